"""dispatch.patch(model): every eligible linear of a torch module served by a bound layer, in one call.

Eligible: a plain `nn.Linear` without bias whose weight is a 2-D bf16 tensor. The LM head is left as it is by default
(vLLM runs it with F.linear: dispatch/vllm.py). Patch after the weights are loaded and on their device: a bound layer
resolves its choices for the weight it was bound to. `handle.remove()` puts every module back exactly as it was.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dispatch import layers
from dispatch.compiled import op

BOUND = "_dispatch_bound"  # where a patched linear keeps its binding: (weight, its data_ptr, the bound call)


@dataclass
class PatchHandle:
    """What patch() changed: (qualified name, module) per patched linear, and (name, (N, K)) of those whose shape the
    table of their device does not hold (they run F.linear); remove() undoes it."""
    patched: list[tuple[str, Any]] = field(default_factory=list)
    outside: list[tuple[str, tuple[int, int]]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.patched]

    def __len__(self) -> int:
        return len(self.patched)

    def remove(self) -> None:
        for _, module in self.patched:
            if type(module) in (DispatchedLinear, CompiledDispatchedLinear):
                module.__class__ = torch.nn.Linear  # the class it had (patch takes plain nn.Linear only)
                module.__dict__.pop(BOUND, None)
            module.__dict__.pop("forward", None)  # a forward set on the patched module after patch goes too
        self.patched.clear()


def _is_lm_head(model: Any, name: str, module: Any) -> bool:
    if name.rsplit(".", 1)[-1] == "lm_head":
        return True
    get = getattr(model, "get_output_embeddings", None)
    try:
        return get is not None and get() is module
    except (NotImplementedError, AttributeError):
        return False


def eligible(module: Any) -> bool:
    return (type(module) is torch.nn.Linear and module.bias is None and module.weight.dtype == torch.bfloat16
            and module.weight.dim() == 2)


def _servable(weight: Any) -> bool:
    """A weight the dispatcher can bind: a 2-D bf16 tensor with storage (not on the meta device)."""
    return weight.dim() == 2 and weight.dtype == torch.bfloat16 and not weight.is_meta


class _Dispatched:
    """The forward of a patched nn.Linear: the dispatcher bound to the module's *current* weight. The binding is
    made on first use and made again whenever the weight is another tensor or moved (load_state_dict(assign=True),
    `module.weight = ...`, `.to()`, a meta model materialised); a weight it cannot serve (meta, another dtype) or a
    bias added later runs F.linear. The binding is never copied or pickled: a deepcopy or torch.load binds afresh."""

    def _bind(self, weight: Any) -> Callable[[Any], Any]:
        raise NotImplementedError

    def forward(self, x: Any) -> Any:
        weight, bias = self.weight, self.bias
        bound = self.__dict__.get(BOUND)
        if bias is not None or bound is None or bound[0] is not weight or bound[1] != weight.data_ptr():
            if bias is not None or not _servable(weight):  # a bias set at any time is followed: F.linear runs it
                import torch.nn.functional as F
                return F.linear(x, weight, bias)
            bound = self.__dict__[BOUND] = (weight, weight.data_ptr(), self._bind(weight))
        return bound[2](x)

    def __getstate__(self) -> dict:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        state.pop(BOUND, None)
        return state


class DispatchedLinear(_Dispatched, torch.nn.Linear):
    """An nn.Linear served by dispatch.bind (patch() swaps a module's class to it; remove() swaps it back)."""

    def _bind(self, weight: Any) -> Callable[[Any], Any]:
        return layers.bind(weight)


class CompiledDispatchedLinear(_Dispatched, torch.nn.Linear):
    """An nn.Linear served through the custom op torch.ops.bf16_linear_bench.linear (patch(compiled=True))."""

    def forward(self, x: Any) -> Any:
        return op()(x, self.weight, self.bias)


def patch(model: Any, lm_head: bool = False, compiled: bool = False) -> PatchHandle:
    """Serve every eligible linear of `model` by dispatch.bind (or, `compiled`, through the custom op
    torch.ops.bf16_linear_bench.linear, which torch.compile keeps as one opaque call). Returns the handle. Patch after
    the weights are loaded: a linear whose weight is still on the meta device is bound when it first runs on a real
    one."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"dispatch.patch needs a torch.nn.Module (e.g. a transformers model), got "
                        f"{type(model).__name__}")
    handle = PatchHandle()
    if compiled:  # registered now: torch.compile may trace the model before any eager call
        op()
    for name, module in model.named_modules():
        if not eligible(module) or "forward" in module.__dict__ or (not lm_head and _is_lm_head(model, name, module)):
            continue
        module.__class__ = CompiledDispatchedLinear if compiled else DispatchedLinear
        handle.patched.append((name, module))
    handle.outside = _outside_table(handle.patched)
    if handle.outside:
        shapes = sorted({shape for _, shape in handle.outside})
        warnings.warn(f"dispatch.patch: {len(handle.outside)} of {len(handle.patched)} linears ({len(shapes)} shapes: "
                      f"{', '.join(f'{n}x{k}' for n, k in shapes[:4])}{', ...' if len(shapes) > 4 else ''}) are not "
                      f"in the table and run F.linear; a table of both layouts covers them (python -m tables, "
                      f"whose default is both)", stacklevel=3)
    return handle


def _outside_table(patched: list[tuple[str, Any]]) -> list[tuple[str, tuple[int, int]]]:
    """The patched linears whose (N, K) the table of their weight's device does not hold and whose default rule
    runs F.linear at every M (none where no table is known yet: a weight on the meta device, or a device without
    one; none where the default runs another path somewhere, as a rule for every shape does)."""
    out = []
    for name, module in patched:
        table = layers.table_for(module.weight)
        shape = (int(module.weight.shape[0]), int(module.weight.shape[1]))
        # a shape the table does not hold takes its default ranges: outside only where they run F.linear throughout
        if table is not None and shape not in table.shapes and table.threshold(*shape) == 0:
            out.append((name, shape))
    return out
