"""python -m bench e2e: transformers' own model, stock against dispatch.patch (bench/e2e.py)."""
from __future__ import annotations

from bench.commands.options import no_ranges, table_of
from bench.e2e import E2E_FILE, E2EConfig, RoundsInterrupted, ratio_lines, run_e2e, write_e2e
from bench.envinfo import run_info
from bench.forward import models_for
from bench.sweep import require_gpu
from harness.cli import int_in
from harness.console import divert_noise
from harness.errors import HarnessError, Interrupted, signals_deferred
from harness.io import output_dir
from harness.options import add
from shapes.grid import parse_m


def add_parser(sub, parents: list) -> None:
    p_e2e = sub.add_parser("e2e", parents=parents,
                           help="(GPU) transformers' own model, stock against dispatch.patch: prefill, generate, a "
                                "captured decode step")
    add(p_e2e, "model", what="(one)", shown="the first of the catalog")
    add(p_e2e, "config")
    add(p_e2e, "layers", type=int_in(1, 1024))
    p_e2e.add_argument("--prefill", default="8,128,1031", help="prompt lengths timed eagerly (default 8,128,1031)")
    p_e2e.add_argument("--tokens", type=int_in(1, 4096), default=24, help="greedy tokens generated (default 24)")
    add(p_e2e, "rounds", type=int_in(1, 1000), default=10,
        what=", variant order shuffled; each gives one sample per step and variant")
    p_e2e.add_argument("--repeats", type=int_in(1, 100), default=3,
                       help="timed calls per sample; the sample is the fastest (default 3)")
    add(p_e2e, "table", what="the patched model runs")
    p_e2e.add_argument("--control", action="store_true",
                       help="an A/A run: the patched model's table has no ranges, so both variants run F.linear's "
                            "kernels and only the bound layers differ; its ratios are this host's noise, for "
                            "calibrate e2e --control")
    add(p_e2e, "out", required=True, what=": e2e.csv and run.json")


def run(args, profile, command: list[str]) -> int:
    from datetime import datetime, timezone

    if args.model and args.config:
        raise HarnessError("--model and --config exclude each other; pass one")
    if args.model and "," in args.model:
        raise HarnessError("bench e2e runs one model; pass one --model")
    models = models_for([args.model] if args.model else None, args.config)
    name, hf = next(iter(models.items()))
    prefill = tuple(parse_m(args.prefill))
    out = output_dir(args.out, "--out")
    if (out / E2E_FILE).exists():
        raise HarnessError(f"{out / E2E_FILE} exists; choose another --out")
    if args.control and args.table:
        raise HarnessError("--control runs a table of no ranges; it excludes --table, pass one of them")
    table = table_of(args.table, profile.name) if args.table else no_ranges(profile) if args.control else None
    require_gpu(profile)  # before any file system change
    import dispatch
    dispatch.configure(table)
    out.mkdir(parents=True, exist_ok=True)
    divert_noise(out / "log.txt")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stopped: RoundsInterrupted | None = None
    try:
        rows = run_e2e(E2EConfig(name, hf, out, args.layers, prefill, args.tokens, args.rounds,
                                 repeats=args.repeats))
    except RoundsInterrupted as exc:
        rows, stopped = exc.rows, exc
    with signals_deferred():  # run.json is written after the run, as before; `started` is when it began
        write_e2e(out, rows, run_info(command, kind="e2e", profile=profile.name, model=name, layers=args.layers,
                                      prefill=list(prefill), tokens=args.tokens, rounds=args.rounds,
                                      repeats=args.repeats, table_file=args.table, control=args.control,
                                      started=started,
                                      status="interrupted" if stopped else "complete",
                                      rounds_done=stopped.rounds if stopped else args.rounds,
                                      variants="stock, and the same model after dispatch.patch (LM head left as is)"))
    print("\n".join([f"e2e {name}: {out}/{E2E_FILE}", *ratio_lines(rows),
                     f"  next: python -m calibrate e2e RUN --control-runs {out}   (this host's noise as each step's "
                     f"margin)"
                     if args.control else
                     f"  next: python -m calibrate e2e {out}{' --partial' if stopped else ''}   (each step's interval "
                     f"and verdict)"]))
    if stopped is not None:
        raise Interrupted(f"interrupted after {stopped.rounds} of {args.rounds} rounds; their rows are in "
                          f"{out / E2E_FILE}", stopped.signum)
    return 0
