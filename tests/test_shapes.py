"""The shape catalog against the facts in shared/context/research/qwen35-shapes.md."""
import json

import pytest

from harness.errors import HarnessError
from shapes.catalog import catalog, model_layers
from shapes.derive import derive_layers, load_config
from shapes.grid import default_grid, hybrid_buckets, parse_m, vllm_capture_sizes

# (model, tp) -> {layer: (n, k)} from the research file's TP table (section 4)
EXPECTED = {
    ("Qwen3.5-4B", 1): {"linear_attn.in_proj_qkvz": (12288, 2560), "linear_attn.in_proj_ba": (64, 2560),
                        "linear_attn.out_proj": (2560, 4096), "self_attn.qkv_proj": (10240, 2560),
                        "self_attn.o_proj": (2560, 4096), "mlp.gate_up_proj": (18432, 2560),
                        "mlp.down_proj": (2560, 9216), "lm_head": (248320, 2560)},
    ("Qwen3.5-4B", 2): {"linear_attn.in_proj_qkvz": (6144, 2560), "linear_attn.in_proj_ba": (32, 2560),
                        "linear_attn.out_proj": (2560, 2048), "self_attn.qkv_proj": (5120, 2560),
                        "self_attn.o_proj": (2560, 2048), "mlp.gate_up_proj": (9216, 2560),
                        "mlp.down_proj": (2560, 4608), "lm_head": (124160, 2560)},
    ("Qwen3.5-4B", 4): {"linear_attn.in_proj_qkvz": (3072, 2560), "linear_attn.in_proj_ba": (16, 2560),
                        "linear_attn.out_proj": (2560, 1024), "self_attn.qkv_proj": (2560, 2560),
                        "self_attn.o_proj": (2560, 1024), "mlp.gate_up_proj": (4608, 2560),
                        "mlp.down_proj": (2560, 2304), "lm_head": (62080, 2560)},
    ("Qwen3.5-4B", 8): {"linear_attn.in_proj_qkvz": (1536, 2560), "linear_attn.in_proj_ba": (8, 2560),
                        "linear_attn.out_proj": (2560, 512), "self_attn.qkv_proj": (1536, 2560),
                        "self_attn.o_proj": (2560, 512), "mlp.gate_up_proj": (2304, 2560),
                        "mlp.down_proj": (2560, 1152), "lm_head": (31040, 2560)},
    ("Qwen3.5-35B-A3B", 1): {"linear_attn.in_proj_qkvz": (12288, 2048), "linear_attn.in_proj_ba": (64, 2048),
                             "linear_attn.out_proj": (2048, 4096), "self_attn.qkv_proj": (9216, 2048),
                             "self_attn.o_proj": (2048, 4096), "mlp.shared_expert.gate_up_proj": (1024, 2048),
                             "mlp.shared_expert.down_proj": (2048, 512), "mlp.gate": (256, 2048),
                             "mlp.shared_expert_gate": (1, 2048), "lm_head": (248320, 2048)},
    ("Qwen3.5-35B-A3B", 2): {"linear_attn.in_proj_qkvz": (6144, 2048), "linear_attn.in_proj_ba": (32, 2048),
                             "linear_attn.out_proj": (2048, 2048), "self_attn.qkv_proj": (4608, 2048),
                             "self_attn.o_proj": (2048, 2048), "mlp.shared_expert.gate_up_proj": (512, 2048),
                             "mlp.shared_expert.down_proj": (2048, 256), "mlp.gate": (256, 2048),
                             "mlp.shared_expert_gate": (1, 2048), "lm_head": (124160, 2048)},
    ("Qwen3.5-35B-A3B", 4): {"linear_attn.in_proj_qkvz": (3072, 2048), "linear_attn.in_proj_ba": (16, 2048),
                             "linear_attn.out_proj": (2048, 1024), "self_attn.qkv_proj": (2560, 2048),
                             "self_attn.o_proj": (2048, 1024), "mlp.shared_expert.gate_up_proj": (256, 2048),
                             "mlp.shared_expert.down_proj": (2048, 128), "mlp.gate": (256, 2048),
                             "mlp.shared_expert_gate": (1, 2048), "lm_head": (62080, 2048)},
    ("Qwen3.5-35B-A3B", 8): {"linear_attn.in_proj_qkvz": (1536, 2048), "linear_attn.in_proj_ba": (8, 2048),
                             "linear_attn.out_proj": (2048, 512), "self_attn.qkv_proj": (1536, 2048),
                             "self_attn.o_proj": (2048, 512), "mlp.shared_expert.gate_up_proj": (128, 2048),
                             "mlp.shared_expert.down_proj": (2048, 64), "mlp.gate": (256, 2048),
                             "mlp.shared_expert_gate": (1, 2048), "lm_head": (31040, 2048)},
}
COUNTS = {"Qwen3.5-4B": {"linear_attn.in_proj_qkvz": 24, "linear_attn.in_proj_ba": 24, "linear_attn.out_proj": 24,
                         "self_attn.qkv_proj": 8, "self_attn.o_proj": 8, "mlp.gate_up_proj": 32, "mlp.down_proj": 32,
                         "lm_head": 1},
          "Qwen3.5-35B-A3B": {"linear_attn.in_proj_qkvz": 30, "linear_attn.in_proj_ba": 30, "linear_attn.out_proj": 30,
                              "self_attn.qkv_proj": 10, "self_attn.o_proj": 10, "mlp.shared_expert.gate_up_proj": 40,
                              "mlp.shared_expert.down_proj": 40, "mlp.gate": 40, "mlp.shared_expert_gate": 40,
                              "lm_head": 1}}


@pytest.mark.parametrize("model,tp", sorted(EXPECTED))
def test_layers_match_research_table(model, tp):
    layers = model_layers(model, tp)
    assert {l.layer: (l.n, l.k) for l in layers} == EXPECTED[(model, tp)]
    assert {l.layer: l.count for l in layers} == COUNTS[model]
    styles = {l.layer: l.style for l in layers}
    assert styles["linear_attn.out_proj"] == "row" and styles["lm_head"] == "vocab"
    assert all(l.in_cuda_graph == (l.layer != "lm_head") for l in layers)


def test_fourteen_shape_readings():
    shapes = catalog()
    assert len(shapes) == 16 and len({(s.n, s.k) for s in shapes}) == 16
    assert sum("H1" in s.tags for s in shapes) == 14  # decoder linears, no lm_head
    assert sum("H2" in s.tags for s in shapes) == 14  # dense projections + lm_head, no router/gates


def test_dedup_keeps_every_layer_and_count():
    by_shape = {(s.n, s.k): s for s in catalog()}
    out = by_shape[(2560, 4096)]
    assert out.layers == ("Qwen3.5-4B:linear_attn.out_proj", "Qwen3.5-4B:self_attn.o_proj") and out.count == 32
    assert by_shape[(2048, 4096)].count == 40
    assert sum(s.count for s in catalog()) == sum(l.count for l in model_layers())


def _write(tmp_path, data, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_flat_config_with_layer_types_equals_nested():
    from shapes.catalog import model_configs
    cfg = load_config(model_configs()["Qwen3.5-4B"])
    assert "text_config" in cfg and "full_attention_interval" in cfg["text_config"]
    flat = dict(cfg["text_config"])
    flat["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)]
    del flat["full_attention_interval"]
    assert derive_layers(flat, "x") == derive_layers(cfg, "x")


def test_qwen3_next_style_moe_config():
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
           "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "vocab_size": 151936,
           "full_attention_interval": 4, "num_experts": 512, "shared_expert_intermediate_size": 512,
           "intermediate_size": 5120, "mlp_only_layers": [0], "decoder_sparse_step": 1}
    layers = {l.layer: l for l in derive_layers(cfg, "next")}
    assert layers["mlp.gate"].n == 512 and layers["mlp.gate"].count == 3
    assert layers["mlp.gate_up_proj"].count == 1 and layers["mlp.gate_up_proj"].n == 10240
    assert layers["lm_head"].n == 151936


@pytest.mark.parametrize("bad,needle", [
    ({"model_type": "llama", "hidden_size": 4096}, "llama"),
    ({"model_type": "qwen3_5_text", "hidden_size": 2560}, "lacks"),
])
def test_other_family_is_refused(bad, needle):
    with pytest.raises(HarnessError, match=needle):
        derive_layers(bad, "x")


def test_tp_that_does_not_divide(tmp_path):
    with pytest.raises(HarnessError, match="TP 3"):
        model_layers("Qwen3.5-4B", 3)


def test_grid_properties():
    grid = default_grid()
    assert grid[0] == 1 and grid[-1] == 16384 and grid == sorted(set(grid))
    assert all(1 << i in grid for i in range(15))
    buckets = set(hybrid_buckets())
    assert {24, 48, 1031} <= set(grid) and any(4096 < m < 8192 and m not in buckets for m in grid)
    assert all(m not in buckets for m in (24, 48, 1031, 6144))
    capture = vllm_capture_sizes()
    assert len(capture) == 51 and capture[:5] == [1, 2, 4, 8, 16] and capture[-1] == 512
    assert set(c for c in capture if c <= 64) <= set(grid)
    assert set(capture) <= set(parse_m("capture"))
    assert hybrid_buckets(8192) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048,
                                    2560, 3072, 3584, 4096, 8192]


def test_parse_m():
    assert parse_m("1,8,32") == [1, 8, 32]
    assert parse_m("1-16") == [1, 2, 4, 8, 16]
    assert parse_m("64:256:64") == [64, 128, 192, 256]
    for bad in ("x", "0", "1,-4", "5:1:0"):
        with pytest.raises(HarnessError):
            parse_m(bad)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from harness.errors import run_cli
    from shapes.__main__ import main
    cases = [
        [str(tmp_path / "missing.json")],
        [str(_write(tmp_path, "{not json"))],
        [str(_write(tmp_path, {"model_type": "llama"}, "llama.json"))],
        [str(_write(tmp_path, [1, 2], "list.json"))],
    ]
    for args in cases:
        assert run_cli(main, "shapes", ["from-config", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("shapes: error:") and "\n" not in err
    from shapes.catalog import model_configs
    assert run_cli(main, "shapes", ["from-config", str(model_configs()["Qwen3.5-4B"]), "--tp", "3"]) == 2


def test_cli_list_csv(capsys):
    from shapes.__main__ import main
    assert main(["list", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = lines[0].split(",")
    assert "n" in header and "k" in header and len(lines) == 17


def test_the_transformers_layout_unfuses_vllms_layers():
    """transformers' Qwen3.5 modules: the GDN projections, attention and MLP unfused, one rank, the vocab unpadded."""
    from shapes.derive import derive_layers, forward_sequence, load_config
    from shapes.catalog import CONFIG_DIR
    cfg = load_config(CONFIG_DIR / "qwen3.5-4b.json")
    got = {layer.layer: (layer.n, layer.k, layer.count) for layer in derive_layers(cfg, "4B", layout="transformers")}
    assert got["linear_attn.in_proj_qkv"][:2] == (8192, 2560) and got["linear_attn.in_proj_z"][:2] == (4096, 2560)
    assert got["linear_attn.in_proj_b"][:2] == got["linear_attn.in_proj_a"][:2] == (32, 2560)
    assert got["self_attn.q_proj"][:2] == (8192, 2560) and got["self_attn.k_proj"][:2] == (1024, 2560)
    assert got["mlp.gate_proj"][:2] == got["mlp.up_proj"][:2] == (9216, 2560)
    assert "linear_attn.in_proj_qkvz" not in got and "mlp.gate_up_proj" not in got
    vllm = {layer.layer: (layer.n, layer.k) for layer in derive_layers(cfg, "4B")}
    # the unfused parts add up to vLLM's fused layers
    assert got["linear_attn.in_proj_qkv"][0] + got["linear_attn.in_proj_z"][0] == vllm["linear_attn.in_proj_qkvz"][0]
    assert got["mlp.gate_proj"][0] * 2 == vllm["mlp.gate_up_proj"][0]
    seq = forward_sequence(cfg, "4B", layout="transformers")
    assert [lin.layer for lin in seq[:5]] == ["linear_attn.in_proj_qkv", "linear_attn.in_proj_z",
                                              "linear_attn.in_proj_b", "linear_attn.in_proj_a", "linear_attn.out_proj"]
    assert len(seq) == len(forward_sequence(cfg, "4B")) + 24 * 2 + 8 * 2 + 32  # the extra modules per layer kind
    with pytest.raises(HarnessError, match="one rank"):
        derive_layers(cfg, "4B", tp=2, layout="transformers")
