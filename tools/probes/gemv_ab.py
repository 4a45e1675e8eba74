"""(GPU) The GEMV of this checkout against an earlier one and against a fresh tuning, cell by cell, beside each
weight's size-matched read.

    python -m tools.probes.gemv_ab --out DIR [--old OLD_GEMV_PY] [--configs FILE] [--cells FILE] [--samples 15]

For every (N, K, M) of a GEMV configuration file (default: the shipped H200 table's): this kernel with the file's
configuration (`file`), the earlier kernel with it where --old names one (the module at OLD_GEMV_PY, e.g. `git show
<sha>:dispatch/gemv.py`; `old`), and this kernel tuned afresh over its candidates (`tuned`: the CUDA-core tiles among
them at M = 2-8, launched with PDL where the tuner keeps it). Every kernel is checked against an fp32 reference first.
--cells (lines of "N K M") keeps those cells only. Timing as the sweep times cells: CUPTI kernel time of graphs of
back-to-back calls over rotated copies (weights from HBM), replayed interleaved; a configuration that launches with
PDL overlaps the call before it, so its time is the span of its calls (as the sweep reads such rows), `us`. The
size-matched read ceiling of each weight measured alike. Writes DIR/gemv_ab.csv and DIR/run.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path


def _old_module(path: str):
    spec = importlib.util.spec_from_file_location("gemv_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def _cell(clock, old, n: int, k: int, m: int, cfg, samples: int) -> list[dict]:
    import torch

    from bench.ceiling import copies_for
    from bench.gpu import REL_ERR_BOUND, Replays, capture, make_operands, output_error, replay_interleaved
    from dispatch import gemv
    props = torch.cuda.get_device_properties(0)
    ops = make_operands(m, n, k, copies_for(n * k * 2, props.L2_cache_size))
    calls = {"file": gemv.Gemv(ops.ws[0], cfg)}
    configs = {"file": cfg}
    if old is not None:
        calls["old"] = old.Gemv(ops.ws[0], old.GemvConfig(*cfg.astuple()[:4]))
        configs["old"] = cfg
    tuned, _ = gemv.tune(ops.ws, ops.xs)
    calls["tuned"], configs["tuned"] = gemv.Gemv(ops.ws[0], tuned), tuned
    fns = {}
    for name, g in calls.items():
        space = g.space if hasattr(g, "space") else (g.acc, g.count)
        cls = type(g)

        def fn(x, w, cls=cls, cfg=g.config, space=space):
            return cls(w, cfg, space)(x)
        assert output_error(fn(ops.xs[0], ops.ws[0]), ops.xs[0], ops.ws[0]) < REL_ERR_BOUND, (name, n, k, m)
        fns[name] = fn
    per = max(ops.rotations, 32)
    graphs = {name: capture(fn, ops, per) for name, fn in fns.items()}
    timing = replay_interleaved(clock, graphs, Replays(per, samples))
    out = []
    for name in fns:
        gpu, span = statistics.median(timing[name].gpu_us), statistics.median(timing[name].span_us)
        pdl = configs[name].pdl and name != "old"
        out.append({"n": n, "k": k, "m": m, "kernel": name, "config": configs[name].key(), "pdl": pdl,
                    "gpu_us": round(gpu, 3), "span_us": round(span, 3), "us": round(span if pdl else gpu, 3)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.probes.gemv_ab")
    p.add_argument("--old", help="an earlier dispatch/gemv.py, timed with the file's configurations")
    p.add_argument("--out", required=True)
    p.add_argument("--configs", default=str(Path(__file__).resolve().parents[2] / "dispatch" / "thresholds" /
                                           "h200.autotune.gemv.json"))
    p.add_argument("--cells", help="a file of lines 'N K M': only those cells")
    p.add_argument("--samples", type=int, default=15)
    args = p.parse_args(argv)
    import torch

    from bench.ceiling import measure
    from bench.clocks import make_clock
    from bench.envinfo import fingerprint
    from datetime import datetime, timezone
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from dispatch import gemv
    entries = gemv.read(args.configs)
    if args.cells:
        keep = {tuple(map(int, line.split())) for line in Path(args.cells).read_text().splitlines() if line.strip()}
        entries = {cell: c for cell, c in entries.items() if cell in keep}
    clock = make_clock("cupti")
    old = _old_module(args.old) if args.old else None
    rows = []
    for (n, k, m), cfg in sorted(entries.items()):
        added = _cell(clock, old, n, k, m, cfg, args.samples)
        rows += added
        print(*added, sep="\n", flush=True)
    ceilings = measure(clock, sorted({r["n"] * r["k"] * 2 for r in rows}))
    for r in rows:
        read = ceilings["size_matched"][str(r["n"] * r["k"] * 2)]
        r["read_us"] = read.get("gpu_us")
        r["of_read"] = round(read["gpu_us"] / r["us"], 3) if read.get("gpu_us") else None
    import csv
    with open(out / "gemv_ab.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    from dispatch.profiles import detect_profile, this_gpu
    profile = detect_profile(*this_gpu(0))
    (out / "run.json").write_text(json.dumps({"command": " ".join(["python -m tools.probes.gemv_ab", *sys.argv[1:]]),
                                              "profile": profile.name if profile else None, "kind": "gemv-ab",
                                              "started": started, "status": "complete",
                                              "fingerprint": fingerprint(), "ceilings": ceilings,
                                              "gpu": torch.cuda.get_device_name(0)}, indent=1, default=str))
    clock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
