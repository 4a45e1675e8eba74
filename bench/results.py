"""The results contract: one tidy table per run (a row per shape, M, path) plus run.json; atomic writes."""
from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from shapes.errors import HarnessError

COLUMNS = (
    "shape", "n", "k", "tp", "m", "path", "status", "reason",
    "gpu_us", "gpu_us_p20", "gpu_us_p80", "span_us", "event_us",
    "host_us", "host_us_p20", "host_us_p80", "host_gpu_busy",
    "kernels", "kernels_per_call", "timer", "rel_err",
    "samples", "calls_per_graph", "rotations", "l2_multiple",
    "m_is_bucket", "tune_s", "fi_runner", "fi_tactic",
    "models", "layers", "count", "in_cuda_graph", "tags",
    "gpu_samples_us",
)
REQUIRED = ("n", "k", "m", "path", "status", "gpu_us", "gpu_us_p20", "gpu_us_p80", "event_us", "host_us",
            "kernels", "kernels_per_call", "timer", "rel_err")
KEY = ("n", "k", "m", "path")
STATUSES = ("ok", "failed", "skipped")


def atomic_write(path: Path, fill: Callable[[Path], object]) -> None:
    """fill(tmp) writes a temp file in the same folder, which is then renamed over `path`: a reader never sees half a
    file, and a failed fill leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        fill(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, newline=""))


def rows_to_csv(rows: Iterable[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    import io
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _fmt(row.get(c)) for c in columns})
    return buf.getvalue()


def _fmt(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ";".join(_fmt(v) if not isinstance(v, str) else v for v in value)
    return value


def write_results(out_dir: Path, rows: list[dict[str, Any]]) -> Path:
    path = out_dir / "results.csv"
    atomic_write_text(path, rows_to_csv(rows))
    return path


def write_run_json(out_dir: Path, info: dict[str, Any]) -> Path:
    path = out_dir / "run.json"
    atomic_write_text(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    return path


def write_parquet(out_dir: Path) -> str | None:
    """Parquet copy of results.csv when pyarrow is there; returns why not otherwise."""
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError as exc:
        return f"no parquet: {exc}"
    df = read_csv_table(out_dir / "results.csv")
    atomic_write(out_dir / "results.parquet", lambda tmp: df.to_parquet(tmp, index=False))
    return None


def read_csv_table(path: Path):
    import pandas as pd
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in
                       ("gpu_us", "gpu_us_p20", "gpu_us_p80", "span_us", "event_us", "host_us", "host_us_p20",
                        "host_us_p80", "rel_err", "tune_s", "l2_multiple", "kernels_per_call", "samples",
                        "calls_per_graph", "rotations")})


def load_results(path: str | Path):
    """Read a results table (a run folder, results.csv or results.parquet) and check its columns."""
    import pandas as pd
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise HarnessError(f"results file {path} not found; run `python -m bench run` first or pass its folder")
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else read_csv_table(path)
    except Exception as exc:
        raise HarnessError(f"cannot read results file {path} ({type(exc).__name__}: {exc}); is it a bench results table?") from None
    if df.empty:
        raise HarnessError(f"results file {path} has no rows; the run measured nothing")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise HarnessError(f"results file {path} lacks column(s) {', '.join(missing)}; it was not written by `python -m bench run`")
    bad = sorted(set(df["status"]) - set(STATUSES))
    if bad:
        raise HarnessError(f"results file {path} has unknown status values {bad}; expected {', '.join(STATUSES)}")
    return df


def load_run_info(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    run_json = (path if path.is_dir() else path.parent) / "run.json"
    if not run_json.is_file():
        raise HarnessError(f"{run_json} not found; a results table needs the run.json written beside it")
    try:
        return json.loads(run_json.read_text())
    except json.JSONDecodeError as exc:
        raise HarnessError(f"{run_json} is not valid JSON ({exc})") from None


def done_keys(out_dir: Path) -> tuple[list[dict[str, Any]], set[tuple]]:
    """Rows already written to out_dir (for --resume) and their (n, k, m, path) keys."""
    path = out_dir / "results.csv"
    if not path.is_file():
        return [], set()
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or any(c not in reader.fieldnames for c in KEY):
            raise HarnessError(f"{path} is not a results table; remove it or choose another --out")
        rows = list(reader)
    keys = {(int(r["n"]), int(r["k"]), int(r["m"]), r["path"]) for r in rows}
    return rows, keys
