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


def _bounded(convert: Callable[[str], float], what: str, lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is outside {lo}..{hi}")
        return value
    parse.__name__ = what.split()[-1]
    return parse


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    return _bounded(int, "an integer", lo, hi)


def float_in(lo: float, hi: float) -> Callable[[str], float]:
    return _bounded(float, "a number", lo, hi)


def parent(*options: tuple[tuple[str, ...], dict]) -> argparse.ArgumentParser:
    """A parent parser holding options that several subcommands share, each declared once: parents=[parent(...)]."""
    p = argparse.ArgumentParser(add_help=False)
    for names, kwargs in options:
        p.add_argument(*names, **kwargs)
    return p
