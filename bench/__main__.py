"""python -m bench run | forward | host-anatomy | e2e | merge | paths | profiles: the command line is bench/cli.py;
this module only guards the imports against signals and runs it."""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("bench")  # Ctrl-C during the imports below: one line, no traceback

import sys  # noqa: E402

from bench.cli import main  # noqa: E402,F401  (main: the entry point tests call)
from harness.errors import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main, "bench"))
