"""The GPU side of a measurement: rotated inputs, correctness gate, host timing, CUDA-graph capture and replay."""
from __future__ import annotations

import functools
import math
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bench.stats import Window, attribute, count_error, kernel_digest, kernels_per_call, rel_err

L2_MODES = ("rotate", "flush", "warm")
ALIGN_ELEMENTS = 128  # bf16 elements in 256 bytes: every operand copy starts aligned (cute-dsl wants 32 bytes)
REL_ERR_BOUND = 2e-2  # bf16 output rounding is ~4e-3; K-long fp32 accumulation keeps the Frobenius error well below this


@dataclass
class Operands:
    xs: list[Any]
    ws: list[Any]

    @property
    def rotations(self) -> int:
        return len(self.xs)


def make_operands(m: int, n: int, k: int, rotations: int, seed: int = 0) -> Operands:
    """Random bf16 inputs and weights (never zeros: they run faster), one independent copy per rotation. Each side is
    one allocation filled by one randn call, every copy a view starting on a 256-byte boundary: a few launches per
    cell, not several per copy. (The sweep serves its copies from its pools: InputPool, make_weights.)"""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ws = make_weights(n, k, rotations, gen=gen)  # the weights drawn first, then the inputs
    return Operands(random_copies(m, k, rotations, 1.0, gen), ws)


def make_weights(n: int, k: int, rotations: int, seed: int = 0, gen: Any = None) -> list[Any]:
    """`rotations` independent random copies of an [n, k] bf16 weight, drawn from gen (a CUDA generator seeded
    with seed where none is given)."""
    import torch
    if gen is None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
    return random_copies(n, k, rotations, k ** -0.5, gen)


def aligned(elements: int) -> int:
    """Elements rounded up to a 256-byte boundary: where the next copy of a flat allocation starts."""
    return -(-elements // ALIGN_ELEMENTS) * ALIGN_ELEMENTS


def copies_of(flat: Any, rows: int, k: int, rotations: int) -> list[Any]:
    """`rotations` [rows, k] views of one flat allocation, each on a 256-byte boundary."""
    stride = aligned(rows * k)
    if flat.numel() < rotations * stride:
        raise ValueError(f"{flat.numel()} elements cannot hold {rotations} copies of {rows} x {k}")
    return [flat[i * stride:i * stride + rows * k].view(rows, k) for i in range(rotations)]


def random_copies(rows: int, k: int, rotations: int, scale: float, gen: Any) -> list[Any]:
    """`rotations` [rows, k] bf16 views of one randn allocation (times scale), each on a 256-byte boundary."""
    import torch
    flat = torch.randn(rotations * aligned(rows * k), device="cuda", dtype=torch.bfloat16, generator=gen)
    if scale != 1.0:
        flat.mul_(scale)
    return copies_of(flat, rows, k, rotations)


def random_flat(elements: int, seed: int) -> Any:
    """One bf16 randn allocation of `elements` on the GPU."""
    import torch
    return torch.randn(elements, device="cuda", dtype=torch.bfloat16,
                       generator=torch.Generator(device="cuda").manual_seed(seed))


@dataclass
class InputPool:
    """The current shape's inputs: one random allocation, sized at the shape's first M for the most copies any of its M
    takes (rotations x aligned rows x K), each M's copies views into it. A sweep releases the GPU's cached memory
    after every cell, so inputs made per cell were a fresh allocation (a cudaMalloc) and fill each time. Values repeat
    across M; a timing does not depend on them, and each cell's check has its own fp32 reference."""
    fill: Callable[[int, int], Any] = random_flat  # (elements, seed) -> a flat bf16 tensor
    shape: tuple[int, int] | None = None
    flat: Any = None

    def take(self, n: int, k: int, m: int, rotations: int, most: int) -> list[Any]:
        """`rotations` [m, k] copies for shape (n, k); `most`: the elements the shape's largest need takes (a need
        above it, or another shape, makes the allocation again)."""
        need = rotations * aligned(m * k)
        if self.shape != (n, k) or self.flat is None or self.flat.numel() < need:
            self.clear()  # released before the next is made
            self.flat, self.shape = self.fill(max(need, most), n * 7919 + k), (n, k)
        return copies_of(self.flat, m, k, rotations)

    def clear(self) -> None:
        self.shape, self.flat = None, None


def reference(x, w, max_rows: int = 256) -> tuple[Any, Any]:
    """(row indices, fp32 x[rows] @ w.T) on up to max_rows rows of x: one reference serves every path of a cell."""
    import torch
    rows = torch.arange(x.shape[0], device=x.device)
    if x.shape[0] > max_rows:
        rows = torch.linspace(0, x.shape[0] - 1, max_rows, device=x.device).long()
    return rows, x[rows].float() @ w.float().t()


def check_output(fn: Callable, x, w, ref: tuple[Any, Any] | None = None) -> float:
    """Relative error of fn(x, w) against an fp32 reference (reference(x, w), computed here when not given)."""
    return output_error(fn(x, w), x, w, ref)


REPEATS = 5  # calls after the checked one whose outputs must equal it bitwise for a path to be repeatable


def determinism(fn: Callable, x, w, first) -> tuple[bool, bool]:
    """(repeatable: REPEATS more calls of fn on the same operands give bitwise the checked output `first`;
    batch_invariant: the first row alone (M = 1) gives bitwise the first row of the M-row output)."""
    import torch
    repeatable = all(torch.equal(fn(x, w), first) for _ in range(REPEATS))
    return repeatable, bool(torch.equal(fn(x[:1], w), first[:1]))


def output_error(out, x, w, ref: tuple[Any, Any] | None = None) -> float:
    """Relative error of an output for (x, w) against the fp32 reference; a wrong shape raises."""
    rows, expected = ref if ref is not None else reference(x, w)
    if tuple(out.shape) != (x.shape[0], w.shape[0]):
        raise ValueError(f"output shape {tuple(out.shape)}, expected {(x.shape[0], w.shape[0])}")
    return rel_err(out[rows], expected)


@contextmanager
def flashinfer_choices():
    """Records (runner class, tactic) of every FlashInfer GEMM that ran inside the block: the runner called, not only
    the autotuner's answer, which FlashInfer may replace (bf16_gemm_sm100 falls back to runners[0] with tactic -1
    when a cached CuTe DSL entry does not fit the real M). Where a call bypasses the runners (a lean TinyGEMM or
    cuBLASLt call launches the kernel itself), nothing is recorded."""
    seen: list[tuple[str, Any]] = []
    try:
        from flashinfer.autotuner import TunableRunner
    except ImportError:
        yield seen
        return
    original_call = TunableRunner.__call__

    def recording(self, inputs, **kwargs):
        seen.append((type(self).__name__, kwargs.get("tactic", -1)))
        return original_call(self, inputs, **kwargs)

    TunableRunner.__call__ = recording
    try:
        yield seen
    finally:
        TunableRunner.__call__ = original_call


@functools.cache
def sleep_cycles_per_us() -> float:
    """How many torch.cuda._sleep cycles last one microsecond on this GPU now (its SM clock under a sleep kernel),
    measured once per process, so that guard sleeps are as long as intended and no longer."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # wake the clocks first
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


class L2Flush:
    """Writes a buffer of `multiple` x L2 bytes: captured before every call in --l2 flush mode, so that each call finds
    its weight and input evicted from L2 without needing rotated copies."""

    def __init__(self, l2_bytes: int, multiple: float = 2.0):
        import torch
        self.multiple = multiple
        self.buf = torch.empty(int(l2_bytes * multiple) // 4, dtype=torch.float32, device="cuda")

    def __call__(self) -> None:
        self.buf.fill_(1.0)

    def kernel_names(self, clock) -> frozenset[str]:
        """The names of the kernels one flush launches (from CUPTI), to leave out of a call's time."""
        clock.drain()
        self()
        return frozenset(r.name for r in clock.drain() if r.graph_id == 0)


@functools.cache
def _side_stream(device: int):
    """One warm-up stream per device for every capture: a kernel that keeps state per stream (the GEMV's workspaces)
    keeps one set for all of a run's warm-ups, not one per capture."""
    import torch
    return torch.cuda.Stream(device)


def capture_graph(warmup: Callable[[], None], body: Callable[[], None]):
    """`warmup()` on a side stream (lazy initialisation must not happen during capture), then `body()` captured."""
    import torch
    stream = _side_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warmup()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def capture(fn: Callable, ops: Operands, calls: int, before: Callable[[], None] | None = None):
    """A CUDA graph of `calls` back-to-back calls cycling through every rotated copy (each after `before()`, when
    given: the L2 flush)."""
    def warmup() -> None:
        for i in range(min(2, ops.rotations)):
            fn(ops.xs[i], ops.ws[i])

    def body() -> None:
        for i in range(calls):
            if before is not None:
                before()
            fn(ops.xs[i % ops.rotations], ops.ws[i % ops.rotations])
    return capture_graph(warmup, body)


@dataclass
class GraphTiming:
    gpu_us: list[float] = field(default_factory=list)  # kernel busy time per call, per replay
    span_us: list[float] = field(default_factory=list)
    event_us: list[float] = field(default_factory=list)
    kernels: tuple[str, ...] = ()
    kernels_per_call: int | None = None
    digest: str = ""  # kernel_digest of one warm-up replay's kernels
    error: str | None = None
    gpu_from: str | None = None  # the path whose timed replays these are (a twin with the same kernels), or None
    stop: str = ""  # why its replays stopped: the stopping criterion met, or the maximum count
    clocks: list[tuple[int, float, int] | None] = field(default_factory=list)  # (SM MHz, W, reasons) after each sample
    # the interleaved pass its replays were timed in (replay_interleaved): sample i of two timings of one pass ran in
    # round i, side by side, so a clock change between rounds hits both (calibrate pairs them)
    replay_pass: str = ""

    def read_off(self, path: str, **own: Any) -> GraphTiming:
        """This timing as a twin's, read off `path` (gpu_from) in lists of its own; `own` keeps the twin's fields."""
        return replace(self, gpu_from=path, gpu_us=list(self.gpu_us), span_us=list(self.span_us),
                       event_us=list(self.event_us), clocks=list(self.clocks), **own)


def replay_seconds(graph) -> float:
    """Wall seconds of one replay of a warm graph (after one untimed replay), to size settles and runs by time."""
    import torch
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def records_since_last_window(clock, windows: list[Window]) -> list:
    """CUPTI's records so far, keeping only those of the last timed window: called between a window and the next
    settle, so that the (many) records of settle runs are dropped without a flush between a settle and its window.
    Runs that flushed there measured graph replays below their sustained times although NVML read the capped clock
    right after them, and timed eager forwards with several times the host submission time of earlier runs; their
    eager rows are void (load_forward). The likely mechanism: after a forced
    flush CUPTI asks for a fresh buffer at the next launch, which then was the guard sleep (the GPU idled meanwhile) or
    the timed forward's first call. Here that next launch is the settle's."""
    recs = clock.drain()
    return [r for r in recs if r.start >= windows[-1].t0] if windows else []


@dataclass(frozen=True)
class Stopping:
    """When a path's timed replays stop, in the spirit of nvbench's 'stdrel' criterion: once it has `min_samples`
    replays and the relative standard deviation of their CUDA-event times is at most `max_noise`, or at the
    run's sample count."""
    min_samples: int = 5
    max_noise: float = 0.005

    def met(self, times: list[float]) -> bool:
        if len(times) < self.min_samples:
            return False
        mean = sum(times) / len(times)
        sd = (sum((t - mean) ** 2 for t in times) / (len(times) - 1)) ** 0.5
        return mean > 0 and sd / mean <= self.max_noise

    def describe(self) -> dict[str, Any]:
        return {"criterion": "stdrel", "min_samples": self.min_samples, "max_noise": self.max_noise,
                "on": "CUDA-event time per replay"}


def new_pass_id() -> str:
    """A token unique to one interleaved pass (a results row's replay_pass): rows of one cell pair their samples only
    where their tokens match, so rows timed in another pass, process or leg never pair. The letter keeps it a string
    when a table is read back."""
    return "p" + secrets.token_hex(6)


@dataclass
class Replays:
    """How a set of captured graphs is replayed and timed (replay_interleaved): each graph holds `calls` calls and
    is timed up to `samples` times after `warmup` untimed replays; the other fields as replay_interleaved says."""
    calls: int
    samples: int
    warmup: int = 2
    exclude: frozenset[str] = frozenset()
    settle_s: float = 0.0
    reader: Any = None
    orders: list[list[str]] | None = None
    twins: dict[str, tuple[str, ...]] | None = None
    stopping: Stopping | None = None
    keep: list | None = None


def replay_interleaved(clock, graphs: dict[str, Any], plan: Replays) -> dict[str, GraphTiming]:
    """Replays every path's graph up to `plan.samples` times in A B B A order (or in orders[s] for sample s);
    attributes kernel records to each replay.
    Kernels named in `exclude` (an L2 flush captured between calls) are not counted, nor timed.

    twins: path -> the paths that may run the same kernels (the dispatcher and what it chose). A twin is replayed in
    its warm-ups only; where its warm-up kernel digest then equals the first timed such path's, its timing is that
    path's and `gpu_from` names it. A digest that differs times the twin in full, in a second pass.
    stopping: a path stops before `samples` once the criterion is met (GraphTiming.stop says which ended it).
    keep: where given, every kernel record drained here is appended to it (the caller's own windows, earlier in the
    same drain, read them there).

    settle_s: each timed replay follows untimed replays of the same graph lasting at least this long, so that it runs
    at the clock its own sustained load settles at, not at one its predecessor left (see bench forward --settle-ms).
    reader: a ClockReader, read after every timed replay (GraphTiming.clocks).
    Without a settle, CUPTI is drained once, after the last replay (each drain costs milliseconds)."""
    import torch
    calls, warmup, exclude, settle_s, keep, twins = (plan.calls, plan.warmup, plan.exclude, plan.settle_s, plan.keep,
                                                     plan.twins)
    names = list(graphs)
    pass_id = new_pass_id()
    result = {p: GraphTiming(replay_pass=pass_id) for p in names}
    use_records = clock.name == "cupti"
    deferred = [p for p in (twins or {}) if p in graphs] if use_records else []

    # Warm-up replays calibrate kernels per call (cuBLAS may add a split-K reduce kernel) and the host launch time.
    if settle_s > 0:
        _keep(keep, clock.drain())
    warm, launch_ns, replay_ns = [], {p: float("inf") for p in names}, {p: float("inf") for p in names}
    for p in names:
        for s in range(warmup):
            t0 = clock.now()
            h0 = time.perf_counter_ns()
            graphs[p].replay()
            launch_ns[p] = min(launch_ns[p], time.perf_counter_ns() - h0)  # the first replay also uploads the graph
            torch.cuda.synchronize()
            replay_ns[p] = min(replay_ns[p], time.perf_counter_ns() - h0)
            warm.append(Window(p, -1 - s, t0, clock.now()))
    settle = {p: math.ceil(settle_s * 1e9 / replay_ns[p]) if settle_s > 0 else 0 for p in names}
    # the settle runs drain CUPTI before each window (records_since_last_window): the warm-ups' records go first
    records = _keep(keep, clock.drain()) if settle_s > 0 else []
    timed = [p for p in names if p not in deferred]
    windows, events = _timed_replays(clock, {p: graphs[p] for p in timed}, plan, (launch_ns, settle), result,
                                     records)
    records = sorted((r for r in records + _keep(keep, clock.drain()) if r.name not in exclude), key=lambda r: r.start)
    if use_records:
        _calibrate(records, warm, calls, result)
    for (start, end), w in zip(events, windows):
        result[w.path].event_us.append(start.elapsed_time(end) * 1e3 / calls)
    if use_records:
        for w, timing in zip(windows, attribute(records, windows)):
            if result[w.path].error:
                continue
            error = count_error(w, timing.count, calls * result[w.path].kernels_per_call)
            if error:
                result[w.path].error = error
                continue
            result[w.path].gpu_us.append(timing.busy_ns / 1e3 / calls)
            result[w.path].span_us.append(timing.span_ns / 1e3 / calls)
    else:
        for p in timed:
            result[p].gpu_us = list(result[p].event_us)
            result[p].span_us = list(result[p].event_us)
    unmatched = []
    for p in deferred:
        rep = next((c for c in twins[p] if c in timed and result[c].error is None and result[p].error is None
                    and result[c].digest == result[p].digest
                    and result[c].kernels_per_call == result[p].kernels_per_call), None)
        if rep is None:
            unmatched.append(p)
            continue
        result[p] = result[rep].read_off(rep, kernels=result[p].kernels, digest=result[p].digest)
    if unmatched:
        result.update(replay_interleaved(clock, {p: graphs[p] for p in unmatched},
                                         replace(plan, orders=None, twins=None)))
    return result


def _keep(keep: list | None, records: list) -> list:
    if keep is not None:
        keep.extend(records)
    return records


def _calibrate(records: list, warm: list[Window], calls: int, result: dict[str, GraphTiming]) -> None:
    """Kernels per call, kernel names and digest of each path from its warm-up replays."""
    seen: dict[str, int] = {}
    for w, timing in zip(warm, attribute(records, warm)):
        p = w.path
        try:
            kpc = kernels_per_call(timing.count, calls, p)
        except Exception as exc:
            result[p].error = str(exc)
            continue
        if seen.setdefault(p, kpc) != kpc:
            result[p].error = f"{p}: kernels per call changed between warm-up replays ({seen[p]} vs {kpc})"
        result[p].kernels_per_call = kpc
        result[p].kernels = tuple(dict.fromkeys(timing.names))
        result[p].digest = kernel_digest(timing.names)


def _timed_replays(clock, graphs: dict[str, Any], plan: Replays, warmed: tuple[dict, dict],
                   result: dict[str, GraphTiming], records: list) -> tuple[list[Window], list[tuple[Any, Any]]]:
    """The timed replays of `graphs`, interleaved; (windows, CUDA-event pairs). `warmed`: each graph's launch time
    (ns) and settle replays, from the warm-ups. A settle drains CUPTI into `records`."""
    import torch
    live, samples, reader, orders, stopping = list(graphs), plan.samples, plan.reader, plan.orders, plan.stopping
    launch_ns, settle = warmed
    windows, events = [], []
    event_times: dict[str, list[float]] = {p: [] for p in live}
    stopped: set[str] = set()
    for s in range(samples):
        running = [p for p in live if p not in stopped]
        if not running:
            break
        order = [p for p in orders[s] if p in running] if orders else (running if s % 2 == 0 else running[::-1])
        for p in order:
            if settle[p]:
                records += records_since_last_window(clock, windows)
                for _ in range(settle[p]):  # synchronized below, before the window opens: outside every window
                    graphs[p].replay()
                torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = clock.now()
            # A sleep kernel ahead of the start event keeps the GPU busy while the host launches the graph, so the
            # events time the replay and not the launch latency (the sleep is no graph kernel: CUPTI filters it out).
            torch.cuda._sleep(int(sleep_cycles_per_us() * (1.5 * launch_ns[p] / 1e3 + 10)))
            start.record()
            graphs[p].replay()
            end.record()
            torch.cuda.synchronize()
            windows.append(Window(p, s, t0, clock.now()))
            events.append((start, end))
            if stopping is not None:
                event_times[p].append(start.elapsed_time(end))
            if reader is not None:
                result[p].clocks.append(reader.read())
        if stopping is not None:
            for p in running:
                if stopping.met(event_times[p]):
                    stopped.add(p)
                    result[p].stop = f"stdrel <= {stopping.max_noise:g} after {len(event_times[p])}"
    for p in live:
        result[p].stop = result[p].stop or f"max samples ({samples})"
    return windows, events
