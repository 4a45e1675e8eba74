"""(GPU) Measure the regression grid, write a baseline from it, or check it against the stored baseline with one
automatic re-measurement of failing cells. Used by `python -m calibrate baseline|regress`, `make baseline` and the
GPU regression tests."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.autotune_cache import FILE_NAME
from bench.paths import ATEN, PATHS, TUNED_CUBLASLT, low_m_path
from bench.results import load_results, load_run_info
from bench.sweep import SweepConfig, require_gpu, run_sweep
from calibrate.baseline import (REGRESSION_MS, Baseline, BaselineCell, CellCheck, cells_from_results, compare,
                                fingerprint_mismatch, fingerprint_of)
from dispatch.profiles import GpuProfile, get_profile
from harness.errors import HarnessError
from harness.io import claim_work_dir, clear_work_dir
from shapes.catalog import Shape, catalog
from shapes.derive import UNION


def grid_catalog() -> list[Shape]:
    """The shapes a regression grid measures, in the order the baselines' runs measured them: the union layout
    (vLLM's layers and the transformers modules they fuse), as the shipped tables and their baselines cover."""
    return catalog(layout=UNION)


def regression_paths(profile: GpuProfile) -> list[str]:
    """aten, the low-M backend and FlashInfer's cuBLASLt: the paths a dispatch decision chooses between."""
    return list(dict.fromkeys((ATEN, low_m_path(profile), TUNED_CUBLASLT)))


def measure(profile: GpuProfile, out: Path, shapes: list[Shape] | None = None, ms: tuple[int, ...] = REGRESSION_MS,
            samples: int = 10, autotune_cache: Path | None = None) -> tuple[list[BaselineCell], dict]:
    """Runs the regression grid through the bench sweep into `out`; returns its cells and run info.
    autotune_cache: FlashInfer tactics to serve (an existing file); None: tune (the tactics are kept in `out`)."""
    cfg = SweepConfig(profile=profile, shapes=shapes or grid_catalog(), ms=list(ms),
                      paths=[PATHS[p] for p in regression_paths(profile)], out=out, samples=samples,
                      autotune_cache=autotune_cache, quiet=True,  # FlashInfer's own output to <out>/log.txt
                      host_block_us=None,  # every call path host-timed in full blocks, as the baselines' runs were
                      command=["(regression grid, run by)", *sys.argv])  # run.json also lists its shapes and M
    run_sweep(cfg)
    return cells_from_results(load_results(out), regression_paths(profile)[1:]), load_run_info(out)


@dataclass
class RegressionRun:
    checks: list[CellCheck]
    remeasured: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    fingerprint_problems: list[str] = field(default_factory=list)
    tactics: Path | None = None  # the pinned autotuner cache served, or None: tuned afresh

    @property
    def failures(self) -> list[CellCheck]:
        return [c for c in self.checks if c.status != "ok"]


def regress(profile: GpuProfile, baseline: Baseline, work: Path, tolerance: float | None = None,
            samples: int = 10) -> RegressionRun:
    """Fresh measurement of the baseline's cells, compared; failing cells measured once more and compared again.
    Both measurements run in a fresh process, in catalog order, as the baseline's runs did: on the H200 the lm_head's
    TinyGEMM time at M=256 depended on what the process had run before (13.6-13.8 ms in 8 processes that ran the
    catalog order or the shape alone, 15.2 ms in 3 that ran the shapes sorted by N; the cause is not known)."""
    t0 = time.perf_counter()
    # the baseline's conditions: its runs' pdl setting (baselines before the setting was recorded ran without pdl)
    profile = replace(profile, pdl=bool(baseline.fingerprint.get("pdl", False)))
    for own in ("fresh", "remeasure"):  # this function's own output folders: a rerun replaces them
        clear_work_dir(work / own)
    wanted = {c.shape for c in baseline.cells}
    shapes = [s.name for s in grid_catalog() if s.name in wanted]
    unknown = sorted(wanted - set(shapes))
    if unknown:
        raise HarnessError(f"the baseline holds shape(s) {', '.join(unknown)} that no catalog model has; regenerate "
                           f"it with make baseline GPU={profile.name}, or add the model's config under shapes/configs")
    ms = tuple(sorted({c.m for c in baseline.cells}))
    tactics = baseline.tactics_file()
    fresh, info = measure_in_fresh_process(profile, work / "fresh", shapes, ms, samples, tactics)
    run = RegressionRun(compare(baseline, fresh, tolerance),
                        fingerprint_problems=fingerprint_mismatch(baseline.fingerprint, fingerprint_of(info)),
                        tactics=tactics)
    failing = [c for c in run.checks if c.status != "ok"]
    if failing:
        again = [s for s in shapes if s in {c.cell.shape for c in failing}]
        again_ms = tuple(sorted({c.cell.m for c in failing}))
        print(f"regress: re-measuring {', '.join(again)} at M={list(again_ms)}", file=sys.stderr)
        redo, _ = measure_in_fresh_process(profile, work / "remeasure", again, again_ms, samples, tactics)
        run.remeasured = [f"{c.cell.shape} M={c.cell.m} {c.cell.path}" for c in failing]
        retry = {c.key: c for c in redo}
        merged = {c.key: c for c in fresh}
        merged.update({k: v for k, v in retry.items() if k in {f.cell.key for f in failing}})
        run.checks = compare(baseline, list(merged.values()), tolerance)
    run.wall_s = time.perf_counter() - t0
    return run


def _measure_in_child(profile_name: str, out: str, shapes: list[str] | None, ms: tuple[int, ...], samples: int,
                      autotune_cache: str | None, pdl: bool) -> None:
    by_name = {s.name: s for s in grid_catalog()}
    measure(replace(get_profile(profile_name), pdl=pdl), Path(out), [by_name[n] for n in shapes] if shapes else None,
            ms, samples, Path(autotune_cache) if autotune_cache else None)


def measure_in_fresh_process(profile: GpuProfile, out: Path, shapes: list[str] | None = None,
                             ms: tuple[int, ...] = REGRESSION_MS, samples: int = 10,
                             autotune_cache: Path | None = None) -> tuple[list[BaselineCell], dict]:
    """measure() in a new interpreter (spawned: CUDA cannot be forked), so that no earlier work of this process (the
    GPU tests before it, a first pass) changes what it measures. Returns its cells and run info from disk."""
    import multiprocessing

    require_gpu(profile)  # before the folder is made
    claim_work_dir(out, "the measurement folder")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_measure_in_child, (profile.name, str(out), shapes, tuple(ms), samples,
                                       str(autotune_cache) if autotune_cache else None, profile.pdl))
    return cells_from_results(load_results(out), regression_paths(profile)[1:]), load_run_info(out)


def measure_runs(profile: GpuProfile, work: Path, runs: int, samples: int = 10,
                 autotune_cache: Path | None = None) -> list[Path]:
    """`runs` regression-grid runs into work/run-1..N, each in a fresh process, so that their spread is what a new
    process sees. Run 1 serves `autotune_cache` when given, else tunes; every later run serves run 1's tactics."""
    outs: list[Path] = []
    for i in range(runs):
        out = work / f"run-{i + 1}"
        clear_work_dir(out)  # an earlier baseline's run of the same name, made by the harness
        tactics = autotune_cache if i == 0 else outs[0] / FILE_NAME
        print(f"baseline: run {i + 1}/{runs} -> {out}"
              + (f" serving the tactics of {tactics}" if tactics else " (tuning)"), file=sys.stderr, flush=True)
        measure_in_fresh_process(profile, out, samples=samples, autotune_cache=tactics)
        if i == 0 and runs > 1 and not (out / FILE_NAME).is_file():
            raise HarnessError(f"run 1 kept no autotuner cache ({out / FILE_NAME}; see its run.json), "
                               f"so later runs cannot serve its tactics")
        outs.append(out)
    return outs
