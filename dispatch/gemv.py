"""A project-owned split-K GEMV for small M (Triton): y[M, N] = x[M, K] @ w[N, K].T in bf16 with fp32 accumulation.

At M <= 16 a linear is a streaming read of its weight. cuBLAS and TinyGEMM leave a small-N, large-K weight (o_proj,
down_proj) well short of the memory ceiling, because N / tile gives too few CTAs to keep every SM's loads in flight.
Splitting K gives each SM several independent slices. A configuration's tile holds `tile_m` rows of x: one row (a
broadcast product on the CUDA cores), 2, 4 or 8 rows (a loop over the rows on the CUDA cores: the weight tile is read
once and used for each row) or 16 rows (one tensor-core tile, the rows past M masked).

Deterministic: each (N tile, K split) program writes its fp32 partial into a slot of its own, and the last program of
an N tile to arrive (a per-tile arrival counter) sums the slots in split order, 0 to SPLIT_K - 1, writes the bf16
output and resets the counter. One launch, no memset, no second reduce kernel, and the output is bitwise the same for
a given (N, K, M, configuration) whatever order the splits arrive in.

Stream-safe: a split call's workspace (the slots and the counters) is never shared by calls that may run at once. Each
(device, stream, N, configuration) has its own, made outside any CUDA graph capture: on a stream's first eager call,
or ahead at bind time for the current stream, torch.cuda.graph's default capture stream and the streams named to
dispatch.serve_streams. A capture on a stream without one runs F.linear there and says so once. Graphs captured on
one stream share its workspaces: replay them one at a time, or capture each on a stream of its own.

A configuration is chosen per (N, K, M) by timing a short list of candidates (`candidates`: a few tile shapes, each
with the K split that gives two programs per SM, half that and twice that) in a CUDA graph over rotated operands,
as the sweep times the cells. On SM90 and newer the fastest is timed again launched with programmatic dependent
launch (PDL: its first weight loads overlap the kernel before it) and keeps PDL where that is faster by more than
PDL_MIN_GAIN; the configuration then launches so wherever it runs, the dispatcher included. The choices live in one
process-wide store, like FlashInfer's autotuner: tuned in a benchmark, saved beside its FlashInfer tactics
(`<tactics>.gemv.json`), loaded by the dispatcher from its table's file. The dispatcher never tunes: an (N, K, M)
without a stored choice takes that shape's choice at the nearest stored M above (else below), and a shape with none
runs F.linear.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from dispatch.lean import warn_once
from harness.errors import HarnessError
from harness.io import atomic_write_text, is_count, read_json

MAX_M = 16
TILE_MS = (1, 2, 4, 8, 16)  # the rows a tile holds: 1, 2-8 on the CUDA cores, 16 a tensor-core tile
# every configuration the kernel is written for: (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, tile_m); a 16-row tile is a
# tensor-core tile, which needs BLOCK_N >= 16; a 2-8 row tile loops over its rows. tools/probes/limit.py tunes over all
CONFIGS = tuple((bn, bk, sk, nw, tm) for tm in TILE_MS for bn in (8, 16, 32, 64) for bk in (128, 256, 512)
                for sk in (1, 2, 4, 8, 16) for nw in (4, 8) if bn * bk <= 16384 and (tm != 16 or bn >= 16))
# the tile shapes (BLOCK_N, BLOCK_K, num_warps) the tuner tries: for one row, for 2-8 rows on the CUDA cores, and for
# a 16-row tensor-core tile (tried at every M above 1)
TILES_ONE_ROW = ((8, 256, 4), (8, 512, 4), (16, 256, 4), (32, 128, 4), (64, 128, 4))
TILES_FEW_ROWS = ((8, 256, 4), (16, 256, 4), (32, 128, 4), (16, 512, 8))
TILES_ROWS = ((16, 256, 4), (32, 128, 4), (32, 256, 4), (32, 256, 8), (64, 128, 4))
KERNEL_NAME = "gemv_splitk"  # the kernel's name in a profiler's records: a captured GEMV call runs this and nothing else
# 3: each configuration says whether it launches with PDL; 2: names its tile_m; 1: one row at M = 1, else a 16-row
# tile (1 and 2 are read as well, their configurations launched plainly)
FILE_FORMAT = 3
FORMATS = (1, 2, 3)
# the tuner keeps PDL for a configuration only where its calls back to back take less than this share of the time
# below the plain launch's: a PDL launch overlaps the kernel before it, which its own timing of one weight's calls
# back to back can only approximate for a forward, where the kernel before it is another linear's
PDL_MIN_GAIN = 0.02
PDL_MIN_SM = 9  # programmatic dependent launch needs SM90 or newer


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    tile_m: int = 16  # rows a tile holds (TILE_MS)
    pdl: bool = False  # every launch a programmatic dependent launch (the tuner's choice per (N, K, M))

    def takes(self, m: int) -> bool:
        return m == 1 if self.tile_m == 1 else m <= self.tile_m

    def key(self) -> str:
        return (f"bn{self.block_n}_bk{self.block_k}_sk{self.split_k}_w{self.num_warps}_r{self.tile_m}"
                + ("_pdl" if self.pdl else ""))

    def astuple(self) -> tuple[int, int, int, int, int]:
        return self.block_n, self.block_k, self.split_k, self.num_warps, self.tile_m


def tile_rows(m: int) -> int:
    """The fewest rows of TILE_MS that hold m rows: the tile a CUDA-core configuration for M = m runs."""
    return next(t for t in TILE_MS if t >= m)


@functools.cache
def epilogue():
    """The split-K epilogue every GEMV product ends in (tools/probes/gemv_variants.py's too): unsplit, the tile
    stored; split, each split its own fp32 slot and the tile's last split to arrive sums them in split order (the
    same sum whatever the arrival order), then sets the tile's counter back to zero for the next call."""
    import triton
    import triton.language as tl

    @triton.jit
    def store_result(acc, y_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, rn, M, N, stride_ym,
                     TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        if SPLIT_K == 1:
            tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(tl.bfloat16), mask=out_mask)
        else:
            slot = rm[:, None] * N + rn[None, :]
            tl.store(part_ptr + pid_k * (TILE_M * N) + slot, acc, mask=out_mask)
            tl.debug_barrier()  # every thread's partial is written before the tile's counter says so
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                total = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    total += tl.load(part_ptr + s * (TILE_M * N) + slot, mask=out_mask, other=0.0,
                                     cache_modifier=".cg")
                tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], total.to(tl.bfloat16), mask=out_mask)
                tl.store(count_ptr + pid_n, 0)
    return store_result


@functools.cache
def kernel():
    """The Triton kernel, made once per process."""
    import triton
    import triton.language as tl
    store_result = epilogue()

    @triton.jit
    def tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M: tl.constexpr):
        """acc + the tile's rows of x times one weight tile w [BLOCK_N, BLOCK_K] (K offsets rk)."""
        if TILE_M == 16:  # a tensor-core tile, the rows past M masked to zero
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            acc += tl.dot(x, tl.trans(w))
        else:  # CUDA cores: the weight tile converted once, a broadcast product summed over K for each row
            wf = w.to(tl.float32)
            for i in tl.static_range(TILE_M):
                xi = tl.load(x_ptr + i * stride_xm + rk, mask=(rk < K) & (i < M), other=0.0).to(tl.float32)
                row = tl.sum(wf * xi[None, :], axis=1)
                acc += tl.where(rm[:, None] == i, row[None, :], 0.0)
        return acc

    @triton.jit
    def gemv_splitk(x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K, k_per, stride_xm, stride_wn, stride_ym,
                    TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                    USE_PDL: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, TILE_M)
        k_lo = pid_k * k_per  # each split's slice of K, whole BLOCK_Ks
        acc = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
        if USE_PDL:
            # launched early beside the kernel before it (programmatic dependent launch): the first weight tile is
            # loaded (no kernel writes weights) before waiting for that kernel's writes; x, y and the workspace are
            # touched only after the wait. Then the next kernel may launch and load its own weights.
            rk = k_lo + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :],
                        mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0, eviction_policy="evict_first")
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
            acc = tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M)
            first = BLOCK_K
        else:
            first = 0
        for k0 in range(first, k_per, BLOCK_K):
            rk = k_lo + k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :],
                        mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0, eviction_policy="evict_first")
            acc = tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M)
        store_result(acc, y_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, rn, M, N, stride_ym, TILE_M, BLOCK_N, SPLIT_K)
    return gemv_splitk


def workspace_for(n: int, config: GemvConfig, device: Any) -> tuple[Any, Any]:
    """(fp32 slots: one [tile_m, N] block per split, int32 arrival counters: one per N tile, zero); a call leaves
    the counters at zero for the next. An unsplit configuration needs none (empty tensors)."""
    import torch
    slots = config.split_k * config.tile_m * n if config.split_k > 1 else 0
    tiles = -(-n // config.block_n) if config.split_k > 1 else 0
    return (torch.empty(slots, device=device, dtype=torch.float32),
            torch.zeros(tiles, device=device, dtype=torch.int32))


def launch(fn: Any, x: Any, w: Any, y: Any, space: tuple[Any, Any], c: GemvConfig, pdl: bool | None = None) -> None:
    """One GEMV launch of configuration c into y (x [M, K], w [N, K], y [M, N]; space from workspace_for); as a
    programmatic dependent launch (SM90 and newer, its weight loads overlapping the kernel before it) where pdl says
    so, or, pdl None, where the configuration does."""
    m, k = x.shape
    n = w.shape[0]
    grid, ints, options = arguments(m, n, k, c, pdl, (x.stride(0), w.stride(0), y.stride(0)))
    fn[grid](x, w, y, space[0], space[1], *ints, **options)


def arguments(m: int, n: int, k: int, c: GemvConfig, pdl: bool | None, strides: tuple[int, int, int]
              ) -> tuple[tuple[int, int], tuple[int, ...], dict[str, Any]]:
    """(grid, the integer arguments after the five pointers, the keyword options) of a launch at (M, N, K) with
    configuration c; strides: (x, w, y) row strides. The one description of a launch, for launch and precompile."""
    pdl = c.pdl if pdl is None else pdl
    k_per = -(-(-(-k // c.split_k)) // c.block_k) * c.block_k
    options = dict(TILE_M=c.tile_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=c.split_k, USE_PDL=pdl,
                   num_warps=c.num_warps, **({"launch_pdl": True} if pdl else {}))
    return (-(-n // c.block_n), c.split_k), (m, n, k, k_per, *strides), options


class Gemv:
    """The split-K GEMV bound to one weight [N, K] (bf16, contiguous rows), one configuration and one workspace (its
    calls run on one stream at a time): call(x) -> y."""

    def __init__(self, weight: Any, config: GemvConfig, workspace: tuple[Any, Any] | None = None):
        """workspace: (slots, counters) to share with other weights of the same N and configuration on the same
        stream; None allocates them here."""
        import torch
        if weight.dim() != 2 or weight.dtype != torch.bfloat16 or weight.stride(1) != 1:
            raise ValueError("the GEMV takes a 2-D bf16 weight with contiguous rows")
        if config.astuple() not in CONFIGS:
            raise ValueError(f"{config.key()} is not a configuration the GEMV is written for")
        self.weight, self.config = weight, config
        self.space = workspace if workspace is not None else workspace_for(weight.shape[0], config, weight.device)
        self.fn = kernel()

    def __call__(self, x: Any, out: Any | None = None) -> Any:
        import torch
        m, k = x.shape
        if m > MAX_M or k != self.weight.shape[1] or x.stride(1) != 1 or not self.config.takes(m):
            raise ValueError(f"the GEMV ({self.config.key()}) takes M <= {self.config.tile_m} rows of K = "
                             f"{self.weight.shape[1]} contiguous elements")
        y = out if out is not None else torch.empty((m, self.weight.shape[0]), device=x.device, dtype=torch.bfloat16)
        launch(self.fn, x, self.weight, y, self.space, self.config)
        return y


def candidates(n: int, k: int, m: int, sms: int) -> list[GemvConfig]:
    """The configurations the tuner times at (N, K, M): each tile shape (one row at M = 1; at M = 2-8 the CUDA-core
    tile of the fewest rows that holds M and the 16-row tensor-core tiles; above, the tensor-core tiles) with the
    smallest power-of-two K split that gives at least two programs per SM, half that and twice that (a split's slice
    at least one BLOCK_K; 16 at most)."""
    tiles = ([(t, 1) for t in TILES_ONE_ROW] if m == 1 else
             [(t, tile_rows(m)) for t in TILES_FEW_ROWS if m <= 8] + [(t, 16) for t in TILES_ROWS])
    out = []
    for (bn, bk, nw), rows in tiles:
        count, sk = -(-n // bn), 1
        while sk < 16 and count * sk < 2 * sms and bk * sk * 2 <= k:
            sk *= 2
        for split in dict.fromkeys((max(1, sk // 2), sk, sk * 2)):
            if split <= 16 and (split == 1 or bk * split <= k):
                out.append(GemvConfig(bn, bk, split, nw, rows))
    return [c for c in out if c.takes(m) and c.astuple() in CONFIGS]


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
    (default: candidates, the fastest then launched with PDL where that is faster: with_pdl_if_faster). Eager timing
    of a Triton launch would measure the host, so each is timed in a graph."""
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
    if configs is None and torch.cuda.get_device_capability(weights[0].device)[0] >= PDL_MIN_SM:
        best, best_us = with_pdl_if_faster(best, best_us, weights, xs)
    return best, best_us


def with_pdl_if_faster(best: GemvConfig, best_us: float, weights: list[Any], xs: list[Any]) -> tuple[GemvConfig, float]:
    """The tuned configuration launched with PDL where its calls back to back take less than (1 - PDL_MIN_GAIN) of
    the plain launch's time, else as it was; (configuration, its µs per call)."""
    from dataclasses import replace
    chained = replace(best, pdl=True)
    try:
        us = time_config(chained, weights, xs)
    except Exception:  # a launch this Triton or driver cannot make with PDL: the plain one
        return best, best_us
    return (chained, us) if us < best_us * (1 - PDL_MIN_GAIN) else (best, best_us)


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
                         "num_warps": c.num_warps, "tile_m": c.tile_m, "pdl": c.pdl}
                        for (n, k, m), c in sorted(STORE.configs.items())]}


def parse(data: Any, where: str) -> dict[tuple[int, int, int], GemvConfig]:
    """A gemv-configs file's configurations; one clear error for anything else. A format 1 file (no tile_m) ran one
    row at M = 1 and a 16-row tile above; formats 1 and 2 (no pdl) launched every configuration plainly."""
    fix = "delete it and tune afresh (bench run --tune)"
    if not isinstance(data, dict) or data.get("kind") != "gemv-configs":
        raise HarnessError(f"{where} is not a GEMV configuration file (kind gemv-configs); {fix}")
    fmt = data.get("format")
    if isinstance(fmt, bool) or fmt not in FORMATS:
        raise HarnessError(f"{where}: GEMV configuration format {fmt!r} is not one this harness reads "
                           f"({', '.join(map(str, FORMATS))}); {fix}")
    out = {}
    keys = ("n", "k", "m", "block_n", "block_k", "split_k", "num_warps", *(("tile_m",) if fmt >= 2 else ()))
    for i, e in enumerate(data.get("configs") if isinstance(data.get("configs"), list) else [None]):
        if not isinstance(e, dict) or not all(is_count(e.get(f)) for f in keys):
            raise HarnessError(f"{where}: configuration {i} needs positive integers {', '.join(keys)}; {fix}")
        if fmt >= 3 and not isinstance(e.get("pdl"), bool):
            raise HarnessError(f"{where}: configuration {i} needs pdl, true or false; {fix}")
        rows = e["tile_m"] if fmt >= 2 else 1 if e["m"] == 1 else 16
        cfg = GemvConfig(e["block_n"], e["block_k"], e["split_k"], e["num_warps"], rows, e.get("pdl", False) is True)
        if cfg.astuple() not in CONFIGS or e["m"] > MAX_M or not cfg.takes(e["m"]):
            raise HarnessError(f"{where}: configuration {i} ({cfg.key()} at M = {e['m']}) is not one the GEMV "
                               f"takes; {fix}")
        if (e["n"], e["k"], e["m"]) in out:
            raise HarnessError(f"{where}: configuration {i} is a second one for N = {e['n']}, K = {e['k']}, "
                               f"M = {e['m']}; one configuration a cell; {fix}")
        out[(e["n"], e["k"], e["m"])] = cfg
    return out


def read(path: Any) -> dict[tuple[int, int, int], GemvConfig]:
    """A gemv-configs file's configurations, read and checked without serving them; one clear error otherwise."""
    return parse(read_json(path, "GEMV configuration file", "delete it and tune afresh (bench run --tune)"), str(path))


def load(path: Any) -> int:
    """Serves the configurations of a gemv-configs file (they replace stored ones of the same cells); how many."""
    configs = read(path)
    STORE.configs.update(configs)
    STORE.files.add(str(path))
    STORE.version += 1
    return len(configs)


def save(path: Any) -> None:
    import json
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
    MAX_M, or a bias; pdl None launches each call as its configuration says, True every call as a programmatic
    dependent launch, False every call plainly. A split configuration's workspace is per (device, stream, N,
    configuration): made ahead by prepare (at bind time), or at the first eager call on any stream, for that stream
    and the streams a capture may use (capture_streams); a capture on a stream without one runs F.linear there (memory
    allocated while capturing would belong to that graph) and says so once.
    The Gemv of a call is made afresh (host work only): keeping one per weight would keep every weight alive."""

    def __init__(self, tune: bool = False, pdl: bool | None = None):
        self.tune = tune
        self.pdl = pdl  # True / False: every launch with / without PDL; None: as the configuration says (launch())
        self.workspaces: dict[tuple[int, int, int, GemvConfig], tuple[Any, Any]] = {}  # (device, stream, N, config)
        self.plans: dict[tuple[int, int, int, int], GemvConfig] = {}  # (device, N, K, M), at one STORE.version
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

    def launches_pdl(self, n: int, k: int, m: int) -> bool:
        """Whether a call at (N, K, M) launches with PDL: this call's pdl where set, else its configuration's (False
        where it runs F.linear)."""
        cfg = self.config(n, k, m)
        return cfg is not None and (cfg.pdl if self.pdl is None else self.pdl)

    def choice_key(self, w: Any, x: Any) -> str:
        """The configuration's name a call runs (the results' fi_tactic), or F.linear."""
        cfg = self.config(w.shape[0], w.shape[1], x.shape[0])
        return cfg.key() if cfg is not None else "F.linear"

    def prepare(self, n: int, k: int, device: Any) -> None:
        """Plans every M of (N, K) on `device` ahead (at bind time) and makes the split configurations' workspaces
        for the streams a capture may use (capture_streams), so that a first call inside a capture finds them;
        nothing while capturing."""
        import torch
        if torch.cuda.is_current_stream_capturing():
            return
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        for m in range(1, MAX_M + 1):
            cfg = self._make_plan(index, n, k, m, None, None)
            if cfg is not None and cfg.split_k > 1:
                self._make_spaces(index, n, cfg, device)

    def _make_spaces(self, index: int, n: int, cfg: GemvConfig, device: Any) -> None:
        """The workspaces of (N, configuration) for every stream a call or capture may use next (capture_streams:
        the current stream, torch.cuda.graph's default capture stream, the served ones); never while capturing."""
        for stream in capture_streams(index):
            if (index, stream, n, cfg) not in self.workspaces:
                self.workspaces[(index, stream, n, cfg)] = workspace_for(n, cfg, device)

    def _make_plan(self, index: int, n: int, k: int, m: int, w: Any, x: Any) -> GemvConfig | None:
        if self.version != STORE.version:
            self.plans.clear()
            self.version = STORE.version
        key = (index, n, k, m)
        if key in self.plans:
            return self.plans[key]
        cfg = self.config(n, k, m)
        if cfg is None and self.tune and w is not None:
            cfg = self.tune_for([w], [x])[0]
        if cfg is not None:
            self.plans[key] = cfg
        return cfg

    def _plan(self, x: Any, w: Any) -> tuple[GemvConfig, tuple[Any, Any]] | None:
        """(configuration, workspace) of a call on the current stream; None: F.linear."""
        m = x.shape[0]
        n, k = w.shape
        index = w.get_device()
        cfg = self.plans.get((index, n, k, m)) if self.version == STORE.version else None
        if cfg is None:
            import torch
            if m > MAX_M or w.dtype != torch.bfloat16 or w.stride(1) != 1 or torch.cuda.is_current_stream_capturing():
                return None  # nothing is tuned or allocated while a graph is captured
            cfg = self._make_plan(index, n, k, m, w, x)
            if cfg is None:
                return None
        if cfg.split_k == 1:
            return cfg, _NO_SPACE
        stream = current_stream(index)
        space = self.workspaces.get((index, stream, n, cfg))
        if space is None:
            import torch
            if torch.cuda.is_current_stream_capturing():
                warn_once(f"gemv-stream:{index}:{stream}", f"the GEMV has no workspace for stream {stream:#x}, "
                          f"captured before any eager call on it: those calls run F.linear in the graph. Name the "
                          f"stream to dispatch.serve_streams before binding, or call the layers once on it first")
                return None
            # this stream's and the capture streams': a call made eagerly and then captured, as a benchmark or a
            # warm-up does, finds its workspace there
            self._make_spaces(index, n, cfg, w.device)
            space = self.workspaces[(index, stream, n, cfg)]
        return cfg, space

    def _run(self, x: Any, w: Any, y: Any, plan: tuple[GemvConfig, tuple[Any, Any]]) -> None:
        if self.fn is None:
            self.fn = kernel()
        launch(self.fn, x, w, y, plan[1], plan[0], self.pdl)

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


_NO_SPACE = (None, None)  # an unsplit launch touches no workspace
SERVED_STREAMS: list[Any] = []  # dispatch.serve_streams: streams whose workspaces prepare makes ahead


def current_stream(index: int) -> int:
    """The current CUDA stream of a device, as its raw handle (cheap: no Stream object)."""
    return _raw_stream()(index)


@functools.cache
def _raw_stream():
    """torch's raw current-stream query where this build has it, else the same through a Stream object."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


def capture_streams(index: int) -> list[int]:
    """The streams a capture of this device may run the GEMV on, as raw handles: the current one, torch.cuda.graph's
    default capture stream (made here, as torch.cuda.graph would make it) and the streams named to serve_streams."""
    import torch
    if torch.cuda.graph.default_capture_stream is None:
        torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
    streams = [torch.cuda.graph.default_capture_stream, *SERVED_STREAMS]
    return list(dict.fromkeys([current_stream(index), *(s.cuda_stream for s in streams
                                                        if s.device.index in (index, None))]))


def serve_streams(*streams: Any) -> None:
    """Streams besides the current one on which bound layers may be captured in a CUDA graph (a fork inside a
    capture, a model on a stream of its own): bind makes the GEMV's workspaces for them ahead. Call before binding."""
    SERVED_STREAMS.extend(s for s in streams if s not in SERVED_STREAMS)
