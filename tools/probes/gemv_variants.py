"""(GPU) Kernel structures for the GEMV at M = 1-8, against each weight's size-matched read: which one to build.

    python -m tools.probes.gemv_variants --out DIR [--cells 2560x4096,4096x2048] [--ms 1,2,4,8] [--budget-s 300]

Per (weight, M), every variant over a grid of its tile shapes and K splits, each checked against an fp32 reference
first, then timed as the GEMV's tuner times a configuration (a captured graph of back-to-back calls over rotated
copies, weights from HBM, CUDA events, the median replay):
- `tc16-sS`: dispatch/gemv.py's 16-row tensor-core tile, Triton software pipelining of S stages (3: today's);
- `rows`: dispatch/gemv.py's CUDA-core tile of 1-8 rows (each K step reduced across the tile's lanes);
- `defer`: a CUDA-core tile whose accumulator keeps the K lanes ([rows, BLOCK_N, BLOCK_K] fp32 partial products),
  reduced across K once at the end: no cross-lane reduction per K step;
- `wide`, `wide16`: today's CUDA-core and tensor-core tiles split 16-64 ways along K: many small programs, as the
  streaming read that sets the ceiling runs;
- `packed`, `packed16`: today's one-row and 16-row products over the weight stored in tile order (packed once, each
  weight tile one contiguous block);
- `tma`, `tma16`: `defer`'s and the 16-row tensor-core product with the weight tiles loaded by the Hopper tensor
  memory accelerator (a host-made tensor descriptor), S stages deep.
- `pipe`: dispatch/gemv.py's one-row tile (M = 1) with its loop pipelined S stages deep through shared memory;
- `swap`: the tensor-core product with A and B swapped (the weight tile the MMA's 64 or 128 rows, x's 8 or 16 rows
  its columns): on SM90 a wgmma fed from shared memory by Triton's cp.async pipeline, S stages deep;
- `streamk`: one, two or four programs per SM, each an equal share of the (N tile, K step) iterations in one loop
  pipelined S deep (tools/probes/gemv_streamk.py; its `sk` field is the programs per SM): no partial last wave.
Every other variant ends in dispatch/gemv.py's split-K epilogue (a slot per split, the last to arrive sums them in
order); `streamk` sums a tile its shares cut the same way, in program order.
Writes DIR/variants.csv (every configuration) and DIR/run.json (command, environment, the reads). A diagnostic: what
it finds decides what dispatch/gemv.py runs; the harness's own numbers come from bench run.
"""
from __future__ import annotations

import csv
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

REG_BUDGET = 64  # fp32 accumulator registers per thread a `defer` tile may hold
STREAMK_PER_SM = (1, 2, 4)  # the programs per SM a `streamk` launch tries


@functools.cache
def kernels() -> dict[str, Any]:
    """The probe's own kernels by family: (Triton kernel, how it loads the weight); one split-K epilogue for all."""
    import triton
    import triton.language as tl

    from dispatch.gemv import epilogue
    from tools.probes.gemv_streamk import tile_product
    finish = epilogue()

    @triton.jit
    def weight_tile(w_src, pid_n, k, rn, rk, N, K, stride_wn, k_tiles,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LOAD: tl.constexpr):
        """The [BLOCK_N, BLOCK_K] weight tile at (pid_n, k): LOAD 0 by pointers, 1 by TMA (a tensor descriptor; rows
        past N and columns past K read as zero), 2 from the packed weight (pack(); every split whole tiles)."""
        if LOAD == 1:
            w = w_src.load([pid_n * BLOCK_N, k])
        elif LOAD == 2:
            base = tl.multiple_of((pid_n * k_tiles + k // BLOCK_K) * (BLOCK_N * BLOCK_K), BLOCK_N * BLOCK_K)
            w = tl.load(w_src + base + tl.arange(0, BLOCK_N)[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :],
                        eviction_policy="evict_first")
        else:
            w = tl.load(w_src + rn[:, None] * stride_wn + rk[None, :],
                        mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0, eviction_policy="evict_first")
        return w

    @triton.jit
    def program(k_per, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """(pid_n, pid_k, the tile's N offsets, its rows, the split's first K) of this program."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        return pid_n, pid_k, pid_n * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, TILE_M), pid_k * k_per

    @triton.jit
    def x_tile(x_ptr, rm, rk, M, K, stride_xm):
        """x's [TILE_M, BLOCK_K] tile at K offsets rk, the rows past M zero."""
        return tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                       other=0.0)

    @triton.jit
    def gemv_defer(x_ptr, w_src, y_ptr, part_ptr, count_ptr, M, N, K, k_per, stride_xm, stride_wn, stride_ym,
                   k_tiles, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, LOAD: tl.constexpr):
        """The K lanes kept in the accumulator ([rows, BLOCK_N, BLOCK_K]), reduced across K once at the end."""
        pid_n, pid_k, rn, rm, k_lo = program(k_per, TILE_M, BLOCK_N)
        acc = tl.zeros((TILE_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, k_per, BLOCK_K):
            rk = k_lo + k0 + tl.arange(0, BLOCK_K)
            w = weight_tile(w_src, pid_n, k_lo + k0, rn, rk, N, K, stride_wn, k_tiles, BLOCK_N, BLOCK_K, LOAD)
            x = x_tile(x_ptr, rm, rk, M, K, stride_xm)
            acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        finish(tl.sum(acc, axis=2), y_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, rn, M, N, stride_ym,
               TILE_M, BLOCK_N, SPLIT_K)

    @triton.jit
    def gemv_tile(x_ptr, w_src, y_ptr, part_ptr, count_ptr, M, N, K, k_per, stride_xm, stride_wn, stride_ym,
                  k_tiles, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, LOAD: tl.constexpr):
        """dispatch/gemv.py's products: one row (TILE_M 1) or the 16-row tensor-core tile, each weight tile by LOAD."""
        pid_n, pid_k, rn, rm, k_lo = program(k_per, TILE_M, BLOCK_N)
        acc = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, k_per, BLOCK_K):
            rk = k_lo + k0 + tl.arange(0, BLOCK_K)
            w = weight_tile(w_src, pid_n, k_lo + k0, rn, rk, N, K, stride_wn, k_tiles, BLOCK_N, BLOCK_K, LOAD)
            acc = tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M)
        finish(acc, y_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, rn, M, N, stride_ym, TILE_M, BLOCK_N, SPLIT_K)

    @triton.jit
    def gemv_swap(x_ptr, w_src, y_ptr, part_ptr, count_ptr, M, N, K, k_per, stride_xm, stride_wn, stride_ym,
                  k_tiles, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, LOAD: tl.constexpr):
        """The tensor-core product with A and B swapped: the weight tile [BLOCK_N, BLOCK_K] the MMA's A (64 or 128
        rows: on SM90 Triton emits a warpgroup's wgmma fed from shared memory by its cp.async pipeline, where the
        16-row tile, x as A, is mma.sync), x's TILE_M rows transposed its B, the accumulator transposed at the end."""
        pid_n, pid_k, rn, rm, k_lo = program(k_per, TILE_M, BLOCK_N)
        acc = tl.zeros((BLOCK_N, TILE_M), dtype=tl.float32)
        for k0 in range(0, k_per, BLOCK_K):
            rk = k_lo + k0 + tl.arange(0, BLOCK_K)
            w = weight_tile(w_src, pid_n, k_lo + k0, rn, rk, N, K, stride_wn, k_tiles, BLOCK_N, BLOCK_K, LOAD)
            acc = tl.dot(w, tl.trans(x_tile(x_ptr, rm, rk, M, K, stride_xm)), acc)
        finish(tl.trans(acc), y_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, rn, M, N, stride_ym, TILE_M, BLOCK_N,
               SPLIT_K)

    @triton.jit
    def gemv_pipe(x_ptr, w_src, y_ptr, part_ptr, count_ptr, M, N, K, k_per, stride_xm, stride_wn, stride_ym,
                  k_tiles, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, LOAD: tl.constexpr, STAGES: tl.constexpr):
        """dispatch/gemv.py's one-row product with its loop pipelined STAGES deep: Triton pipelines only the loads
        that feed a dot unless the loop asks (tl.range's num_stages), so today's one-row tile waits for each weight
        tile; here the next ones are in flight through shared memory (cp.async)."""
        pid_n, pid_k, rn, rm, k_lo = program(k_per, TILE_M, BLOCK_N)
        acc = tl.zeros((TILE_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(0, k_per, BLOCK_K, num_stages=STAGES):
            rk = k_lo + k0 + tl.arange(0, BLOCK_K)
            w = weight_tile(w_src, pid_n, k_lo + k0, rn, rk, N, K, stride_wn, k_tiles, BLOCK_N, BLOCK_K, LOAD)
            acc = tile_product(acc, w, x_ptr, rk, rm, M, K, stride_xm, TILE_M)
        finish(acc, y_ptr, part_ptr, count_ptr, pid_n, pid_k, rm, rn, M, N, stride_ym, TILE_M, BLOCK_N, SPLIT_K)

    # family -> (kernel, how it loads the weight)
    return {"defer": (gemv_defer, 0), "tma": (gemv_defer, 1), "tma16": (gemv_tile, 1), "packed": (gemv_tile, 2),
            "packed16": (gemv_tile, 2), "pipe": (gemv_pipe, 0), "swap": (gemv_swap, 0)}


def pack(w: Any, bn: int, bk: int) -> Any:
    """w [N, K] tile by tile: [N / bn, K / bk, bn, bk], contiguous (N and K multiples of the tile)."""
    n, k = w.shape
    return w.reshape(n // bn, bn, k // bk, bk).permute(0, 2, 1, 3).contiguous()


def splits(n: int, k: int, bn: int, bk: int, sms: int) -> list[int]:
    """The K splits tried for a tile: the smallest power of two giving two programs per SM, half and twice that."""
    sk = 1
    while sk < 16 and -(-n // bn) * sk < 2 * sms and bk * sk * 2 <= k:
        sk *= 2
    return [s for s in dict.fromkeys((max(1, sk // 2), sk, sk * 2)) if s <= 16 and (s == 1 or bk * s <= k)]


def variants(n: int, k: int, m: int, sms: int) -> list[tuple[str, int, int, int, int, int, int]]:
    """(family, tile_m, block_n, block_k, split_k, num_warps, num_stages) for every configuration tried."""
    from dispatch.gemv import TILES_FEW_ROWS, TILES_ONE_ROW, TILES_ROWS, tile_rows
    rows = tile_rows(m)
    # today's kernel first (its tuner's list: the baseline), then the new structures, then deeper pipelines
    out = [("rows", rows, bn, bk, sk, nw, 3) for bn, bk, nw in (TILES_ONE_ROW if m == 1 else TILES_FEW_ROWS)
           for sk in splits(n, k, bn, bk, sms)]
    if m > 1:
        out += [("tc16-s3", 16, bn, bk, sk, nw, 3) for bn, bk, nw in TILES_ROWS for sk in splits(n, k, bn, bk, sms)]
    if m == 1:  # the one-row tile with its loop pipelined through shared memory
        out += [("pipe", 1, bn, bk, sk, nw, s) for bn, bk, nw in TILES_ONE_ROW for s in (3, 4)
                for sk in splits(n, k, bn, bk, sms)]
    # the weight in tile order: each program's weight tile one contiguous block (every split whole tiles: no mask)
    if m == 1:
        out += [("packed", 1, bn, bk, sk, nw, 3) for bn, bk, nw in TILES_ONE_ROW + ((16, 512, 4), (32, 256, 4))
                if n % bn == 0 and k % bk == 0 for sk in splits(n, k, bn, bk, sms) if k % (sk * bk) == 0]
    else:
        out += [("packed16", 16, bn, bk, sk, nw, s) for bn, bk, nw in TILES_ROWS for s in (3, 4)
                if n % bn == 0 and k % bk == 0 for sk in splits(n, k, bn, bk, sms) if k % (sk * bk) == 0]
    for bn in (8, 16, 32, 64):
        for bk in (64, 128, 256, 512):
            if rows * bn * bk / 128 in (32, 64):  # fp32 accumulator registers per thread at four warps
                out += [("defer", rows, bn, bk, sk, 4, 3) for sk in splits(n, k, bn, bk, sms)]
    for bn, bk in ((8, 256), (16, 128), (16, 256), (32, 128), (32, 256), (64, 128)):
        if rows * bn * bk / 128 <= REG_BUDGET:
            out += [("tma", rows, bn, bk, sk, 4, 4) for sk in splits(n, k, bn, bk, sms)]
        if m > 1 and bn >= 16:
            out += [("tma16", 16, bn, bk, sk, 4, 4) for sk in splits(n, k, bn, bk, sms)]
    # many small programs, as the streaming read that sets the ceiling runs (a program per 2 KB block): deep K splits
    for bn, bk in ((8, 256), (8, 512), (16, 128), (16, 256), (32, 128)):
        for sk in (16, 32, 64):
            if bk * sk <= k:
                out += [("wide", rows, bn, bk, sk, 4, 3)]
                if m > 1 and bn >= 16:
                    out += [("wide16", 16, bn, bk, sk, 4, 3)]
    if m > 1:
        out += [("tc16-s4", 16, bn, bk, sk, nw, 4) for bn, bk, nw in TILES_ROWS for sk in splits(n, k, bn, bk, sms)]
    # A and B swapped: the weight tile the MMA's 64 or 128 rows, x's rows its columns, 16 (a wgmma) or, where they
    # hold M, 8 (Triton 3.6 runs those as mma.sync, 3.9 as a wgmma)
    out += [("swap", rows, bn, bk, sk, 4, s) for rows in ((8, 16) if m <= 8 else (16,))
            for bn, bk in ((64, 64), (64, 128), (128, 64), (128, 128)) for s in (3, 4)
            for sk in splits(n, k, bn, bk, sms)]
    # equal shares of the iterations, one loop per program: the fifth field is the programs per SM, not a K split
    out += [("streamk", 1 if m == 1 else 16, bn, bk, per_sm, nw, s)
            for bn, bk, nw in (TILES_ONE_ROW if m == 1 else TILES_ROWS) for per_sm in STREAMK_PER_SM for s in (3, 4)]
    return out


def streamk_programs(n: int, k: int, bn: int, bk: int, programs: int) -> int:
    """The programs a stream-K launch runs: as asked, but no more than the iterations (N tiles x K steps), so that
    every share holds at least one and the shares' starts strictly increase (gemv_streamk's sums count on it)."""
    return max(1, min(programs, -(-n // bn) * -(-k // bk)))


def runner(family: str, tile_m: int, bn: int, bk: int, sk: int, nw: int, stages: int, n: int, device):
    """(x, w) -> y for one configuration, its workspace made here (one stream)."""
    if family == "streamk":
        return streamk_runner(tile_m, bn, bk, sk, nw, stages, n, device)
    import torch

    from dispatch.gemv import GemvConfig, kernel, workspace_for
    space = workspace_for(n, GemvConfig(bn, bk, sk, nw, tile_m), device)
    fn, load = kernels().get(family, (kernel(), None))
    extra = ({"USE_PDL": False} if load is None else
             {"LOAD": load, **({"STAGES": stages} if family == "pipe" else {})})
    packed: dict[int, Any] = {}  # a weight's packed copy, made on its first call (outside any timing)

    def call(x, w):
        m, k = x.shape
        y = torch.empty((m, n), device=x.device, dtype=torch.bfloat16)
        k_per = -(-(-(-k // sk)) // bk) * bk
        if load is None:  # today's kernel
            head = (x, w, y, space[0], space[1], m, n, k, k_per, x.stride(0), w.stride(0), y.stride(0))
        else:
            if load == 1:
                from triton.tools.tensor_descriptor import TensorDescriptor
                src = TensorDescriptor.from_tensor(w, [bn, bk])
            elif load == 2:
                if w.data_ptr() not in packed:
                    packed[w.data_ptr()] = pack(w, bn, bk)
                src = packed[w.data_ptr()]
            else:
                src = w
            head = (x, src, y, space[0], space[1], m, n, k, k_per, x.stride(0), w.stride(0), y.stride(0), k // bk)
        fn[(-(-n // bn), sk)](*head, TILE_M=tile_m, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=nw,
                              num_stages=stages, **extra)
        return y
    return call


def streamk_runner(tile_m: int, bn: int, bk: int, per_sm: int, nw: int, stages: int, n: int, device):
    """(x, w) -> y for one stream-K configuration: per_sm programs per SM of this device, at most the iterations."""
    import torch

    from tools.probes.gemv_streamk import launch, workspace
    sms = torch.cuda.get_device_properties(device).multi_processor_count

    def call(x, w):
        programs = streamk_programs(n, x.shape[1], bn, bk, per_sm * sms)
        if programs not in spaces:
            spaces[programs] = workspace(programs, tile_m, bn, n, device)
        y = torch.empty((x.shape[0], n), device=x.device, dtype=torch.bfloat16)
        launch(x, w, y, spaces[programs], programs, tile_m, bn, bk, nw, stages)
        return y
    spaces: dict[int, Any] = {}  # made at the first (eager) call, outside any capture
    call.spaces = spaces  # type: ignore[attr-defined]
    return call


def probe_cell(n: int, k: int, m: int, sms: int, read_us: float, deadline: float, writer,
               families: set[str] | None = None) -> None:
    import torch

    from bench.gpu import output_error, reference
    from tools.probes.limit import ROTATIONS, timed
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5 for _ in range(ROTATIONS)]
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(ROTATIONS)]
    ref = reference(xs[0], ws[0])
    best: dict[str, tuple[float, str]] = {}
    for v in variants(n, k, m, sms):
        if families and v[0] not in families:
            continue
        if time.monotonic() > deadline:
            print("  deadline: the rest of the grid is not timed", flush=True)
            break
        family, tile_m, bn, bk, sk, nw, stages = v
        key = f"r{tile_m}_bn{bn}_bk{bk}_{'ps' if family == 'streamk' else 'sk'}{sk}_w{nw}_s{stages}"
        try:
            fn = runner(*v, n, ws[0].device)
            err = output_error(fn(xs[0], ws[0]), xs[0], ws[0], ref)
            if not err < 2e-2:
                raise ValueError(f"relative error {err:.3g} against fp32")
            for x, w in zip(xs, ws):  # eagerly first: a packed variant packs each copy here, not inside the graph
                fn(x, w)
            us = timed(fn, list(zip(xs, ws)), 2 * ROTATIONS, replays=9)
        except Exception as exc:  # a configuration Triton cannot build here, or a wrong one: its row says so
            writer.writerow({"n": n, "k": k, "m": m, "family": family, "config": key,
                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"})
            continue
        writer.writerow({"n": n, "k": k, "m": m, "family": family, "config": key, "us": round(us, 3),
                         "of_read": round(read_us / us, 3), "rel_err": f"{err:.3g}", "error": ""})
        if us < best.get(family, (float("inf"), ""))[0]:
            best[family] = (us, key)
    for family, (us, key) in sorted(best.items(), key=lambda e: e[1][0]):
        print(f"  {n} x {k} M={m} {family:8s} {us:7.2f} µs  {read_us / us:.3f} of read  {key}", flush=True)


def main(argv=None) -> int:
    from harness.cli import Parser
    from shapes.grid import parse_m
    p = Parser(prog="python -m tools.probes.gemv_variants")
    p.add_argument("--out", required=True)
    p.add_argument("--cells", default="2560x4096,4096x2048",
                   help="weights as NxK, comma-separated")
    p.add_argument("--ms", default="1,2,4,8", type=parse_m)
    p.add_argument("--families", default="", help="comma list: only these families (default: every one)")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="no configuration is timed after this long (the cells go M by M)")
    args = p.parse_args(argv)
    import torch

    from datetime import datetime, timezone

    from bench.envinfo import fingerprint
    from dispatch.profiles import detect_profile, this_gpu
    from tools.probes.limit import read_ceiling
    started = time.monotonic()
    started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    weights = [tuple(int(v) for v in c.lower().split("x")) for c in args.cells.split(",")]
    reads = {}
    with open(out / "variants.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["n", "k", "m", "family", "config", "us", "of_read", "rel_err",
                                                "error"])
        writer.writeheader()
        for n, k in weights:
            read_us, read_name, _ = read_ceiling(n * k, sms)
            reads[(n, k)] = {"us": read_us, "best": read_name, "gbps": n * k * 2 / read_us / 1e3}
            print(f"{n} x {k}: size-matched read {read_us:.2f} µs ({n * k * 2 / read_us / 1e3:.0f} GB/s)", flush=True)
        for m in args.ms:  # a configuration compiles once per M (Triton specialises M = 1), then serves every weight
            for n, k in weights:
                probe_cell(n, k, m, sms, reads[(n, k)]["us"], started + args.budget_s, writer,
                           {f for f in args.families.split(",") if f})
                fh.flush()
    (out / "run.json").write_text(json.dumps({
        "kind": "gemv-variants", "started": started_utc,
        "profile": getattr(detect_profile(*this_gpu(0)), "name", None),
        "command": " ".join(["python -m tools.probes.gemv_variants", *sys.argv[1:]]),
        "gpu": torch.cuda.get_device_name(0), "fingerprint": fingerprint(),
        "reads": {f"{n}x{k}": r for (n, k), r in reads.items()},
        "wall_s": round(time.monotonic() - started, 1)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
