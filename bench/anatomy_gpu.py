"""(GPU) Host-time anatomy: every layer of one FlashInfer mm_bf16 call timed with identical tensors, against the aten
baselines; `python -m bench host-anatomy`. The subtraction and the op registration are in bench/anatomy.py."""
from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.anatomy import (FLASHINFER_SEGMENTS, FLASHINFER_TOTAL, NULL_OP_SEGMENT, can_use_flashinfer, inductor_style,
                           segment_costs)
from bench.anatomy_ops import make_vllm_impl, register_gemm_op, register_null_op
from bench.vllm_op import flashinfer_bf16_mm
from bench.envinfo import run_info
from bench.hosttime import sleep_guard, time_blocks
from bench.paths import PATHS
from bench.results import rows_to_csv, write_run_json
from bench.stats import summary
from bench.sweep import require_gpu, tune_shape
from dispatch.backends import ATEN, BACKENDS, flashinfer_path
from dispatch.lean import lean_call
from dispatch.profiles import GpuProfile
from harness.errors import HarnessError
from harness.io import atomic_write_text
from shapes.catalog import Shape

ANATOMY_COLUMNS = ("path", "kind", "layer", "n", "k", "m", "host_us", "host_us_p20", "host_us_p80", "calls", "rounds",
                   "gpu_busy", "cache_state", "status", "reason")


def _raw_kernel(backend: str, gb, tensors: tuple, pdl: bool) -> Callable[[], Any] | None:
    """The innermost call each runner makes, without the runner: the TVM-FFI function on the same tensors
    (a, b, out, workspace)."""
    import torch
    a, b, out, ws = tensors
    if backend == "tinygemm":
        mod = gb.get_tinygemm2_module()
        weight = b.transpose(-2, -1)
        return lambda: mod.tinygemm2_nobias_op(a, weight, out, pdl)
    if backend == "cublaslt":
        from flashinfer.jit.gemm import gen_mm_bf16_cublaslt_module
        mod = gen_mm_bf16_cublaslt_module().build_and_load()
        runner = gb.get_mm_bf16_cublaslt_module().cublaslt_bf16_gemm_runner()
        algo_buf, _ = runner._get_algos([a, b, None, False, out, ws])
        handle = torch.cuda.current_blas_handle()
        b_t = b.transpose(-2, -1)
        return lambda: mod.mm_bf16_cublaslt_run_with_algo(a, b_t, None, out, ws, handle, algo_buf, 0)
    return None  # cute-dsl: the compiled CuTe launch has no stable entry point of its own


def _runner_builder(backend: str, gb) -> Callable[[list], list]:
    """Runner construction exactly as bf16_gemm_sm100 does it on every call (a new runner object per call)."""
    if backend == "tinygemm":
        return lambda inputs: [gb._tinygemm_bf16_gemm_runner()]
    if backend == "cublaslt":
        return lambda inputs: [gb.get_mm_bf16_cublaslt_module().cublaslt_bf16_gemm_runner()]
    if backend == "cute-dsl":
        return lambda inputs: gb._cute_dsl_bf16_runners(inputs)
    if backend == "cudnn":
        return lambda inputs: [gb._cudnn_gemm_bf16_runner(is_a_k_major=True, is_b_k_major=True)]
    raise HarnessError(f"host-anatomy has no runner builder for backend {backend!r}")


def flashinfer_layers(backend: str, x, w, pdl: bool = False) -> tuple[dict[str, Callable[[], Any]], str]:
    """Every entry point of the FlashInfer path, outermost first, on the same x [M, K] and w [N, K], and beside them
    the lean call (dispatch/lean.py) on the same tensors. `pdl` is what the backend is called with (the profile's,
    where the backend takes it). Returns the layers and the autotuner cache state of choose_one at this M."""
    import flashinfer
    import flashinfer.gemm.gemm_base as gb
    import torch
    from flashinfer.autotuner import AutoTuner


    mm_bf16 = flashinfer.mm_bf16
    m, n = x.shape[0], w.shape[0]

    vllm_mm = flashinfer_bf16_mm(mm_bf16)
    op = register_gemm_op(vllm_mm)
    impl = make_vllm_impl(vllm_mm)  # the same Python kernel the op runs, called directly
    body = inspect.unwrap(mm_bf16)  # below backend_requirement and flashinfer_api
    wt = w.t()
    out = torch.empty(m, n, device=x.device, dtype=torch.bfloat16)
    ws = gb._get_cache_buf("mm_bf16_workspace", gb.DEFAULT_WORKSPACE_SIZE, x.device)
    inputs = [x, wt, None, pdl, out, ws]
    build = _runner_builder(backend, gb)
    tuner = AutoTuner.get()
    cfg = gb._BF16_GEMM_SM100_TUNING_CONFIG
    runners = build(inputs)
    hit, runner_id, tactic, _ = tuner.search_cache("bf16_gemm", runners, tuple(tuner._get_input_sizes(inputs)), cfg,
                                                   inputs=inputs)
    cached_runner = runners[runner_id]

    def fresh_call():
        r = build(inputs)[runner_id]
        return r(inputs=inputs, tactic=tactic)

    layers: dict[str, Callable[[], Any]] = {
        "inductor_wrapper": inductor_style(op.default, (x, w, None, pdl, backend), (m, n), (n, 1), "bench_op"),
        "custom_op": lambda: op.default(x, w, None, pdl, backend),
        "vllm_impl": lambda: impl(x, w, None, pdl, backend),
        "mm_bf16": lambda: mm_bf16(x, wt, bias=None, pdl=pdl, out_dtype=torch.bfloat16, backend=backend),
        "mm_bf16_skip_check": lambda: mm_bf16(x, wt, bias=None, pdl=pdl, out_dtype=torch.bfloat16, backend=backend,
                                              skip_check=True),
        "mm_bf16_body": lambda: body(x, wt, None, pdl, None, torch.bfloat16, backend),
        "gemm_dispatch": lambda: gb.bf16_gemm_sm100(x, wt, None, pdl, out, ws, [backend]),
        "runner_build": lambda: build(inputs),
        "choose_one": lambda: tuner.choose_one("bf16_gemm", runners, cfg, inputs),
        "runner_call_fresh": fresh_call,
        "runner_call_cached": lambda: cached_runner(inputs=inputs, tactic=tactic),
    }
    lean = lean_call(backend, pdl)
    lean(x, w)  # resolves runner and tactic for this M before timing
    layers["lean_call"] = lambda: lean(x, w)
    raw = _raw_kernel(backend, gb, (x, wt, out, ws), pdl)
    if raw is not None:
        layers["raw_kernel"] = raw
    return layers, "hit" if hit else "miss"


def aten_layers(x, w) -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn.functional as F

    m, n = x.shape[0], w.shape[0]
    buf = torch.empty(m, n, device=x.device, dtype=x.dtype)
    null = register_null_op()
    wt = w.t()
    return {
        "F.linear": lambda: F.linear(x, w),
        "torch.mm": lambda: torch.mm(x, wt),
        "torch.mm(out=)": lambda: torch.mm(x, wt, out=buf),
        "aten.linear.default": lambda: torch.ops.aten.linear.default(x, w),
        "inductor aten: empty_strided+mm(out=)": lambda: torch.mm(
            x, wt, out=torch.empty_strided((m, n), (n, 1), device=x.device, dtype=x.dtype)),
        "null_custom_op": lambda: null.default(x, w, None),
    }


def first_call_costs(fn: Callable[[Any, Any], Any], shape: Shape, m: int, fresh_ms: int = 5) -> list[dict[str, Any]]:
    """First-touch costs, timed once each (no warm-up, by definition): the first mm_bf16 call (fn, the path's
    callable) at an M this process has never seen (cuBLASLt heuristic query, autotuner miss), median over `fresh_ms`
    distinct new M values."""
    import torch
    w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
    times = []
    for i in range(fresh_ms):
        mi = m + 1 + i  # never a grid or bucket value here: 8 -> 9..13, 48 -> 49..53
        x = torch.randn(mi, shape.k, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn(x, w)
        times.append((time.perf_counter_ns() - t0) / 1e3)
        torch.cuda.synchronize()
    med, p20, p80 = summary(times)
    return [{"kind": "first_call", "layer": "first mm_bf16 call at a new M", "m": m, "host_us": med,
             "host_us_p20": p20, "host_us_p80": p80, "calls": fresh_ms, "rounds": 1, "status": "ok"}]


def cute_dsl_compile_cost(fn: Callable[[Any, Any], Any], shape: Shape, m: int) -> dict[str, Any]:
    """The first cute-dsl call of a shape in this process, timed once to its synchronize: the CuTe DSL kernel is
    compiled there (FlashInfer caches it per device, dtype, N, K, tactic and pdl), then launched."""
    import torch
    x = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    fn(x, w)
    torch.cuda.synchronize()
    return {"path": flashinfer_path("cute-dsl"), "m": m, "kind": "first_call", "status": "ok", "calls": 1,
            "rounds": 1, "layer": "CuTe DSL: first call of this shape (compiles its kernel)",
            "host_us": (time.perf_counter_ns() - t0) / 1e3}


def module_load_costs(backends: list[str]) -> list[dict[str, Any]]:
    """The first load of each backend's JIT module in this process: a build on a cold cache, a load on a warm one."""
    import flashinfer.gemm.gemm_base as gb
    cache = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    warm = cache.is_dir()
    rows = []
    loaders = {"tinygemm": gb.get_tinygemm2_module, "cublaslt": gb.get_mm_bf16_cublaslt_module}
    for b in backends:
        if b not in loaders:
            continue
        t0 = time.perf_counter_ns()
        loaders[b]()
        # A present cache folder need not hold this module: seconds here mean it was built, milliseconds loaded.
        rows.append({"path": flashinfer_path(b), "kind": "first_call", "status": "ok", "calls": 1, "rounds": 1,
                     "layer": "JIT module: first load in this process (a build when not cached)",
                     "cache_state": "cache folder present" if warm else "no cache folder",
                     "host_us": (time.perf_counter_ns() - t0) / 1e3})
    return rows


@dataclass(frozen=True)
class Anatomy:
    """What bench host-anatomy measures: the shapes, M values and FlashInfer backends on this profile's GPU, the
    calls per layer and rounds, and where the results go."""
    profile: GpuProfile
    shapes: list[Shape]
    ms: list[int]
    backends: list[str]
    out_dir: Path
    calls: int = 40
    rounds: int = 9
    allow_mismatch: bool = False
    command: list[str] | None = None


def run_anatomy(plan: Anatomy) -> Path:
    profile, shapes, ms, backends, out_dir = plan.profile, plan.shapes, plan.ms, plan.backends, plan.out_dir
    calls, rounds, command = plan.calls, plan.rounds, plan.command
    sm = require_gpu(profile, plan.allow_mismatch)
    import torch
    from flashinfer.autotuner import AutoTuner  # noqa: F401  (a missing FlashInfer stops here, before any write)

    info = run_info(command, profile=profile.name, kind="host-anatomy", calls=calls, rounds=rounds, ms=ms, pdl=profile.pdl,
                    shapes=[s.name for s in shapes], backends=backends)
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    runnable = [b for b in backends if not PATHS[flashinfer_path(b)].skip_reason(sm, 16, 128, 1)]
    rows += module_load_costs(runnable)
    before, after = sleep_guard(factor=2.5, margin_us=500)  # cuBLASLt's per-call heuristic query varies
    for shape in shapes:
        base = {"n": shape.n, "k": shape.k}
        for backend in backends:
            path = PATHS[flashinfer_path(backend)]
            live = [m for m in ms if not path.skip_reason(sm, shape.n, shape.k, m)]
            for m in ms:
                if m not in live:
                    rows.append({**base, "path": path.name, "m": m, "kind": "layer", "layer": FLASHINFER_TOTAL,
                                 "status": "skipped", "reason": path.skip_reason(sm, shape.n, shape.k, m)})
            if not live:
                continue
            if backend == "cute-dsl":  # the first call of a shape compiles its CuTe DSL kernel (SM100; not run on SM90)
                rows.append({**base, **cute_dsl_compile_cost(path.build(profile.pdl), shape, live[0])})
            # The untuned state first: an empty autotuner cache, choose_one falls back to runners[0], tactic -1.
            AutoTuner.get().clear_cache()
            for m in live:
                x = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
                layers, _ = flashinfer_layers(backend, x, w, BACKENDS[backend].pdl(profile.pdl))
                per_round, prot = time_blocks({"choose_one": layers["choose_one"]}, calls, rounds, (before, after))
                rows.append(_row({**base, "path": path.name, "m": m, "calls": calls}, "choose_one",
                                 per_round["choose_one"], prot, "untuned"))
            fn = path.build(profile.pdl)  # the sweep's own callable for this path: mm_bf16(x, w.t(), backend=...)
            _, err = tune_shape(path, shape, live, profile.pdl)
            if err:
                raise HarnessError(f"{path.name} {shape.name}: {err}")
            for m in live:
                rows += [{**r, **base, "path": path.name} for r in first_call_costs(fn, shape, m)]
                x = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
                if not can_use_flashinfer(x, w, None):
                    raise HarnessError(f"{shape.name} fails vLLM's FlashInfer eligibility test (K % 128 == 0, "
                                       f"contiguous bf16 CUDA tensors); vLLM would run F.linear there: pick another shape")
                layers, state = flashinfer_layers(backend, x, w, BACKENDS[backend].pdl(profile.pdl))
                aten = aten_layers(x, w)
                layers.update(aten)
                per_round, prot = time_blocks(layers, calls, rounds, (before, after))
                for name, vals in per_round.items():
                    rows.append(_row({**base, "path": ATEN if name in aten else path.name, "m": m, "calls": calls},
                                     name, vals, prot, state if name == "choose_one" else ""))
                for seg, med, p20, p80 in segment_costs(per_round, (*FLASHINFER_SEGMENTS, NULL_OP_SEGMENT)):
                    is_null = seg is NULL_OP_SEGMENT
                    rows.append({**base, "path": ATEN if is_null else path.name, "m": m, "kind": "segment",
                                 "layer": seg.name, "host_us": med, "host_us_p20": p20, "host_us_p80": p80,
                                 "calls": calls, "rounds": rounds, "status": "ok",
                                 "cache_state": state if seg.outer == "choose_one" else "",
                                 "gpu_busy": all(prot[n] for n in (seg.outer, *seg.inner))})
                print(f"host-anatomy: {shape.name} M={m} {path.name}: total {summary(per_round[FLASHINFER_TOTAL])[0]:.1f} µs"
                      f" vs F.linear {summary(per_round['F.linear'])[0]:.1f} µs (autotuner {state})", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "results.csv", rows_to_csv(rows, ANATOMY_COLUMNS))
    write_run_json(out_dir, {**info, "status": "complete", "wall_s": round(time.perf_counter() - t_start, 1)})
    return out_dir


def _row(at: dict[str, Any], layer: str, vals: list[float], prot: dict[str, bool], state: str) -> dict[str, Any]:
    """One layer's row at `at` (its shape, path, M and calls per block): the median and spread of its rounds."""
    med, p20, p80 = summary(vals)
    return {**at, "kind": "layer", "layer": layer, "host_us": med, "host_us_p20": p20, "host_us_p80": p80,
            "rounds": len(vals), "gpu_busy": prot[layer], "cache_state": state, "status": "ok"}
