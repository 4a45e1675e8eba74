"""python -m bench forward: per-forward linear time of whole models, captured and eager, per rule (bench/forward.py)."""
from __future__ import annotations

from dataclasses import replace

from bench.commands.options import layout_and_tuning, saved, served, table_of
from bench.forward import DEFAULT_SETTLE_MS, FORWARD_MS, SETTLE_AT, ForwardConfig, models_for, run_forward, sequences
from bench.forward_paths import check_rules, default_rules
from harness.cli import float_in, int_in
from harness.errors import HarnessError
from harness.io import output_dir
from harness.options import add
from shapes.grid import parse_m


def add_parser(sub, parents: list) -> None:
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
    add(p_fw, "no-compile-ahead")
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
    layout_and_tuning(p_fw)


def run(args, profile, command: list[str], tokens: int | None) -> int:
    if args.model and args.config:
        raise HarnessError("--model and --config exclude each other; pass one")
    models = models_for([s.strip() for s in args.model.split(",") if s.strip()] if args.model else None, args.config)
    cfg = ForwardConfig(profile=profile, models=models, ms=parse_m(args.m),
                        rules=check_rules([s.strip() for s in args.paths.split(",") if s.strip()] if args.paths
                                          else list(default_rules(profile))),
                        out=output_dir(args.out, "--out"), tp=args.tp, samples=args.samples,
                        decoder_layers=args.layers, lm_head=not args.no_lm_head, tune=not args.no_tune,
                        autotune_cache=None, save_autotune_cache=saved(args),
                        resume=args.resume, command=command, quiet=True, order_seed=args.order_seed,
                        settle_ms=0.0 if args.no_settle else args.settle_ms, settle_at=args.settle_at,
                        table=table_of(args.table, profile.name) if args.table else None, table_file=args.table,
                        sustain_ms=args.sustain_ms or 0.0, idle_ms=args.idle_ms, skip_slower=args.skip_slower,
                        vllm_tune_tokens=tokens, layout=args.layout, compile_ahead=not args.no_compile_ahead)
    if cfg.sustain_ms and args.resume:
        raise HarnessError("--sustain-ms runs cannot be resumed; run it again into a new --out")
    seqs = sequences(cfg)  # a config that cannot be derived stops here, before the GPU is touched
    wanted = [(lin.n, lin.k, m) for seq in seqs.values() for lin in seq for m in cfg.ms]
    cfg = replace(cfg, autotune_cache=served(args, profile, cfg.table, wanted, cfg.rules))
    run_forward(cfg)
    return 0
