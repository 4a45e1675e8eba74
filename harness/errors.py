"""One error type for bad input, and the CLI wrapper that turns it into one line and a non-zero exit."""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Sequence

from harness.console import terminal


class HarnessError(Exception):
    """Bad input or environment: the message names the problem and the fix, in one line."""
    exit_code = 2


class Interrupted(HarnessError):
    """Ctrl-C or SIGTERM stopped a command; finished work was kept. Exit code 128 + the signal (130, 143)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a batch scheduler, kill), raised like Ctrl-C so that the same cleanup runs."""
    signum = signal.SIGTERM


def signal_of(exc: BaseException) -> int:
    return int(getattr(exc, "signum", signal.SIGINT))


def _on_sigterm(signum, frame):
    raise Terminated()


def raise_on_sigterm() -> None:
    """SIGTERM raises Terminated (a KeyboardInterrupt) in the main thread, so the cleanup of Ctrl-C runs for it too."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextmanager
def signals_deferred():
    """Ctrl-C and SIGTERM wait until the block is done (the final writes of a run), then act as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_cli(main: Callable[[Sequence[str] | None], int], prog: str, argv: Sequence[str] | None = None) -> int:
    """Runs a command's main: bad input is one line `prog: error: ...` and exit 2, an interrupt exits 130 (SIGINT) or
    143 (SIGTERM), a closed stdout (`| head`) ends quietly with 141, as for any Unix tool."""
    raise_on_sigterm()
    try:
        return main(argv)
    except HarnessError as exc:
        print(f"{prog}: error: {exc}", file=terminal(), flush=True)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted", file=terminal(), flush=True)
        return 128 + signal_of(exc)
    except BrokenPipeError:
        # Python would print a second error when it flushes stdout at exit; point stdout at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE
