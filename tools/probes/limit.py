"""(GPU) How far the small-M linears are from the memory ceiling, and which candidate kernels close the distance.

    python -m tools.probes.limit --out DIR [--ms 1,2,4,8,16,32] [--min-mb 16]

For every catalog weight of at least --min-mb (vLLM's layout, TP 1) and the LM head: the size-matched read ceiling
(the fastest of several streaming-read kernels over the same bytes), the large-buffer ceiling, and at each M the time
of F.linear, Inductor's max-autotune mm, gemlite (where it imports) and the project's split-K GEMV
(dispatch/gemv.py, tuned over its configurations). Every path is checked against an fp32 reference first. Timing: a
CUDA graph of back-to-back calls cycling through 8 copies of the operands (weights from HBM), CUDA events around each
replay, the median replay over the calls. Writes DIR/limit.csv and DIR/run.json (the environment, the command and
the ceilings). A diagnostic: its figures decide what the harness measures; the harness's own numbers come from bench run.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROTATIONS = 8


def timed(fn, args_list, calls: int, replays: int = 25) -> float:
    """µs per call: the median over `replays` of one captured graph of `calls` calls cycling through args_list."""
    import torch
    from bench.gpu import capture_graph

    def body():
        for i in range(calls):
            fn(*args_list[i % len(args_list)])
    graph = capture_graph(lambda: [fn(*a) for a in args_list[:2]], body)
    graph.replay()
    torch.cuda.synchronize()
    from dispatch.gemv import replay_us
    times = replay_us(graph, calls, replays)
    del graph
    return statistics.median(times)


def read_kernels():
    from bench.ceiling import read_kernels as kernels_of
    kernels = kernels_of()
    return kernels["blocks"], kernels["persistent"]


def read_ceiling(elements: int, sms: int) -> tuple[float, str, dict]:
    """(µs, the fastest read's name, every read's µs) for streaming `elements` bf16 values, 8 rotating copies."""
    import torch
    blocks, persistent = read_kernels()
    bufs = [torch.randn(elements, device="cuda", dtype=torch.bfloat16) for _ in range(ROTATIONS)]
    out = torch.empty(elements // 1024 + sms * 8 + 1, device="cuda", dtype=torch.float32)
    calls = max(8, min(64, int(2e9 // (elements * 2)) or 8))
    results = {}
    for block in (1024, 2048, 4096, 8192, 16384):
        for warps in (4, 8, 16):
            grid = (triton_cdiv(elements, block),)
            results[f"blocks_b{block}_w{warps}"] = timed(
                lambda b, g=grid, bl=block, w=warps: blocks[g](b, elements, out, BLOCK=bl, num_warps=w),
                [(b,) for b in bufs], calls)
        for per_sm in (1, 2, 4, 8):
            for warps in (4, 8):
                grid = (min(sms * per_sm, triton_cdiv(elements, block)),)
                results[f"persistent_b{block}_x{per_sm}_w{warps}"] = timed(
                    lambda b, g=grid, bl=block, w=warps: persistent[g](b, elements, out, BLOCK=bl, num_warps=w),
                    [(b,) for b in bufs], calls)
    results["torch_sum"] = timed(lambda b: b.sum(dtype=torch.float32), [(b,) for b in bufs], calls)
    best = min(results, key=results.get)
    del bufs
    return results[best], best, results


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def inductor_mm():
    import torch
    import torch._inductor.config as cfg
    import torch.nn.functional as F
    cfg.max_autotune_gemm_backends = "TRITON,ATEN"
    torch._dynamo.reset()  # a fresh compile per (shape, M): no dynamic-shape graph reused from another shape
    return torch.compile(lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs", dynamic=False)


def gemlite_layers(ws):
    from gemlite.core import DType, GemLiteLinearTriton
    layers = []
    for w in ws:
        n, k = w.shape
        layer = GemLiteLinearTriton(W_nbits=16, group_size=None, in_features=k, out_features=n,
                                    input_dtype=DType.BF16, output_dtype=DType.BF16)
        layer.pack(w, None, None)
        layers.append(layer)
    return layers


def tune_gemv(ws, xs, m: int):
    """The fastest configuration of dispatch.gemv at this shape and M, each timed as the cells are (a captured graph
    of back-to-back calls), and its GEMVs."""
    from dispatch.gemv import CONFIGS, Gemv, GemvConfig
    best, best_us = None, float("inf")
    for geometry in CONFIGS:
        cfg = GemvConfig(*geometry)
        if cfg.block_k * cfg.split_k > ws[0].shape[1] * 2 or not cfg.takes(m):
            continue
        try:
            gs = [Gemv(w, cfg) for w in ws]
            us = timed(lambda x, g: g(x), list(zip(xs, gs)), 2 * len(ws), replays=5)
        except Exception as exc:  # a configuration Triton cannot build: skipped
            print(f"  gemv {cfg.key()}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
            continue
        if us < best_us:
            best, best_us = cfg, us
    return best, ([Gemv(w, best) for w in ws] if best else [])


FIELDS = ["shape", "n", "k", "m", "path", "us", "bytes", "gbps", "of_size_matched", "of_large_buffer", "rel_err",
          "setup_s"]


def _parser():
    from harness.cli import Parser, float_in
    from harness.options import add
    from shapes.grid import parse_m
    p = Parser(prog="tools.probes.limit")
    add(p, "out", required=True)
    p.add_argument("--ms", default="1,2,4,8,16,32", type=parse_m)
    p.add_argument("--min-mb", type=float_in(0.0, 1e6), default=16.0)
    p.add_argument("--gemv-ms", default="1,2,4,8,16", type=parse_m)
    add(p, "shapes", default="", shown="every one of --min-mb")
    p.add_argument("--skip", default="", help="comma list of candidates to leave out (inductor, gemlite, gemv)")
    return p


def large_buffer_ceiling() -> dict:
    """The sustained read bandwidth over a 2 GiB buffer: the fastest block size of the streaming-read kernel."""
    import torch
    big = 2 ** 30
    buf = torch.randn(big // 2, device="cuda", dtype=torch.bfloat16)
    blocks, _ = read_kernels()
    o = torch.empty(big // 2 // 1024 + 1, device="cuda", dtype=torch.float32)
    large = min(timed(lambda b, bl=bl: blocks[(triton_cdiv(b.numel(), bl),)](b, b.numel(), o, BLOCK=bl, num_warps=8),
                      [(buf,)], 4, 10) for bl in (4096, 8192, 16384))
    return {"bytes": big, "us": large, "gbps": big / large / 1e3}


def _candidates(xs, ws, m: int, skip: set[str], gemv_ms: set[int]) -> dict:
    """name -> (fn, its argument list over the rotated copies, setup seconds): every candidate that builds."""
    import torch.nn.functional as F
    cands = {"aten": (F.linear, [(x, w) for x, w in zip(xs, ws)], 0.0)}
    if "inductor" not in skip:
        t = time.perf_counter()
        try:
            mm = inductor_mm()
            mm(xs[0], ws[0])
            cands["inductor"] = (mm, [(x, w) for x, w in zip(xs, ws)], time.perf_counter() - t)
        except Exception as exc:
            print(f"  inductor M={m}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    if "gemlite" not in skip:
        t = time.perf_counter()
        try:
            layers = gemlite_layers(ws)
            for layer, x in zip(layers, xs):
                layer(x)
            cands["gemlite"] = (lambda x, layer: layer(x), [(x, layer) for x, layer in zip(xs, layers)],
                                time.perf_counter() - t)
        except Exception as exc:
            print(f"  gemlite M={m}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            skip.add("gemlite")
    if "gemv" not in skip and m in gemv_ms:
        t = time.perf_counter()
        cfg, gs = tune_gemv(ws, xs, m)
        if cfg is not None:
            cands["gemv:" + cfg.key()] = (lambda x, g: g(x), [(x, g) for x, g in zip(xs, gs)], time.perf_counter() - t)
    return cands


def _probe_shape(s, ms: list[int], gemv_ms: set[int], skip: set[str], sms: int, ceilings: dict, writer) -> None:
    """One weight: its size-matched read ceiling, then every candidate at each M, checked against fp32 and timed."""
    import torch
    from bench.gpu import output_error, reference
    n, k = s.n, s.k
    c_us, c_name, c_all = read_ceiling(n * k, sms)
    ceilings[s.name] = {"bytes": n * k * 2, "us": c_us, "best": c_name, "gbps": n * k * 2 / c_us / 1e3, "all": c_all}
    print(f"{s.name}: read ceiling {c_us:.2f} µs ({n * k * 2 / c_us / 1e3:.0f} GB/s, {c_name})", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rot = 2 if n * k * 2 > 5e8 else ROTATIONS
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5 for _ in range(rot)]
    for m in ms if rot == ROTATIONS else ms[:1]:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(rot)]
        ref = reference(xs[0], ws[0])
        byts = (n * k + m * k + m * n) * 2
        calls = max(4, min(64, int(1e9 // byts)))
        for name, (fn, arglist, setup_s) in _candidates(xs, ws, m, skip, gemv_ms).items():
            try:
                err = output_error(fn(*arglist[0]), xs[0], ws[0], ref)
                if not err < 2e-2:
                    raise ValueError(f"relative error {err:.3g} against fp32")
                t_us = timed(fn, arglist, calls)
            except Exception as exc:
                print(f"  {name} M={m}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                continue
            writer.writerow({"shape": s.name, "n": n, "k": k, "m": m, "path": name, "us": round(t_us, 3),
                             "bytes": byts, "gbps": round(byts / t_us / 1e3, 1),
                             "of_size_matched": round(c_us / t_us, 3), "of_large_buffer":
                             round(byts / t_us / 1e3 / ceilings["large_buffer"]["gbps"], 3), "rel_err": err,
                             "setup_s": round(setup_s, 2)})
            print(f"  M={m} {name}: {t_us:.2f} µs, {c_us / t_us:.2f} of the read ceiling", flush=True)
    del ws
    torch.cuda.empty_cache()


def main(argv=None) -> int:
    import csv

    import torch
    from bench.envinfo import run_info
    from dispatch.profiles import detect_profile, this_gpu
    from shapes.catalog import catalog
    args = _parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = set(filter(None, args.shapes.split(",")))
    shapes = sorted({(s.n, s.k): s for s in catalog() if s.n * s.k * 2 >= args.min_mb * 1e6
                     and (not names or s.name in names)}.values(), key=lambda s: s.n * s.k)
    ceilings: dict = {}
    t0 = time.perf_counter()
    profile = detect_profile(*this_gpu())
    info = run_info(["python", "-m", "tools.probes.limit", *(argv if argv is not None else sys.argv[1:])],
                    kind="limit", profile=profile.name if profile else None, status="running")
    with (out / "limit.csv").open("w", newline="") as sheet:
        writer = csv.DictWriter(sheet, fieldnames=FIELDS)
        writer.writeheader()

        def record(status: str = "running") -> None:  # after every shape: a run cut short keeps what it measured
            sheet.flush()
            (out / "run.json").write_text(json.dumps({**info, "status": status, "ceilings": ceilings,
                                                      "wall_s": round(time.perf_counter() - t0, 1)},
                                                     indent=1, default=str) + "\n")
        ceilings["large_buffer"] = large_buffer_ceiling()
        print(f"large buffer: {ceilings['large_buffer']['gbps']:.0f} GB/s", flush=True)
        record()
        for s in shapes:
            _probe_shape(s, list(args.ms), set(args.gemv_ms), skip, sms, ceilings, writer)
            record()
        record("complete")
    return 0


if __name__ == "__main__":
    from harness.errors import run_cli
    sys.exit(run_cli(main, "tools.probes.limit"))
