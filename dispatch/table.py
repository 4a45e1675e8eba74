"""Dispatch tables, dispatch/thresholds/<profile>.json: per regime and weight shape, M ranges -> path.

Two regimes, because what a call costs depends on how it runs:
- graph: the call is being captured into a CUDA graph (vLLM's decode and small prefill steps): only GPU time counts;
- eager: the call runs as issued (above vLLM's capture size, enforce_eager, any eager user): host and GPU time count.

Tables written before the format lost its third regime may carry `idle` ranges: they are read and left out (the
eager ranges apply), which is what the dispatcher runs for them now (docs/design.md: why there is no idle regime).

A regime's ranges are ((up_to, path), ...) with up_to increasing: M up to `up_to` (and above the previous range's)
runs `path`; M above the last range runs F.linear. Paths are registry names: 'aten', 'flashinfer-lean:<backend>'
(the lean call), 'flashinfer:<backend>' (FlashInfer's public mm_bf16) or 'triton:gemv' (the project's GEMV, M <= 16,
its configurations in the file source["gemv_configs"] names beside the table).

Format 1 files (a single `default_threshold` with per-shape `overrides`, the low-M backend at M <= threshold) still
load: both regimes get the same ranges, on FlashInfer's public call, which is what such a table meant when written.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dispatch.backends import ATEN, BACKENDS, GEMV, GEMV_MAX_M, LOW_M_BACKENDS, flashinfer_path, lean_path
from dispatch.gemv import parse
from dispatch.profiles import PROFILES, get_profile
from harness.errors import HarnessError
from harness.io import check_format, is_count, read_json, read_json_object, sha256
from harness.shipped import missing_line, shipped_file
from shapes.grid import M_MAX

FORMATS = (1, 2)  # 1: a single threshold with per-shape overrides (no format key); 2: per-regime ranges
REGIMES = ("graph", "eager")
Range = tuple[int, str]
Ranges = tuple[Range, ...]


def dispatchable_paths() -> list[str]:
    """Every path a table may name: F.linear, each FlashInfer backend's public and lean call, and the GEMV."""
    return [ATEN, *(f(b) for b in BACKENDS for f in (lean_path, flashinfer_path)), GEMV]


@dataclass(frozen=True)
class ThresholdTable:
    profile: str
    low_m_backend: str
    default: dict[str, Ranges]  # regime -> ranges, for shapes without their own
    shapes: dict[tuple[int, int], dict[str, Ranges]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    # FlashInfer's autotuner cache the table was fitted with (source["tactics"]["file"], beside the table file): the
    # dispatcher loads it, so that its cuBLASLt calls run the tactics that were measured.
    tactics: Path | None = None
    # the GEMV's configurations the table was fitted with (source["gemv_configs"]["file"]), loaded alike
    gemv_configs: Path | None = None

    @classmethod
    def from_thresholds(cls, profile: str, backend: str, default_threshold: int,
                        overrides: dict[tuple[int, int], int] | None = None, source: dict[str, Any] | None = None,
                        path: str | None = None) -> "ThresholdTable":
        """The low-M path at M <= threshold in both regimes (a format 1 table, the seed PR's rule)."""
        path = path or lean_path(backend)

        def both(t: int) -> dict[str, Ranges]:
            return {r: ((t, path),) if t > 0 else () for r in REGIMES}
        return cls(profile, backend, both(default_threshold),
                   {s: both(t) for s, t in (overrides or {}).items()}, dict(source or {}))

    def ranges(self, n: int, k: int, regime: str) -> Ranges:
        own = self.shapes.get((n, k))
        own = own if own is not None else self.default
        return own[regime]

    def choose(self, n: int, k: int, m: int, regime: str = "graph") -> str:
        """The path name the dispatcher runs for this cell in this regime (eligibility aside)."""
        for up_to, path in self.ranges(n, k, regime):
            if m <= up_to:
                return path
        return ATEN

    def threshold(self, n: int, k: int, regime: str | None = None) -> int:
        """The largest M at which the shape runs anything but F.linear (in a regime, or in either)."""
        regimes = REGIMES if regime is None else (regime,)
        return max((up for r in regimes for up, p in self.ranges(n, k, r) if p != ATEN), default=0)

    def paths(self) -> set[str]:
        every = [*self.default.values(), *(rs for own in self.shapes.values() for rs in own.values())]
        return {p for ranges in every for _, p in ranges}

    def restricted_to(self, paths: set[str]) -> ThresholdTable:
        """The table with every range of a path outside `paths` running F.linear (neighbouring F.linear ranges
        merged)."""
        def keep(ranges: Ranges) -> Ranges:
            out: list[Range] = []
            for up, path in ranges:
                path = path if path in paths else ATEN
                if out and out[-1][1] == path:
                    out[-1] = (up, path)
                else:
                    out.append((up, path))
            return tuple(out)
        return replace(self, default={r: keep(v) for r, v in self.default.items()},
                       shapes={s: {r: keep(v) for r, v in own.items()} for s, own in self.shapes.items()})

    def deterministic(self) -> ThresholdTable:
        """The table choosing only among the paths its fitted run measured repeatable in every cell (source
        .determinism), F.linear elsewhere; one HarnessError where it records no such measurement."""
        data = self.source.get("determinism")
        if not isinstance(data, dict) or not data:
            raise HarnessError(f"deterministic mode: the {self.profile} table records no determinism measurements "
                               f"(it was fitted before bench run measured them); refit it (make table), or leave "
                               f"deterministic mode off")
        return self.restricted_to({p for p, d in data.items() if isinstance(d, dict) and d.get("repeatable") is True}
                                  | {ATEN})

    def low_m_path(self) -> str:
        """The low-M backend's path as this table names it (lean unless the table names only the public call)."""
        public = flashinfer_path(self.low_m_backend)
        return public if public in self.paths() and lean_path(self.low_m_backend) not in self.paths() \
            else lean_path(self.low_m_backend)

    def describe(self, regime: str) -> str:
        return describe_ranges(self.default[regime])

    def to_json(self) -> dict[str, Any]:
        def enc(ranges: Ranges) -> list[dict[str, Any]]:
            return [{"up_to": up, "path": p} for up, p in ranges]

        def regimes(own: dict[str, Ranges]) -> dict[str, Any]:
            return {r: enc(own[r]) for r in REGIMES}
        return {"format": 2, "profile": self.profile, "low_m_backend": self.low_m_backend,
                "default": regimes(self.default),
                "shapes": [{"n": n, "k": k, **regimes(own)} for (n, k), own in sorted(self.shapes.items())],
                "source": self.source}


def describe_ranges(ranges: Ranges) -> str:
    """'flashinfer-lean:tinygemm at M <= 8, aten above' and the like."""
    parts, lo = [], 1
    for up, p in ranges:
        parts.append(f"{p} at M {lo}..{up}" if lo > 1 else f"{p} at M <= {up}")
        lo = up + 1
    return ", ".join(parts + [f"{ATEN} above" if parts else f"{ATEN} everywhere"])


def compress(choices: list[tuple[int, str]]) -> Ranges:
    """Ranges from per-M choices [(m, path)] sorted by M: a range ends at the last M of a run of equal choices, so an
    M between two measured values takes the larger one's choice (F.linear, where the run of FlashInfer ends)."""
    out: list[Range] = []
    for m, p in choices:
        if out and out[-1][1] == p:
            out[-1] = (m, p)
        else:
            out.append((m, p))
    while out and out[-1][1] == ATEN:
        out.pop()
    return tuple(out)


def _parse_ranges(value: Any, where: str) -> Ranges:
    if not isinstance(value, list):
        raise HarnessError(f"{where}: a regime's ranges are a list of {{up_to, path}}")
    known = dispatchable_paths()
    out: list[Range] = []
    for item in value:
        try:
            up, path = item["up_to"], item["path"]
        except (KeyError, TypeError) as exc:
            raise HarnessError(f"{where}: malformed range ({exc}); each range is {{up_to, path}}") from None
        if not isinstance(up, int) or isinstance(up, bool) or not isinstance(path, str):
            raise HarnessError(f"{where}: up_to {up!r} and path {path!r}: up_to must be an integer and path a name; "
                               f"fix the table or refit it")
        if path not in known:
            raise HarnessError(f"{where}: path {path!r} is not one the dispatcher can run (known: {', '.join(known)})")
        if not 1 <= up <= M_MAX:
            raise HarnessError(f"{where}: up_to {up} is outside 1..{M_MAX}, the M the harness measures")
        if path == GEMV and up > GEMV_MAX_M:
            raise HarnessError(f"{where}: {GEMV} up to M = {up}, but it takes M <= {GEMV_MAX_M}; fix the table or "
                               f"refit it")
        if out and up <= out[-1][0]:
            raise HarnessError(f"{where}: ranges must have increasing up_to ({out[-1][0]} then {up})")
        out.append((up, path))
    return tuple(out)


def _parse_regimes(data: dict, where: str) -> dict[str, Ranges]:
    missing = [r for r in REGIMES if r not in data]
    if missing:
        raise HarnessError(f"{where}: lacks the {', '.join(missing)} regime (a format 2 table names both)")
    if "idle" in data:  # a table from before the format dropped its idle regime: checked, then left out
        _parse_ranges(data["idle"], f"{where} idle")
    return {r: _parse_ranges(data[r], f"{where} {r}") for r in REGIMES}


def _parse_format1(data: dict, where: str) -> tuple[dict[str, Ranges], dict[tuple[int, int], dict[str, Ranges]]]:
    listed = data.get("overrides", [])
    fields = [(o.get("n"), o.get("k"), o.get("threshold")) if isinstance(o, dict) else () for o in
              (listed if isinstance(listed, list) else [None])]
    if not all(len(f) == 3 and is_count(f[0]) and is_count(f[1]) and is_count(f[2], None) for f in fields) \
            or not is_count(data.get("default_threshold"), None):
        raise HarnessError(f"{where}: malformed threshold or override; each override is {{n, k, threshold}} of "
                           f"integers (n, k positive)")
    overrides = {(n, k): t for n, k, t in fields}
    if len(overrides) != len(fields):
        raise HarnessError(f"{where}: an override lists one shape twice; one override a shape")
    default = data["default_threshold"]
    if default < 0 or any(t < 0 for t in overrides.values()):
        raise HarnessError(f"{where}: thresholds must be >= 0 (0 means never FlashInfer)")
    if any(t > M_MAX for t in (default, *overrides.values())):
        raise HarnessError(f"{where}: thresholds must be <= {M_MAX}, the largest M the harness measures")
    t = ThresholdTable.from_thresholds("", data["low_m_backend"], default, overrides,
                                       path=flashinfer_path(data["low_m_backend"]))
    return t.default, t.shapes


def parse_table(data: Any, where: str) -> ThresholdTable:
    if not isinstance(data, dict):
        raise HarnessError(f"{where}: a threshold table is a JSON object")
    v2 = check_format(data, where, "threshold table", FORMATS, "refit it with python -m calibrate fit") == 2
    need = ("profile", "low_m_backend", "default") if v2 else ("profile", "low_m_backend", "default_threshold")
    missing = [f for f in need if f not in data]
    if missing:
        raise HarnessError(f"{where}: threshold table lacks {', '.join(missing)}")
    backend = data["low_m_backend"]
    known = known_low_m_backends()
    if backend not in known:
        raise HarnessError(f"{where}: low_m_backend {backend!r} is not a FlashInfer backend of the path registry "
                           f"(known: {', '.join(known)}); fix the table or refit it with python -m calibrate fit")
    if v2:
        if not isinstance(data["default"], dict):
            raise HarnessError(f"{where}: default is an object of regimes ({', '.join(REGIMES)})")
        default = _parse_regimes(data["default"], f"{where} default")
        shapes = {}
        if not isinstance(data.get("shapes", []), list):
            raise HarnessError(f"{where}: shapes must be a list of {{n, k, graph, eager}} entries")
        for i, own in enumerate(data.get("shapes", [])):
            if not isinstance(own, dict) or not (is_count(own.get("n")) and is_count(own.get("k"))):
                n, k = (own.get("n"), own.get("k")) if isinstance(own, dict) else (None, None)
                raise HarnessError(f"{where}: shape entry {i} needs positive integers n and k (has {n!r:.20} and "
                                   f"{k!r:.20}); fix the table or refit it")
            key = (own["n"], own["k"])
            if key in shapes:
                raise HarnessError(f"{where}: shape {key[0]}x{key[1]} is listed twice (entry {i}); one entry a shape")
            shapes[key] = _parse_regimes(own, f"{where} shape {key[0]}x{key[1]}")
    else:
        default, shapes = _parse_format1(data, where)
    expected = PROFILES[data["profile"]].low_m_backend if data["profile"] in PROFILES else None
    if expected is not None and backend != expected:
        raise HarnessError(f"{where}: low_m_backend {backend!r} is not the {data['profile']} profile's "
                           f"({expected!r}); fix the table or refit it")
    source = data.get("source", {})
    if not isinstance(source, dict):
        raise HarnessError(f"{where}: source must be an object (where the table came from)")
    return ThresholdTable(str(data["profile"]), backend, default, shapes, source)


def known_low_m_backends() -> list[str]:
    return list(LOW_M_BACKENDS)


def _names_a_file(value: Any) -> bool:
    """Whether load_table's first argument names a table file rather than a GPU profile: a Path, or text that is no
    profile's name and looks like a file (a folder in it, .json at its end, or an existing file)."""
    if isinstance(value, Path):
        return True
    text = str(value)
    if text in PROFILES:
        if Path(text).is_file():
            import warnings
            warnings.warn(f"load_table({text!r}) took the {text} profile's shipped table, not the file {text!r}; "
                          f"pass path={text!r} (or ./{text}) for the file", stacklevel=3)
        return False
    return "/" in text or "\\" in text or text.endswith(".json") or Path(text).is_file()


def load_table(profile: str | Path | None = None, path: str | Path | None = None) -> ThresholdTable:
    """A table: the shipped one of a GPU profile (load_table("h200")), or a file (load_table("my/table.json"),
    load_table(Path(...)) or path=...)."""
    if path is None and profile is not None and _names_a_file(profile):
        profile, path = None, profile
    shipped = path is None
    if shipped:
        if profile is None:
            raise HarnessError("name a GPU profile or a threshold file")
        path = shipped_file("table", str(profile))
    data = read_json(path, "threshold table", "run `python -m calibrate fit RESULTS --gpu PROFILE` to make one")
    table = parse_table(data, str(path))
    if shipped and table.profile != str(profile):
        raise HarnessError(f"{path} is the {table.profile} profile's table, not the {profile} profile's; restore the "
                           f"shipped file (reinstall, or git checkout) or pass the table by path")
    for key, field_name in (("tactics", "tactics"), ("gemv_configs", "gemv_configs")):
        spec = table.source.get(key)
        if isinstance(spec, dict) and spec.get("file"):
            table = replace(table, **{field_name: Path(path).parent / str(spec["file"])})
    return table


def check_files(table: ThresholdTable) -> None:
    """The files a table names beside it (its FlashInfer tactics, the GEMV's configurations) are there, are the ones
    it was fitted with (sha256) and read; a table that runs the GEMV names its configurations. One HarnessError
    naming the file and the fix otherwise: a table never serves other choices than it was fitted with."""
    fix = "restore the table's files together (reinstall the package, or git checkout its folder) or refit the table"
    for key, path, what in (("tactics", table.tactics, "FlashInfer tactics"),
                            ("gemv_configs", table.gemv_configs, "GEMV configurations")):
        spec = table.source.get(key)
        if path is None:
            continue
        if not path.is_file():
            raise HarnessError(f"the {table.profile} table names its {what} {path}, which is missing; {fix}")
        want = spec.get("sha256") if isinstance(spec, dict) else None
        if want and sha256(path) != want:
            raise HarnessError(f"{path} is not the {what} file the {table.profile} table was fitted with (sha256 "
                               f"differs); {fix}")
        data = read_json_object(path, what, fix)
        if key == "gemv_configs":
            parse(data, str(path))
    if GEMV in table.paths() and table.gemv_configs is None:
        raise HarnessError(f"the {table.profile} table runs {GEMV} in some ranges but names no GEMV configurations "
                           f"(source.gemv_configs); refit the table with the GEMV measured")


def shipped_table(profile: str) -> ThresholdTable | None:
    """The shipped table of a GPU profile with its files checked (check_files); None where the profile ships none.
    A table the profile ships and this installation lacks, or one that does not load, is one HarnessError."""
    path = shipped_file("table", profile)
    if not path.exists() and not path.is_symlink():
        if "table" in get_profile(profile).ships:
            raise HarnessError(missing_line("table", profile))
        return None
    table = load_table(profile)
    check_files(table)
    return table
