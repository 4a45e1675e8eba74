"""A project-owned split-K GEMV for small M (Triton): y[M, N] = x[M, K] @ w[N, K].T in bf16 with fp32 accumulation.

At M <= 16 a linear is a streaming read of its weight. cuBLAS and TinyGEMM leave a small-N, large-K weight (o_proj,
down_proj) well short of the memory ceiling, because N / tile gives too few CTAs to keep every SM's loads in flight.
Splitting K gives each SM several independent slices. The partial sums are reduced inside the same kernel: each
(N tile, K split) program adds its fp32 partial into a workspace with an atomic add, and the last program of an N
tile (a per-tile arrival counter) reads the sum, writes the bf16 output and clears the workspace and counter for the
next call. One launch, no memset, no second reduce kernel, so the cost of a call is one kernel's.

The workspace and counters are cleared by the call that used them, so calls on one stream can share them (one per N
and configuration); two streams running at once must not.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

# the configurations the tuner tries: (BLOCK_N, BLOCK_K, SPLIT_K, num_warps); more than one row of x takes a
# tensor-core tile, which needs BLOCK_N >= 16 (takes(m))
CONFIGS = tuple((bn, bk, sk, nw) for bn in (8, 16, 32, 64) for bk in (128, 256, 512) for sk in (1, 2, 4, 8, 16)
                for nw in (4, 8) if bn * bk <= 16384)
MAX_M = 16


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int

    def takes(self, m: int) -> bool:
        return m == 1 or self.block_n >= 16

    def key(self) -> str:
        return f"bn{self.block_n}_bk{self.block_k}_sk{self.split_k}_w{self.num_warps}"


@functools.cache
def kernel():
    """The Triton kernel, made once per process."""
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_splitk(x_ptr, w_ptr, y_ptr, acc_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, M_PAD)
        k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_lo = pid_k * k_per
        acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, k_per, BLOCK_K):
            rk = k_lo + k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :],
                        mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0, eviction_policy="evict_first")
            if M_PAD == 1:  # one row: a broadcast product summed over K on the CUDA cores
                xm = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
                acc += tl.sum(w.to(tl.float32) * xm[None, :], axis=1)[None, :]
            else:  # up to 16 rows: one tensor-core tile, the rows past M masked to zero
                x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                            mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
                acc += tl.dot(x, tl.trans(w))
        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        if SPLIT_K == 1:
            tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(tl.bfloat16), mask=out_mask)
        else:
            part = acc_ptr + rm[:, None] * N + rn[None, :]
            tl.atomic_add(part, acc, mask=out_mask, sem="relaxed")
            tl.debug_barrier()  # every thread's partial is in before the tile's counter says so
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:  # the last split of this N tile: the sum is complete
                total = tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], total.to(tl.bfloat16), mask=out_mask)
                tl.store(part, tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32), mask=out_mask)
                tl.store(count_ptr + pid_n, 0)
    return gemv_splitk


def workspace_for(n: int, config: GemvConfig, device: Any) -> tuple[Any, Any]:
    import torch
    return (torch.zeros(MAX_M * n, device=device, dtype=torch.float32),
            torch.zeros(-(-n // config.block_n), device=device, dtype=torch.int32))


class Gemv:
    """The split-K GEMV bound to one weight [N, K] (bf16, contiguous rows) and one configuration: call(x) -> y."""

    def __init__(self, weight: Any, config: GemvConfig, workspace: tuple[Any, Any] | None = None):
        """workspace: (fp32 partial sums, int32 tile counters) to share with other weights of the same N and
        configuration on the same stream (each call leaves them cleared); None allocates them here."""
        import torch
        if weight.dim() != 2 or weight.dtype != torch.bfloat16 or weight.stride(1) != 1:
            raise ValueError("the GEMV takes a 2-D bf16 weight with contiguous rows")
        self.weight, self.config = weight, config
        n = weight.shape[0]
        self.tiles = -(-n // config.block_n)
        self.acc, self.count = workspace if workspace is not None else workspace_for(n, config, weight.device)
        self.fn = kernel()

    def __call__(self, x: Any, out: Any | None = None) -> Any:
        import torch
        m, k = x.shape
        n = self.weight.shape[0]
        if m > MAX_M or k != self.weight.shape[1] or x.stride(1) != 1 or not self.config.takes(m):
            raise ValueError(f"the GEMV takes M <= {MAX_M} rows of K = {self.weight.shape[1]} contiguous elements")
        y = out if out is not None else torch.empty((m, n), device=x.device, dtype=torch.bfloat16)
        c = self.config
        self.fn[(self.tiles, c.split_k)](x, self.weight, y, self.acc, self.count, m, n, k, x.stride(0),
                                        self.weight.stride(0), y.stride(0), M_PAD=1 if m == 1 else MAX_M,
                                        BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=c.split_k,
                                        num_warps=c.num_warps)
        return y


def tune(weight: Any, x: Any, configs=CONFIGS) -> GemvConfig:
    """The fastest configuration for this weight and M, each timed by triton.testing.do_bench_cudagraph (a CUDA graph
    of repeated calls): eager timing of a Triton launch measures the host, not the kernel."""
    from triton.testing import do_bench_cudagraph
    m, k = x.shape
    best, best_ms = None, float("inf")
    for c in configs:
        cfg = GemvConfig(*c)
        if not cfg.takes(m) or cfg.block_k * cfg.split_k > 2 * k:
            continue
        gemv = Gemv(weight, cfg)
        try:
            ms = do_bench_cudagraph(lambda: gemv(x), rep=5)
        except Exception:  # a configuration Triton cannot build here is left out
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    if best is None:
        raise ValueError(f"no GEMV configuration builds for {tuple(weight.shape)} at M = {m}")
    return best


class TunedGemv:
    """(x, w) -> y for any weight: its configuration tuned once per (N, K, M) on first use (configs: (N, K, M) ->
    GemvConfig, which a caller may fill from a stored file instead), one workspace per N and configuration. The
    Gemv of a call is made afresh (host work only): keeping one per weight would keep every weight alive."""

    def __init__(self, configs: dict[tuple[int, int, int], GemvConfig] | None = None):
        self.configs = dict(configs or {})
        self.workspaces: dict[tuple[int, GemvConfig], tuple[Any, Any]] = {}

    def __call__(self, x: Any, weight: Any) -> Any:
        """One call; a new weight of a known (N, K, M) allocates nothing (it may run inside a graph capture)."""
        key = (weight.shape[0], weight.shape[1], x.shape[0])
        cfg = self.configs.get(key)
        if cfg is None:
            cfg = self.configs[key] = tune(weight, x)
        space = self.workspaces.get((weight.shape[0], cfg))
        if space is None:
            space = self.workspaces[(weight.shape[0], cfg)] = workspace_for(weight.shape[0], cfg, weight.device)
        return Gemv(weight, cfg, space)(x)
