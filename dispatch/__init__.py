"""The BF16 linear dispatcher: per weight shape, regime and M, F.linear or a FlashInfer kernel, by the GPU's table.

- `dispatch.bind(weight, bias=None)` -> a callable x -> y: what a model does once per layer at weight loading. The
  table rows, the kernels and the weight's eligibility are resolved then; a call above every range costs one
  comparison more than F.linear.
- `dispatch.linear(x, weight, bias=None)`: a drop-in for torch.nn.functional.linear, for ad-hoc use.
- `dispatch.op()`: the same as a torch custom op with a fake implementation, for code under torch.compile.

The regime is read per call: while the current stream is capturing a CUDA graph only GPU time counts (the `graph`
ranges), otherwise host time counts too (the `eager` ranges).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from dispatch.backends import ATEN, BACKENDS, backend_of, is_lean
from dispatch.profiles import detect_profile, this_gpu
from dispatch.table import REGIMES, ThresholdTable, load_table

__all__ = ["bind", "linear", "op", "ThresholdTable", "load_table", "configure", "reset", "is_capturing"]

Kernel = Callable[[Any, Any, Any], Any]  # (x2d, weight, bias) -> y2d
_FORCED: ThresholdTable | None = None
_DEVICES: dict[int, tuple[ThresholdTable | None, int, bool]] = {}  # device -> (table, SM, pdl)
_SHAPES: dict[tuple[int, int, int], "_ShapeRule"] = {}  # (device, N, K) -> rule
_KERNELS: dict[tuple[str, bool], Kernel | None] = {}  # (path, pdl) -> kernel


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (the `graph` regime)."""
    return torch.cuda.is_current_stream_capturing()


def configure(table: ThresholdTable | None) -> None:
    """Use this table on every device (None: back to the table of each device's GPU profile)."""
    global _FORCED
    _FORCED = table
    _DEVICES.clear()
    _SHAPES.clear()


def reset() -> None:
    configure(None)


def _kernel(path: str, pdl: bool) -> Kernel | None:
    """The callable of a FlashInfer path; None when FlashInfer is not installed (F.linear runs instead)."""
    key = (path, pdl)
    if key not in _KERNELS:
        try:
            from dispatch.lean import lean_call, public_call
            backend = backend_of(path)
            flag = BACKENDS[backend].pdl(pdl)
            _KERNELS[key] = lean_call(backend, flag) if is_lean(path) else public_call(backend, flag)
        except ImportError:
            _KERNELS[key] = None
    return _KERNELS[key]


def _device(index: int) -> tuple[ThresholdTable | None, int, bool]:
    state = _DEVICES.get(index)
    if state is None:
        table, sm, pdl = _FORCED, 0, False
        if index >= 0:  # get_device() is -1 for CPU tensors
            name, sm = this_gpu(index)
            profile = detect_profile(name, sm)
            pdl = profile.pdl if profile is not None else sm >= 90
            if table is None and profile is not None:
                try:
                    table = load_table(profile.name)
                except Exception:
                    table = None  # no table for this GPU yet: always F.linear
        state = _DEVICES[index] = (table if index >= 0 else None, sm, pdl)
    return state


class _ShapeRule:
    """What the dispatcher does for one weight shape on one device: per regime ((up_to, kernel, backend), ...), and
    the M above which every regime runs F.linear."""
    __slots__ = ("limit", "graph", "eager", "sm")

    def __init__(self, table: ThresholdTable | None, n: int, k: int, sm: int, pdl: bool):
        self.sm = sm
        self.limit = 0
        per: dict[str, tuple] = {}
        for regime in REGIMES:
            steps = []
            for up_to, path in (table.ranges(n, k, regime) if table is not None else ()):
                kernel = None if path == ATEN else _kernel(path, pdl)
                backend = BACKENDS[backend_of(path)] if kernel is not None else None
                if backend is not None and backend.sms is not None and sm not in backend.sms:
                    kernel, backend = None, None  # a table from another GPU: its kernels do not run here
                steps.append((up_to, kernel, backend))
                if kernel is not None:
                    self.limit = max(self.limit, up_to)
            per[regime] = tuple(steps)
        self.graph, self.eager = per["graph"], per["eager"]

    def pick(self, m: int) -> tuple[Kernel | None, Any]:
        for up_to, kernel, backend in (self.graph if is_capturing() else self.eager):
            if m <= up_to:
                return kernel, backend
        return None, None


def _rule(device: int, n: int, k: int) -> _ShapeRule:
    rule = _SHAPES.get((device, n, k))
    if rule is None:
        table, sm, pdl = _device(device)
        rule = _SHAPES[(device, n, k)] = _ShapeRule(table, n, k, sm, pdl)
    return rule


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    if not x.shape:  # 0-D: whatever F.linear says of it (an error), as a drop-in must
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    rule = _SHAPES.get((x.get_device(), weight.shape[0], k)) or _rule(x.get_device(), weight.shape[0], k)
    if m > rule.limit or m == 0:
        return F.linear(x, weight, bias)
    kernel, backend = rule.pick(m)
    if kernel is None or not backend.accepts(x, weight, bias, rule.sm):
        return F.linear(x, weight, bias)
    return kernel(x.reshape(m, k), weight, bias).view(*x.shape[:-1], weight.shape[0])


class BoundLinear:
    """One layer's dispatcher: weight, bias, the shape's rule and which of its kernels take this weight."""
    __slots__ = ("weight", "bias", "rule", "k", "limit_numel", "weight_ok")

    def __init__(self, weight: Any, bias: Any = None):
        self.weight, self.bias = weight, bias
        n, self.k = weight.shape[0], weight.shape[-1]
        self.rule = _rule(weight.get_device(), n, self.k)
        self.limit_numel = self.rule.limit * self.k  # compared with x.numel(): no division on the fast path
        backends = {b for steps in (self.rule.graph, self.rule.eager) for _, _, b in steps if b is not None}
        self.weight_ok = {b.name: b.accepts_weight(weight, bias, self.rule.sm) for b in backends}

    def __call__(self, x: Any) -> Any:
        numel = x.numel()
        if numel > self.limit_numel or numel == 0:
            return F.linear(x, self.weight, self.bias)
        m = numel // self.k
        kernel, backend = self.rule.pick(m)
        if kernel is None or not self.weight_ok[backend.name] or x.shape[-1] != self.k \
                or not backend.accepts_input(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return kernel(x.reshape(m, self.k), self.weight, self.bias).view(*x.shape[:-1], self.weight.shape[0])


def bind(weight: Any, bias: Any = None) -> BoundLinear:
    """The dispatcher for one layer; call it with the activations."""
    if weight.dim() != 2:
        raise ValueError(f"dispatch.bind needs a 2-D weight [N, K], got shape {tuple(weight.shape)}")
    return BoundLinear(weight, bias)


def op():
    """torch.ops.bf16_linear_bench.linear(x, weight, bias): `linear` as an opaque custom op with a fake (meta)
    implementation, for code under torch.compile (dispatch/compiled.py)."""
    from dispatch.compiled import register
    return register()
