"""CPU tests of the dispatcher: verdicts, fitting and per-forward totals, on a synthetic table and the H200 sweep."""
import json

import numpy as np
import pandas as pd
import pytest

from bench.results import load_results
from calibrate.analysis import Cells, cell_verdicts, fit, forward_totals, model_uses, ratio_ci, verdict
from dispatch.table import ThresholdTable, load_table, parse_table
from harness.errors import HarnessError


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


def test_fit_and_verdicts_by_hand():
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
    base = ThresholdTable("h200", "tinygemm", 0)
    table, report = fit(cells, base, uses, capture_size=512)
    # whichever way the global value and overrides split it, each shape gets its own best threshold
    assert table.threshold(64, 2048) == 16 and table.threshold(2048, 4096) == 0
    assert report.set_index(["n", "k"]).loc[(64, 2048), "crossover_m"] == 32
    v = cell_verdicts(cells, table)
    assert set(v["verdict"]) == {"SAME"}
    wrong = ThresholdTable("h200", "tinygemm", 1024)
    v = cell_verdicts(cells, wrong).set_index(["n", "k", "m"])
    assert v.loc[(64, 2048, 32), "verdict"] == "SLOWER" and v.loc[(2048, 4096, 1), "verdict"] == "SLOWER"
    assert v.loc[(64, 2048, 32), "regret"] == pytest.approx(8 / 5 - 1, rel=1e-3)
    tot = forward_totals(cells, table, uses, capture_size=16).set_index(["model", "m", "regime"])
    g = tot.loc[("Qwen3.5-35B-A3B", 1, "graph")]
    assert g["dispatch_us"] == pytest.approx(30 * 3 + 40 * 8) and g["aten_us"] == pytest.approx(30 * 5 + 40 * 8)
    assert g["flashinfer_us"] == pytest.approx(30 * 3 + 40 * 9) and bool(g["actual"])
    e = tot.loc[("Qwen3.5-35B-A3B", 32, "eager")]  # above capture: max(host, GPU), FlashInfer host-bound
    assert bool(e["actual"]) and e["aten_us"] == pytest.approx(70 * 20) and e["flashinfer_us"] == pytest.approx(70 * 90)


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
    assert main(["validate", "tests/data/h200-sweep"]) == 0
    # out of sample: a second run, stopped at 375 of 400 groups, so judged as a partial run
    assert main(["validate", "tests/data/h200-sweep-2", "--partial"]) == 0


def test_the_seed_threshold_fails_on_h200(capsys):
    from calibrate.__main__ import main
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        json.dump({"profile": "h200", "low_m_backend": "tinygemm", "default_threshold": 32}, open(path, "w"))
        assert main(["validate", "tests/data/h200-sweep", "--thresholds", path]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_validate_refuses_other_gpu_and_bad_files(tmp_path):
    from calibrate.__main__ import main
    df = load_results("tests/data/h200-sweep")
    info = json.load(open("tests/data/h200-sweep/run.json"))
    info["fingerprint"]["gpu_name"] = "NVIDIA B200"
    info["fingerprint"]["sm"] = 100
    df.head(50).to_csv(tmp_path / "results.csv", index=False)
    (tmp_path / "run.json").write_text(json.dumps(info))
    with pytest.raises(HarnessError, match="not on a h200"):
        main(["validate", str(tmp_path), "--gpu", "h200"])
    (tmp_path / "run.json").write_text(open("tests/data/h200-sweep/run.json").read())
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
