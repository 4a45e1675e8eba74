"""A sweep: catalog x M grid x paths on one GPU, one (shape, M) group at a time, results written after each group."""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import dispatch
from bench import autotune_cache
from bench.ahead import Ahead
from bench.ceiling import annotate
from bench.ceiling import measure as measure_ceilings
from bench.clocks import make_clock
from bench.envinfo import nvml_clocks, run_info
from bench.gpu import (REL_ERR_BOUND, InputPool, L2Flush, Operands, Replays, Stopping, aligned, capture,
                       determinism, flashinfer_choices, make_weights, output_error, reference, replay_interleaved)
from bench.hosttime import MIN_CALLS, host_times
from bench.paths import DISPATCH, PATHS, GemmPath, kernel_twins
from bench.skips import Skips, hopeless_after, shape_fields, skip_reason_at, split_runnable
from bench.results import CsvLines, done_keys, write_parquet, write_results, write_run_json
from bench.shard import SECONDS_PER_CELL, SECONDS_PER_TUNING
from bench.stats import (PhaseTimer, Window, attribute, calls_per_graph, estimate_call_us, kernel_digest,
                         rotation_count, summary)
from dispatch import vllm
from dispatch.backends import GEMV
from dispatch.profiles import GpuProfile, check_device, this_gpu
from harness.console import divert_noise, log_path, terminal, third_party_stdout
from harness.errors import HarnessError, Interrupted, signal_of, signals_deferred
from shapes.catalog import Shape
from shapes.grid import hybrid_buckets
from dispatch import gemv
from dispatch.table import shipped_table

MAX_ROTATION_BYTES = 8 << 30
NEW_WEIGHTS = "new weights (inside operands)"  # a phase counted inside another, as the CUPTI drain is in replay
# (calls, rounds) at most, of the host timing of a GPU-bound call: its host time cannot decide its eager cost there
GPU_BOUND_HOST_BLOCKS = (5, 3)
# a call estimated this long on the GPU (the largest M of the largest weights) hides any host time measured here
# several times over (docs/design.md, "A sweep's cost"): one block of HIDDEN_HOST_BLOCKS[0] calls, no warm-up (the
# check has just run it on the same operands). Every host-timed call also runs on the GPU, so fewer calls there
# shorten the sweep by their GPU time.
HIDDEN_HOST_US = 3000.0
HIDDEN_HOST_BLOCKS = (3, 1)


@dataclass
class SweepConfig:
    profile: GpuProfile
    shapes: list[Shape]
    ms: list[int]
    paths: list[GemmPath]
    out: Path
    cells: dict[str, list[int]] | None = None  # --cells: per shape name, its own M (then `ms` is their union)
    timer: str = "cupti"
    samples: int = 10  # the most timed replays per path and cell
    stopping: Stopping | None = Stopping()  # None: every path `samples` replays
    time_twins: bool = False  # True: a twin with the same kernels is replayed in full, not read off its twin
    compile_ahead: bool = True  # the C++ layer and the GEMV's kernels compiled in threads at the start
    table: Any = None  # the table the dispatch path runs (None: the profile's committed table)
    table_file: str | None = None
    host_calls: int = 10  # per round; host time is the median over rounds of each round's median
    host_rounds: int = 5
    host_block_us: float | None = 1000.0  # a slower call gets fewer calls per block (at least 3; bench.hosttime)
    gpu_bound_us: float = 100.0  # a call estimated this long on the GPU is host-timed in GPU_BOUND_HOST_BLOCKS
    write_every_s: float = 5.0  # results are rewritten at most this often (and always at the end or on interrupt)
    # A low-M backend is no longer timed on a shape from the M after one where its GPU time exceeded this many times
    # F.linear's cost there in both regimes (GPU time, and max(host, GPU)): it only grows with M, so it cannot win
    # above. None (--all): every cell is timed.
    hopeless_factor: float | None = None  # bench run sets 2.0 unless --all; baselines time every cell
    # Paths that cannot change a decision (bench.skips: a backend the dispatcher cannot choose, a public FlashInfer
    # call where the FlashInfer-alone comparison runs another path) get a skipped row per cell; bench run sets it
    # unless --all or --paths.
    skip_unchoosable: bool = False
    ceilings: bool = True  # measure the machine's read ceilings (bench/ceiling.py) and each row's share of them
    l2: str = "rotate"  # rotate | flush | warm (bench.gpu.L2_MODES)
    resume: bool = False
    allow_mismatch: bool = False
    tune: bool = True
    tune_all: bool = False
    # A run that tunes FlashInfer (tune, no tactics served) tunes the GEMV too, unless this is off and the table it
    # runs has GEMV configurations to serve: bench run tunes FlashInfer for want of tactics cells, but the GEMV only
    # with --tune (the dispatcher runs the table's configurations, and tuning compiles every candidate per cell).
    tune_gemv: bool = True
    autotune_cache: Path | None = None  # FlashInfer tactics to serve (an existing file): no tuning in this run
    save_autotune_cache: Path | None = None  # where to write the tactics this run tuned (besides <out>/autotune-cache.json)
    vllm_tune_tokens: int | None = None  # tune as vLLM does, at this max_num_batched_tokens (None: the grid's buckets)
    layout: str = "vllm"  # which layout's catalog the shapes come from (shapes.derive.LAYOUTS), for run.json
    target_replay_us: float = 500.0
    max_rotations: int = 512
    command: list[str] | None = None
    quiet: bool = False  # third-party output to <out>/log.txt, the terminal keeps the progress bar and the summary
    shard: dict[str, Any] | None = None  # {index, of, grid_shapes} of a --shard run, recorded in run.json
    next_shape: Callable[[], Shape | None] | None = None  # a worker of --devices: shapes from the shared queue
    host_lock: Any = None  # held around host timing when several workers share the host (--devices)
    host_timing: str | None = None  # how host timing ran beside other workers (--devices), said in run.json
    on_shape_done: Callable[[Shape, float], None] | None = None  # a worker reports each finished shape
    progress: bool = True

    def ms_of(self, shape: Shape) -> list[int]:
        """The M this run measures for a shape: its own (--cells), or the grid's."""
        return list(self.cells[shape.name]) if self.cells is not None else list(self.ms)

    def cell_count(self) -> int:
        """(shape, M) cells this run measures."""
        return sum(len(self.ms_of(s)) for s in self.shapes)

    def grid_text(self) -> str:
        """'16 shapes x 25 M x 6 paths', or for --cells '57 (shape, M) cells of --cells x 6 paths'."""
        grid = (f"{self.cell_count()} (shape, M) cells of --cells" if self.cells is not None else
                f"{len(self.shapes)} shapes x {len(self.ms)} M")
        return f"{grid} x {len(self.paths)} paths"


def previous_legs(run_json: Path) -> list[dict[str, Any]]:
    """The command, start, wall time and status of every earlier leg of a resumed sweep (newest last)."""
    import json
    try:
        old = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return [{"error": f"{run_json} was unreadable when the sweep resumed"}]
    legs = list(old.get("previous_legs", []))
    legs.append({k: old.get(k) for k in ("command", "started", "wall_s", "status")})
    return legs


def require_cuda() -> None:
    """Stops before anything is written when there is no usable CUDA GPU."""
    try:
        import torch
    except ImportError:
        raise HarnessError("torch is not installed; install a CUDA build of torch on a GPU machine (make bench does it)") from None
    if not torch.cuda.is_available():
        raise HarnessError("no CUDA GPU is visible (torch.cuda.is_available() is False); run the benchmark on a GPU machine")


def require_gpu(profile: GpuProfile, allow_mismatch: bool = False) -> int:
    """A CUDA GPU that is the profile's (or allowed not to be), checked before anything is written; returns its SM."""
    require_cuda()
    name, sm = this_gpu(0)
    check_device(profile, name, sm, allow_mismatch)
    return sm


def estimate(cfg: SweepConfig, shape: Shape, m: int) -> float:
    """The profile's roofline guess of one call (sizing only)."""
    return estimate_call_us(m, shape.n, shape.k, cfg.profile.sizing_tflops, cfg.profile.sizing_gbps)


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, file=terminal(), dynamic_ncols=True, mininterval=1.0)
    except ImportError:
        class Plain:
            def __init__(self):
                self.n = 0

            def update(self, k=1):
                self.n += k

            def set_postfix_str(self, s):
                print(f"[{self.n}/{total}] {s}", file=terminal(), flush=True)

            def close(self):
                pass
        return Plain()


def shape_stream(cfg: SweepConfig):
    """The shapes to measure: the config's list, or, for a --devices worker, whatever the shared queue hands out."""
    if cfg.next_shape is None:
        yield from cfg.shapes
        return
    while (shape := cfg.next_shape()) is not None:
        yield shape


class _Silent:
    """A progress bar that shows nothing (a --devices worker: the parent shows one bar for all)."""
    n = 0

    def update(self, k: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def tuning_info(vllm_tokens: int | None) -> dict[str, Any]:
    """run.json's account of how FlashInfer was tuned."""
    if vllm_tokens is None:
        return {"mode": "grid", "buckets": "the grid's M values that are hybrid buckets"}
    return {"mode": "vllm", "vllm": vllm.VLLM_VERSION, "max_num_batched_tokens": vllm_tokens,
            "buckets": vllm.autotune_buckets(vllm_tokens), "round_up": True}


def tune_shape(path: GemmPath, shape: Shape, ms: list[int], pdl: bool, vllm_tokens: int | None = None
               ) -> tuple[float | None, str | None]:
    """FlashInfer's own autotuner, before any timing, through the path's public call (a lean path reads the entries
    it leaves): over the bucket values of the grid, or, with `vllm_tokens`, as vLLM tunes (dispatch/vllm.py
    autotune_buckets: one call at M = vllm_tokens inside autotune(hybrid buckets up to it, round_up=True)).
    (seconds, error)."""
    import flashinfer
    import torch
    fn = path.tuning_call(pdl)
    if vllm_tokens is not None:
        buckets, rows, extra = tuple(vllm.autotune_buckets(vllm_tokens)), vllm_tokens, {"round_up": True}
    else:
        buckets, extra = tuple(sorted(set(ms) & set(hybrid_buckets()))), {}
        rows = max(buckets) if buckets else 0
    if not buckets:
        return 0.0, None
    x = torch.randn(rows, shape.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    try:
        with flashinfer.autotune(True, tuning_buckets=buckets, **extra):
            fn(x, w)
        torch.cuda.synchronize()
    except Exception as exc:
        return None, f"autotune failed: {type(exc).__name__}: {exc}"
    finally:
        del x, w
    return time.perf_counter() - t0, None


@dataclass
class Sweeping:
    """One sweep in progress, what every step of a cell reads: its settings, the timer and the phase clock, the
    built path calls, the SM and L2 size, the L2 flush (--l2 flush), and the rows so far (with their keys, `done`)."""
    cfg: SweepConfig
    clock: Any
    phase: "PhaseTimer"
    fns: dict[str, Any]
    sm: int
    l2_bytes: int
    flush: Any = None
    flush_names: frozenset[str] = frozenset()
    info: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    done: set[tuple] = field(default_factory=set)
    bar: Any = None
    last_write: float = 0.0
    csv: CsvLines = field(default_factory=CsvLines)  # results.csv's rows formatted so far (rows are final once added)
    weights: "WeightPool" = field(default_factory=lambda: WeightPool())
    inputs: InputPool = field(default_factory=InputPool)
    table: Any = None  # the table the dispatch path runs (None: the profile ships none)


@dataclass
class WeightPool:
    """The current shape's weight copies: made at its first M, which needs the most of them (the fewest bytes per
    copy), and served again at its later M, since a weight does not depend on M; dropped when the shape changes."""
    shape: tuple[int, int] | None = None
    ws: list[Any] = field(default_factory=list)

    def take(self, n: int, k: int, rotations: int) -> list[Any] | None:
        """The first `rotations` copies of the [n, k] weight, or None where the pool holds too few or another shape's
        (then it is emptied, so that its memory is free before new copies are made)."""
        if self.shape == (n, k) and len(self.ws) >= rotations:
            return self.ws[:rotations]
        self.clear()
        return None

    def clear(self) -> None:
        self.shape, self.ws = None, []

    def keep(self, n: int, k: int, ws: list[Any]) -> None:
        self.shape, self.ws = (n, k), list(ws)


@dataclass
class Group:
    """One cell under measurement: a (shape, M) and the paths timed there, interleaved; a row per path, how its
    graphs are sized, its operands (rotated copies) and what tuning its paths had."""
    shape: Shape
    m: int
    rows: dict[str, dict[str, Any]]
    rotations: int
    calls: int
    l2_multiple: float
    paths: list[GemmPath] = field(default_factory=list)
    ops: Any = None
    tune_info: dict[str, tuple[float | None, str | None]] = field(default_factory=dict)

    def fail(self, name: str, status: str, reason: str) -> None:
        self.rows[name].update(status=status, reason=reason)

    def error(self, name: str, exc: Exception) -> None:
        """A path's exception as its row: out of memory is 'skipped' (the GPU's size), anything else 'failed'."""
        import torch
        if isinstance(exc, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
            self.fail(name, "skipped", f"out of memory: {str(exc).splitlines()[0]}")
            return
        torch.cuda.synchronize()
        self.fail(name, "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def plan_group(run: Sweeping, shape: Shape, m: int, paths: list[GemmPath]) -> Group:
    """Rotated copies (cold L2 in --l2 rotate) and calls per graph, and the rows every path will fill."""
    cfg, l2_bytes, flush = run.cfg, run.l2_bytes, run.flush
    base = {**shape_fields(shape), "m": m, "timer": run.clock.name, "m_is_bucket": m in set(hybrid_buckets())}
    bytes_per_copy = 2 * (m * shape.k + shape.n * shape.k)
    rotations = rotations_of(cfg, l2_bytes, shape, m)
    calls = calls_per_graph(rotations, estimate(cfg, shape, m), cfg.target_replay_us)
    l2_multiple = flush.multiple if flush is not None else rotations * bytes_per_copy / l2_bytes
    buckets = set(hybrid_buckets())
    rows = {p.name: {**base, "path": p.name,
                     "m_is_bucket": p.backend.tuned_entry_reachable(m, buckets) if p.backend else m in buckets,
                     "pdl": p.backend.pdl(cfg.profile.pdl) if p.backend else
                     dispatcher_pdl(run.table, cfg.profile, run.sm, shape, m) if p.name == DISPATCH else None}
            for p in paths}
    return Group(shape, m, rows, rotations, calls, l2_multiple, paths)


def rotations_of(cfg: SweepConfig, l2_bytes: int, shape: Shape, m: int) -> int:
    """The rotated operand copies of a cell: enough to hold 5x L2 in --l2 rotate (rotation_count), else one; at most
    MAX_ROTATION_BYTES of them."""
    bytes_per_copy = 2 * (m * shape.k + shape.n * shape.k)
    rotations = 1 if cfg.l2 != "rotate" else rotation_count(bytes_per_copy, l2_bytes, cap=cfg.max_rotations)
    return max(1, min(rotations, MAX_ROTATION_BYTES // bytes_per_copy))


def inputs_most(cfg: SweepConfig, l2_bytes: int, shape: Shape) -> int:
    """The elements of the largest input copies any M of this run takes at a shape (InputPool's allocation)."""
    return max(rotations_of(cfg, l2_bytes, shape, m) * aligned(m * shape.k) for m in cfg.ms_of(shape))


def dispatcher_pdl(table: Any, profile: GpuProfile, sm: int, shape: Shape, m: int) -> bool:
    """Whether the dispatch row's captured calls launch a kernel with pdl: its table's graph choice is a FlashInfer
    backend that takes pdl under this profile, or the GEMV with a configuration that launches with PDL, and can run
    the cell. A pdl kernel overlaps the call before it, so the row is read by its span, as that path's own row is."""
    chosen = PATHS.get(table.choose(shape.n, shape.k, m, "graph")) if table is not None else None
    if chosen is None or chosen.skip_reason(sm, shape.n, shape.k, m) is not None:
        return False
    if chosen.name == GEMV:
        cfg = gemv.pinned(shape.n, shape.k, m)
        return cfg is not None and cfg.pdl
    return chosen.backend is not None and chosen.backend.pdl(profile.pdl)


def check_paths(run: Sweeping, group: Group) -> tuple[dict[str, Any], dict[str, Window]]:
    """Each path's output against the fp32 reference, and its repeatability and batch invariance; the paths that
    pass, ready to time, and each checked call's window (its eager kernels, read from CUPTI after the group's one
    drain)."""
    import torch
    clock, phase, fns, ops, paths, tune_info = run.clock, run.phase, run.fns, group.ops, group.paths, group.tune_info
    checked: dict[str, Any] = {}
    windows: dict[str, Window] = {}
    try:
        with phase("check"):
            ref = reference(ops.xs[0], ops.ws[0])
    except Exception as exc:  # out of memory for the fp32 reference: every path's row says so
        for p in paths:
            group.error(p.name, exc)
        return checked, windows
    for p in paths:
        row = group.rows[p.name]
        tune_s, tune_err = tune_info.get(p.name, (None, None))
        row.update(tune_s=tune_s, rotations=group.rotations, calls_per_graph=group.calls,
                   l2_multiple=group.l2_multiple)
        if tune_err:
            group.fail(p.name, "failed", tune_err)
            continue
        if getattr(fns[p.name], "tunes_here", None) is not None:  # the GEMV: tuned on the cell's rotated copies
            try:
                with phase("tune"):
                    row["tune_s"] = fns[p.name].tunes_here(ops.ws, ops.xs)
            except Exception as exc:
                group.error(p.name, exc)
                continue
        try:
            with flashinfer_choices() as choices, phase("check"), third_party_stdout():
                torch.cuda.synchronize()  # nothing else runs inside the call's window
                t0 = clock.now()
                out = fns[p.name](ops.xs[0], ops.ws[0])
                torch.cuda.synchronize()
                windows[p.name] = Window(p.name, 0, t0, clock.now())
                err = output_error(out, ops.xs[0], ops.ws[0], ref)
        except Exception as exc:
            group.error(p.name, exc)
            continue
        row["rel_err"] = err
        if choices:
            row["fi_runner"], row["fi_tactic"] = choices[-1][0], str(choices[-1][1])
        elif getattr(fns[p.name], "choice_key", None) is not None:
            row["fi_runner"], row["fi_tactic"] = "triton", fns[p.name].choice_key(ops.ws[0], ops.xs[0])
        if not err <= REL_ERR_BOUND:
            group.fail(p.name, "failed", f"output differs from the fp32 reference: rel_err {err:.3g} > {REL_ERR_BOUND}")
            continue
        launches_pdl = getattr(fns[p.name], "launches_pdl", None)
        if launches_pdl is not None:  # the GEMV: PDL where its configuration (or the path) launches so
            row["pdl"] = launches_pdl(group.shape.n, group.shape.k, group.m)
        try:
            with phase("check"), third_party_stdout():
                row["repeatable"], row["batch_invariant"] = determinism(fns[p.name], ops.xs[0], ops.ws[0], out)
        except Exception as exc:
            group.error(p.name, exc)
            continue
        checked[p.name] = fns[p.name]
    return checked, windows


def time_host(run: Sweeping, group: Group, checked: dict[str, Any]) -> None:
    """Eager host time of every checked path, all of them interleaved so their ratio sees the same host conditions."""
    cfg, phase = run.cfg, run.phase
    x0, w0 = group.ops.xs[0], group.ops.ws[0]
    calls, rounds, warmup = host_blocks(cfg, estimate(cfg, group.shape, group.m))
    with phase("host"), (cfg.host_lock if cfg.host_lock is not None else nullcontext()):
        host = host_times({n: (lambda f=f: f(x0, w0)) for n, f in checked.items()}, calls=calls, rounds=rounds,
                          block_us=cfg.host_block_us, warmup=warmup)
    for name, (med, p20, p80, busy) in host.items():
        group.rows[name].update(host_us=med, host_us_p20=p20, host_us_p80=p80, host_gpu_busy=busy)


def host_blocks(cfg: SweepConfig, gpu_us: float) -> tuple[int, int, int]:
    """(calls per block, rounds, warm-up calls) of the host timing of a cell whose calls take an estimated gpu_us on
    the GPU. Every host-timed call also runs on the GPU; where that GPU time dwarfs the host time (large M), fewer
    calls keep the sweep short without changing what decides a cell: its eager cost max(host, GPU) is its GPU time."""
    if gpu_us >= HIDDEN_HOST_US:
        return min(HIDDEN_HOST_BLOCKS[0], cfg.host_calls), min(HIDDEN_HOST_BLOCKS[1], cfg.host_rounds), 0
    if gpu_us >= cfg.gpu_bound_us:
        return min(GPU_BOUND_HOST_BLOCKS[0], cfg.host_calls), min(GPU_BOUND_HOST_BLOCKS[1], cfg.host_rounds), 3
    return cfg.host_calls, cfg.host_rounds, 3


def time_gpu(run: Sweeping, group: Group, checked: dict[str, Any], check_windows: dict[str, Window] | None = None
             ) -> None:
    """Each checked path's CUDA graph of `calls` calls, replayed interleaved; CUPTI kernel time into its row.

    A public FlashInfer call with a lean twin is not captured at first: where its checked call ran the very kernels
    of the lean twin's checked call, its GPU time is the twin's (gpu_from); otherwise it is captured and timed."""
    cfg, clock, phase, flush_names = run.cfg, run.clock, run.phase, run.flush_names
    twins = None if cfg.time_twins else kernel_twins(list(checked))
    deferred = {p: c[0] for p, c in (twins or {}).items()
                if p != DISPATCH and clock.name == "cupti" and check_windows and {p, c[0]} <= set(check_windows)}
    graphs = _captured(run, group, {n: f for n, f in checked.items() if n not in deferred})
    if not graphs:
        return
    records: list = []
    with phase("replay"):
        timings = replay_interleaved(clock, graphs, Replays(
            group.calls, cfg.samples, exclude=flush_names, stopping=cfg.stopping, keep=records,
            twins={p: c for p, c in (twins or {}).items() if p not in deferred}))
    late = {}
    digests = eager_digests(records, check_windows) if deferred else {}
    for p, rep in deferred.items():
        if rep in timings and not timings[rep].error and digests[p] and digests[p] == digests[rep]:
            timings[p] = timings[rep].read_off(rep)
        else:
            late[p] = checked[p]
    if late:  # a public call whose kernels differ from its twin's: captured and timed itself
        graphs = _captured(run, group, late)
        with phase("replay"):
            timings.update(replay_interleaved(clock, graphs, Replays(group.calls, cfg.samples, exclude=flush_names,
                                                                     stopping=cfg.stopping)))
    for name, t in timings.items():
        foreign = PATHS[name].foreign_kernels(t.kernels) if name in PATHS and not t.error else None
        if t.error or foreign:
            print(f"bench: KERNEL CHECK FAILED for {group.shape.name} M={group.m} {name}: {t.error or foreign}",
                  file=terminal())
            group.fail(name, "failed", t.error or foreign)
            continue
        gpu, g20, g80 = summary(t.gpu_us)
        if t.gpu_from:  # the twin's kernels, launched as the twin launches them
            group.rows[name]["pdl"] = group.rows[t.gpu_from].get("pdl")
        group.rows[name].update(status="ok", reason="", gpu_us=gpu, gpu_us_p20=g20, gpu_us_p80=g80,
                                span_us=summary(t.span_us)[0], event_us=summary(t.event_us)[0],
                                samples=len(t.gpu_us), kernels=t.kernels, kernels_per_call=t.kernels_per_call,
                                gpu_samples_us=[round(v, 4) for v in t.gpu_us],
                                span_samples_us=[round(v, 4) for v in t.span_us], gpu_from=t.gpu_from or "",
                                stop=t.stop, replay_pass=t.replay_pass)


def _captured(run: Sweeping, group: Group, fns: dict[str, Any]) -> dict[str, Any]:
    """Each path's graph of the group's calls; a path that fails to capture gets its row's error."""
    graphs = {}
    for name, fn in fns.items():
        try:
            with run.phase("capture"):
                graphs[name] = capture(fn, group.ops, group.calls, before=run.flush)
        except Exception as exc:
            group.error(name, exc)
    return graphs


def eager_digests(records: list, windows: dict[str, Window]) -> dict[str, str]:
    """Per path, the kernel digest of its checked (eager) call, from the records of the group's drain."""
    ordered = list(windows.values())
    timings = attribute(sorted(records, key=lambda r: r.start), ordered, graph=False)
    return {w.path: kernel_digest(t.names) for w, t in zip(ordered, timings)}


def measure_group(run: Sweeping, shape: Shape, m: int, paths: list[GemmPath],
                  tune_info: dict[str, tuple[float | None, str | None]]) -> list[dict[str, Any]]:
    """One (shape, M) group: operands, correctness, host time, capture and replay; a row per path."""
    import torch

    phase = run.phase
    group = plan_group(run, shape, m, paths)
    group.tune_info = tune_info
    try:
        with phase("operands"):
            group.ops = operands(run, shape, m, group.rotations)
    except torch.OutOfMemoryError as exc:
        run.weights.clear()
        run.inputs.clear()
        torch.cuda.empty_cache()
        for p in paths:
            group.fail(p.name, "skipped", f"out of memory allocating {group.rotations} operand copies: "
                                          f"{str(exc).splitlines()[0]}")
        return list(group.rows.values())
    checked, windows = check_paths(run, group)
    if checked:
        time_host(run, group, checked)
        time_gpu(run, group, checked, windows)
    with phase("free"):
        group.ops = None
        torch.cuda.empty_cache()
    return list(group.rows.values())


def operands(run: Sweeping, shape: Shape, m: int, rotations: int) -> Any:
    """The cell's rotated operand copies: views of the shape's input pool, and the weight copies of its weight pool
    where it holds enough (made here and pooled otherwise)."""
    import torch
    ws = run.weights.take(shape.n, shape.k, rotations)
    if ws is None:
        with run.phase(NEW_WEIGHTS):  # how much of `operands` a shape's first M takes (allocation included)
            run.inputs.clear()
            torch.cuda.empty_cache()  # the previous shape's copies, just released
            ws = make_weights(shape.n, shape.k, rotations, seed=shape.n * 31 + shape.k)
        run.weights.keep(shape.n, shape.k, ws)
    return Operands(run.inputs.take(shape.n, shape.k, m, rotations, inputs_most(run.cfg, run.l2_bytes, shape)), ws)


def _profile_table(profile: GpuProfile) -> Any:
    """The profile's shipped table (None where it ships none; a damaged one is its error, never 'no table')."""
    return shipped_table(profile.name)


def _load_pinned_tactics(cfg: SweepConfig) -> dict[str, Any] | None:
    if cfg.autotune_cache is None:
        return None
    if not cfg.tune:
        raise HarnessError("--no-tune and --autotune-cache contradict each other; pass one of them")
    try:
        return autotune_cache.load(cfg.autotune_cache)
    except ImportError as exc:
        raise HarnessError(f"--autotune-cache needs FlashInfer ({exc}); pip install -e '.[gpu]'") from None


def _keep_tactics(cfg: SweepConfig, pinned: dict[str, Any] | None) -> dict[str, Any] | str:
    """The tactics this run served, beside its results (and at cfg.save_autotune_cache after tuning)."""
    kept = cfg.out / autotune_cache.FILE_NAME
    try:
        if pinned:
            autotune_cache.copy(cfg.autotune_cache, kept)
            return {**pinned, "kept": str(kept)}
        if not cfg.tune:
            return "not tuned: FlashInfer ran its fallback tactics"
        autotune_cache.save(kept)
        if cfg.save_autotune_cache is not None:
            autotune_cache.copy(kept, cfg.save_autotune_cache)
        return {**autotune_cache.describe(kept, "tuned"), "kept": str(kept)}
    except Exception as exc:  # the measured rows are already written; losing the tactics must not lose them
        return f"not kept: {type(exc).__name__}: {exc}"


def _keep_gemv(out: Path) -> dict[str, Any] | str:
    try:
        return autotune_cache.keep_gemv(out)
    except Exception as exc:  # the measured rows are already written; losing the configurations must not lose them
        return f"GEMV configurations not kept: {type(exc).__name__}: {exc}"


def serve_gemv(tuning: bool, table: Any) -> None:
    """How this run's GEMV calls get their configurations: a run that tunes tunes them (the dispatch path runs them,
    as it runs this run's FlashInfer tactics); one that serves a tactics file serves the GEMV file beside it, else
    those of the table its dispatch path runs. Called after the tactics are loaded."""
    gemv.STORE.tuning = tuning
    path = table_gemv_file(table)
    if not tuning and not gemv.STORE.files and path is not None:
        gemv.load(path)


def table_gemv_file(table: Any) -> Path | None:
    """The GEMV configuration file `table` names, where it exists (None: a table without one, or no table)."""
    path = getattr(table, "gemv_configs", None)
    return Path(path) if path is not None and Path(path).is_file() else None


def gemv_tuning(cfg: SweepConfig, pinned: Any, table: Any) -> bool:
    """Whether this run tunes the GEMV afresh: where it tunes FlashInfer, unless cfg.tune_gemv is off and `table` has
    GEMV configurations to serve (bench run says so in its line on the tactics)."""
    if not cfg.tune or pinned:
        return False
    return cfg.tune_gemv or table_gemv_file(table) is None


def build_paths(paths: list[GemmPath], sm: int, pdl: bool) -> dict[str, Any]:
    """The callables of the paths this SM can run (the others' rows are recorded as skipped, with the reason)."""
    fns: dict[str, Any] = {}
    for p in paths:
        if p.sms is not None and sm not in p.sms:
            continue
        try:
            fns[p.name] = p.build(pdl)
        except ImportError as exc:
            raise HarnessError(f"path {p.name} needs a package that is missing ({exc}); "
                               f"pip install -e '.[gpu]' or leave the path out with --paths") from None
    return fns


def tune_group_paths(run: Sweeping, shape: Shape, todo: list[int]) -> dict[str, tuple[float | None, str | None]]:
    """FlashInfer's autotuner for each FlashInfer path of one shape, over the M values still to measure."""
    cfg, sm, fns, bar, phase = run.cfg, run.sm, run.fns, run.bar, run.phase
    tune_info: dict[str, tuple[float | None, str | None]] = {}
    by_backend: dict[str, tuple[float | None, str | None]] = {}  # a backend's public and lean paths share its tuning
    for p in cfg.paths:
        runnable = [m for m in todo if not p.skip_reason(sm, shape.n, shape.k, m)]
        if p.flashinfer_backend and (p.tune_by_default or cfg.tune_all) and runnable and p.name in fns:
            if p.flashinfer_backend not in by_backend:
                bar.set_postfix_str(f"{shape.name} autotune {p.flashinfer_backend}")
                with phase("tune"), third_party_stdout():
                    by_backend[p.flashinfer_backend] = tune_shape(p, shape, runnable, cfg.profile.pdl,
                                                                  cfg.vllm_tune_tokens)
            tune_info[p.name] = by_backend[p.flashinfer_backend]
    return tune_info


def run_sweep(cfg: SweepConfig) -> Path:
    sm = require_gpu(cfg.profile, cfg.allow_mismatch)  # before any file system change
    import torch

    props = torch.cuda.get_device_properties(0)
    if not cfg.resume and (cfg.out / "results.csv").exists():
        raise HarnessError(f"{cfg.out}/results.csv exists; pass --resume to continue it or choose another --out")
    if cfg.quiet:
        divert_noise(cfg.out / "log.txt")
    clock = make_clock(cfg.timer)  # before any FlashInfer JIT load or capture

    pinned = _load_pinned_tactics(cfg)  # before anything is written: a refused file stops the run here
    dispatch.tactics_from_table(False)  # the dispatch path runs this run's tactics, as every other path does
    dispatch.configure(cfg.table)
    table = cfg.table if cfg.table is not None else _profile_table(cfg.profile)
    serve_gemv(gemv_tuning(cfg, pinned, table), table)
    ahead = start_ahead(cfg)  # compiles in threads while the run starts and measures its ceilings
    info = _sweep_info(cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    rows, done = done_keys(cfg.out) if cfg.resume else ([], set())
    if cfg.resume and (cfg.out / "run.json").is_file():
        info["previous_legs"] = previous_legs(cfg.out / "run.json")
    if pinned:
        info["autotune_cache"] = pinned
    write_run_json(cfg.out, {**info, "status": "running"})
    run = Sweeping(cfg, clock, PhaseTimer(), {}, sm, props.L2_cache_size,
                   info=info, rows=rows, done=done, bar=_progress(cfg.cell_count(), "bench") if cfg.progress else
                   _Silent(), table=table)
    if cfg.l2 == "flush":
        run.flush = L2Flush(props.L2_cache_size)
        run.flush_names = run.flush.kernel_names(clock)
        info["l2_flush"] = {"bytes": run.flush.buf.numel() * 4, "kernels_excluded": sorted(run.flush_names),
                            "note": "span_us and event_us include the flush; gpu_us does not"}
    t_start = run.last_write = time.perf_counter()
    interrupted: KeyboardInterrupt | None = None
    try:
        if cfg.ceilings and clock.name == "cupti" and "ceilings" not in info:
            with run.phase("ceilings"):
                info["ceilings"] = {**measure_ceilings(clock, [s.n * s.k * 2 for s in cfg.shapes]),
                                    "nominal_gbps": cfg.profile.hbm_peak_gbps or None}
        with run.phase("compile wait"):  # what start_ahead has not finished
            run.fns.update(build_paths(cfg.paths, sm, cfg.profile.pdl))  # the dispatch path waits for its C++ layer
            info["compiled_ahead"] = ahead.wait()
        for shape in shape_stream(cfg):
            t_shape = time.perf_counter()
            todo = [m for m in cfg.ms_of(shape) if any((shape.n, shape.k, m, p.name) not in done for p in cfg.paths)]
            _sweep_shape(run, shape, todo, tune_group_paths(run, shape, todo) if cfg.tune and not pinned else {})
            if cfg.on_shape_done is not None:
                with run.phase("write"):
                    write_results(cfg.out, rows, run.csv)  # a finished shape is on disk before it is reported
                cfg.on_shape_done(shape, time.perf_counter() - t_shape)
    except KeyboardInterrupt as exc:
        interrupted = exc
    finally:
        run.bar.close()
        wall = time.perf_counter() - t_start
        with signals_deferred():
            _finish(run, pinned, wall, interrupted)
    if interrupted is not None:
        raise Interrupted(f"interrupted; {len(rows)} finished rows are in {cfg.out}/results.csv, continue with "
                          f"the same command and --resume", signal_of(interrupted))
    clock.close()
    if cfg.progress:  # a --devices worker stays quiet: the parent prints one summary
        print_summary(cfg, rows, wall)
    return cfg.out


def start_ahead(cfg: SweepConfig) -> Ahead:
    """The sweep's compiles ahead: the C++ layer where the dispatch path runs, the GEMV's kernels of its cells where
    the GEMV or the dispatcher runs served configurations (a tuning run compiles its candidates as it tunes)."""
    names = {p.name for p in cfg.paths}
    return Ahead.start(cfg.compile_ahead, native_layer=DISPATCH in names,
                       cells=[(s.n, s.k, m) for s in cfg.shapes for m in cfg.ms_of(s)]
                       if names & {GEMV, DISPATCH} and not gemv.STORE.tuning else [])


def _sweep_info(cfg: SweepConfig) -> dict[str, Any]:
    """run.json's settings of a sweep (its outcome is added as it ends)."""
    extra = {"shard": cfg.shard} if cfg.shard else {}
    if cfg.host_timing:
        extra["host_timing"] = cfg.host_timing
    return run_info(cfg.command, profile=cfg.profile.name, timer=cfg.timer, l2=cfg.l2, warm_l2=cfg.l2 == "warm", **extra,
                    samples=cfg.samples, ms=cfg.ms, **({"cells": cfg.cells} if cfg.cells is not None else {}),
                    replay_us=cfg.target_replay_us,
                    host_blocks={"calls": cfg.host_calls, "rounds": cfg.host_rounds,
                                 "gpu_bound": {"calls": GPU_BOUND_HOST_BLOCKS[0], "rounds": GPU_BOUND_HOST_BLOCKS[1],
                                               "from_gpu_us": cfg.gpu_bound_us},
                                 "gpu_hidden": {"calls": HIDDEN_HOST_BLOCKS[0], "rounds": HIDDEN_HOST_BLOCKS[1],
                                                "from_gpu_us": HIDDEN_HOST_US, "warmup": 0},
                                 "block_us": cfg.host_block_us or None, "min_calls": MIN_CALLS},
                    stopping=(cfg.stopping.describe() if cfg.stopping else {"criterion": "fixed",
                                                                            "samples": cfg.samples}),
                    gpu_twins="full" if cfg.time_twins else "read-off-twin",
                    shapes=[s.name for s in cfg.shapes],
                    paths=[p.name for p in cfg.paths], pdl=cfg.profile.pdl, tuning=tuning_info(cfg.vllm_tune_tokens),
                    layout=cfg.layout, table_file=cfg.table_file,
                    skip_unchoosable=bool(cfg.skip_unchoosable),
                    skip_hopeless=cfg.hopeless_factor or None,
                    clocks_start=nvml_clocks())


def _sweep_shape(run: Sweeping, shape, todo: list[int], tune_info: dict[str, tuple[float | None, str | None]]
                 ) -> None:
    """Measure one shape at its M of `todo` (rows appended to run.rows, written at most every cfg.write_every_s);
    `tune_info`: the shape's FlashInfer tuning."""
    cfg, bar = run.cfg, run.bar
    skips = Skips.of(cfg, run.sm, run.clock.name, run.done)
    hopeless: dict[str, str] = {}
    for m in cfg.ms_of(shape):
        bar.set_postfix_str(f"{shape.name} M={m}")
        if m not in todo:
            bar.update(1)
            continue
        live, skipped = split_runnable(cfg.paths, shape, m, skips, hopeless)
        run.rows.extend(skipped)
        measured = measure_group(run, shape, m, live, tune_info)
        annotate(measured, run.info.get("ceilings"))
        run.rows.extend(measured)
        for name, reason in hopeless_after(measured, m, cfg.hopeless_factor).items():
            hopeless.setdefault(name, reason)
        if time.perf_counter() - run.last_write >= cfg.write_every_s:
            with run.phase("write"):
                write_results(cfg.out, run.rows, run.csv)
            run.last_write = time.perf_counter()
        bar.update(1)


def _finish(run: Sweeping, pinned, wall: float, interrupted: BaseException | None) -> None:
    """The last writes of a sweep (results, parquet, tactics, run.json), also after an interrupt."""
    cfg, rows, info, phase, clock, fns = run.cfg, run.rows, run.info, run.phase, run.clock, run.fns
    write_results(cfg.out, rows, run.csv)
    phases = phase.rounded()
    phases["cupti_drain (inside replay)"] = round(clock.drain_s, 2)
    info.update(status="interrupted" if interrupted else "complete", wall_s=round(wall, 1), phase_s=phases,
                kernel_records=clock.records_seen, clocks_end=nvml_clocks(), cupti_invalid_records=clock.invalid)
    if any(p.flashinfer_backend and p.name in fns for p in cfg.paths):
        info["autotune_cache"] = _keep_tactics(cfg, pinned)
    if GEMV in fns or any(p.name == DISPATCH for p in cfg.paths):
        info["gemv_configs"] = _keep_gemv(cfg.out)
    parquet_note = write_parquet(cfg.out)
    if parquet_note:
        info["parquet"] = parquet_note
    write_run_json(cfg.out, info)


def print_summary(cfg: SweepConfig, rows: list[dict[str, Any]], wall_s: float) -> None:
    """What the sweep did, where it went and what to run next, on the terminal."""
    counts = {s: sum(1 for r in rows if r.get("status") == s) for s in ("ok", "skipped", "failed")}
    lines = [f"bench: {counts['ok']} cells ok, {counts['skipped']} skipped, {counts['failed']} failed in {wall_s:.0f} s"
             f" ({cfg.grid_text()})"]
    failed = sorted({str(r.get("reason", ""))[:100] for r in rows if r.get("status") == "failed"})
    lines += [f"  failed: {reason}" for reason in failed[:5]]
    lines.append(f"  results: {cfg.out}/results.csv and run.json" + (f"; third-party log: {log_path()}" if log_path() else ""))
    lines.append(f"  next: python -m calibrate validate {cfg.out}   |   python -m reports build {cfg.out} -o report.html")
    print("\n".join(lines), file=terminal(), flush=True)


def dry_run(cfg: SweepConfig) -> str:
    """What `bench run` would do on the profile's GPU, without touching one: paths, skips with reasons, tuning
    buckets, expected cells and an estimated time."""
    sm = cfg.profile.sm
    buckets = sorted(set(cfg.ms) & set(hybrid_buckets()))
    lines = [f"dry run: {cfg.profile.name} (SM{sm}), {cfg.grid_text()} = {cfg.cell_count() * len(cfg.paths)} rows; "
             f"L2 {cfg.l2}; {cfg.samples} replays of graphs of ~{cfg.target_replay_us:g} µs; host blocks of "
             f"{cfg.host_calls} calls x {cfg.host_rounds} rounds"]
    measured = tunings = 0
    skips = Skips.of(cfg, sm, cfg.timer)
    for p in cfg.paths:
        reasons: dict[str, int] = {}
        runs = 0
        for shape in cfg.shapes:
            ms = []
            for m in cfg.ms_of(shape):
                reason = skip_reason_at(p, shape, m, skips)
                if reason:
                    key = reason.split(", N =")[0].split(", K =")[0].split(", this GPU")[0]
                    reasons[key] = reasons.get(key, 0) + 1
                else:
                    ms.append(m)
            runs += len(ms)
            tuned = p.backend is not None and (p.tune_by_default or cfg.tune_all) and cfg.tune and ms
            first = p.backend is not None and next(q for q in cfg.paths if q.backend is p.backend) is p
            tunings += bool(tuned and first and cfg.autotune_cache is None)
        measured += runs
        own = [b for b in buckets if p.backend is None or p.backend.max_m is None or b <= p.backend.max_m]
        tune = (f"; tuned over buckets {own}" if p.backend and (p.tune_by_default or cfg.tune_all) and cfg.tune
                and cfg.autotune_cache is None else "")
        lines.append(f"  {p.name:22s} {p.role:10s} {runs:5d} cells measured{tune}")
        lines += [f"      skipped {n:4d}: {reason}" for reason, n in sorted(reasons.items())]
    est = measured * SECONDS_PER_CELL + tunings * SECONDS_PER_TUNING
    if cfg.autotune_cache is not None:
        lines.append(f"  tactics served from {cfg.autotune_cache} (no tuning; --tune tunes afresh)")
    if any(p.name in (GEMV, DISPATCH) for p in cfg.paths):
        table = cfg.table if cfg.table is not None else _profile_table(cfg.profile)
        served = table_gemv_file(table)
        if gemv_tuning(cfg, cfg.autotune_cache, table):
            lines.append("  GEMV configurations tuned per cell")
        elif served is not None:
            lines.append(f"  GEMV configurations served from {served} (a cell it lacks tuned for the GEMV's own row)")
        else:
            lines.append("  GEMV configurations: none to serve; tuned per cell for the GEMV's own row")
    lines.append(f"  {measured} cells to measure, {tunings} (shape, path) tunings; estimated {est / 60:.1f} min "
                 f"(at the committed H200 sweep's rate; another GPU differs)")
    return "\n".join(lines)
