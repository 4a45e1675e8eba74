"""The two opaque custom ops of the anatomy: vLLM's FlashInfer GEMM op (a Python CUDA kernel behind torch.library)
and a null op over F.linear. No `from __future__ import annotations` here: infer_schema reads these hints."""
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from bench.anatomy import can_use_flashinfer, register_op

MmFn = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], bool, str], torch.Tensor]


def make_vllm_impl(mm: MmFn, eligible: Callable = can_use_flashinfer) -> Callable:
    """cuda_flashinfer_bf16_gemm_impl: the eligibility test, a 2-D view, the FlashInfer call, the output view."""
    def flashinfer_bf16_gemm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], pdl: bool,
                             backend: str) -> torch.Tensor:
        if not eligible(x, weight, bias):
            return F.linear(x, weight, bias)
        k = x.shape[-1]
        n = weight.shape[0]
        out = mm(x.view(-1, k), weight.t(), bias, pdl, backend)
        return out.view(*x.shape[:-1], n)
    return flashinfer_bf16_gemm


def _fake(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], pdl: bool, backend: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def null_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return F.linear(x, weight, bias)


def register_gemm_op(mm: MmFn, dispatch_key: str = "CUDA", name: str = "flashinfer_bf16_gemm",
                     eligible: Callable = can_use_flashinfer):
    return register_op(name, make_vllm_impl(mm, eligible), dispatch_key, fake=_fake)


def register_null_op(dispatch_key: str = "CUDA", name: str = "null_linear"):
    return register_op(name, null_linear, dispatch_key)
