"""(GPU) The GEMV as stream-K, for the structure probe (tools/probes/gemv_variants, family `streamk`).

A launch of one program per SM (or two) splits the weight's (N tile, K step) iterations into equal contiguous
shares, so every SM streams the same bytes and none waits on a partial last wave (a 160-tile weight on 132 SMs runs
a second wave of 28 tiles; why that matters: docs/design.md, "Stream-K, built and not yet timed"). A share runs as one flat loop, pipelined STAGES deep across its
tile boundaries. A tile whole in one share is stored; a tile two or more shares cut is summed by the last of them to
arrive, in program order, from one fp32 slot per (program, its first or last tile): the same sum whatever the order
the programs finish in. Where the iterations are few, fewer programs run, so that every share holds one or more
(gemv_variants.streamk_programs; the plan's arithmetic is tested there without Triton).

Triton is imported here at module level: kernels defined at the top level run in Triton's interpreter on a CPU
(TRITON_INTERPRET=1 before Triton is imported), which is how tests/test_probe_gemv_streamk.py checks them against
fp32 without a GPU."""
from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M: tl.constexpr):
    """acc + x's TILE_M rows (the rows past M zero) times one weight tile w [BLOCK_N, BLOCK_K] at K offsets rk:
    the 16-row tensor-core tile or one row on the CUDA cores (the probe's `gemv_tile` and `gemv_pipe` call it too)."""
    tl.static_assert((TILE_M == 1) | (TILE_M == 16))
    if TILE_M == 16:
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                    other=0.0)
        acc += tl.dot(x, tl.trans(w))
    else:
        xi = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * xi[None, :], axis=1)[None, :]
    return acc


@triton.jit
def _slot(part_ptr, program, tile, k_iters, total, offs, PROGRAMS: tl.constexpr, TILE_M: tl.constexpr,
          BLOCK_N: tl.constexpr):
    """Where `program` keeps its partial of `tile`: slot 0 of its two for its share's first tile, slot 1 for its
    last."""
    which = (tile != (program * total // PROGRAMS) // k_iters).to(tl.int32)
    return part_ptr + (program * 2 + which) * (TILE_M * BLOCK_N) + offs


@triton.jit
def _arrive(y_ptr, part_ptr, count_ptr, tile, k_iters, total, rm, offs, M, N, stride_ym, PROGRAMS: tl.constexpr,
            TILE_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This share's partial of a tile it cuts is in its slot: the tile's last share to arrive sums every share's
    slot in program order (the same sum whatever the order they arrive in), stores the tile and zeroes its
    counter for the next call."""
    first_p = ((tile * k_iters + 1) * PROGRAMS - 1) // total  # the share holding the tile's first iteration
    last_p = ((tile + 1) * k_iters * PROGRAMS - 1) // total  # and its last
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if arrived == last_p - first_p:
        whole = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
        for q in range(first_p, last_p + 1):
            whole += tl.load(_slot(part_ptr, q, tile, k_iters, total, offs, PROGRAMS, TILE_M, BLOCK_N),
                             cache_modifier=".cg")
        rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], whole.to(tl.bfloat16),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
        tl.store(count_ptr + tile, 0)


@triton.jit
def gemv_streamk(x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 PROGRAMS: tl.constexpr, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K]^T, program pid streaming iterations [pid * T / P, (pid + 1) * T / P) of the
    T = N tiles x K steps, N tile by N tile, K step by K step. Inside the loop only plain stores (a tile whole in
    the share to y, a cut one to the program's slot), which Triton's pipeliner takes; the cut tiles, at most the
    share's first and last, are summed after it."""
    pid = tl.program_id(0)
    k_iters = tl.cdiv(K, BLOCK_K)
    total = tl.cdiv(N, BLOCK_N) * k_iters
    start = pid * total // PROGRAMS
    end = (pid + 1) * total // PROGRAMS
    rm = tl.arange(0, TILE_M)
    offs = rm[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    acc = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
    for it in tl.range(start, end, num_stages=STAGES):
        tile = it // k_iters
        step = it - tile * k_iters
        rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = step * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K),
                    other=0.0, eviction_policy="evict_first")
        acc = tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M)
        if (step == k_iters - 1) | (it == end - 1):
            if (tile * k_iters >= start) & ((tile + 1) * k_iters <= end):
                tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(tl.bfloat16),
                         mask=(rm[:, None] < M) & (rn[None, :] < N))
            else:
                tl.store(_slot(part_ptr, pid, tile, k_iters, total, offs, PROGRAMS, TILE_M, BLOCK_N), acc)
            acc = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
    tl.debug_barrier()  # every thread's partials are written before a counter says so
    first_tile = start // k_iters
    last_tile = (end - 1) // k_iters
    if (first_tile * k_iters < start) | ((first_tile + 1) * k_iters > end):
        _arrive(y_ptr, part_ptr, count_ptr, first_tile, k_iters, total, rm, offs, M, N, stride_ym, PROGRAMS,
                TILE_M, BLOCK_N)
    if (last_tile != first_tile) & ((last_tile + 1) * k_iters > end):
        _arrive(y_ptr, part_ptr, count_ptr, last_tile, k_iters, total, rm, offs, M, N, stride_ym, PROGRAMS,
                TILE_M, BLOCK_N)


def workspace(programs: int, tile_m: int, block_n: int, n: int, device: Any) -> tuple[Any, Any]:
    """(fp32 slots: two [tile_m, block_n] per program, int32 arrival counters: one per N tile, zero); a call
    leaves the counters at zero for the next."""
    import torch
    return (torch.empty(programs * 2 * tile_m * block_n, device=device, dtype=torch.float32),
            torch.zeros(-(-n // block_n), device=device, dtype=torch.int32))


def launch(x: Any, w: Any, y: Any, space: tuple[Any, Any], programs: int, tile_m: int, block_n: int,
           block_k: int, num_warps: int, stages: int) -> None:
    """One stream-K launch into y (x [M, K], w [N, K], y [M, N]); `programs` as planned by
    gemv_variants.streamk_programs (no more than the iterations)."""
    m, k = x.shape
    n = w.shape[0]
    gemv_streamk[(programs,)](x, w, y, space[0], space[1], m, n, k, x.stride(0), w.stride(0), y.stride(0),
                              PROGRAMS=programs, TILE_M=tile_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
                              num_warps=num_warps, num_stages=stages)
