"""python -m tables --gpu P: a table from one command, in legs that resume (tables/legs.py, tables/pipeline.py), and
--install of a passing run (tables/install.py)."""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Sequence

from bench.sweep import require_gpu
from calibrate.runs import RESULTS
from dispatch.profiles import get_profile
from harness.cli import Parser, int_in
from harness.errors import HarnessError
from harness.options import add
from shapes.derive import CATALOG_LAYOUTS
from tables.install import fewer_baseline_runs, install
from tables.legs import legs
from tables.manifest import FIT_MACHINES, MANIFEST, MAX_FIT_MACHINES, TableRun, parse_scope
from tables.pipeline import (REFIT_FROM, REJUDGE_FROM, check_stop_after, pending_legs, plan_text, legs_run_again,
                             run_pipeline, set_aside_legs)


def parser() -> Parser:
    p = Parser(prog="python -m tables", description="(GPU) a GPU's dispatch table from one command: sweep, forward, "
                                                    "fit, out-of-sample check, baseline, report, in legs that resume")
    add(p, "gpu", required=True)
    p.add_argument("--run-id", help="the run's folder under results/<profile>/ (default: a new UTC time stamp)")
    add(p, "resume", what=": the legs of --run-id that are not done")
    p.add_argument("--refit", action="store_true",
                   help="fit --run-id's measurements again (a changed fit rule) and run every leg after the fit "
                        "again; the earlier entries and outputs move to refit-<n>/")
    p.add_argument("--rejudge", action="store_true",
                   help="judge --run-id's check again (a changed verdict rule; CPU only): validate and every leg "
                        "after it run again; the earlier entries and outputs move to refit-<n>/")
    add(p, "dry-run", what="(its legs; any machine)")
    p.add_argument("--stop-after", metavar="LEG",
                   help="stop after this leg (e.g. fit: the check on another machine with --resume)")
    p.add_argument("--same-machine", action="store_true",
                   help="let the out-of-sample legs run on a machine that ran a fitted leg (one GPU machine "
                        "only; the manifest then says the check was in-machine)")
    add(p, "layout", choices=CATALOG_LAYOUTS, shown="union, as shipped",
        what=" the table covers: union: vLLM's fused layers and the transformers modules they fuse, one table for vLLM "
             "and dispatch.patch; vllm or transformers: one of them only")
    add(p, "model", what="(comma list) the table covers", shown="every model")
    p.add_argument("--machines", type=int_in(1, MAX_FIT_MACHINES),
                   help="how many machines the fit measures on: the sweep's and a machine-<i> leg on each other "
                        f"one (default {FIT_MACHINES}; a resume keeps the run's; with --refit, more than the "
                        f"run's adds machine-<i> legs before the fit)")
    add(p, "install", what=": the table, its tactics and the baseline of --run-id (a complete run whose "
                           "check passed, judged again from its legs)")
    return p


def _run_of(args) -> TableRun:
    """The run the options name, its folder under results/<profile>/, its manifest read once."""
    if (args.resume or args.install or args.refit or args.rejudge) and not args.run_id:
        raise HarnessError("--resume, --refit, --rejudge and --install name a run: pass --run-id")
    run_id = args.run_id or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    if not run_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise HarnessError(f"--run-id {run_id!r}: letters, digits, '-', '_' and '.' only")
    profile = get_profile(args.gpu)
    return TableRun(profile, RESULTS / profile.name / run_id)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    scope = parse_scope(args.layout, args.model)
    if scope is not None and args.install:
        raise HarnessError("--install takes the run's own scope: drop --layout/--model")
    if args.refit and args.rejudge:
        raise HarnessError("--refit judges the run again already: drop --rejudge")
    if (args.refit or args.rejudge) and (args.install or scope is not None):
        word = "--refit" if args.refit else "--rejudge"
        raise HarnessError(f"{word} keeps the run's scope and installs nothing: drop --install/--layout/--model")
    run = _run_of(args)
    if args.resume and run.manifest is None:  # before any GPU check: the run is what is missing
        raise HarnessError(f"{run.folder} has no {MANIFEST}: no table run to resume there; start one without "
                           f"--resume, or copy the run's folder here first")
    check_stop_after(run, args.stop_after, args.machines)
    if args.dry_run:
        print(plan_text(run, scope, args.machines))
        return 0
    if args.install:
        fewer = fewer_baseline_runs(run)
        for path in install(run):
            print(f"installed {path}")
        if fewer:
            print(f"tables: note: {fewer}", file=sys.stderr)
        return 0
    if args.refit or args.rejudge:
        start, word = (REFIT_FROM, "--refit") if args.refit else (REJUDGE_FROM, "--rejudge")
        if args.rejudge and args.machines is not None:
            raise HarnessError("--rejudge measures nothing: drop --machines")
        late = legs_run_again(run, start)
        if args.stop_after is not None and args.stop_after not in late:
            raise HarnessError(f"--stop-after {args.stop_after}: {word} runs {', '.join(late)}; stop after one of "
                               f"them")
        todo = late[:late.index(args.stop_after) + 1] if args.stop_after is not None else late
        if any(leg.gpu for leg in legs(run) if leg.name in todo):
            require_gpu(run.profile)  # before any file system change
        what = "fit and check" if args.refit else "verdict"
        print(f"table: {word[2:]} {run.folder}: earlier {what} kept in {set_aside_legs(run, args.machines, start)}")
    elif any(leg.gpu for leg in pending_legs(run, args.resume, args.stop_after, args.machines)):
        require_gpu(run.profile)  # before any file system change
    manifest = run_pipeline(run, args.resume or args.refit or args.rejudge, stop_after=args.stop_after,
                            same_machine=args.same_machine, scope=scope, machines=args.machines)
    if manifest.get("status") != "complete":
        print(f"table: {manifest['status']}; continue with --run-id {run.folder.name} --resume; legs in "
              f"{run.file}")
        return 0
    print(f"table: {run.folder}/table.json, verdict {manifest.get('verdict')}; legs and times in {run.file}")
    return 0
