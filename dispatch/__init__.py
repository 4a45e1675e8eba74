"""Threshold dispatcher for BF16 linears: FlashInfer's low-M backend at M <= threshold, F.linear otherwise.

`dispatch.linear(x, weight, bias=None)` is a drop-in for torch.nn.functional.linear.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.nn.functional as F

from dispatch.backends import BACKENDS, Backend
from dispatch.profiles import detect_profile, this_gpu
from dispatch.table import ThresholdTable, load_table

__all__ = ["linear", "ThresholdTable", "load_table", "configure", "reset"]

# Per CUDA device index: (default threshold, overrides, (low-M kernel, its Backend) or None, SM). Built on first use.
_DEVICES: dict[int | None, tuple[int, dict[tuple[int, int], int], tuple[Callable, Backend] | None, int]] = {}
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
    table, sm = _FORCED, 0
    if index is not None and index >= 0:  # get_device() is -1 for CPU tensors
        name, sm = this_gpu(index)
        profile = detect_profile(name, sm) if table is None else None
        if profile is not None:
            try:
                table = load_table(profile.name)
            except Exception:
                table = None  # no table for this GPU yet: always F.linear
    if table is None:
        state = (-1, {}, None, sm)  # unknown GPU: always F.linear
    else:
        kernel = _low_m_kernel(table.low_m_backend)
        low_m = (kernel, BACKENDS[table.low_m_backend]) if kernel is not None else None
        state = (table.default_threshold, dict(table.overrides), low_m, sm)
    _DEVICES[key] = state
    return state


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    if not x.shape:  # 0-D: whatever F.linear says of it (an error), as a drop-in must
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    device = x.get_device()  # an int, cheaper than x.device; -1 on the CPU
    state = _DEVICES.get(device)
    threshold, overrides, low_m, sm = state if state is not None else _device_state(device)
    if overrides:
        threshold = overrides.get((weight.shape[0], k), threshold)
    if m > threshold or low_m is None or m == 0 or not low_m[1].accepts(x, weight, bias, sm):
        return F.linear(x, weight, bias)
    out = low_m[0](x.reshape(m, k), weight)
    return out.view(*x.shape[:-1], weight.shape[0])
