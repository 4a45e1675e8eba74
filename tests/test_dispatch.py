"""CPU tests of the dispatcher: verdicts, fitting and per-forward totals, on a synthetic table and the H200 sweep."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.results import load_results
from calibrate.analysis import Cells, cell_verdicts, fit, ratio_ci, verdict
from dispatch.table import ThresholdTable, load_table, parse_table
from harness.errors import HarnessError

DATA = Path(__file__).parent / "data"
EVIDENCE = Path(__file__).resolve().parent.parent / "evidence"  # the measured runs docs cite


@pytest.mark.parametrize("lo,hi,expected", [
    (0.80, 0.90, "FASTER"), (1.05, 1.10, "SLOWER"), (0.98, 1.02, "SAME"), (0.95, 1.02, "AMBIGUOUS"),
    (0.90, 1.10, "AMBIGUOUS"),
])
def test_verdict(lo, hi, expected):
    assert verdict(lo, hi, 0.03) == expected


def test_ratio_ci_brackets_the_ratio():
    rng = np.random.default_rng(1)
    a, b = 10 + rng.normal(0, 0.1, 30), 20 + rng.normal(0, 0.1, 30)
    r, lo, hi = ratio_ci(a, b)
    assert lo <= r <= hi and 0.49 < lo and hi < 0.51


def _synthetic(times):
    """times: {(n, k, m, path): (gpu_us, host_us)} -> a results DataFrame with tight samples."""
    rows = []
    for (n, k, m, path), (gpu, host) in times.items():
        samples = ";".join(f"{gpu * (1 + d):.4f}" for d in np.linspace(-0.002, 0.002, 11))
        rows.append({"n": n, "k": k, "m": m, "path": path, "status": "ok", "gpu_us": gpu, "host_us": host,
                     "gpu_samples_us": samples, "tp": 1, "in_cuda_graph": True})
    return pd.DataFrame(rows)


def test_fit_finds_each_shapes_own_ranges_per_regime():
    """(64, 2048): the lean low-M kernel wins on the GPU up to M = 16 and loses from 32, and its host time is below
    F.linear's, so it wins eager too; (2048, 4096): it never wins (nor eagerly: host 25 vs 20 µs); the public call's GPU time equals the lean one's,
    but its host time is 90 µs: never chosen (the fit chooses among F.linear and the lean calls)."""
    times = {}
    for m in (1, 8, 16, 32, 64, 1024):
        times[(64, 2048, m, "aten")] = (5.0, 20.0)
        times[(64, 2048, m, "flashinfer-lean:tinygemm")] = (3.0 if m <= 16 else 8.0, 9.0)
        times[(64, 2048, m, "flashinfer:tinygemm")] = (3.0 if m <= 16 else 8.0, 90.0)
        times[(2048, 4096, m, "aten")] = (8.0, 20.0)
        times[(2048, 4096, m, "flashinfer-lean:tinygemm")] = (9.0, 25.0)
    df = _synthetic(times)
    cells = Cells.from_results(df)
    table, report = fit(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 0), capture_size=512)
    # measured wins up to 16 and losses from 32; in between, the linear costs cross at 16 + 16 * 2 / 5 = 22.4
    assert table.ranges(64, 2048, "graph") == ((22, "flashinfer-lean:tinygemm"),)
    assert table.ranges(2048, 4096, "graph") == () and table.ranges(2048, 4096, "eager") == ()
    # eager cost max(host, GPU): lean 9 vs F.linear 20 at every M -> lean where its max stays below
    assert table.ranges(64, 2048, "eager") == ((1024, "flashinfer-lean:tinygemm"),)
    assert table.choose(64, 2048, 24, "graph") == "aten"  # an unmeasured M past the crossing goes to F.linear
    assert table.choose(999, 999, 1) == "aten"  # a shape the fit never saw runs F.linear
    assert report.set_index(["n", "k"]).loc[(64, 2048), "crossover_m"] == 32
    held, _ = fit(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 0), 512, hold_out={16})
    assert held.ranges(64, 2048, "graph") == ((17, "flashinfer-lean:tinygemm"),)  # 8 + 24 * 2 / 5 = 17.6
    # a measured forward's pick: eagerly it wins at its cell; in the graph regime it only fills a cell where the cell
    # test left F.linear and its own cell is no dearer
    picked, _ = fit(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 0), 512,
                    forward_picks={("eager", 2048, 4096, 1): "flashinfer-lean:tinygemm",
                                   ("graph", 2048, 4096, 1): "flashinfer-lean:tinygemm"})
    assert picked.ranges(2048, 4096, "eager") == ((1, "flashinfer-lean:tinygemm"),)
    assert picked.ranges(2048, 4096, "graph") == ()  # GPU 9 vs 8 µs: its cell is dearer, F.linear stays
    kept, _ = fit(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 0), 512,
                  forward_picks={("graph", 64, 2048, 1): "flashinfer:tinygemm"})
    assert kept.choose(64, 2048, 1, "graph") == "flashinfer-lean:tinygemm"  # the cell test's own win stands


def test_fit_hysteresis_keeps_f_linear_on_a_gain_inside_the_noise():
    """A 1% GPU-time gain, however tight its samples, is not worth leaving F.linear for (min_gain 2%); a 5% gain is,
    unless the run-to-run floor is wider than it."""
    from calibrate.noise import NoiseFloor
    times = {(64, 2048, 1, "aten"): (5.0, 20.0), (64, 2048, 1, "flashinfer-lean:tinygemm"): (4.95, 30.0),
             (64, 2048, 8, "aten"): (5.0, 20.0), (64, 2048, 8, "flashinfer-lean:tinygemm"): (4.75, 30.0)}
    cells = Cells.from_results(_synthetic(times))
    base = ThresholdTable.from_thresholds("h200", "tinygemm", 0)
    table, _ = fit(cells, base, 512)
    assert table.choose(64, 2048, 1) == "aten" and table.choose(64, 2048, 8) == "flashinfer-lean:tinygemm"
    wide = NoiseFloor(((math.inf, 0.06),))
    table, _ = fit(cells, base, 512, noise=wide)
    assert table.choose(64, 2048, 8) == "aten"
    assert table.choose(64, 2048, 8, "eager") == "aten"  # host 30 vs 20: F.linear eagerly


def test_eager_fit_follows_whether_the_measured_forward_is_host_or_gpu_bound():
    """cuBLASLt 5% faster on the GPU, its host time 10% above F.linear's, both hidden behind the cell's own GPU time.
    Without measured forwards the cell test hands the eager cell to the graph choice; with them, below the M where
    the forward turned GPU-bound only a path with less host time than F.linear's may run (TinyGEMM), from it on the
    graph choice."""
    from calibrate.forward_model import gpu_bound_from
    lt, tg = "flashinfer-lean:cublaslt", "flashinfer-lean:tinygemm"
    times = {}
    for m in (8, 128, 4096):
        times[(4096, 2048, m, "aten")] = (40.0, 20.0)
        times[(4096, 2048, m, lt)] = (38.0, 22.0)
        times[(64, 2048, m, "aten")] = (5.0, 20.0)
        times[(64, 2048, m, tg)] = (3.0 if m <= 128 else 50.0, 9.0)
    cells = Cells.from_results(_synthetic(times))
    base = ThresholdTable.from_thresholds("h200", "tinygemm", 0)
    plain, _ = fit(cells, base, 512)
    assert all(plain.choose(4096, 2048, m, "eager") == lt for m in (8, 128, 4096))
    fw = pd.DataFrame([{"model": "X", "m": m, "path": "aten", "regime": "eager", "status": "ok",
                        "gpu_busy_us": busy, "submit_us": 1000.0} for m, busy in ((8, 500.0), (128, 1300.0),
                                                                                   (1024, 1200.0), (4096, 3000.0))])
    assert gpu_bound_from(fw) == {"X": 4096.0}  # 128 was GPU-bound, but 1024 (1.2x) was not: from 4096 on
    assert gpu_bound_from(fw, hold_out={1024}) == {"X": 128.0}
    assert gpu_bound_from(fw.assign(gpu_busy_us=100.0)) == {"X": math.inf}
    bound = {(4096, 2048): 4096.0, (64, 2048): 4096.0}
    aware, _ = fit(cells, base, 512, gpu_bound_from=bound)
    assert aware.choose(4096, 2048, 8, "eager") == aware.choose(4096, 2048, 128, "eager") == "aten"
    assert aware.choose(4096, 2048, 4096, "eager") == lt and aware.choose(4096, 2048, 128, "graph") == lt
    assert aware.choose(64, 2048, 128, "eager") == tg  # less host time than F.linear: allowed host-bound


def test_eager_fit_in_a_balanced_forward_needs_less_host_and_less_gpu_time():
    """Between the M up to which the measured forward was host-bound (host_bound_until) and the one from which it
    was GPU-bound, host and GPU time both show in the forward: TinyGEMM, with half F.linear's host time, replaces
    F.linear only where its GPU time beats F.linear's too. Host-bound, its host time alone decides."""
    from calibrate.forward_model import host_bound_until
    tg = "flashinfer-lean:tinygemm"
    times = {}
    for m, gpu in ((8, 4.0), (128, 6.0)):
        times[(64, 2048, m, "aten")] = (5.0, 20.0)
        times[(64, 2048, m, tg)] = (gpu, 9.0)  # GPU time below F.linear's at M = 8, above it at 128
    cells = Cells.from_results(_synthetic(times))
    base = ThresholdTable.from_thresholds("h200", "tinygemm", 0)
    fw = pd.DataFrame([{"model": "X", "m": m, "path": "aten", "regime": "eager", "status": "ok",
                        "gpu_busy_us": busy, "submit_us": 1000.0} for m, busy in ((8, 500.0), (128, 900.0),
                                                                                   (1024, 700.0), (4096, 3000.0))])
    assert host_bound_until(fw) == {"X": 8.0}  # 1000 >= 1.25 x 500 at M = 8; not at 128 (1.11x): up to 8
    assert host_bound_until(fw, hold_out={128}) == {"X": 1024.0}
    assert host_bound_until(fw.assign(gpu_busy_us=1000.0)) == {"X": 0.0}
    bound = {(64, 2048): 4096.0}
    balanced, _ = fit(cells, base, 512, gpu_bound_from=bound, host_bound_until={(64, 2048): 0.0})
    assert balanced.choose(64, 2048, 8, "eager") == tg and balanced.choose(64, 2048, 128, "eager") == "aten"
    host_bound, _ = fit(cells, base, 512, gpu_bound_from=bound, host_bound_until={(64, 2048): 128.0})
    assert host_bound.choose(64, 2048, 8, "eager") == host_bound.choose(64, 2048, 128, "eager") == tg
    assert fit(cells, base, 512, gpu_bound_from=bound)[0].choose(64, 2048, 128, "eager") == tg  # no such data


LOW = "flashinfer:tinygemm"


def test_verdicts_on_cells_with_known_answers():
    """Synthetic cells whose answers are known: the low-M kernel 40% faster, 60% slower or 1% slower than aten, and a
    table that chooses wrongly on purpose."""
    times = {(64, 2048, 1, "aten"): (5.0, 20.0), (64, 2048, 1, "flashinfer:tinygemm"): (3.0, 90.0),   # FASTER
             (64, 2048, 64, "aten"): (5.0, 20.0), (64, 2048, 64, "flashinfer:tinygemm"): (8.0, 90.0),  # SLOWER
             (64, 2048, 8, "aten"): (5.0, 20.0), (64, 2048, 8, "flashinfer:tinygemm"): (5.05, 90.0)}   # SAME
    cells = Cells.from_results(_synthetic(times))
    v = cell_verdicts(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 8, path=LOW)).set_index("m")
    assert v["low_m_vs_aten"].to_dict() == {1: "FASTER", 8: "SAME", 64: "SLOWER"}
    assert v.loc[1, "verdict"] == "SAME" and v.loc[1, "chosen"] == "flashinfer:tinygemm"  # it chose the best
    assert v.loc[64, "verdict"] == "SAME" and v.loc[64, "chosen"] == "aten"
    assert v.loc[8, "verdict"] == "SAME"  # 1% apart: inside the 3% margin
    wrong = cell_verdicts(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 1024, path=LOW)).set_index("m")
    assert wrong.loc[64, "verdict"] == "SLOWER" and wrong.loc[64, "regret"] == pytest.approx(0.6, abs=0.01)
    never = cell_verdicts(cells, ThresholdTable.from_thresholds("h200", "tinygemm", 0, path=LOW)).set_index("m")
    assert never.loc[1, "verdict"] == "SLOWER" and never.loc[8, "verdict"] == "SAME"

def test_table_files():
    t = load_table("h200")
    assert t.profile == "h200" and t.low_m_backend == "tinygemm" and t.source.get("fingerprint")
    gb = load_table("gb200")
    assert gb.choose(2048, 4096, 32, "graph") == gb.choose(2048, 4096, 32, "eager") == "flashinfer-lean:cute-dsl"
    assert gb.choose(2048, 4096, 33) == "aten" and "seed PR" in gb.source["note"]
    old = load_table(path=DATA / "h200-table-format1.json")  # format 1: public call, both regimes alike
    assert old.threshold(64, 2048) == 256 and old.choose(64, 2048, 256, "eager") == "flashinfer:tinygemm"
    assert old.threshold(2048, 4096) == 8 and old.choose(9216, 2048, 1) == "aten"
    with pytest.raises(HarnessError, match="not found"):
        load_table("nope")
    with pytest.raises(HarnessError, match="lacks"):
        parse_table({"profile": "h200"}, "x")
    with pytest.raises(HarnessError, match="malformed"):
        parse_table({"profile": "h200", "low_m_backend": "tinygemm", "default_threshold": 1,
                     "overrides": [{"n": 1}]}, "x")
    v2 = {"format": 2, "profile": "h200", "low_m_backend": "tinygemm", "default": {"graph": [], "eager": []}}
    assert parse_table(v2, "x").choose(1, 1, 1) == "aten"
    for bad, needle in (({"default": {"graph": []}}, "lacks the eager regime"),
                        ({"default": {"graph": [{"up_to": 8, "path": "nope"}], "eager": []}}, "not one the dispatcher"),
                        ({"default": {"graph": [{"up_to": 8, "path": "aten"}, {"up_to": 4, "path": "aten"}],
                                      "eager": []}}, "increasing"),
                        ({"default": {"graph": [{"up_to": 0, "path": "aten"}], "eager": []}}, "outside 1..16384"),
                        ({"shapes": [{"n": "x", "k": 1}]}, "positive integers n and k")):
        with pytest.raises(HarnessError, match=needle):
            parse_table({**v2, **bad}, "x")
    t2 = parse_table(json.loads(json.dumps(t.to_json())), "roundtrip")
    assert t2.shapes == t.shapes and t2.default == t.default


OLD_TABLE = ["--table", str(DATA / "h200-table-format1.json"), "--oracle", "candidates"]


def test_the_format1_table_holds_on_the_runs_it_was_judged_on():
    """The first H200 table (format 1, public TinyGEMM call) against its own dispatcher candidates, as it was judged
    when committed; the new table is judged on runs that measured the lean calls (test_committed_h200_table_...)."""
    from calibrate.__main__ import main
    assert main(["validate", str(DATA / "h200-sweep"), *OLD_TABLE]) == 0
    # out of sample: a second run, stopped at 375 of 400 groups, so judged as a partial run
    assert main(["validate", str(DATA / "h200-sweep-2"), "--partial", *OLD_TABLE]) == 0


def test_every_measured_path_is_the_oracle_by_default(capsys):
    """validate's default oracle is every measured path: the format 1 table, which could only choose F.linear or
    TinyGEMM, is SLOWER than FlashInfer's cuBLASLt at cells of the committed run."""
    from calibrate.__main__ import main
    assert main(["validate", str(DATA / "h200-sweep"), "--table", str(DATA / "h200-table-format1.json")]) == 1
    out = capsys.readouterr().out
    assert "best of all" in out and "flashinfer:cublaslt" in out and "FAIL" in out


def test_validate_refuses_other_gpu_and_bad_files(tmp_path):
    from calibrate.__main__ import main
    df = load_results(DATA / "h200-sweep")
    info = json.load(open(DATA / "h200-sweep" / "run.json"))
    info["fingerprint"]["gpu_name"] = "NVIDIA B200"
    info["fingerprint"]["sm"] = 100
    df.head(50).to_csv(tmp_path / "results.csv", index=False)
    (tmp_path / "run.json").write_text(json.dumps(info))
    with pytest.raises(HarnessError, match="not on a h200"):
        main(["validate", str(tmp_path), "--gpu", "h200"])
    (tmp_path / "run.json").write_text((DATA / "h200-sweep" / "run.json").read_text())
    (tmp_path / "results.csv").write_text("")
    with pytest.raises(HarnessError):
        main(["validate", str(tmp_path)])
    df[["n", "k", "m"]].to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(HarnessError, match="lacks column"):
        main(["validate", str(tmp_path)])


def test_dispatch_linear_on_cpu_is_f_linear():
    torch = pytest.importorskip("torch")
    import dispatch.layers
    x, w, b = torch.randn(3, 5, 64), torch.randn(32, 64), torch.randn(32)
    assert torch.equal(dispatch.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    assert dispatch.linear(x, w).shape == (3, 5, 32)


def test_paired_ratio_cancels_a_clock_step_that_hits_both_paths():
    """Recorded shape of the problem (H200, n18432_k2560 M=16384): both paths' replays step from ~1930 to ~2200 us
    a few replays in. Paired, the same kernel is 1.0 with a tight interval; unpaired, the interval is wide."""
    from calibrate.analysis import paired_ratio_ci, ratio_ci
    step = np.array([1930.0] * 5 + [2200.0] * 5)
    a, b = step * (1 + 0.002 * np.sin(np.arange(10))), step.copy()
    b[4] = 2200.0  # the step caught the aten replay of pair 4 first
    r, lo, hi = paired_ratio_ci(a, b)
    assert r == pytest.approx(1.0, abs=0.003) and hi - lo < 0.01
    _, ulo, uhi = ratio_ci(a, b)
    assert uhi - ulo > 0.1
    r, lo, hi = paired_ratio_ci(a * 1.1, b)  # a real 10% slowdown moves every pair
    assert lo > 1.09
    with pytest.raises(ValueError, match="equal"):
        paired_ratio_ci(a[:9], b)


# ---------------------------------------------------------------- the runtime: binding, regimes, the custom op
def _fake_rule_table():
    """Graph: a fake 'lean tinygemm' up to M = 32; eager: F.linear everywhere."""
    return ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()},
                          {(16, 64): {"graph": ((32, "flashinfer-lean:tinygemm"),), "eager": ()}})


class _Capturing(dict):
    """The fixture's capture flag: the Python layer reads state["capturing"]; the C++ layer keeps its own counter,
    which the hooks' listener would move (dispatch/capture.py), moved here alike."""

    def __init__(self, mod):
        super().__init__(capturing=False)
        self.mod = mod

    def __setitem__(self, key, value):
        if self.mod is not None and key == "capturing" and bool(value) != bool(self.get(key)):
            (self.mod.capture_enter if value else self.mod.capture_exit)()
        super().__setitem__(key, value)


# The tests that build and load the C++ layer share one xdist worker: the build takes most of a minute on two cores,
# and a second worker waiting on its lock would idle meanwhile.
NATIVE = pytest.mark.xdist_group("native")


@pytest.fixture(params=["Python", pytest.param("C++", marks=NATIVE)])
def fake_gpu_dispatch(request, monkeypatch):
    """The dispatcher on CPU tensors as if they were on an SM90 GPU, with each bound layer (Python, C++): a fake
    kernel that records its calls, a capture flag the test sets, and a backend rule that accepts CPU weights (a CPU
    activation is on the weight's 'device' -1, so the bound layer's own activation checks apply unchanged)."""
    import torch

    import dispatch.layers
    from dispatch import eligible, native
    mod = request.getfixturevalue("native_module") if request.param == "C++" else None
    monkeypatch.setattr(native, "module", lambda build_if_missing=False: mod)
    calls = []
    state = _Capturing(mod)

    def kernel(x, w, bias):
        calls.append(tuple(x.shape))
        return torch.full((x.shape[0], w.shape[0]), 7.0, dtype=x.dtype)

    def into(x, w, out):  # what a bound layer calls: the kernel writing into the output it allocated
        assert out.shape == (x.shape[0], w.shape[0]) and out.dtype == x.dtype
        calls.append(tuple(x.shape))
        out.fill_(7.0)
    kernel.into = into
    monkeypatch.setattr(dispatch.layers._STATE, "capturing", lambda: state["capturing"])
    monkeypatch.setattr(dispatch.layers._STATE, "signal", "hooks")
    monkeypatch.setattr(dispatch.layers, "_kernel", lambda path, pdl: kernel)
    monkeypatch.setattr(dispatch.layers, "_device", lambda index: (_fake_rule_table(), 90, True))
    def cpu_weight_ok(backend, w, b, sm):  # the rule's weight half, with CPU weights allowed
        return b is None and w.dtype == torch.bfloat16
    monkeypatch.setattr(eligible, "accepts_weight", cpu_weight_ok)
    monkeypatch.setattr(dispatch.layers, "accepts_weight", cpu_weight_ok)
    fresh = dispatch.layers._native_linear() or dispatch.layers._linear_python  # the package's and the layers' name
    monkeypatch.setattr(dispatch.layers, "linear", fresh)
    monkeypatch.setattr(dispatch, "linear", fresh)
    assert dispatch.layer_kind(dispatch.linear) == request.param
    dispatch.reset()
    yield dispatch, calls, state
    state["capturing"] = False
    dispatch.reset()


def test_bound_layer_switches_regime_with_the_capture_flag(fake_gpu_dispatch):
    import torch
    import torch.nn.functional as F
    dispatch, calls, state = fake_gpu_dispatch
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    x = torch.randn(2, 4, 64, dtype=torch.bfloat16)  # M = 8
    layer = dispatch.bind(w)
    assert dispatch.layer_kind(layer) == ("C++" if state.mod else "Python")
    assert torch.equal(layer(x), F.linear(x, w)) and calls == []  # eager: F.linear
    state["capturing"] = True
    y = layer(x)
    assert calls == [(8, 64)] and y.shape == (2, 4, 16) and bool((y == 7).all())  # graph: the kernel, reshaped back
    assert torch.equal(dispatch.linear(x, w), y) and calls[-1] == (8, 64)  # the unbound drop-in agrees
    x64 = torch.randn(64, 64, dtype=torch.bfloat16)  # above the graph range: F.linear in both regimes
    assert torch.equal(layer(x64), F.linear(x64, w)) and len(calls) == 2
    xt = torch.randn(64, 8, dtype=torch.bfloat16).t()  # not contiguous: F.linear, not the kernel
    assert torch.equal(layer(xt), F.linear(xt, w)) and len(calls) == 2
    bias = torch.randn(16, dtype=torch.bfloat16)
    with_bias = dispatch.bind(w, bias)  # the kernel takes no bias: F.linear, bound without a choice memory
    assert torch.equal(with_bias(x), F.linear(x, w, bias)) and len(calls) == 2
    other = torch.randn(32, 64, dtype=torch.bfloat16)  # a shape the table has no ranges for: F.linear
    dispatch.bind(other)(x)
    assert len(calls) == 2
    python = [dispatch.bind(v, b, native=False) for v, b in ((w, bias), (other, None), (w, None))]
    assert [p.__name__ for p in python] == ["f_linear_only", "f_linear_only", "bound_linear"]
    with pytest.raises(ValueError, match="2-D weight"):
        dispatch.bind(torch.randn(4, dtype=torch.bfloat16))


def test_bound_layer_checks_each_activation_before_the_kernel(fake_gpu_dispatch):
    """The checks the kernel needs, per call (the choice memory is per shape, these are per tensor): another dtype,
    a misaligned start, a non-contiguous layout each go to F.linear; an aligned contiguous bf16 input to the kernel."""
    import torch
    import torch.nn.functional as F
    dispatch, calls, state = fake_gpu_dispatch
    state["capturing"] = True
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    layer = dispatch.bind(w)
    misaligned = torch.randn(8 * 64 + 1, dtype=torch.bfloat16)[1:].view(8, 64)  # 2 bytes off the 16 TinyGEMM needs
    strided = torch.randn(8, 128, dtype=torch.bfloat16)[:, :64]
    for x in (misaligned, strided):
        assert torch.equal(layer(x), F.linear(x, w)) and calls == []
    with pytest.raises(RuntimeError):
        layer(torch.randn(8, 64))  # float32 against a bf16 weight: F.linear's own error, never the kernel
    assert calls == []
    assert bool((layer(misaligned.clone()) == 7).all()) and calls == [(8, 64)]  # a fresh, aligned copy


def test_capture_hooks_count_captures_per_thread_and_close_on_failure():
    """dispatch/capture.py's counter on a stand-in for torch.cuda.CUDAGraph: up while a capture is open, nested
    captures counted, back to 0 after a capture_end that raised, untouched by a capture_begin that raised, unseen
    by another thread; installing twice wraps once."""
    import threading

    from dispatch import capture

    class Graph:
        def capture_begin(self, fail=False):
            if fail:
                raise RuntimeError("begin failed")

        def capture_end(self, fail=False):
            if fail:
                raise RuntimeError("end failed")
    assert capture.install(Graph) and capture.install(Graph)
    begin = Graph.capture_begin
    assert capture.install(Graph) and Graph.capture_begin is begin  # not wrapped twice
    flag = capture.signal("hooks")
    g = Graph()
    assert not flag()
    g.capture_begin()
    seen = []
    t = threading.Thread(target=lambda: seen.append(flag()))
    t.start()
    t.join()
    assert flag() and seen == [0]
    g.capture_begin()
    g.capture_end()
    assert flag()
    with pytest.raises(RuntimeError, match="end failed"):
        g.capture_end(fail=True)
    assert not flag()
    with pytest.raises(RuntimeError, match="begin failed"):
        g.capture_begin(fail=True)
    assert not flag()
    assert capture.install(object) is False  # nothing to wrap: the caller uses the CUDA query
    with pytest.raises(ValueError, match="unknown capture signal"):
        capture.signal("guess")


def test_the_dispatcher_uses_the_hooked_capture_counter_and_can_switch_to_the_cuda_query(monkeypatch):
    """dispatch.install() (the first bind, linear or op call) hooks torch.cuda.CUDAGraph; its regime test is the
    counter, and capture_signal switches dispatch.linear's test at once (a bound layer keeps its own)."""
    import torch

    import dispatch.layers
    from dispatch import capture
    assert dispatch.install() == "hooks" and getattr(torch.cuda.CUDAGraph.capture_begin, capture._MARK, False)
    assert dispatch.capture_signal() == "hooks" and dispatch.layers._STATE.capturing is capture.hooked_flag
    monkeypatch.setattr(capture._CAPTURES, "depth", 1)
    assert dispatch.is_capturing()
    try:
        assert dispatch.capture_signal("query") == "query" and dispatch.layers._STATE.capturing is capture.cuda_query
        assert not dispatch.is_capturing()  # CUDA's answer: no stream of this CPU process is capturing
    finally:
        dispatch.capture_signal("hooks")
    with pytest.raises(ValueError):
        dispatch.capture_signal("sometimes")
    assert dispatch.capture_signal() == "hooks"


def test_bound_layers_of_one_shape_share_a_bounded_memory_of_choices(fake_gpu_dispatch, monkeypatch):
    """The Python layer's choice is remembered per activation shape and shared by the layers of one weight shape; a
    shape whose last dim is not K goes to F.linear (and its error); at the cap the memory starts over and still
    answers right. (The C++ layer's memory: test_the_cpp_layer_remembers_choices_per_m.)"""
    import torch
    import torch.nn.functional as F
    dispatch, calls, state = fake_gpu_dispatch
    state["capturing"] = True
    w1, w2 = torch.randn(16, 64, dtype=torch.bfloat16), torch.randn(16, 64, dtype=torch.bfloat16)
    a, b = dispatch.bind(w1, native=False), dispatch.bind(w2, native=False)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    a(x)
    b(x)
    assert calls == [(8, 64), (8, 64)]
    rules = list(dispatch.layers._STATE.layer_rules.values())
    assert len(rules) == 1 and set(rules[0][0]) == {(8, 64)}  # one memory, one entry, for both layers
    with pytest.raises(RuntimeError):
        a(torch.randn(8, 32, dtype=torch.bfloat16))  # K mismatch: F.linear's own error, not the kernel
    assert len(calls) == 2
    monkeypatch.setattr(dispatch.layers, "CHOICES_KEPT", 3)
    dispatch.reset()
    c = dispatch.bind(w1, native=False)
    for m in (1, 2, 3, 4, 64, 5):
        xm = torch.randn(m, 64, dtype=torch.bfloat16)
        y = c(xm)
        assert (bool((y == 7).all()) if m <= 32 else torch.equal(y, F.linear(xm, w1)))
        assert len(next(iter(dispatch.layers._STATE.layer_rules.values()))[0]) <= 3
    assert calls[-1] == (5, 64) and len(calls) == 7


def test_the_custom_op_compiles_without_a_graph_break_and_runs_the_dispatcher(fake_gpu_dispatch):
    import torch
    dispatch, calls, state = fake_gpu_dispatch
    op = dispatch.op()
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    fn = torch.compile(lambda a, b: op(a, b, None) + 1, backend="aot_eager", fullgraph=True)
    state["capturing"] = True
    assert bool((fn(x, w) == 8).all()) and calls  # the op ran the dispatcher at execution, in the graph regime
    state["capturing"] = False
    assert torch.allclose(fn(x, w).float(), (torch.nn.functional.linear(x, w) + 1).float())


def test_pdl_rows_are_timed_by_their_span():
    """A pdl kernel's summed CUPTI durations overlap its predecessor: the analysis takes its span (and span samples
    where the run kept them); a row without pdl keeps the summed durations."""
    rows = []
    for path, pdl in (("aten", ""), ("flashinfer-lean:tinygemm", True)):
        rows.append({"n": 64, "k": 2048, "m": 8, "path": path, "status": "ok", "gpu_us": 4.0, "span_us": 2.5,
                     "host_us": 10.0, "gpu_samples_us": "4.0;4.1;3.9", "span_samples_us": "2.5;2.6;2.4",
                     "pdl": pdl, "tp": 1, "in_cuda_graph": True})
    cells = Cells.from_results(pd.DataFrame(rows))
    assert cells.gpu(64, 2048, 8, "aten") == 4.0 and cells.gpu(64, 2048, 8, "flashinfer-lean:tinygemm") == 2.5
    assert list(cells.samples[(64, 2048, 8, "flashinfer-lean:tinygemm")]) == [2.5, 2.6, 2.4]
    old = pd.DataFrame(rows).drop(columns=["pdl", "span_samples_us"])  # a run from before the column: its setting
    old.attrs["run_pdl"] = True
    assert Cells.from_results(old).gpu(64, 2048, 8, "flashinfer-lean:tinygemm") == 2.5
    old.attrs["run_pdl"] = False
    assert Cells.from_results(old).gpu(64, 2048, 8, "flashinfer-lean:tinygemm") == 4.0


def test_interval_coverage_counts_replicate_ratios_inside_the_first_runs_intervals():
    """Two synthetic runs whose ratio moves by 4% between them: the bootstrap interval of tight samples misses it,
    a run-to-run floor of 5% covers it, one of 1% does not."""
    from calibrate.noise import NoiseFloor, coverage, fit_floor
    def run(ratio):
        return Cells.from_results(_synthetic({(64, 2048, 8, "aten"): (5.0, 20.0),
                                              (64, 2048, 8, "flashinfer-lean:tinygemm"): (5.0 * ratio, 9.0)}))
    a, b = run(0.80), run(0.80 * 1.04)
    cov = coverage(a, b, NoiseFloor(((math.inf, 0.05),)))
    assert len(cov) == 1 and not cov["boot_inside"].iloc[0] and cov["calibrated_inside"].iloc[0]
    assert not coverage(a, b, NoiseFloor(((math.inf, 0.01),)))["calibrated_inside"].iloc[0]
    floor = fit_floor([(a, b)])
    assert floor.half_width(5.0) == pytest.approx(math.log(1.04), rel=1e-3)


def test_flashinfer_alone_is_the_flashinfer_everywhere_rule_on_each_sm():
    """'FlashInfer alone' in the cell-sum model is the forward's flashinfer-everywhere rule: on SM90 the low-M kernel up to
    M = 32 and FlashInfer's cuBLASLt above; on SM100 CuTe DSL at every M (its runner set falls back to its own
    cuBLASLt above 32)."""
    from calibrate.analysis import flashinfer_path
    times = {(2048, 4096, m, p): (5.0, 20.0) for m in (8, 64)
             for p in ("aten", "flashinfer:tinygemm", "flashinfer:cute-dsl", "flashinfer:cublaslt")}
    cells = Cells.from_results(_synthetic(times))
    sm90 = ThresholdTable.from_thresholds("h200", "tinygemm", 0)
    sm100 = ThresholdTable.from_thresholds("gb200", "cute-dsl", 0)
    assert [flashinfer_path(sm90, cells, 2048, 4096, m) for m in (8, 64)] == ["flashinfer:tinygemm",
                                                                              "flashinfer:cublaslt"]
    assert [flashinfer_path(sm100, cells, 2048, 4096, m) for m in (8, 64)] == ["flashinfer:cute-dsl"] * 2


def _shipped_run(profile: str = "h200") -> tuple[Path, dict]:
    """The evidence folder of a shipped table's run (found by its manifest's sha256) and the table."""
    from evidence_store.store import current
    root = Path(__file__).parent.parent
    return current(profile), json.loads((root / "dispatch" / "thresholds" / f"{profile}.json").read_text())


@pytest.mark.evidence
def test_the_committed_h200_table_names_its_table_run():
    """dispatch/thresholds/h200.json names its table run's manifest, kept in evidence/ with the run, by sha256, and
    the fit command that made it from that run's data."""
    kept, committed = _shipped_run()
    assert committed["source"]["fit_command"] == "python " + json.loads((kept / "manifest.json").read_text())[
        "legs"]["fit"]["command"]
    assert (kept / "table.json").is_file() and (kept / "check-sweep").is_dir()


def _refit_with_todays_fit(kept: Path, tmp_path: Path) -> tuple[dict, dict]:
    """A table run's fit leg on its data (filed in evidence/ as `kept`) and with the noise floor its table recorded,
    by today's fit: (today's table, the run's). The fit command's paths under the run's folder (its sweep's parent,
    results/<profile>/<run-id>/) are read from `kept`."""
    import shlex

    from calibrate.__main__ import main
    table = json.loads((kept / "table.json").read_text())
    argv = shlex.split(table["source"]["fit_command"])[3:]
    folder = str(Path(argv[1]).parent) + "/"  # after the subcommand, the fit's first argument: the run's sweep
    argv = [str(kept / a[len(folder):]) if a.startswith(folder) else a for a in argv]
    argv[next(i for i, a in enumerate(argv) if a in ("--out", "--out-file")) + 1] = str(tmp_path / "table.json")
    # the floor the fit read; none (none was shipped then): a floor of zero width, intervals the bootstrap alone
    floor = table["source"].get("noise_floor") or {"format": 1, "level": 0.95,
                                                   "bands": [{"ref_gpu_us_up_to": None, "half_width": 0.0}]}
    (tmp_path / "floor.json").write_text(json.dumps(floor))
    assert main([*argv, "--noise", str(tmp_path / "floor.json")]) == 0
    return json.loads((tmp_path / "table.json").read_text()), table


@pytest.mark.evidence
@pytest.mark.parametrize("profile", ["h200", "h100"])
def test_the_newest_table_run_is_what_todays_fit_makes_of_its_data(profile, tmp_path):
    """Each shipped table's fit leg by today's fit gives the shipped table's ranges: a fit change that would change
    a table shows here, before anyone measures it."""
    again, table = _refit_with_todays_fit(_shipped_run(profile)[0], tmp_path)
    assert again["default"] == table["default"] and again["shapes"] == table["shapes"]


@NATIVE
def test_the_cpp_layer_remembers_choices_per_m_and_hands_the_rest_to_the_python_layer(native_module):
    """The C++ bound layer (dispatch/bound_linear.cpp) on CPU tensors with a decide() of its own: decide is asked
    once per M and the answer kept (at most 4096 M, then the memory starts over); the regime follows its capture
    counter; an N-D input reaches the kernel as [M, K] and comes back [..., N]; keyword arguments, a tensor subclass
    and a torch function mode go to the Python layer (F.linear honours the last two, at::linear would not); a
    kernel's error and a bad decide() answer surface as Python errors; with or without the GIL released, the same."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    mod = native_module
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    asked, ran, fell = [], [], []

    def into(x, weight, out):
        assert weight is w and out.shape == (x.shape[0], 16) and x.dim() == 2
        ran.append(x.shape[0])
        out.fill_(7.0)
    kernel = (into, 16)

    def decide(m):
        asked.append(m)
        return (kernel if m <= 32 else None), (kernel if m <= 4 else None)

    def fallback(x, *args, **kwargs):
        fell.append(type(x).__name__)
        return F.linear(x, w)

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    for release in (True, False):
        asked.clear(), ran.clear(), fell.clear()
        layer = mod.BoundLinear(w, None, decide, fallback, release_gil=release)
        x8 = torch.randn(2, 4, 64, dtype=torch.bfloat16)
        assert torch.equal(layer(x8), F.linear(x8, w)) and ran == []  # eager at M = 8: F.linear
        mod.capture_enter()
        try:
            assert mod.capture_depth() == 1
            y = layer(x8)
            assert y.shape == (2, 4, 16) and bool((y == 7).all()) and ran == [8]  # graph: the kernel
        finally:
            mod.capture_exit()
        mod.capture_exit()  # one too many: the counter stays at 0
        assert mod.capture_depth() == 0
        assert bool((layer(torch.randn(3, 64, dtype=torch.bfloat16)) == 7).all())  # eager at M = 3: the kernel
        assert asked == [8, 3] and layer.remembered() == {8: (1, 0), 3: (1, 1)}
        assert torch.equal(layer(x=x8), F.linear(x8, w)) and fell == ["Tensor"]  # a keyword: the Python layer
        param = torch.nn.Parameter(x8.clone())
        layer(param)
        with Passthrough():
            layer(x8)
        assert fell == ["Tensor", "Parameter", "Tensor"] and asked == [8, 3]
        with pytest.raises(RuntimeError, match="cannot be multiplied|shapes"):
            layer(torch.randn(3, 32, dtype=torch.bfloat16))  # F.linear's own error
    asked.clear()  # 4098 M, each run by the kernel (cheap on CPU): the memory fills up at 4096 and starts over once
    layer = mod.BoundLinear(w, None, lambda m: (asked.append(m), (kernel, kernel))[1], fallback)
    for m in range(1, 4099):
        layer(torch.zeros(m, 64, dtype=torch.bfloat16))
    assert len(asked) == 4098 and layer.remembered() == {4097: (1, 1), 4098: (1, 1)}

    def broken(x, weight, out):
        raise ValueError("the kernel failed")
    bad = mod.BoundLinear(w, None, lambda m: ((broken, 16), (broken, 16)), fallback)
    with pytest.raises(ValueError, match="the kernel failed"):
        bad(torch.randn(3, 64, dtype=torch.bfloat16))
    for answer in ("kernel", ((into, 0), None), (None, None, None)):
        with pytest.raises(TypeError, match="decide"):
            mod.BoundLinear(w, None, lambda m: answer, fallback)(torch.randn(3, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="tensors"):
        mod.BoundLinear("w", None, decide, fallback)


@NATIVE
def test_the_cpp_dispatch_linear_runs_f_linear_itself_only_where_both_regimes_do(native_module):
    """The C++ dispatch.linear (bound_linear.cpp's Linear) on CPU tensors with a rule_of() of its own: the shape rule
    is asked once per (device, N, K) and the M test once per M below its limit (at most 4096 M, then the memory
    starts over); where both regimes run F.linear it calls at::linear itself (bias and Parameter weights included);
    everything else goes to the Python dispatch.linear: a kernel in either regime, keyword arguments, a tensor
    subclass, a torch function mode, a weight that is not 2-D. F.linear's errors are F.linear's; forget() starts
    over; a bad rule_of() answer is a TypeError."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    import dispatch.layers
    mod = native_module
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    bias = torch.randn(16, dtype=torch.bfloat16)
    shapes, ms, fell = [], [], []

    def f_linear_at(m):
        ms.append(m)
        return m > 8  # a kernel in some regime up to M = 8

    def rule_of(device, weight):
        shapes.append((device, tuple(weight.shape)))
        return 32, f_linear_at

    def fallback(x, weight, bias=None):
        fell.append(tuple(x.shape))
        return torch.full((*x.shape[:-1], weight.shape[0]), 7.0, dtype=x.dtype)

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Sub(torch.Tensor):
        pass
    for release in (True, False):
        shapes.clear(), ms.clear(), fell.clear()
        linear = mod.Linear(rule_of, fallback, torch.nn.Parameter, release_gil=release)
        assert dispatch.layer_kind(linear) == "C++"
        x64, x16, x4 = (torch.randn(*s, 64, dtype=torch.bfloat16) for s in ((64,), (2, 8), (4,)))
        for _ in range(2):
            assert torch.equal(linear(x64, w), F.linear(x64, w))  # above the limit: no M test
            assert torch.equal(linear(x16, w, bias), F.linear(x16, w, bias))  # M = 16: F.linear in both
            assert bool((linear(x4, w) == 7).all())  # M = 4: the Python dispatch.linear
        assert shapes == [(-1, (16, 64))] and ms == [16, 4] and fell == [(4, 64), (4, 64)]
        assert linear.remembered() == {(-1, 16, 64): (32, {16: True, 4: False})}
        assert torch.equal(linear(x16, torch.nn.Parameter(w)), F.linear(x16, w)) and len(fell) == 2
        linear(x16, w, bias=bias)
        linear(x16.as_subclass(Sub), w)
        linear(x16, w.as_subclass(Sub))
        with Passthrough():
            linear(x16, w)
        linear(x16, torch.randn(64, dtype=torch.bfloat16))
        assert fell == [(4, 64)] * 2 + [(2, 8, 64)] * 4 + [(2, 8, 64)] and shapes == [(-1, (16, 64))]
        with pytest.raises(RuntimeError, match="cannot be multiplied|shapes"):
            linear(torch.randn(3, 32, dtype=torch.bfloat16), w)  # F.linear's own error
        with pytest.raises(RuntimeError, match="at least 1D"):
            linear(torch.tensor(1.0), w)
        linear.forget()
        assert linear.remembered() == {}
        linear(x64, w)
        assert shapes == [(-1, (16, 64))] * 2
    wide = mod.Linear(lambda device, weight: (10 ** 6, f_linear_at), fallback, torch.nn.Parameter)
    ms.clear()
    # 4098 calls of at::linear, in fp32 (CPU bf16 matmuls are 50x slower; the memory of M is what is tested)
    narrow, rows = torch.randn(1, 8), torch.zeros(9 + 4098, 8)
    for m in range(9, 9 + 4098):
        wide(rows[:m], narrow)
    assert len(ms) == 4098 and wide.remembered()[(-1, 1, 8)][1] == {4105: True, 4106: True}
    for answer in ("rule", (32, None), (32,)):
        with pytest.raises(TypeError, match="rule_of"):
            mod.Linear(lambda device, weight: answer, fallback, torch.nn.Parameter)(x16, w)
    with pytest.raises(TypeError, match="callables"):
        mod.Linear(rule_of, fallback, "Parameter")


@NATIVE
def test_bind_returns_the_cpp_layer_where_it_can_serve(native_module, monkeypatch):
    """dispatch.bind's native switch: the C++ layer when built and the capture signal is the hooks' counter, the
    Python layer with native=False, with the CUDA query as signal, or for a tensor subclass weight; native=True says
    why not. The hooks move the C++ layer's counter as they move their own (capture.add_listener)."""
    import torch

    import dispatch.layers
    from dispatch import capture, native
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(native, "module", lambda build_if_missing=False: native_module)
    assert dispatch.layer_kind(dispatch.bind(w)) == "C++" == dispatch.layer_kind(dispatch.bind(w, native=True))
    assert dispatch.layer_kind(dispatch.bind(torch.nn.Parameter(w))) == "C++"
    assert dispatch.layer_kind(dispatch.bind(w, native=False)) == "Python"

    class Sub(torch.Tensor):
        pass
    assert dispatch.layer_kind(dispatch.bind(w.as_subclass(Sub))) == "Python"
    with pytest.raises(RuntimeError, match="subclass"):
        dispatch.bind(w.as_subclass(Sub), native=True)
    try:
        dispatch.capture_signal("query")
        assert dispatch.layer_kind(dispatch.bind(w)) == "Python"
        with pytest.raises(RuntimeError, match="capture signal"):
            dispatch.bind(w, native=True)
    finally:
        dispatch.capture_signal("hooks")
    monkeypatch.setattr(native, "module", lambda build_if_missing=False: None)
    with pytest.raises(RuntimeError, match="not built"):
        dispatch.bind(w, native=True)

    class Graph:
        def capture_begin(self):
            pass

        def capture_end(self):
            pass
    capture.install(Graph)
    capture.add_listener(native_module.capture_enter, native_module.capture_exit)
    g = Graph()
    g.capture_begin()
    try:
        assert native_module.capture_depth() == 1 == capture.hooked_flag()
    finally:
        g.capture_end()
    assert native_module.capture_depth() == 0 == capture.hooked_flag()


def test_dispatch_linear_remembers_shapes_where_both_regimes_run_f_linear(fake_gpu_dispatch, monkeypatch):
    """Below a later range, an M at which both regimes choose F.linear is remembered by its activation shape: the
    next call goes to F.linear from the fast path (no range walk; host-cost-10 timed the walk at 1.15x F.linear);
    an M with a kernel in either regime is never remembered so, and the memory is bounded."""
    import torch
    import torch.nn.functional as F
    dispatch, calls, state = fake_gpu_dispatch
    table = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()},
                           {(16, 64): {"graph": ((8, "flashinfer-lean:tinygemm"), (16, "aten"),
                                                 (32, "flashinfer-lean:tinygemm")), "eager": ()}})
    monkeypatch.setattr(dispatch.layers, "_device", lambda index: (table, 90, True))
    dispatch.reset()
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    rule = dispatch.layers._rule(-1, w)
    x12, x4 = torch.randn(12, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
    for _ in range(2):
        assert torch.equal(dispatch.linear(x12, w), F.linear(x12, w))
        assert torch.equal(dispatch.linear(x4, w), F.linear(x4, w))  # eager: F.linear, but graph has a kernel
    if state.mod is None:
        assert set(rule.f_linear_shapes) == {(12, 64)} and calls == []
    else:  # the C++ dispatch.linear remembers M itself (M = 4 goes to the Python one, which remembers nothing)
        assert dispatch.linear.remembered() == {(-1, 16, 64): (32, {12: True, 4: False})} and calls == []
        assert rule.f_linear_shapes == {}
    state["capturing"] = True
    assert bool((dispatch.linear(x4, w) == 7).all()) and calls == [(4, 64)]
    assert torch.equal(dispatch.linear(x12, w), F.linear(x12, w)) and len(calls) == 1
    if state.mod is not None:
        dispatch.reset()  # a new table: the C++ dispatch.linear forgets its shape rules
        assert dispatch.linear.remembered() == {}
        return
    monkeypatch.setattr(dispatch.layers, "CHOICES_KEPT", 2)
    for m in (9, 10, 11):
        dispatch.linear(torch.randn(m, 64, dtype=torch.bfloat16), w)
    assert len(rule.f_linear_shapes) <= 2 and len(calls) == 1


def test_build_native_without_a_compiler_says_what_to_install(monkeypatch, capsys, tmp_path):
    """python -m dispatch build-native on a machine without c++ or ninja: one line naming what is missing and how
    to get it, exit 2, nothing written; native-status says 'not built' (exit 1) where nothing was built."""
    import shutil

    from dispatch.__main__ import main
    from harness.errors import run_cli
    monkeypatch.setenv("BLB_NATIVE_DIR", str(tmp_path / "native"))
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "ninja" else "/usr/bin/" + tool)
    assert run_cli(main, "python -m dispatch", ["build-native"]) == 2
    err = capsys.readouterr().err
    assert "needs ninja on PATH" in err and "pip install ninja" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "native").exists()
    from dispatch import native
    monkeypatch.setattr(native, "_LOADED", [])
    assert main(["native-status"]) == 1 and "not built" in capsys.readouterr().out


@NATIVE
def test_the_cpp_layer_keeps_autograd_and_inference_mode_as_f_linear_does(native_module, monkeypatch):
    """Where the C++ layer runs F.linear's kernel (at::linear) the result is F.linear's: the same values, a graph
    for backward with the same gradients, and no graph under inference mode."""
    import torch
    import torch.nn.functional as F

    import dispatch.layers
    from dispatch import native
    monkeypatch.setattr(native, "module", lambda build_if_missing=False: native_module)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    layer = dispatch.bind(w, b)
    assert dispatch.layer_kind(layer) == "C++"
    x = torch.randn(3, 16, requires_grad=True)
    y, ref = layer(x), F.linear(x, w, b)
    assert torch.equal(y, ref) and y.requires_grad
    grads = torch.autograd.grad(y.sum(), (x, w, b))
    expected = torch.autograd.grad(ref.sum(), (x, w, b))
    assert all(torch.equal(g, e) for g, e in zip(grads, expected))
    with torch.inference_mode():
        z = layer(x)
    assert z.is_inference() and not z.requires_grad and torch.equal(z, ref.detach())


def test_the_segment_fit_prefers_few_ranges_within_the_tolerance():
    from calibrate.segments import segment
    ms = [1, 2, 4, 8, 16, 32]
    # TinyGEMM 20% faster up to 8, then slower; a one-M dip of cuBLASLt at 16 worth 1.5% (inside a 2% tolerance)
    cost = {}
    for m in ms:
        cost[(m, "aten")] = 10.0
        cost[(m, "tiny")] = 8.0 if m <= 8 else 14.0
        cost[(m, "cublaslt")] = 9.85 if m == 16 else 10.5
    upper = {(m, p): cost[(m, p)] / 10.0 * 1.005 for m, p in cost}
    choices = segment(ms, cost, upper, ["aten", "tiny", "cublaslt"], tolerance=0.02, min_gain=0.01)
    assert choices == [(1, "tiny"), (2, "tiny"), (4, "tiny"), (8, "tiny"), (16, "aten"), (32, "aten")]
    # without the tolerance the dip is its own range
    tight = segment(ms, cost, upper, ["aten", "tiny", "cublaslt"], tolerance=0.0, min_gain=0.01)
    assert tight[4] == (16, "cublaslt")
    # a gain inside the noise never leaves F.linear
    flat = {(m, p): 1.0 for m, p in upper}
    assert {p for _, p in segment(ms, cost, flat, ["aten", "tiny", "cublaslt"], 0.5, 0.01)} == {"aten"}


def test_segment_eager_cells_follow_the_forwards_boundness_and_picks():
    from calibrate.segments import eager_model, forward_picks
    assert eager_model(4096, 4096.0, 512.0) == ("graph",)
    assert eager_model(1024, 4096.0, 512.0) == ("graph", "eager")  # balanced: cheaper in both
    assert eager_model(8, 4096.0, 512.0) == ("eager",)
    assert eager_model(8, None, None) == ("eager",)
    cells = type("C", (), {"ms": lambda self, n, k: [1, 2, 4, 8, 16, 32, 64]})()
    picks = {("eager", "A", 1): ("tiny", 0.7, 0.8), ("eager", "A", 8): ("tiny", 0.75, 0.9),
             ("eager", "A", 32): ("cublas", 0.9, 0.97), ("graph", "A", 1): ("tiny", 0.7, 0.71)}
    out = forward_picks(picks, {"A": [(10, 20, 3)]}, cells, frozenset({4}))
    assert out[("eager", 10, 20, 2)] == ("tiny", 0.75, 0.9)  # between two picks of one path: the worse ratio
    assert ("eager", 10, 20, 4) not in out  # held out
    assert ("eager", 10, 20, 16) not in out  # between picks of different paths
    assert ("graph", 10, 20, 1) not in out and out[("eager", 10, 20, 32)][0] == "cublas"
    # a forward measured M = 2 between the picks and picked nothing there: no filling in between
    apart = forward_picks(picks, {"A": [(10, 20, 3)]}, cells, frozenset(), {("eager", "A"): [1, 2, 8, 32]})
    assert ("eager", 10, 20, 2) not in apart and ("eager", 10, 20, 4) not in apart


def test_importing_dispatch_changes_nothing_in_torch_until_the_first_call():
    """A fresh interpreter: `import dispatch` imports neither torch nor the layers; after torch's import its
    CUDAGraph is unhooked and no C++ layer is loaded; the first bind hooks it, and dispatch.linear is looked up (C++
    or Python) on first use."""
    import subprocess
    import sys
    code = ("import sys, dispatch\n"
            "assert 'torch' not in sys.modules and 'dispatch.layers' not in sys.modules\n"
            "import torch\n"
            "from dispatch import capture\n"
            "hooked = lambda: getattr(torch.cuda.CUDAGraph.capture_begin, capture._MARK, False)\n"
            "assert not hooked() and 'dispatch.layers' not in sys.modules and 'blb_bound_linear' not in sys.modules\n"
            "assert 'linear' not in vars(dispatch)\n"
            "dispatch.bind(torch.randn(8, 16))\n"
            "assert hooked() and dispatch.layers._STATE.signal == 'hooks'\n"
            "assert callable(dispatch.linear) and 'linear' in vars(dispatch)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_the_analyses_and_the_report_import_no_torch():
    """The floors that read results (the registry's names, the fit, validate and the calibrate command, the report)
    import without torch: where torch's import would be most of the wait."""
    import subprocess
    import sys
    code = ("import sys\n"
            "import bench.paths, bench.forward_paths, calibrate.analysis, calibrate.segments, calibrate.__main__\n"
            "import reports.build\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_a_table_with_the_retired_idle_regime_loads_with_its_eager_ranges():
    """Tables written before the idle regime was removed still load: their idle ranges are checked and left out
    (the eager ranges apply), and they are not written back."""
    v2 = {"format": 2, "profile": "h200", "low_m_backend": "tinygemm",
          "default": {"graph": [], "eager": []},
          "shapes": [{"n": 16, "k": 64, "graph": [{"up_to": 8, "path": "flashinfer-lean:tinygemm"}],
                      "eager": [], "idle": [{"up_to": 8, "path": "flashinfer-lean:tinygemm"}]}]}
    t = parse_table(v2, "x")
    assert [t.choose(16, 64, 8, r) for r in ("graph", "eager")] == ["flashinfer-lean:tinygemm", "aten"]
    assert "idle" not in t.to_json()["shapes"][0]
    bad = {**v2, "shapes": [{**v2["shapes"][0], "idle": [{"up_to": 0, "path": "aten"}]}]}
    with pytest.raises(HarnessError, match="x shape 16x64 idle"):
        parse_table(bad, "x")


def test_the_segment_fit_leaves_to_f_linear_what_no_path_wins():
    """F.linear above the last range is not a range: a FlashInfer range that wins at low M and only ties F.linear
    above ends where it stops winning, although running it to the top would list as few ranges."""
    from calibrate.segments import segment
    ms = [1, 2, 4, 8, 16, 32]
    cost = {(m, "aten"): 10.0 for m in ms}
    cost.update({(m, "cublaslt"): 8.0 if m <= 4 else 10.0 for m in ms})
    upper = {(m, p): cost[(m, p)] / 10.0 * 1.005 for m, p in cost}
    assert segment(ms, cost, upper, ["aten", "cublaslt"], 0.03, 0.01) == [
        (1, "cublaslt"), (2, "cublaslt"), (4, "cublaslt"), (8, "aten"), (16, "aten"), (32, "aten")]


def test_a_range_over_m_where_the_path_runs_f_linears_kernels_is_judged_where_it_differs():
    """FlashInfer's tuned cuBLASLt differs from F.linear only at the M its tuned entry is reachable at; elsewhere it
    runs F.linear's kernels and costs the same. Judged there by its noise-widened ratio, every such M would break
    the range's span test into islands; as `alike` M they are covered and the test is judged at the others."""
    from calibrate.segments import segment
    ms = [4, 6, 8, 12, 16, 24, 32]
    cost = {(m, "aten"): 10.0 for m in ms}
    cost.update({(m, "cublaslt"): 9.4 if m in (8, 16, 32) else 10.0 for m in ms})
    wins = {(m, "cublaslt"): 0.975 for m in (8, 16, 32)}
    upper = {**{(m, "aten"): 1.0 for m in ms}, **{(m, "cublaslt"): 1.045 for m in ms}, **wins}
    alike = {(m, "cublaslt") for m in (4, 6, 12, 24)}
    islands = segment(ms, cost, upper, ["aten", "cublaslt"], 0.04, 0.01)
    assert [p for _, p in islands] == ["aten", "aten", "cublaslt", "aten", "cublaslt", "aten", "cublaslt"]
    alike_upper = {**upper, **{key: 1.0 for key in alike}}
    one = segment(ms, cost, alike_upper, ["aten", "cublaslt"], 0.04, 0.01, alike=alike)
    assert {p for _, p in one} == {"cublaslt"}  # one range: the alike M at its foot cost nothing to cover
    # a range of alike M alone claims no gain: F.linear keeps it
    none = segment(ms, cost, {**upper, **{(m, "cublaslt"): 1.0 for m in ms}}, ["aten", "cublaslt"], 0.04, 0.01,
                   alike={(m, "cublaslt") for m in ms})
    assert {p for _, p in none} == {"aten"}


def test_a_backends_rule_on_tensors_checks_dtype_layout_alignment_and_device():
    """dispatch.eligible on CPU tensors (device -1): the activation half passes a contiguous bf16 activation on the
    weight's device and fails any other; the weight half wants a bias-free 2-D bf16 CUDA weight on a listed SM."""
    import torch

    from dispatch.backends import BACKENDS
    from dispatch.eligible import accepts, accepts_weight, input_ok
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    assert input_ok(x, -1, 16)
    assert not input_ok(x.float(), -1, 16) and not input_ok(x.t(), -1, 16) and not input_ok(x, 0, 16)
    off = torch.randn(8 * 64 + 1, dtype=torch.bfloat16)[1:].view(8, 64)  # 2 bytes off the 16-byte alignment
    assert off.is_contiguous() and not input_ok(off, -1, 16)
    tiny, w = BACKENDS["tinygemm"], torch.randn(16, 64, dtype=torch.bfloat16)
    assert not accepts_weight(tiny, w, None, 90) and not accepts(tiny, x, w, None, 90)  # a CPU weight
    if torch.cuda.is_available():
        wc = w.cuda()
        assert accepts_weight(tiny, wc, None, 90) and not accepts_weight(tiny, wc, torch.zeros(16).cuda(), 90)
        assert not accepts_weight(tiny, wc, None, 80) and not accepts_weight(tiny, wc[:, :60].contiguous(), None, 90)


def test_cells_know_where_two_paths_ran_the_same_kernels():
    rows = [{"n": 64, "k": 32, "m": m, "path": p, "status": "ok", "gpu_us": 5.0, "host_us": 9.0,
             "kernels": kern, "gpu_samples_us": "5;5"}
            for m, p, kern in [(8, "aten", "nvjet_a"), (8, "cublaslt", "nvjet_a"), (16, "aten", "nvjet_a"),
                               (16, "cublaslt", "nvjet_b"), (32, "aten", ""), (32, "cublaslt", "")]]
    from calibrate.analysis import Cells
    cells = Cells.from_results(pd.DataFrame(rows))
    assert cells.same_kernels(64, 32, 8, "cublaslt")
    assert not cells.same_kernels(64, 32, 16, "cublaslt")
    assert not cells.same_kernels(64, 32, 32, "cublaslt")  # unnamed kernels are not known to be the same
    assert not cells.same_kernels(64, 32, 64, "cublaslt")  # unmeasured


def test_an_eager_cell_costs_f_linears_where_both_calls_are_gpu_bound_on_its_kernels():
    """The lean call runs F.linear's kernels at all three M. Eagerly its cost is F.linear's only where both calls
    are GPU-bound (M = 64: host well below GPU time); at M = 8 the host time decides, and the lean call's is its own."""
    from calibrate.analysis import Cells
    from calibrate.segments import _machine_costs
    from dispatch.backends import ATEN
    lean = "flashinfer-lean:cublaslt"
    rows = []
    for m, gpu, host_aten, host_lean, gpu_lean in [(8, 5.0, 9.0, 12.0, 5.0), (64, 40.0, 9.0, 12.0, 40.4),
                                                   (128, 80.0, 9.0, 78.0, 80.2)]:
        for path, g, h in ((ATEN, gpu, host_aten), (lean, gpu_lean, host_lean)):
            rows.append({"n": 64, "k": 32, "m": m, "path": path, "status": "ok", "gpu_us": g, "gpu_us_p20": 0.99 * g,
                         "gpu_us_p80": 1.01 * g, "host_us": h, "host_us_p20": 0.9 * h, "host_us_p80": 1.1 * h,
                         "kernels": "nvjet_a", "gpu_samples_us": ";".join(str(g * f) for f in (0.99, 1.0, 1.01))})
    cells = Cells.from_results(pd.DataFrame(rows))
    hows = {m: ("eager",) for m in (8, 64, 128)}
    cost, upper, alike = _machine_costs(cells, 64, 32, hows, [ATEN, lean], None)
    assert alike == {(64, lean)}  # at 128 the lean call's host time (p80 85.8) is not below its GPU time
    assert cost[(64, lean)] == cost[(64, ATEN)] == 40.0 and upper[(64, lean)] == 1.0
    assert cost[(8, lean)] == 12.0 and upper[(8, lean)] > 1.0  # host-bound: the lean call's own host time
    _, _, graph_alike = _machine_costs(cells, 64, 32, {m: ("graph",) for m in (8, 64, 128)}, [ATEN, lean], None)
    assert graph_alike == {(8, lean), (64, lean), (128, lean)}


def test_a_model_sum_beyond_the_per_forward_tolerance_picks_the_path_at_its_cells():
    """Two shapes of one model where cuBLASLt is 3% cheaper at M = 2048, a gain no single cell shows beyond its
    noise: the count-weighted sum beats the fit's by more than validate allows, so cuBLASLt is taken there, and only
    there; a forward floor wider than that gain leaves F.linear."""
    from calibrate.forward_noise import ForwardFloor
    from calibrate.segments import Problem, sum_picks
    ms = [1024, 2048]
    problems, choices = {}, {}
    for n in (100, 200):
        cost = {(m, "aten"): 100.0 for m in ms}
        cost.update({(1024, "cublaslt"): 100.0, (2048, "cublaslt"): 97.0})
        problems[("eager", n, 64)] = Problem(ms, cost, {}, {m: "graph" for m in ms})
        choices[("eager", n, 64)] = [(m, "aten") for m in ms]
    uses = {"M": [(100, 64, 3), (200, 64, 1)]}
    picked = sum_picks(choices, problems, ["aten", "cublaslt"], uses, None, capture_size=512)
    assert picked == {("eager", 100, 64, 2048): "cublaslt", ("eager", 200, 64, 2048): "cublaslt"}
    wide = ForwardFloor({"graph": 0.05, "eager": 0.2})
    assert sum_picks(choices, problems, ["aten", "cublaslt"], uses, wide, capture_size=512) == {}
    # vLLM runs M = 2048 eagerly: the graph regime's sum there is not what validate judges
    graph = {("graph", n, k): v for (_, n, k), v in problems.items()}
    assert sum_picks({("graph", n, k): v for (_, n, k), v in choices.items()}, graph, ["aten", "cublaslt"], uses,
                     None, capture_size=512) == {}


def test_refine_names_the_midpoints_of_gaps_where_the_choice_changes():
    from calibrate.segments import cells_spec, refine_cells
    from dispatch.table import ThresholdTable
    table = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()},
                           {(256, 2048): {"graph": ((64, "flashinfer-lean:tinygemm"),), "eager": ()}})
    cells = type("C", (), {"ms": lambda self, n, k: [1, 8, 64, 128, 256],
                           "has": lambda self, n, k, m, p: True})()
    plan = refine_cells(table, cells, {(256, 2048): "n256_k2048"})
    assert plan == {"n256_k2048": [96]} and cells_spec(plan) == "n256_k2048:96"


def test_fit_with_added_cells_fits_their_m_and_refuses_a_cell_twice(tmp_path):
    """--add: a run of the same setup and tactics at another M is fitted with RESULTS (its M is in fitted_ms); a run
    that measures a cell RESULTS has is refused."""
    import json
    import shutil
    import pandas as pd
    from calibrate.__main__ import main
    from harness.errors import HarnessError
    lean = Path(__file__).parent / "data" / "h200-lean-validate"
    added = tmp_path / "added"
    shutil.copytree(lean, added)
    df = pd.read_csv(lean / "results.csv")
    one = df[df["m"] == 1].copy()
    one["m"] = 3
    one.to_csv(added / "results.csv", index=False)
    info = json.loads((lean / "run.json").read_text())
    info["ms"] = [3]
    (added / "run.json").write_text(json.dumps(info))
    out = tmp_path / "t.json"
    assert main(["fit", str(lean), "--gpu", "h200", "--method", "segments", "--add", str(added), "--out-file",
                 str(out)]) == 0
    assert 3 in json.loads(out.read_text())["source"]["fitted_ms"]
    df.to_csv(added / "results.csv", index=False)
    info["ms"] = sorted(set(df["m"]))
    (added / "run.json").write_text(json.dumps(info))
    with pytest.raises(HarnessError, match="measured twice"):
        main(["fit", str(lean), "--gpu", "h200", "--method", "segments", "--add", str(added), "--out-file",
              str(tmp_path / "u.json")])


def test_the_median_machine_is_not_moved_by_one_machine_and_a_consistent_gain_counts():
    """Three machines with the same tactics: the cell's ratio is the median machine's, one machine's slow kernel does
    not move it, and a path faster than F.linear on every machine is judged by its slowest machine's ratio even where
    each machine's own interval reaches 1."""
    from calibrate.segments import median_machine
    aten = {(8, "aten"): 10.0, (16, "aten"): 10.0}

    def machine(r8, r16, up8, up16):
        return ({**aten, (8, "cublaslt"): 10.0 * r8, (16, "cublaslt"): 10.0 * r16},
                {(8, "aten"): 1.0, (16, "aten"): 1.0, (8, "cublaslt"): up8, (16, "cublaslt"): up16}, set())
    own = machine(0.95, 0.91, 0.97, 1.05)
    cost, upper, alike = median_machine(own, [machine(0.96, 0.92, 0.98, 1.03), machine(1.10, 0.90, 1.12, 1.01)])
    assert cost[(8, "cublaslt")] == pytest.approx(9.6) and upper[(8, "cublaslt")] == pytest.approx(0.98)
    assert upper[(16, "cublaslt")] == pytest.approx(0.92)  # every machine below 0.92: a win beyond the noise
    two = median_machine(own, [machine(0.96, 0.92, 0.98, 1.03)])
    assert two[1][(16, "cublaslt")] == pytest.approx(1.04)  # two machines: the median of their intervals' tops
    assert not alike


def test_machine_bars_keep_a_path_off_where_one_machine_loses_beyond_the_tolerance_or_time_where_nothing_is_won():
    from calibrate.segments import machine_bars, segment
    ms = [2, 4, 8]
    paths = ["aten", "cublaslt"]

    def machine(ratios, uppers):
        cost = {**{(m, "aten"): 10.0 for m in ms}, **{(m, "cublaslt"): 10.0 * r for m, r in zip(ms, ratios)}}
        upper = {**{(m, "aten"): 1.0 for m in ms}, **{(m, "cublaslt"): u for m, u in zip(ms, uppers)}}
        return cost, upper, set()
    a = machine([0.94, 1.005, 0.95], [0.95, 1.02, 0.96])
    b = machine([0.95, 1.010, 0.93], [0.98, 1.04, 0.96])
    c = machine([0.96, 0.97, 0.94], [0.99, 1.00, 0.97])
    bars = machine_bars(ms, [a, b, c], paths, tolerance=0.04, min_gain=0.01)
    # M = 4: cuBLASLt wins nowhere beyond the noise and lost time on two machines (F.linear within the tolerance);
    # at M = 2 and 8 F.linear costs more than 4% above a machine's winning cuBLASLt
    assert bars == {(4, "cublaslt"), (2, "aten"), (8, "aten")}
    cost = {key: v for key, v in a[0].items()}
    up = dict(a[1])
    merged = segment(ms, cost, up, paths, 0.04, 0.01)
    assert [p for _, p in merged] == ["cublaslt", "cublaslt", "cublaslt"]  # one range, carried over M = 4
    split = segment(ms, cost, up, paths, 0.04, 0.01, barred=bars)
    assert [p for _, p in split] == ["cublaslt", "aten", "cublaslt"]
    # a machine where F.linear loses 8%: F.linear is barred there
    d = machine([0.94, 0.92, 0.95], [0.97, 0.95, 0.98])
    assert (4, "aten") in machine_bars(ms, [a, d], paths, tolerance=0.04, min_gain=0.01)


def test_load_table_takes_a_profile_name_or_a_file_path(tmp_path, monkeypatch):
    """A string that names a file is a path, whether it is given as text, as a Path or as path=; a profile name is the
    shipped table; where a file in the working folder bears a profile's name, the profile wins and a warning says so."""
    import shutil
    from pathlib import Path

    import dispatch
    shipped = load_table("h200")
    copy = tmp_path / "sub" / "mine.json"
    copy.parent.mkdir()
    shutil.copy(Path(dispatch.__file__).parent / "thresholds" / "h200.json", copy)
    for given in (str(copy), copy, "sub/mine.json"):
        monkeypatch.chdir(tmp_path)
        assert load_table(given).shapes == shipped.shapes
    assert load_table(path=str(copy)).shapes == shipped.shapes
    (tmp_path / "h200").write_text("{}")
    with pytest.warns(UserWarning, match="took the h200 profile's shipped table"):
        assert load_table("h200").shapes == shipped.shapes
    with pytest.raises(HarnessError, match="names its FlashInfer tactics .*which is missing"):
        dispatch.configure(str(copy))  # a table without the files it names beside it is refused
    for name in ("h200.autotune.json", "h200.autotune.gemv.json"):
        shutil.copy(Path(dispatch.__file__).parent / "thresholds" / name, copy.parent / name)
    dispatch.configure(str(copy))  # configure takes a file as well
    dispatch.reset()


def test_the_first_bind_builds_the_cpp_layer_once_where_the_tools_are_there(tmp_path, monkeypatch, capsys):
    """No build of the C++ layer yet: the first dispatch.bind builds it (one line saying so) where a compiler and
    ninja are on PATH and BLB_NATIVE_BUILD is not 0; a failed build leaves the Python layer, said once; a process
    tries once."""
    import torch

    import dispatch
    from dispatch import lean, native
    monkeypatch.setenv("BLB_NATIVE_DIR", str(tmp_path / "native"))
    monkeypatch.setenv("BLB_NATIVE_BUILD", "1")
    monkeypatch.setattr(native, "_LOADED", [])
    monkeypatch.setattr(native, "_TRIED", [])
    monkeypatch.setattr(lean, "_WARNED", set())
    built = []

    def fake_build(verbose=False):
        built.append(True)
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(native, "build", fake_build)
    monkeypatch.setattr(native, "toolchain_missing", lambda: [])
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    layer = dispatch.bind(w)
    dispatch.bind(w)
    err = capsys.readouterr().err
    assert built == [True] and dispatch.layer_kind(layer) == "Python"
    assert "building the C++ bound layer once" in err and "did not build (no compiler here)" in err
    monkeypatch.setattr(native, "_TRIED", [])
    monkeypatch.setattr(native, "_LOADED", [])
    monkeypatch.setenv("BLB_NATIVE_BUILD", "0")
    dispatch.bind(w)
    monkeypatch.setenv("BLB_NATIVE_BUILD", "1")
    monkeypatch.setattr(native, "toolchain_missing", lambda: ["ninja"])
    dispatch.bind(w)
    assert built == [True]  # turned off, or no tools: nothing is compiled


def _clock_step(passes=("p1", "p1")):
    """A cell on a GPU whose clock drops by 10% after five rounds: F.linear met the stopping criterion in the fast
    rounds (five samples), the path ran on into the slow ones (ten); side by side it is 0.92x F.linear throughout."""
    fast, slow = [745.0 * (1 + d) for d in (-0.001, 0.0, 0.001, 0.0005, -0.0005)], [820.0] * 5
    path = [x * 0.92 for x in fast] + [x * 0.92 for x in slow]
    rows = [{"n": 8192, "k": 2048, "m": 16384, "path": p, "status": "ok", "gpu_us": float(np.median(s)),
             "host_us": 20.0, "gpu_samples_us": ";".join(f"{x:.3f}" for x in s), "tp": 1, "in_cuda_graph": True,
             "replay_pass": rp}
            for p, s, rp in (("aten", fast, passes[0]), ("flashinfer-lean:cublaslt", path, passes[1]))]
    return Cells.from_results(pd.DataFrame(rows))


def test_paths_timed_side_by_side_pair_over_the_rounds_both_ran():
    """Rows of one interleaved pass pair their samples over the rounds both ran: a clock step after F.linear stopped
    does not turn a 0.92x path into a tie. Rows of different passes (or without one) compare their medians."""
    from calibrate.analysis import calibrated_ratio
    cells = _clock_step()
    a, b, paired = cells.side_by_side(8192, 2048, 16384, "flashinfer-lean:cublaslt", "aten")
    assert paired and len(a) == len(b) == 5
    ratio, lo, hi = calibrated_ratio(cells, 8192, 2048, 16384, "flashinfer-lean:cublaslt", "aten", None, 0)
    assert ratio == pytest.approx(0.92) and hi < 0.93
    assert cells.gpu_ratio(8192, 2048, 16384, "flashinfer-lean:cublaslt", "aten") == pytest.approx(0.92)
    assert cells.gpu_beside_aten(8192, 2048, 16384, "flashinfer-lean:cublaslt") == pytest.approx(0.92 * 745.0)
    for passes in (("p1", "p2"), ("", "")):
        apart = _clock_step(passes)
        assert not apart.side_by_side(8192, 2048, 16384, "flashinfer-lean:cublaslt", "aten")[2]
        ratio, lo, hi = calibrated_ratio(apart, 8192, 2048, 16384, "flashinfer-lean:cublaslt", "aten", None, 0)
        assert ratio > 0.96 and hi > 1.0  # the medians straddle the step: no win beyond the noise
        assert apart.gpu_beside_aten(8192, 2048, 16384, "flashinfer-lean:cublaslt") == pytest.approx(
            apart.gpu(8192, 2048, 16384, "flashinfer-lean:cublaslt"))


def test_the_forward_veto_asks_the_cells_side_by_side_not_by_unpaired_medians():
    """A forward measured a path slower than all-aten; the fit vetoes it unless the cells say it is no slower. A
    path 0.97x F.linear in every round both ran, whose later rounds ran on into a clock fall, has the larger median:
    side by side the cells say no slower (the veto is left to them); timed in other passes, its median speaks."""
    from calibrate.commands.fit import _cells_say_no_slower
    fast = [745.0 * (1 + d) for d in (-0.001, 0.0, 0.001, 0.0005, -0.0005)]
    path = [x * 0.97 for x in fast] + [820.0 * 0.97] * 5
    uses = [(8192, 2048, 10)]
    for passes, no_slower in ((("p1", "p1"), True), (("p1", "p2"), False)):
        rows = [{"n": 8192, "k": 2048, "m": 16384, "path": p, "status": "ok", "gpu_us": float(np.median(s)),
                 "host_us": 20.0, "gpu_samples_us": ";".join(f"{x:.3f}" for x in s), "tp": 1, "in_cuda_graph": True,
                 "replay_pass": rp}
                for p, s, rp in (("aten", fast, passes[0]), ("flashinfer-lean:cublaslt", path, passes[1]))]
        cells = Cells.from_results(pd.DataFrame(rows))
        assert cells.gpu(8192, 2048, 16384, "flashinfer-lean:cublaslt") > cells.gpu(8192, 2048, 16384, "aten")
        assert _cells_say_no_slower(cells, uses, 16384, "flashinfer-lean:cublaslt", "graph") is no_slower
        assert _cells_say_no_slower(cells, uses, 16384, "flashinfer-lean:cublaslt", "eager") is no_slower


def test_the_per_forward_sum_charges_each_path_for_the_rounds_it_shared_with_f_linear():
    """validate's cell-sum: a table running the path that ran on into a clock fall costs 0.92x F.linear's forward
    (the rounds both ran), not the ratio of its median over ten rounds, five of them slow, to F.linear's over five
    fast ones; rows of different passes still compare their medians."""
    from calibrate.analysis import forward_totals
    table = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()},
                           {(8192, 2048): {"graph": ((16384, "flashinfer-lean:cublaslt"),),
                                           "eager": ((16384, "flashinfer-lean:cublaslt"),)}})
    uses = {"model": [(8192, 2048, 10)]}
    for passes in (("p1", "p1"), ("p1", "p2")):
        cells = _clock_step(passes)
        ratio = 0.92 if passes[0] == passes[1] else (cells.gpu(8192, 2048, 16384, "flashinfer-lean:cublaslt")
                                                     / cells.gpu(8192, 2048, 16384, "aten"))
        assert passes[0] == passes[1] or ratio > 0.95  # the unpaired medians straddle the clock fall
        totals = forward_totals(cells, table, uses, capture_size=512).set_index("regime")
        assert totals.at["graph", "dispatch_us"] / totals.at["graph", "aten_us"] == pytest.approx(ratio, rel=1e-3)
        assert totals.at["graph", "aten_us"] == pytest.approx(10 * 745.0, rel=1e-3)


def test_a_run_before_the_replay_pass_column_pairs_only_what_one_pass_timed():
    """A results table without replay_pass: a public FlashInfer call beside its lean twin, or the dispatcher, pairs
    only where it was read off a twin (gpu_from); every other row of a run pairs; a resumed run pairs nothing."""
    from bench.results import LEGACY_PASS, legacy_passes
    df = pd.DataFrame({"n": [64] * 5 + [128], "k": [2048] * 6, "m": [8] * 6,
                       "path": ["aten", "flashinfer-lean:cublaslt", "flashinfer:cublaslt", "flashinfer:tinygemm",
                                "dispatch", "flashinfer:cublaslt"],
                       "gpu_from": ["", "", "flashinfer-lean:cublaslt", "", "", ""]})
    assert legacy_passes(df, resumed=False) == [LEGACY_PASS, LEGACY_PASS, LEGACY_PASS, LEGACY_PASS, "", LEGACY_PASS]
    assert legacy_passes(df.assign(gpu_from=""), resumed=False)[2] == ""
    assert legacy_passes(df, resumed=True) == [""] * 6


@pytest.mark.parametrize("shapes, needle", [
    ([{"n": 2560.5, "k": 4096}], "positive integers n and k"),
    ([{"n": 2560.0, "k": 4096}], "positive integers n and k"),
    ([{"n": True, "k": 4096}], "positive integers n and k"),
    ([{"n": "2560", "k": 4096}], "positive integers n and k"),
    ([{"n": 0, "k": 4096}], "positive integers n and k"),
    ([{"n": 2560, "k": -4096}], "positive integers n and k"),
    ([{"n": 2560, "k": 4096}, {"n": 2560, "k": 4096}], "listed twice"),
])
def test_a_tables_shape_is_a_pair_of_positive_integers_once(shapes, needle):
    from dispatch.table import parse_table
    v2 = json.loads((Path(__file__).parent.parent / "dispatch" / "thresholds" / "h200.json").read_text())
    regimes = {"graph": [{"up_to": 8, "path": "aten"}], "eager": []}
    with pytest.raises(HarnessError, match=needle):
        parse_table({**v2, "shapes": [{**s, **regimes} for s in shapes]}, "x")


def test_a_shipped_table_of_another_profile_is_refused(tmp_path, monkeypatch):
    import harness.shipped as shipped
    from dispatch.table import load_table
    folder = tmp_path / "dispatch" / "thresholds"
    folder.mkdir(parents=True)
    b200 = (Path(__file__).parent.parent / "dispatch" / "thresholds" / "b200.json").read_text()
    (folder / "h200.json").write_text(b200)
    monkeypatch.setattr(shipped, "PACKAGES", tmp_path)
    with pytest.raises(HarnessError, match="is the b200 profile's table, not the h200 profile's"):
        load_table("h200")
    assert load_table(path=folder / "h200.json").profile == "b200"  # by path: the user's file, taken as it is


def test_a_gpu_bound_eager_forward_judges_a_call_that_submits_slower_by_its_host_time_too():
    """In an eager forward found GPU-bound with F.linear (judged by GPU time), a call whose submission is slower than
    F.linear's beyond the spread and not covered by its own GPU time costs max(host, GPU) as well: at M = 8 the lean
    call's 30 µs submission over a 10 µs kernel; at M = 64 its kernel (60 µs) covers the same submission."""
    from calibrate.analysis import Cells
    from calibrate.segments import _machine_costs
    from dispatch.backends import ATEN
    lean = "flashinfer-lean:cublaslt"
    rows = []
    for m, gpu_aten, gpu_lean in [(8, 11.0, 10.0), (64, 62.0, 60.0)]:
        for path, g, h in ((ATEN, gpu_aten, 12.0), (lean, gpu_lean, 30.0)):
            rows.append({"n": 64, "k": 32, "m": m, "path": path, "status": "ok", "gpu_us": g, "gpu_us_p20": 0.99 * g,
                         "gpu_us_p80": 1.01 * g, "host_us": h, "host_us_p20": 0.95 * h, "host_us_p80": 1.05 * h,
                         "kernels": f"k_{path}", "gpu_samples_us": ";".join(str(g * f) for f in (0.99, 1.0, 1.01))})
    cells = Cells.from_results(pd.DataFrame(rows))
    graph_judged = {m: ("graph",) for m in (8, 64)}
    eager_cost, _, _ = _machine_costs(cells, 64, 32, graph_judged, [ATEN, lean], None, "eager")
    assert eager_cost[(8, lean)] == pytest.approx(30.0) and eager_cost[(8, ATEN)] == pytest.approx(11.0)
    assert eager_cost[(64, lean)] == pytest.approx(60.0)  # GPU-bound itself: its GPU time
    graph_cost, _, _ = _machine_costs(cells, 64, 32, graph_judged, [ATEN, lean], None, "graph")
    assert graph_cost[(8, lean)] == pytest.approx(10.0)  # captured: submission is not paid per call


def _vetoed_cells():
    """One shape where cuBLASLt (lean and public, the same kernel) is 5% faster than F.linear at M = 512 and 20%
    slower at M = 8; the table runs F.linear at 512."""
    times = {}
    for m, aten, lt in ((8, 10.0, 12.0), (512, 100.0, 95.0)):
        times[(64, 2048, m, "aten")] = (aten, 10.0)
        times[(64, 2048, m, "flashinfer-lean:cublaslt")] = (lt, 9.0)
        times[(64, 2048, m, "flashinfer:cublaslt")] = (lt, 90.0)
    return Cells.from_results(_synthetic(times))


def test_a_path_the_fit_vetoed_at_a_cell_is_no_oracle_there_and_is_named():
    """A veto recorded in the table's source (a measured forward ran slower with the path alone than all-aten) takes
    the path, and the public call of its backend, out of the oracle at that cell: F.linear is then the best there,
    and the cell says which vetoed path was faster and by how much. Without the veto the cell is SLOWER."""
    from calibrate.analysis import forward_vetoes
    cells = _vetoed_cells()
    table = ThresholdTable.from_thresholds("h200", "tinygemm", 0, path=LOW)
    plain = cell_verdicts(cells, table).set_index("m")
    assert plain.loc[512, "verdict"] == "SLOWER" and plain.loc[512, "vetoed"] == ""
    table.source["measured_forwards"] = {"vetoes": {"graph 64x2048 M=512": ["flashinfer-lean:cublaslt"]}}
    assert forward_vetoes(table) == {("graph", 64, 2048, 512): frozenset({"flashinfer-lean:cublaslt"})}
    v = cell_verdicts(cells, table).set_index("m")
    assert v.loc[512, "verdict"] == "SAME" and v.loc[512, "oracle"] == "aten"
    assert v.loc[512, "vetoed"] in ("flashinfer-lean:cublaslt", "flashinfer:cublaslt")
    assert v.loc[512, "vetoed_regret"] == pytest.approx(100 / 95 - 1)
    assert v.loc[8, "vetoed"] == "" and v.loc[8, "verdict"] == "SAME"
    assert cell_verdicts(cells, table, vetoes={}).set_index("m").loc[512, "verdict"] == "SLOWER"


def test_an_unreadable_veto_in_a_table_is_refused_in_one_line():
    from calibrate.analysis import forward_vetoes
    table = ThresholdTable.from_thresholds("h200", "tinygemm", 0, path=LOW)
    table.source["measured_forwards"] = {"vetoes": {"graph 64 by 2048": ["flashinfer-lean:cublaslt"]}}
    with pytest.raises(HarnessError, match="is not 'REGIME NxK M=m'"):
        forward_vetoes(table)


def test_a_check_forward_confirms_or_refutes_a_veto_where_it_measured_the_path():
    """forward_model.judged_vetoes (validate and the report): a check forward of a model using the shape that
    measured the vetoed path alone slower than all-aten beyond the noise confirms the veto; one that measured it no
    slower refutes it (the cell is judged against every path again); one that did not measure it leaves it
    standing."""
    from calibrate.analysis import forward_vetoes
    from calibrate.forward_model import judged_vetoes
    from tests.test_vllm import _forward
    table = ThresholdTable.from_thresholds("h200", "tinygemm", 0, path=LOW)
    table.source["measured_forwards"] = {"vetoes": {"graph 64x2048 M=512": ["flashinfer-lean:cublaslt"]}}
    uses = {"Model": [(64, 2048, 4)]}
    slower = _forward({("Model", 512): {"aten": 100.0, "flashinfer-lean:cublaslt": 106.0}}, regimes=("graph",))
    kept, lines = judged_vetoes(table, [slower], uses, None)
    assert kept == {("graph", 64, 2048, 512): frozenset({"flashinfer-lean:cublaslt"})}
    assert "confirm 1, refute 0" in lines[0]
    faster = _forward({("Model", 512): {"aten": 100.0, "flashinfer-lean:cublaslt": 96.0}}, regimes=("graph",))
    kept, lines = judged_vetoes(table, [faster], uses, None)
    assert kept == {} and "refute 1" in lines[0] and "graph 64x2048 M=512 flashinfer-lean:cublaslt" in lines[1]
    other = _forward({("Other", 512): {"aten": 100.0, "flashinfer-lean:cublaslt": 96.0}}, regimes=("graph",))
    kept, lines = judged_vetoes(table, [other], uses, None)
    assert kept == forward_vetoes(table) and "did not measure 1" in lines[0]


def test_a_vetoed_path_covers_no_cell_at_that_m_in_the_segment_fit():
    """fit_segments: cuBLASLt 5% faster than F.linear at M = 512 is chosen there; vetoed at 512 (its model's forward
    ran slower with it), F.linear covers 512 and cuBLASLt keeps no range there."""
    from calibrate.segments import fit_segments
    cells = _vetoed_cells()
    base = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()})
    table, _ = fit_segments(cells, base)
    assert table.choose(64, 2048, 512, "graph") == "flashinfer-lean:cublaslt"
    vetoed, _ = fit_segments(cells, base, vetoes={("graph", 64, 2048, 512): {"flashinfer-lean:cublaslt"}})
    assert vetoed.choose(64, 2048, 512, "graph") == "aten" and vetoed.choose(64, 2048, 8, "graph") == "aten"


def test_a_fit_on_a_gpu_without_a_shipped_floor_measures_one_from_its_machines(tmp_path, monkeypatch, capsys):
    """calibrate fit --machine where the profile ships no noise floor: the floor of the machines it fits on (as
    calibrate noise over them) widens the cells' intervals, is said once and is recorded in the table's source; with
    a floor given (--noise), that one is used."""
    import shutil
    from calibrate.__main__ import main
    from calibrate.commands import fit as fit_cmd
    lean = Path(__file__).parent / "data" / "h200-lean-validate"
    other = tmp_path / "machine-2"
    shutil.copytree(lean, other)
    df = pd.read_csv(lean / "results.csv")
    factor = 1 + 0.02 * np.sin(np.arange(len(df)))  # another machine: each cell a little apart
    for col in ("gpu_us", "gpu_us_p20", "gpu_us_p80"):
        df[col] = df[col] * factor
    df["gpu_samples_us"] = [";".join(f"{float(v) * f:.4f}" for v in str(s).split(";")) if s == s else s
                            for s, f in zip(df["gpu_samples_us"], factor)]
    df.to_csv(other / "results.csv", index=False)
    monkeypatch.setattr(fit_cmd, "load_noise", lambda profile, path=None: None)
    out = tmp_path / "t.json"
    assert main(["fit", str(lean), "--gpu", "h200", "--method", "segments", "--machine", str(other), "--out-file",
                 str(out)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "ships no noise floor" in line]
    floor = json.loads(out.read_text())["source"]["noise_floor"]
    assert len(said) == 1 and floor["file"].startswith("none: measured by the fit")
    assert floor["source"]["runs"] == [str(lean), str(other)] and max(b["half_width"] for b in floor["bands"]) > 0
    given = tmp_path / "floor.json"
    given.write_text(json.dumps({"format": 1, "level": 0.95, "bands": [{"ref_gpu_us_up_to": None, "half_width": 0.0}]}))
    from calibrate.noise import load_noise
    monkeypatch.setattr(fit_cmd, "load_noise", load_noise)
    assert main(["fit", str(lean), "--gpu", "h200", "--method", "segments", "--machine", str(other), "--noise",
                 str(given), "--out-file", str(tmp_path / "t2.json")]) == 0
    assert "ships no noise floor" not in capsys.readouterr().out
    assert json.loads((tmp_path / "t2.json").read_text())["source"]["noise_floor"]["file"] == str(given)
