"""The dispatcher's layers and their state (the package docstring, dispatch/__init__.py, says what each public name
does; `dispatch.<name>` loads this module on first use). Every layer consumes one choice per (weight shape, M,
regime): ShapeRule.choice.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from dispatch import capture, gemv
from dispatch import native as native_build  # bind's `native` argument would shadow the module's own name
from dispatch.backends import ATEN, BACKENDS, GEMV, Backend, backend_of, is_lean, rule_of
from dispatch.eligible import accepts, accepts_weight
from dispatch.lean import lean_call, public_call, warn_once
from dispatch.profiles import detect_profile, this_gpu, variant_problem
from dispatch.table import ThresholdTable, check_files, load_table, shipped_table

Kernel = Callable[[Any, Any, Any], Any]  # (x2d, weight, bias) -> y2d, with .into(x2d, weight, out2d)
Pick = tuple[Kernel | None, Backend | None]  # (kernel, its backend), or (None, None) for F.linear
CHOICES_KEPT = 4096  # activation shapes (Python) or M values (C++) remembered per layer; at the cap it starts over
_F_LINEAR = ("F.linear",)  # a remembered choice: F.linear in both regimes


class ShapeRule:
    """What the dispatcher does for one weight shape on one device: per regime ((up_to, kernel, backend), ...), and
    the activation size (M x K elements) above which both regimes run F.linear. `choice(m)` is the one place a
    call's choice is derived; every layer consumes it."""
    __slots__ = ("graph", "eager", "limit_m", "limit_numel", "sm", "f_linear_shapes")

    def __init__(self, table: ThresholdTable | None, n: int, k: int, sm: int, pdl: bool):
        self.sm = sm
        limit = 0
        per: dict[str, tuple] = {}
        for regime in ("graph", "eager"):
            steps = []
            for up_to, path in (table.ranges(n, k, regime) if table is not None else ()):
                kernel = None if path == ATEN else _kernel(path, pdl)
                backend = rule_of(path) if kernel is not None else None
                if backend is not None and backend.sms is not None and sm not in backend.sms:
                    kernel, backend = None, None  # a table from another GPU: its kernels do not run here
                steps.append((up_to, kernel, backend))
                if kernel is not None:
                    limit = max(limit, up_to)
            per[regime] = tuple(steps)
        self.graph, self.eager = per["graph"], per["eager"]
        self.limit_m = limit if limit else -1
        self.limit_numel = limit * k if limit else -1
        self.f_linear_shapes: dict = {}  # activation shapes at which both regimes run F.linear, remembered

    def choice(self, m: int) -> tuple[Pick, Pick]:
        """(graph pick, eager pick) at M."""
        return _at(self.graph, m), _at(self.eager, m)

    def f_linear_in_both(self, m: int) -> bool:
        graph, eager = self.choice(m)
        return graph[0] is None and eager[0] is None


def _at(steps: tuple, m: int) -> Pick:
    return next(((kernel, backend) for up_to, kernel, backend in steps if m <= up_to), (None, None))


@dataclass
class _Dispatcher:
    """Every piece of the dispatcher's process-wide state."""
    forced: ThresholdTable | None = None  # configure(table): used on every device
    devices: dict[int, tuple[ThresholdTable | None, int, bool]] = field(default_factory=dict)  # -> (table, SM, pdl)
    rules: dict[tuple[int, Any], ShapeRule] = field(default_factory=dict)  # (device, weight.shape) -> rule
    layer_rules: dict[tuple, tuple[dict, Callable, Callable]] = field(default_factory=dict)
    kernels: dict[tuple[str, bool], Kernel | None] = field(default_factory=dict)  # (path, pdl) -> kernel
    tactics_loaded: set[str] = field(default_factory=set)
    tactics_from_table: bool = True
    # deterministic(): only the paths measured repeatable (BLB_DETERMINISTIC=1 sets it for a process)
    deterministic: bool = os.environ.get("BLB_DETERMINISTIC", "0") not in ("", "0")
    signal: str | None = None  # the capture signal; None until install()
    capturing: Callable[[], Any] = capture.never


_STATE = _Dispatcher()
_RULES = _STATE.rules  # the fast path's dict, looked up as a global


def install() -> str:
    """Hooks torch's CUDA graph class so that the capture test is a counter (the first bind, linear or op call does
    this; call it first where a layer may first be called inside a capture). Returns the capture signal: 'hooks', or
    'query' where the class cannot be hooked."""
    if _STATE.signal is None:
        capture_signal("hooks" if capture.install() else "query")
    return _STATE.signal


def is_capturing() -> bool:
    """Whether this thread is capturing a CUDA graph (the `graph` regime), by the current capture signal."""
    install()
    return bool(_STATE.capturing())


def capture_signal(name: str | None = None) -> str:
    """The capture test ('hooks': the counter torch's CUDAGraph keeps; 'query': cudaStreamIsCapturing per call);
    with a name, switch to it. dispatch.linear follows at once; a bound layer keeps the signal it was bound with."""
    if name is None:
        return install()
    test = capture.signal(name)
    if name == "hooks" and not capture.install():
        raise RuntimeError("capture_signal('hooks'): this torch's CUDAGraph has no capture_begin/capture_end to hook")
    _STATE.capturing, _STATE.signal = test, name
    return name


def configure(table: ThresholdTable | str | Path | None) -> None:
    """Use this table on every device: a ThresholdTable, or a file or profile name as load_table takes them (None:
    back to the table of each device's GPU profile)."""
    if table is not None and not isinstance(table, ThresholdTable):
        table = load_table(table)
        check_files(table)
    _STATE.forced = table
    _STATE.devices.clear()
    _STATE.rules.clear()
    _STATE.layer_rules.clear()
    forget = getattr(globals().get("linear"), "forget", None)  # the C++ dispatch.linear's memory of shape rules
    if forget is not None:
        forget()


def reset() -> None:
    configure(None)


def deterministic(enabled: bool = True) -> None:
    """Choose only among the paths the table's own run measured repeatable (bitwise the same output on repeated
    calls) in every cell, F.linear elsewhere, as vLLM's batch-invariant mode turns kernels off; BLB_DETERMINISTIC=1
    sets it for a process. A table that records no such measurement is refused at the next bind. Takes effect for
    layers bound after the call."""
    _STATE.deterministic = enabled
    configure(_STATE.forced)


def tactics_from_table(enabled: bool) -> None:
    """Whether the dispatcher loads the FlashInfer tactics its table names (default: yes). The benchmark turns it off:
    it tunes or serves tactics itself, and every path of a run, the dispatcher included, runs those."""
    _STATE.tactics_from_table = enabled


def _kernel(path: str, pdl: bool) -> Kernel | None:
    """The callable of a kernel path; None when its library (FlashInfer, Triton) is not installed (F.linear runs
    instead). The GEMV takes its configurations from the store its table's file filled (dispatch/gemv.py); it never
    tunes, and runs F.linear for a shape the store lacks."""
    key = (path, pdl)
    if key not in _STATE.kernels and path == GEMV:
        try:
            import triton  # noqa: F401
            _STATE.kernels[key] = gemv.GemvCall(tune=False)
        except ImportError:
            _STATE.kernels[key] = None
    if key not in _STATE.kernels:
        try:
            backend = backend_of(path)
            flag = BACKENDS[backend].pdl(pdl)
            _STATE.kernels[key] = lean_call(backend, flag) if is_lean(path) else public_call(backend, flag)
        except ImportError:
            _STATE.kernels[key] = None
    return _STATE.kernels[key]


def _device(index: int) -> tuple[ThresholdTable | None, int, bool]:
    state = _STATE.devices.get(index)
    if state is None:
        table, sm, pdl = _STATE.forced, 0, False
        if index >= 0:  # get_device() is -1 for CPU tensors
            name, sm = this_gpu(index)
            profile = detect_profile(name, sm)
            pdl = profile.pdl if profile is not None else sm >= 90
            if table is None:
                table = _shipped_table(index, name, sm, profile)
        if table is not None and _STATE.deterministic:
            table = table.deterministic()
        state = _STATE.devices[index] = (table if index >= 0 else None, sm, pdl)
        if state[0] is not None:
            _load_tactics(state[0])
    return state


def _shipped_table(index: int, name: str, sm: int, profile: Any) -> ThresholdTable | None:
    """The shipped table of a device's GPU; None (F.linear on every linear, said once) where no profile describes the
    GPU, its profile ships no table, or the GPU is another part than the table was fitted on. A shipped table that
    is missing or does not load (or its tactics or GEMV files) raises its one line: never silently F.linear."""
    fit = "fit one with make table GPU=<profile> on it (README, Where to add things), or pass one: dispatch.configure"
    if profile is None:
        warn_once(f"gpu:{name}", f"no GPU profile describes {name} (SM{sm}); every linear runs F.linear: add one in "
                                 f"dispatch/profiles.py and {fit}")
        return None
    import torch
    props = torch.cuda.get_device_properties(index)
    other = variant_problem(profile, props.multi_processor_count, props.total_memory)
    if other:
        warn_once(f"variant:{name}:{other}", f"{name} has {other}: its split choices were not measured here, so "
                                             f"every linear runs F.linear; {fit}")
        return None
    table = shipped_table(profile.name)
    if table is None:
        warn_once(f"table:{profile.name}", f"no table is shipped for the {profile.name} profile yet; every linear "
                                           f"runs F.linear: {fit}")
    return table


def table_for(weight: Any) -> ThresholdTable | None:
    """The table that serves a weight: its GPU's (configure()'s where one was forced), None for a meta weight."""
    if weight.is_meta:
        return None
    index = weight.get_device()
    return _device(index)[0] if index >= 0 else _STATE.forced


def _load_tactics(table: ThresholdTable) -> None:
    """FlashInfer's autotuner cache the table was fitted with, loaded once per process, so that the lean calls
    resolve the tactics that were measured. FlashInfer refuses a file from another environment (version, CUDA,
    cuBLAS, cuDNN, GPU): then its calls run the fallback tactic, and this says so once. The GEMV's configurations
    likewise (a file that does not load leaves its shapes on F.linear, said once)."""
    _load_gemv_configs(table)
    path = table.tactics
    if not _first_load(path, any(p != ATEN for p in table.paths())):
        return
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
        warn_once(f"tactics:{path}", f"FlashInfer did not load {path} ({why}); the dispatcher's FlashInfer calls run "
                                      f"FlashInfer's fallback tactics, not those its table was fitted with")


def _first_load(path: Path | None, used: bool) -> bool:
    """Whether to load a file a table names beside it now: the table's files are served (tactics_from_table), the
    table names it, uses what it holds, and no earlier table of this process loaded it (marked loaded here)."""
    if not _STATE.tactics_from_table or path is None or not used or str(path) in _STATE.tactics_loaded:
        return False
    _STATE.tactics_loaded.add(str(path))
    return True


def _load_gemv_configs(table: ThresholdTable) -> None:
    path = table.gemv_configs
    if not _first_load(path, GEMV in table.paths()):
        return
    gemv.load(path)  # a file that does not load is its one line (HarnessError), never F.linear in the GEMV's ranges


_ALWAYS_ATEN = ShapeRule(None, 0, 0, 0, False)


def _rule(device: int, weight: Any) -> ShapeRule:
    """The rule of a weight's shape on a device, built on first use; F.linear always for a weight that is not 2-D."""
    key = (device, weight.shape)
    rule = _RULES.get(key)
    if rule is None:
        if weight.dim() != 2:
            return _ALWAYS_ATEN
        install()
        table, sm, pdl = _device(device)
        rule = _RULES[key] = ShapeRule(table, weight.shape[0], weight.shape[1], sm, pdl)
        for steps in (rule.graph, rule.eager):
            for _, kernel, backend in steps:
                if backend is not None and backend.path == GEMV:
                    kernel.prepare(weight.shape[0], weight.shape[1], weight.device)  # workspaces outside capture
    return rule


_f_linear = F.linear


def _linear_python(x: Any, weight: Any, bias: Any = None) -> Any:
    # The fast path (F.linear in both regimes: above every range, or an activation shape remembered as such) is two
    # dict lookups and one comparison; see calibrate host-cost.
    rule = _RULES.get((x.get_device(), weight.shape)) or _rule(x.get_device(), weight)
    numel = x.numel()
    if numel > rule.limit_numel or x.shape in rule.f_linear_shapes:
        return _f_linear(x, weight, bias)
    if x.dim() == 0 or numel == 0 or x.shape[-1] != weight.shape[1]:  # what F.linear makes of it (maybe an error)
        return _f_linear(x, weight, bias)
    k = weight.shape[1]
    m = numel // k
    graph, eager = rule.choice(m)
    if graph[0] is None and eager[0] is None:  # remembered: the next call takes the fast path
        if len(rule.f_linear_shapes) >= CHOICES_KEPT:
            rule.f_linear_shapes.clear()
        rule.f_linear_shapes[x.shape] = True
        return _f_linear(x, weight, bias)
    kernel, backend = graph if graph[0] is eager[0] or _STATE.capturing() else eager
    if kernel is None or not accepts(backend, x, weight, bias, rule.sm):
        return _f_linear(x, weight, bias)
    if x.dim() == 2:
        return kernel(x, weight, bias)
    return kernel(x.view(m, k), weight, bias).view(*x.shape[:-1], weight.shape[0])


def _layer_rule(device: int, weight: Any, bias: Any) -> tuple[dict, Callable, Callable] | None:
    """What every bound layer of one weight shape (and one kernel eligibility) shares: a memory of activation shape
    -> choice, the function that fills it, and the per-regime kernel entries at an M (what the C++ layer asks). A
    choice is, per regime, the kernel entry (its `into` call, its alignment) or None for F.linear, the 2-D views of
    an N-D input and output, and the output shape. None where no kernel of the table takes this weight."""
    rule = _rule(device, weight)
    n, k = weight.shape[0], weight.shape[1]
    backends = {id(b): b for steps in (rule.graph, rule.eager) for _, kern, b in steps if kern is not None}
    accepted = frozenset(key for key, b in backends.items() if accepts_weight(b, weight, bias, rule.sm))
    if not accepted:
        return None
    key = (device, weight.shape, bias is None, accepted)
    if key in _STATE.layer_rules:
        return _STATE.layer_rules[key]
    entries: dict[int, tuple] = {}

    def entry(pick: Pick) -> tuple | None:  # one (into, alignment) object per kernel
        kernel, backend = pick
        if kernel is None or id(backend) not in accepted:
            return None  # a kernel that does not take this weight becomes F.linear
        return entries.setdefault(id(kernel), (kernel.into, backend.align_bytes))

    def entries_at(m: int) -> tuple[tuple | None, tuple | None]:
        """(graph, eager) entries at M: one object where both regimes choose the same kernel."""
        graph, eager = rule.choice(m)
        return entry(graph), entry(eager)
    choices: dict = {}

    def choose(shape: Any) -> tuple:
        numel = 1
        for d in shape:
            numel *= d
        c = _F_LINEAR
        if len(shape) and numel and shape[-1] == k:
            m = numel // k
            graph, eager = entries_at(m)
            if graph is not None or eager is not None:
                flat = None if len(shape) == 2 else ((m, k), (m, n))
                c = (graph, eager, flat, (*shape[:-1], n))
        if len(choices) >= CHOICES_KEPT:
            choices.clear()
        choices[shape] = c
        return c
    _STATE.layer_rules[key] = (choices, choose, entries_at)
    return choices, choose, entries_at


def _no_kernel(m: int) -> tuple[None, None]:
    return None, None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def bind(weight: Any, bias: Any = None, native: bool | None = None) -> Callable[[Any], Any]:
    """The dispatcher for one layer, a callable x -> y. Everything that depends on the weight is resolved here: the
    table's ranges, the kernels, and which of them take this weight (one that does not becomes F.linear). Per call:
    the activation's M looks up the remembered choice; where it is F.linear, that is all; where it is a kernel, the
    capture test where the two regimes differ, the activation's own checks (dtype, contiguity, alignment, device:
    eligible.input_ok, inlined) and the kernel writing into an output of the remembered shape. The Python layer
    remembers choices per activation shape, shared by the layers of one weight shape; the C++ layer per M, its own.

    native: None (default) returns the C++ layer where it is built (by the first bind where a compiler is there, or
    by python -m dispatch build-native) and can serve (the capture signal is 'hooks', weight and bias are plain
    tensors), else the Python layer; False the Python layer; True the C++ layer or a RuntimeError saying why not.
    layer_kind tells which one a layer is."""
    if weight.dim() != 2:
        raise ValueError(f"dispatch.bind needs a 2-D weight [N, K], got shape {tuple(weight.shape)}")
    python_layer, entries = _python_layer(weight, bias)
    if native is False:
        return python_layer
    mod = native_build.module(build_if_missing=True)
    why = ("it is not built (python -m dispatch build-native; no C++ compiler or ninja, or BLB_NATIVE_BUILD=0) or "
           "BLB_NATIVE=0" if mod is None
           else f"the capture signal is {_STATE.signal!r} (it keeps the hooks' counter)" if _STATE.signal != "hooks"
           else "the weight or bias is a tensor subclass" if type(weight) not in _PLAIN
           or (bias is not None and type(bias) not in _PLAIN) else None)
    if why is not None:
        if native:
            raise RuntimeError(f"dispatch.bind(native=True): no C++ layer, {why}")
        return python_layer
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
    remembered, f_linear, capturing, once, bf16 = choices.get, _f_linear, _STATE.capturing, _F_LINEAR, torch.bfloat16

    # One function, no helper call on the way to the kernel: every step here is host time per call.
    def bound_linear(x: Any) -> Any:
        shape = x.shape
        c = remembered(shape) or choose(shape)
        if c is once:
            return f_linear(x, weight, bias)
        graph, eager, flat, out_shape = c
        use = graph if graph is eager or capturing() else eager
        if (use is None or x.dtype is not bf16 or not x.is_contiguous() or x.data_ptr() % use[1]
                or x.get_device() != device):
            return f_linear(x, weight, bias)
        out = x.new_empty(out_shape)
        if flat is None:
            use[0](x, weight, out)
        else:
            use[0](x.view(flat[0]), weight, out.view(flat[1]))
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
    mod = native_build.module(build_if_missing=True)
    return None if mod is None else mod.Linear(_linear_rule_of, _linear_python, torch.nn.Parameter)


def __getattr__(name: str) -> Any:
    # dispatch.linear: the C++ one where `python -m dispatch build-native` built it, else the Python one, looked up
    # on first use (not at import). layer_kind(dispatch.linear) says which.
    if name == "linear":
        fn = globals()["linear"] = _native_linear() or _linear_python
        return fn
    raise AttributeError(f"module 'dispatch.layers' has no attribute {name!r}")
