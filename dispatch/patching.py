"""dispatch.patch(model): every eligible linear of a torch module served by a bound layer, in one call.

Eligible: a plain `nn.Linear` without bias whose weight is a 2-D bf16 tensor. The LM head is left as it is by default
(vLLM runs it with F.linear: dispatch/vllm.py). Patch after the weights are loaded and on their device: a bound layer
resolves its choices for the weight it was bound to. `handle.remove()` puts every module back exactly as it was.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class PatchHandle:
    """What patch() changed: (qualified name, module) per patched linear; remove() undoes it."""
    patched: list[tuple[str, Any]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.patched]

    def __len__(self) -> int:
        return len(self.patched)

    def remove(self) -> None:
        for _, module in self.patched:
            module.__dict__.pop("forward", None)  # the class's own forward shows again
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
    import torch
    return (type(module) is torch.nn.Linear and module.bias is None and module.weight.dtype == torch.bfloat16
            and module.weight.dim() == 2)


def patch(model: Any, lm_head: bool = False, compiled: bool = False) -> PatchHandle:
    """Serve every eligible linear of `model` by dispatch.bind (or, `compiled`, through the custom op
    torch.ops.bf16_linear_bench.linear, which torch.compile keeps as one opaque call). Returns the handle."""
    import dispatch
    handle = PatchHandle()
    for name, module in model.named_modules():
        if not eligible(module) or "forward" in module.__dict__ or (not lm_head and _is_lm_head(model, name, module)):
            continue
        if compiled:
            op = dispatch.op()
            forward: Callable[[Any], Any] = (lambda w: lambda x: op(x, w, None))(module.weight)
        else:
            forward = dispatch.bind(module.weight)
        module.forward = forward
        handle.patched.append((name, module))
    return handle
