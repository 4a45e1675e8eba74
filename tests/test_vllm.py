"""The model of vLLM 0.33.0 (dispatch/vllm.py), the forward rules named after it, and the answer in its terms."""
import json
from types import SimpleNamespace

import pandas as pd
import pytest

from bench.forward import Bound, twin_of, twin_rows
from bench.forward_paths import Target, default_rules, path_for
from calibrate.vllm_terms import best_threshold, text, vllm_terms
from dispatch import vllm
from dispatch.profiles import get_profile
from shapes.derive import ForwardLinear

H200, B200, GB200 = get_profile("h200"), get_profile("b200"), get_profile("gb200")


def test_the_flag_runs_only_on_the_sm100_family():
    assert not vllm.flag_supported(90) and vllm.flag_supported(100) and vllm.flag_supported(103)
    lin = ForwardLinear(0, "linear_attn.out_proj", 2560, 4096)
    assert path_for("vllm-flag", lin, 1, Target(90, H200, None)) == "aten"
    assert path_for("vllm-flag", lin, 32, Target(100, B200, None)) == path_for("vllm-flag", lin, 33, Target(100, B200, None)) \
        == "vllm-op:cute-dsl"  # one backend at every M: FlashInfer splits at CUTE_DSL_MAX_M itself
    assert vllm.CUTE_DSL_MAX_M == 32
    assert not vllm.seed_pr_uses_flashinfer(90, 1)
    assert vllm.seed_pr_uses_flashinfer(100, 32) and not vllm.seed_pr_uses_flashinfer(100, 33)


def test_capture_size_follows_max_num_seqs_and_the_sm():
    assert vllm.capture_size(90, 1024) == 512 and vllm.capture_size(100, 1024) == 1024
    assert vllm.capture_size(100, 256) == 512 and vllm.capture_size(90, 100) == 200
    assert H200.capture_size == 512 and B200.capture_size == 1024 and GB200.capture_size == 1024
    assert H200.capture_size_for(64) == 128


def test_server_defaults_by_memory():
    assert H200.server == vllm.ServerDefaults(1024, 8192)
    assert B200.server == vllm.ServerDefaults(1024, 16384)
    assert vllm.server_defaults(40) == vllm.ServerDefaults(256, 2048)


def test_pdl_and_the_lm_head():
    assert vllm.pdl(90) and vllm.pdl(100) and not vllm.pdl(80)
    from dispatch.profiles import PROFILES
    assert all(p.pdl == vllm.pdl(p.sm) for p in PROFILES.values())  # every profile passes pdl as vLLM does
    head = ForwardLinear(-1, "lm_head", 248320, 2560)
    for rule in ("vllm-default", "vllm-flag", "seed-pr", "vllm-op:cute-dsl"):
        assert path_for(rule, head, 1, Target(100, B200, None)) == "aten"  # F.linear whatever the flag


def test_autotune_buckets_are_the_hybrid_buckets_up_to_the_token_budget():
    b = vllm.autotune_buckets(8192)
    assert b[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256] and b[-1] == 8192 and 512 in b and 2560 in b
    assert vllm.autotune_buckets(5000)[-1] == 5000


def _tensor(shape, *, dtype="bf16", cuda=True, contiguous=True, ptr=0, device=0):
    import torch
    n = 1
    for d in shape:
        n *= d
    return SimpleNamespace(shape=shape, ndim=len(shape), is_cuda=cuda, device=device, numel=lambda: n,
                           dtype=torch.bfloat16 if dtype == "bf16" else torch.float16,
                           is_contiguous=lambda: contiguous, data_ptr=lambda: ptr)


def test_the_per_call_check_is_vllms():
    x, w = _tensor((4, 256)), _tensor((512, 256))
    assert vllm.can_use_cutedsl(100, x, w, None)
    assert not vllm.can_use_cutedsl(90, x, w, None)  # not the SM 10.x family
    assert not vllm.can_use_cutedsl(100, _tensor((4, 200)), _tensor((512, 200)), None)  # K % 128
    assert not vllm.can_use_cutedsl(100, _tensor((4, 256), ptr=16), w, None)  # 32-byte alignment
    assert not vllm.can_use_cutedsl(100, _tensor((4, 256), contiguous=False), w, None)
    assert not vllm.can_use_cutedsl(100, _tensor((4, 256), dtype="fp16"), w, None)
    assert not vllm.can_use_cutedsl(100, _tensor((0, 256)), w, None)  # empty
    assert vllm.can_use_cutedsl(100, x, w, _tensor((512,)))
    assert not vllm.can_use_cutedsl(100, x, w, _tensor((256,)))  # bias of another length


def test_default_forward_rules_name_the_low_m_backend_through_vllms_op():
    assert default_rules(H200) == ("aten", "vllm-default", "vllm-flag", "seed-pr", "vllm-op:tinygemm", "dispatch")
    assert default_rules(B200)[4] == "vllm-op:cute-dsl"


def test_rules_running_the_same_paths_are_twins():
    a, b, d = Bound(paths=["aten", "aten"]), Bound(paths=["aten", "aten"]), Bound(paths=["aten", "aten"])
    assert twin_of("vllm-flag", b, {"aten": a}) == "aten"
    assert twin_of("dispatch", d, {"aten": a}) is None  # the dispatcher adds its own bound layer
    assert twin_of("vllm-op:tinygemm", Bound(paths=["vllm-op:tinygemm", "aten"]), {"aten": a}) is None
    rows = [{"model": "m", "m": 8, "path": "aten", "regime": r, "us": 1.0, "reason": ""} for r in ("graph", "eager")]
    copies = twin_rows(rows, {("m", 8, "vllm-flag"): "aten"})
    assert [c["path"] for c in copies] == ["vllm-flag"] * 2 and all(c["us"] == 1.0 for c in copies)
    assert all(c["reason"].startswith("same paths as aten") for c in copies)


def _forward(times: dict[tuple[str, int], dict[str, float]], regimes=("graph", "eager")) -> pd.DataFrame:
    """A synthetic forward: per (model, M) each path's per-round µs (5 rounds, the same relative noise)."""
    rows = []
    noise = [1.0, 1.01, 0.99, 1.005, 0.995]
    for (model, m), paths in times.items():
        for regime in regimes:
            for path, us in paths.items():
                samples = [round(us * f, 3) for f in noise]
                rows.append({"model": model, "tp": 1, "m": m, "path": path, "regime": regime, "status": "ok",
                             "reason": "", "us": us, "linears": 3, "samples_us": ";".join(map(str, samples))})
    return pd.DataFrame(rows)


def _h200_forward():
    same = lambda us, low, table: {"aten": us, "vllm-default": us, "vllm-flag": us, "seed-pr": us,  # noqa: E731
                                   "vllm-op:tinygemm": low, "dispatch": table}
    return _forward({("A", 1): same(100.0, 60.0, 58.0), ("A", 8): same(110.0, 80.0, 79.0),
                     ("A", 32): same(130.0, 140.0, 125.0), ("A", 128): same(200.0, 500.0, 199.0)})


def test_the_best_threshold_is_read_off_the_low_m_and_default_forwards():
    terms = vllm_terms(_h200_forward(), H200)
    assert terms.thresholds == {"graph": 8, "eager": 8}
    r = terms.rows.set_index(["regime", "m"])
    assert r.at[("graph", 1), "threshold"] == pytest.approx(0.6) and r.at[("graph", 32), "threshold"] == 1.0
    assert r.at[("graph", 1), "vllm-flag"] == 1.0 and r.at[("graph", 1), "seed-pr"] == 1.0
    assert terms.per_model == {("A", "eager"): 8, ("A", "graph"): 8}
    assert r.at[("graph", 32), "dispatch"] == pytest.approx(125 / 130)
    assert r.at[("graph", 1), "table_over_threshold"] == pytest.approx(58 / 60)
    assert bool(r.at[("graph", 1), "vllm_regime"]) and not bool(r.at[("eager", 1), "vllm_regime"])
    out = text(terms)
    assert "T = 8" in out and "vLLM 0.33.0" in out


def test_a_rule_measured_as_vllm_defaults_twin_has_no_interval():
    df = _h200_forward()
    df.loc[df["path"] == "vllm-flag", "reason"] = "same paths as vllm-default on every linear: its measurement"
    df.loc[df["path"] == "vllm-flag", "samples_us"] = "1;2;3;4;5"  # would pair to a ratio far from 1
    r = vllm_terms(df, H200).rows.set_index(["regime", "m"])
    assert (r.at[("graph", 8), "vllm-flag"], r.at[("graph", 8), "vllm-flag_lo"]) == (1.0, 1.0)


def test_no_threshold_when_the_low_m_backend_never_wins():
    df = _forward({("A", 1): {"vllm-default": 100.0, "vllm-op:tinygemm": 120.0}})
    groups = {("A", "graph", 1): df[df["regime"] == "graph"].set_index("path")}
    assert best_threshold(groups, "vllm-op:tinygemm", "graph") == 0


def test_vllm_terms_needs_every_rule():
    from harness.errors import HarnessError
    df = _h200_forward()
    with pytest.raises(HarnessError, match="seed-pr"):
        vllm_terms(df[df["path"] != "seed-pr"], H200)


def test_calibrate_vllm_prints_the_table(tmp_path, capsys):
    from calibrate.__main__ import main
    df = _h200_forward()
    df.to_csv(tmp_path / "forward.csv", index=False)
    info = {"kind": "forward", "profile": "h200", "status": "complete", "models": ["A"], "ms": [1, 8, 32, 128],
            "paths": sorted(set(df["path"])), "regimes": ["graph", "eager"],
            "fingerprint": {"gpu_name": "NVIDIA H200", "sm": 90}}
    (tmp_path / "run.json").write_text(json.dumps(info))
    assert main(["vllm", "--forward", str(tmp_path), "--no-floor"]) == 0
    out = capsys.readouterr().out
    assert "best threshold" in out and "graph T = 8" in out


def test_path_for_on_a_linear_the_op_cannot_take():
    lin = ForwardLinear(0, "x", 2560, 4000)  # K % 128 != 0
    assert path_for("vllm-op:cute-dsl", lin, 8, Target(100, B200, None)) == "aten"


def _forward_folder(path, df):
    df.to_csv(path / "forward.csv", index=False)
    info = {"kind": "forward", "profile": "h200", "status": "complete", "models": sorted(set(df["model"])),
            "ms": sorted(set(int(m) for m in df["m"])), "paths": sorted(set(df["path"])), "regimes": ["graph", "eager"],
            "fingerprint": {"gpu_name": "NVIDIA H200", "sm": 90}}
    (path / "run.json").write_text(json.dumps(info))
    return path


def test_the_report_leads_with_the_vllm_terms_where_the_forwards_measured_them(tmp_path):
    from calibrate.forward_model import load_forward
    from calibrate.forward_noise import load_forward_floor
    from reports.build import vllm_section
    run = SimpleNamespace(profile=H200, forward_floor=load_forward_floor(H200.name))  # a Run's reads the shipped one
    html = vllm_section(run, [load_forward(_forward_folder(tmp_path, _h200_forward()))[0]])
    assert "vLLM 0.33.0" in html and "is unsupported" in html and "best T" in html
    old = tmp_path / "old"
    old.mkdir()
    df = _h200_forward()
    assert vllm_section(run, [load_forward(_forward_folder(old, df[df["path"] != "vllm-op:tinygemm"]))[0]]) is None


def test_a_low_m_forward_skipped_as_far_slower_is_never_under_the_threshold():
    df = _h200_forward()
    slow = (df["path"] == "vllm-op:tinygemm") & (df["m"] == 128)
    df.loc[slow, ["status", "reason"]] = ["skipped", "12.0x aten's graph replay time (--skip-slower 3)"]
    df.loc[slow, "us"] = float("nan")
    terms = vllm_terms(df, H200)
    assert terms.thresholds["graph"] == 8 and 128 in set(terms.rows["m"])
    assert terms.rows.set_index(["regime", "m"]).at[("graph", 128), "threshold"] == 1.0


def test_the_op_falls_back_to_f_linear_where_vllms_check_fails():
    """bench/vllm_op.py's op (the anatomy's model of vLLM's, bench/anatomy_ops.py): vLLM's check first, F.linear
    where it fails (CPU tensors always fail it), mm_bf16 with vLLM's arguments on the 2-D view where it passes."""
    import torch

    from bench.anatomy_ops import _fake, make_vllm_impl
    from bench.vllm_op import flashinfer_bf16_mm, vllm_check
    sent = []
    mm = flashinfer_bf16_mm(lambda a, b, **kw: sent.append(kw) or a @ b)
    x, w = torch.randn(4, 256), torch.randn(32, 256)
    impl = make_vllm_impl(mm, vllm_check("cute-dsl", 100))
    assert torch.allclose(impl(x, w, None, True, "cute-dsl"), torch.nn.functional.linear(x, w))
    assert sent == []
    assert not vllm_check("tinygemm", 90)(x, w, None)  # CPU tensors fail the backend's own rule too
    y = make_vllm_impl(mm, lambda *a: True)(x.view(2, 2, 256), w, None, True, "cute-dsl")
    assert y.shape == (2, 2, 32) and sent == [{"bias": None, "pdl": True, "out_dtype": torch.bfloat16,
                                               "backend": "cute-dsl"}]
    assert _fake(x, w, None, True, "cute-dsl").shape == (4, 32)
