"""(GPU) FlashInfer called the way vLLM calls it: through a registered custom op with vLLM's per-call check.

vLLM 0.33.0 (vllm/model_executor/layers/utils.py) registers `torch.ops.vllm.cuda_flashinfer_bf16_gemm` with
direct_register_custom_op (vllm/utils/torch_utils.py: Library.define + Library.impl on the CUDA dispatch key, a fake
impl for torch.compile). Its impl, cuda_flashinfer_bf16_gemm_impl, runs the backend's can_implement check, F.linear
where it fails, else `flashinfer_bf16_mm` (mm_bf16 with out_dtype bf16) on the 2-D view. Public mm_bf16 called
directly leaves the dispatcher hop and the check out, which understates vLLM's eager host cost.

The op is the host anatomy's model of that op (bench/anatomy_ops.py register_gemm_op), registered once per backend
with its check: for cute-dsl vLLM's (dispatch.vllm.can_use_cutedsl, on this GPU's SM); for another backend, which
vLLM has no entry for (TinyGEMM on SM90: the mechanism a vLLM change would use), that backend's own rule
(dispatch/backends.py, applied by dispatch/eligible.py).
"""
from __future__ import annotations

from typing import Any, Callable

from dispatch.backends import BACKENDS
from dispatch.profiles import sm_of
from dispatch.vllm import FLAG_BACKEND, can_use_cutedsl


def vllm_check(backend: str, sm: int) -> Callable[[Any, Any, Any], bool]:
    """The per-call check the op runs for a backend on an SM (F.linear where it fails)."""
    if backend == FLAG_BACKEND:
        return lambda x, weight, bias: can_use_cutedsl(sm, x, weight, bias)
    from dispatch.eligible import accepts  # torch: only when vLLM's op is called
    rule = BACKENDS[backend]
    return lambda x, weight, bias: (x.ndim >= 1 and x.shape[-1] == weight.shape[-1]
                                    and accepts(rule, x, weight, bias, sm))


def flashinfer_bf16_mm(mm_bf16: Callable[..., Any]) -> Callable[..., Any]:
    """vllm/utils/flashinfer.py flashinfer_bf16_mm over a given mm_bf16: (a, b, bias, pdl, backend) -> out."""
    import torch

    def mm(a, b, bias, pdl, backend):
        return mm_bf16(a, b, bias=bias, pdl=pdl, out_dtype=torch.bfloat16, backend=backend)
    return mm


def op_call(backend: str, pdl: bool) -> Callable[[Any, Any], Any]:
    """(x, w) -> y through the registered op, as vLLM's cuda_flashinfer_bf16_gemm calls it."""
    from flashinfer import mm_bf16

    from bench.anatomy_ops import register_gemm_op  # torch's custom-op machinery: only when the op is built
    op = register_gemm_op(flashinfer_bf16_mm(mm_bf16), name=f"vllm_bf16_gemm_{backend.replace('-', '_')}",
                          eligible=vllm_check(backend, sm_of()))

    def linear(x, w):
        return op(x, w, None, pdl, backend)
    return linear
