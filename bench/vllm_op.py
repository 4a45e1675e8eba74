"""(GPU) FlashInfer called the way vLLM calls it: through a registered custom op with vLLM's per-call check.

vLLM 0.33.0 (vllm/model_executor/layers/utils.py) registers `torch.ops.vllm.cuda_flashinfer_bf16_gemm` with
direct_register_custom_op (vllm/utils/torch_utils.py: Library.define + Library.impl on the CUDA dispatch key, a fake
impl for torch.compile). Its impl, cuda_flashinfer_bf16_gemm_impl, runs the backend's can_implement check, F.linear
where it fails, else `flashinfer_bf16_mm` (mm_bf16 with out_dtype bf16) on the 2-D view. Public mm_bf16 called
directly leaves the dispatcher hop and the check out, which understates vLLM's eager host cost.

The op here is that op, under the harness's own library name. For cute-dsl its check is vLLM's
(dispatch.vllm.can_use_cutedsl); for another backend, which vLLM has no entry for (TinyGEMM on SM90: the mechanism a
vLLM change would use), the check is that backend's own rule (dispatch/backends.py).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from dispatch.backends import BACKENDS
from dispatch.vllm import FLAG_BACKEND, can_use_cutedsl

OP_LIB = "blb_vllm"
OP_NAME = "cuda_flashinfer_bf16_gemm"
_LIB: Any = None
_SM: list[int] = []  # the SM the op's checks ask about, read once when the op is registered


def _check(backend: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if backend == FLAG_BACKEND:
        return can_use_cutedsl(_SM[0], x, weight, bias)
    return x.ndim >= 1 and x.shape[-1] == weight.shape[-1] and BACKENDS[backend].accepts(x, weight, bias, _SM[0])


def _impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pdl: bool,
          vllm_backend: str) -> torch.Tensor:
    if not _check(vllm_backend, x, weight, bias):
        return F.linear(x, weight, bias)
    import flashinfer
    k, n = x.shape[-1], weight.shape[0]
    out = flashinfer.mm_bf16(x.view(-1, k), weight.t(), bias=bias, pdl=pdl, out_dtype=torch.bfloat16,
                             backend=vllm_backend)
    return out.view(*x.shape[:-1], n)


def _fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pdl: bool,
          vllm_backend: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _register() -> None:
    global _LIB
    if _LIB is not None:
        return
    from dispatch.profiles import sm_of
    _SM.append(sm_of())
    lib = torch.library.Library(OP_LIB, "FRAGMENT")
    lib.define(f"{OP_NAME}(Tensor x, Tensor weight, Tensor? bias, bool pdl, str vllm_backend) -> Tensor")
    lib.impl(OP_NAME, _impl, dispatch_key="CUDA")
    lib._register_fake(OP_NAME, _fake)
    _LIB = lib


def op_call(backend: str, pdl: bool) -> Callable[[Any, Any], Any]:
    """(x, w) -> y through the registered op, as vLLM's cuda_flashinfer_bf16_gemm calls it."""
    _register()
    op = getattr(getattr(torch.ops, OP_LIB), OP_NAME)

    def linear(x, w):
        return op(x, w, None, pdl, backend)
    return linear
