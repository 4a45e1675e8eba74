"""Threshold tables, dispatch/thresholds/<profile>.json: FlashInfer's low-M backend at M <= threshold, else F.linear."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatch.backends import ATEN, BACKENDS, flashinfer_path
from harness.errors import HarnessError
from harness.io import read_json
from shapes.grid import M_MAX

TABLE_DIR = Path(__file__).parent / "thresholds"


@dataclass(frozen=True)
class ThresholdTable:
    profile: str
    low_m_backend: str
    default_threshold: int
    overrides: dict[tuple[int, int], int] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def threshold(self, n: int, k: int) -> int:
        return self.overrides.get((n, k), self.default_threshold)

    def low_m_path(self) -> str:
        return flashinfer_path(self.low_m_backend)

    def choose(self, n: int, k: int, m: int) -> str:
        """The path name the dispatcher runs for this cell (eligibility aside)."""
        return self.low_m_path() if m <= self.threshold(n, k) else ATEN

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "low_m_backend": self.low_m_backend,
                "default_threshold": self.default_threshold,
                "overrides": [{"n": n, "k": k, "threshold": t} for (n, k), t in sorted(self.overrides.items())],
                "source": self.source}


def parse_table(data: Any, where: str) -> ThresholdTable:
    if not isinstance(data, dict):
        raise HarnessError(f"{where}: a threshold table is a JSON object")
    missing = [f for f in ("profile", "low_m_backend", "default_threshold") if f not in data]
    if missing:
        raise HarnessError(f"{where}: threshold table lacks {', '.join(missing)}")
    try:
        overrides = {(int(o["n"]), int(o["k"])): int(o["threshold"]) for o in data.get("overrides", [])}
        default = int(data["default_threshold"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HarnessError(f"{where}: malformed threshold or override ({exc}); each override is {{n, k, threshold}}") from None
    if default < 0 or any(t < 0 for t in overrides.values()):
        raise HarnessError(f"{where}: thresholds must be >= 0 (0 means never FlashInfer)")
    if any(t > M_MAX for t in (default, *overrides.values())):
        raise HarnessError(f"{where}: thresholds must be <= {M_MAX}, the largest M the harness measures")
    backend = data["low_m_backend"]
    known = known_low_m_backends()
    if backend not in known:
        raise HarnessError(f"{where}: low_m_backend {backend!r} is not a FlashInfer backend of the path registry "
                           f"(known: {', '.join(known)}); fix the table or refit it with python -m calibrate fit")
    source = data.get("source", {})
    if not isinstance(source, dict):
        raise HarnessError(f"{where}: source must be an object (where the table came from)")
    return ThresholdTable(str(data["profile"]), backend, default, overrides, source)


def known_low_m_backends() -> list[str]:
    return list(BACKENDS)


def load_table(profile: str | None = None, path: str | Path | None = None) -> ThresholdTable:
    if path is None:
        if profile is None:
            raise HarnessError("name a GPU profile or a threshold file")
        path = TABLE_DIR / f"{profile}.json"
    data = read_json(path, "threshold table", "run `python -m calibrate fit RESULTS --gpu PROFILE` to make one")
    return parse_table(data, str(path))
