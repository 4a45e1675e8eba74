"""python -m calibrate compare RUN_A RUN_B: run B against run A per cell and path (calibrate/compare.py holds the
comparison; docs/compare.md the verdict classes)."""
from __future__ import annotations

from bench.results import load_run_info
from calibrate.compare import DEFAULT_MARGIN, compare, summary_lines
from calibrate.noise import load_noise
from calibrate.runs import load_run, profile_of
from dispatch.profiles import get_profile
from harness.cli import float_in
from harness.errors import HarnessError
from harness.io import atomic_write_text, distinct, output_file
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_cmp = sub.add_parser("compare", parents=parents,
                           help="run B against run A per cell and path: ratio, interval, SAME/FASTER/SLOWER/AMBIGUOUS "
                                "(exit 1 where any cell is SLOWER)")
    p_cmp.add_argument("run_a", help="the reference run (results folder)")
    p_cmp.add_argument("run_b", help="the run judged against it")
    add(p_cmp, "margin", type=float_in(0.0, 0.5), default=DEFAULT_MARGIN)
    add(p_cmp, "paths", what="to compare", shown="every path both runs measured")
    add(p_cmp, "no-floor", what="(intervals from the runs' replays alone)")
    p_cmp.add_argument("--allow-env-mismatch", action="store_true",
                       help="compare runs whose environments differ (FlashInfer, CUDA, driver, GPU, pdl, ...)")
    add(p_cmp, "out-file", what=": a CSV of every compared cell")
    add(p_cmp, "partial")


def run(args) -> int:
    distinct([args.run_a, args.run_b], "compare")
    out = output_file(args.out_file, "--out-file") if args.out_file else None
    ia, ib = load_run_info(args.run_a), load_run_info(args.run_b)
    profile = get_profile(profile_of(ia, args.gpu))
    a, _ = load_run(args.run_a, args.partial, profile.name)
    b, _ = load_run(args.run_b, args.partial, profile.name)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()] if args.paths else None
    result = compare(a, b, ia, ib, None if args.no_floor else load_noise(profile.name), args.margin, paths)
    if result.env_differences and not args.allow_env_mismatch:
        raise HarnessError(f"{args.run_a} and {args.run_b} ran in different environments "
                           f"({'; '.join(result.env_differences)}); a verdict could be the environment's, not the "
                           f"code's: pass --allow-env-mismatch to compare them anyway")
    print("\n".join(summary_lines(result, args.margin, args.run_a, args.run_b)))
    if out is not None:
        atomic_write_text(out, result.rows.to_csv(index=False))
        print(f"wrote {out}")
    return 1 if (result.rows["verdict"] == "SLOWER").any() else 0
