"""(GPU) Host time of dispatch.linear against F.linear at M above the threshold, interleaved as the sweep does it."""
from __future__ import annotations

from pathlib import Path

import dispatch
from bench.hosttime import host_times
from bench.sweep import require_cuda
from dispatch.table import load_table
from harness.errors import HarnessError
from harness.io import atomic_write_text
from shapes.catalog import catalog


def run_host_cost(profile_name: str, calls: int, out: str | None) -> int:
    require_cuda()
    import torch
    import torch.nn.functional as F

    table = load_table(profile_name)
    dispatch.configure(table)
    rows = ["n,k,m,aten_host_us,dispatch_host_us,ratio"]
    worst = 0.0
    for shape in catalog():
        m = max(table.threshold(shape.n, shape.k) + 1, 64)
        x = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
        # the sweep's own interleaver: blocks of 50 calls, the two alternating, the GPU kept busy under each block
        host = host_times({"F.linear": lambda: F.linear(x, w), "dispatch.linear": lambda: dispatch.linear(x, w)},
                          calls=50, rounds=max(1, calls // 50))
        a, d = host["F.linear"][0], host["dispatch.linear"][0]
        worst = max(worst, d / a)
        rows.append(f"{shape.n},{shape.k},{m},{a:.3f},{d:.3f},{d / a:.4f}")
        print(f"{shape.name:16s} M={m:5d}  F.linear {a:7.2f} µs  dispatch.linear {d:7.2f} µs  ratio {d / a:.3f}")
    if out:
        atomic_write_text(Path(out), "\n".join(rows) + "\n")
    print(f"worst dispatch/aten host-time ratio above the threshold: {worst:.3f} (bound 1.15)")
    if worst > 1.15:
        raise HarnessError(f"dispatch.linear costs {worst:.2f}x F.linear's host time above the threshold (> 1.15)")
    return 0
