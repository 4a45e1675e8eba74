"""GPU tests: a small real sweep, its kernel-count checks, CUPTI vs events, and the dispatcher in a graph."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small_sweep_dir(tmp_path_factory, gpu_profile):
    from bench.paths import paths_for
    from bench.sweep import SweepConfig, run_sweep
    from shapes.catalog import catalog, select
    name = gpu_profile
    out = tmp_path_factory.mktemp("sweep")
    cfg = SweepConfig(profile=name, shapes=select(catalog(), "n2048_k4096,n64_k2048,n1_k2048"), ms=[1, 48, 1031],
                      paths=paths_for(name.flashinfer_backends), out=out, samples=10)
    run_sweep(cfg)
    return out


@pytest.fixture(scope="module")
def small_sweep(small_sweep_dir):
    from bench.results import load_results
    return load_results(small_sweep_dir)


def test_the_kept_autotuner_cache_serves_the_tuned_tactics(small_sweep_dir, tmp_path, gpu_profile):
    """A second sweep serving the first one's autotune-cache.json (tuner memory cleared, so only the file can answer)
    runs the same FlashInfer tactics and kernels."""
    from flashinfer.autotuner import AutoTuner

    from bench.autotune_cache import FILE_NAME
    from bench.paths import PATHS
    from bench.results import load_results, load_run_info
    from bench.sweep import SweepConfig, run_sweep
    from shapes.catalog import catalog, select
    profile = gpu_profile
    first = load_results(small_sweep_dir)
    assert load_run_info(small_sweep_dir)["autotune_cache"]["mode"] == "tuned"
    AutoTuner.get().clear_cache()
    fi = [PATHS[f"flashinfer:{b}"] for b in dict.fromkeys((profile.low_m_backend, "cublaslt"))]
    run_sweep(SweepConfig(profile=profile, shapes=select(catalog(), "n2048_k4096"), ms=[1, 48, 1031], paths=fi,
                          out=tmp_path, samples=3, autotune_cache=small_sweep_dir / FILE_NAME))
    assert load_run_info(tmp_path)["autotune_cache"]["mode"] == "loaded"
    second = load_results(tmp_path)
    key = ["n", "k", "m", "path"]
    both = first[first["status"] == "ok"].merge(second[second["status"] == "ok"], on=key, suffixes=("_tuned", "_served"))
    assert len(both) == 6, both[key]
    assert (both["fi_tactic_tuned"].astype(str) == both["fi_tactic_served"].astype(str)).all(), \
        both[key + ["fi_tactic_tuned", "fi_tactic_served"]]
    assert (both["kernels_tuned"] == both["kernels_served"]).all()
    import pandas as pd
    assert (pd.to_numeric(both["fi_tactic_tuned"], errors="coerce") >= 0).any(), "no tuned tactic: nothing was pinned"


def test_every_runnable_cell_is_timed_and_correct(small_sweep):
    df = small_sweep
    assert set(df["status"]) <= {"ok", "skipped"}, df[df["status"] == "failed"][["shape", "m", "path", "reason"]]
    ok = df[df["status"] == "ok"]
    assert (ok["rel_err"] < 2e-2).all()
    assert (ok["gpu_us"] > 0).all() and (ok["kernels_per_call"] >= 1).all()
    assert (ok["timer"] == "cupti").all()
    # N = 1 cannot run on TinyGEMM: skipped, with the reason
    tiny = df[(df["n"] == 1) & (df["path"] == "flashinfer:tinygemm")]
    assert (tiny["status"] == "skipped").all() and tiny["reason"].str.contains("N % 16").all()


def test_cupti_and_events_agree_for_longer_calls(small_sweep):
    """Both directions: the kernels' busy time fits inside their span, the span inside the events' window, and the
    events exceed the span by under 5% in the median (a launch gap or a lost kernel record would show here).
    Kernels launched with pdl overlap their predecessor (each one's duration includes its wait), so their summed
    durations may exceed the span: the first check holds for the others (the analysis times pdl rows by span)."""
    ok = small_sweep[(small_sweep["status"] == "ok") & (small_sweep["gpu_us"] >= 10)]
    assert len(ok) >= 5
    plain = ok[ok["pdl"].astype(str).str.lower() != "true"]
    assert len(plain) >= 5 and (plain["gpu_us"] <= plain["span_us"] * 1.0001).all()
    assert (ok["span_us"] <= ok["event_us"] * 1.02).all(), ok[["span_us", "event_us"]]
    assert (ok["event_us"] / ok["span_us"] - 1).median() < 0.05


def test_the_dispatch_row_runs_the_kernels_of_the_tables_choice(small_sweep, gpu_profile, gpu_table):
    """Each dispatch cell ran exactly the kernels of the path its table chooses there (F.linear where the low-M
    kernel cannot take the shape), not merely those of some known path."""
    from bench.paths import PATHS
    from dispatch.backends import ATEN, DISPATCH
    table = gpu_table
    df = small_sweep[small_sweep["status"] == "ok"].set_index(["n", "k", "m", "path"])
    rows = [(key, row) for key, row in df.iterrows() if key[3] == DISPATCH]
    assert rows
    for (n, k, m, _), row in rows:
        chosen = table.choose(n, k, m)
        if chosen != ATEN and PATHS[chosen].skip_reason(gpu_profile.sm, n, k, m):
            chosen = ATEN
        assert row["kernels"] == df.loc[(n, k, m, chosen), "kernels"], (n, k, m, chosen)


def test_dispatcher_captures_and_falls_back():
    import torch
    import torch.nn.functional as F

    import dispatch
    from dispatch.table import ThresholdTable
    dispatch.configure(ThresholdTable.from_thresholds("h200", "tinygemm", 32))
    try:
        w = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = dispatch.linear(x, w)
        g.replay()
        torch.cuda.synchronize()
        assert (y.float() - ref.float()).norm() / ref.float().norm() < 2e-2
        # inputs the low-M kernel cannot take go to F.linear
        w1 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(dispatch.linear(x, w1), F.linear(x, w1))
        xf = x.float()
        assert torch.equal(dispatch.linear(xf, w.float()), F.linear(xf, w.float()))
        xt = torch.randn(4096, 8, device="cuda", dtype=torch.bfloat16).t()
        assert torch.equal(dispatch.linear(xt, w), F.linear(xt, w))
        b = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(dispatch.linear(x, w, b), F.linear(x, w, b))
    finally:
        dispatch.reset()


def test_l2_modes_time_a_cached_weight_faster_when_warm(tmp_path, gpu_profile):
    """n2560_k9216 (47 MB of weight, under the H200's 60 MB L2) at M=1: with a warm L2 the GEMM reads its weight from
    L2 and is faster than after a flush; the flush's own kernels are not counted in the call's time."""
    import torch

    from bench.paths import PATHS
    from bench.results import load_results, load_run_info
    from bench.sweep import SweepConfig, run_sweep
    from shapes.catalog import catalog, select
    profile = gpu_profile
    if torch.cuda.get_device_properties(0).L2_cache_size < 48 << 20:
        pytest.skip("needs a known GPU with an L2 larger than the weight")
    gpu = {}
    for mode in ("flush", "warm"):
        out = tmp_path / mode
        run_sweep(SweepConfig(profile=profile, shapes=select(catalog(), "n2560_k9216"), ms=[1],
                              paths=[PATHS["aten"]], out=out, samples=5, l2=mode, tune=False))
        row = load_results(out).iloc[0]
        assert row["status"] == "ok" and row["rotations"] == 1, row["reason"]
        gpu[mode] = row["gpu_us"]
        if mode == "flush":
            excluded = load_run_info(out)["l2_flush"]["kernels_excluded"]
            assert not any(name in str(row["kernels"]) for name in excluded)
    assert gpu["warm"] < 0.9 * gpu["flush"], gpu
