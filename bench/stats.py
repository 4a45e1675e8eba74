"""Sample statistics and the sizing rules of a measurement; pure Python, tested on CPU."""
from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

from harness.errors import HarnessError


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method), q in [0, 1]: the one quantile of the project."""
    return _quantile_sorted(_sorted_or_nan(values), q)


def summary(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, p20, p80)."""
    xs = _sorted_or_nan(values)
    return _quantile_sorted(xs, 0.5), _quantile_sorted(xs, 0.2), _quantile_sorted(xs, 0.8)


def _sorted_or_nan(values: Sequence[float]) -> list[float]:
    """The values as sorted floats; [nan] where any is NaN (numpy's quantile of such values is NaN)."""
    if not len(values):
        raise ValueError("quantile of no values")
    xs = [float(v) for v in values]
    if any(x != x for x in xs):
        return [math.nan]
    xs.sort()
    return xs


def _quantile_sorted(xs: list[float], q: float) -> float:
    """numpy.quantile(xs, q) of sorted floats, in pure Python: a sweep takes tens of thousands of quantiles of a
    few samples each, where numpy's call overhead is ~100x the arithmetic."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    n = len(xs)
    h = (n - 1) * q  # numpy's virtual index of the linear method
    if h >= n - 1:
        return xs[-1]
    if h < 0:
        return xs[0]
    lo = math.floor(h)
    a, b, t = xs[lo], xs[lo + 1], h - lo
    diff = b - a
    return b - diff * (1.0 - t) if t >= 0.5 else a + diff * t  # numpy's _lerp


class PhaseTimer:
    """Wall seconds spent per named phase of a sweep, so that run.json says where the time went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}


def rotation_count(bytes_per_copy: int, l2_bytes: int, factor: float = 5.0, cap: int = 1024) -> int:
    """Distinct input/weight copies so that one pass over them touches factor x L2 (cold L2), at most cap."""
    if bytes_per_copy <= 0:
        raise ValueError("bytes_per_copy must be positive")
    return max(1, min(cap, math.ceil(factor * l2_bytes / bytes_per_copy)))


def calls_per_graph(rotations: int, est_call_us: float, target_replay_us: float = 500.0, cap: int = 2048) -> int:
    """K calls per captured graph: every rotated copy at least once, and enough calls for a replay of target length."""
    by_time = math.ceil(target_replay_us / max(est_call_us, 0.5))
    return max(rotations, min(cap, by_time), 1)


def estimate_call_us(m: int, n: int, k: int, tflops: float = 600.0, gbps: float = 4000.0, launch_us: float = 3.0) -> float:
    """A roofline guess of one GEMM's GPU time, only used to size graphs (never reported)."""
    flop_us = 2.0 * m * n * k / (tflops * 1e6)
    byte_us = 2.0 * (m * k + n * k + m * n) / (gbps * 1e3)
    return max(flop_us, byte_us) + launch_us


class KernelRecord(NamedTuple):
    """One kernel's CUPTI activity record. A named tuple, not a dataclass: a sweep makes millions of them, one per
    kernel, while CUPTI's buffers are parsed, and a tuple is much cheaper to make than a frozen dataclass."""
    start: int  # ns, CUPTI clock
    end: int
    name: str
    graph_id: int = 0


@dataclass(frozen=True)
class Window:
    """One graph replay: host timestamps (same clock as the records) before replay and after its sync."""
    path: str
    sample: int
    t0: int
    t1: int


@dataclass(frozen=True)
class WindowTiming:
    busy_ns: int  # sum of kernel durations
    span_ns: int  # first start to last end
    names: tuple[str, ...]  # kernel names in launch order
    count: int


class KernelCountError(HarnessError):
    pass


def in_window(records: Sequence[KernelRecord], starts: Sequence[int], w: Window, graph: bool = True
              ) -> list[KernelRecord]:
    """The records that started inside window w (records sorted by start; starts their start times), launched by a
    CUDA-graph replay (graph) or eagerly (not graph)."""
    lo, hi = bisect_left(starts, w.t0), bisect_right(starts, w.t1)
    return [r for r in records[lo:hi] if (r.graph_id != 0) == graph]


def attribute(records: Sequence[KernelRecord], windows: Sequence[Window], expected: dict[str, int] | None = None,
              graph: bool = True) -> list[WindowTiming]:
    """Assign kernel records to windows by time; check each window's count exactly.

    records must be sorted by start. expected maps path -> kernels per window (None: no check). graph: count the
    kernels launched by CUDA-graph replays (graph id != 0), else the eagerly launched ones (graph id 0).
    """
    starts = [r.start for r in records]
    out = []
    for w in windows:
        ks = in_window(records, starts, w, graph)
        error = count_error(w, len(ks), expected[w.path]) if expected is not None else None
        if error:
            raise KernelCountError(error)
        if not ks:
            out.append(WindowTiming(0, 0, (), 0))
            continue
        out.append(WindowTiming(sum(r.end - r.start for r in ks), max(r.end for r in ks) - min(r.start for r in ks),
                                tuple(r.name for r in ks), len(ks)))
    return out


def kernel_digest(names: Sequence[str]) -> str:
    """A short fingerprint of a kernel sequence (names in launch order): two forwards with the same digest ran the
    same kernels, so the difference between their times is measurement noise."""
    import hashlib
    return hashlib.sha1("\n".join(names).encode()).hexdigest()[:12] if names else ""


def count_error(window: Window, got: int, want: int) -> str | None:
    """The kernel-count check of one replay window, in one place: every kernel of every call, no more."""
    if got == want:
        return None
    return (f"{window.path} replay {window.sample}: {got} kernel records in its window, expected {want} "
            f"(kernels missing from CUPTI, or extra kernels launched)")


def kernels_per_call(total_records: int, calls: int, path: str) -> int:
    """Calibrate kernels per call from a warm-up replay; a count that K calls cannot split evenly is an error."""
    if total_records == 0 or total_records % calls:
        raise KernelCountError(
            f"{path}: warm-up replay of {calls} calls produced {total_records} kernel records, "
            f"which is not a whole number per call")
    return total_records // calls


def rel_err(out, ref) -> float:
    """Frobenius relative error of a bf16 result against an fp32 reference (torch tensors)."""
    diff = (out.float() - ref).norm().item()
    base = ref.norm().item()
    return diff / base if base else diff
