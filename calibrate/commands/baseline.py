"""python -m calibrate baseline | regress: the regression baseline of a GPU profile from fresh (or given) runs of
the regression grid, and fresh (or given) measurements judged against it (calibrate/baseline.py,
calibrate/regress.py)."""
from __future__ import annotations

from pathlib import Path

from bench.autotune_cache import sha256
from bench.envinfo import fingerprint
from bench.sweep import require_gpu
from calibrate.baseline import (REGRESSION_MS, autotune_cache_path, baseline_check, baseline_path, baseline_text,
                                cells_from_results, compare, describe, fingerprint_mismatch, fingerprint_of,
                                kernel_change, left_out, load_baseline, merge_runs, shared_tactics, write_baseline)
from calibrate.compare import verdict_totals
from calibrate.regress import measure_runs, regress, regression_paths
from calibrate.runs import RESULTS, verdict_word
from calibrate.runs import load_run as _load
from calibrate.runs import sibling_free as _sibling_free
from dispatch.profiles import get_profile
from harness.cli import float_in, int_in
from harness.errors import HarnessError
from harness.io import claim_work_dir, distinct, shipped_or_results
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_base = sub.add_parser("baseline", parents=parents,
                            help="write calibrate/baselines/<profile>.json from fresh (or given) regression-grid runs")
    add(p_base, "from", dest="sources", nargs="+", what="of one environment")
    add(p_base, "work", default="results/baseline")
    add(p_base, "out-file", what=": the baseline", shown="results/<profile>/baseline.json", dest="out")
    add(p_base, "install", what="calibrate/baselines/<profile>.json")
    add(p_base, "samples", type=int_in(3, 1000), default=10, what="(graph replays) per cell")
    p_base.add_argument("--runs", type=int_in(1, 20), default=3,
                        help="fresh runs, each in a new process; the baseline holds their envelope (default 3)")
    p_base.add_argument("--retune", action="store_true",
                        help="tune FlashInfer afresh in run 1 instead of serving the committed <profile>.autotune.json")
    add(p_base, "partial")
    p_reg = sub.add_parser("regress", parents=parents,
                           help="compare fresh (or given) measurements with the stored baseline")
    add(p_reg, "from", dest="source", what="to compare")
    add(p_reg, "baseline", shown="calibrate/baselines/<profile>.json")
    add(p_reg, "tolerance", type=float_in(0, 1), what=": the GPU-ratio band", shown="the baseline's, 0.05")
    add(p_reg, "work", default="results/regress")
    add(p_reg, "partial")
    add(p_reg, "allow-mismatch", what="(also a fingerprint other than the baseline's)")


def run(args) -> int:
    profile = get_profile(args.gpu)
    return _baseline(args, profile) if args.cmd == "baseline" else _regress(args, profile)


def _baseline(args, profile) -> int:
    """A baseline from fresh runs of the regression grid (each in a new process) or from given runs."""
    fi_paths = regression_paths(profile)[1:]
    out = shipped_or_results(args.out, baseline_path(profile.name), RESULTS / profile.name / "baseline.json",
                             args.install)
    cache_file = autotune_cache_path(out)
    if args.sources:
        _sibling_free(cache_file, out, args.install)
        sources = distinct(list(args.sources), "baseline --from")
    else:
        require_gpu(profile)  # before any file system change
        work = claim_work_dir(Path(args.work), "--work")
        serve = None if args.retune or not cache_file.exists() else cache_file
        sources = [str(p) for p in measure_runs(profile, work, args.runs, args.samples, serve)]
    runs, per_run = [], []
    for src in sources:
        df, info = _load(src, args.partial, profile.name)
        df = df[df["m"].isin(REGRESSION_MS)]  # a full sweep holds more M values than the regression grid
        runs.append((str(src), info))
        per_run.append(cells_from_results(df, fi_paths))
    cells = merge_runs(per_run)
    if not cells:
        raise HarnessError("the runs have no cell where both aten and a FlashInfer path measured ok")
    served = shared_tactics(sources)
    tactics = {"file": cache_file.name, "sha256": sha256(served)} if served else None
    text = baseline_text(profile.name, runs, cells, tactics)
    write_baseline(out, text, served, baseline_check(profile.name))
    print(f"wrote {out}: {len(cells)} cells from {len(runs)} run(s); "
          + (f"tactics pinned in {cache_file}" if served else
             "the runs served different FlashInfer tactics, so a regression run tunes afresh"))
    return 0


def _regress(args, profile) -> int:
    """Fresh (or given) measurements of the regression grid judged against the stored baseline."""
    fi_paths = regression_paths(profile)[1:]
    fresh = not args.source
    baseline = load_baseline(Path(args.baseline) if args.baseline else baseline_path(profile.name))
    if baseline.profile != profile.name and not args.allow_mismatch:
        raise HarnessError(f"the baseline {baseline.path} is for {baseline.profile}, not {profile.name}; "
                           f"pass that GPU's baseline (or --allow-mismatch)")
    if fresh:
        require_gpu(profile)
        # the regression runs under the baseline's pdl setting (calibrate.regress), so only the machine is compared
        _check_fingerprint(baseline, {"fingerprint": fingerprint(), "pdl": baseline.fingerprint.get("pdl", False)},
                           "this machine", args.allow_mismatch)
        work = claim_work_dir(Path(args.work), "--work")
        run = regress(profile, baseline, work, args.tolerance)
        checks, remeasured, problems = run.checks, run.remeasured, run.fingerprint_problems
        print(f"fresh measurement: {run.wall_s:.1f} s; FlashInfer tactics "
              + (f"served from {run.tactics}" if run.tactics else "tuned afresh"))
        incomplete: list[str] = []
    else:
        df, info = _load(args.source, args.partial, profile.name, args.allow_mismatch)
        incomplete = df.attrs["incomplete"]
        problems = _check_fingerprint(baseline, info, args.source, args.allow_mismatch)
        checks = compare(baseline, cells_from_results(df, fi_paths), args.tolerance,
                         not_judged=left_out(baseline, df, info))
        if all(c.status == "skipped" for c in checks):
            raise HarnessError(f"{args.source} measured none of the baseline's cells; measure the regression grid "
                               f"(make regress GPU={profile.name})")
        served = (info.get("autotune_cache") or {}).get("sha256")
        if baseline.autotune_cache and served != baseline.autotune_cache.get("sha256"):
            print(f"note: {args.source} served other FlashInfer tactics than the baseline's, so a FlashInfer cell "
                  f"that moved may be its tactics, not a regression; to judge the baseline's, measure with "
                  f"--autotune-cache {baseline.tactics_file()}")
        remeasured: list[str] = []
    if problems:
        print("note (--allow-mismatch): fingerprint differs from the baseline's: " + "; ".join(problems))
    for c in checks:
        if c.kernel_changed:
            print("warning: " + kernel_change(c))
    if remeasured:
        print(f"re-measured once: {', '.join(remeasured)}")
    bad = [c for c in checks if c.status not in ("ok", "skipped")]
    skipped = [c for c in checks if c.status == "skipped"]
    print(f"{len(checks) - len(skipped)} cells judged, {len(bad)} outside the band"
          + (f"; {len(skipped)} left out by the run (not judged):" if skipped else ""))
    for c in skipped:
        print(f"  not judged: {describe(c)}")
    print(verdict_counts(checks))
    for c in bad:
        print(f"{c.verdict if c.verdict in ('SLOWER', 'FASTER') else c.status}: {describe(c)}")  # FAIL: host
    print(verdict_word(not bad, args.source, incomplete))
    return 0 if not bad else 1


def verdict_counts(checks) -> str:
    """The judged cells per verdict class of calibrate compare (docs/compare.md): the fresh GPU ratio against the
    stored band. SLOWER and FASTER fail the check (as does a host ratio outside its band); AMBIGUOUS passes."""
    return "GPU ratio against the stored band: " + verdict_totals(c.verdict for c in checks if c.fresh is not None)


def _check_fingerprint(baseline, info: dict, what: str, allow_mismatch: bool) -> list[str]:
    """The fingerprint keys that differ; an error unless the user allows the mismatch."""
    problems = fingerprint_mismatch(baseline.fingerprint, fingerprint_of(info))
    if problems and not allow_mismatch:
        raise HarnessError(f"{what} is another environment than the baseline {baseline.path} "
                           f"({'; '.join(problems)}); make a baseline for it with make baseline, or pass --allow-mismatch")
    return problems
