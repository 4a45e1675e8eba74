"""python -m dispatch build-native | native-status"""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts(__package__)  # Ctrl-C during the imports below: one line, no traceback

import os
import sys
from pathlib import Path
from typing import Sequence

from harness.cli import Parser
from harness.console import divert_noise, terminal
from harness.errors import HarnessError, run_cli


def _check_native_root(root: Path) -> None:
    """$BLB_NATIVE_DIR (or the default cache) must be a folder this user can write, or creatable."""
    try:
        real = root.resolve(strict=False)
    except (OSError, RuntimeError):
        raise HarnessError(f"the native build folder {root} is a symlink loop; point BLB_NATIVE_DIR at a "
                           f"folder") from None
    existing = next((p for p in (real, *real.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise HarnessError(f"the native build folder {root}: {existing} is a file; point BLB_NATIVE_DIR at a folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise HarnessError(f"the native build folder {root} is not writable; point BLB_NATIVE_DIR at a folder you "
                           f"can write")


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m dispatch", description="The dispatcher's C++ bound layer (dispatch/native.py).")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-native", help="compile the C++ bound layer for this torch and Python (15-20 s where timed)")
    b.add_argument("--verbose", action="store_true", help="show the compiler's output")
    sub.add_parser("native-status", help="where the C++ bound layer is looked for, and whether it loads")
    args = parser.parse_args(argv)
    from dispatch import native  # torch: only for the subcommands that build or ask the C++ layer
    if args.command == "native-status":
        mod = native.module()
        build = "python -m dispatch build-native"
        state = ("loads" if mod is not None else "turned off (BLB_NATIVE=0)" if not native.enabled()
                 else f"not built: run {build}" if not native.library().exists()
                 else f"does not load: rebuild it with {build}")
        print(f"{native.library()}: {state}")
        return 0 if mod is not None else 1
    missing = native.toolchain_missing()
    if missing:
        raise HarnessError(f"building the C++ bound layer needs {' and '.join(missing)} on PATH; install them "
                           f"(e.g. apt install g++ ninja-build, or pip install ninja) and run this again")
    _check_native_root(native.build_dir().parent)
    if not args.verbose:
        divert_noise(native.build_dir().parent / "build-log.txt")
    try:
        path = native.build(verbose=args.verbose)
    except Exception as exc:  # the compiler's own output is in the log
        where = "above" if args.verbose else f"in {native.build_dir().parent / 'build-log.txt'}"
        raise HarnessError(f"the C++ bound layer did not build ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                           f"the compiler's output is {where}") from None
    native.forget()
    if native.module() is None:
        raise HarnessError(f"{path} was built but does not load; run python -m dispatch native-status")
    print(f"built {path}; dispatch.bind now returns the C++ layer", file=terminal())
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, __package__))
