"""GPU timers: one CUPTI activity session per process (kernel records only), or CUDA events alone."""
from __future__ import annotations

import contextlib
import threading
import time

from bench.stats import KernelRecord
from harness.errors import HarnessError

INVALID_END = 1 << 63


class CuptiClock:
    """Collects CONCURRENT_KERNEL records for the whole process. Create before any graph capture or JIT load."""
    name = "cupti"

    def __init__(self, buffer_bytes: int = 32 << 20):
        try:
            from cupti import cupti
        except ImportError as exc:
            raise HarnessError(
                f"cupti-python is not importable ({exc}); pip install 'cupti-python>=13' "
                f"(or the [gpu] extra), or pass --timer events") from None
        self._cupti = cupti
        self._lock = threading.Lock()
        self._records: list[KernelRecord] = []
        self.invalid = 0
        self.drain_s = 0.0  # host seconds spent flushing and parsing records (reported in run.json)
        self.records_seen = 0
        kind = cupti.ActivityKind.CONCURRENT_KERNEL

        def requested():
            return buffer_bytes, 0

        def completed(activities):
            # a sweep parses millions of records here: each field of a binding's record is read once
            keep, bad = [], 0
            add = keep.append
            for a in activities:
                if a.kind != kind:
                    continue
                start, end = a.start, a.end
                if start == 0 or end <= start or end >= INVALID_END:
                    bad += 1
                    continue
                add(KernelRecord(start, end, a.name, a.graph_id))
            with self._lock:
                self._records.extend(keep)
                self.invalid += bad

        self._callbacks = (requested, completed)  # the binding keeps no reference of its own
        try:
            cupti.activity_register_callbacks(requested, completed)
            cupti.activity_enable(kind)
        except Exception as exc:  # cupti.cuptiError and friends
            raise HarnessError(
                f"CUPTI did not start ({exc}); another profiler (nsys, torch.profiler) may hold it, or libcupti "
                f"does not match the driver; close it or pass --timer events") from None

    def now(self) -> int:
        return self._cupti.get_timestamp()

    def drain(self) -> list[KernelRecord]:
        import torch
        torch.cuda.synchronize()  # nothing in flight, so a forced flush cannot cut a record short
        t0 = time.perf_counter()
        self._cupti.activity_flush_all(self._cupti.ActivityFlag.FLUSH_FORCED)
        with self._lock:
            recs, self._records = self._records, []
        recs.sort(key=lambda r: r.start)
        self.drain_s += time.perf_counter() - t0
        self.records_seen += len(recs)
        return recs

    @contextlib.contextmanager
    def paused(self):
        """No kernel records inside (records so far are drained first and kept): CUPTI's activity is off, so the
        launches pay no profiler and no buffer fills up under them."""
        kept = self.drain()
        kind = self._cupti.ActivityKind.CONCURRENT_KERNEL
        self._cupti.activity_disable(kind)
        try:
            yield
        finally:
            self._cupti.activity_enable(kind)
            with self._lock:
                self._records[:0] = kept

    def close(self) -> None:
        self.drain()
        self._cupti.activity_disable(self._cupti.ActivityKind.CONCURRENT_KERNEL)
        self._cupti.finalize()


class EventClock:
    """No kernel records: windows are timed by CUDA events only (kernel names and counts are unknown)."""
    name = "events"
    invalid = 0
    drain_s = 0.0
    records_seen = 0

    def now(self) -> int:
        return time.perf_counter_ns()

    def drain(self) -> list[KernelRecord]:
        import torch
        torch.cuda.synchronize()
        return []

    def paused(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


def make_clock(timer: str):
    if timer == "cupti":
        return CuptiClock()
    if timer == "events":
        return EventClock()
    raise HarnessError(f"unknown timer {timer!r}; use cupti or events")
