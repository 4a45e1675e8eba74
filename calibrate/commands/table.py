"""python -m calibrate table: moved to python -m tables (the table pipeline sits on the top floor, above the report
it builds); the old spelling says so in one line."""
from __future__ import annotations

from harness.errors import HarnessError


def add_parser(sub, parents: list) -> None:
    sub.add_parser("table", help="moved: python -m tables (same options)")


def run(args) -> int:
    raise HarnessError("calibrate table is now python -m tables, with the same options (make table runs it); "
                       "nothing was run")
