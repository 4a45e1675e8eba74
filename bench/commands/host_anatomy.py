"""python -m bench host-anatomy: where one FlashInfer call's host time goes, layer by layer (bench/anatomy_gpu.py)."""
from __future__ import annotations

from bench.anatomy_gpu import Anatomy, run_anatomy
from bench.paths import PATHS
from bench.sweep import require_gpu
from dispatch.backends import flashinfer_path
from harness.cli import int_in
from harness.console import divert_noise
from harness.errors import HarnessError
from harness.io import output_dir
from harness.options import add
from shapes.catalog import catalog, select
from shapes.grid import parse_m


def add_parser(sub, parents: list) -> None:
    p_an = sub.add_parser("host-anatomy", parents=parents,
                          help="where a FlashInfer call's host time goes, layer by layer, vs F.linear")
    add(p_an, "shapes", default="n2048_k4096")
    add(p_an, "m", default="8,48,1024", shown="8,48,1024: tuning buckets 8 and 1024, and 48, which is none")
    p_an.add_argument("--backends", help="FlashInfer backends (default: the profile's low-M backend and cublaslt)")
    add(p_an, "calls", type=int_in(1, 100_000), default=40, what="per layer and round")
    add(p_an, "rounds", type=int_in(1, 1000), default=9)
    add(p_an, "out", default="results/host-anatomy")
    add(p_an, "allow-mismatch")


def run(args, profile, command: list[str]) -> int:
    backends = ([b.strip() for b in args.backends.split(",") if b.strip()] if args.backends
                else list(dict.fromkeys((profile.low_m_backend, "cublaslt"))))
    unknown = [b for b in backends if flashinfer_path(b) not in PATHS]
    if unknown:
        raise HarnessError(f"unknown FlashInfer backend(s) {', '.join(unknown)}; known: "
                           f"{', '.join(p.flashinfer_backend for p in PATHS.values() if p.flashinfer_backend)}")
    shapes, ms, out_dir = select(catalog(), args.shapes), parse_m(args.m), output_dir(args.out, "--out")
    require_gpu(profile, args.allow_mismatch)
    divert_noise(out_dir / "log.txt")
    out = run_anatomy(Anatomy(profile, shapes, ms, backends, out_dir, args.calls, args.rounds, args.allow_mismatch,
                              command))
    print(f"results: {out}/results.csv, {out}/run.json")
    return 0
