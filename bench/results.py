"""The results contract: one tidy table per run (a row per shape, M, path) plus run.json; atomic writes."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable

from bench.envinfo import RUN_FORMATS
from bench.paths import kernel_twins
from harness.errors import HarnessError
from harness.io import atomic_write, atomic_write_text, read_input, read_input_text, read_json_object
from shapes.grid import M_MAX

COLUMNS = (
    "shape", "n", "k", "tp", "m", "path", "status", "reason",
    "gpu_us", "gpu_us_p20", "gpu_us_p80", "span_us", "event_us",
    "host_us", "host_us_p20", "host_us_p80", "host_gpu_busy",
    "kernels", "kernels_per_call", "timer", "rel_err",
    "samples", "calls_per_graph", "rotations", "l2_multiple",
    "m_is_bucket", "tune_s", "fi_runner", "fi_tactic",
    "models", "layers", "count", "in_cuda_graph", "tags",
    "gpu_samples_us", "pdl", "span_samples_us", "gpu_from", "stop",
    "bytes", "gbps", "of_ceiling", "of_large_ceiling", "replay_pass", "repeatable", "batch_invariant",
)
REQUIRED = ("n", "k", "m", "path", "status", "gpu_us", "gpu_us_p20", "gpu_us_p80", "event_us", "host_us",
            "kernels", "kernels_per_call", "timer", "rel_err")
KEY = ("n", "k", "m", "path")
STATUSES = ("ok", "failed", "skipped")


def rows_to_csv(rows: Iterable[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    return CsvLines(columns).text(list(rows))


class CsvLines:
    """A results.csv that is rewritten as rows are added, each row formatted once: a row must be final by the time it
    joins the list (a sweep appends a cell's rows when the cell is done)."""

    def __init__(self, columns: tuple[str, ...] = COLUMNS):
        import io
        self.columns = columns
        self.lines: list[str] = []
        self._buf = io.StringIO()
        self._writer = csv.DictWriter(self._buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
        self._writer.writeheader()
        self.header = self._take()

    def _take(self) -> str:
        line = self._buf.getvalue()
        self._buf.seek(0)
        self._buf.truncate(0)
        return line

    def text(self, rows: list[dict[str, Any]]) -> str:
        """The file's text for `rows`, whose first len(self.lines) rows are those formatted before."""
        if len(rows) < len(self.lines):
            raise ValueError(f"rows shrank from {len(self.lines)} to {len(rows)}: a results list only grows")
        for row in rows[len(self.lines):]:
            self._writer.writerow({c: _fmt(row.get(c)) for c in self.columns})
            self.lines.append(self._take())
        return self.header + "".join(self.lines)


def _fmt(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ";".join(str(_fmt(v)) for v in value)
    return value


def write_results(out_dir: Path, rows: list[dict[str, Any]], lines: CsvLines | None = None) -> Path:
    """results.csv of `rows`, atomically; `lines` keeps the rows formatted by earlier writes of the same list."""
    path = out_dir / "results.csv"
    atomic_write_text(path, lines.text(rows) if lines is not None else rows_to_csv(rows))
    return path


def write_run_json(out_dir: Path, info: dict[str, Any]) -> Path:
    path = out_dir / "run.json"
    atomic_write_text(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    return path


def write_parquet(out_dir: Path) -> str | None:
    """Parquet copy of results.csv when pyarrow is there; returns why not otherwise."""
    try:
        import pyarrow
    except ImportError as exc:
        return f"no parquet: {exc}"
    del pyarrow  # only that it imports matters: it is to_parquet's engine
    df = read_csv_table(out_dir / "results.csv")
    atomic_write(out_dir / "results.parquet", lambda tmp: df.to_parquet(tmp, index=False))
    return None


def read_csv_table(path: Path | Any):
    """A results.csv as the harness wrote it (a path, or a text buffer of its contents)."""
    import pandas as pd
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in
                       ("gpu_us", "gpu_us_p20", "gpu_us_p80", "span_us", "event_us", "host_us", "host_us_p20",
                        "host_us_p80", "rel_err", "tune_s", "l2_multiple", "kernels_per_call", "samples",
                        "calls_per_graph", "rotations", "bytes", "gbps", "of_ceiling", "of_large_ceiling")})


TIME_COLUMNS = ("gpu_us", "gpu_us_p20", "gpu_us_p80", "event_us", "host_us")  # finite, >= 0 on every ok row
OPTIONAL_TIMES = ("span_us", "host_us_p20", "host_us_p80")  # where given on an ok row: finite and >= 0
REL_ERR_MAX = 2e-2  # bench.gpu.REL_ERR_BOUND: an ok row's output passed the fp32 check at this bound
INT_COLUMNS = ("n", "k", "m")
INT_MAX = {"n": 1 << 24, "k": 1 << 24, "m": M_MAX}  # n, k: far above any weight of the catalog
RUN_FIX = "it must be the run.json that `python -m bench run` wrote beside results.csv"


def load_results(path: str | Path, partial: bool = False):
    """Read a results table (a run folder, results.csv, results.csv.xz or results.parquet) and validate it against
    its run.json: columns, types, finite non-negative times of ok rows, parseable samples, no duplicate cell, and
    every cell of the run's grid present (unless `partial`: then missing cells are allowed, and the caller says so)."""
    path = Path(path)
    if path.is_dir():  # results.csv, or an archived folder's xz-compressed copy of it (read-only use)
        path = next((p for p in (path / "results.csv", path / "results.csv.xz") if p.is_file()), path / "results.csv")
    if not path.is_file():
        raise HarnessError(f"results file {path} not found; run `python -m bench run` first or pass its folder")
    df = read_table(path)
    validate_results(df, path)
    twin = path.with_name("results.parquet" if path.name == "results.csv" else "results.csv")
    if path.name in ("results.csv", "results.parquet") and twin.is_file():
        other = read_table(twin)
        validate_results(other, twin)
        _same_rows(df, other, path, twin)
    info = load_run_info(path)
    incomplete = check_grid(df, info, path, partial)  # empty unless `partial` let it by
    inside = inside_grid(df, info)  # only the run's own grid is judged
    if not inside.all():
        if partial:
            incomplete.append(f"{int((~inside).sum())} row(s) outside the run's grid left out")
        df = df[inside].copy()
    df.attrs["incomplete"] = incomplete
    df.attrs["run_pdl"] = bool(info.get("pdl", False))  # runs before the pdl column: the run's setting
    if "replay_pass" not in df.columns:
        df["replay_pass"] = legacy_passes(df, resumed=bool(info.get("previous_legs")))
    return df


LEGACY_PASS = "recorded-before-replay-pass"


def legacy_passes(df, resumed: bool) -> list[str]:
    """replay_pass for a run recorded before the column: a sweep timed every path of a cell in one interleaved pass
    (bench.gpu.replay_interleaved), except a twin that was not read off its twin (a public FlashInfer call beside its
    lean call, or the dispatcher, with gpu_from empty), which may have been timed in a second pass. Those rows, and
    every row of a resumed run (a cell's paths may come from different legs), get no pass: they never pair."""
    if resumed:
        return [""] * len(df)
    cell_paths: dict[tuple, list[str]] = {}
    for n, k, m, p in zip(df["n"], df["k"], df["m"], df["path"]):
        cell_paths.setdefault((n, k, m), []).append(str(p))
    twins = {cell: kernel_twins(paths) for cell, paths in cell_paths.items()}
    gpu_from = df["gpu_from"] if "gpu_from" in df.columns else [""] * len(df)
    return ["" if str(p) in twins[(n, k, m)] and not (isinstance(src, str) and src.strip()) else LEGACY_PASS
            for n, k, m, p, src in zip(df["n"], df["k"], df["m"], df["path"], gpu_from)]


def read_table(path: Path):
    """A results table as read, before validation: csv (whole lines only) or parquet."""
    import io

    import pandas as pd
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(io.BytesIO(read_input(path, "results file", "re-run or restore it")))
        if path.suffix == ".xz":
            return read_csv_table(path)
        text = read_input_text(path, "results file", "re-run or restore it")
        _whole_rows(text, path)
        return read_csv_table(io.StringIO(text))
    except HarnessError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HarnessError(f"cannot read results file {path} ({type(exc).__name__}: {first}); "
                           f"is it a bench results table?") from None


def _whole_rows(text: str, path: Path) -> None:
    """The harness writes every row whole, each with the header's fields and a final newline: anything else is a
    file cut short (a full disk, a copy interrupted) or edited."""
    if text and not text.endswith("\n"):
        raise HarnessError(f"results file {path} ends inside a row (no final newline): it was cut short; re-run or "
                           f"restore it")
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    for number, row in enumerate(rows, start=2):
        if header is not None and len(row) != len(header):
            raise HarnessError(f"results file {path}: line {number} has {len(row)} fields, the header {len(header)}; "
                               f"the file was cut or edited: re-run or restore it")


def _same_rows(a, b, path_a: Path, path_b: Path) -> None:
    """results.csv and results.parquet of one folder hold the same cells and times (the parquet is the csv's copy,
    to the csv's 6 significant digits)."""
    import numpy as np
    cols = [c for c in ("status", "gpu_us", "host_us") if c in a.columns and c in b.columns]
    left = a.set_index(list(KEY))[cols].sort_index()
    right = b.set_index(list(KEY))[cols].sort_index()
    same = left.index.equals(right.index) and (left["status"].astype(str) == right["status"].astype(str)).all()
    if same:
        for c in cols[1:]:
            x, y = left[c].to_numpy(float), right[c].to_numpy(float)
            same &= bool(np.all((np.isnan(x) & np.isnan(y)) | np.isclose(x, y, rtol=1e-5, atol=0)))
    if not same:
        raise HarnessError(f"{path_a} and {path_b} of one run disagree (cells or times differ); one was edited or "
                           f"is stale: remove {path_b.name if path_b.suffix == '.parquet' else path_a.name} (the "
                           f"parquet is a copy of the csv) or re-run")


def _bad(path: Path, df, mask, column: str, what: str) -> HarnessError:
    row = df[mask].iloc[0]
    where = f"{row.get('shape', '?')} M={row.get('m', '?')} {row.get('path', '?')}"
    return HarnessError(f"results file {path}: {int(mask.sum())} row(s) with {what} in {column} (first: {where}); "
                        f"the file was edited or damaged: re-run or restore it")


def validate_results(df, path: Path) -> None:
    """Raises HarnessError naming the first problem: the checks every reader of a results table relies on."""
    import numpy as np
    import pandas as pd
    if df.empty:
        raise HarnessError(f"results file {path} has no rows; the run measured nothing")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise HarnessError(f"results file {path} lacks column(s) {', '.join(missing)}; "
                           f"it was not written by `python -m bench run`")
    bad = sorted(set(map(str, df["status"])) - set(STATUSES))
    if bad:
        raise HarnessError(f"results file {path} has unknown status values {bad}; expected {', '.join(STATUSES)}")
    for col in INT_COLUMNS:
        num = pd.to_numeric(df[col], errors="coerce")
        broken = ~(num.notna() & np.isfinite(num) & (num >= 1) & (num == np.floor(num)))
        if broken.any():
            raise _bad(path, df, broken, col, "a value that is not a positive integer")
        broken = num > INT_MAX[col]
        if broken.any():
            raise _bad(path, df, broken, col, f"a value above {INT_MAX[col]}, beyond any the harness measures")
        df[col] = num.astype(int)
    df["path"] = df["path"].astype(str)
    ok = df["status"] == "ok"
    for col in TIME_COLUMNS:
        num, garbage = numeric(df[col])
        if garbage.any():
            raise _bad(path, df, garbage, col, "non-numeric text")
        df[col] = num
        broken = ok & ~(np.isfinite(num) & (num > 0 if col.startswith("gpu") else num >= 0))
        if broken.any():
            raise _bad(path, df, broken, col, "a missing, infinite, NaN or negative time on an ok row")
    for col in OPTIONAL_TIMES:
        if col not in df.columns:
            continue
        num, garbage = numeric(df[col])
        broken = garbage | (ok & num.notna() & ~(np.isfinite(num) & (num >= 0)))
        if broken.any():
            raise _bad(path, df, broken, col, "text, an infinite or a negative time")
        df[col] = num
    for col, lo, hi in (("gpu_us", "gpu_us_p20", "gpu_us_p80"), ("host_us", "host_us_p20", "host_us_p80")):
        if lo in df.columns and hi in df.columns:
            med, a, b = df[col], df[lo], df[hi]
            broken = ok & a.notna() & b.notna() & med.notna() & ~((a <= med * 1.000001) & (med <= b * 1.000001))
            if broken.any():
                raise _bad(path, df, broken, f"{lo}, {col}, {hi}", "percentiles out of order (p20 <= median <= p80)")
    err = pd.to_numeric(df["rel_err"], errors="coerce")
    broken = ok & ~(err.notna() & (err >= 0) & (err <= REL_ERR_MAX))
    if broken.any():
        raise _bad(path, df, broken, "rel_err", f"an ok row whose error is missing or above {REL_ERR_MAX:g}")
    if "shape" in df.columns:
        names = "n" + df["n"].astype(str) + "_k" + df["k"].astype(str)
        shape = df["shape"].astype(str)
        broken = ~pd.Series([a == b or a.startswith(b + "_") for a, b in zip(shape, names)], index=df.index)
        if broken.any():
            raise _bad(path, df, broken, "shape, n, k", "a shape name that does not match n and k")
    for col in ("gpu_samples_us", "span_samples_us"):
        if col in df.columns:
            broken = ok & ~df[col].map(samples_ok)
            if broken.any():
                raise _bad(path, df, broken, col, "samples that are not ';'-separated positive numbers")
    dup = df.duplicated(list(KEY), keep=False)
    if dup.any():
        raise _bad(path, df, dup, "n, k, m, path", "a duplicated cell")


def numeric(raw):
    """A column as numbers, and the mask of its cells that hold text which is no number (blank and 'nan' count as
    missing, not as text)."""
    import pandas as pd
    num = pd.to_numeric(raw, errors="coerce")
    text = raw.astype(str).str.strip()
    return num, num.isna() & raw.notna() & (text != "") & (text.str.lower() != "nan")


def samples_missing(value: Any) -> bool:
    import math
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def samples_ok(value: Any) -> bool:
    """';'-separated finite positive numbers, or nothing (older tables: the median stands in for the samples)."""
    import math
    if samples_missing(value):
        return True
    try:
        xs = [float(v) for v in str(value).split(";") if v.strip()]
    except ValueError:
        return False
    return bool(xs) and all(math.isfinite(x) and x > 0 for x in xs)


def expected_cells(info: dict[str, Any]) -> set[tuple[str, int, str]] | None:
    """(shape, m, path) of every cell of the run's grid, from run.json; None when run.json does not list it."""
    grid = [info.get(k) for k in ("shapes", "ms", "paths")]
    if not all(isinstance(g, list) and g for g in grid):
        return None
    shapes, ms, paths = grid
    per_shape = info.get("cells") or {s: ms for s in shapes}  # bench run --cells: each shape its own M
    return {(str(s), int(m), str(p)) for s in shapes for m in per_shape.get(s, []) for p in paths}


def check_grid(df, info: dict[str, Any], path: Path, partial: bool) -> list[str]:
    """Every cell of run.json's grid must have a row and the run must have finished; else one error naming what is
    missing, unless `partial` (then the missing cells are returned for the caller to report)."""
    problems = []
    status = info.get("status")
    if status not in (None, "complete"):
        problems.append(f"run.json says the run is {status!r}")
    want = expected_cells(info)
    missing: list[tuple[str, int, str]] = []
    if want is None:
        problems.append("run.json names no complete grid (shapes, ms and paths), so missing cells cannot be told")
    if want is not None and "shape" in df.columns:
        have = set(zip(df["shape"].astype(str), df["m"].astype(int), df["path"].astype(str)))
        missing = sorted(want - have)
        if missing:
            shown = ", ".join(f"{s} M={m} {p}" for s, m, p in missing[:4])
            problems.append(f"{len(missing)} of {len(want)} cells of its grid are missing ({shown}"
                            f"{', ...' if len(missing) > 4 else ''})")
    if problems and not partial:
        raise HarnessError(f"results {path}: {'; '.join(problems)}; no verdict on incomplete data: finish it with "
                           f"`python -m bench run ... --resume`, or pass --partial to judge only what was measured")
    return problems


def inside_grid(df, info: dict[str, Any]):
    """A mask of the rows whose cell is in run.json's grid (all of them where run.json lists none)."""
    import pandas as pd
    want = expected_cells(info)
    if want is None or "shape" not in df.columns:
        return pd.Series(True, index=df.index)
    return pd.Series([(s, m, p) in want for s, m, p in zip(df["shape"].astype(str), df["m"].astype(int),
                                                           df["path"].astype(str))], index=df.index)


def load_run_info(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise HarnessError(f"results {path} not found; run `python -m bench run` first or pass its folder")
    run_json = (path if path.is_dir() else path.parent) / "run.json"
    if not run_json.is_file():
        raise HarnessError(f"{run_json} not found; a results table needs the run.json written beside it")
    info = read_json_object(run_json, "run.json", RUN_FIX)
    check_format(info, run_json)
    fp = info.get("fingerprint")
    if fp is not None and not isinstance(fp, dict):
        raise HarnessError(f"{run_json}: fingerprint is a {type(fp).__name__}, not an object; {RUN_FIX}")
    for key in ("shapes", "paths", "ms"):
        value = info.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, int if key == "ms" else str) for v in value)):
            raise HarnessError(f"{run_json}: {key} must be a list of {'integers' if key == 'ms' else 'names'}; "
                               f"{RUN_FIX}")
    cells = info.get("cells")
    if cells is not None and not (isinstance(cells, dict) and cells and all(
            isinstance(ms, list) and ms and all(isinstance(m, int) for m in ms) for ms in cells.values())):
        raise HarnessError(f"{run_json}: cells must map shape names to lists of integer M; {RUN_FIX}")
    for key in ("profile", "command", "status", "started"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise HarnessError(f"{run_json}: {key} must be a string; {RUN_FIX}")
    return info


def check_format(info: dict[str, Any], where: Path) -> None:
    """A run.json of a format this harness reads (bench.envinfo.RUN_FORMATS; no key: format 1)."""
    fmt = info.get("format", 1)
    if fmt not in RUN_FORMATS or isinstance(fmt, bool):
        known = ", ".join(map(str, RUN_FORMATS))
        raise HarnessError(f"{where}: format {fmt!r:.20} is not one this harness reads ({known}); read it with the "
                           f"harness that wrote it (its sha is in the fingerprint), or update")


def finished_rows(path: Path, key: tuple[str, ...], what: str) -> list[dict[str, str]]:
    """The rows a run already wrote (for --resume), as text; none when the file is not there yet."""
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or any(c not in reader.fieldnames for c in key):
            raise HarnessError(f"{path} is not a {what}; remove it or choose another --out")
        return list(reader)


def done_keys(out_dir: Path) -> tuple[list[dict[str, Any]], set[tuple]]:
    """Rows already written to out_dir (for --resume) and their (n, k, m, path) keys."""
    path = out_dir / "results.csv"
    rows = finished_rows(path, KEY, "results table")
    try:
        keys = {(int(r["n"]), int(r["k"]), int(r["m"]), r["path"]) for r in rows}
    except (TypeError, ValueError):
        raise HarnessError(f"{path} has a row whose n, k or m is not an integer; restore it or choose another "
                           f"--out") from None
    return rows, keys
