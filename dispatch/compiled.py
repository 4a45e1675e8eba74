"""`dispatch.linear` as a torch custom op, for code under torch.compile: the compiled graph holds one opaque call,
and the capture check and the range lookup run inside it when it executes (at CUDA-graph capture, that is the
`graph` regime). No `from __future__ import annotations` here: the op's schema is read from these hints."""
from typing import Optional

import torch

import dispatch

_OP = None


def register():
    global _OP
    if _OP is None:
        @torch.library.custom_op("bf16_linear_bench::linear", mutates_args=())
        def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
            return dispatch.linear(x, weight, bias)

        @_linear.register_fake
        def _(x, weight, bias=None):
            return x.new_empty((*x.shape[:-1], weight.shape[0]))
        _OP = torch.ops.bf16_linear_bench.linear
    return _OP
