"""Stored per-GPU ratios (calibrate/baselines/<profile>.json) and the comparison of fresh measurements against them.

A baseline holds, per catalog shape x regression M, the FlashInfer/aten GPU-time ratio (cuBLASLt and the low-M
backend) with its interval, the host-time ratio, the kernel names and the sample counts: everything a dispatch
decision rests on. It is keyed by an environment fingerprint; a fresh run on another fingerprint is not compared.
Built from one run or several runs of one fingerprint: then the stored interval is the envelope of the runs'
intervals, so that it holds what a fresh process sees. When every run served the same FlashInfer tactics (one
autotuner cache, bench/autotune_cache.py), that file is kept beside the baseline (`<profile>.autotune.json`) and a
regression run serves the same tactics; otherwise a regression run tunes afresh, and the autotuner's per-process picks
(another cuBLASLt algorithm in a fresh process, seen on the H200) land in the comparison. One cell per line.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from bench.autotune_cache import FILE_NAME, gemv_file, read_entries, sha256
from bench.results import expected_cells
from calibrate.analysis import Cells
from calibrate.install import Artifact, gemv_check, write_outputs
from dispatch.backends import ATEN
from harness.errors import HarnessError
from harness.io import is_count, read_json_object
from harness.shipped import shipped_file

REGRESSION_MS = (1, 8, 32, 64, 256, 1031, 4096, 16384)
FINGERPRINT_KEYS = ("gpu_name", "sm", "driver_major", "torch", "cublas", "flashinfer", "pdl")
DEFAULT_TOLERANCE = 0.05  # GPU-time ratio band, relative to the stored ratio
DEFAULT_HOST_TOLERANCE = 1.0  # host ratio within a factor 2: run-to-run host medians on one H200 host moved 0.4-1.75x (5-95%)
FORMAT = 4  # 3: the autotuner cache the runs served; 4: paired ratios


@dataclass(frozen=True)
class BaselineCell:
    shape: str
    n: int
    k: int
    m: int
    path: str  # the FlashInfer path; the ratio is its time over aten's
    gpu_ratio: float  # median over runs of the paired ratio median(FlashInfer_i / aten_i) of side-by-side replays
    gpu_ratio_lo: float  # lowest bootstrap bound over runs
    gpu_ratio_hi: float
    host_ratio: float
    host_ratio_lo: float
    host_ratio_hi: float
    kernels: str  # the FlashInfer kernels per call; variants seen in different runs joined by " | "
    aten_kernels: str
    samples: int  # graph replays, summed over runs
    aten_samples: int
    runs: int = 1

    @property
    def key(self) -> tuple[int, int, int, str]:
        return self.n, self.k, self.m, self.path


@dataclass(frozen=True)
class CellCheck:
    cell: BaselineCell
    fresh: BaselineCell | None
    status: str  # "ok", "FAIL", "missing" or "skipped"
    message: str
    kernel_changed: bool = False
    band: tuple[float, float] | None = None  # the stored GPU-ratio interval widened by the tolerance

    @property
    def verdict(self) -> str:
        """The fresh GPU ratio against the stored band, in calibrate compare's classes (docs/compare.md): SAME (its
        interval inside the band), SLOWER or FASTER (wholly above or below it: the check fails), AMBIGUOUS (across
        an edge: the check passes, the runs cannot tell); a cell without a fresh measurement keeps its status."""
        if self.fresh is None or self.band is None:
            return self.status
        lo, hi = self.band
        if self.fresh.gpu_ratio_lo > hi:
            return "SLOWER"
        if self.fresh.gpu_ratio_hi < lo:
            return "FASTER"
        return "SAME" if lo <= self.fresh.gpu_ratio_lo and self.fresh.gpu_ratio_hi <= hi else "AMBIGUOUS"


def baseline_path(profile: str) -> Path:
    return shipped_file("baseline", profile)


def autotune_cache_path(baseline_file: Path) -> Path:
    """Where a baseline keeps the FlashInfer tactics its runs served: calibrate/baselines/<profile>.autotune.json."""
    return baseline_file.with_suffix(".autotune.json")


def shared_tactics(sources: list[str]) -> Path | None:
    """The autotuner cache every run in `sources` served, when they all served the same one (by content)."""
    files = [Path(s) / FILE_NAME for s in sources]
    if not all(f.is_file() for f in files):
        return None
    gemv = [gemv_file(f) for f in files]  # the GEMV's configurations beside them: the same in all, or in none
    same_gemv = (not any(g.is_file() for g in gemv)
                 or (all(g.is_file() for g in gemv) and _one_content([gemv_configs(g) for g in gemv])))
    return files[0] if len({sha256(f) for f in files}) == 1 and same_gemv else None


def _one_content(configs: list[dict | None]) -> bool:
    return configs[0] is not None and all(c == configs[0] for c in configs)


def gemv_configs(path: Path) -> dict | None:
    """A GEMV configuration file's configurations, compared by content: a run that serves a file saves it in the
    harness's current format, so the same configurations may differ byte for byte. None where it does not read."""
    from dispatch import gemv
    try:
        return gemv.read(path)
    except HarnessError:
        return None


def fingerprint_of(run_info: dict[str, Any]) -> dict[str, Any]:
    """The environment keys a baseline holds; `pdl` (the run's setting; runs before it was recorded ran without)
    changes TinyGEMM's and CuTe DSL's kernels and timing, so a baseline is tied to it too."""
    fp = run_info.get("fingerprint") or {}
    out = {k: fp.get(k) for k in FINGERPRINT_KEYS if k != "pdl"}
    out["pdl"] = bool(run_info.get("pdl", fp.get("pdl", False)))
    return out


def fingerprint_mismatch(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'key: stored -> current' for every fingerprint key that differs."""
    def get(d: dict[str, Any], k: str) -> Any:
        return bool(d.get(k)) if k == "pdl" else d.get(k)  # baselines before the key ran without pdl
    return [f"{k}: {get(stored, k)!r} -> {get(current, k)!r}" for k in FINGERPRINT_KEYS if get(stored, k) != get(current, k)]


def cells_from_results(df: pd.DataFrame, flashinfer_paths: list[str]) -> list[BaselineCell]:
    """A cell per (shape, M, FlashInfer path) where both the path and aten measured ok."""
    cells = Cells.from_results(df)
    out = []
    for (n, k, m, path) in cells.samples:
        if path not in flashinfer_paths or not cells.has(n, k, m, ATEN):
            continue
        fi, at = cells.samples[(n, k, m, path)], cells.samples[(n, k, m, ATEN)]
        ratio, lo, hi = cells.ratio_ci(n, k, m, path, ATEN)  # paired where timed side by side
        row, arow = cells.df.loc[(n, k, m, path)], cells.df.loc[(n, k, m, ATEN)]
        host = cells.host(n, k, m, path) / cells.host(n, k, m, ATEN)
        host = round(host, 4) if math.isfinite(host) else float("nan")
        out.append(BaselineCell(str(row["shape"]), n, k, m, path, round(ratio, 5), round(lo, 5), round(hi, 5),
                                host, host, host, _names(row["kernels"]), _names(arow["kernels"]), len(fi), len(at)))
    return sorted(out, key=lambda c: (c.n, c.k, c.path, c.m))


def merge_runs(runs: list[list[BaselineCell]]) -> list[BaselineCell]:
    """One cell per key over several runs: median ratios, the envelope of the intervals, every kernel variant."""
    by_key: dict[tuple, list[BaselineCell]] = {}
    for cells in runs:
        for c in cells:
            by_key.setdefault(c.key, []).append(c)
    out = []
    for group in by_key.values():
        hosts = [c.host_ratio for c in group if math.isfinite(c.host_ratio)]
        host_lo = [c.host_ratio_lo for c in group if math.isfinite(c.host_ratio_lo)]
        host_hi = [c.host_ratio_hi for c in group if math.isfinite(c.host_ratio_hi)]
        out.append(BaselineCell(
            group[0].shape, *group[0].key[:3], group[0].path,
            round(float(pd.Series([c.gpu_ratio for c in group]).median()), 5),
            min(c.gpu_ratio_lo for c in group), max(c.gpu_ratio_hi for c in group),
            round(float(pd.Series(hosts).median()), 4) if hosts else float("nan"),
            min(host_lo) if host_lo else float("nan"), max(host_hi) if host_hi else float("nan"),
            _variants(c.kernels for c in group), _variants(c.aten_kernels for c in group),
            sum(c.samples for c in group), sum(c.aten_samples for c in group), sum(c.runs for c in group)))
    return sorted(out, key=lambda c: (c.n, c.k, c.path, c.m))


def _variants(names) -> str:
    return " | ".join(sorted({v for n in names for v in n.split(" | ") if v}))


def _names(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def baseline_text(profile: str, runs: list[tuple[str, dict[str, Any]]], cells: list[BaselineCell],
                  tactics: dict[str, str] | None = None, tolerance: float = DEFAULT_TOLERANCE,
                  host_tolerance: float = DEFAULT_HOST_TOLERANCE) -> str:
    """runs: (results folder, run.json) of every run the cells came from; they must share one fingerprint.
    tactics: {"file": name beside the baseline, "sha256": ...} of the autotuner cache all runs served, or None."""
    fps = [fingerprint_of(info) for _, info in runs]
    for (src, _), fp in zip(runs[1:], fps[1:]):
        if fp != fps[0]:
            raise HarnessError(f"{src} has another fingerprint than {runs[0][0]} "
                               f"({'; '.join(fingerprint_mismatch(fps[0], fp))}); one baseline holds one environment")
    head = {
        "format": FORMAT, "profile": profile, "fingerprint": fps[0], "autotune_cache": tactics,
        "tolerance": tolerance, "host_tolerance": host_tolerance,
        "sources": [{"results": src, "command": info.get("command"), "started": info.get("started"),
                     "harness_sha": (info.get("fingerprint") or {}).get("harness_sha")} for src, info in runs],
        "full_fingerprint": runs[0][1].get("fingerprint"),
    }
    lines = json.dumps(head, indent=1, sort_keys=True)[:-2]  # reopen the object to append the cells
    body = ",\n".join("  " + json.dumps(_cell_json(c), allow_nan=False) for c in cells)
    return f'{lines},\n "cells": [\n{body}\n ]\n}}\n'


def _cell_json(cell: BaselineCell) -> dict[str, Any]:
    """A cell as standard JSON: a host ratio that was not measured is null, never NaN."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(cell).items()}


BAND_SPAN = 5.0  # a stored band lies within ratio / BAND_SPAN .. ratio * BAND_SPAN
_GPU_RATIOS = ("gpu_ratio", "gpu_ratio_lo", "gpu_ratio_hi")
_HOST_RATIOS = ("host_ratio", "host_ratio_lo", "host_ratio_hi")
_COUNTS = ("n", "k", "m", "samples", "aten_samples", "runs")


def cell_from_json(data: Any) -> BaselineCell:
    """A stored cell, type-checked: positive finite GPU ratios with lo <= ratio <= hi, host ratios finite or null,
    positive integer counts, text kernel names. Raises ValueError naming the field."""
    if not isinstance(data, dict):
        raise ValueError("a cell is not an object")
    cell = dict(data)
    for key in _COUNTS:
        v = cell.get(key, 1 if key == "runs" else None)
        if not is_count(v):
            raise ValueError(f"cell {cell.get('shape')} M={cell.get('m')}: {key} = {v!r} is not a positive integer")
    for key in _GPU_RATIOS + _HOST_RATIOS:
        v = cell.get(key)
        if v is None and key in _HOST_RATIOS:
            cell[key] = float("nan")
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"cell {cell.get('shape')} M={cell.get('m')}: {key} = {v!r} is not a positive number")
        cell[key] = float(v)
    for kind in ("gpu", "host"):
        ratio, lo, hi = (cell[f"{kind}_ratio{end}"] for end in ("", "_lo", "_hi"))
        if math.isnan(ratio):
            continue
        if not lo <= ratio <= hi:
            raise ValueError(f"cell {cell.get('shape')} M={cell.get('m')}: {kind}_ratio lies outside "
                             f"[{kind}_ratio_lo, {kind}_ratio_hi]")
        if lo < ratio / BAND_SPAN or hi > ratio * BAND_SPAN:
            raise ValueError(f"cell {cell.get('shape')} M={cell.get('m')}: the {kind} band [{lo:g}, {hi:g}] reaches "
                             f"beyond {1 / BAND_SPAN:g}x..{BAND_SPAN:g}x its ratio {ratio:g}, wider than any "
                             f"run-to-run spread: such a band can fail nothing")
    for key in ("shape", "path", "kernels", "aten_kernels"):
        if not isinstance(cell.get(key), str):
            raise ValueError(f"cell {cell.get('shape')} M={cell.get('m')}: {key} is not text")
    return BaselineCell(**cell)


def baseline_check(profile: str) -> Callable[[Path], None]:
    """The installer's check of a staged baseline: it loads, is this profile's, and its tactics are beside it."""
    def check(path: Path) -> None:
        base = load_baseline(path)
        if base.profile != profile:
            raise HarnessError(f"it is a baseline of the {base.profile!r} profile, not {profile!r}")
        base.tactics_file()  # present beside it with the recorded hash
    return check


def write_baseline(path: Path, text: str, tactics: Path | None = None, check=None) -> Path:
    """The baseline, and the tactics its runs served beside it (autotune_cache_path), both or neither (a shipped
    baseline through the installer, which reads it back with `check`)."""
    json.loads(text)  # never write a file that cannot be read back
    gemv = gemv_file(Path(tactics)) if tactics else None
    write_outputs([*([Artifact(autotune_cache_path(path), Path(tactics).read_bytes(), "the baseline's tactics",
                               read_entries)] if tactics else []),
                   *([Artifact(gemv_file(autotune_cache_path(path)), gemv.read_bytes(),
                               "the baseline's GEMV configurations", gemv_check)]
                     if gemv is not None and gemv.is_file() else []),
                   Artifact(path, text.encode(), "the baseline", check)])
    return path


@dataclass
class Baseline:
    profile: str
    fingerprint: dict[str, Any]
    tolerance: float
    host_tolerance: float
    cells: list[BaselineCell]
    sources: list[dict[str, Any]]
    full_fingerprint: dict[str, Any]
    autotune_cache: dict[str, str] | None = None  # {"file", "sha256"}: the tactics to serve; None: tune afresh
    path: Path | None = None

    def tactics_file(self) -> Path | None:
        """The pinned tactics beside the baseline, checked by hash; None when the baseline's runs were tuned apiece."""
        if not self.autotune_cache:
            return None
        f = (self.path or baseline_path(self.profile)).parent / self.autotune_cache["file"]
        if not f.is_file():
            raise HarnessError(f"the baseline's autotuner cache {f} is missing; restore it or regenerate both "
                               f"with make baseline GPU={self.profile}")
        if sha256(f) != self.autotune_cache["sha256"]:
            raise HarnessError(f"{f} is not the autotuner cache the baseline was measured with (sha256 differs); "
                               f"restore it or regenerate both with make baseline GPU={self.profile}")
        return f


def load_baseline(path: Path) -> Baseline:
    if not Path(path).exists():
        raise HarnessError(f"no baseline at {path}; create one with make baseline GPU=<profile> on that GPU")
    data = read_json_object(path, "baseline", "regenerate it with make baseline GPU=<profile>")
    try:
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        if not isinstance(data["cells"], list) or not data["cells"]:
            raise ValueError("cells must be a non-empty list")
        cells = [cell_from_json(c) for c in data["cells"]]
        if len({c.key for c in cells}) != len(cells):
            raise ValueError("a cell is stored twice")
        for key, hi in (("tolerance", 1.0), ("host_tolerance", 10.0)):
            v = data[key]
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= hi:
                raise ValueError(f"{key} = {v!r} is not a number in 0..{hi:g}")
        tactics = data["autotune_cache"]
        if tactics is not None and not (isinstance(tactics.get("file"), str) and isinstance(tactics.get("sha256"), str)):
            raise ValueError("autotune_cache must be null or {file, sha256}")
        return Baseline(str(data["profile"]), dict(data["fingerprint"]), float(data["tolerance"]),
                        float(data["host_tolerance"]), cells, list(data["sources"]), dict(data["full_fingerprint"]),
                        tactics, Path(path))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HarnessError(f"baseline {path} is malformed ({type(exc).__name__}: {exc}); "
                           f"regenerate it with make baseline GPU=<profile>") from None


def check_cell(stored: BaselineCell, fresh: BaselineCell | None, tolerance: float, host_tolerance: float) -> CellCheck:
    """FAIL when the fresh GPU-ratio interval lies wholly outside the stored interval widened by `tolerance`
    ([lo x (1 - tol), hi x (1 + tol)]), or the fresh host ratio outside [lo / (1 + htol), hi x (1 + htol)].
    Kernels never seen in the baseline's runs only warn."""
    if fresh is None:
        return CellCheck(stored, None, "missing", "not measured in the fresh run")
    lo_band, hi_band = stored.gpu_ratio_lo * (1 - tolerance), stored.gpu_ratio_hi * (1 + tolerance)
    problems = []
    if fresh.gpu_ratio_hi < lo_band or fresh.gpu_ratio_lo > hi_band:
        problems.append(f"GPU ratio {fresh.gpu_ratio:.3f} [{fresh.gpu_ratio_lo:.3f}, {fresh.gpu_ratio_hi:.3f}] "
                        f"outside stored [{stored.gpu_ratio_lo:.3f}, {stored.gpu_ratio_hi:.3f}] +-{tolerance:.0%} "
                        f"= [{lo_band:.3f}, {hi_band:.3f}]")
    if math.isfinite(stored.host_ratio_lo) and math.isfinite(fresh.host_ratio):
        h_lo, h_hi = stored.host_ratio_lo / (1 + host_tolerance), stored.host_ratio_hi * (1 + host_tolerance)
        if not h_lo <= fresh.host_ratio <= h_hi:
            problems.append(f"host ratio {fresh.host_ratio:.2f} outside [{h_lo:.2f}, {h_hi:.2f}] "
                            f"(stored {stored.host_ratio:.2f})")
    changed = not (set(fresh.kernels.split(" | ")) <= set(stored.kernels.split(" | "))
                   and set(fresh.aten_kernels.split(" | ")) <= set(stored.aten_kernels.split(" | ")))
    if problems:
        return CellCheck(stored, fresh, "FAIL", "; ".join(problems), changed, (lo_band, hi_band))
    return CellCheck(stored, fresh, "ok", f"GPU ratio {fresh.gpu_ratio:.3f} (stored {stored.gpu_ratio:.3f})", changed,
                     (lo_band, hi_band))


def compare(baseline: Baseline, fresh: list[BaselineCell], tolerance: float | None = None,
            host_tolerance: float | None = None, not_judged: dict[tuple, str] | None = None) -> list[CellCheck]:
    """Each stored cell against its fresh one. `not_judged`: cells a user's run left out on purpose (key -> why),
    which get status "skipped" where the run has no fresh cell, never "missing"."""
    by_key = {c.key: c for c in fresh}
    tol = baseline.tolerance if tolerance is None else tolerance
    htol = baseline.host_tolerance if host_tolerance is None else host_tolerance
    out = []
    for c in baseline.cells:
        why = (not_judged or {}).get(c.key)
        out.append(CellCheck(c, None, "skipped", why) if why and c.key not in by_key
                   else check_cell(c, by_key.get(c.key), tol, htol))
    return out


def left_out(baseline: Baseline, df: pd.DataFrame, info: dict[str, Any]) -> dict[tuple, str]:
    """The baseline cells a measured run did not judge on purpose: skipped with a recorded reason (the path's or
    F.linear's row), or outside the run's grid. A cell of the grid with no row is not here: that is missing data."""
    rows = {(int(n), int(k), int(m), str(p)): (str(st), str(r))
            for n, k, m, p, st, r in zip(df["n"], df["k"], df["m"], df["path"], df["status"],
                                         df["reason"] if "reason" in df.columns else [""] * len(df))}
    grid = expected_cells(info)
    out = {}
    for c in baseline.cells:
        for path in (c.path, ATEN):
            status, reason = rows.get((c.n, c.k, c.m, path), ("", ""))
            if status == "skipped" and reason.strip():
                out[c.key] = f"{path} skipped by the run: {reason}"
                break
        else:
            if grid is not None and (c.shape, c.m, c.path) not in grid:
                out[c.key] = "not in the run's grid"
    return out


def describe(check: CellCheck) -> str:
    c = check.cell
    return f"{c.shape} M={c.m} {c.path}: {check.message}"


def kernel_change(check: CellCheck) -> str:
    c, f = check.cell, check.fresh
    return (f"{c.shape} M={c.m} {c.path}: kernels changed: FlashInfer {c.kernels!r} -> {f.kernels!r}; "
            f"aten {c.aten_kernels!r} -> {f.aten_kernels!r}") if f else ""
