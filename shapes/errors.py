"""One error type for bad input, and the CLI wrapper that turns it into one line and a non-zero exit."""
from __future__ import annotations

import sys
from typing import Callable, Sequence


class HarnessError(Exception):
    """Bad input or environment: the message names the problem and the fix, in one line."""


def run_cli(main: Callable[[Sequence[str] | None], int], prog: str, argv: Sequence[str] | None = None) -> int:
    try:
        return main(argv)
    except HarnessError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
