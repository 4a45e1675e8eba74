"""Which tensors a backend's kernel takes: its rule (dispatch/backends.py) applied to tensors. The dispatcher falls
back to F.linear where a kernel does not take them, instead of letting the kernel raise."""
from __future__ import annotations

from typing import Any

import torch

from dispatch.backends import Backend


def input_ok(x: Any, device: int, align_bytes: int) -> bool:
    """The per-call half of a backend's rule, for a weight on GPU `device`: the activation's dtype, device, layout
    and alignment (device indices compared as ints: cheaper than building torch.device objects on every call). A
    plain function of plain arguments: a bound layer calls it with values resolved at bind time."""
    return (x.dtype is torch.bfloat16 and x.is_contiguous() and x.data_ptr() % align_bytes == 0
            and x.get_device() == device)


def accepts_weight(backend: Backend, weight: Any, bias: Any, sm: int) -> bool:
    """The half of the rule that depends on the weight alone: checked once when a layer is bound."""
    n, k = weight.shape[0], weight.shape[-1]
    return (bias is None and weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.is_cuda
            and weight.is_contiguous() and (backend.sms is None or sm in backend.sms) and n % backend.n_multiple == 0
            and k % backend.k_multiple == 0 and weight.data_ptr() % backend.align_bytes == 0)


def accepts(backend: Backend, x: Any, weight: Any, bias: Any, sm: int) -> bool:
    """Whether the kernel takes these tensors (bf16, contiguous, on one GPU, no bias, shape multiples, alignment)."""
    return accepts_weight(backend, weight, bias, sm) and input_ok(x, weight.get_device(), backend.align_bytes)
