"""The terminal, kept apart from third-party noise.

FlashInfer's INFO logs, the autotuner's warnings, JIT build chatter and the cuDNN frontend's nanobind leak report (at
interpreter exit) write to the process's stdout/stderr file descriptors. `divert_noise(log)` points both descriptors
at a log file for the rest of the process and keeps the terminal for the harness's own progress bar, messages and
summary, through `terminal()` (stderr side) and `sys.stdout` (our printed results).
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Iterator, TextIO

_TERMINAL: TextIO | None = None
_LOG: Path | None = None


def terminal() -> TextIO:
    """Where the harness's own messages go: the real stderr, also after divert_noise."""
    return _TERMINAL if _TERMINAL is not None else sys.stderr


def log_path() -> Path | None:
    return _LOG


def divert_noise(log: Path) -> Path:
    """From now on fd 1 and fd 2 write to `log` (appended); sys.stdout keeps the terminal's stdout, terminal() its
    stderr. Python-level writes to sys.stderr (warnings, logging handlers) land in the log too. Idempotent."""
    global _TERMINAL, _LOG
    if _LOG is not None:
        return _LOG
    sys.stdout.flush()
    sys.stderr.flush()
    out_fd, err_fd = os.dup(1), os.dup(2)
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(out_fd, "w", buffering=1, encoding=sys.stdout.encoding or "utf-8")
    _TERMINAL = os.fdopen(err_fd, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8")
    _LOG = log
    return log


@contextmanager
def third_party_stdout() -> Iterator[None]:
    """Python-level prints of third-party code into the log while the noise is diverted (FlashInfer's first cuDNN
    call prints 'cudnn_handle created ...' to sys.stdout, which is the terminal's); a no-op otherwise."""
    if _LOG is None:
        yield
        return
    with open(_LOG, "a", buffering=1, encoding="utf-8") as log, redirect_stdout(log):
        yield
