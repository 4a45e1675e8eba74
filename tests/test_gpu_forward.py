"""GPU tests of the measured forward: a short forward (2 decoder layers, 2 M values) of the 35B-A3B runs every
default path in both regimes; its graph regime holds exactly the kernels of its linears; linears are counted."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def short_forward(tmp_path_factory, gpu_profile, gpu_table):
    from bench.forward import ForwardConfig, models_for, run_forward
    from bench.forward_paths import default_rules
    profile = gpu_profile
    out = tmp_path_factory.mktemp("forward")
    cfg = ForwardConfig(profile=profile, models=models_for(["Qwen3.5-35B-A3B"], None), ms=[8, 1031],
                        rules=[*default_rules(profile), "table-direct"], out=out, samples=5, decoder_layers=2)
    run_forward(cfg)
    import pandas as pd
    return pd.read_csv(out / "forward.csv", dtype={"kernel_digest": str}), cfg, profile


def test_every_path_and_regime_is_measured(short_forward):
    df, cfg, _ = short_forward
    assert set(df["status"]) == {"ok"}, df[df["status"] != "ok"][["m", "path", "regime", "reason"]]
    assert len(df) == 2 * len(cfg.rules) * 2
    assert (df["decoder_layers"].astype(str) == "2").all()
    g = df[df["regime"] == "graph"]
    if cfg.profile.pdl:
        # with PDL a kernel starts before its predecessor ends and waits inside it, so the summed kernel durations
        # overlap: they may exceed the replay's span, by a few percent on the H200 (the sweep times such calls by span)
        assert (g["gpu_busy_us"] <= g["span_us"] * 1.10).all()
    else:
        assert (g["gpu_busy_us"] <= g["span_us"] * 1.0001).all()
    e = df[df["regime"] == "eager"]
    assert (e["submit_us"] <= e["us"]).all() and (e["gpu_busy_us"] > 0).all()


def test_rules_that_run_the_same_paths_are_measured_once(short_forward):
    """On SM90 vLLM's default, its flag and the seed PR's rule all run F.linear: one measurement, named thrice."""
    df, cfg, _ = short_forward
    if cfg.profile.sm != 90:
        pytest.skip("the vLLM rules differ from all-aten on this SM")
    key = ["m", "regime"]
    aten = df[df["path"] == "aten"].set_index(key).sort_index()
    for rule in ("vllm-default", "vllm-flag", "seed-pr"):
        twin = df[df["path"] == rule].set_index(key).sort_index()
        assert (twin["reason"].str.startswith("same paths as aten")).all()
        assert (twin["samples_us"] == aten["samples_us"]).all()
    op = df[df["path"] == "vllm-op:tinygemm"]
    assert op["paths_used"].str.contains("vllm-op:tinygemm").all() and op["reason"].isna().all()


def test_linears_counted_match_the_sequence(short_forward):
    from bench.forward import sequences
    df, cfg, _ = short_forward
    n = len(sequences(cfg)["Qwen3.5-35B-A3B"])
    # 2 decoder layers of the MoE model: 3 GDN projections + 4 MoE dense parts each, then lm_head
    assert n == 2 * (3 + 4) + 1 and (df["linears"] == n).all()


def test_graph_forward_holds_exactly_the_kernels_of_its_linears(short_forward):
    """Each linear of the aten forward run alone, eagerly under CUPTI: their kernel counts add up to the graph's."""
    import torch
    import torch.nn.functional as F

    from bench.clocks import CuptiClock
    from bench.forward import sequences
    df, cfg, _ = short_forward
    seq = sequences(cfg)["Qwen3.5-35B-A3B"]
    clock = CuptiClock()
    try:
        total = 0
        for lin in seq:
            x = torch.randn(8, lin.k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(lin.n, lin.k, device="cuda", dtype=torch.bfloat16)
            F.linear(x, w)
            clock.drain()
            F.linear(x, w)
            total += sum(1 for r in clock.drain() if r.graph_id == 0)
    finally:
        clock.close()
    graph = df[(df["regime"] == "graph") & (df["path"] == "aten") & (df["m"] == 8)]
    assert int(graph["kernels"].iloc[0]) == total


def test_settled_samples_keep_exact_kernel_counts_and_carry_clocks(short_forward):
    """Every timed forward followed settle_ms of untimed runs of itself: none of their kernels may leak into a timed
    window (an eager forward holds as many kernels as its graph), and NVML's clock was read after every sample."""
    df, cfg, _ = short_forward
    assert cfg.settle_ms > 0
    g = df[df["regime"] == "graph"].set_index(["m", "path"])["kernels"]
    e = df[df["regime"] == "eager"].set_index(["m", "path"])["kernels"]
    assert (e.sort_index() == g.sort_index()).all(), (e, g)
    if "sm_mhz" in df and df["sm_mhz"].notna().any():  # NVML present
        assert (df["sm_mhz"] > 0).all()
        assert all(len(str(v).split(";")) == cfg.samples for v in df["sm_mhz_samples"])


def test_sustained_replays_are_timed_one_by_one(tmp_path, gpu_profile):
    import pandas as pd

    from bench.forward import ForwardConfig, models_for, run_forward
    cfg = ForwardConfig(profile=gpu_profile, models=models_for(["Qwen3.5-4B"], None), ms=[512],
                        rules=["aten"], out=tmp_path, samples=3, decoder_layers=2, sustain_ms=150, idle_ms=50)
    run_forward(cfg)
    df = pd.read_csv(tmp_path / "sustain.csv")
    assert set(df["status"]) == {"ok"} and len(df) >= 10
    assert df["t_ms"].is_monotonic_increasing and (df["us"] > 0).all()
    # the replays ran back to back: their times add up to the span they cover
    assert abs(df["us"].sum() / 1e3 - df["t_ms"].iloc[-1]) <= 0.05 * df["t_ms"].iloc[-1]
    assert not (tmp_path / "forward.csv").exists()


def test_skip_slower_leaves_out_a_path_far_slower_than_aten(tmp_path, gpu_profile, gpu_table):
    """TinyGEMM everywhere at M = 1031 ran the forward about 20x all-aten on the H200: with --skip-slower 3 its rows
    say so in both regimes and the other paths are timed as usual."""
    import pandas as pd

    from bench.forward import ForwardConfig, models_for, run_forward
    if gpu_profile.low_m_backend != "tinygemm":
        pytest.skip("measured with TinyGEMM (SM90) only; another low-M backend may not be 3x slower at M = 1031")
    low = "flashinfer-lean:tinygemm"
    cfg = ForwardConfig(profile=gpu_profile, models=models_for(["Qwen3.5-4B"], None), ms=[1031],
                        rules=["aten", "dispatch", low], out=tmp_path, samples=3, decoder_layers=2, skip_slower=3.0)
    run_forward(cfg)
    df = pd.read_csv(tmp_path / "forward.csv").set_index(["path", "regime"])
    assert set(df.loc[low, "status"]) == {"skipped"} and df.loc[low, "reason"].str.contains("x aten's graph").all()
    assert set(df.drop(index=low, level="path")["status"]) == {"ok"}


def test_the_dispatcher_and_table_direct_run_the_same_kernels(short_forward):
    """Both run the committed table's choices, bound per layer or called directly: the same kernel sequence (one
    kernel_digest) in each regime and M, so in the graph regime their ratio measures noise alone; every row carries
    a digest."""
    df, cfg, _ = short_forward
    assert df["kernel_digest"].astype(str).str.fullmatch("[0-9a-f]{12}").all()
    d = df.set_index(["m", "regime", "path"])["kernel_digest"]
    for m in cfg.ms:
        for regime in ("graph", "eager"):
            assert d[(m, regime, "dispatch")] == d[(m, regime, "table-direct")], (m, regime)
    # no check that a lean cuBLASLt layer runs other kernels than F.linear: with the pinned tactics it may run
    # F.linear's own (35B-A3B M = 1031 on the H200: same digest, h200-settled-forward-8)


def test_fused_siblings_run_fewer_kernels_and_pdl_the_same_ones(tmp_path, gpu_profile, gpu_table):
    """The fused rules run one GEMM per group of siblings (2 decoder layers of the 35B-A3B: 3 linears fewer in each);
    table-pdl and table-plain run table-direct's kernels, the GEMV's launched with PDL and plainly; every rule's
    output matched fp32 before timing."""
    import pandas as pd

    from bench.forward import ForwardConfig, models_for, run_forward
    cfg = ForwardConfig(profile=gpu_profile, models=models_for(["Qwen3.5-35B-A3B"], None), ms=[1, 8],
                        rules=["aten", "vllm-fused", "table-direct", "table-pdl", "table-plain", "fused-siblings"],
                        out=tmp_path,
                        samples=3, decoder_layers=2)
    run_forward(cfg)
    df = pd.read_csv(tmp_path / "forward.csv", dtype={"kernel_digest": str})
    assert set(df["status"]) == {"ok"}, df[df["status"] != "ok"][["m", "path", "regime", "reason"]]
    g = df[df["regime"] == "graph"].set_index(["m", "path"])

    def linears(m, rule):  # paths_used: 'path:count;...', one count per linear run
        return sum(int(part.rsplit(":", 1)[1]) for part in g.at[(m, rule), "paths_used"].split(";"))
    for m in (1, 8):
        assert linears(m, "vllm-fused") == linears(m, "aten") - 2 * 3
        assert linears(m, "fused-siblings") == linears(m, "table-direct") - 2 * 3
        # the same choices, the GEMV's launched with PDL: the same kernels (F.linear may run two for one linear)
        assert g.at[(m, "table-pdl"), "kernels"] == g.at[(m, "table-direct"), "kernels"]
        assert g.at[(m, "table-pdl"), "paths_used"] == g.at[(m, "table-direct"), "paths_used"].replace(
            "triton:gemv", "triton:gemv-pdl")
        assert g.at[(m, "table-plain"), "kernels"] == g.at[(m, "table-direct"), "kernels"]  # launched plainly
        assert g.at[(m, "table-plain"), "paths_used"] == g.at[(m, "table-direct"), "paths_used"].replace(
            "triton:gemv", "triton:gemv-plain")
