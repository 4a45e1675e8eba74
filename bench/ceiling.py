"""(GPU) The memory ceilings a run measures on its own machine, and each cell's distance to them.

A linear at small M is a read of its weight. Its floor is the time the machine takes to stream the same bytes:
- the size-matched ceiling: the fastest of a few streaming-read kernels (Triton; one CTA per block, or persistent)
  over exactly the weight's bytes, cycling through enough copies that every read comes from HBM (copies_for),
  captured and replayed with the cells' own timer. A small read pays a ramp and a tail that a large one amortises,
  so this is the floor a kernel reading that weight alone can reach;
- the large-buffer ceiling: the same reads over a buffer far larger than L2 (the machine's sustained bandwidth).
The profile's nominal peak (hbm_peak_gbps) is shown beside them, never used as one.

Each results row then carries the bytes its cell moves (weight, activations and output, bf16), its achieved GB/s
and its share of both ceilings (`annotate`), from the per-call time the verdicts use (the span for a pdl kernel).
A share above 1 means some GEMM beat the reads: the read set is too weak and must be widened, never the figure
trimmed.
"""
from __future__ import annotations

import functools
from typing import Any

from bench.gpu import Operands, Replays, capture, replay_interleaved

LARGE_BUFFER_BYTES = 2 << 30  # 2 GiB: 30x an H200's L2, 16x a B200's
ROTATIONS = 8
# (kind, BLOCK, num_warps, CTAs per SM for a persistent read): the reads tried at every size
READS = (("blocks", 4096, 4, 0), ("blocks", 8192, 8, 0), ("blocks", 16384, 16, 0), ("persistent", 8192, 8, 4),
         ("persistent", 4096, 4, 8))
BYTES_PER_ELEMENT = 2


def cell_bytes(n: int, k: int, m: int) -> int:
    """What one call of an [M, K] x [N, K] linear reads and writes at least, in bf16: weight, input, output."""
    return (n * k + m * k + m * n) * BYTES_PER_ELEMENT


@functools.cache
def read_kernels():
    """The read kernels, made once per process (each new triton.jit function would compile afresh)."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_blocks(p, n, out, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(p + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
        tl.store(out + pid, tl.sum(x.to(tl.float32)))

    @triton.jit
    def read_persistent(p, n, out, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(pid * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(p + offs, mask=offs < n, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(out + pid, tl.sum(acc))
    return {"blocks": read_blocks, "persistent": read_persistent}


def read_name(read: tuple) -> str:
    kind, block, warps, per_sm = read
    return f"{kind}-b{block}-w{warps}" + (f"-x{per_sm}" if per_sm else "")


def _read_fn(read: tuple, elements: int, sms: int, out) -> Any:
    kind, block, warps, per_sm = read
    kernel = read_kernels()[kind]
    blocks = -(-elements // block)
    grid = (min(blocks, sms * per_sm) if per_sm else blocks,)

    def fn(x, w):
        kernel[grid](w, elements, out, BLOCK=block, num_warps=warps)
    return fn


def copies_for(nbytes: int, l2_bytes: int) -> int:
    """How many copies a read of `nbytes` cycles through so that every read comes from HBM: enough to hold three
    times L2 between two reads of one copy, at most ROTATIONS; one where a single copy is that large."""
    return max(1, min(ROTATIONS, -(-3 * l2_bytes // nbytes)))


def measure(clock, weight_bytes: list[int], samples: int = 10, replay_us: float = 2000.0) -> dict[str, Any]:
    """The ceilings of this machine: {"large_buffer": {...}, "size_matched": {str(bytes): {...}}}, each with the
    fastest read's median GPU µs per call, its GB/s and which read it was (every read's time kept too). A size whose
    copies do not fit in the free memory is recorded as skipped, with the reason, and its cells get no share."""
    import torch

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count

    def fastest(nbytes: int) -> dict[str, Any]:
        elements = nbytes // BYTES_PER_ELEMENT
        rotations = copies_for(nbytes, props.L2_cache_size)
        try:
            flat = torch.randn(rotations * elements, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(elements // 1024 + sms * 16 + 1, device="cuda", dtype=torch.float32)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return {"bytes": nbytes, "skipped": f"out of memory for {rotations} copies: {str(exc).splitlines()[0]}"}
        ws = [flat[i * elements:(i + 1) * elements] for i in range(rotations)]
        estimate_us = nbytes / 4e6  # at 4 TB/s: only to size the replay near replay_us
        calls = max(rotations, min(256, int(replay_us / estimate_us)))
        graphs = {read_name(r): capture(_read_fn(r, elements, sms, out), Operands(ws, ws), calls) for r in READS}
        timing = replay_interleaved(clock, graphs, Replays(calls, samples))
        times = {name: float(torch.tensor(t.gpu_us).median()) for name, t in timing.items() if t.gpu_us}
        del graphs, flat, ws, out
        torch.cuda.empty_cache()
        best = min(times, key=times.get)
        return {"bytes": nbytes, "copies": rotations, "gpu_us": round(times[best], 3),
                "gbps": round(nbytes / times[best] / 1e3, 1), "read": best,
                "reads_us": {k: round(v, 3) for k, v in sorted(times.items())}}
    return {"large_buffer": fastest(LARGE_BUFFER_BYTES),
            "size_matched": {str(b): fastest(b) for b in sorted(set(weight_bytes))},
            "method": f"the fastest of {len(READS)} streaming reads ({', '.join(read_name(r) for r in READS)}) over "
                      f"copies that hold 3x L2 between two reads of one (at most {ROTATIONS}), captured and replayed "
                      f"like the cells"}


def annotate(rows: list[dict[str, Any]], ceilings: dict[str, Any] | None) -> None:
    """Adds bytes, gbps and the shares of both ceilings to every ok row (in place)."""
    if not ceilings:
        return
    large = ceilings["large_buffer"].get("gbps")
    matched = ceilings.get("size_matched", {})
    by_cell = {(row.get("n"), row.get("k"), row.get("m"), row.get("path")): row for row in rows}
    for row in rows:
        if row.get("status") != "ok" or not row.get("gpu_us"):
            continue
        n, k, m = int(row["n"]), int(row["k"]), int(row["m"])
        nbytes = cell_bytes(n, k, m)
        # a pdl kernel overlaps the previous call, so its per-call time is the span of the calls (as the verdicts
        # read it: calibrate.analysis.Cells), not the sum of kernel durations; a row whose GPU time is a twin's
        # (gpu_from: the dispatcher where it ran that path's kernels) is read as that twin is
        twin = (by_cell.get((row.get("n"), row.get("k"), row.get("m"), row["gpu_from"])) if row.get("gpu_from")
                else None) or row
        per_call = float(row["span_us"]) if twin.get("pdl") is True and row.get("span_us") else float(row["gpu_us"])
        row["bytes"] = nbytes
        row["gbps"] = round(nbytes / per_call / 1e3, 1)
        if large:
            row["of_large_ceiling"] = round(row["gbps"] / large, 4)
        own = matched.get(str(n * k * BYTES_PER_ELEMENT))
        if own is not None and own.get("gpu_us"):
            row["of_ceiling"] = round(own["gpu_us"] / per_call, 4)


def forward_floor(shapes: list[tuple[int, int]], m: int, ceilings: dict[str, Any]) -> dict[str, Any]:
    """A forward's linears ([(n, k)] in order) at M against the limit: the bytes they move, their bandwidth floor (those
    bytes over the large-buffer ceiling), and the sum of their weights' size-matched ceilings (None where a size was
    not measured)."""
    nbytes = sum(cell_bytes(n, k, m) for n, k in shapes)
    matched = ceilings.get("size_matched", {})
    own = [matched.get(str(n * k * BYTES_PER_ELEMENT)) or {} for n, k in shapes]
    large = ceilings["large_buffer"].get("gbps")
    return {"bytes": nbytes, "floor_us": round(nbytes / large / 1e3, 3) if large else None,
            "ceiling_sum_us": round(sum(c["gpu_us"] for c in own), 3) if all(c.get("gpu_us") for c in own)
            else None}


def annotate_forward(rows: list[dict[str, Any]], shapes: list[tuple[int, int]], ceilings: dict[str, Any] | None
                     ) -> None:
    """Adds to every ok forward row its floor (forward_floor at its M) and the ratios of its time to it (in place)."""
    if not ceilings:
        return
    for row in rows:
        if row.get("status") != "ok" or not row.get("us"):
            continue
        floor = forward_floor(shapes, int(row["m"]), ceilings)
        row.update(floor)
        if floor["floor_us"]:
            row["over_floor"] = round(float(row["us"]) / floor["floor_us"], 4)
        if floor["ceiling_sum_us"]:
            row["over_ceiling_sum"] = round(float(row["us"]) / floor["ceiling_sum_us"], 4)
