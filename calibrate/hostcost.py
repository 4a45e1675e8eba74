"""(GPU) Host time per call of the dispatcher and the lean FlashInfer calls against F.linear, interleaved as the
sweep does it (blocks of 50 calls alternating, the GPU kept busy under each block).

1. Where the dispatcher runs F.linear (above every range of the table; where the ranges reach M = 16384, the first
   M >= 64 at which both regimes choose F.linear): dispatch.linear (Python, and where built C++) and the bound layers
   (dispatch.bind: the Python layer, and where built the C++ layer, also with the GIL held through the launch)
   against F.linear, per catalog shape; the target is the median ratio over shapes.
2. At a low M where a lean call can run: the lean call, FlashInfer's public call and the project's GEMV (Triton's
   launcher) against F.linear."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

import dispatch
import dispatch.layers as dispatch_layers
from bench.hosttime import host_times
from bench.stats import estimate_call_us
from bench.sweep import SweepConfig, require_cuda
from dispatch import capture, native
from dispatch.backends import ATEN, BACKENDS, GEMV, GEMV_RULE, flashinfer_path, lean_path
from dispatch.eligible import accepts, input_ok
from dispatch.gemv import GemvCall
from dispatch.lean import lean_call, public_call
from dispatch.profiles import get_profile
from dispatch.table import load_table
from harness.errors import HarnessError
from harness.io import atomic_write_text
from shapes.catalog import catalog
from shapes.grid import M_MAX

WORST_BOUND = 1.15  # dispatch.linear where it runs F.linear may cost at most this much F.linear's host time
LEAN_M = 8
BIND_AT_LEAN_M = "dispatch.bind (the table's eager choice)"


def _gemv_call(sm: int):
    """The GEMV's call where this GPU runs it (Triton present), else None."""
    if sm not in (GEMV_RULE.sms or ()):
        return None
    try:
        return GemvCall(tune=True)
    except ImportError:
        return None


def bound_layers(w) -> dict[str, object]:
    """The bound layers to time for a weight: 'dispatch.bind [Python]', and where the C++ layer is built
    'dispatch.bind [C++]' and 'dispatch.bind [C++, GIL held]' (the same layer not releasing the GIL for the launch,
    which F.linear releases: what that costs on this host)."""
    layers = {"dispatch.bind [Python]": dispatch.bind(w, native=False)}
    mod = native.module(build_if_missing=True)
    if mod is not None:
        layers["dispatch.bind [C++]"] = layer = dispatch.bind(w, native=True)
        python, entries = dispatch_layers._python_layer(w, None)
        layers["dispatch.bind [C++, GIL held]"] = mod.BoundLinear(w, None, entries or dispatch_layers._no_kernel,
                                                                 python, release_gil=False)
        assert dispatch.layer_kind(layer) == "C++"
    return layers


def drop_ins(x, w) -> dict[str, object]:
    """dispatch.linear to time: 'dispatch.linear [Python]', and where the C++ one is built 'dispatch.linear [C++]'
    (a fresh one, so its memory starts empty as the Python one's does after configure)."""
    fns = {"dispatch.linear [Python]": lambda: dispatch_layers._linear_python(x, w)}
    native_linear = dispatch_layers._native_linear()
    if native_linear is not None:
        fns["dispatch.linear [C++]"] = lambda: native_linear(x, w)
    return fns


HEADER = "part,n,k,m,path,host_us,f_linear_host_us,ratio"


def _row(part: str, n: int, k: int, m: int, name: str, host_us: float, f_linear_us: float) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow([part, n, k, m, name, f"{host_us:.3f}", f"{f_linear_us:.3f}",
                                                 f"{host_us / f_linear_us:.4f}"])
    return buf.getvalue()


def load_host_cost(path: str | Path) -> pd.DataFrame:
    """A host-cost CSV. host-cost-9..11 were written before path names were quoted: a name with a comma in it
    ('dispatch.bind [C++, GIL held]') spans several fields there, between the four first and the three last."""
    rows = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        for fields in reader:
            if len(fields) > len(header):
                fields = [*fields[:4], ",".join(fields[4:-3]), *fields[-3:]]
            rows.append(fields)
    df = pd.DataFrame(rows, columns=header)
    for c in ("n", "k", "m"):
        df[c] = df[c].astype(int)
    for c in ("host_us", "f_linear_host_us", "ratio"):
        df[c] = df[c].astype(float)
    return df


def f_linear_m(table, n: int, k: int) -> tuple[int, str] | None:
    """The M to time the dispatcher's F.linear choice at, and which kind: 'above' every range, or 'aten-both' (the
    first M >= 64 of a grid in which both regimes choose F.linear, below a later range); None where there is none."""
    m = max(table.threshold(n, k) + 1, 64)
    if m <= M_MAX:
        return m, "above"
    for m in sorted({64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288}):
        if table.choose(n, k, m, "graph") == table.choose(n, k, m, "eager") == ATEN:
            return m, "aten-both"
    return None


def run_host_cost(profile_name: str, calls: int, out: Path | None) -> int:
    require_cuda()
    profile = get_profile(profile_name)
    table = load_table(profile_name)
    dispatch.configure(table)
    rows = [HEADER]
    try:
        above = _time_where_f_linear(table, profile, calls, rows)
        lean_ratios = _time_at_lean_m(table, profile, calls, rows)
    finally:
        dispatch.reset()
    if out:
        atomic_write_text(out, "\n".join(rows) + "\n")
    _summarise(above, lean_ratios)
    return 0


def _time_where_f_linear(table, profile, calls: int, rows: list[str]) -> dict[str, list[float]]:
    """Each catalog shape at an M where both regimes of the table run F.linear: every layer's host time over
    F.linear's (what a dispatching layer costs where it gains nothing)."""
    import torch
    import torch.nn.functional as F
    above: dict[str, list[float]] = {}
    for shape in catalog():
        where = f_linear_m(table, shape.n, shape.k)
        if where is None:
            print(f"{shape.name:16s} no M where both regimes run F.linear to time", flush=True)
            continue
        m, part = where
        x = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
        layers = bound_layers(w)
        # as the sweep does: a call whose GPU time dwarfs its host time gets few calls (every call also runs on
        # the GPU, and the blocks wait for it)
        gpu_bound = (estimate_call_us(m, shape.n, shape.k, profile.sizing_tflops, profile.sizing_gbps)
                     >= SweepConfig.gpu_bound_us)
        fns = {"F.linear": lambda: F.linear(x, w), **drop_ins(x, w)}
        fns.update({name: (lambda layer=layer: layer(x)) for name, layer in layers.items()})
        host = host_times(fns, calls=5 if gpu_bound else 50, rounds=5 if gpu_bound else max(1, calls // 50))
        a = host["F.linear"][0]
        line = f"{shape.name:16s} M={m:5d} ({part})  F.linear {a:7.2f} µs"
        for name in fns:
            if name == "F.linear":
                continue
            above.setdefault(name, []).append(host[name][0] / a)
            rows.append(_row(part, shape.n, shape.k, m, name, host[name][0], a))
            line += f"  {name} {host[name][0]:7.2f} µs ({host[name][0] / a:.3f})"
        print(line, flush=True)
    return above


def _lean_fns(profile, x, w, gemv) -> dict:
    """At LEAN_M: F.linear, the bound layers, their per-call pieces, and each backend's lean and public call."""
    import torch.nn.functional as F

    layers = bound_layers(w)
    device, align = w.get_device(), BACKENDS[profile.low_m_backend].align_bytes
    # the bound layer's own per-call pieces, to set against its excess over the lean call it runs: the capture
    # test it calls (the hooked counter) and the CUDA query it replaced, and the activation checks (here as a
    # function call; the bound layer inlines them)
    fns = {"F.linear": lambda: F.linear(x, w),
           **{f"{BIND_AT_LEAN_M} {name[len('dispatch.bind '):]}": (lambda layer=layer: layer(x))
              for name, layer in layers.items()},
           "part: capture test (hooks)": capture.hooked_flag,
           "part: capture query (CUDA)": capture.cuda_query,
           "part: activation check": lambda: input_ok(x, device, align)}
    n, k = w.shape
    for b in dict.fromkeys((profile.low_m_backend, "cublaslt")):
        backend = BACKENDS[b]
        if backend.skip_reason(profile.sm, n, k, LEAN_M) or not accepts(backend, x, w, None, profile.sm):
            continue
        lean, public = lean_call(b, backend.pdl(profile.pdl)), public_call(b, backend.pdl(profile.pdl))
        fns[lean_path(b)] = lambda lean=lean: lean(x, w)
        fns[flashinfer_path(b)] = lambda public=public: public(x, w)
    if gemv is not None:  # the GEMV's call, its configuration tuned once per shape before timing
        gemv.tunes_here([w], [x])
        fns[GEMV] = lambda: gemv(x, w)
    return fns


def _time_at_lean_m(table, profile, calls: int, rows: list[str]) -> dict[str, list[float]]:
    """Each catalog shape at LEAN_M: every call's host time over F.linear's."""
    import torch
    lean_ratios: dict[str, list[float]] = {}
    gemv = _gemv_call(profile.sm)
    for shape in catalog():
        x = torch.randn(LEAN_M, shape.k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
        host = host_times(_lean_fns(profile, x, w, gemv), calls=50, rounds=max(1, calls // 200))
        a = host["F.linear"][0]
        line = (f"{shape.name:16s} M={LEAN_M:5d}  eager choice {table.choose(shape.n, shape.k, LEAN_M, 'eager')}"
                f"  F.linear {a:7.2f} µs")
        for name, (v, *_) in host.items():
            if name == "F.linear":
                continue
            lean_ratios.setdefault(name, []).append(v / a)
            rows.append(_row("lean", shape.n, shape.k, LEAN_M, name, v, a))
            line += f"  {name} {v:7.2f} µs ({v / a:.3f})"
        print(line, flush=True)
    return lean_ratios


def _summarise(above: dict[str, list[float]], lean_ratios: dict[str, list[float]]) -> None:
    """Print the medians and refuse a layer in use that costs more than WORST_BOUND where it runs F.linear."""
    print("host time over F.linear's, median over catalog shapes [min, max]:")
    for name, r in {**{f"{k} where it runs F.linear": v for k, v in above.items()}, **lean_ratios}.items():
        print(f"  {name:40s} {np.median(r):.3f} [{min(r):.3f}, {max(r):.3f}] ({len(r)} shapes)")
    in_use = f"dispatch.linear [{dispatch.layer_kind(dispatch.linear)}]"  # what `dispatch.linear` is in this process
    if not above.get(in_use):
        raise HarnessError("no catalog shape has an M where both regimes of the table run F.linear to time")
    worst = max(above[in_use])
    print(f"worst {in_use}/F.linear host-time ratio where it runs F.linear: {worst:.3f} (bound {WORST_BOUND})")
    if worst > WORST_BOUND:
        raise HarnessError(f"{in_use} costs {worst:.2f}x F.linear's host time where it runs F.linear "
                           f"(> {WORST_BOUND})")
