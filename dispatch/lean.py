"""Lean FlashInfer calls: what `mm_bf16` does per call, resolved once.

Public `mm_bf16` pays on every call for backend_requirement checks, its decorators, a new runner object, the autotuner
lookup and, for cuBLASLt on SM90, a per-call heuristic query: hundreds of µs of host time against a raw kernel launch
of a few (`bench host-anatomy` measures where it goes). A lean call resolves runner and tactic once per (N, K, M) from
FlashInfer's autotuner cache (the pinned file, when one is loaded) and then calls the kernel: TinyGEMM's and
cuBLASLt's TVM-FFI functions directly, CuTe DSL's cached runner. The caller allocates nothing: the output is allocated
here, as mm_bf16 does. Each call also offers `into(x, w, out)`: the same kernel writing into an output the caller
allocated, without bias; a bound layer (dispatch.bind) uses it with the output shape it remembers per activation
shape, one Python frame and a shape lookup less per call.

These read FlashInfer internals. They are checked against the source of the versions in KNOWN_VERSIONS; any other
version, or a missing internal, falls back to the public mm_bf16 (same kernels, full host cost) and says so once.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

KNOWN_VERSIONS = ("0.7.2.post1",)
TUNING_OP = "bf16_gemm"  # the custom_op name bf16_gemm_sm100 passes to choose_one
LeanFn = Callable[[Any, Any, Any], Any]  # (x [M, K], weight [N, K], bias or None) -> y [M, N]; .into(x, w, out)

_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"bf16-linear-bench: {message}", file=sys.stderr, flush=True)


def public_call(backend: str, pdl: bool) -> LeanFn:
    """FlashInfer's public entry point: every check and lookup on every call."""
    import flashinfer

    def call(x, w, bias=None):
        return flashinfer.mm_bf16(x, w.t(), bias=bias, pdl=pdl, backend=backend)

    def into(x, w, out):
        flashinfer.mm_bf16(x, w.t(), pdl=pdl, out=out, backend=backend)
    call.into = into
    return call


def lean_call(backend: str, pdl: bool) -> LeanFn:
    """The lean call for a backend, or the public one (said once) where this FlashInfer is not a known version."""
    import flashinfer
    version = getattr(flashinfer, "__version__", "unknown")
    if version not in KNOWN_VERSIONS:
        warn_once(f"version:{backend}", f"FlashInfer {version} is not a version the lean calls were checked against "
                                         f"({', '.join(KNOWN_VERSIONS)}); flashinfer-lean:{backend} runs the public mm_bf16")
        return public_call(backend, pdl)
    if backend not in _BUILDERS:
        warn_once(f"backend:{backend}", f"no lean call for FlashInfer backend {backend!r}; it runs the public mm_bf16")
        return public_call(backend, pdl)
    try:
        return _BUILDERS[backend](pdl)
    except (AttributeError, ImportError) as exc:
        warn_once(f"internal:{backend}", f"FlashInfer {version} lacks an internal the lean {backend} call needs "
                                          f"({exc}); it runs the public mm_bf16")
        return public_call(backend, pdl)


def _workspace(device):
    import flashinfer.gemm.gemm_base as gb
    return gb._get_cache_buf("mm_bf16_workspace", gb.DEFAULT_WORKSPACE_SIZE, device)


def _search(runners: list, inputs: list) -> tuple[int, Any]:
    """(runner index, tactic) FlashInfer's autotuner holds for these inputs; (0, -1) on a miss, as choose_one does."""
    import flashinfer.gemm.gemm_base as gb
    from flashinfer.autotuner import AutoTuner
    tuner = AutoTuner.get()
    hit, runner_id, tactic, _ = tuner.search_cache(TUNING_OP, runners, tuple(tuner._get_input_sizes(inputs)),
                                                   gb._BF16_GEMM_SM100_TUNING_CONFIG, inputs=inputs)
    return (runner_id, tactic) if hit else (0, -1)


def _tinygemm(pdl: bool) -> LeanFn:
    """TinyGEMM has one tactic: nothing to resolve. The kernels are the TVM-FFI functions of FlashInfer's JIT module,
    called without the Python wrapper FlashInfer puts around them (get_tinygemm2_module)."""
    from flashinfer.jit import gen_tinygemm2_module
    module = gen_tinygemm2_module().build_and_load()
    nobias, withbias = module.tinygemm2_nobias_op, module.tinygemm2_op

    def call(x, w, bias=None):
        out = x.new_empty((x.shape[0], w.shape[0]))
        if bias is None:
            nobias(x, w, out, pdl)
        else:
            withbias(x, w, bias, out, pdl)
        return out

    def into(x, w, out):
        nobias(x, w, out, pdl)
    call.into = into
    return call


def _cublaslt(pdl: bool) -> LeanFn:
    """cuBLASLt: per exact M (its tuned entries and heuristic list are keyed by it), the heuristic's algorithm list,
    the tuned tactic and the handle, resolved at the first call and kept; later calls launch with that algorithm.
    Where FlashInfer holds no tuned entry for the exact M (its cuBLASLt runner keys entries by it, so every M between
    its autotuner's buckets misses), mm_bf16 falls back to the heuristic's first algorithm: the kernels F.linear runs
    (docs/design.md, "Tuned cuBLASLt only at tuned M"), not always as fast. There the lean call runs F.linear's
    matmul itself. cuBLASLt takes no pdl (FlashInfer raises on it), so `pdl` is not used."""
    import flashinfer.gemm.gemm_base as gb
    import torch
    from flashinfer.jit.gemm import gen_mm_bf16_cublaslt_module
    run = gen_mm_bf16_cublaslt_module().build_and_load().mm_bf16_cublaslt_run_with_algo
    make_runner = gb.get_mm_bf16_cublaslt_module().cublaslt_bf16_gemm_runner
    resolved: dict[tuple[int, int, int, int, bool], tuple] = {}

    def resolve(x, w, bias, out) -> tuple | bool:
        ws = _workspace(x.device)
        runner = make_runner()
        inputs = [x, w.t(), bias, False, out, ws]
        _, tactic = _search([runner], inputs)
        if not (isinstance(tactic, int) and tactic >= 0):
            return False  # no tuned entry at this M: F.linear's matmul
        algos, count = runner._get_algos(inputs)
        if count == 0:
            raise RuntimeError(f"cuBLASLt offers no algorithm for M={x.shape[0]}, N={w.shape[0]}, K={x.shape[1]}")
        tactic = tactic if isinstance(tactic, int) and 0 <= tactic < count else 0
        with torch.cuda.device(x.device):
            handle = torch.cuda.current_blas_handle()
        return ws, handle, algos, tactic

    def call(x, w, bias=None):
        key = (x.shape[0], w.shape[0], x.shape[1], x.get_device(), bias is not None)
        entry = resolved.get(key)
        if entry is False:
            return torch.nn.functional.linear(x, w, bias)
        out = x.new_empty((x.shape[0], w.shape[0]))
        if entry is None:
            entry = resolved[key] = resolve(x, w, bias, out)
            if entry is False:
                return torch.nn.functional.linear(x, w, bias)
        ws, handle, algos, tactic = entry
        run(x, w, bias, out, ws, handle, algos, tactic)
        return out

    def into(x, w, out):  # call's lookup again, not a shared helper: a frame more per call on either path
        key = (x.shape[0], w.shape[0], x.shape[1], x.get_device(), False)
        entry = resolved.get(key)
        if entry is None:
            entry = resolved[key] = resolve(x, w, None, out)
        if entry is False:
            torch.mm(x, w.t(), out=out)
            return
        ws, handle, algos, tactic = entry
        run(x, w, None, out, ws, handle, algos, tactic)
    call.into = into
    return call


def _cute_dsl(pdl: bool) -> LeanFn:
    """CuTe DSL (SM100): per exact M, the runner and tactic the autotuner holds, re-checked as bf16_gemm_sm100 does
    (supports_inputs, is_tactic_compatible; else runners[0] with its default tactic); later calls go straight to
    that runner. Never run (no SM100 here): written from FlashInfer 0.7.2.post1's bf16_gemm_sm100."""
    import flashinfer.gemm.gemm_base as gb
    resolved: dict[tuple[int, int, int, int, bool], tuple] = {}

    def run(x, w, bias, out):
        key = (x.shape[0], w.shape[0], x.shape[1], x.get_device(), bias is not None)
        inputs = [x, w.t(), bias, pdl, out, None]
        entry = resolved.get(key)
        if entry is None:
            inputs[5] = _workspace(x.device)
            runners = gb._cute_dsl_bf16_runners(inputs)
            runner_id, tactic = _search(runners, inputs)
            runner = runners[runner_id]
            if not (runner.supports_inputs(inputs) and runner.is_tactic_compatible(inputs, tactic)):
                runner, tactic = runners[0], -1
            entry = resolved[key] = (runner, tactic, inputs[5])
        runner, tactic, inputs[5] = entry
        runner(inputs=inputs, tactic=tactic)

    def call(x, w, bias=None):
        out = x.new_empty((x.shape[0], w.shape[0]))
        run(x, w, bias, out)
        return out

    def into(x, w, out):
        run(x, w, None, out)
    call.into = into
    return call


_BUILDERS: dict[str, Callable[[bool], LeanFn]] = {"tinygemm": _tinygemm, "cublaslt": _cublaslt, "cute-dsl": _cute_dsl}
LEAN_BACKENDS = tuple(_BUILDERS)  # the backends with a lean call
