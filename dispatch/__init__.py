"""The BF16 linear dispatcher: per weight shape, regime and M, F.linear or a FlashInfer kernel, by the GPU's table.

- `dispatch.bind(weight, bias=None)` -> a callable x -> y: what a model does once per layer at weight loading. The
  table rows, the kernels and the weight's eligibility are resolved then; a call looks its activation's choice up
  in a memory. The layer is the C++ one where `python -m dispatch build-native` built it (dispatch/native.py), else
  the Python one; both make the same choices.
- `dispatch.linear(x, weight, bias=None)`: a drop-in for torch.nn.functional.linear, for ad-hoc use; C++ where the
  layer is built (it runs F.linear's kernel itself where both regimes choose it), else Python.
- `dispatch.op()`: the same as a torch custom op with a fake implementation, for code under torch.compile.

The regime is read per call: while this thread is capturing a CUDA graph only GPU time counts (the `graph` ranges),
otherwise host time counts too (the `eager` ranges). By default the capture test is a counter that torch's CUDA
graph class keeps (dispatch/capture.py, hooked in at import); `capture_signal("query")` asks CUDA on every call
instead. Where the table has `idle` ranges for a shape and M that differ from eager's, an eager call runs the idle
choice (less host time per call) while the idle signal says the GPU is waiting on the host: by default ('pace')
while this thread's host runs slow, timed on those calls themselves (capture.pace_record); with
`idle_signal("stream")` where CUDA says the current stream has drained (capture.stream_idle).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from dispatch import capture
from dispatch.backends import ATEN, BACKENDS, backend_of, is_lean
from dispatch.profiles import detect_profile, this_gpu
from dispatch.table import IDLE, REGIMES, ThresholdTable, load_table

__all__ = ["bind", "layer_kind", "linear", "op", "ThresholdTable", "load_table", "configure", "reset",
           "is_capturing", "capture_signal", "idle_signal", "pace_counts"]

Kernel = Callable[[Any, Any, Any], Any]  # (x2d, weight, bias) -> y2d
_FORCED: ThresholdTable | None = None
_DEVICES: dict[int, tuple[ThresholdTable | None, int, bool]] = {}  # device -> (table, SM, pdl)
_SHAPES: dict[tuple[int, Any], "_ShapeRule"] = {}  # (device, weight.shape) -> rule
_KERNELS: dict[tuple[str, bool], Kernel | None] = {}  # (path, pdl) -> kernel
_TACTICS_LOADED: set[str] = set()
_TACTICS_FROM_TABLE = [True]


# The per-call capture test: the counter kept by hooks on torch.cuda.CUDAGraph, or CUDA's own query where the hooks
# cannot be installed (a torch whose CUDAGraph has no capture_begin/capture_end)
_SIGNAL = ["hooks" if capture.install() else "query"]
_capturing = capture.signal(_SIGNAL[0])


def is_capturing() -> bool:
    """Whether this thread is capturing a CUDA graph (the `graph` regime), by the current capture signal."""
    return bool(_capturing())


def capture_signal(name: str | None = None) -> str:
    """The capture test ('hooks': the counter torch's CUDAGraph keeps; 'query': cudaStreamIsCapturing per call);
    with a name, switch to it. dispatch.linear follows at once; a bound layer keeps the signal it was bound with."""
    global _capturing
    if name is not None:
        _capturing = capture.signal(name)
        _SIGNAL[0] = name
    return _SIGNAL[0]


_IDLE_SIGNAL = ["pace"]


def idle_signal(name: str | None = None) -> str:
    """What runs the table's idle choice where it differs from the eager one: 'pace' (default; this thread's host runs
    slow, timed on those calls) or 'stream' (CUDA says the current stream has drained); with a name, switch to it.
    Process-wide: every layer follows at once, bound before or after."""
    if name is not None:
        if name not in capture.IDLE_SIGNALS:
            raise ValueError(f"unknown idle signal {name!r}; known: {', '.join(capture.IDLE_SIGNALS)}")
        _IDLE_SIGNAL[0] = name
        from dispatch import native
        mod = native.module()
        if mod is not None:
            mod.set_idle_signal(capture.IDLE_SIGNALS.index(name))
    return _IDLE_SIGNAL[0]


def pace_config(weight: float | None = None, enter: float | None = None, exit_: float | None = None,
                cap: float | None = None) -> tuple[float, float, float, float]:
    """The pace's (weight of a call in the moving average, level that enters the slow phase, level that leaves it,
    cap of one call's ratio), both layers; with values, set those first. For measuring the signal, not for users."""
    w, e, x, c = (capture.PACE_WEIGHT if weight is None else weight, capture.SLOW_ENTER if enter is None else enter,
                  capture.SLOW_EXIT if exit_ is None else exit_, capture.RATIO_CAP if cap is None else cap)
    if not (0 < w <= 1 and x <= e and c >= 1):
        raise ValueError("pace_config: 0 < weight <= 1, exit <= enter, cap >= 1")
    capture.PACE_WEIGHT, capture.SLOW_ENTER, capture.SLOW_EXIT, capture.RATIO_CAP = w, e, x, c
    from dispatch import native
    mod = native.module()
    if mod is not None:
        mod.pace_config(w, e, x, c)
    return w, e, x, c


def pace_counts() -> tuple[int, int]:
    """This thread's paced calls so far (where idle and eager choices differed, signal 'pace'): (ran the eager
    choice, ran the idle one), the C++ layer's and the Python layer's together."""
    from dispatch import native
    mod = native.module()
    py = capture.PACE
    cpp = mod.pace_state()[2:] if mod is not None else (0, 0)
    return py.eager_calls + cpp[0], py.idle_calls + cpp[1]


def configure(table: ThresholdTable | None) -> None:
    """Use this table on every device (None: back to the table of each device's GPU profile)."""
    global _FORCED
    _FORCED = table
    _DEVICES.clear()
    _SHAPES.clear()
    _LAYER_RULES.clear()
    forget = getattr(linear, "forget", None)  # the C++ dispatch.linear's memory of shape rules
    if forget is not None:
        forget()


def reset() -> None:
    configure(None)


def tactics_from_table(enabled: bool) -> None:
    """Whether the dispatcher loads the FlashInfer tactics its table names (default: yes). The benchmark turns it off:
    it tunes or serves tactics itself, and every path of a run, the dispatcher included, runs those."""
    _TACTICS_FROM_TABLE[0] = enabled


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
        if state[0] is not None:
            _load_tactics(state[0])
    return state


def _load_tactics(table: ThresholdTable) -> None:
    """FlashInfer's autotuner cache the table was fitted with, loaded once per process, so that the lean calls
    resolve the tactics that were measured. FlashInfer refuses a file from another environment (version, CUDA,
    cuBLAS, cuDNN, GPU): then its calls run the fallback tactic, and this says so once."""
    path = table.tactics
    if (not _TACTICS_FROM_TABLE[0] or path is None or str(path) in _TACTICS_LOADED
            or not any(p != ATEN for p in table.paths())):
        return
    _TACTICS_LOADED.add(str(path))
    try:
        from flashinfer.autotuner import AutoTuner
        loaded = AutoTuner.get().load_configs(str(path))
    except ImportError:
        return
    except Exception as exc:
        loaded, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = "written in another environment (FlashInfer, CUDA, cuBLAS, cuDNN or GPU differ)"
    if not loaded:
        from dispatch.lean import warn_once
        warn_once(f"tactics:{path}", f"FlashInfer did not load {path} ({why}); the dispatcher's FlashInfer calls run "
                                      f"FlashInfer's fallback tactics, not those its table was fitted with")


class _ShapeRule:
    """What the dispatcher does for one weight shape on one device: per regime ((up_to, kernel, backend), ...), the
    activation size (M x K elements) above which every regime runs F.linear, and the activation shapes below it at
    which both regimes run F.linear (remembered as they come, at most CHOICES_KEPT)."""
    __slots__ = ("limit_m", "limit_numel", "graph", "eager", "idle", "sm", "device", "f_linear_shapes", "fastest")

    def __init__(self, table: ThresholdTable | None, n: int, k: int, sm: int, pdl: bool, device: int = -1):
        self.sm, self.device = sm, device
        limit = 0
        per: dict[str, tuple] = {}
        # idle steps only where they differ from eager's: elsewhere no call asks the idle signal
        for regime in (*REGIMES, IDLE) if table is not None and table.has_idle(n, k) else REGIMES:
            steps = []
            for up_to, path in (table.ranges(n, k, regime) if table is not None else ()):
                kernel = None if path == ATEN else _kernel(path, pdl)
                backend = BACKENDS[backend_of(path)] if kernel is not None else None
                if backend is not None and backend.sms is not None and sm not in backend.sms:
                    kernel, backend = None, None  # a table from another GPU: its kernels do not run here
                steps.append((up_to, kernel, backend))
                if kernel is not None:
                    limit = max(limit, up_to)
            per[regime] = tuple(steps)
        self.graph, self.eager, self.idle = per["graph"], per["eager"], per.get(IDLE)
        self.limit_m = limit if limit else -1
        self.limit_numel = limit * k if limit else -1
        self.f_linear_shapes: dict = {}
        self.fastest: dict = {}  # the idle signal pace: the fastest paced call per kernel, ns

    def pick(self, m: int) -> tuple[Kernel | None, Any, bool]:
        """(kernel or None for F.linear, its backend, whether the call is paced: to be timed for the idle signal)."""
        if _capturing():
            return (*_at(self.graph, m), False)
        eager = _at(self.eager, m)
        if self.idle is not None:
            idle = _at(self.idle, m)
            if idle[0] is not eager[0]:
                if _IDLE_SIGNAL[0] == "pace":
                    pace = capture.PACE
                    if pace.slow:
                        pace.idle_calls += 1
                        return (*idle, True)
                    pace.eager_calls += 1
                    return (*eager, True)
                if capture.stream_idle(self.device):
                    return (*idle, False)
        return (*eager, False)

    def f_linear_in_both(self, m: int) -> bool:
        """Whether every regime (idle included) runs F.linear at M."""
        return all(_at(steps, m)[0] is None for steps in (self.graph, self.eager, self.idle or ()))


def _at(steps: tuple, m: int) -> tuple[Kernel | None, Any]:
    return next(((kernel, backend) for up_to, kernel, backend in steps if m <= up_to), (None, None))


_ALWAYS_ATEN = _ShapeRule(None, 0, 0, 0, False)


def _rule(device: int, weight: Any) -> _ShapeRule:
    """The rule of a weight's shape on a device, built on first use; F.linear always for a weight that is not 2-D."""
    key = (device, weight.shape)
    rule = _SHAPES.get(key)
    if rule is None:
        if weight.dim() != 2:
            return _ALWAYS_ATEN
        table, sm, pdl = _device(device)
        rule = _SHAPES[key] = _ShapeRule(table, weight.shape[0], weight.shape[1], sm, pdl, device)
    return rule


_f_linear = F.linear


def _linear_python(x: Any, weight: Any, bias: Any = None) -> Any:
    # The fast path (F.linear in both regimes: above every range, or an activation shape remembered as such) is two
    # dict lookups and one comparison; see calibrate host-cost.
    rule = _SHAPES.get((x.get_device(), weight.shape)) or _rule(x.get_device(), weight)
    numel = x.numel()
    if numel > rule.limit_numel or x.shape in rule.f_linear_shapes:
        return _f_linear(x, weight, bias)
    return _below_limit(x, weight, bias, rule, numel)


def _below_limit(x: Any, weight: Any, bias: Any, rule: _ShapeRule, numel: int) -> Any:
    if x.dim() == 0 or numel == 0 or x.shape[-1] != weight.shape[1]:  # what F.linear makes of it (maybe an error)
        return _f_linear(x, weight, bias)
    k = weight.shape[1]
    m = numel // k
    if rule.f_linear_in_both(m):  # the table's answer for this shape: remembered, the next call takes the fast path
        if len(rule.f_linear_shapes) >= CHOICES_KEPT:
            rule.f_linear_shapes.clear()
        rule.f_linear_shapes[x.shape] = True
        return _f_linear(x, weight, bias)
    kernel, backend, paced = rule.pick(m)
    t0 = time.perf_counter_ns() if paced else 0
    if kernel is None or not backend.accepts(x, weight, bias, rule.sm):
        y = _f_linear(x, weight, bias)
    elif x.dim() == 2:
        y = kernel(x, weight, bias)
    else:
        y = kernel(x.view(m, k), weight, bias).view(*x.shape[:-1], weight.shape[0])
    if paced:
        capture.pace_record(rule.fastest, id(kernel), time.perf_counter_ns() - t0)
    return y


_F_LINEAR = ("F.linear",)  # a remembered choice: F.linear in both regimes
CHOICES_KEPT = 4096  # activation shapes remembered per layer rule; at the cap the memory starts over (bounded)
# (device, weight shape, bias is None, eligible kernels) -> (choices, choose, entries_at)
_LAYER_RULES: dict[tuple, tuple[dict, Callable, Callable]] = {}


def _layer_rule(device: int, weight: Any, bias: Any) -> tuple[dict, Callable, Callable] | None:
    """What every bound layer of one weight shape (and one kernel eligibility) shares: a memory of activation shape
    -> choice, the function that fills it, and the per-regime kernel entries at an M (what the C++ layer asks). The
    choice depends on the shape alone (M, and whether the last dim is K): per regime the kernel entry (its `into`
    call, its alignment) or None for F.linear, the 2-D views of an N-D input and output, and the output shape. None
    where no kernel of the table takes this weight."""
    rule = _rule(device, weight)
    n, k = weight.shape[0], weight.shape[1]
    backends = {id(b): b for steps in (rule.graph, rule.eager, rule.idle or ()) for _, kern, b in steps
                if kern is not None}
    accepted = frozenset(key for key, b in backends.items() if b.accepts_weight(weight, bias, rule.sm))
    if not accepted:
        return None
    key = (device, weight.shape, bias is None, accepted)
    if key in _LAYER_RULES:
        return _LAYER_RULES[key]
    entries: dict[int, tuple] = {}

    def entry(kernel: Any, backend: Any) -> tuple | None:  # one (into, alignment) object per kernel
        if kernel is None or id(backend) not in accepted:
            return None  # a kernel that does not take this weight becomes F.linear
        return entries.setdefault(id(kernel), (kernel.into, backend.align_bytes))

    def at(steps: tuple, m: int) -> tuple | None:
        return entry(*_at(steps, m))

    def entries_at(m: int) -> tuple[tuple | None, tuple | None, tuple | None]:
        """(graph, eager, idle) entries at M; idle is eager's entry (one object) where the shape has no idle ranges."""
        eager = at(rule.eager, m)
        return at(rule.graph, m), eager, eager if rule.idle is None else at(rule.idle, m)
    choices: dict = {}

    def choose(shape: Any) -> tuple:
        numel = 1
        for d in shape:
            numel *= d
        c = _F_LINEAR
        if len(shape) and numel and shape[-1] == k:
            m = numel // k
            graph, eager, idle = entries_at(m)
            if graph is not None or eager is not None or idle is not None:
                # where the regimes choose the same kernel entry (one object), the capture test and the idle signal
                # are skipped
                flat = None if len(shape) == 2 else ((m, k), (m, n))
                c = (graph, eager, idle, flat, (*shape[:-1], n))
        if len(choices) >= CHOICES_KEPT:
            choices.clear()
        choices[shape] = c
        return c
    _LAYER_RULES[key] = (choices, choose, entries_at)
    return choices, choose, entries_at


def _no_kernel(m: int) -> tuple[None, None, None]:
    return None, None, None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def bind(weight: Any, bias: Any = None, native: bool | None = None) -> Callable[[Any], Any]:
    """The dispatcher for one layer, a callable x -> y. Everything that depends on the weight is resolved here: the
    table's ranges, the kernels, and which of them take this weight (one that does not becomes F.linear). Per call:
    the activation's M looks up the remembered choice; where it is F.linear, that is all; where it is a kernel, the
    capture test where the two regimes differ, the idle signal where idle ranges differ from eager's (an eager call
    only: the call timed for the pace, or the stream test), the activation's own checks (dtype, contiguity,
    alignment, device: backends.input_ok, inlined) and the kernel writing into an output of the remembered shape.
    The Python layer remembers choices per activation shape, shared by the layers of one weight shape; the C++ layer
    per M, its own.

    native: None (default) returns the C++ layer where it is built (python -m dispatch build-native) and can serve
    (the capture signal is 'hooks', weight and bias are plain tensors), else the Python layer; False the Python
    layer; True the C++ layer or a RuntimeError saying why not. Both make the same choices (layer_kind tells which
    one a layer is)."""
    if weight.dim() != 2:
        raise ValueError(f"dispatch.bind needs a 2-D weight [N, K], got shape {tuple(weight.shape)}")
    python_layer, entries = _python_layer(weight, bias)
    if native is False:
        return python_layer
    from dispatch import native as native_build
    mod = native_build.module()
    why = ("it is not built (python -m dispatch build-native) or BLB_NATIVE=0" if mod is None
           else f"the capture signal is {_SIGNAL[0]!r} (it keeps the hooks' counter)" if _SIGNAL[0] != "hooks"
           else "the weight or bias is a tensor subclass" if type(weight) not in _PLAIN
           or (bias is not None and type(bias) not in _PLAIN)
           else "it was built without CUDA, and the table has idle choices for this layer (the idle signal 'stream' "
                "needs CUDA's stream test; rebuild where a CUDA toolkit is)" if _IDLE_SIGNAL[0] == "stream"
           and not mod.STREAM_TEST and _rule(weight.get_device(), weight).idle is not None else None)
    if why is not None:
        if native:
            raise RuntimeError(f"dispatch.bind(native=True): no C++ layer, {why}")
        return python_layer
    mod.set_idle_signal(capture.IDLE_SIGNALS.index(_IDLE_SIGNAL[0]))  # a module loaded after idle_signal(name)
    return mod.BoundLinear(weight, bias, entries or _no_kernel, python_layer)


def layer_kind(layer: Any) -> str:
    """'C++' or 'Python': which bound layer dispatch.bind returned."""
    return "Python" if hasattr(layer, "__code__") else "C++"


def _python_layer(weight: Any, bias: Any) -> tuple[Callable[[Any], Any], Callable | None]:
    """The Python bound layer, and the per-M kernel entries for the C++ layer (None: F.linear at every M)."""
    device = weight.get_device()
    shared = _layer_rule(device, weight, bias)
    if shared is None:  # F.linear at every M in both regimes (no range, or no kernel takes this weight or bias)
        def f_linear_only(x: Any) -> Any:
            return _f_linear(x, weight, bias)
        return f_linear_only, None
    choices, choose, entries_at = shared
    remembered, f_linear, capturing, once, bf16 = choices.get, _f_linear, _capturing, _F_LINEAR, torch.bfloat16
    drained, signal, pace, record, clock = capture.stream_idle, _IDLE_SIGNAL, capture.PACE, capture.pace_record, \
        time.perf_counter_ns
    fastest: dict = {}  # the idle signal pace: this layer's fastest paced call per choice, ns

    # One function, no helper call on the way to the kernel: every step here is host time per call.
    def bound_linear(x: Any) -> Any:
        shape = x.shape
        c = remembered(shape) or choose(shape)
        if c is once:
            return f_linear(x, weight, bias)
        graph, eager, idle, flat, out_shape = c
        t0 = 0
        if graph is eager is idle or capturing():
            use = graph
        elif idle is eager:
            use = eager
        elif signal[0] == "pace":
            t0 = clock()
            if pace.slow:
                use = idle
                pace.idle_calls += 1
            else:
                use = eager
                pace.eager_calls += 1
        else:
            use = idle if drained(device) else eager
        if (use is None or x.dtype is not bf16 or not x.is_contiguous() or x.data_ptr() % use[1]
                or x.get_device() != device):
            out = f_linear(x, weight, bias)
        else:
            out = x.new_empty(out_shape)
            if flat is None:
                use[0](x, weight, out)
            else:
                use[0](x.view(flat[0]), weight, out.view(flat[1]))
        if t0:
            record(fastest, id(use), clock() - t0)
        return out
    return bound_linear, entries_at


def _linear_rule_of(device: int, weight: Any) -> tuple[int, Callable[[int], bool]]:
    """What the C++ dispatch.linear asks once per (device, weight shape): the M above which both regimes run
    F.linear (-1: at every M), and the test of an M below it."""
    rule = _rule(device, weight)
    return rule.limit_m, rule.f_linear_in_both


def _native_linear() -> Callable[..., Any] | None:
    """dispatch.linear in C++ (dispatch/bound_linear.cpp's Linear) where the C++ layer is built, else None. Where
    both regimes run F.linear it calls at::linear itself; every other call goes to the Python dispatch.linear."""
    from dispatch import native
    mod = native.module()
    return None if mod is None else mod.Linear(_linear_rule_of, _linear_python, torch.nn.Parameter)


# dispatch.linear: the C++ one where `python -m dispatch build-native` built it (looked up once, at import), else the
# Python one; both make the same choices. layer_kind(dispatch.linear) says which.
linear: Callable[..., Any] = _native_linear() or _linear_python


def op():
    """torch.ops.bf16_linear_bench.linear(x, weight, bias): `linear` as an opaque custom op with a fake (meta)
    implementation, for code under torch.compile (dispatch/compiled.py)."""
    from dispatch.compiled import register
    return register()


def patch(model: Any, lm_head: bool = False, compiled: bool = False):
    """Every eligible bias-free bf16 nn.Linear of a torch module served by the dispatcher (dispatch/patching.py);
    returns a handle whose remove() restores the module."""
    from dispatch.patching import patch as _patch
    return _patch(model, lm_head, compiled)
