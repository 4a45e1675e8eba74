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

    def parse_known_args(self, args=None, namespace=None):
        """As argparse, and an empty value (--shapes "", a "" in a list) is refused: it never means the default."""
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            if value == action.default:
                continue
            if value == "" or (isinstance(value, list) and "" in value):
                name = "/".join(action.option_strings) or action.metavar or action.dest
                raise HarnessError(f"{name} is empty; give it a value, or leave it out for its default (see "
                                   f"`{self.prog} --help`)")
        return namespace, extras


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
