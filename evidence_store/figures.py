"""The figures evidence/manifest.json records for its runs, and how each is read back or recomputed from the run.

A manifest entry may carry `figures`: a list of {"label", "of", "args", "value", "tolerance"}. `of` names one of
the readers below; `value` is what the reader gave when the figure was recorded (`python -m evidence_store figure`, never
by hand); `tolerance` is how far a later reading may be from it (0 for a value read from a file; a recomputation by
today's code, such as `validate`, compares exactly or within its recorded tolerance). The results page
(`python -m evidence_store page`) shows the values read now, and the evidence test reads every figure again.
"""
from __future__ import annotations

# The readers of the runs (pandas) are imported where a command reads one: `current`, what the Makefile asks with
# the system python, needs none of them.

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any, Callable

from harness.errors import HarnessError

READERS: dict[str, Callable[..., Any]] = {}


def reader(name: str):
    def register(fn):
        READERS[name] = fn
        return fn
    return register


def _one(df, where: dict, what: str):
    sel = df
    for key, want in where.items():
        sel = sel[sel[key] == want]
    if len(sel) != 1:
        raise HarnessError(f"{what}: {len(sel)} rows match {where}, not one")
    return sel.iloc[0]


def _number(v) -> float:
    v = float(v)
    return round(v, 4) if math.isfinite(v) else v


@reader("forward")
def forward(run: Path, part: str, model: str, m: int, path: str, regime: str, column: str | list[str],
            reference_gbps: float | None = None) -> float | list[float]:
    """A forward row's column (or columns); `over_reference` is its time over its bytes at reference_gbps (GB/s)."""
    import pandas as pd
    df = pd.read_csv(run / part / "forward.csv")
    row = _one(df, {"model": model, "m": m, "path": path, "regime": regime, "status": "ok"}, f"{run}/{part}")
    if isinstance(column, list):
        return [_number(row[c]) for c in column]
    if column == "over_reference":
        return _number(row["us"] / (row["bytes"] / (reference_gbps * 1e3)))
    return _number(row[column])


@reader("cells")
def cells(run: Path, part: str, n: int, k: int, ms: list[int], path: str, column: str) -> list[float]:
    """One results column of (N, K, path) at each of `ms`, from the run's results file."""
    from bench.results import load_results
    df = load_results(run / part)
    return [_number(_one(df, {"n": n, "k": k, "m": m, "path": path, "status": "ok"}, f"{run}/{part}")[column])
            for m in ms]


@reader("host_cost")
def host_cost(run: Path, m: int, path: str, stat: str) -> float:
    """The median, min or max over shapes of a host-cost path's ratio to F.linear at M."""
    from calibrate.hostcost import load_host_cost
    df = load_host_cost(run / "host_cost.csv")
    ratio = df[(df["m"] == m) & (df["path"] == path)]["ratio"]
    if ratio.empty:
        raise HarnessError(f"{run}/host_cost.csv: no {path!r} rows at M = {m}")
    return _number(getattr(ratio, stat)())


@reader("leg")
def leg(run: Path, name: str, key: str = "seconds"):
    """What a table run's manifest recorded of one leg (its seconds, its verdict)."""
    legs = json.loads((run / "manifest.json").read_text())["legs"]
    if name not in legs:
        raise HarnessError(f"{run}/manifest.json has no leg {name!r}")
    return legs[name][key]


@reader("validate")
def validate(run: Path) -> str:
    """The verdict today's `calibrate validate` gives the run's table on its own check legs (recomputed)."""
    from calibrate.__main__ import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["validate", str(run / "check-sweep"), "--table", str(run / "table.json"),
              "--forward", str(run / "check-forward")])
    return out.getvalue().strip().splitlines()[-1]


@reader("e2e")
def e2e(run: Path, step: str, tokens: int, column: str | list[str], forward: str | None = None):
    """A step of a bench e2e run as `calibrate e2e` judges it (recomputed): per_round, lo, hi, verdict, ...; with
    `forward` (the evidence id of a transformers-layout bench forward run) also what its linears predict."""
    from calibrate.e2e_terms import load_e2e, predictions
    from calibrate.forward_model import load_forward
    df, _ = load_e2e(run)
    fw = load_forward(run.parent / forward)[0] if forward else None
    row = _one(predictions(df, fw, None), {"step": step, "tokens": tokens}, f"e2e {step}")
    cols = [column] if isinstance(column, str) else column
    values = [row[c] if isinstance(row[c], str) else _number(row[c]) for c in cols]
    return values[0] if isinstance(column, str) else values


@reader("probe")
def probe(run: Path, n: int, k: int, ms: list[int], path: str, column: str) -> list[float]:
    """One column of tools/probes/limit.py's limit.csv for (N, K, path) at each of `ms`."""
    import pandas as pd
    df = pd.read_csv(run / "limit.csv")
    return [_number(_one(df, {"n": n, "k": k, "m": m, "path": path}, f"{run}/limit.csv")[column]) for m in ms]


def read(run: Path, spec: dict) -> Any:
    of = spec.get("of")
    if of not in READERS:
        raise HarnessError(f"figure {spec.get('label')!r}: no reader {of!r}; one of {', '.join(sorted(READERS))}")
    try:
        return READERS[of](run, **spec.get("args", {}))
    except (TypeError, KeyError, FileNotFoundError) as exc:  # arguments the reader does not take, a missing column
        raise HarnessError(f"figure {spec.get('label')!r}: {of}({spec.get('args', {})}) cannot read {run.name}: "
                           f"{type(exc).__name__}: {exc}; see evidence_store/figures.py for its arguments") from None


def agrees(value: Any, stored: Any, tolerance: float) -> bool:
    if isinstance(stored, list):
        return isinstance(value, list) and len(value) == len(stored) and all(
            agrees(v, s, tolerance) for v, s in zip(value, stored))
    if isinstance(stored, (int, float)) and not isinstance(stored, bool):
        return isinstance(value, (int, float)) and abs(value - stored) <= tolerance
    return value == stored


def shown(value: Any) -> str:
    if isinstance(value, list):
        return " / ".join(shown(v) for v in value)
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    return str(value)
