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


# The process that installed the handlers. A child forked from it (a drawing pool's worker, a compiler's helper)
# inherits them; there a signal ends the child quietly instead of raising into code that would print a traceback.
_OWNER = [os.getpid()]


def _quiet_child_exit(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os._exit(128 + signum)


def _on_sigterm(signum, frame):
    if os.getpid() != _OWNER[0]:
        _quiet_child_exit(signum)
    raise Terminated()


def _on_sigint(signum, frame):
    if os.getpid() != _OWNER[0]:
        _quiet_child_exit(signum)
    raise KeyboardInterrupt()


def raise_on_sigterm() -> None:
    """SIGTERM raises Terminated (a KeyboardInterrupt) in the main thread, so the cleanup of Ctrl-C runs for it too;
    SIGINT raises KeyboardInterrupt. Both only in this process: a forked child that inherits them exits quietly."""
    if threading.current_thread() is threading.main_thread():
        _OWNER[0] = os.getpid()
        signal.signal(signal.SIGTERM, _on_sigterm)
        signal.signal(signal.SIGINT, _on_sigint)


def worker_signals() -> None:
    """For a pool worker: Ctrl-C is left to the parent (which ends the command with its one line), SIGTERM (the
    pool's own teardown) ends the worker at once and quietly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # forked inside signals_deferred


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


def quiet_interrupts(prog: str) -> None:
    """Ctrl-C or SIGTERM while a command's modules still import: one line and 130/143, no traceback. run_cli puts
    the usual handlers back once it runs."""
    def stop(signum, frame):
        if os.getpid() != _OWNER[0]:
            _quiet_child_exit(signum)
        try:
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        finally:
            os._exit(128 + signum)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)


def run_cli(main: Callable[[Sequence[str] | None], int], prog: str, argv: Sequence[str] | None = None) -> int:
    """Runs a command's main: bad input is one line `prog: error: ...` and exit 2, an interrupt exits 130 (SIGINT) or
    143 (SIGTERM), a closed stdout (`| head`) ends quietly with 141, as for any Unix tool; a standard output that
    cannot be written (a full disk, /dev/full) is one line and exit 2."""
    raise_on_sigterm()
    if sys.stdout is None:  # started with standard output closed (`>&-`)
        print(f"{prog}: error: standard output is closed; redirect it to a file or /dev/null", file=terminal(),
              flush=True)
        return 2
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except HarnessError as exc:
        print(f"{prog}: error: {exc}", file=terminal(), flush=True)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted", file=terminal(), flush=True)
        return 128 + signal_of(exc)
    except BrokenPipeError:
        _stdout_to_devnull()  # Python would print a second error when it flushes stdout at exit
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if not _is_stdout_error(exc):
            if exc.errno not in _FILE_ERRNOS:
                raise
            where = f" {exc.filename}" if exc.filename else ""
            print(f"{prog}: error: cannot write or read{where} ({exc.strerror}); check that path's permissions, "
                  f"attributes (chattr) and free space, or choose another", file=terminal(), flush=True)
            return 2
        _stdout_to_devnull()
        print(f"{prog}: error: cannot write to standard output ({exc.strerror or exc}); redirect it elsewhere",
              file=terminal(), flush=True)
        return 2


def _is_stdout_error(exc: OSError) -> bool:
    import errno
    return exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EBADF) and exc.filename is None


# what a file system says of a path the user named: one line, never a traceback
_FILE_ERRNOS = {getattr(__import__("errno"), name) for name in
                ("EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT", "ENOTDIR", "EISDIR", "ENAMETOOLONG", "ELOOP",
                 "EEXIST", "ENOENT", "EXDEV", "EMLINK", "EFBIG")}


def _stdout_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
