"""Run-to-run noise of GPU-time ratios, measured from replicate runs, and the verdict intervals calibrated with it.

A bootstrap over the ~10 replays of one process sees only that process's noise: on the H200 a fresh-process
replicate's ratio fell inside it for 42-83% of cells (committed replicate pairs), against a nominal 95%. Between
processes the tactics, the clocks and the memory placement change; that noise is measured here, per band of the
reference path's GPU time, as the `level` quantile of |log(ratio_b / ratio_a)| over cells of replicate pairs, and added
to the bootstrap half-width (in log space, in quadrature). The interval is then a prediction interval: where a
fresh-process replicate's ratio is expected to fall with probability `level`. `coverage` measures exactly that.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from calibrate.analysis import Cells
from dispatch.backends import ATEN, DISPATCH
from dispatch.profiles import PROFILES
from harness.errors import HarnessError
from harness.io import check_format, read_json
from harness.shipped import missing_line, shipped_file

BANDS_US = (10.0, 30.0, 100.0, math.inf)  # upper edges of the reference GPU-time bands
LEVEL = 0.95
FILE_FORMAT = 1  # the format of a noise floor file (none written before: read as 1)


def noise_path(profile: str) -> Path:
    return shipped_file("noise", profile)


def _none_shipped(profile: str, kind: str) -> None:
    """None where `profile` ships no file of `kind`; one line where it ships one and this installation lacks it."""
    known = PROFILES.get(profile)
    if known is not None and kind in known.ships:
        raise HarnessError(missing_line(kind, profile))
    return None


def noise_check(profile: str) -> Callable[[Path], None]:
    """The installer's check of a staged noise floor: it loads as every verdict loads it."""
    return lambda path: load_noise(profile, path)


def widen_log(ratio: float, lo: float, hi: float, floor: float) -> tuple[float, float]:
    """[lo, hi] around `ratio` with a log half-width `floor` added to each side's in quadrature."""
    down = math.sqrt(math.log(ratio / lo) ** 2 + floor ** 2) if lo > 0 else math.inf
    up = math.sqrt(math.log(hi / ratio) ** 2 + floor ** 2)
    return ratio * math.exp(-down), ratio * math.exp(up)


@dataclass(frozen=True)
class NoiseFloor:
    """Per band of the reference GPU time (upper edge in µs): the run-to-run log-ratio half-width at `level`."""
    bands: tuple[tuple[float, float], ...]
    level: float = LEVEL
    source: dict[str, Any] = field(default_factory=dict)

    def half_width(self, ref_us: float) -> float:
        for edge, hw in self.bands:
            if ref_us <= edge:
                return hw
        return self.bands[-1][1]

    def widen(self, ratio: float, lo: float, hi: float, ref_us: float) -> tuple[float, float]:
        """The bootstrap interval [lo, hi] around `ratio`, widened by the run-to-run floor in quadrature."""
        return widen_log(ratio, lo, hi, self.half_width(ref_us))

    def to_json(self) -> dict[str, Any]:
        return {"format": FILE_FORMAT, "level": self.level,
                "bands": [{"ref_gpu_us_up_to": None if math.isinf(e) else e, "half_width": hw}
                          for e, hw in self.bands], "source": self.source}


def load_noise(profile: str, path: Path | str | None = None) -> NoiseFloor | None:
    """The profile's stored floor, or None where the profile ships none (intervals are then the bootstrap alone); a
    floor its profile ships and this installation lacks is an error, never a silently narrower interval."""
    path = Path(path) if path else None  # a command's option as given, or nothing
    p = path or noise_path(profile)
    if path is None and not p.exists():
        return _none_shipped(profile, "noise")
    data = read_json(p, "noise floor", f"measure one with python -m calibrate noise RUN_A RUN_B --gpu {profile}")
    check_format(data if isinstance(data, dict) else {}, p, "noise floor", (FILE_FORMAT,),
                 "re-measure it with python -m calibrate noise")
    try:
        bands = tuple((math.inf if b["ref_gpu_us_up_to"] is None else float(b["ref_gpu_us_up_to"]),
                       float(b["half_width"])) for b in data["bands"])
        level = float(data["level"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HarnessError(f"{p}: malformed noise floor ({exc}); re-measure it with python -m calibrate noise") from None
    if not bands or any(not (hw >= 0 and math.isfinite(hw)) for _, hw in bands) or not 0 < level < 1:
        raise HarnessError(f"{p}: half-widths must be finite and >= 0 and the level in (0, 1); re-measure it")
    of_profile(data, profile, p, "noise")
    return NoiseFloor(bands, level, data.get("source", {}))


def of_profile(data: dict, profile: str, path: Path, tool: str) -> None:
    """A floor measured on another GPU kind than the one it would judge is refused (floors older than the profile
    field name none and are taken as the file they are)."""
    source = data.get("source")
    theirs = source.get("profile") if isinstance(source, dict) else None
    if theirs is not None and theirs != profile:
        raise HarnessError(f"{path} is a floor measured on {theirs}, not {profile}; pass a {profile} floor (python -m "
                           f"calibrate {tool} RUN_A RUN_B --gpu {profile})")


def replicate_diffs(a: Cells, b: Cells) -> pd.DataFrame:
    """Per cell and FlashInfer path measured ok in both runs: log of (path/aten in b) over (path/aten in a)."""
    rows = []
    for (n, k, m, p) in a.samples:
        if p in (ATEN, DISPATCH) or not (b.has(n, k, m, p) and a.has(n, k, m, ATEN) and b.has(n, k, m, ATEN)):
            continue
        ra, rb = a.gpu_ratio(n, k, m, p, ATEN), b.gpu_ratio(n, k, m, p, ATEN)
        rows.append({"n": n, "k": k, "m": m, "path": p, "ref_us": a.gpu(n, k, m, ATEN), "ratio_a": ra, "ratio_b": rb,
                     "d": math.log(rb / ra)})
    return pd.DataFrame(rows)


def fit_floor(pairs: list[tuple[Cells, Cells]], level: float = LEVEL, source: dict | None = None) -> NoiseFloor:
    """The `level` quantile of |d| per band, pooled over the replicate pairs."""
    d = pd.concat([replicate_diffs(a, b) for a, b in pairs], ignore_index=True)
    if d.empty:
        raise HarnessError("the replicate runs share no cell where a FlashInfer path and aten were both measured ok")
    bands, lo = [], 0.0
    for edge in BANDS_US:
        sel = d[(d["ref_us"] > lo) & (d["ref_us"] <= edge)]["d"].abs()
        hw = float(np.quantile(sel, level)) if len(sel) >= 10 else (bands[-1][1] if bands else float(np.quantile(d["d"].abs(), level)))
        bands.append((edge, hw))
        lo = edge
    return NoiseFloor(tuple(bands), level, dict(source or {}, cells=len(d)))


def coverage(a: Cells, b: Cells, floor: NoiseFloor | None, level: float = LEVEL, n_boot: int = 400) -> pd.DataFrame:
    """Per cell: whether run b's point ratio (path/aten) falls inside run a's interval, bootstrap alone and with the
    floor. The mean of each column is the measured coverage; `level` is the nominal one."""
    rows = []
    for r in replicate_diffs(a, b).itertuples(index=False):
        ratio, lo, hi = a.ratio_ci(r.n, r.k, r.m, r.path, ATEN, n_boot=n_boot, level=level,
                                   seed=hash((r.n, r.k, r.m)) & 0xFFFF)
        row = {"n": r.n, "k": r.k, "m": r.m, "path": r.path, "ref_us": r.ref_us, "ratio_a": ratio,
               "ratio_b": r.ratio_b, "boot_inside": lo <= r.ratio_b <= hi}
        if floor is not None:
            wlo, whi = floor.widen(ratio, lo, hi, r.ref_us)
            row["calibrated_inside"] = wlo <= r.ratio_b <= whi
        rows.append(row)
    return pd.DataFrame(rows)


def coverage_line(cov: pd.DataFrame, level: float, what: str) -> str:
    if cov.empty:
        return f"interval coverage ({what}): no shared cell"
    parts = [f"bootstrap alone {cov['boot_inside'].mean():.1%}"]
    if "calibrated_inside" in cov:
        parts.append(f"with the run-to-run floor {cov['calibrated_inside'].mean():.1%}")
    return f"interval coverage ({what}, {len(cov)} ratios, nominal {level:.0%}): " + ", ".join(parts)

