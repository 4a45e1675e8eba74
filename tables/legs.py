"""The legs of a table run, each a small typed value: which command of which tool it runs, with which arguments,
whether it needs the GPU machine, what it writes. A GPU leg is its own process (a fresh CUDA context, and nothing a
previous leg tuned or loaded); a CPU leg calls its tool's entry point in this process. Either way its arguments are
parsed by the tool's own parser (check) before the run starts, so a leg can name no option its tool lacks.

sweep -> measured forward -> first fit -> refine (a sweep of the gaps between measured M where the first fit's choice
changes) -> the same sweep on more machines (machine-2 ...: a cell's kernels run several per cent apart on some
machines of one kind, so the fit judges each cell by the median machine) -> fit (fewest ranges, eager boundness and
picks from the forward) -> out-of-sample check on another machine (a fresh-process sweep that includes M the fit
never saw, and a fresh forward of the table beside vLLM's rules, both serving the table's tactics, as the
dispatcher does) -> the noise between the machines (sweeps and forwards) -> validate with it -> regression baseline from
both machines' sweeps -> report.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from bench.autotune_cache import FILE_NAME
from bench.forward_paths import TABLE_PLAIN
from bench.paths import paths_for, unchoosable_reason
from calibrate.vllm_terms import required_paths
from dispatch.backends import ATEN, DISPATCH, is_choosable, lean_path
from harness.errors import HarnessError
from shapes.grid import default_grid
from tables.manifest import TableRun, machine_legs

# M values the out-of-sample sweep adds to the default grid: none of them is a grid value, nor the midpoint of two
# neighbouring grid values (where the refine leg measures)
UNSEEN_M = (10, 18, 80, 112, 176, 640, 3000)
REFINE_PLAN = "refine-cells.txt"
# The fit's tolerance: wide enough that near-equal paths over neighbouring M become one range, and a regret that
# validate cannot call SLOWER (beyond its 3% margin) once the noise floor's smallest band widens it (docs/design.md)
FIT_TOLERANCE = 0.04
# The first fit's, tighter, so that its boundaries (where the refine leg measures) include most of the final fit's
REFINE_TOLERANCE = 0.03
TOOLS = ("bench", "calibrate", "reports")


def _entry(tool: str) -> tuple[Callable, Callable]:
    """(parser(), main(argv)) of a tool's command line."""
    # each tool's command line on first use: bench's imports torch, reports' matplotlib
    if tool == "bench":
        from bench.cli import main, parser
    elif tool == "calibrate":
        from calibrate.cli import main, parser
    else:
        from reports.cli import main, parser
    return parser, main


@dataclass(frozen=True)
class Leg:
    name: str
    tool: str  # bench, calibrate or reports
    args: tuple[str, ...]  # its command line after `python -m <tool>`
    gpu: bool  # needs the GPU machine: runs as its own process
    out: str | None = None  # what it writes in the run folder besides its log (a folder or a file's name)
    verdict: bool = False  # exit 1 is a FAIL verdict to record, not a failed leg
    skip: str | None = None  # why this leg has nothing to do (recorded as done, not run)

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.tool, *self.args]

    @property
    def command(self) -> str:
        """As the manifest and the plan show it: python's `-m <tool> ...`."""
        return " ".join(self.argv[1:])

    def check(self) -> None:
        """Its arguments, parsed by its tool's own parser; one HarnessError naming the leg where they do not parse."""
        parser, _ = _entry(self.tool)
        try:
            with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
                parser().parse_args(list(self.args))
        except (HarnessError, SystemExit) as exc:
            raise HarnessError(f"leg {self.name}: python -m {self.tool} does not take its arguments ({exc})") from None

    def continued(self, folder: Path) -> "Leg":
        """The leg as it runs in `folder`: a measurement an interrupted attempt left there (its results or forward
        table) continues with --resume, its finished rows kept (bench records each part's machine in run.json)."""
        partial = self.gpu and self.tool == "bench" and self.out is not None and any(
            (folder / self.out / name).is_file() for name in ("results.csv", "forward.csv"))
        return replace(self, args=(*self.args, "--resume")) if partial and "--resume" not in self.args else self

    def outputs(self) -> list[str]:
        """The names it writes in the run folder besides its log: its output, and a JSON output's tactics file and
        GEMV configurations beside it."""
        if self.out is None:
            return []
        stem = Path(self.out).stem
        return [self.out, *([f"{stem}.autotune.json", f"{stem}.autotune.gemv.json"] if self.out.endswith(".json")
                            else [])]


def in_process(tool: str, args: list[str], out) -> int:
    """A tool's command line called in this process, its output into the text stream `out`: the exit code as the
    command line would give it (2 for bad input, 1 for a FAIL verdict)."""
    _, main = _entry(tool)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            return int(main(args) or 0)
        except HarnessError as exc:
            print(f"{tool}: error: {exc}", file=out)
            return exc.exit_code


def execute(leg: Leg, log: Path) -> int:
    """Runs one leg, its output into `log`: its own process where it needs the GPU, else its tool's main here."""
    with log.open("w") as fh:
        if leg.gpu:
            return subprocess.run(leg.argv, stdout=fh, stderr=subprocess.STDOUT).returncode
        return in_process(leg.tool, list(leg.args), fh)


def legs(run: TableRun, scope=None, machines: int | None = None) -> list[Leg]:
    """The run's legs; `scope` and `machines` (fitting machines) None: what its manifest records."""
    profile, folder = run.profile, run.folder
    p, low = profile.name, profile.low_m_backend
    scope = scope if scope is not None else run.scope
    covers, covers_fw = scope.args(), scope.forward_args()
    # the fitted sweep leaves out the dispatcher (it would run the table being replaced; the check runs the new one)
    # and what the dispatcher cannot choose (a backend without a lean call), as a default sweep does
    fit_paths = ",".join(x.name for x in paths_for(profile.flashinfer_backends, None)
                         if x.name != DISPATCH and unchoosable_reason(x) is None)
    check_ms = ",".join(map(str, sorted(set(default_grid(profile.capture_size)) | set(UNSEEN_M))))
    table, sweep, forward, refine = folder / "table.json", folder / "sweep", folder / "forward", folder / "refine"
    check_sweep, check_forward = folder / "check-sweep", folder / "check-forward"
    noise, forward_noise = folder / "noise.json", folder / "forward-noise.json"
    floors = ("--noise", str(noise), "--forward-floor", str(forward_noise))  # the verdict's and the page's alike
    tactics, table_tactics = sweep / FILE_NAME, folder / "table.autotune.json"
    plan = folder / REFINE_PLAN
    refined = not (plan.is_file() and not plan.read_text().strip())  # unknown before the first fit: planned
    others = machine_legs(machines if machines is not None else run.machines)
    fit = ["fit", str(sweep), "--gpu", p, "--method", "segments", "--forward", str(forward)]
    # another machine's sweep needs only what the fit chooses from: F.linear, the lean calls and the GEMV
    lean = ",".join(x.name for x in paths_for(profile.flashinfer_backends, None)
                    if x.name == ATEN or is_choosable(x.name))
    # the check's forward also runs vLLM's rules, so that its report leads with the answer in vLLM's terms (rules
    # that run the same paths as an earlier one, F.linear's on SM90, are read off it, not timed again), and every
    # single path the fit's forward ran: validate confirms or refutes the fit's vetoes with them, and the forward
    # floor pairs them with the fit's forward at every M
    fit_forward = [ATEN, lean_path(low), lean_path("cublaslt")]
    # and the table's choices with every GEMV call launched plainly: beside dispatch (each launched as its
    # configuration says), what the tuner's PDL choices give the captured forward (calibrate forward-ratio --pairs
    # dispatch/table-plain)
    check_paths = ",".join(dict.fromkeys([*fit_forward, *required_paths(profile), TABLE_PLAIN]))

    def sweep_leg(name: str, *args: str, skip: str | None = None) -> Leg:
        return Leg(name, "bench", ("run", "--gpu", p, *covers, *args, "--out", str(folder / name)), True, name,
                   skip=skip)

    def forward_leg(name: str, *args: str) -> Leg:
        return Leg(name, "bench", ("forward", "--gpu", p, *covers_fw, "--skip-slower", "3", *args, "--out",
                                   str(folder / name)), True, name)

    def cpu_leg(name: str, tool: str, args: list[str], out: str | None, verdict: bool = False) -> Leg:
        return Leg(name, tool, tuple(args), False, out, verdict)
    return [
        # the first sweep tunes: its tactics become the table's, which every later leg serves
        sweep_leg("sweep", "--paths", fit_paths, "--tune"),
        forward_leg("forward", "--autotune-cache", str(tactics), "--paths", ",".join(fit_forward)),
        cpu_leg("first-fit", "calibrate", [*fit, "--tolerance", str(REFINE_TOLERANCE), "--out-file",
                                           str(folder / "first-fit.json"), "--plan-refine", str(plan)],
                "first-fit.json"),
        sweep_leg("refine", "--cells", f"@{plan}", "--paths", fit_paths, "--autotune-cache", str(tactics),
                  skip=None if refined else "the first fit's choice changes in no gap between measured M"),
        *(sweep_leg(name, "--paths", lean, "--autotune-cache", str(tactics)) for name in others),
        cpu_leg("fit", "calibrate", [*fit, "--tolerance", str(FIT_TOLERANCE), *(["--add", str(refine)] if refined else []),
                                     *(["--machine", *(str(folder / name) for name in others)] if others else []),
                                     "--out-file", str(table)], table.name),
        sweep_leg("check-sweep", "--m", check_ms, "--table", str(table), "--autotune-cache", str(table_tactics)),
        forward_leg("check-forward", "--table", str(table), "--autotune-cache", str(table_tactics), "--paths",
                    check_paths),
        # the run-to-run floors of this run's own machines (every sweep of the grid, both forwards) widen the
        # check's intervals, so that a first table of a GPU is judged as one with a shipped floor is
        cpu_leg("noise", "calibrate", ["noise", str(sweep), *(str(folder / name) for name in others),
                                       str(check_sweep), "--gpu", p, "--out-file", str(noise)], noise.name),
        cpu_leg("forward-noise", "calibrate", ["forward-noise", str(forward), str(check_forward), "--gpu", p,
                                               "--out-file", str(forward_noise)], forward_noise.name),
        cpu_leg("validate", "calibrate", ["validate", str(check_sweep), "--table", str(table), "--forward",
                                          str(check_forward), *floors], None, verdict=True),
        cpu_leg("baseline", "calibrate", ["baseline", "--gpu", p, "--from", str(sweep), str(check_sweep), "--out-file",
                                          str(folder / "baseline.json")], "baseline.json"),
        cpu_leg("report", "reports", ["build", str(check_sweep), "--table", str(table), "--forward",
                                      str(check_forward), *floors, "-o", str(folder / "report.html")], "report.html"),
    ]
