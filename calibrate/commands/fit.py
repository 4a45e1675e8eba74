"""python -m calibrate fit RESULTS --gpu P: a dispatch table fitted to measured results (calibrate/analysis.py: the
per-cell rules; calibrate/segments.py: the fewest ranges)."""
from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from bench.autotune_cache import FILE_NAME, gemv_file, read_entries, read_gemv, sha256
from bench.merge import fingerprint_difference
from bench.results import load_run_info
from calibrate.analysis import FIT_MIN_GAIN, Cells, dispatch_candidates, fit, model_uses, veto_key
from calibrate.determinism import source_entry
from calibrate.forward_model import (GPU_BOUND_MARGIN, gpu_bound_in_every_run, host_bound_in_every_run, kept_choices,
                                     overrides_over_the_table, picks_in_every_run, slower_in_every_run)
from calibrate.forward_noise import forward_noise_path, load_forward_floor
from calibrate.install import Artifact, gemv_check, shipped_layout, table_check, write_outputs
from calibrate.noise import fit_floor, load_noise
from calibrate.runs import RESULTS
from calibrate.runs import load_forwards as _load_forwards
from calibrate.runs import load_run as _load
from calibrate.runs import profile_of as _profile_of
from calibrate.runs import sibling_free as _sibling_free
from calibrate.segments import RULE, cells_spec, fit_segments, forward_picks, range_counts, refine_cells
from dispatch.backends import ATEN, GEMV
from dispatch.profiles import get_profile
from dispatch.table import REGIMES, ThresholdTable, load_table
from harness.cli import float_in
from harness.errors import HarnessError
from harness.io import atomic_write_text, distinct, is_shipped, output_file, shipped_or_results
from harness.options import add
from harness.shipped import shipped_file, shown
from shapes.derive import layout_covers


def add_parser(sub, parents: list) -> None:
    p_fit = sub.add_parser("fit", parents=parents,
                           help="fit per-shape M ranges for both regimes (graph: GPU time; eager: host and GPU)")
    p_fit.add_argument("results")
    p_fit.add_argument("--min-gain", type=float_in(0, 1), default=FIT_MIN_GAIN,
                       help=f"a cell leaves F.linear only for a gain above this share, beyond the noise "
                            f"(default {FIT_MIN_GAIN})")
    p_fit.add_argument("--hold-out", default="", help="comma list of M values the fit must not see (validated later)")
    add(p_fit, "noise", what="to fit with; the table keeps its bands")
    p_fit.add_argument("--add", nargs="+", metavar="DIR",
                       help="more cells of the same setup fitted with RESULTS: runs made with RESULTS' tactics "
                            "(bench run --cells ... --autotune-cache RESULTS/autotune-cache.json) at other M")
    p_fit.add_argument("--machine", nargs="+", metavar="DIR",
                       help="(--method segments) the same cells measured on other machines with RESULTS' tactics "
                            "(bench run --autotune-cache RESULTS/autotune-cache.json on each): every cell is judged "
                            "by the median machine")
    p_fit.add_argument("--plan-refine", metavar="FILE",
                       help="also write the cells to measure before a final fit (bench run --cells' form): the "
                            "midpoints of the gaps between measured M where the fitted choice changes")
    p_fit.add_argument("--table-forward", nargs="+", metavar="DIR",
                       help="measured forwards of the table this fit makes (its table-direct rows, checked against "
                            "what it chooses): where a single path (all-aten included) beat those choices in every "
                            "run and by more than --min-gain over their rounds pooled, in either regime, it takes "
                            "precedence at the model's cells")
    p_fit.add_argument("--keep", metavar="TABLE",
                       help="with --table-forward: the table file those runs measured; at each (model, M, regime) "
                            "where its choices ran faster than all-aten beyond the noise in every run and no single "
                            "path beat them, they are kept at the model's cells (a measured gain is not given up on "
                            "the cells' word alone)")
    add(p_fit, "forward", nargs="+",
        what=": at each (model, M, regime) they all measured, a lean single path whose whole forward beat all-aten "
             "beyond the noise in every one of them is picked for that model's shapes (eager: every cell; graph: "
             "cells left to F.linear); the eager boundness starts where it starts in the latest of them")
    p_fit.add_argument("--forward-noise", action="store_true",
                       help="widen every forward test of the fit (--forward picks, --table-forward overrides, --keep) "
                            "by the profile's forward noise floor (python -m calibrate forward-noise), so that a "
                            "choice made on one run's forwards holds for a fresh process's")
    p_fit.add_argument("--method", choices=("rules", "segments"), default="rules",
                       help="rules: the per-cell fit with forward picks and overrides (default); segments: the "
                            "fewest ranges within --tolerance of the per-M best (calibrate/segments.py)")
    add(p_fit, "tolerance", type=float_in(0, 0.5), default=0.02,
        what="(--method segments): a range's path may cost this much more than the per-M best")
    add(p_fit, "out-file", what=": the table", shown="results/<profile>/table.json", dest="out")
    add(p_fit, "install", what="dispatch/thresholds/<profile>.json (and its tactics file)")
    add(p_fit, "dry-run")
    add(p_fit, "partial")


def run(args, argv) -> int:
    profile = get_profile(_profile_of(load_run_info(args.results), args.gpu))
    df, info = _load(args.results, args.partial, profile.name, getattr(args, "allow_mismatch", None))
    cells = Cells.from_results(df)

    if args.add:
        df = _with_added(args.results, df, info, args.add, args.partial, profile.name)
        cells = Cells.from_results(df)
    return _fit_cmd(args, argv, profile, df, info, cells)


def _grid_ms(value: str) -> set[int]:
    try:
        return {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        raise HarnessError(f"--hold-out {value!r}: a comma list of integers, e.g. 24,40,48") from None


def _tactics_of(results: str) -> Path:
    """The autotuner cache a run kept beside its results (RESULTS a folder, or its results.csv)."""
    return (Path(results) if Path(results).is_dir() else Path(results).parent) / FILE_NAME


def _same_setup_runs(results: str, info: dict, runs: list[str], partial: bool, profile: str, option: str
                     ) -> list[pd.DataFrame]:
    """Each run's rows, where it was measured as RESULTS was: the same GPU and software, pdl and L2 mode, and
    RESULTS' own tactics served."""
    distinct([results, *runs], f"fit {option}")
    tactics = _tactics_of(results)
    want = sha256(tactics) if tactics.is_file() else None
    frames = []
    for run in runs:
        more, more_info = _load(run, partial, profile)
        differs = fingerprint_difference(info, more_info)
        if differs is not None:
            field_name, a, b = differs
            raise HarnessError(f"{option} {run}: fingerprint {field_name} {b!r} differs from {results}'s {a!r}; "
                               f"give only runs of the same GPU type and software")
        for key in ("pdl", "l2", "timer"):
            if info.get(key) != more_info.get(key):
                raise HarnessError(f"{option} {run}: {key} {more_info.get(key)!r} differs from {results}'s "
                                   f"{info.get(key)!r}; measure it with the same settings")
        served = (more_info.get("autotune_cache") or {}).get("sha256")
        if want is not None and (served != want or (more_info.get("autotune_cache") or {}).get("mode") == "tuned"):
            raise HarnessError(f"{option} {run} did not serve {results}'s tactics; measure it with --autotune-cache "
                               f"{tactics}")
        frames.append(more)
    return frames


def _with_added(results: str, df: pd.DataFrame, info: dict, added: list[str], partial: bool, profile: str
                ) -> pd.DataFrame:
    """RESULTS' rows and those of each --add run (_same_setup_runs), no cell twice."""
    both = pd.concat([df, *_same_setup_runs(results, info, added, partial, profile, "--add")], ignore_index=True)
    both.attrs = dict(df.attrs)
    twice = both.duplicated(["shape", "m", "path"])
    if twice.any():
        s, m, p = both.loc[twice, ["shape", "m", "path"]].iloc[0]
        raise HarnessError(f"--add: {s} M={m} {p} is measured twice; add runs of other M only")
    return both


def _fit_cmd(args, argv, profile, df, info, cells) -> int:
    out = shipped_or_results(args.out, shipped_file("table", profile.name), RESULTS / profile.name / "table.json",
                             args.install)
    if is_shipped(out):
        want, got = shipped_layout(profile.name), info.get("layout", "vllm")
        if not layout_covers(got, want):
            raise HarnessError(f"{args.results} measured {got}'s layout; the shipped {profile.name} table covers "
                               f"{want}'s. Fit it to a file of its own (--out FILE) and give the dispatcher that "
                               f"file; nothing was written")
    plan_file = output_file(args.plan_refine, "--plan-refine") if args.plan_refine else None
    _sibling_free(out.with_name(out.stem + ".autotune.json"), out, args.install)
    _sibling_free(gemv_file(out.with_name(out.stem + ".autotune.json")), out, args.install)
    if _tactics_of(args.results).is_file():  # the files the table will name beside it: read before any fitting
        read_entries(_tactics_of(args.results))
        read_gemv(_tactics_of(args.results))
    hold_out = _grid_ms(args.hold_out)
    left = set(int(m) for m in df["m"]) - hold_out
    if hold_out and len(left) < 2:
        raise HarnessError(f"--hold-out leaves {len(left)} M value(s) of the run to fit; hold out fewer "
                           f"(the run has {len(set(df['m']))})")
    if args.keep and not args.table_forward:
        raise HarnessError("--keep needs --table-forward: the measured forwards of that table")
    base = ThresholdTable(profile.name, profile.low_m_backend, {r: () for r in REGIMES})
    noise = load_noise(profile.name, args.noise)
    if args.machine and args.method != "segments":
        raise HarnessError("--machine needs --method segments")
    others = [Cells.from_results(o) for o in _same_setup_runs(args.results, info, args.machine, args.partial,
                                                               profile.name, "--machine")] if args.machine else None
    if noise is None and others:  # a GPU's first table: the floor of the machines it is fitted on
        noise = fit_floor(list(zip([cells, *others], others)), source={
            "runs": [args.results, *args.machine], "profile": profile.name, "measured_by": "calibrate fit",
            "command": "python -m calibrate noise " + " ".join([args.results, *args.machine])})
        print(f"fit: {profile.name} ships no noise floor; the cells' intervals are widened by the floor of the "
              f"{len(others) + 1} machines fitted on (as python -m calibrate noise {args.results} "
              f"{' '.join(args.machine)})")
    floor = None
    if args.forward_noise:
        floor = load_forward_floor(profile.name)
        if floor is None:
            raise HarnessError(f"--forward-noise: no forward noise floor for {profile.name}; measure one with python -m "
                               f"calibrate forward-noise RUN_A RUN_B --gpu {profile.name}")
    cell_picks, forward_note, shape_bound, shape_host, runs, picks, vetoes = _forward_picks(
        args, profile, df, cells, base, hold_out, floor)
    if args.method == "segments":
        if args.table_forward:
            raise HarnessError("--method segments takes from measured forwards (--forward) only where eager forwards "
                               "are host- or GPU-bound; check the table with calibrate validate --forward instead "
                               "of --table-forward")
        seg_picks = {}
        if args.forward:
            measured = {(str(r), str(mo)): sorted(set(int(v) for v in g["m"]))
                        for fdf in runs for (r, mo), g in fdf.groupby(["regime", "model"])}
            seg_picks = forward_picks(picks, model_uses(df), cells, hold_out, measured)
        table, report = fit_segments(cells, base, args.tolerance, args.min_gain, noise, hold_out, shape_bound,
                                     shape_host, seg_picks, model_uses(df), None, profile.capture_size, others,
                                     vetoes)
        counts = range_counts(table)
        print(f"segments: {counts['mean_ranges']:.2f} ranges per shape and regime on average (at most "
              f"{counts['max_ranges']}), the narrowest {counts['narrowest_share']:.0%} of its upper M")
    else:
        table, report = fit(cells, base, profile.capture_size, args.min_gain, noise, hold_out, cell_picks, shape_bound,
                            host_bound_until=shape_host)
    override_note = None
    if args.table_forward:
        table, report, override_note = _overrides(args, profile, df, cells, base, noise, hold_out, cell_picks,
                                                  shape_bound, shape_host, table, report, floor)
    source, fitted_ms = _source(args, argv, profile, info, df, cells, base, hold_out, noise, floor, forward_note,
                                override_note)
    return _write(args, profile, df, cells, out, plan_file, table, source, report, fitted_ms, hold_out)


def _cells_say_no_slower(cells: Cells, uses: list[tuple[int, int, int]], m: int, path: str, regime: str) -> bool:
    """Whether a model's cells at M, count-weighted, put a single path at or below all-aten's cost: the graph regime
    by GPU time, eager by max(host, GPU) per call, each path's GPU time as compared side by side with F.linear's
    (Cells.gpu_beside_aten: the rounds both ran, as the cell-sum of validate charges it). False where the path or
    F.linear is not measured at every one of them (a sweep leaves out a path far slower at a smaller M: the cells
    cannot speak for the forward)."""
    if not uses or not all(cells.has(n, k, m, ATEN) and cells.has(n, k, m, path) for n, k, _ in uses):
        return False
    aten = sum(c * cells.cost(n, k, m, ATEN, regime) for n, k, c in uses)
    single = sum(c * cells.cost(n, k, m, path, regime, beside_aten=True) for n, k, c in uses)
    return single <= aten


def _forward_picks(args, profile, df, cells, base, hold_out, floor):
    """What measured forwards (--forward) give the fit: the single-path picks at each (regime, model, M), the cells
    they apply to, the M from which each shape's eager forwards are GPU-bound and up to which they are host-bound,
    and the note the table's source keeps. (cell picks, note, GPU-bound M, host-bound M, runs, picks)."""
    cell_picks, forward_note, shape_bound, shape_host, runs, picks = {}, None, {}, {}, [], {}
    if not args.forward:
        return cell_picks, forward_note, shape_bound, shape_host, runs, picks, {}
    runs = [fdf for fdf, _ in _load_forwards(args.forward, profile.name, args.partial)]
    picks = picks_in_every_run(runs, dispatch_candidates(cells, base), args.min_gain, floor)
    uses = model_uses(df)
    vetoes = {}  # (regime, n, k, m) -> the paths a whole forward of the model ran slower than all-aten there
    for (regime, model, m), slow in sorted(slower_in_every_run(runs, dispatch_candidates(cells, base), floor).items()):
        # only where the cells say otherwise: a path slower on some shapes is the cells' to judge, shape by shape
        slow = {p: r for p, r in slow.items() if _cells_say_no_slower(cells, uses.get(model, []), m, p, regime)}
        if m in hold_out or not slow:
            continue
        for n, k, _ in uses.get(model, []):
            vetoes.setdefault((regime, n, k, m), set()).update(slow)
        for path, ratio in sorted(slow.items()):
            print(f"{regime}, {model} M={m}: {path} everywhere it runs measured {ratio:.3f}x all-aten, slower beyond "
                  f"the noise{' in every run' if len(runs) > 1 else ''}; not chosen at the model's cells at that M")
    for (regime, model, m), (path, ratio, hi) in sorted(picks.items()):
        if m in hold_out:
            continue
        for n, k, _ in uses.get(model, []):
            cell_picks[(regime, n, k, m)] = path
        where = "the model's cells at that M" if regime == "eager" else \
            "the model's cells at that M that the cell test left to F.linear"
        print(f"{regime}, {model} M={m}: {path} everywhere it runs measured {ratio:.3f}x all-aten "
              f"(interval up to {hi:.3f}{'; the worst of the runs' if len(runs) > 1 else ''}); picked for {where}")
    bound_m = gpu_bound_in_every_run(runs, hold_out=hold_out)
    for model, start in sorted(bound_m.items()):
        for n, k, _ in uses.get(model, []):
            shape_bound[(n, k)] = max(shape_bound.get((n, k), 0.0), start)
        print(f"eager, {model}: all-aten forwards GPU-bound (busy >= {GPU_BOUND_MARGIN}x host submission) "
              + (f"from M = {start:g} on" if start < math.inf else "at no measured M"))
    host_m = host_bound_in_every_run(runs, hold_out=hold_out)
    for model, until in sorted(host_m.items()):
        for n, k, _ in uses.get(model, []):
            shape_host[(n, k)] = min(shape_host.get((n, k), until), until)
        print(f"eager, {model}: all-aten forwards host-bound (submission >= {GPU_BOUND_MARGIN}x busy) "
              + (f"up to M = {until:g}" if until else "at no measured M")
              + "; between that and the GPU-bound M a path must cost less host and less GPU time")
    forward_note = {"forward": args.forward[0] if len(args.forward) == 1 else list(args.forward),
                    "picks": {f"{r} {mo} M={m}": p for (r, mo, m), (p, *_) in sorted(picks.items())},
                    "gpu_bound_from": {mo: (None if v == math.inf else int(v)) for mo, v in sorted(bound_m.items())},
                    "host_bound_until": {mo: int(v) for mo, v in sorted(host_m.items())},
                    "vetoes": {veto_key(r, n, k, m): sorted(v) for (r, n, k, m), v in sorted(vetoes.items())}}
    return cell_picks, forward_note, shape_bound, shape_host, runs, picks, vetoes


def _source(args, argv, profile, info, df, cells, base, hold_out, noise, floor, forward_note, override_note):
    """The table's source: where it was fitted from, with what, and the rule in words. (source, fitted M)"""
    fp = info.get("fingerprint", {})
    fitted_ms = sorted(set(int(m) for m in df["m"]) - hold_out)
    source = {"fitted_from": str(args.results), "run_command": info.get("command"), "gpu": fp.get("gpu_name"),
              "harness_sha": fp.get("harness_sha"), "fingerprint": fp, "pdl": info.get("pdl"),
              "fit_command": "python -m calibrate " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "fitted_ms": fitted_ms, "held_out_m": sorted(hold_out), "layout": info.get("layout", "vllm"),
              "rule": "per shape, regime and measured M, the cheapest of " + ", ".join(dispatch_candidates(cells, base))
                      + " in the regime's cost (graph: GPU time; eager: max(host, GPU) per call) replaces F.linear "
                      f"where it beats F.linear beyond the noise by more than {args.min_gain:.0%} (graph: the "
                      "GPU-time ratio's interval widened by the run-to-run floor; eager: path's p80 cost below "
                      "F.linear's p20 cost times the floor); eager, with --forward, from the M where every measured "
                      f"all-aten eager forward of the shape's models kept the GPU busy >= {GPU_BOUND_MARGIN}x its host "
                      "submission time, the graph regime's choice, and below it only paths whose median host time is "
                      "below F.linear's, which above the M up to which every such forward took the host >= "
                      f"{GPU_BOUND_MARGIN}x its GPU busy time (balanced) must also beat F.linear in GPU time beyond the "
                      "noise; without measured forwards, an eager cell whose host p80 stays below its GPU "
                      "p20 takes the graph regime's choice; with --forward, at each (model, M) measured, the lean single "
                      "path whose whole forward beat all-aten beyond the noise (paired interval) for that model's "
                      "shapes (eager: at every such cell; graph: where the cell test left F.linear and the path's "
                      "cell costs no more); between two measured M whose choices differ, the boundary is where the "
                      "two paths' costs, interpolated linearly in M, cross (a model of unmeasured M); shapes not "
                      "measured and M above the last range run F.linear",
              "noise_floor": {**noise.to_json(), "file": args.noise or (
                  "none: measured by the fit from its machines" if noise.source.get("measured_by")
                  else shown("noise", profile.name))}
              if noise else None,
              "measured_forwards": forward_note}
    if args.method == "segments":
        source["rule"] = f"{RULE}; tolerance {args.tolerance:g}, min_gain {args.min_gain:g}"
        source["method"] = "segments"
    if floor is not None:
        source["forward_noise_floor"] = {**floor.to_json(), "file": forward_noise_path(profile.name).name}
        source["rule"] += ("; with --forward-noise, every forward test's paired interval is widened by the forward "
                           "noise floor (" + floor.describe() + ") before it is compared")
    if override_note is not None:
        source["forwards_of_this_table"] = override_note
        source["rule"] += ("; with --table-forward, at each (model, M, regime) where those runs measured this fit's "
                           "own choices (table-direct), a single path (all-aten included) whose forward beat them in "
                           f"every run and by more than {args.min_gain:.0%} over all their rounds pooled (interval "
                           "below 1) takes precedence at that model's cells" + (
                               f"; with --keep, where they measured the choices of {args.keep} faster than all-aten "
                               "beyond the noise in every run and no single path beat them, those choices are kept "
                               "at that model's cells" if args.keep else ""))
    if args.forward and len(args.forward) > 1:
        source["rule"] += ("; with several --forward runs, a pick must beat all-aten beyond the noise in every one of "
                           "them, and the eager boundness starts where it starts in the latest of them")
    if args.add:
        source["added"] = list(args.add)
    if args.machine:
        source["other_machines"] = list(args.machine)
        source["rule"] += ("; with other machines' runs of the same cells and tactics, every cell's costs and "
                           "conservative ratios are the median machine's (with 3 machines or more, a path faster "
                           "than F.linear on every machine at most its slowest machine's ratio), and a range covers "
                           "as few as it can of the M where a path costs more than (1 + tolerance) x some machine's "
                           "best, or is FlashInfer, wins nothing beyond the noise on the median machine and was "
                           "slower than F.linear on some machine")
    if df.attrs["incomplete"]:
        source["incomplete_data"] = "fitted with --partial from a run with missing cells or that did not finish"
    determined = source_entry(df)
    if determined is not None:  # what the dispatcher's deterministic mode chooses among
        source["determinism"] = determined
    return source, fitted_ms


def _write(args, profile, df, cells, out, plan_file, table, source, report, fitted_ms, hold_out) -> int:
    """The fitted table with its source, and beside it the tactics and GEMV configurations it was fitted with (and
    the refine plan); printed, and written unless --dry-run."""
    kept = _tactics_of(args.results)
    tactics_file = out.with_name(out.stem + ".autotune.json")
    if kept.is_file():
        source["tactics"] = {"file": tactics_file.name, "sha256": sha256(kept), "from": str(kept),
                             "note": "FlashInfer's autotuner cache of the fitted run; the dispatcher loads it"}
    kept_gemv, gemv_target = gemv_file(kept), gemv_file(tactics_file)
    if GEMV in table.paths() and kept_gemv.is_file():
        source["gemv_configs"] = {"file": gemv_target.name, "sha256": sha256(kept_gemv), "from": str(kept_gemv),
                                  "note": "the GEMV's configurations of the fitted run; the dispatcher loads them"}
    elif GEMV in table.paths():
        raise HarnessError(f"the fit chose {GEMV} but {args.results} kept no {kept_gemv.name} (its configurations); "
                           f"measure it with a harness that keeps them")
    table = ThresholdTable(table.profile, table.low_m_backend, table.default, table.shapes, source)
    print(f"fitted from {args.results} ({len(fitted_ms)} M values" + (f"; held out {sorted(hold_out)}" if hold_out else "")
          + ")" + (" (incomplete data, --partial)" if df.attrs["incomplete"] else ""))
    print(report.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if not args.dry_run:
        write_outputs([*([Artifact(tactics_file, kept.read_bytes(), "the table's tactics", read_entries)]
                         if kept.is_file() else []),
                       *([Artifact(gemv_target, kept_gemv.read_bytes(), "the table's GEMV configurations", gemv_check)]
                         if "gemv_configs" in source else []),
                       Artifact(out, (json.dumps(table.to_json(), indent=2) + "\n").encode(), "the table",
                                table_check(profile.name, shipped_layout(profile.name) if is_shipped(out) else None))])
        if args.plan_refine:
            names = {(int(n), int(k)): str(name) for name, n, k in zip(df["shape"], df["n"], df["k"])}
            plan = refine_cells(table, cells, names)
            atomic_write_text(plan_file, cells_spec(plan) + "\n")
            print(f"wrote {plan_file}: {sum(map(len, plan.values()))} cells in the gaps where the choice changes")
        print(f"wrote {out}" + (f" and {tactics_file}" if kept.is_file() else
                                " (the run kept no autotune-cache.json: the dispatcher's FlashInfer calls will tune "
                                "or fall back in the user's process)"))
    return 0


def _overrides(args, profile, df, cells, base, noise, hold_out, cell_picks, shape_bound, shape_host, table, report,
               floor=None):
    """--table-forward: measured forwards of the table this fit makes; where a single path (all-aten included) beat
    its choices, in either regime, refit with that path taking precedence at the model's cells in that regime.
    Returns table, report, note."""
    runs = _load_forwards(args.table_forward, profile.name, args.partial)
    candidates = dispatch_candidates(cells, base)
    found = {(regime, model, m): o for regime in REGIMES
             for (model, m), o in overrides_over_the_table(runs, table, profile, candidates, args.min_gain,
                                                           regime, floor).items() if m not in hold_out}
    uses = model_uses(df)
    over = {}
    kept = {}
    if args.keep:
        previous = load_table(profile.name, args.keep)
        if previous.profile != profile.name:
            raise HarnessError(f"--keep {args.keep} is a table for {previous.profile}, the fit is for {profile.name}")
        for regime in REGIMES:
            beaten = overrides_over_the_table(runs, previous, profile, candidates, args.min_gain, regime, floor)
            for (model, m), o in kept_choices(runs, previous, profile, regime, floor).items():
                if m in hold_out or (model, m) in beaten:
                    continue
                kept[(regime, model, m)] = o
                print(f"{regime}, {model} M={m}: {args.keep}'s choices measured {o['ratio']:.3f}x all-aten (interval "
                      f"up to {o['hi']:.3f}; the worst of {o['runs']} runs); kept at the model's cells")
                for n, k, _ in uses.get(model, []):
                    over[(regime, n, k, m)] = previous.choose(n, k, m, regime)
    for (regime, model, m), o in found.items():
        print(f"{regime}, {model} M={m}: {o['path']} everywhere it runs measured {o['ratio']:.3f}x this table's own "
              f"choices [{o['lo']:.3f}, {o['hi']:.3f}] over {o['runs']} runs' rounds pooled (worst run "
              f"{o['worst_run']:.3f}); it takes precedence at the model's cells")
        for n, k, _ in uses.get(model, []):
            over[(regime, n, k, m)] = o["path"]
    if not found:
        print("no single path beat this table's own measured choices in every --table-forward run")
    table, report = fit(cells, base, profile.capture_size, args.min_gain, noise, hold_out, cell_picks, shape_bound, over,
                        host_bound_until=shape_host)
    note = {"runs": list(args.table_forward), "kept_from": args.keep,
            "kept": {f"{regime} {mo} M={m}": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in o.items()}
                     for (regime, mo, m), o in sorted(kept.items())},
            "overrides": {f"{regime} {mo} M={m}": {k: (round(v, 4) if isinstance(v, float) else v)
                                                   for k, v in o.items()}
                          for (regime, mo, m), o in sorted(found.items())}}
    return table, report, note
