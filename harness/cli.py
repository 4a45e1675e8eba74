"""Argument parsing shared by every command: errors as one line through run_cli, numbers checked against sane ranges."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from harness.errors import HarnessError


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one `prog: error: ...` line (run_cli prints it) instead of usage + error."""

    def error(self, message: str):
        raise HarnessError(f"{message} (see `{self.prog} --help`)")


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi}")
        return value
    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is outside {lo:g}..{hi:g}")
        return value
    parse.__name__ = "number"
    return parse
