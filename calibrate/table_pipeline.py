"""`python -m calibrate table --gpu P`: a table from one command, in legs that resume.

sweep -> measured forward -> first fit -> refine (a sweep of the gaps between measured M where the first fit's choice
changes) -> the same sweep on more machines (machine-2 ...: a cell's kernels run several per cent apart on some
machines of one kind, so the fit judges each cell by the median machine) -> fit (fewest ranges, eager boundness and
picks from the forward) -> out-of-sample check on another machine
(a fresh-process sweep that includes M the fit never saw, and a fresh forward of the table beside vLLM's rules, both
serving the table's tactics, as the dispatcher does) -> the noise between the fitting and the checking machine ->
validate -> regression baseline from both machines' sweeps -> report. Every artifact lives under results/<profile>/<run-id>/ with
manifest.json (each leg's command, status, seconds, machine and the harness sha). Each leg is its own process, so a
leg that fails or is interrupted is run again by the same command with --resume, the finished legs kept. A changed
fit rule refits a run's measurements with --refit: the fit and every leg after it run again (the check on a machine
that fitted none), the earlier ones' entries and outputs kept under refit-<n>/.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from bench.autotune_cache import FILE_NAME, gemv_file
from shapes.derive import UNION
from bench.envinfo import git_sha
from dispatch.backends import ATEN, is_choosable, lean_path
from dispatch.profiles import GpuProfile
from harness.errors import HarnessError
from harness.io import ROOT, atomic_write_text, check_format, read_json_object
from harness.shipped import shipped_file

MANIFEST = "manifest.json"
# M values the out-of-sample sweep adds to the default grid: none of them is a grid value, nor the midpoint of two
# neighbouring grid values (where the refine leg measures)
UNSEEN_M = (10, 18, 80, 112, 176, 640, 3000)
REFINE_PLAN = "refine-cells.txt"
# the out-of-sample legs, which run on another machine than the fitted legs (by GPU UUID)
CHECK_LEGS = ("check-sweep", "check-forward")
FIT_LEGS = ("sweep", "forward", "refine")
# The machines whose sweeps the fit takes: the first sweep's and a machine-<i> leg on each other one. A run started
# before machine legs existed fitted one machine's.
FIT_MACHINES = 3
MAX_FIT_MACHINES = 8


# --refit runs this leg and every one after it again: they read the fit's table
REFIT_FROM = "fit"


def machine_legs(machines: int) -> list[str]:
    return [f"machine-{i}" for i in range(2, machines + 1)]


def recorded(run: Path) -> dict | None:
    """A run's manifest as the legs read it: None where there is none yet; a damaged one is refused in one line."""
    if not (run / MANIFEST).exists():
        return None
    return read_manifest(run / MANIFEST)


_FIX = "restore it from the run's copy, or start another --run-id"
MANIFEST_FORMAT = 1
# key -> what its value must be; keys not named here are kept as they are
_MANIFEST_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "profile": ((str,), "a profile name"), "started": ((str,), "a time"), "harness_sha": ((str, type(None)), "a sha"),
    "legs": ((dict,), "an object of legs"), "fit_machines": ((int,), "an integer"),
    "machines": ((list,), "a list of machines"), "refits": ((list,), "a list of refits"),
    "status": ((str,), "a status"), "verdict": ((str, type(None)), "a verdict"),
    "fitted_on": ((list,), "a list of legs"), "validated_on": ((list,), "a list of legs"),
    "out_of_machine": ((bool, type(None)), "true, false or null"), "scope": ((dict,), "an object"),
}


def read_manifest(path: Path) -> dict:
    """A run's manifest where the run goes on from it (resume, install): each key of the type the legs write and
    fit_machines within 1..MAX_FIT_MACHINES; a damaged one is refused in one line."""
    data = read_json_object(path, "table run manifest", _FIX)
    check_format(data, path, "table run manifest", (MANIFEST_FORMAT,), "continue it with the harness that started it "
                                                                      "(its harness_sha), or start another --run-id")
    for key, (types, what) in _MANIFEST_TYPES.items():
        value = data.get(key)
        if key in data and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise HarnessError(f"table run manifest {path}: {key} is {value!r:.60}, not {what}; {_FIX}")
    fit = data.get("fit_machines", FIT_MACHINES)
    if not 1 <= fit <= MAX_FIT_MACHINES:
        raise HarnessError(f"table run manifest {path}: fit_machines {fit} is outside 1..{MAX_FIT_MACHINES}; {_FIX}")
    for name, entry in data.get("legs", {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("status", ""), str):
            raise HarnessError(f"table run manifest {path}: leg {name!r} is not an object with a status; {_FIX}")
    for key in ("machines", "refits"):
        if not all(isinstance(item, dict) for item in data.get(key, [])):
            raise HarnessError(f"table run manifest {path}: {key} must be a list of objects; {_FIX}")
    for key in ("fitted_on", "validated_on"):
        if not all(isinstance(item, str) for item in data.get(key, [])):
            raise HarnessError(f"table run manifest {path}: {key} must be a list of leg names; {_FIX}")
    scope = data.get("scope", {})
    models = scope.get("models")
    if not isinstance(scope.get("layout", "vllm"), str) or not (
            models is None or (isinstance(models, list) and all(isinstance(m, str) for m in models))):
        raise HarnessError(f"table run manifest {path}: scope must be {{layout, models}}; {_FIX}")
    return data


def run_machines(run: Path) -> int:
    """The fitting machines a run's manifest records (FIT_MACHINES for a run not started yet)."""
    data = recorded(run)
    if data is None:
        return FIT_MACHINES
    return int(data.get("fit_machines") or 1)


# The fit's tolerance: wide enough that near-equal paths over neighbouring M become one range, and a regret that
# validate cannot call SLOWER (beyond its 3% margin) once the noise floor's smallest band widens it (docs/design.md)
FIT_TOLERANCE = 0.04
# The first fit's, tighter, so that its boundaries (where the refine leg measures) include most of the final fit's
REFINE_TOLERANCE = 0.03


@dataclass(frozen=True)
class Scope:
    """What a table run covers: the layout its shapes come in (the union of vLLM's fused layers and transformers'
    modules by default: one table for a vLLM and a transformers model; or one of them) and the catalog models
    (None: every one). Kept in the manifest, so that every resume runs the same shapes."""
    layout: str = UNION
    models: tuple[str, ...] | None = None

    def args(self) -> list[str]:
        """The options the sweep legs (bench run) take for it."""
        return [*(["--layout", self.layout] if self.layout != "vllm" else []),
                *(["--model", ",".join(self.models)] if self.models else [])]

    def forward_args(self) -> list[str]:
        """The options the forward legs take: a forward runs one layout, vLLM's for the union (the forward the fit
        and the verdict read; transformers' modules are judged cell by cell)."""
        return Scope("vllm" if self.layout == UNION else self.layout, self.models).args()

    def is_default(self) -> bool:
        return self == Scope()

    def to_json(self) -> dict:
        return {"layout": self.layout, "models": list(self.models) if self.models else None}


def parse_scope(layout: str | None, models: str | None) -> Scope | None:
    """The scope the options name (None where they name none), each model checked against the catalog."""
    if layout is None and models is None:
        return None
    from shapes.catalog import model_layers
    names = tuple(m.strip() for m in models.split(",")) if models is not None else None
    if names is not None and (not all(names) or len(set(names)) != len(names)):
        raise HarnessError(f"--model {models!r}: a comma list of distinct catalog models")
    scope = Scope(layout or UNION, names)
    for name in names or (None,):
        model_layers(name, 1, scope.layout)  # an unknown model or layout is refused here
    return scope


def run_scope(run: Path) -> Scope:
    """The scope a run's manifest records: the default for a run not started, vLLM's layout for a run made before
    the manifest recorded one."""
    manifest = recorded(run)
    if manifest is None:
        return Scope()
    data = manifest.get("scope") or {}
    models = data.get("models")
    return Scope(str(data.get("layout") or "vllm"), tuple(models) if models else None)


@dataclass(frozen=True)
class Leg:
    name: str
    argv: list[str]
    gpu: bool  # needs the GPU machine
    verdict: bool = False  # exit 1 is a FAIL verdict to record, not a failed leg
    skip: str | None = None  # why this leg has nothing to do (recorded as done, not run)


def legs(profile: GpuProfile, run: Path, scope: Scope | None = None, machines: int | None = None) -> list[Leg]:
    """The run's legs; `scope` and `machines` (fitting machines) None: what its manifest records."""
    from bench.paths import DISPATCH, paths_for, unchoosable_reason
    p, low = profile.name, profile.low_m_backend
    scope = scope if scope is not None else run_scope(run)
    covers, covers_fw = scope.args(), scope.forward_args()
    py = [sys.executable, "-m"]
    # the fitted sweep leaves out the dispatcher (it would run the table being replaced; the check runs the new one)
    # and what the dispatcher cannot choose (a backend without a lean call), as a default sweep does
    fit_paths = ",".join(x.name for x in paths_for(profile.flashinfer_backends, None)
                         if x.name != DISPATCH and unchoosable_reason(x) is None)
    from shapes.grid import default_grid
    check_ms = ",".join(map(str, sorted(set(default_grid(profile.capture_size)) | set(UNSEEN_M))))
    table, sweep, forward, refine = run / "table.json", run / "sweep", run / "forward", run / "refine"
    check_sweep, check_forward = run / "check-sweep", run / "check-forward"
    tactics, table_tactics = sweep / FILE_NAME, run / "table.autotune.json"
    plan = run / REFINE_PLAN
    refined = not (plan.is_file() and not plan.read_text().strip())  # unknown before the first fit: planned
    others = machine_legs(machines if machines is not None else run_machines(run))
    fit = [*py, "calibrate", "fit", str(sweep), "--gpu", p, "--method", "segments", "--forward", str(forward)]
    # another machine's sweep needs only what the fit chooses from: F.linear, the lean calls and the GEMV
    lean = ",".join(x.name for x in paths_for(profile.flashinfer_backends, None)
                    if x.name == ATEN or is_choosable(x.name))
    # the check's forward also runs vLLM's rules, so that its report leads with the answer in vLLM's terms (rules
    # that run the same paths as an earlier one, F.linear's on SM90, are read off it, not timed again)
    from calibrate.vllm_terms import required_paths
    check_paths = ",".join(dict.fromkeys([ATEN, lean_path(low), *required_paths(profile)]))
    return [
        # the first sweep tunes: its tactics become the table's, which every later leg serves
        Leg("sweep", [*py, "bench", "run", "--gpu", p, *covers, "--paths", fit_paths, "--tune", "--out", str(sweep)],
            True),
        Leg("forward", [*py, "bench", "forward", "--gpu", p, *covers_fw, "--skip-slower", "3", "--autotune-cache",
                        str(tactics), "--paths", ",".join([ATEN, lean_path(low), lean_path("cublaslt")]), "--out",
                        str(forward)], True),
        Leg("first-fit", [*fit, "--tolerance", str(REFINE_TOLERANCE), "--out-file", str(run / "first-fit.json"),
                          "--plan-refine", str(plan)], False),
        Leg("refine", [*py, "bench", "run", "--gpu", p, *covers, "--cells", f"@{plan}", "--paths", fit_paths,
                       "--autotune-cache", str(tactics), "--out", str(refine)], True,
            skip=None if refined else "the first fit's choice changes in no gap between measured M"),
        *(Leg(name, [*py, "bench", "run", "--gpu", p, *covers, "--paths", lean, "--autotune-cache", str(tactics),
                     "--out", str(run / name)], True) for name in others),
        Leg("fit", [*fit, "--tolerance", str(FIT_TOLERANCE), *(["--add", str(refine)] if refined else []),
                    *(["--machine", *(str(run / name) for name in others)] if others else []), "--out-file", str(table)],
            False),
        Leg("check-sweep", [*py, "bench", "run", "--gpu", p, *covers, "--m", check_ms, "--table", str(table),
                            "--autotune-cache", str(table_tactics), "--out", str(check_sweep)], True),
        Leg("check-forward", [*py, "bench", "forward", "--gpu", p, *covers_fw, "--skip-slower", "3", "--table", str(table),
                              "--autotune-cache", str(table_tactics), "--paths", check_paths, "--out",
                              str(check_forward)], True),
        Leg("noise", [*py, "calibrate", "noise", str(sweep), str(check_sweep), "--gpu", p, "--out-file",
                      str(run / "noise.json")], False),
        Leg("validate", [*py, "calibrate", "validate", str(check_sweep), "--table", str(table), "--forward",
                         str(check_forward)], False, verdict=True),
        Leg("baseline", [*py, "calibrate", "baseline", "--gpu", p, "--from", str(sweep), str(check_sweep),
                         "--out-file", str(run / "baseline.json")], False),
        Leg("report", [*py, "reports", "build", str(check_sweep), "--table", str(table), "--forward",
                       str(check_forward), "-o", str(run / "report.html")], False),
    ]


def _fingerprint() -> dict:
    """This machine's environment fingerprint, for the manifest (each resumed part of a run adds its machine's)."""
    try:
        from bench.envinfo import fingerprint
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


def other_machine_legs(manifest: dict) -> list[str]:
    """The machine-<i> legs a run's manifest has an entry for."""
    return [name for name in manifest.get("legs", {}) if name.startswith("machine-")]


def fitted_legs(manifest: dict) -> list[str]:
    """The legs that measured what the fit takes: the first machine's and every other fitting machine's."""
    return [*FIT_LEGS, *other_machine_legs(manifest)]


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


def plan_text(profile: GpuProfile, run: Path, scope: Scope | None = None, machines: int | None = None) -> str:
    lines = [f"calibrate table --gpu {profile.name}: {run}/ (manifest.json beside the artifacts)"]
    for i, leg in enumerate(legs(profile, run, scope, machines), 1):
        lines.append(f"  leg {i} {leg.name:14s} {'GPU' if leg.gpu else 'CPU'}  {' '.join(leg.argv[1:])}")
    return "\n".join(lines)


def check_stop_after(profile: GpuProfile, run: Path, stop_after: str | None, machines: int | None = None) -> list[str]:
    """The legs' names; a --stop-after that names none of them is refused."""
    names = [leg.name for leg in legs(profile, run, machines=machines)]
    if stop_after is not None and stop_after not in names:
        raise HarnessError(f"--stop-after {stop_after!r} is no leg; the legs: {', '.join(names)}")
    return names


def pending_legs(profile: GpuProfile, run: Path, resume: bool, stop_after: str | None = None,
                 machines: int | None = None) -> list[Leg]:
    """The legs a run (or its resume) has still to do, up to `stop_after`: only those that need the GPU need a GPU
    machine."""
    done = (recorded(run) or {}).get("legs", {}) if resume else {}
    todo = legs(profile, run, machines=machines)
    if stop_after is not None:
        todo = todo[:[leg.name for leg in todo].index(stop_after) + 1]
    return [leg for leg in todo if done.get(leg.name, {}).get("status") != "done"]


def leg_outputs(leg: Leg) -> list[str]:
    """The names a leg writes in the run folder besides its log: its --out (a folder) or --out-file (-o), and a JSON output's tactics file
    and GEMV configurations beside it."""
    flag = next((f for f in ("--out", "--out-file", "-o") if f in leg.argv), None)
    if flag is None:
        return []
    out = Path(leg.argv[leg.argv.index(flag) + 1])
    return [out.name, *([out.stem + ".autotune.json", out.stem + ".autotune.gemv.json"] if out.suffix == ".json"
                         else [])]


def refit_legs(profile: GpuProfile, run: Path) -> list[str]:
    """The legs --refit runs again; refused in one line where the run has not fitted yet (resume it instead)."""
    if not (run / MANIFEST).is_file():
        raise HarnessError(f"{run} has no {MANIFEST}; --refit refits a table run's measurements: run it first")
    manifest = read_manifest(run / MANIFEST)  # a damaged one is refused in one line
    names = [leg.name for leg in legs(profile, run)]
    late = names[names.index(REFIT_FROM):]
    done = manifest.get("legs", {})
    missing = [n for n in names[:names.index(REFIT_FROM)] if done.get(n, {}).get("status") != "done"]
    if missing or done.get(REFIT_FROM, {}).get("status") != "done":
        why = f"its legs {', '.join(missing)} are not done" if missing else f"its {REFIT_FROM} leg has not run"
        raise HarnessError(f"{run}: nothing to refit, {why}; continue it with --resume")
    return late


def supersede_fit(profile: GpuProfile, run: Path, machines: int | None = None) -> Path:
    """--refit: moves the fit's and every later leg's manifest entries into the manifest's `refits` and their
    outputs and logs into refit-<n>/ (nothing deleted), so that a resume runs them again. Returns that folder.
    `machines` (more than the run's): the refit also measures on that many machines, so that a resume first runs
    the new machine-<i> legs, each on a machine of its own."""
    late = refit_legs(profile, run)
    manifest = read_manifest(run / MANIFEST)
    before = int(manifest.get("fit_machines") or 1)
    if machines is not None and not before <= machines <= MAX_FIT_MACHINES:
        raise HarnessError(f"--refit --machines {machines}: the run fits on {before}; a refit adds machines (from "
                           f"{before} to {MAX_FIT_MACHINES}), it never drops measured ones")
    n = len(manifest.get("refits", [])) + 1
    kept = run / f"refit-{n}"
    if kept.exists():
        raise HarnessError(f"{kept} exists; move it out of {run} and --refit again")
    kept.mkdir()
    written = [name for leg in legs(profile, run) if leg.name in late
               for name in (*leg_outputs(leg), f"{leg.name}.log")]
    moved = [name for name in written if (run / name).exists()]
    for name in moved:
        (run / name).rename(kept / name)
    manifest.setdefault("refits", []).append({
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "harness_sha": git_sha(),
        "folder": kept.name, "moved": moved, "legs": {leg: manifest["legs"].pop(leg) for leg in late
                                                      if leg in manifest["legs"]},
        **{key: manifest.pop(key) for key in ("status", "verdict", "fitted_on", "validated_on", "out_of_machine")
           if key in manifest}, **({"fit_machines": before} if machines not in (None, before) else {})})
    if machines is not None:
        manifest["fit_machines"] = machines
    atomic_write_text(run / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return kept


def _default_exec(leg: Leg, log: Path) -> int:
    with log.open("w") as fh:
        return subprocess.run(leg.argv, stdout=fh, stderr=subprocess.STDOUT).returncode


def run_pipeline(profile: GpuProfile, run: Path, resume: bool, execute: Callable[[Leg, Path], int] = _default_exec,
                 stop_after: str | None = None, same_machine: bool = False,
                 machine: Callable[[], str | None] = gpu_uuid, scope: Scope | None = None,
                 machines: int | None = None) -> dict:
    """Runs the legs not yet done, in order; stops at the first that fails, or after `stop_after` (a later
    --resume, on this machine or another, continues). `scope`: what a new run covers, `machines`: on how many
    machines its fit measures (a resume keeps its own and refuses another). Returns the manifest."""
    check_stop_after(profile, run, stop_after, machines)
    manifest_file = run / MANIFEST
    if run.exists() and any(run.iterdir()) and not resume:
        raise HarnessError(f"{run} exists; pass --resume to continue it, or choose another --run-id")
    if resume and not manifest_file.is_file():
        raise HarnessError(f"{run} has no {MANIFEST}; it is not a table run to resume")
    kept = read_manifest(manifest_file) if resume else None
    if resume and scope is not None and scope != run_scope(run):
        raise HarnessError(f"{run} covers {run_scope(run).to_json()}, not {scope.to_json()}; resume it without "
                           f"--layout/--model, or start another --run-id")
    if resume and machines is not None and machines != run_machines(run):
        raise HarnessError(f"{run} fits on {run_machines(run)} machine(s), not {machines}; resume it without "
                           f"--machines, or start another --run-id")
    if not 1 <= (machines or 1) <= MAX_FIT_MACHINES:
        raise HarnessError(f"--machines {machines}: from 1 to {MAX_FIT_MACHINES}")
    if kept is not None and not pending_legs(profile, run, resume):
        return kept  # nothing left to do: the manifest stays as it is
    run.mkdir(parents=True, exist_ok=True)
    manifest = kept if kept is not None else {
        "format": MANIFEST_FORMAT, "profile": profile.name,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "harness_sha": git_sha(), "legs": {}, "scope": (scope or Scope()).to_json(),
        "fit_machines": machines or FIT_MACHINES}
    if not resume:
        atomic_write_text(manifest_file, json.dumps(manifest, indent=1) + "\n")  # the legs read its scope
    names = check_stop_after(profile, run, stop_after)  # as the manifest now records the run
    here = machine() if any(leg.gpu for leg in pending_legs(profile, run, resume, stop_after)) else None
    manifest.setdefault("machines", []).append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                                "harness_sha": git_sha(), "gpu_uuid": here,
                                                "fingerprint": _fingerprint()})
    todo = names[:names.index(stop_after) + 1] if stop_after is not None else names
    for name in todo:
        leg = next(x for x in legs(profile, run) if x.name == name)  # anew: a leg's command reads earlier outputs
        if manifest["legs"].get(leg.name, {}).get("status") == "done":
            continue
        if leg.gpu and fitted_here(manifest, leg, here, same_machine):
            why = ("the out-of-sample check runs on another machine than the fitted legs" if leg.name in CHECK_LEGS
                   else "each fitting machine's sweep runs on another machine")
            manifest["status"] = (f"waiting before {leg.name}: {why} ({here} ran one); copy {run} there and "
                                  f"--resume, or pass --same-machine")
            atomic_write_text(manifest_file, json.dumps(manifest, indent=1) + "\n")
            return manifest
        print(f"table: leg {leg.name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        code = 0 if leg.skip else execute(leg, run / f"{leg.name}.log")
        ok = code == 0 or (leg.verdict and code == 1)
        entry = {"command": " ".join(leg.argv[1:]), "seconds": round(time.perf_counter() - t0, 1),
                 "status": "done" if ok else f"failed (exit {code})", "log": f"{leg.name}.log",
                 **({"verdict": "PASS" if code == 0 else "FAIL"} if leg.verdict and ok else {}),
                 **({"machine": here} if leg.gpu and here else {}),
                 **({"skipped": leg.skip, "command": None, "log": None} if leg.skip else {})}
        manifest["legs"][leg.name] = entry
        atomic_write_text(manifest_file, json.dumps(manifest, indent=1) + "\n")
        if not ok:
            raise HarnessError(f"leg {leg.name} failed (exit {code}); its output is in {run / (leg.name + '.log')}; "
                               f"fix it and run the same command with --resume")
    if todo != names:
        manifest["status"] = f"stopped after {stop_after}"
        atomic_write_text(manifest_file, json.dumps(manifest, indent=1) + "\n")
        return manifest
    manifest["status"] = "complete"
    manifest["verdict"] = manifest["legs"]["validate"].get("verdict")
    manifest["fitted_on"] = [f for f in fitted_legs(manifest) if manifest["legs"].get(f, {}).get("command")]
    manifest["validated_on"] = list(CHECK_LEGS)
    checked = {manifest["legs"][c].get("machine") for c in CHECK_LEGS} - {None}
    fitted = {manifest["legs"].get(f, {}).get("machine") for f in fitted_legs(manifest)} - {None}
    manifest["out_of_machine"] = checked.isdisjoint(fitted) if checked and fitted else None  # None: not known
    atomic_write_text(manifest_file, json.dumps(manifest, indent=1) + "\n")
    return manifest


def fewer_baseline_runs(profile: GpuProfile, run: Path) -> str | None:
    """A note when the run's baseline holds fewer source runs than the shipped one it replaces: a cell with two
    speeds across processes can then fail make regress on a healthy machine (docs/design.md, Noise floors)."""
    from calibrate.baseline import baseline_path

    def runs(path: Path) -> int:
        try:
            return len(json.loads(path.read_text()).get("sources") or [])
        except (OSError, ValueError, AttributeError):
            return 0
    shipped, new = runs(baseline_path(profile.name)), runs(run / "baseline.json")
    if new >= shipped:
        return None
    return (f"the shipped baseline held {shipped} source runs, this run's holds {new}. To widen it, run make regress "
            f"with BENCH_REGRESSION_WORK=DIR on other machines, then python -m calibrate baseline --gpu {profile.name} "
            f"--from {run / 'sweep'} {run / 'check-sweep'} DIR/fresh ... --install")


def install(profile: GpuProfile, run: Path) -> list[Path]:
    """The run's table (with its tactics) and baseline (with its tactics) as the shipped files, all or none
    (calibrate.install): only from a complete run whose out-of-sample verdict is PASS, and only files that pass the
    runtime's readers. The run's cross-machine floor (noise.json) is installed on its own, where it should replace the
    profile's (python -m calibrate noise ... --install): every verdict and fit reads that floor."""
    from bench.autotune_cache import sha256
    from calibrate.baseline import autotune_cache_path, baseline_path
    from calibrate.install import Artifact, baseline_check, install as install_all, shipped_layout, table_check
    from harness.io import parse_json_text, read_input, read_input_text
    manifest_file = run / MANIFEST
    if not manifest_file.is_file():
        raise HarnessError(f"{run} has no {MANIFEST}; run python -m calibrate table first")
    manifest = read_manifest(manifest_file)
    if manifest.get("status") != "complete" or manifest.get("verdict") != "PASS":
        raise HarnessError(f"{run}: status {manifest.get('status')!r}, verdict {manifest.get('verdict')!r}; only a "
                           f"complete run whose out-of-sample check passed is installed")
    if not run_scope(run).is_default():
        raise HarnessError(f"{run} covers {run_scope(run).to_json()}; the shipped table covers every catalog model "
                           f"in both layouts (union). Give the dispatcher {run / 'table.json'} instead "
                           f"(dispatch.configure, or --table)")
    for name in ("table.json", "baseline.json"):
        if not (run / name).is_file():
            raise HarnessError(f"{run} has no {name}; a passing run has both: restore it, or run the legs again with "
                               f"--refit; nothing was installed")
    table, base = shipped_file("table", profile.name), baseline_path(profile.name)
    where = manifest_file.resolve()
    named = {"file": str(where.relative_to(ROOT) if ROOT in where.parents else where), "sha256": sha256(manifest_file)}
    fix = f"restore it from the run's copy, or run the table again (--run-id {run.name} --refit)"

    def edited(src: Path, what: str, edit) -> bytes:
        data = parse_json_text(read_input_text(src, what, fix), str(src), what, fix)
        if not isinstance(data, dict):
            raise HarnessError(f"{what} {src} holds a JSON {type(data).__name__}, not an object; {fix}")
        return (json.dumps(edit(data), indent=2) + "\n").encode()

    def as_table(data: dict) -> dict:  # the tactics beside the shipped table under its shipped name; the manifest
        if not isinstance(data.get("source", {}), dict):
            raise HarnessError(f"{run / 'table.json'}: source is not an object; {fix}")
        data.setdefault("source", {})["manifest"] = named
        if isinstance(data["source"].get("tactics"), dict):
            data["source"]["tactics"]["file"] = autotune_cache_path(table).name
        if isinstance(data["source"].get("gemv_configs"), dict):
            data["source"]["gemv_configs"]["file"] = gemv_file(autotune_cache_path(table)).name
        return data

    def as_baseline(data: dict) -> dict:
        if isinstance(data.get("autotune_cache"), dict):
            data["autotune_cache"]["file"] = autotune_cache_path(base).name
        return data
    artifacts = [Artifact(table, edited(run / "table.json", "the run's table", as_table), "the table",
                          table_check(profile.name, shipped_layout(profile.name))),
                 Artifact(base, edited(run / "baseline.json", "the run's baseline", as_baseline), "the baseline",
                          baseline_check(profile.name))]
    for src, dst, what in ((run / "table.autotune.json", autotune_cache_path(table), "the table's tactics"),
                           (gemv_file(run / "table.autotune.json"), gemv_file(autotune_cache_path(table)),
                            "the table's GEMV configurations"),
                           (gemv_file(autotune_cache_path(run / "baseline.json")), gemv_file(autotune_cache_path(base)),
                            "the baseline's GEMV configurations"),
                           (autotune_cache_path(run / "baseline.json"), autotune_cache_path(base),
                            "the baseline's tactics")):
        if src.is_file():
            artifacts.append(Artifact(dst, read_input(src, what, fix), what))
    return install_all(artifacts)
