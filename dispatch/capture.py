"""Whether this thread is capturing a CUDA graph (the `graph` regime), as a flag that torch's CUDA graph class keeps.

Asking CUDA (cudaStreamIsCapturing on the current stream) costs more host time per call than reading a thread-local
counter (`calibrate host-cost` measures both). The counter is kept by wrapping `torch.cuda.CUDAGraph.capture_begin`
and `capture_end` (dispatch.install(), at the first bind, linear or op call), which every capture made through torch
goes through: `torch.cuda.graph`, `make_graphed_callables`, torch.compile's CUDA graphs and vLLM's CUDA-graph wrapper.

A capture begun around torch (cudaStreamBeginCapture called from C++) leaves the counter at 0: the dispatcher then
runs its eager choices inside that graph. Those are correct, only not the graph regime's picks. Code that captures
that way calls `dispatch.capture_signal("query")` before binding its layers: CUDA is then asked on every call.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

SIGNALS = ("hooks", "query")
_MARK = "_bf16_linear_bench_capture_hook"


class _Captures(threading.local):
    depth = 0  # captures open in this thread (the class attribute is every new thread's start)


_CAPTURES = _Captures()
_LISTENERS: list[tuple[Callable[[], Any], Callable[[], Any]]] = []  # (enter, exit): other counters kept alike


def add_listener(enter: Callable[[], Any], exit_: Callable[[], Any]) -> None:
    """Counters kept beside this one (the C++ bound layer's, dispatch/native.py), told of every capture begun and
    ended from now on; brought up to this thread's open captures at once."""
    if any(e is enter for e, _ in _LISTENERS):
        return
    _LISTENERS.append((enter, exit_))
    for _ in range(_CAPTURES.depth):
        enter()
# C-level callables, no Python frame per call: the counter (truthy while capturing) and CUDA's own answer
hooked_flag: Callable[[], Any] = functools.partial(getattr, _CAPTURES, "depth")
# (a CPU-only torch has a stand-in that raises: never capturing there)
cuda_query: Callable[[], bool] = (torch._C._cuda_isCurrentStreamCapturing if torch.backends.cuda.is_built()
                                  else lambda: False)


def never() -> bool:
    """The capture test before dispatch.install(): nothing can have been captured through the dispatcher yet."""
    return False



def install(cls: Any = None) -> bool:
    """Wraps cls.capture_begin / capture_end (default torch.cuda.CUDAGraph) to keep the counter; once per class.
    False where the class lacks them (then every capture is invisible to the counter: use signal 'query')."""
    cls = torch.cuda.CUDAGraph if cls is None else cls
    begin, end = getattr(cls, "capture_begin", None), getattr(cls, "capture_end", None)
    if begin is None or end is None:
        return False
    if getattr(begin, _MARK, False):
        return True

    @functools.wraps(begin)
    def capture_begin(self, *args, **kwargs):
        begin(self, *args, **kwargs)
        _CAPTURES.depth += 1  # only once the capture has really begun
        for enter, _ in _LISTENERS:
            enter()

    @functools.wraps(end)
    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:  # a capture that failed has ended too
            if _CAPTURES.depth > 0:
                _CAPTURES.depth -= 1
                for _, exit_ in _LISTENERS:
                    exit_()
    setattr(capture_begin, _MARK, True)
    setattr(capture_end, _MARK, True)
    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    return True


def signal(name: str) -> Callable[[], Any]:
    """The per-call capture test for a signal name: 'hooks' (the counter) or 'query' (CUDA's answer)."""
    if name not in SIGNALS:
        raise ValueError(f"unknown capture signal {name!r}; known: {', '.join(SIGNALS)}")
    return hooked_flag if name == "hooks" else cuda_query
