"""Host time of eager calls: blocks of calls per layer or path, rounds interleaved, gc off, the GPU kept busy by a
sleep kernel so that no call waits on it (no back-pressure). Pure Python apart from the guard; tested on CPU."""
from __future__ import annotations

import gc
import math
import time
from typing import Any, Callable

from bench.gpu import sleep_cycles_per_us
from bench.stats import quantile, summary

MIN_CALLS = 3  # the fewest calls in a block sized by time (time_blocks' block_us)


def time_blocks(layers: dict[str, Callable[[], Any]], calls: int, rounds: int,
                guard: tuple[Callable[[float], Any], Callable[[Any], bool]] | None = None,
                block_us: float | None = None, warmup: int = 3) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """Per-round median µs per call of every layer, rounds interleaved (A B C, C B A, ...), gc off.

    warmup: untimed calls of each layer first (0 where the caller has just run it on the same operands); two more
    calls, timed, give the estimate that sizes blocks and the protection.

    block_us: a layer's block holds as many calls as last this long by its warm-up estimate, between MIN_CALLS and
    `calls` (None: `calls` for every layer): a slow call's median needs fewer calls to be as precise.

    guard (before_block, after_block): before_block(expected_us) runs before each layer's block of calls (the GPU side
    enqueues a sleep kernel there, so no call waits on the GPU) and returns a token; after_block(token) says whether
    that protection held.
    """
    before_block, after_block = guard if guard is not None else (None, None)
    names = list(layers)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    protected = {n: True for n in names}
    estimate_us = {n: 0.0 for n in names}
    for n in names:  # warm-up, and the estimate that sizes the protection
        for _ in range(warmup):
            layers[n]()
        for _ in range(2):
            t0 = time.perf_counter_ns()
            layers[n]()
            estimate_us[n] = max(estimate_us[n], (time.perf_counter_ns() - t0) / 1e3)
    per_block = {n: block_calls(estimate_us[n], calls, block_us) for n in names}
    gc_on = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                fn = layers[n]
                token = before_block(estimate_us[n] * per_block[n]) if before_block else None
                times = []
                for _ in range(per_block[n]):
                    t0 = time.perf_counter_ns()
                    fn()
                    times.append(time.perf_counter_ns() - t0)
                if after_block is not None and not after_block(token):
                    protected[n] = False
                per_round[n].append(quantile([t / 1e3 for t in times], 0.5))
    finally:
        if gc_on:
            gc.enable()
    return per_round, protected


def block_calls(estimate_us: float, calls: int, block_us: float | None) -> int:
    """Calls in one block of a layer estimated at estimate_us per call (time_blocks' block_us)."""
    if block_us is None:
        return calls
    return max(min(MIN_CALLS, calls), min(calls, math.ceil(block_us / max(estimate_us, 1e-3))))


def sleep_guard(factor: float = 1.5, margin_us: float = 200.0) -> tuple[Callable[[float], Any], Callable[[Any], bool]]:
    """(GPU) before/after hooks for time_blocks: a sleep kernel of factor x the expected block time plus margin_us is
    enqueued first; afterwards, True when it was still running, i.e. no call in the block could have waited on the GPU.
    The wait for the rest of the sleep is the price of that guarantee, so the factor stays small."""
    import torch

    rate = sleep_cycles_per_us()

    def before(expected_us: float):
        torch.cuda._sleep(int(rate * (factor * expected_us + margin_us)))
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def after(ev) -> bool:
        busy = not ev.query()
        torch.cuda.synchronize()
        return busy
    return before, after


def host_times(fns: dict[str, Callable[[], Any]], calls: int, rounds: int, factor: float = 1.5,
               block_us: float | None = None, warmup: int = 3) -> dict[str, tuple[float, float, float, bool]]:
    """(GPU) median, p20, p80 over rounds of the per-round median µs per call, and whether the GPU stayed busy."""
    per_round, busy = time_blocks(fns, calls, rounds, sleep_guard(factor), block_us, warmup)
    return {n: (*summary(v), busy[n]) for n, v in per_round.items()}
