"""(GPU) What the idle signal 'pace' sees: the 4B forward at M = 8, bound per layer with a table that has idle ranges,
its eager forwards interleaved with all-F.linear ones for a while, the pace never entering its slow phase (enter level
set out of reach), and every paced call recorded by the C++ layer (pace_trace_start): its end, its time, its layer's
fastest so far. The all-F.linear forwards beside them say which phase the host was in.

    python -m tools.pace_probe OUT TABLE [SECONDS]   -> OUT/pace-trace.csv, OUT/forwards.csv, OUT/probe.json

A diagnostic script, not part of the measured grid."""
import csv
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

import dispatch
from bench.forward import _weights
from bench.paths import ATEN
from dispatch import native
from dispatch.table import load_table
from harness.errors import HarnessError
from shapes.catalog import model_configs
from shapes.derive import forward_sequence, load_config


def _stop(why: str) -> None:
    print(f"python -m tools.pace_probe: error: {why}", file=sys.stderr)
    sys.exit(2)


if len(sys.argv) not in (3, 4):
    _stop("usage: python -m tools.pace_probe OUT TABLE [SECONDS]")
out, table_file = sys.argv[1], sys.argv[2]
try:
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 40.0
except ValueError:
    seconds = float("nan")
if not seconds > 0:
    _stop(f"SECONDS must be a positive number, got {sys.argv[3]!r}")
if not torch.cuda.is_available():
    _stop("needs a CUDA GPU; run it on the GPU machine")
mod = native.module()
if mod is None:
    _stop("the C++ layer is not built; python -m dispatch build-native first")
try:
    table = load_table("h200", table_file)
except HarnessError as exc:
    _stop(str(exc))
dispatch.tactics_from_table(False)
dispatch.configure(table)
seq = forward_sequence(load_config(model_configs()["Qwen3.5-4B"]), "Qwen3.5-4B")
weights = _weights(seq, 0)
m = 8
xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in {lin.k for lin in seq}}
layers = [(dispatch.bind(w), xs[lin.k]) for lin, w in zip(seq, weights)]
plain = [(w, xs[lin.k]) for lin, w in zip(seq, weights)]


def table_forward() -> None:
    for layer, x in layers:
        layer(x)


def aten_forward() -> None:
    for w, x in plain:
        F.linear(x, w)


defaults = dispatch.pace_config()
dispatch.pace_config(enter=1e9, exit_=1e9)  # never slow: every paced call runs the eager choice
for _ in range(20):
    table_forward(), aten_forward()
torch.cuda.synchronize()
mod.pace_trace_start(4_000_000)
rows = []
t_end = time.monotonic() + seconds
rng = random.Random(0)
while time.monotonic() < t_end:
    order = [("table", table_forward), (ATEN, aten_forward)]
    rng.shuffle(order)
    for name, fn in order:
        t0 = time.monotonic_ns()
        fn()
        t1 = time.monotonic_ns()
        torch.cuda.synchronize()
        t2 = time.monotonic_ns()
        rows.append({"forward": name, "start_ns": t0, "submit_us": (t1 - t0) / 1e3, "wall_us": (t2 - t0) / 1e3})
trace = mod.pace_trace()
mod.pace_trace_start(0)
dispatch.pace_config(*defaults)
os.makedirs(out, exist_ok=True)
ids = {lid: i for i, lid in enumerate(sorted({r[3] for r in trace}))}
with open(f"{out}/pace-trace.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["end_ns", "ns", "fastest_ns", "layer", "slot", "level"])
    w.writerows((r[0], r[1], r[2], ids[r[3]], r[4], round(r[5], 4)) for r in trace)
with open(f"{out}/forwards.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
json.dump({"table": table_file, "m": m, "seconds": seconds, "paced_calls": len(trace), "forwards": len(rows),
           "paced_layers": len(ids), "pace_defaults": defaults}, open(f"{out}/probe.json", "w"), indent=1)
print(f"{len(rows)} forwards, {len(trace)} paced calls on {len(ids)} layers")
