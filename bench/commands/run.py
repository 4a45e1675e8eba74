"""python -m bench run: the sweep of the shape catalog x M grid x paths (bench/sweep.py)."""
from __future__ import annotations

from dataclasses import replace

from bench.commands.options import check_before_gpu, layout_and_tuning, saved, served, table_of
from bench.gpu import L2_MODES, Stopping
from bench.multi import run_on_devices
from bench.paths import PATHS, paths_for
from bench.shard import assign, full_catalog, full_grid_ms, parse_shard, shard_from_env
from bench.sweep import GPU_BOUND_HOST_BLOCKS, SweepConfig, dry_run, run_sweep
from harness.cli import float_in, int_in
from harness.errors import HarnessError
from harness.io import output_dir
from harness.options import add
from shapes.catalog import catalog, select, select_cells
from shapes.grid import parse_m


def add_parser(sub, parents: list) -> None:
    p_run = sub.add_parser("run", parents=parents, help="sweep the shape catalog x M grid x paths on this GPU")
    add(p_run, "shapes", shown="the whole catalog")
    add(p_run, "model", what="(one) whose shapes alone are measured", shown="every model")
    add(p_run, "tp", type=int_in(1, 64), default=1)
    add(p_run, "m", shown="the default grid")
    p_run.add_argument("--cells", metavar="SHAPE:M;...",
                       help="per shape its own M values, e.g. n256_k2048:80,96;n1024_k2048:20 (instead of --shapes "
                            "and --m; the table pipeline measures the gaps of a first fit this way)")
    add(p_run, "paths", what=f"(known: {', '.join(PATHS)})", shown="the profile's")
    add(p_run, "table", what="the dispatch path runs")
    add(p_run, "out", default="results/latest")
    add(p_run, "resume", what="in --out")
    p_run.add_argument("--timer", choices=("cupti", "events"), default="cupti",
                       help="GPU timer: CUPTI kernel records (default) or CUDA events only")
    add(p_run, "samples", type=int_in(3, 1000), default=10, what="(the most graph replays) per path and cell")
    p_run.add_argument("--min-samples", type=int_in(3, 1000), default=5,
                       help="replays stop early once a path has this many and their relative standard deviation is "
                            "at most --max-noise (nvbench's stdrel; default 5; = --samples: a fixed count)")
    p_run.add_argument("--max-noise", type=float_in(0, 1), default=0.005,
                       help="the stopping criterion's relative standard deviation (default 0.005)")
    p_run.add_argument("--replay-us", type=float_in(10, 100_000), default=500.0,
                       help="the GPU time one captured graph of a path aims at, which sets its calls per graph "
                            "(default 500)")
    p_run.add_argument("--host-calls", type=int_in(1, 1000), default=10,
                       help=f"eager calls per block of the host timing (default 10; at most {GPU_BOUND_HOST_BLOCKS[0]} "
                            f"where a call is GPU-bound)")
    p_run.add_argument("--host-rounds", type=int_in(1, 100), default=5,
                       help=f"interleaved rounds of those blocks (default 5; at most {GPU_BOUND_HOST_BLOCKS[1]} "
                            f"where a call is GPU-bound)")
    p_run.add_argument("--host-block-us", type=float_in(0, 1_000_000), default=1000.0,
                       help="a host-timing block holds the calls that last this long by a warm-up estimate, at least "
                            "3 and at most --host-calls (default 1000; 0: always --host-calls)")
    p_run.add_argument("--time-twins", action="store_true",
                       help="replay a public FlashInfer call and its lean twin, and the dispatcher, in full even where "
                            "their kernels match (default: once, gpu_from names the timed path)")
    add(p_run, "no-compile-ahead")
    p_run.add_argument("--l2", choices=L2_MODES, default="rotate",
                       help="L2 state of each timed call: rotate = cold by rotating input/weight copies over >= 5x L2 "
                            "(default); flush = one copy, a buffer of 2x L2 written before every call inside the graph "
                            "(its kernels excluded from the call's time); warm = one copy, no flush")
    add(p_run, "no-tune")
    p_run.add_argument("--tune-all", action="store_true", help="also tune backends that are untuned by default (cudnn)")
    p_run.add_argument("--max-rotations", type=int_in(1, 4096), default=512,
                       help="at most this many rotated input/weight copies per graph (default 512)")
    add(p_run, "allow-mismatch")
    p_run.add_argument("--grid", choices=("default", "full"), default="default",
                       help="full: both models' catalogs at TP 1, 2, 4 and 8 and every vLLM capture size besides the "
                            "default M grid (excludes --shapes, --model, --tp and --m)")
    p_run.add_argument("--shard", metavar="I/N", help="measure shard I of N (I from 1): the shapes split longest first "
                                                      "over N machines; 'auto' reads a Slurm array or torchrun's "
                                                      "RANK/WORLD_SIZE; merge the shards with python -m bench merge")
    p_run.add_argument("--devices", metavar="LIST",
                       help="comma list of local GPU indices, or 'all': one worker process per GPU, shapes handed out "
                            "longest first, the shards merged into --out")
    p_run.add_argument("--host-timing", choices=("serialized", "concurrent"), default="serialized",
                       help="with --devices: host-time blocks one worker at a time (default), or concurrent "
                            "(measured on two GPUs: no shift beyond the run-to-run noise; calibrate host-shift "
                            "compares such runs)")
    p_run.add_argument("--pdl", choices=("profile", "on", "off"), default="profile",
                       help="programmatic dependent launch for the backends that take it: the profile's (vLLM's: on "
                            "for SM >= 90; default), or forced on/off to measure what it changes; run.json records it")
    p_run.add_argument("--all", action="store_true",
                       help="time every cell (default: a low-M backend is skipped on a shape above an M where its GPU "
                            "time exceeded 2x F.linear's cost in both regimes, a backend without a lean call, "
                            "which the dispatcher cannot choose, is skipped, and FlashInfer's public call is timed "
                            "only where the FlashInfer-alone comparison runs it)")
    add(p_run, "dry-run", what="(paths, skips with reasons, tuning buckets, cells, estimated time); no GPU")
    layout_and_tuning(p_run)


def run(args, profile, command: list[str], tokens: int | None) -> int:
    if args.grid == "full":
        given = [f"--{o}" for o in ("shapes", "model", "m") if getattr(args, o)] + (["--tp"] if args.tp != 1 else [])
        if given:
            raise HarnessError(f"--grid full names its own shapes and M values; leave out {', '.join(given)}")
        shapes, ms = full_catalog(), full_grid_ms()
    cells = None
    if args.cells is not None:
        given = [f"--{o}" for o in ("shapes", "m", "shard", "devices") if getattr(args, o)] + (
            ["--grid full"] if args.grid == "full" else [])
        if given:
            raise HarnessError(f"--cells names its own shapes and M values on one GPU; leave out {', '.join(given)}")
        shapes, cells = select_cells(catalog(args.model, args.tp, args.layout), args.cells)
        ms = sorted({m for v in cells.values() for m in v})
    elif args.grid != "full":
        shapes, ms = select(catalog(args.model, args.tp, args.layout), args.shapes), parse_m(args.m)
    if args.pdl != "profile":
        profile = replace(profile, pdl=args.pdl == "on")
    paths = paths_for(profile.flashinfer_backends, args.paths)
    shard = None
    if args.shard:
        if args.devices:
            raise HarnessError("--shard splits over machines, --devices over this machine's GPUs; pass one of them")
        i, n = parse_shard(args.shard)
        grid_shapes = [s.name for s in shapes]
        shapes = assign(shapes, n, ms, paths, profile)[i - 1]
        shard = {"index": i, "of": n, "grid_shapes": grid_shapes}
        if not shapes:
            raise HarnessError(f"shard {i}/{n} has no shape (the grid has {len(grid_shapes)}); use fewer shards")
    if args.host_timing != "serialized" and not args.devices:
        raise HarnessError("--host-timing concurrent is about the workers of --devices; pass --devices too")
    table = table_of(args.table, profile.name) if args.table else None
    cfg = SweepConfig(profile=profile, shapes=shapes, ms=ms, paths=paths, cells=cells,
                      out=output_dir(args.out, "--out"), timer=args.timer, samples=args.samples, l2=args.l2,
                      resume=args.resume, allow_mismatch=args.allow_mismatch, tune=not args.no_tune, tune_all=args.tune_all,
                      tune_gemv=bool(args.tune or args.save_autotune_cache),
                      autotune_cache=served(args, profile, table, [(s.n, s.k, m) for s in shapes
                                                             for m in (cells[s.name] if cells else ms)],
                                             [p.name for p in paths]),
                      save_autotune_cache=saved(args), max_rotations=args.max_rotations, command=command,
                      quiet=True, shard=shard,
                      vllm_tune_tokens=tokens, hopeless_factor=None if args.all else 2.0, layout=args.layout,
                      stopping=Stopping(min(args.min_samples, args.samples), args.max_noise)
                      if args.min_samples < args.samples else None, time_twins=args.time_twins,
                      compile_ahead=not args.no_compile_ahead,
                      table=table, table_file=args.table, target_replay_us=args.replay_us,
                      host_calls=args.host_calls, host_rounds=args.host_rounds,
                      host_block_us=args.host_block_us or None, skip_unchoosable=not args.all and args.paths is None)
    check_before_gpu(cfg, args)
    if args.dry_run:
        where = f" ({shard_from_env()[2]})" if args.shard and args.shard.strip() == "auto" else ""
        print(dry_run(cfg) + (f"\n  shard {shard['index']}/{shard['of']}{where}: {len(shapes)} of "
                              f"{len(shard['grid_shapes'])} shapes" if shard else ""))
        return 0
    if args.devices:
        run_on_devices(cfg, args.devices, host_timing=args.host_timing)
        return 0
    run_sweep(cfg)  # stops first, writing nothing, when there is no CUDA GPU; prints its summary
    return 0
