"""python -m calibrate validate RESULTS: a threshold table judged against measured results, per cell and per
forward (calibrate/analysis.py holds the verdicts)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.autotune_cache import FILE_NAME, tactic_differences
from bench.results import load_run_info
from calibrate.analysis import Cells, cell_verdicts, failures, forward_totals, model_uses, provenance
from calibrate.forward_model import (MODEL_MISS, forward_ratios, judged_forward, judged_vetoes, load_forward,
                                     model_vs_measured, null_pair_spread)
from calibrate.forward_noise import forward_coverage, forward_noise_path, load_forward_floor
from calibrate.determinism import lines as determinism_lines
from calibrate.limit import lines as limit_lines
from calibrate.noise import LEVEL, coverage, coverage_line, load_noise, noise_path
from calibrate.runs import table_problem, verdict_word
from calibrate.runs import check_gpu as _check_gpu
from calibrate.runs import load_run as _load
from calibrate.runs import profile_of as _profile_of
from calibrate.runs import refuse_overlap as _refuse_overlap
from dispatch.profiles import get_profile
from dispatch.table import ThresholdTable, load_table
from harness.cli import float_in
from harness.errors import HarnessError
from harness.io import atomic_write_text, distinct, output_file
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_val = sub.add_parser("validate", parents=parents, help="judge a threshold table against measured results")
    p_val.add_argument("results", help="results folder or results.csv (run.json beside it)")
    add(p_val, "table", what="judged")
    add(p_val, "margin", type=float_in(0, 0.5), default=0.03)
    p_val.add_argument("--oracle", choices=("candidates", "all"), default="all",
                       help="best achievable over every measured path (default) or the dispatcher's own candidates")
    add(p_val, "csv", what="(the verdicts)")
    add(p_val, "partial")
    add(p_val, "forward", nargs="+",
        what=", e.g. one per model: per-forward verdicts use them where they have the (model, M), and the cell-sum "
             "model is set beside them; two folders that both measured one (model, M) are refused")
    p_val.add_argument("--forward-replicate", metavar="DIR",
                       help="with --forward: a measured forward of the same models and M in a fresh process: how "
                            "often its ratios fall inside --forward's intervals (their coverage)")
    add(p_val, "allow-mismatch")
    add(p_val, "noise", what="that widens the cell intervals")
    add(p_val, "forward-floor", what="that widens the measured forwards' intervals")
    p_val.add_argument("--replicate", help="a replicate run (fresh process, same GPU): measure how often its point "
                                           "ratios fall inside this run's intervals (their coverage)")


def run(args) -> int:
    csv_out = output_file(args.csv, "--csv") if args.csv else None
    if args.replicate:
        distinct([args.results, args.replicate], "--replicate")
    profile = get_profile(_profile_of(load_run_info(args.results), args.gpu))
    df, info = _load(args.results, args.partial, profile.name, getattr(args, "allow_mismatch", None))
    cells = Cells.from_results(df)

    table = load_table(profile.name, args.table)
    if table.profile != profile.name:
        raise HarnessError(f"threshold table is for {table.profile}, the results are from {profile.name}")
    problem = table_problem(table, info, cells.paths(), args.results, bool(getattr(args, "allow_mismatch", False)))
    if problem:
        raise HarnessError(problem)
    if args.forward_replicate and len(args.forward or []) != 1:
        raise HarnessError("--forward-replicate needs --forward with one folder: the run whose intervals it checks")
    forwards, replicate = [], None
    for folder in args.forward or []:  # checked before anything is printed: a bad file stops the command
        fdf, finfo = load_forward(folder, args.partial)
        _check_gpu(finfo, profile.name, folder, args.allow_mismatch)
        forwards.append((folder, fdf, finfo))
    _refuse_overlap(forwards)
    if args.forward_replicate:
        rep_df, rep_info = load_forward(args.forward_replicate, args.partial)
        _check_gpu(rep_info, profile.name, args.forward_replicate, args.allow_mismatch)
        replicate = (args.forward_replicate, rep_df)
    noise = load_noise(profile.name, args.noise)
    floor = load_forward_floor(profile.name, args.forward_floor)
    floor_name = args.forward_floor or forward_noise_path(profile.name).name
    _print_provenance(table, args.results, info, args.forward or [])
    uses = model_uses(df)
    vetoes, veto_lines = judged_vetoes(table, [fdf for _, fdf, _ in forwards], uses, floor)
    verdicts = cell_verdicts(cells, table, args.margin, args.oracle, noise, vetoes)
    totals = forward_totals(cells, table, uses, profile.capture_size, args.oracle)
    if csv_out:
        atomic_write_text(csv_out, verdicts.to_csv(index=False))
    counts = verdicts["verdict"].value_counts().to_dict()
    print(f"{len(verdicts)} cells, graph regime (GPU time); dispatcher vs best of {args.oracle}: {counts}; "
          f"max regret {verdicts['regret'].max():.1%}")
    for line in veto_lines + vetoed_lines(verdicts):
        print(line)
    noise_name = args.noise or noise_path(profile.name).name
    print("intervals: " + (f"bootstrap widened by the run-to-run floor of {noise_name} "
                           f"({noise.source.get('runs', '?')})" if noise else
                           "bootstrap alone (no noise floor for this profile: python -m calibrate noise)"))
    if args.replicate:
        rep_df, _ = _load(args.replicate, args.partial, profile.name, args.allow_mismatch)
        cov = coverage(cells, Cells.from_results(rep_df), noise)
        print(coverage_line(cov, noise.level if noise else LEVEL, f"{args.replicate}'s ratios in {args.results}'s intervals"))
    ev = verdicts["eager_regret"]
    print(f"eager regime (cost max(host, GPU) per call, point estimates): the table's choice costs more than the best "
          f"by over {args.margin:.0%} in {int((ev > args.margin).sum())} of {len(ev)} cells; largest {ev.max():.1%}")
    print("per-forward totals (cell-sum model, µs), dispatcher / best:")
    show = totals.pivot_table(index="m", columns=["model", "regime"], values="dispatch_over_best")
    print(show.to_string(float_format=lambda v: f"{v:.4f}"))
    slower, over = failures(verdicts, totals, floor)
    measured_over = pd.DataFrame()
    measured: set[tuple[str, int]] = set()
    for folder, fdf, finfo in forwards:
        fails, covered = _forward_report(folder, fdf, finfo, cells, table, profile, floor, floor_name, replicate)
        measured_over, measured = pd.concat([measured_over, fails]), measured | covered
    over = over[[(m, mm) not in measured for m, mm in zip(over["model"], over["m"])]]
    for line in limit_lines(df, forwards[0][1] if forwards else None):
        print(line)
    for line in determinism_lines(df):
        print(line)
    if not slower.empty:
        print(f"\nFAIL: the dispatcher is SLOWER than the best path beyond {args.margin:.0%} on {len(slower)} cell(s):")
        print(slower[["n", "k", "m", "chosen", "oracle", "chosen_us", "oracle_us", "regret", "ratio_lo", "ratio_hi"]]
              .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        _say_tactic_differences(args.results, table, slower)
    if not over.empty:
        print("\nFAIL: per-forward total (cell-sum model) more than 1% above the best achievable:")
        print(over.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if not measured_over.empty:
        print("\nFAIL: measured forward of the dispatcher more than 1% above the best measured path:")
        print(measured_over.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    ok = slower.empty and over.empty and measured_over.empty
    print(verdict_word(ok, args.results, df.attrs["incomplete"]))
    return 0 if ok else 1


def vetoed_lines(verdicts: pd.DataFrame) -> list[str]:
    """The cells where a vetoed path was the fastest, with what the choice costs over it (not counted as regret)."""
    if not len(verdicts) or "vetoed" not in verdicts:
        return []
    hit = verdicts[verdicts["vetoed"] != ""]
    if hit.empty:
        return []
    return [f"{len(hit)} cell(s) judged without a vetoed path that was the fastest there (GPU time; chosen over it): "
            + ", ".join(f"{r.n}x{r.k} M={r.m} {r.vetoed} {r.vetoed_regret:+.1%}" for r in hit.itertuples())]


def _say_tactic_differences(results: str, table: ThresholdTable, slower: pd.DataFrame) -> None:
    """Where the run tuned other tactics than the table's file at a SLOWER cell, those cells judge a tuning the
    dispatcher does not run (it loads the table's): say so, with the command that judges what it runs."""
    own = Path(results) / FILE_NAME
    if table.tactics is None or not own.is_file() or not table.tactics.is_file():
        return
    cells = [(int(n), int(k), int(m)) for n, k, m in zip(slower["n"], slower["k"], slower["m"])]
    try:
        diffs = tactic_differences(own, table.tactics, cells)
    except HarnessError as exc:  # a note beside the verdict: an unreadable cache does not stop the verdict
        print(f"  (tactics not compared with the table's: {exc})")
        return
    if diffs:
        print(f"  at {len({d[:3] for d in diffs})} of them this run tuned other tactics than the table's "
              f"({table.tactics}), which the dispatcher loads: "
              + "; ".join(f"{n}x{k} M={m} {runner} {mine} (table: {theirs})" for n, k, m, runner, mine, theirs in diffs)
              + f". To judge the tactics it runs, measure with --autotune-cache {table.tactics}.")


def fitted_forwards(table: ThresholdTable) -> list[str]:
    """The measured-forward folders a table was fitted with (--forward, --table-forward)."""
    src = table.source or {}
    picks = (src.get("measured_forwards") or {}).get("forward") or []
    runs = (src.get("forwards_of_this_table") or {}).get("runs") or []
    return list(dict.fromkeys(str(f).rstrip("/") for f in ([picks] if isinstance(picks, str) else picks) + list(runs)))


def _print_provenance(table: ThresholdTable, results: str, info: dict, forwards: list[str] = ()) -> None:
    used = fitted_forwards(table)
    if used:
        print("measured forwards the table was fitted with: " + ", ".join(used))
    for forward in forwards:
        if str(forward).rstrip("/") in used:
            print(f"{forward} is one of them: its forward verdicts below are in-sample")
    p = provenance(table, results, info.get("ms") or [])
    print(f"table fitted from {p.fitted_from or 'unknown'}"
          + (f" (M {', '.join(map(str, p.held_out))} held out)" if p.held_out else "")
          + f"; validated on {results}" + (" -- the data it was fitted on (in-sample)" if p.in_sample else
                                           f" (out of sample: another run, started {info.get('started', '?')})"))
    if p.unseen and not p.in_sample:
        print(f"M values the fit never saw: {', '.join(map(str, p.unseen))}")


def _forward_report(where: str, fdf: pd.DataFrame, finfo: dict, cells, table, profile, floor, floor_name: str,
                    replicate: tuple[str, pd.DataFrame] | None = None) -> tuple[pd.DataFrame, set[tuple[str, int]]]:
    """Prints measured per-forward ratios and the cell-sum model against them; returns the failing measured
    verdicts and the (model, M) that the measurement covers."""
    ratios = forward_ratios(fdf)
    print(f"\nmeasured forwards ({where}): per-forward µs over aten's")
    print(ratios.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    mv = model_vs_measured(cells, fdf, finfo, profile, table)
    if not mv.empty:
        show = mv.pivot_table(index=["model", "m"], columns=["regime", "path"], values="measured_over_model")
        print(f"\nmeasured / cell-sum model (the model misses by more than {MODEL_MISS:.0%} in "
              f"{int(mv['miss'].sum())} of {len(mv)} rows; largest miss {(mv['measured_over_model'] - 1).abs().max():.1%}):")
        print(show.to_string(float_format=lambda v: f"{v:.3f}"))
    print("\nforward intervals: " + (f"paired per round, widened by the run-to-run floor of "
                                     f"{floor_name} ({floor.describe()}; from "
                                     f"{len(floor.source.get('runs', []))} runs)" if floor else
                                     "paired per round alone (no forward noise floor for this profile: python -m "
                                     "calibrate forward-noise)"))
    if replicate:
        cov = forward_coverage(fdf, replicate[1], floor)
        for regime in ("graph", "eager"):
            print(coverage_line(cov[cov["regime"] == regime], floor.level if floor else LEVEL,
                                f"{regime}, {replicate[0]}'s ratios in {where}'s intervals"))
    fv, other, checkable, covered = judged_forward(fdf, finfo, table, profile, floor)
    if not checkable and not fv.empty:
        print(f"\nnote: {where} has no table-direct rows, so which table its dispatcher ran is not checked")
    if other:
        print(f"\n{where} ran another table's choices than this one at {len(other)} (model, M, regime) (its "
              f"table-direct rows ran other paths): no measured verdict there: "
              + ", ".join(f"{mo} M={m} {r}" for mo, m, r in sorted(other)))
    if fv.empty:
        return fv, set()
    print("\nmeasured forwards, dispatcher / best measured path and / all-aten, both regimes (paired per round; "
          "[interval]; * = the regime vLLM runs that M in" + ("; with table-direct measured, dispatcher / best = the "
          "table's choices called directly / best x the binding's own cost, dispatcher / table-direct"
          if fv["binding_cost"].notna().any() else "") + "):")
    for r in fv.itertuples():
        lo = "" if r.ratio_lo != r.ratio_lo else f" [{r.ratio_lo:.3f}, {r.ratio_hi:.3f}]"
        alo = "" if r.aten_lo != r.aten_lo else f" [{r.aten_lo:.3f}, {r.aten_hi:.3f}]"
        split = "" if r.binding_cost != r.binding_cost else (
            f"   choices {r.choices_over_best:.3f} x binding {r.binding_cost:.3f} [{r.binding_lo:.3f}, {r.binding_hi:.3f}]")
        print(f"  {r.model:22s} M={r.m:<6d} {r.regime:5s}{'*' if r.vllm_regime else ' '} / best ({r.best}) "
              f"{r.dispatch_over_best:.3f}{lo}   / aten {r.dispatch_over_aten:.3f}{alo}   {r.verdict}"
              + split + ("   (same kernels as table-direct: pooled)" if r.same_kernels else ""))
    n_same, med, worst = null_pair_spread(fv)
    if n_same:
        print(f"  identical captured forwards (dispatch and table-direct, same kernels) at {n_same} points: "
              f"|dispatch / table-direct - 1| median {med:.2%}, largest {worst:.2%} (the graph regime's measured noise)")
    return fv[~fv["ok"]], covered  # a (model, M) counts as measured where both regimes were, for this table
