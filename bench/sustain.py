"""(GPU) Each path's captured forward replayed back to back for a while after an idle gap, every replay timed by CUDA
events, with the SM clock and board power that NVML reports meanwhile: what a sustained load does to a path's time
at the GPU's power cap, and how long after the start it shows (bench forward --sustain-ms; --settle-ms is chosen
from it)."""
from __future__ import annotations

import math
import threading
import time
from typing import Any

from bench.envinfo import ClockReader
from bench.gpu import replay_seconds
from bench.stats import summary

SUSTAIN_FILE = "sustain.csv"
SUSTAIN_COLUMNS = ("model", "m", "path", "status", "reason", "replay", "t_ms", "us", "sm_mhz", "power_w", "clock_reasons")
POLL_S = 0.002


def sustained(graphs: dict[str, Any], idle_s: float, run_s: float, reader: ClockReader) -> dict[str, list[dict]]:
    """Per path: idle for idle_s, then replays for about run_s; one record per replay (its end on the GPU's timeline
    since the first started, its time, and the last NVML reading taken before that end)."""
    import torch
    out = {}
    for path, graph in graphs.items():
        n = max(1, math.ceil(run_s / replay_seconds(graph)))
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        polls: list[tuple[float, Any]] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                polls.append((time.perf_counter(), reader.read()))
                time.sleep(POLL_S)

        time.sleep(idle_s)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.perf_counter()  # the GPU is idle: the first replay starts within a launch latency of this
        events[0].record()
        for e in events[1:]:
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        stop.set()
        poller.join()
        records, j, last = [], 0, None
        for i in range(n):
            end_ms = events[0].elapsed_time(events[i + 1])
            while j < len(polls) and (polls[j][0] - t0) * 1e3 <= end_ms:
                last = polls[j][1] or last
                j += 1
            records.append({"replay": i, "t_ms": round(end_ms, 3),
                            "us": round(events[i].elapsed_time(events[i + 1]) * 1e3, 2),
                            "sm_mhz": last[0] if last else None, "power_w": round(last[1]) if last else None,
                            "clock_reasons": last[2] if last else None})
        out[path] = records
    return out


def summary_line(path: str, records: list[dict]) -> str:
    """First replays against the last third: the settled time, and how long the path took to reach it."""
    us = [r["us"] for r in records]
    tail = us[-max(1, len(us) // 3):]
    settled = summary(tail)[0]
    first = summary(us[:3])[0]
    reached = next(r["t_ms"] for r in records if abs(r["us"] / settled - 1) <= 0.02 or r is records[-1])
    clocks = [r["sm_mhz"] for r in records[-len(tail):] if r["sm_mhz"]]
    return (f"  {path:26s} first {first:9.1f} µs, settled {settled:9.1f} µs ({settled / first:.3f}x), first within "
            f"2% of it at {reached:.0f} ms; SM clock then {summary(clocks)[0] if clocks else float('nan'):.0f} MHz")
