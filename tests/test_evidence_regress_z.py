"""Evidence checks of docs/results-h200.md, "The regression gate on machines Z2 and Z3": the one failing cell, the
old and new harness on it, its two modes across earlier runs, and the baseline rebuilt from machines K, P, Q, Z2."""
import json
import statistics
from pathlib import Path

import pandas as pd
import pytest
from test_evidence_machines_wx import gpu_uuid, gpus_in

from bench.results import load_results
from calibrate.baseline import REGRESSION_MS, cells_from_results, compare, load_baseline, merge_runs
from calibrate.regress import regression_paths
from dispatch.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "evidence"
Z2, Z3 = EVIDENCE / "h200-regress-20261202T0713-Z2", EVIDENCE / "h200-lmhead-tinygemm-20261202-Z3"
SOURCES = [EVIDENCE / p for p in ("h200-table-h200-20261201g/sweep", "h200-table-h200-20261201h/check-sweep",
                                  "h200-regress-20261201T2356-Q/fresh", "h200-regress-20261201T2356-Q/remeasure",
                                  "h200-regress-20261202T0713-Z2/fresh", "h200-regress-20261202T0713-Z2/remeasure")]
LM_M1 = (248320, 2560, 1, "flashinfer:tinygemm")
H200 = get_profile("h200")


def _cells(folder: Path):
    """A run's cells at the regression grid's M, as calibrate baseline --from reads them."""
    df = load_results(folder)
    return cells_from_results(df[df["m"].isin(REGRESSION_MS)], regression_paths(H200)[1:])


def _run_h_baseline(tmp_path: Path):
    from subprocess import check_output
    path = tmp_path / "h200.json"
    path.write_bytes(check_output(["git", "-C", str(ROOT), "show", "2b6f7dd:tests/baselines/h200.json"]))
    return load_baseline(path)


@pytest.mark.evidence
def test_z2_and_z3_are_new_gpus():
    earlier = gpus_in("gpu-machine-[A-Z].txt")
    z2, z3 = gpu_uuid(Z2 / "gpu-machine-Z2.txt"), gpu_uuid(Z3 / "gpu-machine-Z3.txt")
    assert z2 != z3 and not {z2, z3} & earlier


@pytest.mark.evidence
def test_the_one_failing_cell_and_the_other_gpu_tests(tmp_path):
    log = (Z2 / "regress.log").read_text()
    assert "1 failed, 1 passed" in log and "n248320_k2560 M=1 flashinfer:tinygemm: GPU ratio 1.669" in log
    assert "31 passed, 1 skipped" in (Z2 / "gputests.log").read_text()
    fresh = {c.key: c for c in _cells(Z2 / "fresh")}
    again = {c.key: c for c in _cells(Z2 / "remeasure")}
    assert (round(fresh[LM_M1].gpu_ratio, 3), round(again[LM_M1].gpu_ratio, 3)) == (1.473, 1.669)
    stored = {c.key: c for c in _run_h_baseline(tmp_path).cells}[LM_M1]
    assert (stored.gpu_ratio_lo, stored.gpu_ratio_hi) == (1.14099, 1.37836)
    assert fresh[LM_M1].kernels == stored.kernels


@pytest.mark.evidence
def test_old_and_new_harness_agree_on_the_cell():
    ratio = {}
    for run in ("new1", "new2", "new3", "old1", "old2", "old3"):
        info = json.loads((Z3 / run / "run.json").read_text())
        assert ("harness_source" in info["fingerprint"]) == run.startswith("new")
        ratio[run] = {c.key: c.gpu_ratio for c in _cells(Z3 / run)}[LM_M1]
    new, old = [ratio[f"new{i}"] for i in (1, 2, 3)], [ratio[f"old{i}"] for i in (1, 2, 3)]
    assert 1.740 < min(new) and max(new) < 1.747 and 1.733 < min(old) and max(old) < 1.746
    assert abs(statistics.median(new) / statistics.median(old) - 1) < 0.005


@pytest.mark.evidence
def test_the_cell_has_two_modes_across_earlier_runs():
    ratios = []
    for f in sorted(EVIDENCE.glob("*/results.csv")):
        d = pd.read_csv(f, usecols=lambda c: c in ("shape", "m", "path", "gpu_us"))
        d = d[(d["shape"] == "n248320_k2560") & (d["m"] == 1)].groupby("path")["gpu_us"].median()
        if {"aten", "flashinfer:tinygemm"} <= set(d.index):
            ratios.append(d["flashinfer:tinygemm"] / d["aten"])
    assert len(ratios) == 13 and (round(min(ratios), 2), round(max(ratios), 2)) == (1.35, 1.72)
    assert sum(r < 1.41 for r in ratios) == 7 and sum(r > 1.65 for r in ratios) == 4


@pytest.mark.evidence
def test_the_shipped_baseline_is_the_six_runs_and_holds_z3(tmp_path):
    shipped = load_baseline(ROOT / "tests" / "baselines" / "h200.json")
    assert [s["results"] for s in shipped.sources] == [str(p.relative_to(ROOT)) for p in SOURCES]
    rebuilt = merge_runs([_cells(p) for p in SOURCES])
    assert rebuilt == shipped.cells and len(rebuilt) == 218
    cell = {c.key: c for c in shipped.cells}[LM_M1]
    assert (cell.gpu_ratio_lo, cell.gpu_ratio_hi) == (1.14099, 1.67186)
    caught = sum(c.gpu_ratio * 1.10 > c.gpu_ratio_hi * (1 + shipped.tolerance) for c in shipped.cells)
    assert caught == 214
    run_h = _run_h_baseline(tmp_path)
    assert sum(c.gpu_ratio * 1.10 > c.gpu_ratio_hi * (1 + run_h.tolerance) for c in run_h.cells) == 180
    now = {c.key: c for c in shipped.cells}
    wider = [((now[c.key].gpu_ratio_hi - now[c.key].gpu_ratio_lo) / now[c.key].gpu_ratio)
             / ((c.gpu_ratio_hi - c.gpu_ratio_lo) / c.gpu_ratio) for c in run_h.cells]
    assert (round(statistics.median(wider), 2), round(sorted(wider)[int(0.9 * len(wider))], 2)) == (1.28, 2.04)
    for run in ("new1", "new2", "new3", "old1", "old2", "old3"):
        fresh = [c for c in _cells(Z3 / run) if c.key in {k.key for k in shipped.cells}]
        assert {c.status for c in compare(shipped, fresh) if c.cell.key in {f.key for f in fresh}} == {"ok"}
        assert "FAIL" in {c.status for c in compare(run_h, fresh) if c.cell.key == LM_M1}
