"""GPU regression test: the regression grid measured afresh against calibrate/baselines/<profile>.json.

Tolerance: --regression-tolerance (default: the baseline's, 5%). Failing cells are measured once more before a verdict.
The grid is measured in a spawned process serving the baseline's pinned FlashInfer tactics (<profile>.autotune.json).
BENCH_REGRESSION_WORK=DIR keeps the fresh results there (to add them to the baseline's runs later).
"""
import os
import time
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


class KernelChangeWarning(UserWarning):
    pass


def test_fresh_measurements_stay_within_the_stored_ratios(tmp_path, request, gpu_profile):
    from bench.envinfo import fingerprint
    from calibrate.baseline import (baseline_path, describe, fingerprint_mismatch, fingerprint_of, kernel_change,
                                    load_baseline)
    from calibrate.regress import regress
    profile = gpu_profile
    path = baseline_path(profile.name)
    if not path.exists():
        pytest.skip(f"no baseline for {profile.name} ({path}); create it on this GPU with make baseline GPU={profile.name}")
    baseline = load_baseline(path)
    problems = fingerprint_mismatch(baseline.fingerprint, fingerprint_of(  # regress runs under the baseline's pdl
        {"fingerprint": fingerprint(), "pdl": baseline.fingerprint.get("pdl", False)}))
    if problems:
        pytest.skip(f"the {profile.name} baseline was measured on another environment ({'; '.join(problems)}); "
                    f"regenerate it here with make baseline GPU={profile.name}")
    t0 = time.perf_counter()
    work = Path(os.environ.get("BENCH_REGRESSION_WORK") or tmp_path)
    run = regress(profile, baseline, work, request.config.getoption("--regression-tolerance"))
    print(f"\nregression grid: {len(run.checks)} cells in {time.perf_counter() - t0:.1f} s; "
          f"re-measured: {run.remeasured or 'none'}; FlashInfer tactics "
          f"{'served from ' + str(run.tactics) if run.tactics else 'tuned afresh'}")
    for c in run.checks:
        if c.kernel_changed:
            warnings.warn(KernelChangeWarning(kernel_change(c)))
    assert not run.failures, "\n".join(describe(c) for c in run.failures)


def test_a_planted_ten_percent_slowdown_of_one_path_fails_the_gate(tmp_path, gpu_profile):
    """The gate must still catch a real regression: the shipped baseline with one cell's stored ratios made 10%
    lower (as if the path had become 10% slower since) fails at that cell, and only there, against a fresh
    measurement of that shape and M."""
    from dataclasses import replace

    from calibrate.baseline import Baseline, baseline_path, describe, load_baseline
    from calibrate.regress import regress
    path = baseline_path(gpu_profile.name)
    if not path.exists():
        pytest.skip(f"no baseline for {gpu_profile.name}")
    shipped = load_baseline(path)
    from bench.paths import low_m_path
    low = [c for c in shipped.cells if c.m == 1 and c.path == low_m_path(gpu_profile)]
    if not low:
        pytest.skip("the baseline has no low-M cell at M = 1")
    target = min(low, key=lambda c: (c.gpu_ratio_hi - c.gpu_ratio_lo) / c.gpu_ratio)
    slowed = replace(target, gpu_ratio=target.gpu_ratio / 1.10, gpu_ratio_lo=target.gpu_ratio_lo / 1.10,
                     gpu_ratio_hi=target.gpu_ratio_hi / 1.10)
    controls = [c for c in shipped.cells if c.shape == target.shape and c.m == target.m and c.path != target.path]
    planted = Baseline(shipped.profile, shipped.fingerprint, shipped.tolerance, shipped.host_tolerance,
                       [slowed, *controls], shipped.sources, shipped.full_fingerprint, shipped.autotune_cache, path)
    run = regress(gpu_profile, planted, tmp_path)
    failed = {(c.cell.shape, c.cell.m, c.cell.path) for c in run.failures}
    assert (target.shape, target.m, target.path) in failed, "the planted slowdown was not caught: " + "; ".join(
        describe(c) for c in run.checks)
    assert failed == {(target.shape, target.m, target.path)}, "; ".join(describe(c) for c in run.failures)
