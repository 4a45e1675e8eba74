"""A project-owned split-K GEMV for small M (Triton): y[M, N] = x[M, K] @ w[N, K].T in bf16 with fp32 accumulation.

At M <= 16 a linear is a streaming read of its weight. cuBLAS and TinyGEMM leave a small-N, large-K weight (o_proj,
down_proj) well short of the memory ceiling, because N / tile gives too few CTAs to keep every SM's loads in flight.
Splitting K gives each SM several independent slices. The partial sums are reduced inside the same kernel: each
(N tile, K split) program adds its fp32 partial into a workspace with an atomic add, and the last program of an N
tile (a per-tile arrival counter) reads the sum, writes the bf16 output and clears the workspace and counter for the
next call. One launch, no memset, no second reduce kernel, so the cost of a call is one kernel's.

The workspace and counters are cleared by the call that used them, so calls on one stream can share them (one per N
and configuration); two streams running at once must not.

A configuration is chosen per (N, K, M) by timing a short list of candidates (`candidates`: a few tile shapes, each
with the K split that gives two programs per SM, half that and twice that) in a CUDA graph over rotated operands,
as the sweep times the cells. The choices live in one process-wide store, like FlashInfer's autotuner: tuned in a
benchmark, saved beside its FlashInfer tactics (`<tactics>.gemv.json`), loaded by the dispatcher from its table's
file. The dispatcher never tunes: an (N, K, M) without a stored choice takes that shape's choice at the nearest
stored M above (else below), and a shape with none runs F.linear.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

# every configuration the kernel is written for: (BLOCK_N, BLOCK_K, SPLIT_K, num_warps); more than one row of x takes
# a tensor-core tile, which needs BLOCK_N >= 16 (takes(m)). tools/limit_probe.py tunes over all of them.
CONFIGS = tuple((bn, bk, sk, nw) for bn in (8, 16, 32, 64) for bk in (128, 256, 512) for sk in (1, 2, 4, 8, 16)
                for nw in (4, 8) if bn * bk <= 16384)
MAX_M = 16
# the tile shapes (BLOCK_N, BLOCK_K, num_warps) the tuner tries, for one row (CUDA cores) and for more (tensor cores)
TILES_ONE_ROW = ((8, 256, 4), (8, 512, 4), (16, 256, 4), (32, 128, 4), (64, 128, 4))
TILES_ROWS = ((16, 256, 4), (32, 128, 4), (32, 256, 4), (32, 256, 8), (64, 128, 4))
FILE_FORMAT = 1


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



def candidates(n: int, k: int, m: int, sms: int) -> list[GemvConfig]:
    """The configurations the tuner times at (N, K, M): each tile shape with the smallest power-of-two K split that
    gives at least two programs per SM, half that and twice that (a split's slice at least one BLOCK_K; 16 at
    most)."""
    out = []
    for bn, bk, nw in (TILES_ONE_ROW if m == 1 else TILES_ROWS):
        tiles, sk = -(-n // bn), 1
        while sk < 16 and tiles * sk < 2 * sms and bk * sk * 2 <= k:
            sk *= 2
        for split in dict.fromkeys((max(1, sk // 2), sk, sk * 2)):
            if split <= 16 and (split == 1 or bk * split <= k):
                out.append(GemvConfig(bn, bk, split, nw))
    return [c for c in out if c.takes(m)]


def time_config(config: GemvConfig, weights: list[Any], xs: list[Any], replays: int = 3) -> float:
    """µs per call of one configuration: a CUDA graph of calls cycling through the rotated copies (weights from HBM
    where the copies outgrow L2), CUDA events around each replay, the fastest replay."""
    import torch
    space = workspace_for(weights[0].shape[0], config, weights[0].device)
    gemvs = [Gemv(w, config, space) for w in weights]
    calls = max(len(gemvs), 16)

    def body() -> None:
        for i in range(calls):
            gemvs[i % len(gemvs)](xs[i % len(xs)])
    stream = torch.cuda.Stream()  # warm-up (Triton's compile) on a side stream, as a capture needs
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for g, x in zip(gemvs[:2], xs):
            g(x)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return min(replay_us(graph, calls, replays))


def replay_us(graph: Any, calls: int, replays: int) -> list[float]:
    """µs per call of each of `replays` replays of a captured graph of `calls` calls, CUDA events around each."""
    import torch
    out = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000 / calls)
    return out


def tune(weights: list[Any], xs: list[Any], configs: list[GemvConfig] | None = None) -> tuple[GemvConfig, float]:
    """(the fastest configuration, its µs per call) for these rotated copies of one weight and M, over `configs`
    (default: candidates). Eager timing of a Triton launch would measure the host, so each is timed in a graph."""
    import torch
    n, k = weights[0].shape
    m = xs[0].shape[0]
    sms = torch.cuda.get_device_properties(weights[0].device).multi_processor_count
    best, best_us = None, float("inf")
    for cfg in configs if configs is not None else candidates(n, k, m, sms):
        try:
            us = time_config(cfg, weights, xs)
        except Exception:  # a configuration Triton cannot build here is left out
            continue
        if us < best_us:
            best, best_us = cfg, us
    if best is None:
        raise ValueError(f"no GEMV configuration builds for {n} x {k} at M = {m}")
    return best, best_us


@dataclass
class _Store:
    """The process's configurations. `configs` is what the dispatcher runs and a benchmark saves: loaded from files,
    and tuned in a process that tunes (`tuning`). A process that serves stored ones (tuning off) still tunes a cell
    its benchmark path meets without one, into `local`: that path measures a real GEMV, and the dispatcher keeps
    running the served configurations (a served shape's other M take pinned(), as in the dispatcher)."""
    configs: dict[tuple[int, int, int], GemvConfig] = field(default_factory=dict)  # (N, K, M) -> configuration
    local: dict[tuple[int, int, int], GemvConfig] = field(default_factory=dict)
    tune_s: dict[tuple[int, int, int], float] = field(default_factory=dict)  # tuned here: seconds it took
    files: set[str] = field(default_factory=set)  # loaded files
    tuning: bool = True
    version: int = 0  # counts changes of `configs`: a call's remembered plan is rebuilt after one


STORE = _Store()


def pinned(n: int, k: int, m: int) -> GemvConfig | None:
    """The stored configuration for (N, K, M), else that shape's at the nearest stored M above (else below) that
    the configuration takes; None where the shape has none."""
    exact = STORE.configs.get((n, k, m))
    if exact is not None:
        return exact
    near = sorted((((mm < m, abs(mm - m)), c) for (nn, kk, mm), c in STORE.configs.items()
                   if nn == n and kk == k and c.takes(m)), key=lambda e: e[0])
    return near[0][1] if near else None


def to_json() -> dict[str, Any]:
    return {"format": FILE_FORMAT, "kind": "gemv-configs",
            "configs": [{"n": n, "k": k, "m": m, "block_n": c.block_n, "block_k": c.block_k, "split_k": c.split_k,
                         "num_warps": c.num_warps}
                        for (n, k, m), c in sorted(STORE.configs.items())]}


def parse(data: Any, where: str) -> dict[tuple[int, int, int], GemvConfig]:
    """A gemv-configs file's configurations; one clear error for anything else."""
    from harness.errors import HarnessError
    fix = "delete it and tune afresh (bench run --tune)"
    if not isinstance(data, dict) or data.get("kind") != "gemv-configs":
        raise HarnessError(f"{where} is not a GEMV configuration file (kind gemv-configs); {fix}")
    if isinstance(data.get("format"), bool) or data.get("format") != FILE_FORMAT:
        raise HarnessError(f"{where}: GEMV configuration format {data.get('format')!r} is not {FILE_FORMAT}, the one "
                           f"this harness reads; {fix}")
    out = {}
    keys = ("n", "k", "m", "block_n", "block_k", "split_k", "num_warps")
    for i, e in enumerate(data.get("configs") if isinstance(data.get("configs"), list) else [None]):
        if not isinstance(e, dict) or not all(isinstance(e.get(f), int) and not isinstance(e.get(f), bool)
                                              and e.get(f) > 0 for f in keys):
            raise HarnessError(f"{where}: configuration {i} needs positive integers {', '.join(keys)}; {fix}")
        cfg = GemvConfig(e["block_n"], e["block_k"], e["split_k"], e["num_warps"])
        if (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) not in CONFIGS or e["m"] > MAX_M \
                or not cfg.takes(e["m"]):
            raise HarnessError(f"{where}: configuration {i} ({cfg.key()} at M = {e['m']}) is not one the GEMV "
                               f"takes; {fix}")
        if (e["n"], e["k"], e["m"]) in out:
            raise HarnessError(f"{where}: configuration {i} is a second one for N = {e['n']}, K = {e['k']}, "
                               f"M = {e['m']}; one configuration a cell; {fix}")
        out[(e["n"], e["k"], e["m"])] = cfg
    return out


def load(path: Any) -> int:
    """Serves the configurations of a gemv-configs file (they replace stored ones of the same cells); how many."""
    from harness.io import read_json
    data = read_json(path, "GEMV configuration file", "delete it and tune afresh (bench run --tune)")
    configs = parse(data, str(path))
    STORE.configs.update(configs)
    STORE.files.add(str(path))
    STORE.version += 1
    return len(configs)


def save(path: Any) -> None:
    import json
    from harness.io import atomic_write_text
    atomic_write_text(path, json.dumps(to_json(), indent=1) + "\n")


def beside(tactics: Any) -> Any:
    """Where the GEMV configurations served with a FlashInfer tactics file live: <tactics stem>.gemv.json."""
    from pathlib import Path
    t = Path(tactics)
    return t.with_name(t.name.removesuffix(".json") + ".gemv.json")


class GemvCall:
    """(x, w, bias=None) -> y and .into(x, w, out) for any weight: the dispatcher's and the benchmark's call.
    tune=True (the benchmark) tunes an (N, K, M) the store lacks on first use (tune_for does it with rotated copies);
    tune=False (the dispatcher) takes pinned() and runs F.linear where the shape has no configuration, an M above
    MAX_M, or a bias. One workspace per (device, N, configuration), allocated outside any CUDA graph capture
    (prepare, at bind time; a capture that would need a new one runs F.linear instead, since memory allocated while
    capturing belongs to that graph). The Gemv of a call is made afresh (host work only): keeping one per weight
    would keep every weight alive."""

    def __init__(self, tune: bool = False):
        self.tune = tune
        self.workspaces: dict[tuple[int, int, GemvConfig], tuple[Any, Any]] = {}
        self.plans: dict[tuple[int, int, int, int], tuple] = {}  # (device, N, K, M) -> plan, at one STORE.version
        self.version = STORE.version
        self.fn = None  # the Triton kernel, on the first launch

    def config(self, n: int, k: int, m: int) -> GemvConfig | None:
        """The configuration a call at (N, K, M) runs (None: F.linear)."""
        if m > MAX_M:
            return None
        if not self.tune:
            return pinned(n, k, m)
        exact = STORE.configs.get((n, k, m)) or STORE.local.get((n, k, m))
        # a process that serves configurations runs a cell it lacks as the dispatcher would (pinned); one that tunes
        # tunes it
        return exact if exact is not None or STORE.tuning else pinned(n, k, m)

    def tune_for(self, weights: list[Any], xs: list[Any]) -> tuple[GemvConfig, float]:
        """Tunes (N, K, M) on these rotated copies and stores the choice; (configuration, seconds it took)."""
        import time
        t0 = time.perf_counter()
        cfg, _ = tune(weights, xs)
        n, k = weights[0].shape
        key = (n, k, xs[0].shape[0])
        (STORE.configs if STORE.tuning else STORE.local)[key] = cfg
        STORE.tune_s[key] = time.perf_counter() - t0
        STORE.version += 1
        return cfg, STORE.tune_s[key]

    def tunes_here(self, weights: list[Any], xs: list[Any]) -> float | None:
        """The benchmark's hook: tunes (N, K, M) on the cell's rotated copies where no configuration is stored;
        the seconds it took, or None where one was."""
        n, k = weights[0].shape
        if not self.tune or xs[0].shape[0] > MAX_M or self.config(n, k, xs[0].shape[0]) is not None:
            return None
        return round(self.tune_for(weights, xs)[1], 3)

    def choice_key(self, w: Any, x: Any) -> str:
        """The configuration's name a call runs (the results' fi_tactic), or F.linear."""
        cfg = self.config(w.shape[0], w.shape[1], x.shape[0])
        return cfg.key() if cfg is not None else "F.linear"

    def prepare(self, n: int, k: int, device: Any) -> None:
        """Plans every M of (N, K) on `device` ahead (at bind time), so that a first call inside a capture finds its
        workspace; nothing while capturing."""
        import torch
        if not torch.cuda.is_current_stream_capturing():
            index = torch.device(device).index
            for m in range(1, MAX_M + 1):
                self._make_plan(index, n, k, m, device, None, None)

    def _make_plan(self, index: int, n: int, k: int, m: int, device: Any, w: Any, x: Any) -> tuple | None:
        if self.version != STORE.version:
            self.plans.clear()
            self.version = STORE.version
        key = (index, n, k, m)
        if key in self.plans:
            return self.plans[key]
        cfg = self.config(n, k, m)
        if cfg is None and self.tune and w is not None:
            cfg = self.tune_for([w], [x])[0]
        if cfg is None:
            return None
        space = self.workspaces.get((index, n, cfg))
        if space is None:
            space = self.workspaces[(index, n, cfg)] = workspace_for(n, cfg, device)
        plan = self.plans[key] = (cfg, space, -(-n // cfg.block_n))
        return plan

    def _plan(self, x: Any, w: Any) -> tuple | None:
        """(configuration, workspace, tiles) of a call, remembered per (device, N, K, M); None: F.linear."""
        m = x.shape[0]
        n, k = w.shape
        plan = self.plans.get((w.get_device(), n, k, m)) if self.version == STORE.version else None
        if plan is not None:
            return plan
        import torch
        if m > MAX_M or w.dtype != torch.bfloat16 or w.stride(1) != 1 or torch.cuda.is_current_stream_capturing():
            return None  # nothing is tuned or allocated while a graph is captured
        return self._make_plan(w.get_device(), n, k, m, w.device, w, x)

    def _run(self, x: Any, w: Any, y: Any, plan: tuple) -> None:
        c, (acc, count), tiles = plan
        m, k = x.shape
        if self.fn is None:
            self.fn = kernel()
        self.fn[(tiles, c.split_k)](x, w, y, acc, count, m, w.shape[0], k, x.stride(0), w.stride(0), y.stride(0),
                                    M_PAD=1 if m == 1 else MAX_M, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                                    SPLIT_K=c.split_k, num_warps=c.num_warps)

    def __call__(self, x: Any, w: Any, bias: Any = None) -> Any:
        plan = self._plan(x, w) if bias is None and x.stride(-1) == 1 else None
        if plan is None:
            import torch.nn.functional as F
            return F.linear(x, w, bias)
        y = x.new_empty((x.shape[0], w.shape[0]))
        self._run(x, w, y, plan)
        return y

    def into(self, x: Any, w: Any, out: Any) -> None:
        plan = self._plan(x, w) if x.stride(-1) == 1 else None
        if plan is None:
            import torch
            torch.mm(x, w.t(), out=out)
        else:
            self._run(x, w, out, plan)
