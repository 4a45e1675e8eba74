"""python -m dispatch validate RESULTS | fit RESULTS --gpu PROFILE | host-cost --gpu PROFILE
                   | baseline --gpu PROFILE [--runs N] [--retune] [--from RESULTS...]
                   | regress --gpu PROFILE [--from RESULTS]"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import pandas as pd

from bench.profiles import PROFILES, get_profile
from bench.results import atomic_write_text, load_results, load_run_info
from dispatch.analysis import Cells, cell_verdicts, fit, forward_totals, model_uses
from dispatch.table import TABLE_DIR, ThresholdTable, load_table
from shapes.errors import HarnessError, run_cli


def _check_gpu(info: dict, profile_name: str, results: str) -> None:
    fp = info.get("fingerprint", {})
    profile = get_profile(profile_name)
    gpu = str(fp.get("gpu_name", ""))
    if profile.name_pattern not in gpu or fp.get("sm") != profile.sm:
        raise HarnessError(f"{results} was measured on {gpu!r} (SM{fp.get('sm')}), not on a {profile.name} GPU; "
                           f"pass --gpu for that GPU or a threshold table made for it")


def _profile_of(info: dict, given: str | None) -> str:
    if given:
        return given
    name = info.get("profile")
    if not name:
        raise HarnessError("run.json names no GPU profile; pass --gpu")
    return name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatch", description="Validate and fit the threshold dispatcher.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_val = sub.add_parser("validate", help="judge a threshold table against measured results")
    p_val.add_argument("results", help="results folder or results.csv (run.json beside it)")
    p_val.add_argument("--gpu", help="GPU profile (default: the run's)")
    p_val.add_argument("--thresholds", help="threshold table file (default: dispatch/thresholds/<profile>.json)")
    p_val.add_argument("--margin", type=float, default=0.03, help="equivalence margin (default 0.03 = 3%%)")
    p_val.add_argument("--oracle", choices=("candidates", "all"), default="candidates",
                       help="best achievable over the dispatcher's own choices (default) or every measured path")
    p_val.add_argument("--csv", help="write the per-cell verdicts here")
    p_fit = sub.add_parser("fit", help="fit thresholds that minimise the count-weighted per-forward time")
    p_fit.add_argument("results")
    p_fit.add_argument("--gpu", required=True, help=f"GPU profile: {', '.join(PROFILES)}")
    p_fit.add_argument("--min-gain", type=float, default=0.0,
                       help="an override must cut the objective by more than this share (default 0: any gain)")
    p_fit.add_argument("--out", help="table file to write (default dispatch/thresholds/<profile>.json)")
    p_fit.add_argument("--dry-run", action="store_true", help="print, write nothing")
    p_host = sub.add_parser("host-cost", help="(GPU) host time of dispatch.linear against F.linear above the threshold")
    p_host.add_argument("--gpu", required=True)
    p_host.add_argument("--calls", type=int, default=4000)
    p_host.add_argument("--out", help="CSV file for the per-shape figures")
    p_base = sub.add_parser("baseline", help="write tests/baselines/<profile>.json from fresh (or given) regression-grid runs")
    p_base.add_argument("--gpu", required=True, help=f"GPU profile: {', '.join(PROFILES)}")
    p_base.add_argument("--from", dest="sources", nargs="+",
                        help="existing results folders of one environment (default: measure afresh, GPU)")
    p_base.add_argument("--work", default="results/baseline", help="where a fresh run writes (default results/baseline)")
    p_base.add_argument("--out", help="baseline file (default tests/baselines/<profile>.json)")
    p_base.add_argument("--samples", type=int, default=10, help="graph replays per cell (default 10)")
    p_base.add_argument("--runs", type=int, default=3,
                        help="fresh runs, each in a new process; the baseline holds their envelope (default 3)")
    p_base.add_argument("--retune", action="store_true",
                        help="tune FlashInfer afresh in run 1 instead of serving the committed <profile>.autotune.json")
    p_reg = sub.add_parser("regress", help="compare fresh (or given) measurements with the stored baseline")
    p_reg.add_argument("--gpu", required=True, help=f"GPU profile: {', '.join(PROFILES)}")
    p_reg.add_argument("--from", dest="source", help="results folder to compare (default: measure afresh, GPU)")
    p_reg.add_argument("--baseline", help="baseline file (default tests/baselines/<profile>.json)")
    p_reg.add_argument("--tolerance", type=float, help="GPU-ratio band (default: the baseline's, 0.05)")
    p_reg.add_argument("--work", default="results/regress", help="where a fresh run writes (default results/regress)")
    args = parser.parse_args(argv)
    pd.set_option("display.width", 200)

    if args.cmd in ("baseline", "regress"):
        return _baseline_cmd(args, argv)

    if args.cmd == "host-cost":
        from dispatch.hostcost import run_host_cost
        return run_host_cost(args.gpu, args.calls, args.out)

    df = load_results(args.results)
    info = load_run_info(args.results)
    profile = get_profile(_profile_of(info, args.gpu))
    _check_gpu(info, profile.name, args.results)
    cells = Cells.from_results(df)
    uses = model_uses(df)

    if args.cmd == "fit":
        base = load_table(profile.name) if (TABLE_DIR / f"{profile.name}.json").exists() else \
            ThresholdTable(profile.name, profile.low_m_backend, 0)
        table, report = fit(cells, base, uses, profile.capture_size, args.min_gain)
        fp = info.get("fingerprint", {})
        source = {"fitted_from": str(args.results), "run_command": info.get("command"), "gpu": fp.get("gpu_name"),
                  "harness_sha": fp.get("harness_sha"), "fingerprint": fp,
                  "fit_command": "python -m dispatch " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "objective": "count-weighted per-forward time summed over the grid's M values; GPU time at "
                               f"M <= {profile.capture_size}, max(host, GPU) above",
                  "crossover_m": {f"{r.n}x{r.k}": (None if pd.isna(r.crossover_m) else int(r.crossover_m))
                                  for r in report.itertuples()}}
        table = ThresholdTable(table.profile, table.low_m_backend, table.default_threshold, table.overrides, source)
        print(f"global threshold: {table.default_threshold}")
        print(report.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        if not args.dry_run:
            out = Path(args.out) if args.out else TABLE_DIR / f"{profile.name}.json"
            atomic_write_text(out, json.dumps(table.to_json(), indent=2) + "\n")
            print(f"wrote {out}")
        return 0

    table = load_table(profile.name, args.thresholds)
    if table.profile != profile.name:
        raise HarnessError(f"threshold table is for {table.profile}, the results are from {profile.name}")
    verdicts = cell_verdicts(cells, table, args.margin, args.oracle)
    totals = forward_totals(cells, table, uses, profile.capture_size, args.oracle)
    if args.csv:
        atomic_write_text(Path(args.csv), verdicts.to_csv(index=False))
    counts = verdicts["verdict"].value_counts().to_dict()
    print(f"{len(verdicts)} cells; dispatcher vs best of {args.oracle}: {counts}; "
          f"max regret {verdicts['regret'].max():.1%}")
    print("per-forward totals (µs), dispatcher / best:")
    show = totals.pivot_table(index="m", columns=["model", "regime"], values="dispatch_over_best")
    print(show.to_string(float_format=lambda v: f"{v:.4f}"))
    slower = verdicts[verdicts["verdict"] == "SLOWER"]
    over = totals[totals["actual"] & (totals["dispatch_over_best"] > 1.01)]
    if not slower.empty:
        print(f"\nFAIL: the dispatcher is SLOWER than the best path beyond {args.margin:.0%} on {len(slower)} cell(s):")
        print(slower[["n", "k", "m", "chosen", "oracle", "chosen_us", "oracle_us", "regret", "ratio_lo", "ratio_hi"]]
              .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if not over.empty:
        print("\nFAIL: per-forward total more than 1% above the best achievable:")
        print(over.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if slower.empty and over.empty:
        print("PASS")
        return 0
    return 1


def _baseline_cmd(args, argv) -> int:
    import shutil
    from bench.autotune_cache import copy as copy_atomic, sha256
    from dispatch.baseline import (REGRESSION_MS, autotune_cache_path, baseline_path, baseline_text,
                                   cells_from_results, compare, describe, fingerprint_mismatch, fingerprint_of,
                                   kernel_change, load_baseline, merge_runs, shared_tactics, write_baseline)
    from dispatch.regress import measure_runs, regress, regression_paths
    profile = get_profile(args.gpu)
    fi_paths = regression_paths(profile)[1:]
    if args.cmd == "baseline":
        out = Path(args.out) if args.out else baseline_path(profile.name)
        cache_file = autotune_cache_path(out)
        if args.sources:
            sources = list(args.sources)
        else:
            work = Path(args.work)
            if work.exists():
                shutil.rmtree(work)
            serve = None if args.retune or not cache_file.exists() else cache_file
            sources = [str(p) for p in measure_runs(profile, work, args.runs, args.samples, serve)]
        runs, per_run = [], []
        for src in sources:
            info = load_run_info(src)
            _check_gpu(info, profile.name, src)
            df = load_results(src)
            df = df[df["m"].isin(REGRESSION_MS)]  # a full sweep holds more M values than the regression grid
            runs.append((str(src), info))
            per_run.append(cells_from_results(df, fi_paths))
        cells = merge_runs(per_run)
        if not cells:
            raise HarnessError("the runs have no cell where both aten and a FlashInfer path measured ok")
        served = shared_tactics(sources)
        tactics = {"file": cache_file.name, "sha256": sha256(served)} if served else None
        text = baseline_text(profile.name, runs, cells, tactics)
        if served:
            copy_atomic(served, cache_file)
        write_baseline(out, text)
        print(f"wrote {out}: {len(cells)} cells from {len(runs)} run(s); "
              + (f"tactics pinned in {cache_file}" if served else
                 "the runs served different FlashInfer tactics, so a regression run tunes afresh"))
        return 0
    baseline = load_baseline(Path(args.baseline) if args.baseline else baseline_path(profile.name))
    if args.source:
        info = load_run_info(args.source)
        problems = fingerprint_mismatch(baseline.fingerprint, fingerprint_of(info))
        checks = compare(baseline, cells_from_results(load_results(args.source), fi_paths), args.tolerance)
        remeasured: list[str] = []
    else:
        run = regress(profile, baseline, Path(args.work), args.tolerance)
        checks, remeasured, problems = run.checks, run.remeasured, run.fingerprint_problems
        print(f"fresh measurement: {run.wall_s:.1f} s; FlashInfer tactics "
              + (f"served from {run.tactics}" if run.tactics else "tuned afresh"))
    if problems:
        print("note: fingerprint differs from the baseline's: " + "; ".join(problems))
    for c in checks:
        if c.kernel_changed:
            print("warning: " + kernel_change(c))
    if remeasured:
        print(f"re-measured once: {', '.join(remeasured)}")
    bad = [c for c in checks if c.status != "ok"]
    print(f"{len(checks)} cells, {len(bad)} outside the band")
    for c in bad:
        print(f"{c.status}: {describe(c)}")
    print("PASS" if not bad else "FAIL")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(run_cli(main, "dispatch"))
