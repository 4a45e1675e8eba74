"""calibrate's command line as a function: main(argv) parses and runs one command in this process (the table
pipeline calls it so); each command's options and its run live in calibrate/commands/<command>.py."""
from __future__ import annotations

import sys
from typing import Sequence

import pandas as pd

from calibrate.commands import agree as agree_command
from calibrate.commands import baseline as baseline_command
from calibrate.commands import compare as compare_command
from calibrate.commands import e2e as e2e_command
from calibrate.commands import fit as fit_command
from calibrate.commands import forward_noise as forward_noise_command
from calibrate.commands import forward_ratio as forward_ratio_command
from calibrate.commands import host_cost as host_cost_command
from calibrate.commands import l2 as l2_command
from calibrate.commands import noise as noise_command
from calibrate.commands import table as table_command
from calibrate.commands import validate as validate_command
from calibrate.commands import vllm as vllm_command
from harness.cli import Parser
from harness.options import parent


def parser() -> Parser:
    """Every calibrate command's parser: what main parses, and what a table pipeline leg's arguments are checked
    against."""
    p = Parser(prog="python -m calibrate", description="Validate and fit the threshold dispatcher.")
    sub = p.add_subparsers(dest="cmd", required=True)
    gpu = parent(("gpu", dict(required=True)))
    gpu_of_runs = parent(("gpu", dict(what="(default: the runs')")))
    validate_command.add_parser(sub, [gpu_of_runs])
    fit_command.add_parser(sub, [gpu])
    compare_command.add_parser(sub, [gpu_of_runs])
    agree_command.add_parser(sub)  # agree and host-shift
    noise_command.add_parser(sub, [gpu])
    forward_noise_command.add_parser(sub, [gpu])
    forward_ratio_command.add_parser(sub, [gpu_of_runs])
    l2_command.add_parser(sub)
    host_cost_command.add_parser(sub, [gpu])
    baseline_command.add_parser(sub, [gpu])  # baseline and regress
    e2e_command.add_parser(sub)
    vllm_command.add_parser(sub, [gpu_of_runs])
    table_command.add_parser(sub, [gpu])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    if list(argv if argv is not None else sys.argv[1:])[:1] == ["table"]:
        return table_command.run(None)  # moved: one line saying where, whatever its options
    args = parser().parse_args(argv)
    pd.set_option("display.width", 200)
    run = {"validate": lambda: validate_command.run(args), "fit": lambda: fit_command.run(args, argv),
           "compare": lambda: compare_command.run(args), "agree": lambda: agree_command.run_agree(args),
           "host-shift": lambda: agree_command.run_host_shift(args), "noise": lambda: noise_command.run(args),
           "forward-noise": lambda: forward_noise_command.run(args),
           "forward-ratio": lambda: forward_ratio_command.run(args), "l2": lambda: l2_command.run(args),
           "host-cost": lambda: host_cost_command.run(args), "baseline": lambda: baseline_command.run(args),
           "regress": lambda: baseline_command.run(args), "e2e": lambda: e2e_command.run(args),
           "vllm": lambda: vllm_command.run(args), "table": lambda: table_command.run(args)}
    return run[args.cmd]()
