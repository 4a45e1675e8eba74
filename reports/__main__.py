"""python -m reports build RESULTS [RESULTS...] [--baseline FILE] [--anatomy DIR] -o report.html"""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("reports")  # Ctrl-C during the imports below: one line, no traceback

import sys
from typing import Sequence

from harness.cli import Parser, renamed
from harness.errors import run_cli
from harness.io import output_file


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m reports", description="A self-contained HTML report of a run.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="build report.html from results folders")
    p.add_argument("results", nargs="+", help="results folder(s); the first is reported, the others compared with it")
    p.add_argument("--baseline", help="a stored baseline (tests/baselines/<profile>.json) to compare the first run with")
    p.add_argument("--anatomy", help="a host-anatomy results folder (python -m bench host-anatomy)")
    p.add_argument("--forward", nargs="+", metavar="DIR",
                   help="measured-forward folders (python -m bench forward), e.g. one per model; a section each")
    p.add_argument("--table", "--thresholds", dest="thresholds", action=renamed("--table", "--thresholds"),
                   metavar="FILE", help="threshold table (default: dispatch/thresholds/<profile>.json); --thresholds "
                                        "is its old spelling")
    p.add_argument("-o", "--out", default="report.html", help="output file (default report.html)")
    p.add_argument("--allow-mismatch", action="store_true", help="report data of different GPUs together")
    p.add_argument("--figures", choices=("all", "none"), default="all",
                   help="none: text and tables only, without drawing a figure (a quick look; default all)")
    p.add_argument("--partial", action="store_true",
                   help="report runs with missing cells or that did not finish (the verdict says so)")
    args = parser.parse_args(argv)
    from reports.build import build
    out = build(args.results, output_file(args.out, "-o"), args.baseline, args.anatomy, args.thresholds, args.partial,
                args.forward, args.allow_mismatch, draw_figures=args.figures == "all")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "reports"))
