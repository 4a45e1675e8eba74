"""`dispatch.linear` as a torch custom op, for code under torch.compile: the compiled graph holds one opaque call,
and the capture check and the range lookup run inside it when it executes (at CUDA-graph capture, that is the
`graph` regime). No `from __future__ import annotations` here: the op's schema is read from these hints."""
from typing import Optional

import torch

from dispatch import layers

_OP = None


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    """The linear's gradients, as F.linear's autograd gives them (plain matrix products: training takes the
    dispatcher's forward, never a backward of its own)."""
    x, weight = ctx.saved_tensors
    flat = grad.reshape(-1, grad.shape[-1])
    gx = grad @ weight if ctx.needs_input_grad[0] else None
    gw = flat.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
    gb = flat.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb


def op():
    """torch.ops.bf16_linear_bench.linear(x, weight, bias): the dispatcher's `linear` as an opaque custom op with a fake
    (meta) implementation and F.linear's gradients, registered on first use."""
    global _OP
    if _OP is None:
        @torch.library.custom_op("bf16_linear_bench::linear", mutates_args=())
        def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
            return layers.linear(x, weight, bias)

        @_linear.register_fake
        def _(x, weight, bias=None):
            return x.new_empty((*x.shape[:-1], weight.shape[0]))

        _linear.register_autograd(_backward, setup_context=_setup_context)
        _OP = torch.ops.bf16_linear_bench.linear
    return _OP
