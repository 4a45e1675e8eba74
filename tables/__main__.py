"""python -m tables --gpu P [--run-id ID] [--resume | --refit | --rejudge | --install | --dry-run]: the command line is
tables/cli.py; this module only guards the imports against signals and runs it."""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("tables")  # Ctrl-C during the imports below: one line, no traceback

import sys  # noqa: E402

from harness.errors import run_cli  # noqa: E402
from tables.cli import main  # noqa: E402,F401  (main: the entry point tests call)

if __name__ == "__main__":
    sys.exit(run_cli(main, "tables"))
