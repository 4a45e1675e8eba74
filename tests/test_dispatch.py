"""CPU tests of the dispatcher: verdicts, fitting and per-forward totals, on a synthetic table and the H200 sweep."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.results import load_results
from calibrate.analysis import Cells, cell_verdicts, fit, model_uses, ratio_ci, verdict
from dispatch.table import ThresholdTable, load_table, parse_table
from harness.errors import HarnessError

DATA = Path(__file__).parent / "data"


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


def test_fit_finds_each_shapes_own_threshold():
    # (64, 2048): the low-M kernel wins up to M = 16 and loses from 32. (2048, 4096): it never wins.
    times = {}
    for m in (1, 8, 16, 32, 64, 1024):
        times[(64, 2048, m, "aten")] = (5.0, 20.0)
        times[(64, 2048, m, "flashinfer:tinygemm")] = (3.0 if m <= 16 else 8.0, 90.0)
        times[(2048, 4096, m, "aten")] = (8.0, 20.0)
        times[(2048, 4096, m, "flashinfer:tinygemm")] = (9.0, 90.0)
    df = _synthetic(times)
    cells = Cells.from_results(df)
    uses = model_uses(df)
    assert uses == {"Qwen3.5-35B-A3B": [(64, 2048, 30), (2048, 4096, 40)]}
    table, report = fit(cells, ThresholdTable("h200", "tinygemm", 0), uses, capture_size=512)
    # whichever way the global value and overrides split it, each shape gets its own best threshold
    assert table.threshold(64, 2048) == 16 and table.threshold(2048, 4096) == 0
    assert report.set_index(["n", "k"]).loc[(64, 2048), "crossover_m"] == 32


def test_verdicts_on_cells_with_known_answers():
    """Synthetic cells whose answers are known: the low-M kernel 40% faster, 60% slower or 1% slower than aten, and a
    table that chooses wrongly on purpose."""
    times = {(64, 2048, 1, "aten"): (5.0, 20.0), (64, 2048, 1, "flashinfer:tinygemm"): (3.0, 90.0),   # FASTER
             (64, 2048, 64, "aten"): (5.0, 20.0), (64, 2048, 64, "flashinfer:tinygemm"): (8.0, 90.0),  # SLOWER
             (64, 2048, 8, "aten"): (5.0, 20.0), (64, 2048, 8, "flashinfer:tinygemm"): (5.05, 90.0)}   # SAME
    cells = Cells.from_results(_synthetic(times))
    v = cell_verdicts(cells, ThresholdTable("h200", "tinygemm", 8)).set_index("m")
    assert v["low_m_vs_aten"].to_dict() == {1: "FASTER", 8: "SAME", 64: "SLOWER"}
    assert v.loc[1, "verdict"] == "SAME" and v.loc[1, "chosen"] == "flashinfer:tinygemm"  # it chose the best
    assert v.loc[64, "verdict"] == "SAME" and v.loc[64, "chosen"] == "aten"
    assert v.loc[8, "verdict"] == "SAME"  # 1% apart: inside the 3% margin
    wrong = cell_verdicts(cells, ThresholdTable("h200", "tinygemm", 1024)).set_index("m")
    assert wrong.loc[64, "verdict"] == "SLOWER" and wrong.loc[64, "regret"] == pytest.approx(0.6, abs=0.01)
    never = cell_verdicts(cells, ThresholdTable("h200", "tinygemm", 0)).set_index("m")
    assert never.loc[1, "verdict"] == "SLOWER" and never.loc[8, "verdict"] == "SAME"

def test_table_files():
    t = load_table("h200")
    assert t.profile == "h200" and t.low_m_backend == "tinygemm" and t.source.get("fingerprint")
    assert load_table("gb200").default_threshold == 32
    with pytest.raises(HarnessError, match="not found"):
        load_table("nope")
    with pytest.raises(HarnessError, match="lacks"):
        parse_table({"profile": "h200"}, "x")
    with pytest.raises(HarnessError, match="malformed"):
        parse_table({"profile": "h200", "low_m_backend": "tinygemm", "default_threshold": 1,
                     "overrides": [{"n": 1}]}, "x")


def test_committed_h200_table_holds_on_both_runs():
    from calibrate.__main__ import main
    assert main(["validate", str(DATA / "h200-sweep")]) == 0
    # out of sample: a second run, stopped at 375 of 400 groups, so judged as a partial run
    assert main(["validate", str(DATA / "h200-sweep-2"), "--partial"]) == 0


def test_the_seed_threshold_fails_on_h200(capsys):
    import os
    import tempfile

    from calibrate.__main__ import main
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        json.dump({"profile": "h200", "low_m_backend": "tinygemm", "default_threshold": 32}, open(path, "w"))
        assert main(["validate", str(DATA / "h200-sweep"), "--thresholds", path]) == 1
    assert "FAIL" in capsys.readouterr().out


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
    import dispatch
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
