"""reports' command line as a function: parser() and main(argv), which builds one report in this process."""
from __future__ import annotations

from typing import Sequence

from harness.cli import Parser
from harness.io import output_file
from harness.options import add
from reports.build import build  # imported with the command (python -m reports guards its imports against signals)


def parser() -> Parser:
    parser = Parser(prog="python -m reports", description="A self-contained HTML report of a run.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="build report.html from results folders")
    p.add_argument("results", nargs="+", help="results folder(s); the first is reported, the others compared with it")
    add(p, "baseline", what="to compare the first run with", shown="none; calibrate/baselines/<profile>.json is shipped")
    p.add_argument("--anatomy", help="a host-anatomy results folder (python -m bench host-anatomy)")
    add(p, "forward", nargs="+", what=", e.g. one per model; a section each")
    add(p, "table", what="reported")
    add(p, "out-file", short="-o", what=": the report", default="report.html", dest="out")
    add(p, "allow-mismatch")
    p.add_argument("--figures", choices=("all", "none"), default="all",
                   help="none: text and tables only, without drawing a figure (a quick look; default all)")
    add(p, "partial", what="(the verdict says so)")
    add(p, "noise", what="that widens the first run's cell verdicts")
    add(p, "forward-floor", what="that widens its measured forwards' verdicts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = build(args.results, output_file(args.out, "--out-file"), args.baseline, args.anatomy, args.table, args.partial,
                args.forward, args.allow_mismatch, draw_figures=args.figures == "all", noise=args.noise,
                forward_floor=args.forward_floor)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0
