"""bench's command line as a function: parser() declares every command (one module each under bench/commands/),
main(argv) parses and runs one in this process."""
from __future__ import annotations

import sys
from typing import Sequence

from bench.commands import e2e, forward, host_anatomy, run, tools
from bench.commands.options import vllm_tokens
from dispatch.profiles import get_profile
from harness.cli import Parser
from harness.options import parent as shared


def parser() -> Parser:
    """Every bench command's parser: what main parses, and what a table pipeline leg's arguments are checked
    against."""
    p = Parser(prog="python -m bench", description="GPU and host time of BF16 GEMM paths.")
    sub = p.add_subparsers(dest="cmd", required=True)
    gpu = shared(("gpu", dict(required=True)))
    tactics = shared("autotune-cache", "save-autotune-cache", "tune")
    run.add_parser(sub, [gpu, tactics])
    host_anatomy.add_parser(sub, [gpu])
    e2e.add_parser(sub, [gpu])
    forward.add_parser(sub, [gpu, tactics])
    tools.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd in ("merge", "paths", "profiles"):
        return tools.run(args)
    profile = get_profile(args.gpu)
    tokens = vllm_tokens(args, profile)
    command = ["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]
    if args.cmd == "host-anatomy":
        return host_anatomy.run(args, profile, command)
    if args.cmd == "e2e":
        return e2e.run(args, profile, command)
    if args.cmd == "forward":
        return forward.run(args, profile, command, tokens)
    return run.run(args, profile, command, tokens)
