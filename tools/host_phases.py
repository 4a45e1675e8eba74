"""(GPU) Where do the host's slow phases come from? Interleaved samples of a pure-Python workload and of the 4B
forward's 153 F.linear submissions (M = 8), with each sample's thread context switches, CPU before and after, and the
machine-wide CPU use of its block; blocks alternate unpinned / pinned to one core, first without CUPTI, then with
CUPTI set up and paused as bench forward has it in its timed eager forwards.

    python -m tools.host_phases OUT [BLOCK_S] [BLOCKS]    -> OUT/host-phases.csv, OUT/host-phases.json

A diagnostic script, not part of the measured grid."""
import csv
import json
import os
import random
import resource
import sys
import time

import torch
import torch.nn.functional as F

from bench.paths import ATEN
from shapes.catalog import model_configs
from shapes.derive import forward_sequence, load_config

if not 2 <= len(sys.argv) <= 4 or not torch.cuda.is_available():
    why = "needs a CUDA GPU" if 2 <= len(sys.argv) <= 4 else "usage: python -m tools.host_phases OUT [BLOCK_S] [BLOCKS]"
    print(f"python -m tools.host_phases: error: {why}", file=sys.stderr)
    sys.exit(2)
try:
    out = sys.argv[1]
    block_s = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    if not (block_s > 0 and blocks > 0):
        raise ValueError
except ValueError:
    print("python -m tools.host_phases: error: BLOCK_S and BLOCKS must be positive numbers", file=sys.stderr)
    sys.exit(2)


def cpu_now():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def machine_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v), idle


def threads():
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    return sorted(names)


cfg = load_config(model_configs()["Qwen3.5-4B"])
seq = forward_sequence(cfg, "Qwen3.5-4B")
g = torch.Generator(device="cuda").manual_seed(0)
ws = {}
for lin in seq:
    if (lin.n, lin.k) not in ws:
        ws[(lin.n, lin.k)] = torch.randn(lin.n, lin.k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
xs = {k: torch.randn(8, k, device="cuda", dtype=torch.bfloat16) for k in {l.k for l in seq}}
calls = [(xs[l.k], ws[(l.n, l.k)]) for l in seq]


def aten():
    for x, w in calls:
        F.linear(x, w)


def py():
    s = 0
    for i in range(40000):
        s += i
    return s


for _ in range(20):
    aten(); py()
torch.cuda.synchronize()
meta = {"cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)), "threads_start": threads(),
        "loadavg": open("/proc/loadavg").read().strip()}
rows = []
home = cpu_now()


def run_blocks(phase):
    for b in range(blocks):
        pinned = b % 2 == 1
        os.sched_setaffinity(0, {home} if pinned else set(meta["affinity"]))
        tot0, idle0 = machine_busy()
        t_end = time.perf_counter() + block_s
        n = 0
        while time.perf_counter() < t_end:
            order = ["py", ATEN]
            random.shuffle(order)
            for cond in order:
                fn = py if cond == "py" else aten
                r0 = resource.getrusage(resource.RUSAGE_THREAD)
                c0 = cpu_now()
                t0 = time.perf_counter_ns()
                fn()
                t1 = time.perf_counter_ns()
                r1 = resource.getrusage(resource.RUSAGE_THREAD)
                c1 = cpu_now()
                torch.cuda.synchronize()
                rows.append({"phase": phase, "block": b, "pinned": pinned, "cond": cond, "us": (t1 - t0) / 1e3,
                             "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw, "nvcsw": r1.ru_nvcsw - r0.ru_nvcsw,
                             "cpu0": c0, "cpu1": c1, "t": time.perf_counter()})
            n += 1
        tot1, idle1 = machine_busy()
        busy = 1 - (idle1 - idle0) / max(1, tot1 - tot0)
        for r in rows[-2 * n:]:
            r["machine_busy"] = round(busy, 3)


run_blocks("no-cupti")
from bench.clocks import make_clock
clock = make_clock("cupti")
aten(); torch.cuda.synchronize(); clock.drain()
meta["threads_cupti"] = threads()
with clock.paused():
    run_blocks("cupti-paused")
meta["threads_end"] = threads()
meta["loadavg_end"] = open("/proc/loadavg").read().strip()
os.makedirs(out, exist_ok=True)
with open(f"{out}/host-phases.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader(); w.writerows(rows)
json.dump(meta, open(f"{out}/host-phases.json", "w"), indent=1)

for phase in ("no-cupti", "cupti-paused"):
    for pinned in (False, True):
        for cond in ("py", ATEN):
            v = [r for r in rows if r["phase"] == phase and r["pinned"] == pinned and r["cond"] == cond]
            us = sorted(r["us"] for r in v)
            q = lambda p: us[int(p * (len(us) - 1))]
            inv = sum(1 for r in v if r["nivcsw"]) / len(v)
            mig = sum(1 for r in v if r["cpu0"] != r["cpu1"]) / len(v)
            print(f"{phase:13s} pinned={pinned!s:5s} {cond:4s} n={len(v):5d} p10={q(.1):8.1f} p50={q(.5):8.1f} "
                  f"p90={q(.9):8.1f} p99={q(.99):8.1f} frac_invol_cs={inv:.3f} frac_migrated={mig:.3f}")
print(json.dumps(meta))
