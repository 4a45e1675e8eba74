"""Determinism and batch invariance as measured properties of every path (bench run records them per cell:
`repeatable`, bitwise the same output on repeated calls; `batch_invariant`, row 0 alone at M = 1 bitwise row 0 of
the M-row output), summed up per path for validate, the report and the fit (which records them in the table, where
the dispatcher's deterministic mode reads them)."""
from __future__ import annotations

import pandas as pd

COLUMNS = ("repeatable", "batch_invariant")


def _flags(values: pd.Series) -> pd.Series:
    """The recorded flags as booleans; a cell without one (an older run, a row not checked) is left out."""
    text = values.astype(str).str.strip().str.lower()
    return text[text.isin(("true", "false"))] == "true"


def by_path(df: pd.DataFrame) -> pd.DataFrame:
    """Per path, of its ok cells that recorded the flags: how many, how many repeatable, how many batch-invariant.
    Empty where the run recorded none (made before they were measured)."""
    if not all(c in df.columns for c in COLUMNS):
        return pd.DataFrame(columns=["path", "cells", *COLUMNS])
    rows = []
    for path, g in df[df["status"] == "ok"].groupby("path", sort=True):
        rep, inv = _flags(g["repeatable"]), _flags(g["batch_invariant"])
        if len(rep):
            rows.append({"path": path, "cells": len(rep), "repeatable": int(rep.sum()),
                         "batch_invariant": int(inv.sum())})
    return pd.DataFrame(rows, columns=["path", "cells", *COLUMNS])


def lines(df: pd.DataFrame) -> list[str]:
    """What validate prints: each path's repeatable and batch-invariant cells out of those measured."""
    table = by_path(df)
    if table.empty:
        return ["determinism: not measured by this run (bench run records it per cell since its results carry "
                "`repeatable` and `batch_invariant`)"]
    out = ["determinism per path (cells measured: repeatable on repeated calls / row 0 alone = row 0 of M rows):"]
    for r in table.itertuples(index=False):
        out.append(f"  {r.path:26s} {r.cells:5d} cells: repeatable {r.repeatable}/{r.cells}, "
                   f"batch-invariant {r.batch_invariant}/{r.cells}")
    return out


def source_entry(df: pd.DataFrame) -> dict | None:
    """What a fitted table records of its run: per path, repeatable and batch_invariant where every measured cell
    was, and the number of cells; None where the run measured none."""
    table = by_path(df)
    if table.empty:
        return None
    return {r.path: {"repeatable": r.repeatable == r.cells, "batch_invariant": r.batch_invariant == r.cells,
                     "cells": int(r.cells)} for r in table.itertuples(index=False)}
