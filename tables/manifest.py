"""A table run's folder and its manifest.json: what the run covers (its scope), on how many machines it fits, and
each leg's entry. The manifest is read once, when a TableRun is opened, and kept in memory as the legs finish."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dispatch.profiles import GpuProfile
from harness.errors import HarnessError
from harness.io import atomic_write_text, check_format, read_json_object
from shapes.catalog import model_layers
from shapes.derive import UNION

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# the out-of-sample legs, which run on another machine than the fitted legs (by GPU UUID)
CHECK_LEGS = ("check-sweep", "check-forward")
FIT_LEGS = ("sweep", "forward", "refine")
# The machines whose sweeps the fit takes: the first sweep's and a machine-<i> leg on each other one. A run started
# before machine legs existed fitted one machine's.
FIT_MACHINES = 3
MAX_FIT_MACHINES = 8
_FIX = "restore it from the run's copy, or start another --run-id"
# key -> what its value must be; keys not named here are kept as they are
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "profile": ((str,), "a profile name"), "started": ((str,), "a time"), "harness_sha": ((str, type(None)), "a sha"),
    "legs": ((dict,), "an object of legs"), "fit_machines": ((int,), "an integer"),
    "machines": ((list,), "a list of machines"), "refits": ((list,), "a list of refits"),
    "status": ((str,), "a status"), "verdict": ((str, type(None)), "a verdict"),
    "fitted_on": ((list,), "a list of legs"), "validated_on": ((list,), "a list of legs"),
    "out_of_machine": ((bool, type(None)), "true, false or null"), "scope": ((dict,), "an object"),
}


def read_manifest(path: Path) -> dict:
    """A run's manifest where the run goes on from it (resume, install, filing): each key of the type the legs write
    and fit_machines within 1..MAX_FIT_MACHINES; a damaged one is refused in one line."""
    data = read_json_object(path, "table run manifest", _FIX)
    check_format(data, path, "table run manifest", (MANIFEST_FORMAT,), "continue it with the harness that started it "
                                                                      "(its harness_sha), or start another --run-id")
    for key, (types, what) in _TYPES.items():
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
    names = tuple(m.strip() for m in models.split(",")) if models is not None else None
    if names is not None and (not all(names) or len(set(names)) != len(names)):
        raise HarnessError(f"--model {models!r}: a comma list of distinct catalog models")
    scope = Scope(layout or UNION, names)
    for name in names or (None,):
        model_layers(name, 1, scope.layout)  # an unknown model or layout is refused here
    return scope


class TableRun:
    """One table run: its GPU profile, its folder, and its manifest, read once here (None before the run starts)
    and written back by save()."""

    def __init__(self, profile: GpuProfile, folder: Path):
        self.profile, self.folder = profile, Path(folder)
        self.manifest: dict | None = read_manifest(self.file) if self.file.exists() else None

    @property
    def file(self) -> Path:
        return self.folder / MANIFEST

    @property
    def scope(self) -> Scope:
        """What the manifest records: the default for a run not started, vLLM's layout for a run made before the
        manifest recorded one."""
        if self.manifest is None:
            return Scope()
        data = self.manifest.get("scope") or {}
        models = data.get("models")
        return Scope(str(data.get("layout") or "vllm"), tuple(models) if models else None)

    @property
    def machines(self) -> int:
        """The fitting machines the manifest records (FIT_MACHINES for a run not started yet)."""
        return FIT_MACHINES if self.manifest is None else int(self.manifest.get("fit_machines") or 1)

    def done(self, leg: str) -> bool:
        return ((self.manifest or {}).get("legs", {}).get(leg) or {}).get("status") == "done"

    def save(self) -> None:
        atomic_write_text(self.file, json.dumps(self.manifest, indent=1) + "\n")


def machine_legs(machines: int) -> list[str]:
    return [f"machine-{i}" for i in range(2, machines + 1)]


def other_machine_legs(manifest: dict) -> list[str]:
    """The machine-<i> legs a run's manifest has an entry for."""
    return [name for name in manifest.get("legs", {}) if name.startswith("machine-")]


def fitted_legs(manifest: dict) -> list[str]:
    """The legs that measured what the fit takes: the first machine's and every other fitting machine's."""
    return [*FIT_LEGS, *other_machine_legs(manifest)]
