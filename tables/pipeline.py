"""A table from one command, in legs that resume (tables/legs.py names them). Every artifact lives under
results/<profile>/<run-id>/ with manifest.json (each leg's command, status, seconds, machine and the harness sha). A
leg that fails or is interrupted is run again by the same command with --resume, the finished legs kept. A changed
fit rule refits a run's measurements with --refit: the fit and every leg after it run again (the check on a machine
that fitted none), the earlier ones' entries and outputs kept under refit-<n>/."""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from bench.envinfo import fingerprint, git_sha
from harness.errors import HarnessError
from tables.legs import Leg, legs
from tables.legs import execute as run_leg
from tables.manifest import (CHECK_LEGS, FIT_MACHINES, MANIFEST, MANIFEST_FORMAT, MAX_FIT_MACHINES, Scope, TableRun,
                             fitted_legs, other_machine_legs)

REFIT_FROM = "fit"  # --refit runs this leg and every one after it again: they read the fit's table
REJUDGE_FROM = "validate"  # --rejudge runs this leg and every one after it again (CPU only): a changed verdict rule


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _fingerprint() -> dict:
    """This machine's environment fingerprint, for the manifest (each resumed part of a run adds its machine's)."""
    try:
        return fingerprint()
    except Exception as exc:  # no GPU (tests), or NVML missing: the legs' own run.json files still have theirs
        return {"error": f"{type(exc).__name__}: {exc}"}


def gpu_uuid() -> str | None:
    """The first visible GPU's UUID: which machine ran a leg (two leases of one GPU kind differ here)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"  # as nvidia-smi names it
    except Exception:
        return None


def fitted_here(manifest: dict, leg: Leg, here: str | None, same_machine: bool) -> bool:
    """Whether a leg would run on a machine it must not (allowed with --same-machine): an out-of-sample leg on one
    that ran a fitted leg, or another fitting machine's sweep on one whose sweep the fit already takes."""
    if same_machine or here is None:
        return False
    done = manifest.get("legs", {})
    if leg.name in CHECK_LEGS:
        return here in {done.get(f, {}).get("machine") for f in fitted_legs(manifest)}
    if leg.name.startswith("machine-"):
        return here in {done.get(f, {}).get("machine") for f in ["sweep", *other_machine_legs(manifest)]
                        if f != leg.name}
    return False


def plan_text(run: TableRun, scope: Scope | None = None, machines: int | None = None) -> str:
    lines = [f"python -m tables --gpu {run.profile.name}: {run.folder}/ (manifest.json beside the artifacts)"]
    for i, leg in enumerate(legs(run, scope, machines), 1):
        lines.append(f"  leg {i} {leg.name:14s} {'GPU' if leg.gpu else 'CPU'}  {leg.command}")
    return "\n".join(lines)


def check_stop_after(run: TableRun, stop_after: str | None, machines: int | None = None) -> list[str]:
    """The legs' names; a --stop-after that names none of them is refused."""
    names = [leg.name for leg in legs(run, machines=machines)]
    if stop_after is not None and stop_after not in names:
        raise HarnessError(f"--stop-after {stop_after!r} is no leg; the legs: {', '.join(names)}")
    return names


def pending_legs(run: TableRun, resume: bool, stop_after: str | None = None,
                 machines: int | None = None) -> list[Leg]:
    """The legs a run (or its resume) has still to do, up to `stop_after`: only those that need the GPU need a GPU
    machine."""
    todo = legs(run, machines=machines)
    if stop_after is not None:
        todo = todo[:[leg.name for leg in todo].index(stop_after) + 1]
    return [leg for leg in todo if not (resume and run.done(leg.name))]


def legs_run_again(run: TableRun, start: str = REFIT_FROM) -> list[str]:
    """The legs --refit (start: the fit) or --rejudge (start: validate) runs again; refused in one line where the
    run has not reached that leg yet (resume it instead)."""
    what = "refits a table run's measurements" if start == REFIT_FROM else "judges a table run's check again"
    if run.manifest is None:
        raise HarnessError(f"{run.folder} has no {MANIFEST}; --{_verb(start)} {what}: run it first")
    names = [leg.name for leg in legs(run)]
    late = names[names.index(start):]
    missing = [n for n in names[:names.index(start)] if not run.done(n)]
    if missing or not run.done(start):
        why = f"its legs {', '.join(missing)} are not done" if missing else f"its {start} leg has not run"
        raise HarnessError(f"{run.folder}: nothing to {_verb(start)}, {why}; continue it with --resume")
    return late


def _verb(start: str) -> str:
    return "refit" if start == REFIT_FROM else "rejudge"


def set_aside_legs(run: TableRun, machines: int | None = None, start: str = REFIT_FROM) -> Path:
    """--refit: moves the fit's and every later leg's manifest entries into the manifest's `refits` and their
    outputs and logs into refit-<n>/ (nothing deleted), so that a resume runs them again. Returns that folder.
    `machines` (more than the run's): the refit also measures on that many machines, so that a resume first runs
    the new machine-<i> legs, each on a machine of its own. --rejudge (start: validate) moves the verdict legs
    alone, the entry saying which leg it started from."""
    late = legs_run_again(run, start)
    manifest = run.manifest
    before = int(manifest.get("fit_machines") or 1)
    if machines is not None and not before <= machines <= MAX_FIT_MACHINES:
        raise HarnessError(f"--refit --machines {machines}: the run fits on {before}; a refit adds machines (from "
                           f"{before} to {MAX_FIT_MACHINES}), it never drops measured ones")
    n = len(manifest.get("refits", [])) + 1
    kept = run.folder / f"refit-{n}"
    if kept.exists():
        raise HarnessError(f"{kept} exists; move it out of {run.folder} and --refit again")
    kept.mkdir()
    written = [name for leg in legs(run) if leg.name in late for name in (*leg.outputs(), f"{leg.name}.log")]
    moved = [name for name in written if (run.folder / name).exists()]
    for name in moved:
        (run.folder / name).rename(kept / name)
    manifest.setdefault("refits", []).append({
        "at": _now(), "harness_sha": git_sha(), "folder": kept.name, "moved": moved, "from": start,
        "legs": {leg: manifest["legs"].pop(leg) for leg in late if leg in manifest["legs"]},
        **{key: manifest.pop(key) for key in ("status", "verdict", "fitted_on", "validated_on", "out_of_machine")
           if key in manifest}, **({"fit_machines": before} if machines not in (None, before) else {})})
    if machines is not None:
        manifest["fit_machines"] = machines
    run.save()
    return kept


def _start(run: TableRun, resume: bool, scope: Scope | None, machines: int | None) -> None:
    """The checks before a run (or its resume) starts, and a new run's manifest."""
    if run.folder.exists() and any(run.folder.iterdir()) and not resume:
        raise HarnessError(f"{run.folder} exists; pass --resume to continue it, or choose another --run-id")
    if resume and run.manifest is None:
        raise HarnessError(f"{run.folder} has no {MANIFEST}; it is not a table run to resume")
    if resume and scope is not None and scope != run.scope:
        raise HarnessError(f"{run.folder} covers {run.scope.to_json()}, not {scope.to_json()}; resume it without "
                           f"--layout/--model, or start another --run-id")
    if resume and machines is not None and machines != run.machines:
        raise HarnessError(f"{run.folder} fits on {run.machines} machine(s), not {machines}; resume it without "
                           f"--machines, or start another --run-id")
    if not 1 <= (machines or 1) <= MAX_FIT_MACHINES:
        raise HarnessError(f"--machines {machines}: from 1 to {MAX_FIT_MACHINES}")
    if not resume:
        run.folder.mkdir(parents=True, exist_ok=True)
        run.manifest = {"format": MANIFEST_FORMAT, "profile": run.profile.name, "started": _now(),
                        "harness_sha": git_sha(), "legs": {}, "scope": (scope or Scope()).to_json(),
                        "fit_machines": machines or FIT_MACHINES}
        run.save()  # the legs read its scope


def run_pipeline(run: TableRun, resume: bool, execute: Callable[[Leg, Path], int] = run_leg,
                 stop_after: str | None = None, same_machine: bool = False,
                 machine: Callable[[], str | None] = gpu_uuid, scope: Scope | None = None,
                 machines: int | None = None) -> dict:
    """Runs the legs not yet done, in order; stops at the first that fails, or after `stop_after` (a later
    --resume, on this machine or another, continues). `scope`: what a new run covers, `machines`: on how many
    machines its fit measures (a resume keeps its own and refuses another). Returns the manifest."""
    check_stop_after(run, stop_after, machines)
    _start(run, resume, scope, machines)
    if resume and not pending_legs(run, resume):
        return run.manifest  # nothing left to do: the manifest stays as it is
    for leg in legs(run):
        leg.check()  # every leg's arguments parse with its tool's parser before the first runs
    names = check_stop_after(run, stop_after)  # as the manifest now records the run
    here = machine() if any(leg.gpu for leg in pending_legs(run, resume, stop_after)) else None
    manifest = run.manifest
    manifest.setdefault("machines", []).append({"started": _now(), "harness_sha": git_sha(), "gpu_uuid": here,
                                                "fingerprint": _fingerprint()})
    todo = names[:names.index(stop_after) + 1] if stop_after is not None else names
    for name in todo:
        leg = next(x for x in legs(run) if x.name == name)  # anew: a leg's arguments read earlier outputs
        if run.done(leg.name):
            continue
        if leg.gpu and fitted_here(manifest, leg, here, same_machine):
            why = ("the out-of-sample check runs on another machine than the fitted legs" if leg.name in CHECK_LEGS
                   else "each fitting machine's sweep runs on another machine")
            manifest["status"] = (f"waiting before {leg.name}: {why} ({here} ran one); copy {run.folder} there "
                                  f"and --resume, or pass --same-machine")
            run.save()
            return manifest
        _run_one(run, leg, execute, here)
    if todo != names:
        manifest["status"] = f"stopped after {stop_after}"
        run.save()
        return manifest
    _complete(manifest)
    run.save()
    return manifest


def _run_one(run: TableRun, leg: Leg, execute: Callable[[Leg, Path], int], here: str | None) -> None:
    """One leg, its manifest entry written as it ends; a failed leg stops the run."""
    resumed = leg.continued(run.folder)
    print(f"table: leg {leg.name} ..." + (" (continuing its interrupted measurement: --resume)" if resumed != leg
                                          else ""), file=sys.stderr, flush=True)
    leg = resumed
    t0 = time.perf_counter()
    code = 0 if leg.skip else execute(leg, run.folder / f"{leg.name}.log")
    ok = code == 0 or (leg.verdict and code == 1)
    run.manifest["legs"][leg.name] = {
        "command": leg.command, "seconds": round(time.perf_counter() - t0, 1),
        "status": "done" if ok else f"failed (exit {code})", "log": f"{leg.name}.log",
        **({"verdict": "PASS" if code == 0 else "FAIL"} if leg.verdict and ok else {}),
        **({"machine": here} if leg.gpu and here else {}),
        **({"skipped": leg.skip, "command": None, "log": None} if leg.skip else {})}
    run.save()
    if not ok:
        raise HarnessError(f"leg {leg.name} failed (exit {code}); its output is in "
                           f"{run.folder / (leg.name + '.log')}; fix it and run the same command with --resume")


def _complete(manifest: dict) -> None:
    """A finished run's summary: its verdict, the legs it fitted and validated on, whether the check ran on a
    machine that fitted nothing."""
    manifest["status"] = "complete"
    manifest["verdict"] = manifest["legs"]["validate"].get("verdict")
    manifest["fitted_on"] = [f for f in fitted_legs(manifest) if manifest["legs"].get(f, {}).get("command")]
    manifest["validated_on"] = list(CHECK_LEGS)
    checked = {manifest["legs"][c].get("machine") for c in CHECK_LEGS} - {None}
    fitted = {manifest["legs"].get(f, {}).get("machine") for f in fitted_legs(manifest)} - {None}
    manifest["out_of_machine"] = checked.isdisjoint(fitted) if checked and fitted else None  # None: not known
