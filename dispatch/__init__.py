"""The BF16 linear dispatcher: per weight shape, regime and M, F.linear, a FlashInfer kernel or the project's GEMV,
by the GPU's table.

- `dispatch.bind(weight, bias=None)` -> a callable x -> y: what a model does once per layer at weight loading. The
  table rows, the kernels and the weight's eligibility are resolved then; a call looks its activation's choice up
  in a memory. The layer is the C++ one where it is built (by the first bind where a C++ compiler and ninja are on
  PATH, or by `python -m dispatch build-native`: dispatch/native.py), else the Python one; both consume the same
  choice (ShapeRule.choice in dispatch/layers.py).
- `dispatch.linear(x, weight, bias=None)`: a drop-in for torch.nn.functional.linear, for ad-hoc use.
- `dispatch.op()`: the same as a torch custom op with a fake implementation, for code under torch.compile.
- `dispatch.patch(model)`: every eligible linear of a torch module served by a bound layer.

The regime is read per call: while this thread is capturing a CUDA graph only GPU time counts (the `graph` ranges),
otherwise host time counts too (the `eager` ranges). The capture test is a counter that torch's CUDA graph class
keeps (dispatch/capture.py), hooked in by the first bind, linear or op call (or `dispatch.install()`): importing this
package changes nothing in torch. `capture_signal("query")` asks CUDA on every call instead.

Importing the package imports no torch either: the layers (dispatch/layers.py) load on first use of a name below, so
the analyses and the report read tables, backends and profiles without torch's import time.
"""
from __future__ import annotations

from typing import Any

from dispatch.table import ThresholdTable, load_table

__all__ = ["bind", "layer_kind", "linear", "op", "patch", "install", "ThresholdTable", "load_table", "configure",
           "reset", "is_capturing", "capture_signal", "tactics_from_table", "serve_streams", "deterministic"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'dispatch' has no attribute {name!r}")
    # imported on first use of a name: importing the package loads no torch (the analyses read tables without it)
    if name == "patch":
        from dispatch import patching as owner
    elif name == "op":
        from dispatch import compiled as owner
    elif name == "serve_streams":
        from dispatch import gemv as owner
    else:
        from dispatch import layers as owner
    value = globals()[name] = getattr(owner, name)  # kept here: the next lookup is a plain attribute
    return value
