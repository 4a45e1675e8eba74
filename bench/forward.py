"""(GPU) Measured forwards: every BF16 linear of one model forward, in layer order with one weight per instance, timed
as a whole, captured in one CUDA graph (CUPTI busy time and span, CUDA events beside them) and eagerly (wall time
with real host/GPU overlap, host submission time, CUPTI busy time), paths interleaved.

This is the ground truth for per-forward claims: a sum over isolated cells misses the inter-kernel gaps, the clocks
and the L2 state of a real sequence, and in the eager regime the overlap of host and GPU across layers."""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import dispatch
from bench.ceiling import annotate_forward
from bench.ceiling import measure as measure_ceilings
from bench.clocks import make_clock
from bench.envinfo import ClockReader, nvml_clocks, run_info
from bench.forward_paths import (BOUND_LAYER_RULES, DISPATCH_PYTHON, DISPATCHER_RULES, LM_HEAD_RULE, RULES,
                                 FUSED_RULES, TABLE_DIRECT_RULES, Target, path_for)
from bench.gpu import (REL_ERR_BOUND, Replays, capture_graph, check_output, records_since_last_window,
                       replay_interleaved, replay_seconds)
from bench.ahead import Ahead
from bench.paths import ATEN, DISPATCH, GEMV_LAUNCHES, PATHS
from bench.results import finished_rows, rows_to_csv, write_run_json
from bench.stats import PhaseTimer, Window, attribute, kernel_digest, summary
from bench.sustain import SUSTAIN_COLUMNS, SUSTAIN_FILE, summary_line, sustained
from bench.sweep import (_keep_gemv, _keep_tactics, _load_pinned_tactics, _progress, require_gpu, serve_gemv,
                         tune_shape, tuning_info)
from dispatch.profiles import GpuProfile
from dispatch.table import shipped_table
from harness.console import divert_noise, terminal
from harness.errors import HarnessError, Interrupted, signal_of, signals_deferred
from harness.io import atomic_write_text
from shapes.catalog import model_configs
from shapes.derive import ForwardLinear, forward_sequence, load_config
from shapes.siblings import FusedLinear, fuse_siblings

FORWARD_MS = (1, 8, 32, 128, 512, 1031, 4096, 16384)
FORWARD_FILE = "forward.csv"
FORWARD_COLUMNS = ("model", "tp", "m", "path", "regime", "status", "reason", "us", "us_p20", "us_p80", "submit_us",
                   "gpu_busy_us", "span_us", "event_us", "linears", "kernels", "kernel_digest", "decoder_layers",
                   "lm_head", "samples", "paths_used", "samples_us", "sm_mhz", "sm_mhz_samples", "power_w_samples",
                   "clock_reasons_samples", "submit_samples_us", "bytes", "floor_us", "ceiling_sum_us", "over_floor",
                   "over_ceiling_sum")
# Each timed forward follows untimed runs of itself lasting at least this long (ms): a sustained forward runs slower
# than its first replays after idle once the GPU's power cap engages, and settles within this much of its own load
# (docs/design.md, The settle; measured with bench forward --sustain-ms).
DEFAULT_SETTLE_MS = 200.0
# --settle-at: "capped" settles only the forwards of an M whose heaviest forward, run for settle_ms, then reads a
# power or thermal cap (or a clock below the maximum) in NVML; "every" settles every timed forward.
SETTLE_AT = ("capped", "every")
# An eager forward of an uncapped M still follows this much of itself (at least one run): host-bound, its time depends
# on how warm the host's caches are for its own calls, which a different forward before it leaves cold.
LIGHT_SETTLE_MS = 20.0
# NVML clock-event reasons that lower the SM clock under load: SW power cap, HW slowdown, SW and HW thermal, power brake
CAP_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
REGIMES = ("graph", "eager")
# run.json's account of the graph replays' order (runs before it replayed in A B B A order)
GRAPH_ORDER = "shuffled per round like the eager rounds, seed eager_order_seed + M"
# run.json's account of CUPTI in the eager regime (runs before it timed eager forwards with CUPTI recording)
EAGER_PROFILER = "off in timed forwards; gpu_busy_us and kernels from one profiled forward per (M, path) after them"


@dataclass
class ForwardConfig:
    profile: GpuProfile
    models: dict[str, dict[str, Any]]  # name -> HF config
    ms: list[int]
    rules: list[str]
    out: Path
    tp: int = 1
    samples: int = 10
    warmup: int = 2
    decoder_layers: int | None = None  # only the first N decoder layers (memory); said in every row
    lm_head: bool = True
    tune: bool = True
    autotune_cache: Path | None = None  # tactics to serve; None: tune
    save_autotune_cache: Path | None = None  # where to write the tuned tactics (besides <out>/autotune-cache.json)
    vllm_tune_tokens: int | None = None  # tune as vLLM does, at this max_num_batched_tokens (None: the run's M values)
    layout: str = "vllm"  # the model's linears as vLLM fuses them, or as transformers builds them
    resume: bool = False
    command: list[str] | None = None
    quiet: bool = False
    compile_ahead: bool = True  # the C++ layer and the GEMV's kernels compiled in threads at the start
    table: Any = None  # the dispatcher's threshold table (for the model of the dispatch path); loaded when None
    order_seed: int | None = None  # the eager rounds' shuffle; None: a fresh one per run (run.json records it)
    # Each timed forward (graph and eager) follows untimed runs of itself lasting >= settle_ms (at least one; 0: none).
    # What ran before moves a forward's time at the power cap: unsettled, a forward timed right after a slow,
    # low-power one runs faster than after a heavy one, so a path's ratio would depend on its place in the order.
    # Settled, every path is timed at the clock its own sustained load holds (docs/design.md, The settle).
    settle_ms: float = DEFAULT_SETTLE_MS
    settle_at: str = "capped"  # SETTLE_AT
    sustain_ms: float = 0.0  # > 0: instead of timing rows, each graph replayed this long after idle_ms (bench/sustain.py)
    idle_ms: float = 1000.0
    skip_slower: float | None = None  # skip (both regimes) a rule whose graph replay takes > this x all-aten's
    table_file: str | None = None  # --table; None: the profile's committed table
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # --settle-at capped: per model and M, the probe

    @property
    def fuses(self) -> bool:
        """Whether a rule of this run fuses sibling linears (FUSED_RULES)."""
        return bool(set(FUSED_RULES) & set(self.rules))


def models_for(names: list[str] | None, config_path: str | None) -> dict[str, dict[str, Any]]:
    if config_path:
        cfg = load_config(config_path)
        return {str(cfg.get("_model") or Path(config_path).stem): cfg}
    known = model_configs()
    wanted = names or list(known)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise HarnessError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)} (or pass --config PATH)")
    return {n: load_config(known[n]) for n in wanted}


def sequences(cfg: ForwardConfig) -> dict[str, list[ForwardLinear]]:
    out = {}
    for name, hf in cfg.models.items():
        seq = forward_sequence(hf, name, cfg.tp, cfg.decoder_layers, cfg.layout)
        out[name] = seq if cfg.lm_head else [lin for lin in seq if lin.layer != "lm_head"]
    return out


@dataclass
class Bound:
    """One forward under one rule: the callables in order, and which registry path each linear runs."""
    # (fn, its arguments, the weight): a bound layer takes (x,), as a model calls it, so that no adapter of the
    # harness's own sits in the dispatcher's per-call time; every other path takes (x, w)
    calls: list[tuple[Callable, tuple, Any]] = field(default_factory=list)
    used: dict[str, int] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)  # per linear, in order

    def __call__(self) -> None:
        for fn, args, _ in self.calls:
            fn(*args)

    def describe(self) -> str:
        return ";".join(f"{p}:{c}" for p, c in sorted(self.used.items()))


@dataclass
class Forwarding:
    """One forward run in progress, what every step reads: its settings, the timer, the clock reader, the phase
    clock, the progress bar, this GPU's SM, the built path calls, and run.json's record (its ceilings)."""
    cfg: ForwardConfig
    clock: Any
    reader: ClockReader | None
    phase: PhaseTimer
    bar: Any
    sm: int
    fns: dict[str, Callable]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ForwardAt:
    """One model's forward at one M: its linears, their weights and the activations (one per K)."""
    model: str
    seq: list[ForwardLinear]
    weights: list[Any]
    m: int
    xs: dict[int, Any]
    fused: tuple[list[ForwardLinear], list[Any]] | None = None  # the fused-siblings forward and its weights


def fused_forward(seq: list[ForwardLinear], weights: list[Any]) -> tuple[list[ForwardLinear], list[Any]]:
    """The forward with its sibling linears fused (shapes/siblings.py) and their weights concatenated (new memory:
    one copy of every fused group's weights)."""
    import torch
    fused = fuse_siblings(seq)
    index = {id(lin): i for i, lin in enumerate(seq)}
    return fused, [torch.cat([weights[j] for j in lin.members]) if isinstance(lin, FusedLinear)
                   else weights[index[id(lin)]] for lin in fused]


@dataclass(frozen=True)
class EagerRounds:
    """How eager forwards are timed (eager_forwards): `samples` rounds in a shuffled order seeded by `seed`, each
    forward after `settle_s` of itself (in full only for `capped` where given), the clocks read by `reader`."""
    samples: int
    seed: int = 0
    settle_s: float = 0.0
    reader: ClockReader | None = None
    capped: set | None = None


def _weights(seq: list[ForwardLinear], seed: int):
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(lin.n, lin.k, device="cuda", generator=gen) * lin.k ** -0.5).to(torch.bfloat16) for lin in seq]


def _bind(run: Forwarding, at: ForwardAt, rule: str, regime: str = "graph") -> Bound:
    bound = Bound()
    target = Target(run.sm, run.cfg.profile, run.cfg.table)
    seq, weights = at.fused if rule in FUSED_RULES and at.fused is not None else (at.seq, at.weights)
    for lin, w in zip(seq, weights):
        path = path_for(rule, lin, at.m, target, regime)
        fn, args = run.fns[path], (at.xs[lin.k], w)
        if rule in BOUND_LAYER_RULES and lin.layer != "lm_head":
            # the real dispatcher, bound per layer as a model does at load; `path` is its table's choice
            fn, args = dispatch.bind(w, native=False if rule == DISPATCH_PYTHON else None), (at.xs[lin.k],)
            eager = path_for(rule, lin, at.m, target, "eager")
            path = path if eager == path else f"graph {path} / eager {eager}"
        bound.calls.append((fn, args, w))
        bound.used[path] = bound.used.get(path, 0) + 1
        bound.paths.append(path)
    return bound


def _layer_of_dispatch() -> str:
    """Which bound layer the `dispatch` rule runs here: 'C++ (<library>)' or 'Python' (dispatch/native.py)."""
    from dispatch import native  # torch: the analyses that read forwards import this module without it
    return f"C++ ({native.library()})" if native.module(build_if_missing=True) is not None else "Python"


def _check(bound: Bound, rule: str) -> None:
    """Every distinct (callable, shape) of the forward against an fp32 reference, before any timing."""
    seen = set()
    for fn, args, w in bound.calls:
        one = len(args) == 1  # a bound layer: one per linear, checked once per shape
        key = (DISPATCH if one else id(fn), tuple(w.shape))
        if key in seen:
            continue
        seen.add(key)
        err = check_output((lambda x, _w: fn(x)) if one else fn, args[0], w)
        if not err <= REL_ERR_BOUND:
            raise HarnessError(f"{rule}: output of a {tuple(w.shape)} linear differs from the fp32 reference "
                               f"(rel_err {err:.3g})")


def round_orders(keys: list[Any], rounds: int, seed: int = 0) -> list[list[Any]]:
    """One order per round: keys grouped by their first element (M), the groups and the keys inside each group in a
    fresh random order every round. A forward's time depends on what ran just before it (after a 200 ms M=16384
    forward the H200 runs the next one up to 25% slower at its power cap): a fixed or mirrored order gives some keys
    a heavy predecessor in every other round, a shuffled one spreads it over all of them."""
    import random
    rng = random.Random(seed)
    groups: dict[Any, list[Any]] = {}
    for key in keys:
        groups.setdefault(key[0] if isinstance(key, tuple) else None, []).append(key)
    orders = []
    for _ in range(rounds):
        blocks = list(groups.values())
        rng.shuffle(blocks)
        orders.append([k for block in blocks for k in rng.sample(block, len(block))])
    return orders


def eager_forwards(clock, forwards: dict[Any, Bound], plan: EagerRounds) -> dict[Any, dict[str, list]]:
    """`plan.samples` eager forwards of each, in a shuffled order per round (round_orders), gc off, each from an idle GPU
    to one synchronize at its end: wall µs, host submission µs (until the last call returned) and the clocks read
    after it; then one more of each, profiled: CUPTI's busy µs and kernel count.

    The timed forwards run with CUPTI's activity off (clock.paused): with it on, every launch paid the profiler,
    and the records of the settle runs filled CUPTI's buffers, whose parsing on CUPTI's thread (Python, holding the
    GIL) then fell on some timed forwards and not others, which split one forward's eager samples into two groups
    (docs/design.md, Findings the code relies on).

    settle_s: each timed forward follows untimed runs of the same forward lasting at least this long (at least one
    when > 0). What ran before a forward moves its time (the slow samples follow heavier forwards), and one fixed
    shuffle would give each path the same predecessors in every run (docs/design.md, The settle).
    capped: where given, only these forwards settle in full (those of an M that runs power-capped), and they run first
    in each round; the first other forward after them settles in full too, so that it starts at the clock its own
    load holds; every other forward follows LIGHT_SETTLE_MS of itself."""
    import torch
    samples, seed, settle_s, reader, capped = plan.samples, plan.seed, plan.settle_s, plan.reader, plan.capped
    names = list(forwards)
    out: dict[Any, dict[str, list]] = {p: {"wall": [], "submit": [], "busy": [], "kernels": [], "digest": [],
                                           "clocks": []} for p in names}

    def settle(p: Any, seconds: float = settle_s) -> None:
        t_settle = time.perf_counter()
        while seconds > 0:
            forwards[p]()
            torch.cuda.synchronize()
            if time.perf_counter() - t_settle >= seconds:
                break
        torch.cuda.synchronize()

    for p in names:  # untimed: the first forward after the graphs were freed pays the allocator's cudaMalloc calls
        forwards[p]()
    torch.cuda.synchronize()
    clock.drain()
    gc_on = gc.isenabled()
    gc.disable()
    windows: list[Window] = []
    records = []
    try:
        with clock.paused():
            for s, order in enumerate(round_orders(names, samples, seed)):
                if capped is not None:
                    order = [p for p in order if p in capped] + [p for p in order if p not in capped]
                previous = None
                for p in order:
                    if capped is None or p in capped or previous in capped:
                        settle(p)
                    else:  # no cap to settle at, but the host's caches warm up for this forward's own calls
                        settle(p, min(settle_s, LIGHT_SETTLE_MS / 1e3))
                    previous = p
                    t0 = time.perf_counter_ns()
                    forwards[p]()
                    t1 = time.perf_counter_ns()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter_ns()
                    out[p]["wall"].append((t2 - t0) / 1e3)
                    out[p]["submit"].append((t1 - t0) / 1e3)
                    if reader is not None:
                        out[p]["clocks"].append(reader.read())
        for p in names:  # profiled: what kept the GPU busy, and the kernels (each forward's count is checked)
            records += records_since_last_window(clock, windows)
            settle(p)
            c0 = clock.now()
            forwards[p]()
            torch.cuda.synchronize()
            windows.append(Window(p, samples, c0, clock.now()))
    finally:
        if gc_on:
            gc.enable()
    records += clock.drain()
    if clock.name == "cupti":
        for w, t in zip(windows, attribute(records, windows, graph=False)):
            out[w.path]["busy"].append(t.busy_ns / 1e3)
            out[w.path]["kernels"].append(t.count)
            out[w.path]["digest"].append(kernel_digest(t.names))
    return out


def clock_columns(clocks: list[tuple[int, float, int] | None]) -> dict[str, Any]:
    """A row's NVML readings after each of its samples (ClockReader): median SM clock and the per-sample lists."""
    read = [c for c in clocks if c is not None]
    if not read:
        return {}
    return {"sm_mhz": summary([float(c[0]) for c in read])[0], "sm_mhz_samples": [c[0] for c in read],
            "power_w_samples": [round(c[1]) for c in read], "clock_reasons_samples": [c[2] for c in read]}


def _row(cfg: ForwardConfig, at: tuple[str, int, int], rule: str, regime: str, **kw) -> dict[str, Any]:
    """A forward row at `at` = (model, M, its linears)."""
    model, m, n_linears = at
    return {"model": model, "tp": cfg.tp, "m": m, "path": rule, "regime": regime, "linears": n_linears,
            "decoder_layers": cfg.decoder_layers if cfg.decoder_layers is not None else "all",
            "lm_head": cfg.lm_head, **kw}


def too_slow(seconds: dict[str, float], factor: float) -> dict[str, float]:
    """The rules whose forward took more than `factor` x all-aten's (by one replay of each), with that ratio: never
    the best path, and their forwards take long (TinyGEMM everywhere: 17-21x all-aten at M = 1031 on the H200)."""
    ref = seconds[ATEN]
    kept = (ATEN, *DISPATCHER_RULES)  # the dispatcher and its twins are what a run is for
    return {r: t / ref for r, t in seconds.items() if r not in kept and t > factor * ref}


def twin_of(rule: str, bound: Bound, earlier: dict[str, Bound]) -> str | None:
    """The earlier rule whose forward runs the same path on every linear (the same callables in the same order),
    whose measurement this rule's is; None for the dispatcher's rules, which add a layer or per-regime binding of
    their own."""
    if rule in DISPATCHER_RULES:
        return None
    return next((r for r, b in earlier.items() if r not in DISPATCHER_RULES and b.paths == bound.paths), None)


def twin_rows(rows: list[dict[str, Any]], twins: dict[tuple[str, int, str], str]) -> list[dict[str, Any]]:
    """For each (model, M, rule) that runs the same paths as an earlier rule: that rule's rows under its name."""
    out = []
    for (model, m, rule), first in twins.items():
        for r in rows:
            if r["model"] == model and int(r["m"]) == m and r["path"] == first:
                out.append({**r, "path": rule, "reason": f"same paths as {first} on every linear: its measurement"})
    return out


def graph_m(run: Forwarding, at: ForwardAt) -> tuple[list[dict[str, Any]], dict[str, Bound], dict[str, str]]:
    """Binds, checks and warms every rule's forward at one M, and times it captured; returns the graph rows (and
    failures), the bound forwards for the eager phase and the rules measured as an earlier rule's twin."""
    import torch
    cfg, clock, phase, reader, model, m = run.cfg, run.clock, run.phase, run.reader, at.model, at.m
    where = (model, m, len(at.seq))
    rows: list[dict[str, Any]] = []
    bound: dict[str, Bound] = {}
    eager_bound: dict[str, Bound] = {}
    twins: dict[str, str] = {}
    for rule in cfg.rules:
        b = _bind(run, at, rule)
        first = twin_of(rule, b, bound)
        if first is not None:
            twins[rule] = first
            continue
        # a rule that picks per regime at bind time gets a second forward for the eager phase
        e = _bind(run, at, rule, "eager") if rule in TABLE_DIRECT_RULES else b
        try:
            with phase("check"):
                for f in ((b,) if e is b else (b, e)):
                    _check(f, rule)
                    for _ in range(cfg.warmup):
                        f()
                torch.cuda.synchronize()
            bound[rule], eager_bound[rule] = b, e
        except Exception as exc:  # a failing path is recorded, the others go on
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            rows += [_row(cfg, where, rule, r, status="failed", reason=reason) for r in REGIMES]
    graphs = {}
    for rule, b in bound.items():
        try:
            with phase("capture"):
                graphs[rule] = capture_graph(b, b)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            rows.append(_row(cfg, where, rule, "graph", status="skipped",
                             reason=f"out of memory capturing the forward: {str(exc).splitlines()[0]}"))
    if cfg.skip_slower and ATEN in graphs:
        with phase("graph replay"):
            slow = too_slow({rule: replay_seconds(g) for rule, g in graphs.items()}, cfg.skip_slower)
        for rule, ratio in slow.items():
            del graphs[rule], eager_bound[rule]
            rows += [_row(cfg, where, rule, r, status="skipped",
                          reason=f"{ratio:.1f}x aten's graph replay time (--skip-slower {cfg.skip_slower:g})")
                     for r in REGIMES]
    if graphs and cfg.sustain_ms:
        with phase("sustain"):
            traces = sustained(graphs, cfg.idle_ms / 1e3, cfg.sustain_ms / 1e3, reader or ClockReader())
        print(f"{model} M={m}:", file=terminal())
        for rule, records in traces.items():
            print(summary_line(rule, records), file=terminal(), flush=True)
            rows += [{"model": model, "m": m, "path": rule, "status": "ok", **r} for r in records]
        return [{c: r.get(c) for c in SUSTAIN_COLUMNS} for r in rows], {}, twins
    capped = True
    if graphs and cfg.settle_at == "capped" and cfg.settle_ms > 0:
        with phase("graph replay"):
            capped, probe = power_capped(graphs, cfg.settle_ms / 1e3, reader)
        cfg.probes.setdefault(model, {})[str(m)] = probe
    if graphs:
        with phase("graph replay"):
            # shuffled like the eager rounds: in a fixed A B B A order the dispatcher always sat next to the same
            # forwards, which moved it against table-direct at the power cap (docs/design.md, The settle)
            timings = replay_interleaved(clock, graphs, Replays(
                1, cfg.samples, settle_s=cfg.settle_ms / 1e3 if capped else 0.0, reader=reader,
                orders=round_orders(list(graphs), cfg.samples, (cfg.order_seed or 0) + m)))
        for rule, t in timings.items():
            if t.error:
                rows.append(_row(cfg, where, rule, "graph", status="failed", reason=t.error))
                continue
            us, p20, p80 = summary(t.span_us)
            rows.append(_row(cfg, where, rule, "graph", status="ok", reason="", us=us, us_p20=p20,
                             us_p80=p80, gpu_busy_us=summary(t.gpu_us)[0], span_us=us,
                             event_us=summary(t.event_us)[0], kernels=t.kernels_per_call, kernel_digest=t.digest,
                             samples=len(t.span_us),
                             paths_used=bound[rule].describe(), samples_us=[round(v, 2) for v in t.span_us],
                             **clock_columns(t.clocks)))
    del graphs
    torch.cuda.empty_cache()
    return rows, eager_bound, twins


def power_capped(graphs: dict[str, Any], seconds: float, reader: ClockReader | None) -> tuple[bool, dict[str, Any]]:
    """Replays the heaviest of the graphs (longest replay) for `seconds`, then reads NVML: (whether its sustained load
    runs capped, what was read). Without NVML every forward counts as capped (the settle is the safe side)."""
    import torch
    heaviest = max(graphs, key=lambda rule: replay_seconds(graphs[rule]))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        graphs[heaviest].replay()
        torch.cuda.synchronize()
    read, top = (reader.read(), reader.max_mhz()) if reader is not None else (None, None)
    if read is None or top is None:
        return True, {"path": heaviest, "capped": True, "why": "no NVML reading: every forward settles"}
    mhz, watts, reasons = read
    capped = mhz < top or bool(reasons & CAP_REASONS)
    return capped, {"path": heaviest, "capped": capped, "sm_mhz": mhz, "max_mhz": top, "power_w": round(watts),
                    "reasons": reasons}


def eager_rows(run: Forwarding, model: str, n_linears: int, bound: dict[tuple[int, str], Bound],
               capped: set | None = None) -> list[dict[str, Any]]:
    """Every (M, rule) forward of a model timed eagerly, all of them interleaved round by round, so that the slow
    drift of host speed (on the H200 host whole minutes ran 1.3-1.7x slower) spreads over every M and path alike
    instead of landing on the M that happened to run then."""
    cfg, clock = run.cfg, run.clock
    with run.phase("eager"):
        eager = eager_forwards(clock, bound, EagerRounds(cfg.samples, cfg.order_seed or 0, cfg.settle_ms / 1e3,
                                                         run.reader, capped))
    rows = []
    for (m, rule), e in eager.items():
        us, p20, p80 = summary(e["wall"])
        rows.append(_row(cfg, (model, m, n_linears), rule, "eager", status="ok", reason="", us=us, us_p20=p20,
                         us_p80=p80, submit_us=summary(e["submit"])[0],
                         gpu_busy_us=summary(e["busy"])[0] if e["busy"] else None,
                         kernels=int(summary(e["kernels"])[0]) if e["kernels"] else None,
                         kernel_digest=e["digest"][0] if e["digest"] else None,
                         samples=len(e["wall"]), paths_used=bound[(m, rule)].describe(),
                         samples_us=[round(v, 1) for v in e["wall"]], **clock_columns(e["clocks"]),
                         submit_samples_us=[round(v, 1) for v in e["submit"]]))
    return rows


def _tune(cfg: ForwardConfig, seqs, sm: int, fns, bar, phase: PhaseTimer) -> dict[str, Any]:
    """FlashInfer's autotuner for every (FlashInfer backend, shape) some rule runs, over the M it runs it at (once
    per backend: a lean call reads the entries its public call tuned)."""
    wanted: dict[tuple[str, int, int], set[int]] = {}
    for model, seq in seqs.items():
        for lin in seq:
            for m in cfg.ms:
                for rule in cfg.rules:
                    for regime in REGIMES:
                        backend = PATHS[path_for(rule, lin, m, Target(sm, cfg.profile, cfg.table), regime)].backend
                        if backend is not None and backend.tune_by_default:  # public and lean calls share it
                            wanted.setdefault((backend.path, lin.n, lin.k), set()).add(m)
    tuned = {}
    for (path, n, k), ms in sorted(wanted.items()):
        bar.set_postfix_str(f"autotune {path} {n}x{k}")
        with phase("tune"):
            tuned[f"{path} {n}x{k}"] = tune_shape(PATHS[path], ForwardLinear(0, "", n, k), sorted(ms),
                                                  cfg.profile.pdl, cfg.vllm_tune_tokens)
    failed = {key: err for key, (_, err) in tuned.items() if err}
    if failed:
        raise HarnessError(f"FlashInfer's autotuner failed for {', '.join(failed)}: {next(iter(failed.values()))}")
    return {key: round(s or 0.0, 2) for key, (s, _) in tuned.items()}


def run_forward(cfg: ForwardConfig) -> Path:
    sm = require_gpu(cfg.profile)  # before any file system change
    out_csv, columns = ((cfg.out / SUSTAIN_FILE, SUSTAIN_COLUMNS) if cfg.sustain_ms else
                        (cfg.out / FORWARD_FILE, FORWARD_COLUMNS))
    if out_csv.exists() and not cfg.resume:
        raise HarnessError(f"{out_csv} exists; pass --resume to continue it or choose another --out")
    dispatches = any(r in cfg.rules for r in BOUND_LAYER_RULES)
    if cfg.fuses and cfg.layout != "vllm":
        raise HarnessError(f"the {' and '.join(FUSED_RULES)} rules fuse vLLM's layers (shapes/siblings.py); run them "
                           f"with --layout vllm, or leave them out of --paths")
    if cfg.table is None and (dispatches or any(r in cfg.rules for r in TABLE_DIRECT_RULES)):
        cfg.table = shipped_table(cfg.profile.name)
        if cfg.table is None:
            raise HarnessError(f"the dispatch and table-direct rules run a table, and the {cfg.profile.name} profile "
                               f"ships none yet: pass one with --table FILE, or leave those rules out (--paths)")
    seqs = sequences(cfg)
    if cfg.quiet:
        divert_noise(cfg.out / "log.txt")
    clock = make_clock("cupti")
    reader = ClockReader()
    if cfg.order_seed is None:  # a fresh shuffle per run: replicate runs must not share one order's bias
        import random
        cfg.order_seed = random.SystemRandom().randrange(1, 2 ** 31)
    pinned = _load_pinned_tactics(cfg)
    dispatch.tactics_from_table(False)  # the dispatch rule runs this run's tactics, as every other rule does
    serve_gemv(False, cfg.table)  # the forward never tunes the GEMV: it serves the tactics' file, else the table's
    used = used_paths(cfg, seqs, sm)
    ahead = start_ahead(cfg, seqs, used)  # compiles in threads while the run starts and measures its ceilings
    info = _run_info(cfg, seqs)
    cfg.out.mkdir(parents=True, exist_ok=True)
    rows = finished_rows(out_csv, ("model", "m", "path", "regime"), "forward table") if cfg.resume else []
    try:
        done = {(r["model"], int(r["m"]), r["path"]) for r in rows}
    except (TypeError, ValueError):
        raise HarnessError(f"{out_csv} has a row whose m is not an integer; restore it or choose another --out") from None
    write_run_json(cfg.out, {**info, "status": "running"})
    fns = _path_fns(cfg, used)
    if dispatches:
        dispatch.configure(cfg.table)
    phase = PhaseTimer()
    bar = _progress(sum(len(cfg.ms) for _ in seqs), "forward")
    t0 = time.perf_counter()
    interrupted: KeyboardInterrupt | None = None
    try:
        if cfg.tune and not pinned:
            info["tune_s"] = _tune(cfg, seqs, sm, fns, bar, phase)
        if "ceilings" not in info:
            with phase("ceilings"):
                info["ceilings"] = {**measure_ceilings(clock, [lin.n * lin.k * 2 for s in seqs.values() for lin in s]),
                                    "nominal_gbps": cfg.profile.hbm_peak_gbps or None}
        with phase("compile wait"):  # what start_ahead has not finished
            info["compiled_ahead"] = ahead.wait()
        for model, seq in seqs.items():
            todo = [m for m in cfg.ms if any((model, m, r) not in done for r in cfg.rules)]
            if not todo:
                bar.update(len(cfg.ms))
                continue
            fresh = _measure_model(Forwarding(cfg, clock, reader, phase, bar, sm, fns, info), model, seq, todo)
            rows = [r for r in rows if not (r["model"] == model and int(r["m"]) in todo)] + fresh
            atomic_write_text(out_csv, rows_to_csv(rows, columns))
    except KeyboardInterrupt as exc:
        interrupted = exc
    finally:
        bar.close()
        with signals_deferred():
            atomic_write_text(out_csv, rows_to_csv(rows, columns))
            info.update(status="interrupted" if interrupted else "complete",
                        wall_s=round(time.perf_counter() - t0, 1), phase_s=phase.rounded(), clocks_end=nvml_clocks(),
                        settle_probes=cfg.probes or None,
                        kernel_records=clock.records_seen)
            if any(PATHS[p].flashinfer_backend for p in used):
                info["autotune_cache"] = _keep_tactics(cfg, pinned)
            if dispatches:
                info["gemv_configs"] = _keep_gemv(cfg.out)
            write_run_json(cfg.out, info)
        if dispatches:
            dispatch.reset()
    if interrupted is not None:
        raise Interrupted(f"interrupted; finished rows are in {out_csv}, continue with the same command and --resume",
                          signal_of(interrupted))
    clock.close()
    _say_done(cfg, rows, info, out_csv)
    return cfg.out


def _run_info(cfg: ForwardConfig, seqs) -> dict[str, Any]:
    """run.json's settings of a forward run (its outcome is added as it ends)."""
    return run_info(cfg.command, kind="forward", profile=cfg.profile.name, models=list(cfg.models), tp=cfg.tp,
                    ms=cfg.ms, paths=cfg.rules, regimes=list(REGIMES), samples=cfg.samples, pdl=cfg.profile.pdl,
                    decoder_layers=cfg.decoder_layers, lm_head=cfg.lm_head, lm_head_rule=LM_HEAD_RULE,
                    eager_order_seed=cfg.order_seed, graph_order=GRAPH_ORDER, eager_settle=cfg.settle_ms > 0,
                    settle_ms=cfg.settle_ms, settle_at=cfg.settle_at,
                    settle_drain="before the settle", eager_profiler=EAGER_PROFILER,
                    sustain_ms=cfg.sustain_ms or None, idle_ms=cfg.idle_ms if cfg.sustain_ms else None,
                    table_file=cfg.table_file, skip_slower=cfg.skip_slower,
                    tuning=tuning_info(cfg.vllm_tune_tokens), layout=cfg.layout,
                    linears={m: len(s) for m, s in seqs.items()},
                    rules={r: RULES.get(r, "registry path") for r in cfg.rules},
                    table=getattr(cfg.table, "source", {}).get("fitted_from") if cfg.table else None,
                    dispatch_layer=_layer_of_dispatch() if DISPATCH in cfg.rules else None,
                    clocks_start=nvml_clocks())


def used_paths(cfg: ForwardConfig, seqs, sm: int) -> set[str]:
    """The registry paths the run's rules serve at some linear, M and regime."""
    return {path_for(r, lin, m, Target(sm, cfg.profile, cfg.table), regime) for r in cfg.rules for s in seqs.values()
            for lin in s for m in cfg.ms for regime in REGIMES}


def start_ahead(cfg: ForwardConfig, seqs, used: set[str]) -> Ahead:
    """The forward's compiles ahead: the C++ layer where a rule binds the dispatcher, and the GEMV's kernels of
    every linear at every M, launched as the paths the rules run (`used`) launch it."""
    binds = any(r in cfg.rules for r in BOUND_LAYER_RULES)
    pdls = tuple(sorted({GEMV_LAUNCHES[p] for p in used if p in GEMV_LAUNCHES} | ({None} if binds else set()),
                        key=str))
    return Ahead.start(cfg.compile_ahead, native_layer=binds,
                       cells=[(lin.n, lin.k, m) for s in seqs.values() for lin in s for m in cfg.ms] if pdls else [],
                       pdls=pdls)


def _path_fns(cfg: ForwardConfig, used: set[str]) -> dict[str, Callable]:
    """Each path the run serves (`used`, and F.linear) built."""
    fns: dict[str, Callable] = {}
    for name in used | {ATEN}:
        try:
            fns[name] = PATHS[name].build(cfg.profile.pdl)
        except ImportError as exc:
            raise HarnessError(f"path {name} needs a package that is missing ({exc}); pip install -e '.[gpu]'") from None
    return fns


def _measure_model(run: Forwarding, model: str, seq, todo: list[int]) -> list[dict]:
    """One model's rows at the M of `todo`: every M captured, then the eager rounds of all of them interleaved."""
    import torch
    cfg, phase, bar = run.cfg, run.phase, run.bar
    bar.set_postfix_str(f"{model}: {len(seq)} weights")
    try:
        with phase("weights"):
            weights = _weights(seq, seed=len(seq))
            fused = fused_forward(seq, weights) if cfg.fuses else None
    except torch.OutOfMemoryError:
        raise HarnessError(f"{model}: its {len(seq)} distinct weights do not fit in GPU memory; measure the "
                           f"first N decoder layers with --layers N") from None
    bar.update(len(cfg.ms) - len(todo))
    fresh, bound, twins = [], {}, {}
    for m in todo:
        bar.set_postfix_str(f"{model} M={m} graph")
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in sorted({lin.k for lin in seq})}
        graph_rows, bound_m, twins_m = graph_m(run, ForwardAt(model, seq, weights, m, xs, fused))
        fresh += graph_rows
        bound.update({(m, rule): b for rule, b in bound_m.items()})
        twins.update({(model, m, rule): first for rule, first in twins_m.items()})
        bar.update(1)
    bar.set_postfix_str(f"{model} eager, every M interleaved")
    if not cfg.sustain_ms:
        probes = cfg.probes.get(model, {})
        capped = None if cfg.settle_at == "every" else {
            key for key in bound if probes.get(str(key[0]), {}).get("capped", True)}
        fresh += eager_rows(run, model, len(seq), bound, capped)
        fresh += twin_rows(fresh, twins)
    annotate_forward(fresh, [(lin.n, lin.k) for lin in seq], run.info.get("ceilings"))
    del weights, bound, fused
    torch.cuda.empty_cache()
    return fresh


def _say_done(cfg: ForwardConfig, rows: list[dict], info: dict, out_csv: Path) -> None:
    ok = sum(1 for r in rows if r.get("status") == "ok")
    if cfg.sustain_ms:
        failed = {(r["model"], r["m"], r["path"]) for r in rows if r.get("status") != "ok"}
        print(f"sustain: {ok} replays timed, {len(failed)} (model, M, path) failed, in {info['wall_s']:.0f} s; results: "
              f"{out_csv} and run.json (the lines above summarise each path)", file=terminal(), flush=True)
        return
    print(f"forward: {ok} of {len(rows)} rows ok in {info['wall_s']:.0f} s; results: {out_csv} and run.json\n"
          f"  next: python -m calibrate validate RESULTS --forward {cfg.out}   |   "
          f"python -m reports build RESULTS --forward {cfg.out} -o report.html", file=terminal(), flush=True)
