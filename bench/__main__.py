"""python -m bench run | merge | forward | host-anatomy | paths | profiles"""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("bench")  # Ctrl-C during the imports below: one line, no traceback

import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from bench.anatomy_gpu import run_anatomy
from bench.forward import DEFAULT_SETTLE_MS, FORWARD_MS, SETTLE_AT, ForwardConfig, models_for, run_forward, sequences
from bench.forward_paths import check_rules, default_rules
from bench.gpu import L2_MODES, Stopping
from bench.paths import PATHS, paths_for
from bench.merge import merge_shards
from bench.multi import run_on_devices
from bench.shard import assign, full_catalog, full_grid_ms, parse_shard, shard_from_env
from bench.sweep import GPU_BOUND_HOST_BLOCKS, SweepConfig, dry_run, require_gpu, run_sweep
from dispatch import vllm
from dispatch.backends import ATEN, flashinfer_path
from dispatch.profiles import PROFILES, get_profile
from dispatch.table import check_files, load_table, shipped_table
from harness.cli import Parser, float_in, int_in
from harness.options import add
from harness.options import parent as shared
from harness.console import divert_noise
from harness.errors import HarnessError, Interrupted, run_cli, signals_deferred
from harness.io import output_dir, output_file
from shapes.catalog import catalog, select, select_cells
from shapes.derive import CATALOG_LAYOUTS
from shapes.grid import hybrid_buckets, parse_m


def main(argv: Sequence[str] | None = None) -> int:
    parser, sub, gpu, tactics = _parser()
    _add_run(sub, [gpu, tactics])
    _add_anatomy_and_e2e(sub, [gpu])
    _add_forward(sub, [gpu, tactics])
    _add_tools(sub)
    args = parser.parse_args(argv)
    if args.cmd in ("merge", "paths", "profiles"):
        return _tool(args)
    profile = get_profile(args.gpu)
    vllm_tokens = _vllm_tokens(args, profile)
    command = ["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]
    if args.cmd == "host-anatomy":
        return _host_anatomy(args, profile, command)
    if args.cmd == "e2e":
        return _e2e(args, profile, command)
    if args.cmd == "forward":
        return _forward(args, profile, command, vllm_tokens)
    return _run(args, profile, command, vllm_tokens)


def _parser():
    """The parser, its subparsers and the parent options shared by several commands (--gpu; the tactics options)."""
    parser = Parser(prog="python -m bench", description="GPU and host time of BF16 GEMM paths.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    gpu = shared(("gpu", dict(required=True)))
    tactics = shared("autotune-cache", "save-autotune-cache", "tune")
    return parser, sub, gpu, tactics


def _add_run(sub, parents: list) -> None:
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
                            "time exceeded 2x F.linear's cost in both regimes, and a backend without a lean call, "
                            "which the dispatcher cannot choose, is skipped)")
    add(p_run, "dry-run", what="(paths, skips with reasons, tuning buckets, cells, estimated time); no GPU")
    _add_layout_and_tuning(p_run)


def _add_anatomy_and_e2e(sub, parents: list) -> None:
    p_an = sub.add_parser("host-anatomy", parents=parents,
                          help="where a FlashInfer call's host time goes, layer by layer, vs F.linear")
    add(p_an, "shapes", default="n2048_k4096")
    add(p_an, "m", default="8,48,1024", shown="8,48,1024: tuning buckets 8 and 1024, and 48, which is none")
    p_an.add_argument("--backends", help="FlashInfer backends (default: the profile's low-M backend and cublaslt)")
    add(p_an, "calls", type=int_in(1, 100_000), default=40, what="per layer and round")
    add(p_an, "rounds", type=int_in(1, 1000), default=9)
    add(p_an, "out", default="results/host-anatomy")
    add(p_an, "allow-mismatch")
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


def _add_forward(sub, parents: list) -> None:
    p_fw = sub.add_parser("forward", parents=parents,
                          help="per-forward linear time of whole models, CUDA graph and eager, per path")
    add(p_fw, "model", what="(comma list)", shown="every model of the catalog")
    add(p_fw, "config")
    add(p_fw, "tp", type=int_in(1, 64), default=1)
    add(p_fw, "m", default=",".join(map(str, FORWARD_MS)))
    add(p_fw, "paths", what="or forward rules (`python -m bench paths` lists the registry)",
        shown="aten, vllm-default, vllm-flag, seed-pr, vllm-op:<low-M backend>, dispatch")
    add(p_fw, "layers", type=int_in(1, 1000), what="; every row says so")
    p_fw.add_argument("--no-lm-head", action="store_true", help="leave lm_head out of the forward")
    add(p_fw, "samples", type=int_in(3, 1000), default=10, what="(forwards) per path, regime and M")
    add(p_fw, "no-tune")
    add(p_fw, "out", default="results/forward")
    add(p_fw, "resume", what="in --out")
    p_fw.add_argument("--order-seed", type=int_in(1, 2 ** 31 - 1),
                      help="the eager rounds' shuffle (default: a fresh one per run, recorded in run.json)")
    p_fw.add_argument("--settle-ms", type=float_in(0, 10_000), default=DEFAULT_SETTLE_MS,
                      help=f"each timed forward, graph and eager, follows untimed runs of itself lasting at least this "
                           f"long (default {DEFAULT_SETTLE_MS:g}; 0: none): at the GPU's power cap a forward's time "
                           f"depends on the load before it")
    p_fw.add_argument("--settle-at", choices=SETTLE_AT, default="capped",
                      help="capped (default): settle only at an M whose heaviest forward, run --settle-ms long, then "
                           "runs power-capped or below the maximum SM clock (NVML; run.json's settle_probes), and the "
                           "first uncapped eager forward after capped ones; every: settle every timed forward")
    p_fw.add_argument("--no-settle", action="store_true", help="the same as --settle-ms 0")
    p_fw.add_argument("--sustain-ms", type=float_in(1, 60_000),
                      help="instead of timing rows: after --idle-ms, replay each path's captured forward back to back "
                           "this long, every replay timed, the SM clock and power beside it (sustain.csv; how long "
                           "a load takes to settle at the power cap, for --settle-ms)")
    p_fw.add_argument("--idle-ms", type=float_in(0, 60_000), default=1000.0,
                      help="with --sustain-ms: the idle gap before each path's replays (default 1000)")
    p_fw.add_argument("--skip-slower", type=float_in(1.5, 1000), metavar="X",
                      help="at each M, skip (both regimes, a row that says so) a path whose captured forward takes more "
                           "than X times all-aten's: never the best, and slow forwards take long "
                           "(default: time every path)")
    add(p_fw, "table", what="the dispatch and table-direct rules run, e.g. one fitted without forward overrides, to "
                             "fit them anew")
    _add_layout_and_tuning(p_fw)


def _add_layout_and_tuning(p) -> None:
    """The options run and forward share: the layout of the model's linears and how FlashInfer is tuned."""
    add(p, "layout", choices=CATALOG_LAYOUTS, default="vllm",
        what="as vLLM fuses them, as transformers builds them, or (bench run only) the union of both: one table for "
             "a vLLM and a transformers model")
    add(p, "tuning")
    add(p, "max-num-batched-tokens", type=int_in(1, 1 << 20))


def _add_tools(sub) -> None:
    p_merge = sub.add_parser("merge", help="merge shards of one grid (bench run --shard, or several machines) into one run")
    p_merge.add_argument("shards", nargs="+", help="the shards' results folders")
    add(p_merge, "out", old="-o", required=True, what=": the merged run (must not hold results)")
    add(p_merge, "partial", what="(missing or unfinished shards)")
    sub.add_parser("paths", help="list the path registry")
    p_prof = sub.add_parser("profiles", help="list the GPU profiles (or check that NAME is one)")
    p_prof.add_argument("name", nargs="?", help="a profile name: exit 2 with one line when it is unknown")


def _tool(args) -> int:
    """merge, paths, profiles: the commands that need no GPU profile."""
    if args.cmd == "merge":
        target = output_dir(args.out, "--out")
        if target.is_dir() and any(target.iterdir()):  # a user's folder: nothing in it is ours to replace
            raise HarnessError(f"{target} is not empty; merge into a new or empty folder (nothing was changed)")
        out = merge_shards([Path(d) for d in args.shards], target, args.partial)
        print(f"merged {len(args.shards)} shard(s) into {out}/results.csv and run.json\n"
              f"  next: python -m calibrate validate {out}")
        return 0
    if args.cmd == "paths":
        for p in PATHS.values():
            sms = "any" if p.sms is None else "/".join(map(str, p.sms))
            print(f"{p.name:22s} {p.role:10s} SM {sms:24s} {p.note}")
        return 0
    if args.cmd == "profiles":
        for p in ([get_profile(args.name)] if args.name else PROFILES.values()):
            print(f"{p.name:6s} SM{p.sm} {p.name_pattern:6s} backends={','.join(p.flashinfer_backends)} "
                  f"low-M={p.low_m_backend} capture={p.capture_size} "
                  f"vllm-flag={'cute-dsl' if vllm.flag_supported(p.sm) else 'F.linear'}")
        return 0

    raise AssertionError(args.cmd)


def _host_anatomy(args, profile, command: list[str]) -> int:
    backends = ([b.strip() for b in args.backends.split(",") if b.strip()] if args.backends
                else list(dict.fromkeys((profile.low_m_backend, "cublaslt"))))
    unknown = [b for b in backends if flashinfer_path(b) not in PATHS]
    if unknown:
        raise HarnessError(f"unknown FlashInfer backend(s) {', '.join(unknown)}; known: "
                           f"{', '.join(p.flashinfer_backend for p in PATHS.values() if p.flashinfer_backend)}")
    shapes, ms, out_dir = select(catalog(), args.shapes), parse_m(args.m), output_dir(args.out, "--out")
    require_gpu(profile, args.allow_mismatch)
    divert_noise(out_dir / "log.txt")
    out = run_anatomy(profile, shapes, ms, backends, out_dir, args.calls, args.rounds, args.allow_mismatch, command)
    print(f"results: {out}/results.csv, {out}/run.json")
    return 0



def _forward(args, profile, command: list[str], vllm_tokens: int | None) -> int:
    if args.model and args.config:
        raise HarnessError("--model and --config exclude each other; pass one")
    models = models_for([s.strip() for s in args.model.split(",") if s.strip()] if args.model else None, args.config)
    cfg = ForwardConfig(profile=profile, models=models, ms=parse_m(args.m),
                        rules=check_rules([s.strip() for s in args.paths.split(",") if s.strip()] if args.paths
                                          else list(default_rules(profile))),
                        out=output_dir(args.out, "--out"), tp=args.tp, samples=args.samples,
                        decoder_layers=args.layers, lm_head=not args.no_lm_head, tune=not args.no_tune,
                        autotune_cache=None, save_autotune_cache=_saved(args),
                        resume=args.resume, command=command, quiet=True, order_seed=args.order_seed,
                        settle_ms=0.0 if args.no_settle else args.settle_ms, settle_at=args.settle_at,
                        table=_table(args.table, profile.name) if args.table else None, table_file=args.table,
                        sustain_ms=args.sustain_ms or 0.0, idle_ms=args.idle_ms, skip_slower=args.skip_slower,
                        vllm_tune_tokens=vllm_tokens, layout=args.layout)
    if cfg.sustain_ms and args.resume:
        raise HarnessError("--sustain-ms runs cannot be resumed; run it again into a new --out")
    seqs = sequences(cfg)  # a config that cannot be derived stops here, before the GPU is touched
    wanted = [(lin.n, lin.k, m) for seq in seqs.values() for lin in seq for m in cfg.ms]
    cfg = replace(cfg, autotune_cache=_served(args, profile, cfg.table, wanted, cfg.rules))
    run_forward(cfg)
    return 0



def _run(args, profile, command: list[str], vllm_tokens: int | None) -> int:
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
    table = _table(args.table, profile.name) if args.table else None
    cfg = SweepConfig(profile=profile, shapes=shapes, ms=ms, paths=paths, cells=cells,
                      out=output_dir(args.out, "--out"), timer=args.timer, samples=args.samples, l2=args.l2,
                      resume=args.resume, allow_mismatch=args.allow_mismatch, tune=not args.no_tune, tune_all=args.tune_all,
                      autotune_cache=_served(args, profile, table, [(s.n, s.k, m) for s in shapes
                                                             for m in (cells[s.name] if cells else ms)],
                                             [p.name for p in paths]),
                      save_autotune_cache=_saved(args), max_rotations=args.max_rotations, command=command,
                      quiet=True, shard=shard,
                      vllm_tune_tokens=vllm_tokens, hopeless_factor=None if args.all else 2.0, layout=args.layout,
                      stopping=Stopping(min(args.min_samples, args.samples), args.max_noise)
                      if args.min_samples < args.samples else None, time_twins=args.time_twins,
                      table=table, table_file=args.table, target_replay_us=args.replay_us,
                      host_calls=args.host_calls, host_rounds=args.host_rounds,
                      host_block_us=args.host_block_us or None, skip_unchoosable=not args.all and args.paths is None)
    _check_before_gpu(cfg, args)
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


def _e2e(args, profile, command: list[str]) -> int:
    from datetime import datetime, timezone

    from bench.e2e import E2E_FILE, E2EConfig, RoundsInterrupted, ratio_lines, run_e2e, write_e2e
    from bench.envinfo import run_info
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
    table = _table(args.table, profile.name) if args.table else no_ranges(profile) if args.control else None
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


def _check_before_gpu(cfg: SweepConfig, args) -> None:
    """What a real run would refuse, checked before any GPU is touched, so that --dry-run fails the same way."""
    from bench import autotune_cache
    from bench.multi import parse_devices
    from bench.results import done_keys
    if args.devices and args.devices.strip() != "all":
        parse_devices(args.devices, 1 << 16)  # the syntax; the real run checks the indices against its GPUs
    if cfg.autotune_cache is not None:
        autotune_cache.read_entries(cfg.autotune_cache)
        autotune_cache.read_gemv(cfg.autotune_cache)
    if cfg.resume:
        done_keys(cfg.out)


def _vllm_tokens(args, profile) -> int | None:
    """--tuning vllm: the max_num_batched_tokens to tune at; None for the grid's own tuning."""
    if getattr(args, "tuning", "grid") != "vllm":
        if getattr(args, "max_num_batched_tokens", None):
            raise HarnessError("--max-num-batched-tokens is for --tuning vllm; pass both or neither")
        return None
    if args.no_tune or args.autotune_cache:
        raise HarnessError("--tuning vllm tunes; it contradicts --no-tune and --autotune-cache; pass one of them")
    return args.max_num_batched_tokens or profile.server.max_num_batched_tokens


def no_ranges(profile):
    """The A/A control's table: no range in either regime, so every bound layer runs F.linear."""
    from dispatch.table import ThresholdTable
    return ThresholdTable.from_thresholds(profile.name, profile.low_m_backend, 0,
                                          source={"note": "no ranges: an A/A control (bench e2e --control)"})


def _table(path: str, profile: str):
    """A --table file for the dispatch and table-direct rules; one line and exit 2 when it is not this GPU's."""
    table = load_table(path=path)
    if table.profile != profile:
        raise HarnessError(f"--table {path} is a table for {table.profile}, not {profile}; pass one fitted for {profile}")
    check_files(table)
    return table


def _served(args, profile, table, cells: list[tuple[int, int, int]], paths: list[str]) -> Path | None:
    """The tactics file the run serves (None: it tunes): --autotune-cache FILE; else, unless the run tunes or times
    FlashInfer's default tactics, the tactics of the table its dispatch path runs (the file the dispatcher loads),
    where that file holds every (N, K) of the run at each of its M that is a tuning bucket. The autotuner's pick
    among near-tied cuBLASLt tactics differs from process to process, so a run that tunes measures a draw of them."""
    if args.tune and (args.autotune_cache or args.no_tune or getattr(args, "tuning", "grid") == "vllm"):
        raise HarnessError("--tune contradicts --autotune-cache, --no-tune and --tuning vllm; pass one of them")
    if not args.autotune_cache:
        return _table_tactics(args, profile, table, cells, paths)
    path = Path(args.autotune_cache)
    if path.is_dir():
        raise HarnessError(f"--autotune-cache {path} is a folder; name its autotune-cache.json")
    if not path.is_file():
        raise HarnessError(f"--autotune-cache {path}: no such file; serve an existing autotune-cache.json, or tune "
                           f"(leave it out) and keep the tactics with --save-autotune-cache FILE")
    return path


def _table_tactics(args, profile, table, cells: list[tuple[int, int, int]], paths: list[str]) -> Path | None:
    """The default of _served: the tactics file of `table` (the run's --table; None: the profile's table), or None
    (tune) where the run tunes by its options, runs no FlashInfer path, or the file lacks a cell the run would tune."""
    from bench import autotune_cache
    if (args.tune or args.no_tune or args.save_autotune_cache or getattr(args, "tuning", "grid") == "vllm"
            or all(name == ATEN for name in paths)):
        return None
    if table is None:
        table = shipped_table(profile.name)  # a damaged one stops here; a profile without one: nothing to serve
        if table is None:
            return None
    tactics = table.tactics
    if tactics is None or not tactics.is_file():
        return None
    buckets = set(hybrid_buckets())
    tuned = sorted({cell for cell in cells if cell[2] in buckets})
    if autotune_cache.missing(tactics, tuned):
        return None
    return tactics


def _saved(args) -> Path | None:
    if not args.save_autotune_cache:
        return None
    if args.autotune_cache:
        raise HarnessError("--autotune-cache serves tactics (no tuning), so there are none to save with "
                           "--save-autotune-cache; pass one of them")
    return output_file(args.save_autotune_cache, "--save-autotune-cache")


if __name__ == "__main__":
    sys.exit(run_cli(main, "bench"))
