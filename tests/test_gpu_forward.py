"""GPU tests of the measured forward: a short forward (2 decoder layers, 2 M values) of the 35B-A3B runs every
default path in both regimes; its graph regime holds exactly the kernels of its linears; linears are counted."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def short_forward(tmp_path_factory, gpu_profile):
    from bench.forward import ForwardConfig, models_for, run_forward
    from bench.forward_paths import DEFAULT_RULES
    profile = gpu_profile
    out = tmp_path_factory.mktemp("forward")
    cfg = ForwardConfig(profile=profile, models=models_for(["Qwen3.5-35B-A3B"], None), ms=[8, 1031],
                        rules=list(DEFAULT_RULES), out=out, samples=5, decoder_layers=2)
    run_forward(cfg)
    import pandas as pd
    return pd.read_csv(out / "forward.csv"), cfg, profile


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
