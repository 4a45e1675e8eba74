"""python -m reports build RESULTS [RESULTS...] [--baseline FILE] [--anatomy DIR] -o report.html (--out-file): the
command line is reports/cli.py; this module only guards the imports against signals and runs it."""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("reports")  # Ctrl-C during the imports below: one line, no traceback

import sys  # noqa: E402

from harness.errors import run_cli  # noqa: E402
from reports.cli import main  # noqa: E402,F401  (main: the entry point tests call)

if __name__ == "__main__":
    sys.exit(run_cli(main, "reports"))
