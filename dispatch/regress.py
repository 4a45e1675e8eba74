"""(GPU) Measure the regression grid, write a baseline from it, or check it against the stored baseline with one
automatic re-measurement of failing cells. Used by `python -m dispatch baseline|regress`, `make baseline` and the
GPU regression tests."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.paths import PATHS
from bench.profiles import GpuProfile
from bench.results import load_results, load_run_info
from dispatch.baseline import (REGRESSION_MS, Baseline, BaselineCell, CellCheck, cells_from_results, compare,
                               fingerprint_mismatch, fingerprint_of)
from shapes.catalog import Shape, catalog


def regression_paths(profile: GpuProfile) -> list[str]:
    """aten, the low-M backend and FlashInfer's cuBLASLt: the paths a dispatch decision chooses between."""
    return list(dict.fromkeys(("aten", f"flashinfer:{profile.low_m_backend}", "flashinfer:cublaslt")))


def measure(profile: GpuProfile, out: Path, shapes: list[Shape] | None = None, ms: tuple[int, ...] = REGRESSION_MS,
            samples: int = 10) -> tuple[list[BaselineCell], dict]:
    """Runs the regression grid through the bench sweep into `out`; returns its cells and run info."""
    from bench.sweep import SweepConfig, run_sweep
    cfg = SweepConfig(profile=profile, shapes=shapes or catalog(), ms=list(ms),
                      paths=[PATHS[p] for p in regression_paths(profile)], out=out, samples=samples,
                      command=["(regression grid, run by)", *sys.argv])  # run.json also lists its shapes and M
    run_sweep(cfg)
    return cells_from_results(load_results(out), regression_paths(profile)[1:]), load_run_info(out)


@dataclass
class RegressionRun:
    checks: list[CellCheck]
    remeasured: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    fingerprint_problems: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[CellCheck]:
        return [c for c in self.checks if c.status != "ok"]


def regress(profile: GpuProfile, baseline: Baseline, work: Path, tolerance: float | None = None,
            samples: int = 10) -> RegressionRun:
    """Fresh measurement of the baseline's cells, compared; failing cells measured once more and compared again."""
    t0 = time.perf_counter()
    by_name = {s.name: s for s in catalog()}
    shapes = [by_name[n] for n in dict.fromkeys(c.shape for c in baseline.cells) if n in by_name]
    ms = tuple(sorted({c.m for c in baseline.cells}))
    fresh, info = measure(profile, work / "fresh", shapes, ms, samples)
    run = RegressionRun(compare(baseline, fresh, tolerance),
                        fingerprint_problems=fingerprint_mismatch(baseline.fingerprint, fingerprint_of(info)))
    failing = [c for c in run.checks if c.status != "ok"]
    if failing:
        again: dict[str, set[int]] = {}
        for c in failing:
            again.setdefault(c.cell.shape, set()).add(c.cell.m)
        redo: list[BaselineCell] = []
        for i, (shape, mset) in enumerate(sorted(again.items())):
            print(f"regress: re-measuring {shape} M={sorted(mset)}", file=sys.stderr)
            cells, _ = measure(profile, work / f"remeasure-{i}", [by_name[shape]], tuple(sorted(mset)), samples)
            redo += cells
        run.remeasured = [f"{c.cell.shape} M={c.cell.m} {c.cell.path}" for c in failing]
        retry = {c.key: c for c in redo}
        merged = {c.key: c for c in fresh}
        merged.update({k: v for k, v in retry.items() if k in {f.cell.key for f in failing}})
        run.checks = compare(baseline, list(merged.values()), tolerance)
    run.wall_s = time.perf_counter() - t0
    return run
