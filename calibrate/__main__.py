"""python -m calibrate validate | fit | compare | agree | host-shift | noise | forward-noise | l2 | host-cost | baseline
| regress | e2e | vllm | table: the command line is calibrate/cli.py; this module only guards the imports against
signals and runs it."""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("calibrate")  # Ctrl-C during the imports below: one line, no traceback

import sys  # noqa: E402

from calibrate.cli import main  # noqa: E402,F401  (main: the entry point tests and the pipeline call)
from harness.errors import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main, "calibrate"))
