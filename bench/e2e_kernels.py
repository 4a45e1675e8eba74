"""(GPU) Where a captured decode step's time goes, stock against patched: the kernels of replays of each, by CUPTI.

The two variants run the same model, so the kernels both run (norms, attention, routing, the linears the dispatcher
leaves on F.linear) match by name; what one variant runs and the other does not is its own: the linears the
dispatcher changed. Stock's own time minus patched's own time is what the changed linears saved inside the step;
the shared time's change is what patching did to the rest (a kernel that waits longer on its neighbour, a cache
left otherwise). A changed linear whose kernels carry the same names as F.linear's (a lean cuBLASLt call at an
untuned M runs F.linear's matmul) counts as shared.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from bench.clocks import make_clock as clock_of
from bench.stats import Window, in_window
from harness.errors import HarnessError

VARIANTS = ("stock", "patched")
REPLAYS = 5
COLUMNS = ("kernels", "kernels_us", "own_kernels_us", "shared_kernels_us")


def kernel_split(stock: Sequence[tuple[str, float]], patched: Sequence[tuple[str, float]]
                 ) -> dict[str, dict[str, float]]:
    """One replay of each variant as (kernel name, µs): per variant, its kernels' count and summed time, split into
    the kernels the other variant also runs (as many of each name as both have, at this variant's mean time for
    that name) and its own."""
    by: dict[str, dict[str, list[float]]] = {v: defaultdict(list) for v in VARIANTS}
    for v, kernels in zip(VARIANTS, (stock, patched)):
        for name, us in kernels:
            by[v][name].append(us)
    out = {}
    for v, other in zip(VARIANTS, VARIANTS[::-1]):
        own = shared = 0.0
        for name, times in by[v].items():
            both = min(len(times), len(by[other].get(name, ())))
            mean = sum(times) / len(times)
            shared += both * mean
            own += (len(times) - both) * mean
        out[v] = {"kernels": float(sum(len(t) for t in by[v].values())), "kernels_us": own + shared,
                  "own_kernels_us": own, "shared_kernels_us": shared}
    return out


def median_split(replays: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """kernel_split over several replay pairs: the median of each figure."""
    return {v: {c: statistics.median(r[v][c] for r in replays) for c in COLUMNS} for v in VARIANTS}


def make_clock(device: str) -> tuple[Any, str]:
    """A CUPTI clock for the step's kernels, created before any capture or JIT load; (None, why) where there is none."""
    if device != "cuda":
        return None, "a kernel split needs CUDA"
    try:
        return clock_of("cupti"), ""
    except HarnessError as exc:
        return None, str(exc)


def op_kernels(names: Iterable[str], ops: Iterable[str]) -> dict[str, list[str]]:
    """Per op, the distinct kernel names of a step that carry the op's name: a package's kernels do (fla's
    fused_recurrent_gated_delta_rule_fwd_kernel, causal-conv1d's causal_conv1d_update_kernel); an op that ran as
    PyTorch's own elementwise and convolution kernels (transformers' reference code) has none."""
    names = set(names)
    return {op: sorted(n for n in names if op in n) for op in ops}


def decode_split(clock, capture: Callable[[], tuple[Callable[[], None] | None, str]], patch: Callable[[], Any]
                 ) -> tuple[dict[str, dict[str, float]] | None, str, set[str]]:
    """Capture the decode step stock, then patched (capture() gives (replay, why not)); replay them in turn with the
    clock on; (median split, '', the stock step's kernel names) or (None, why not, what was seen). The patch stays
    until the patched graph's replays are done."""
    import torch
    replay = {}
    replay["stock"], why = capture()
    if replay["stock"] is None:
        return None, why, set()
    handle = patch()
    try:
        replay["patched"], why = capture()
        if replay["patched"] is None:
            return None, why, set()
        clock.drain()
        windows = []
        for s in range(REPLAYS + 1):  # the first pair warms up
            for v in VARIANTS:
                t0 = clock.now()
                replay[v]()
                torch.cuda.synchronize()
                windows.append(Window(v, s, t0, clock.now()))
        records = clock.drain()  # sorted by start
    finally:
        handle.remove()
    starts = [r.start for r in records]
    per = defaultdict(dict)
    for w in windows:
        if w.sample:
            per[w.sample][w.path] = [(r.name, (r.end - r.start) / 1e3) for r in in_window(records, starts, w)]
    names = {name for pair in per.values() for name, _ in pair.get("stock", ())}
    if any(not k for pair in per.values() for k in pair.values()):
        return None, "CUPTI reported no kernel for a replay of the captured step", names
    return median_split([kernel_split(pair["stock"], pair["patched"]) for pair in per.values()]), "", names


def split_line(stock: dict[str, Any], patched: dict[str, Any]) -> str | None:
    """The terminal's line for the decode step's kernel split (rows of e2e.csv), or None without one."""
    if any(not isinstance(r.get("own_kernels_us"), (int, float)) for r in (stock, patched)):
        return None
    saved = stock["own_kernels_us"] - patched["own_kernels_us"]
    rest = patched["shared_kernels_us"] - stock["shared_kernels_us"]
    return (f"  decode-graph kernels: the changed linears {stock['own_kernels_us']:.0f} -> "
            f"{patched['own_kernels_us']:.0f} µs (saved {saved:.0f}), the rest {rest:+.0f} µs")
