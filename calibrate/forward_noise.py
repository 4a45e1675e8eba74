"""Run-to-run noise of measured forwards, from runs in fresh processes, and the forward verdicts' intervals widened
with it (what calibrate/noise.py does for cells).

The paired per-round interval of one forward run sees only that run's noise: one process's point ratio (a path's
forward over all-aten's) falls inside another's interval far less often than the nominal level, because at the power
cap the same kernels replay a few per cent apart from one process to the next and the host's speed moves eager
forwards in phases (docs/design.md, Findings the code relies on). That noise is measured here per regime, as the
`level` quantile of |log(ratio_b / ratio_a)| over the (model, M, path) both runs measured with the same choices, and
added to the paired interval's half-widths in quadrature.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from calibrate.pairing import paired
from calibrate.noise import LEVEL, _none_shipped, of_profile, widen_log
from dispatch.backends import ATEN
from harness.errors import HarnessError
from harness.io import check_format, read_json
from harness.shipped import shipped_file

REGIMES = ("graph", "eager")
FILE_FORMAT = 1  # the format of a forward noise floor file (none written before: read as 1)


def forward_noise_path(profile: str) -> Path:
    return shipped_file("forward-noise", profile)


@dataclass(frozen=True)
class ForwardFloor:
    """Per regime: the run-to-run log-ratio half-width of a measured forward's ratio at `level`."""
    half_widths: dict[str, float]
    level: float = LEVEL
    source: dict[str, Any] = field(default_factory=dict)

    def widen(self, regime: str, ratio: float, lo: float, hi: float) -> tuple[float, float]:
        if lo != lo or hi != hi:  # no samples, no interval
            return lo, hi
        return widen_log(ratio, lo, hi, self.half_widths.get(regime, 0.0))

    def describe(self) -> str:
        return ", ".join(f"{r} x{math.exp(hw):.3f}" for r, hw in self.half_widths.items())

    def to_json(self) -> dict[str, Any]:
        return {"format": FILE_FORMAT, "level": self.level, "half_widths": dict(self.half_widths),
                "source": self.source}


def load_forward_floor(profile: str, path: Path | str | None = None) -> ForwardFloor | None:
    """The profile's stored forward floor; None where the profile ships none (the paired intervals alone), an error
    where it ships one and this installation lacks it."""
    path = Path(path) if path else None  # a command's option as given, or nothing
    p = path or forward_noise_path(profile)
    if path is None and not p.exists():
        return _none_shipped(profile, "forward-noise")
    data = read_json(p, "forward noise floor",
                     f"measure one with python -m calibrate forward-noise RUN_A RUN_B --gpu {profile}")
    check_format(data if isinstance(data, dict) else {}, p, "forward noise floor", (FILE_FORMAT,),
                 "re-measure it with python -m calibrate forward-noise")
    try:
        hws = {str(r): float(v) for r, v in data["half_widths"].items()}
        level = float(data["level"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HarnessError(f"{p}: malformed forward noise floor ({exc}); re-measure it with python -m calibrate "
                           f"forward-noise") from None
    if not hws or any(not (v >= 0 and math.isfinite(v)) for v in hws.values()) or not 0 < level < 1:
        raise HarnessError(f"{p}: half-widths must be finite and >= 0 and the level in (0, 1); re-measure it")
    of_profile(data, profile, p, "forward-noise")
    return ForwardFloor(hws, level, data.get("source", {}))


def forward_noise_check(profile: str) -> Callable[[Path], None]:
    """The installer's check of a staged forward noise floor: it loads as every forward verdict loads it."""
    return lambda path: load_forward_floor(profile, path)


def replicate_forward_diffs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per (model, M, regime, path) measured ok in both runs with the same choices (paths_used), beside all-aten:
    the path's ratio to all-aten in each run with run a's paired interval, and d = log(ratio_b / ratio_a)."""
    rows = []
    ok_b = b[b["status"] == "ok"]
    groups_b = {key: g.set_index("path") for key, g in ok_b.groupby(["model", "m", "regime"])}
    for key, ga in a[a["status"] == "ok"].groupby(["model", "m", "regime"]):
        gb = groups_b.get(key)
        ga = ga.set_index("path")
        if gb is None or ATEN not in ga.index or ATEN not in gb.index:
            continue
        for path in ga.index:
            if path == ATEN or path not in gb.index:
                continue
            if "paths_used" in ga.columns and str(ga.at[path, "paths_used"]) != str(gb.at[path, "paths_used"]):
                continue  # another table's choices under the same rule name
            ra, lo, hi = paired(ga, path, ATEN)
            rb = paired(gb, path, ATEN)[0]
            rows.append({"model": key[0], "m": int(key[1]), "regime": key[2], "path": path, "ratio_a": ra,
                         "lo": lo, "hi": hi, "ratio_b": rb, "d": math.log(rb / ra)})
    return pd.DataFrame(rows, columns=["model", "m", "regime", "path", "ratio_a", "lo", "hi", "ratio_b", "d"])


def fit_forward_floor(pairs: list[tuple[pd.DataFrame, pd.DataFrame]], level: float = LEVEL,
                      source: dict | None = None) -> ForwardFloor:
    """The `level` quantile of |d| per regime, pooled over the replicate pairs."""
    d = pd.concat([replicate_forward_diffs(a, b) for a, b in pairs], ignore_index=True)
    counts = d.groupby("regime").size().to_dict()
    short = [r for r in REGIMES if counts.get(r, 0) < 10]
    if short:
        raise HarnessError(f"the replicate forwards share fewer than 10 ratios in the {', '.join(short)} regime "
                           f"({counts}); pass runs that measured the same models, M and paths")
    hws = {r: float(np.quantile(d.loc[d["regime"] == r, "d"].abs(), level)) for r in REGIMES}
    return ForwardFloor(hws, level, dict(source or {}, ratios=counts))


def forward_coverage(a: pd.DataFrame, b: pd.DataFrame, floor: ForwardFloor | None) -> pd.DataFrame:
    """Per shared ratio: whether run b's point falls inside run a's paired interval, alone and widened by the floor
    (the columns calibrate.noise.coverage_line reads)."""
    d = replicate_forward_diffs(a, b)
    d = d[d["lo"].notna()].copy()
    d["boot_inside"] = (d["lo"] <= d["ratio_b"]) & (d["ratio_b"] <= d["hi"])
    if floor is not None:
        widened = [floor.widen(r.regime, r.ratio_a, r.lo, r.hi) for r in d.itertuples(index=False)]
        d["calibrated_inside"] = [lo <= rb <= hi for (lo, hi), rb in zip(widened, d["ratio_b"])]
    return d
