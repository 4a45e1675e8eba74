"""(GPU) Where a sweep cell's fixed costs go: per path and a few (shape, M), the wall time of each step of a capture
(warm-up, capture of the calls, instantiate) and of a replay (launch, wait, CUPTI drain), with CUPTI recording and
paused, and the same graph captured with one call per copy or two calls in all.

    python -m tools.probes.sweep_costs OUT          -> OUT/sweep-costs.csv

A diagnostic, not part of the measured grid."""
import csv
import pathlib
import sys
import time

CELLS = [(256, 2048, 1), (12288, 2048, 1), (12288, 2048, 1024)]
NAMES = ["aten", "flashinfer-lean:cublaslt", "flashinfer:cublaslt", "flashinfer:cudnn", "dispatch"]


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def one(clock, fn, ops, calls: int, paused: bool) -> dict:
    import torch

    from bench.gpu import sleep_cycles_per_us
    row: dict = {}
    t = time.perf_counter()
    fn(ops.xs[0], ops.ws[0])
    fn(ops.xs[1 % len(ops.xs)], ops.ws[1 % len(ops.ws)])
    torch.cuda.synchronize()
    row["warmup_ms"] = ms_since(t)
    g = torch.cuda.CUDAGraph()
    t = time.perf_counter()
    with torch.cuda.graph(g):
        t_body = time.perf_counter()
        for i in range(calls):
            fn(ops.xs[i % len(ops.xs)], ops.ws[i % len(ops.ws)])
        row["body_ms"] = ms_since(t_body)
        t_end = time.perf_counter()
    row["end_ms"] = ms_since(t_end)
    row["capture_ms"] = ms_since(t)
    ctx = clock.paused() if paused else None
    if ctx:
        ctx.__enter__()
    launch, wait = [], []
    for _ in range(6):
        torch.cuda._sleep(int(sleep_cycles_per_us() * 20))
        t = time.perf_counter()
        g.replay()
        launch.append(ms_since(t))
        t = time.perf_counter()
        torch.cuda.synchronize()
        wait.append(ms_since(t))
    if ctx:
        ctx.__exit__(None, None, None)
    row["first_launch_ms"] = launch[0]
    row["launch_ms"] = sorted(launch[1:])[2]
    row["wait_ms"] = sorted(wait[1:])[2]
    t = time.perf_counter()
    recs = clock.drain()
    row["drain_ms"] = ms_since(t)
    row["records"] = len(recs)
    del g
    return row


def main(argv: list[str]) -> int:
    """The checks before any import of torch, then every cell; 2 and one line for bad input or no GPU."""
    prog = "python -m tools.probes.sweep_costs"
    if len(argv) != 1:
        print(f"{prog}: error: usage: {prog} OUT", file=sys.stderr)
        return 2
    if pathlib.Path(argv[0]).exists() and not pathlib.Path(argv[0]).is_dir():
        print(f"{prog}: error: {argv[0]} is not a folder; name a folder for sweep-costs.csv", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print(f"{prog}: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    measure(argv[0])
    return 0


def measure(out: str) -> None:
    import torch

    from bench.clocks import make_clock
    from bench.gpu import make_operands
    from bench.paths import PATHS
    from bench.stats import rotation_count
    from harness.io import atomic_write_text
    clock = make_clock("cupti")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for n, k, m in CELLS:
        rot = rotation_count(2 * (m * k + n * k), l2, cap=512)
        ops = make_operands(m, n, k, rot)
        for name in NAMES:
            fn = PATHS[name].build(True)
            for calls in (max(rot, 2), 2):
                for paused in (False, True):
                    r = one(clock, fn, ops, calls, paused)
                    rows.append({"n": n, "k": k, "m": m, "path": name, "rotations": rot, "calls": calls,
                                 "cupti": "paused" if paused else "on", **{k2: round(v, 3) if isinstance(v, float)
                                                                            else v for k2, v in r.items()}})
                    print(rows[-1], flush=True)
        del ops
        torch.cuda.empty_cache()
    path = pathlib.Path(out)
    path.mkdir(parents=True, exist_ok=True)
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path / "sweep-costs.csv", buf.getvalue())
    clock.close()



if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
