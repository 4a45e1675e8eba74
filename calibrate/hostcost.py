"""(GPU) Host time of dispatch.linear against F.linear at M above the threshold, paired and interleaved."""
from __future__ import annotations

import gc
import time
from pathlib import Path

from harness.io import atomic_write_text
from harness.errors import HarnessError


def paired_host_us(fa, fb, args, calls: int, block: int = 50) -> tuple[float, float]:
    """Median µs per call of fa and fb, timed in alternating blocks (A B B A) with gc off."""
    import torch
    ta, tb = [], []
    for f in (fa, fb):
        for _ in range(20):
            f(*args)
    torch.cuda.synchronize()
    gc_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(calls // block):
            order = ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))
            for f, out in order:
                for _ in range(block):
                    t0 = time.perf_counter_ns()
                    f(*args)
                    out.append(time.perf_counter_ns() - t0)
            torch.cuda.synchronize()  # the queue never fills: no back-pressure on the host
    finally:
        if gc_on:
            gc.enable()
    ta.sort()
    tb.sort()
    return ta[len(ta) // 2] / 1e3, tb[len(tb) // 2] / 1e3


def run_host_cost(profile_name: str, calls: int, out: str | None) -> int:
    from bench.sweep import require_cuda
    require_cuda()
    import torch
    import torch.nn.functional as F
    import dispatch
    from dispatch.table import load_table
    from shapes.catalog import catalog
    table = load_table(profile_name)
    dispatch.configure(table)
    rows = ["n,k,m,aten_host_us,dispatch_host_us,ratio"]
    worst = 0.0
    for shape in catalog():
        m = max(table.threshold(shape.n, shape.k) + 1, 64)
        x = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
        a, d = paired_host_us(F.linear, dispatch.linear, (x, w), calls)
        worst = max(worst, d / a)
        rows.append(f"{shape.n},{shape.k},{m},{a:.3f},{d:.3f},{d / a:.4f}")
        print(f"{shape.name:16s} M={m:5d}  F.linear {a:7.2f} µs  dispatch.linear {d:7.2f} µs  ratio {d / a:.3f}")
    if out:
        atomic_write_text(Path(out), "\n".join(rows) + "\n")
    print(f"worst dispatch/aten host-time ratio above the threshold: {worst:.3f} (bound 1.15)")
    if worst > 1.15:
        raise HarnessError(f"dispatch.linear costs {worst:.2f}x F.linear's host time above the threshold (> 1.15)")
    return 0
