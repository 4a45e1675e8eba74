"""Threshold dispatcher for BF16 linears: FlashInfer's low-M backend at M <= threshold, F.linear otherwise.

`dispatch.linear(x, weight, bias=None)` is a drop-in for torch.nn.functional.linear.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.nn.functional as F

from dispatch.table import ThresholdTable, load_table

__all__ = ["linear", "ThresholdTable", "load_table", "configure", "reset"]

# Per CUDA device index: (default threshold, overrides, low-M kernel or None). Built on first use.
_DEVICES: dict[int | None, tuple[int, dict[tuple[int, int], int], Callable | None, int]] = {}
_FORCED: ThresholdTable | None = None


def configure(table: ThresholdTable | None) -> None:
    """Use this table on every device (None: back to the table of each device's GPU profile)."""
    global _FORCED
    _FORCED = table
    _DEVICES.clear()


def reset() -> None:
    configure(None)


def _low_m_kernel(backend: str) -> Callable | None:
    try:
        import flashinfer
    except ImportError:
        return None

    def run(x2d, weight):
        return flashinfer.mm_bf16(x2d, weight.t(), backend=backend)
    return run


def _device_state(index: int | None):
    key = index
    state = _DEVICES.get(key)
    if state is not None:
        return state
    import torch
    from bench.profiles import detect_profile
    table, sm = _FORCED, 0
    if index is not None and index >= 0:  # get_device() is -1 for CPU tensors
        major, minor = torch.cuda.get_device_capability(index)
        sm = major * 10 + minor
        profile = detect_profile(torch.cuda.get_device_name(index), sm) if table is None else None
        if profile is not None:
            try:
                table = load_table(profile.name)
            except Exception:
                table = None  # no table for this GPU yet: always F.linear
    if table is None:
        state = (-1, {}, None, sm)  # unknown GPU: always F.linear
    else:
        state = (table.default_threshold, dict(table.overrides), _low_m_kernel(table.low_m_backend), sm)
    _DEVICES[key] = state
    return state


def _eligible(x: Any, weight: Any, bias: Any, backend_sm: int) -> bool:
    """What the low-M kernels accept: bf16, contiguous, 2-D weight, N % 16 == 0, 16-byte aligned, no bias."""
    import torch
    n, k = weight.shape[0], weight.shape[-1]
    return (bias is None and x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and x.is_cuda and x.device == weight.device and x.is_contiguous() and weight.is_contiguous()
            and n % 16 == 0 and k % 8 == 0 and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0
            and (backend_sm < 100 or k % 128 == 0))


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    if not x.shape:  # 0-D: whatever F.linear says of it (an error), as a drop-in must
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    device = x.get_device()  # an int, cheaper than x.device; -1 on the CPU
    state = _DEVICES.get(device)
    threshold, overrides, kernel, sm = state if state is not None else _device_state(device)
    if overrides:
        threshold = overrides.get((weight.shape[0], k), threshold)
    if m > threshold or kernel is None or m == 0 or not _eligible(x, weight, bias, sm):
        return F.linear(x, weight, bias)
    out = kernel(x.reshape(m, k), weight)
    return out.view(*x.shape[:-1], weight.shape[0])
