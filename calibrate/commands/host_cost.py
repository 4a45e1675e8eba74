"""python -m calibrate host-cost --gpu P: (GPU) host time of the dispatcher's layers and the lean calls against
F.linear (calibrate/hostcost.py)."""
from __future__ import annotations

from harness.cli import int_in
from harness.io import output_file
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_host = sub.add_parser("host-cost", parents=parents,
                            help="(GPU) host time of dispatch.linear against F.linear above the threshold")
    add(p_host, "calls", type=int_in(100, 1_000_000), default=4000, what="per layer and shape")
    add(p_host, "out-file", what=": a CSV of the per-shape figures", dest="out")


def run(args) -> int:
    from calibrate.hostcost import run_host_cost  # the one command that times the dispatcher: it imports torch
    return run_host_cost(args.gpu, args.calls, output_file(args.out, "--out-file") if args.out else None)
