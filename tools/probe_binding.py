"""(GPU) A probe, not a command of the harness: where does the bound layer's eager cost go in a measured forward?

In the measured forwards (h200-bound-forward-4..7) dispatch/table-direct in eager was 1.04-1.10 per round at
Qwen3.5-35B-A3B M = 128-512 and Qwen3.5-4B M = 32-128, where most layers are 'graph cuBLASLt / eager F.linear',
and about 1.00 where layers choose one kernel in both regimes. This times, for one model and M, the eager
submission time of whole forwards (paired rounds, shuffled order, gc off) for: all-aten, table-direct (eager),
the bound dispatcher, and a bare closure around F.linear per layer, before and after a CUDA graph of the
dispatcher's forward was captured and freed; and the per-call host time of one such layer.

python -m tools.probe_binding [MODEL] [M] [ROUNDS]
"""
from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from pathlib import Path


def submit_rounds(forwards: dict, rounds: int, seed: int = 0) -> dict[str, list[float]]:
    import torch
    rng = random.Random(seed)
    out = {n: [] for n in forwards}
    for f in forwards.values():
        f()
    torch.cuda.synchronize()
    gc.disable()
    try:
        for _ in range(rounds):
            for n in rng.sample(list(forwards), len(forwards)):
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                forwards[n]()
                out[n].append((time.perf_counter_ns() - t0) / 1e3)
                torch.cuda.synchronize()
    finally:
        gc.enable()
    return out


def pieces(layer, x, w) -> dict:
    """One layer's per-call host time, and the steps of its bound layer on the way to F.linear taken one by one
    (the bound layer's code, cut after each step)."""
    import torch.nn.functional as F

    from dispatch import layers
    choices, once, capturing = layers._layer_rule(w.get_device(), w, None)[0], layers._F_LINEAR, layers._STATE.capturing
    remembered = choices.get
    layer(x)

    def lookup():
        c = remembered(x.shape)
        return c is once

    def lookup_and_test():
        c = remembered(x.shape)
        graph, eager, flat, out_shape = c
        return graph if graph is eager else graph if capturing() else eager

    def closure():
        return F.linear(x, w, None)
    return {"F.linear": lambda: F.linear(x, w), "bound layer": lambda: layer(x), "closure around F.linear": closure,
            "lookup": lookup, "lookup + capture test": lookup_and_test, "capture test": capturing}


def report(label: str, times: dict[str, list[float]], base: str) -> None:
    print(f"-- {label}: eager submission µs per forward, median over rounds; paired ratio to {base} [p10, p90]")
    for n, v in times.items():
        r = sorted(a / b for a, b in zip(v, times[base]))
        print(f"  {n:28s} {statistics.median(v):9.1f}  {statistics.median(r):.3f} "
              f"[{r[len(r) // 10]:.3f}, {r[(9 * len(r)) // 10]:.3f}]", flush=True)


def main(model: str = "Qwen3.5-35B-A3B", m: int = 512, rounds: int = 30) -> None:
    import torch
    import torch.nn.functional as F

    import dispatch
    from bench.forward import Bound, ForwardConfig, _bind, _weights, models_for, sequences
    from bench.forward_paths import TABLE_DIRECT, path_for
    from bench.gpu import capture_graph
    from bench.hosttime import host_times
    from bench.paths import ATEN, DISPATCH, PATHS
    from dispatch.profiles import get_profile
    from dispatch.table import load_table
    profile, table = get_profile("h200"), load_table("h200")
    sm = torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]
    cfg = ForwardConfig(profile=profile, models=models_for([model], None), ms=[m], rules=[], out=Path("/tmp/probe"),
                        table=table)
    seq = sequences(cfg)[model]
    weights = _weights(seq, seed=len(seq))
    fns = {p: PATHS[p].build(profile.pdl) for p in {path_for(r, lin, m, sm, profile, table, g) for lin in seq
                                                     for r in (DISPATCH, TABLE_DIRECT) for g in ("graph", "eager")} | {ATEN}}
    dispatch.tactics_from_table(False)
    dispatch.configure(table)
    xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in sorted({lin.k for lin in seq})}
    disp = _bind(DISPATCH, seq, weights, xs, m, sm, cfg, fns)
    closure = Bound()
    for lin, w in zip(seq, weights):
        def one(x, w=w):
            return F.linear(x, w, None)
        closure.calls.append((one, (xs[lin.k],), w))
    forwards = {ATEN: _bind(ATEN, seq, weights, xs, m, sm, cfg, fns),
                "table-direct eager": _bind(TABLE_DIRECT, seq, weights, xs, m, sm, cfg, fns, "eager"),
                "dispatch (bound)": disp, "closure around F.linear": closure}
    print(f"{model} M={m}: dispatch runs {disp.describe()}", flush=True)
    report("before any capture", submit_rounds(forwards, rounds), "table-direct eager")
    odd = next(i for i, lin in enumerate(seq) if lin.layer != "lm_head"
               and path_for(DISPATCH, lin, m, sm, profile, table, "graph") != path_for(DISPATCH, lin, m, sm, profile, table, "eager"))
    lin, w = seq[odd], weights[odd]
    layer, x = dispatch.bind(w), xs[lin.k]
    print(f"one layer ({lin.n}x{lin.k}): graph {path_for(DISPATCH, lin, m, sm, profile, table, 'graph')}, eager "
          f"{path_for(DISPATCH, lin, m, sm, profile, table, 'eager')}", flush=True)
    for label in ("before capture", "after capture"):
        if label == "after capture":
            graph = capture_graph(disp, disp)
            graph.replay()
            torch.cuda.synchronize()
            del graph
            torch.cuda.empty_cache()
        host = host_times(pieces(layer, x, w), calls=50, rounds=20)
        print(f"  {label}: per call µs " + ", ".join(f"{n} {v[0]:.2f}" for n, v in host.items()), flush=True)
    report("after a capture of the dispatcher's forward", submit_rounds(forwards, rounds, seed=1), "table-direct eager")
    dispatch.reset()


if __name__ == "__main__":
    import torch
    args = sys.argv[1:]
    if not torch.cuda.is_available():
        print("python -m tools.probe_binding: error: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    try:
        numbers = [int(a) for a in args[1:3]]
    except ValueError:
        print("python -m tools.probe_binding: error: usage: python -m tools.probe_binding [MODEL] [M] [ROUNDS]",
              file=sys.stderr)
        sys.exit(2)
    main(*(args[:1] or ["Qwen3.5-35B-A3B"]), *numbers)
