"""Bad input, one row each: every command answers with one line `prog: error: ...` naming the problem, a non-zero exit,
no traceback, and no file changed (the case's own folder and the repository's committed tables, baselines and data).

A case builds its inputs in a fresh folder and returns the command line; the table runs it through run_cli in this
process (an uncaught exception would fail the case as a traceback would) and compares file snapshots around it."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from harness.errors import run_cli

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SWEEP = DATA / "h200-sweep"
SHARD = DATA / "h200-shards" / "shard-1"  # a shard of a --shard run, as bench merge takes it
FORWARD = ROOT / "evidence" / "h200-forward-20261201T1016-4d4993"  # a forward of the current rules
LEAN = DATA / "h200-lean-validate"  # a run that measured the lean paths of the table beside it
LEAN_TABLE = DATA / "h200-lean-table.json"  # a table fitted before the GEMV path: every path it chooses, LEAN measured
WATCHED = [ROOT / "dispatch" / "thresholds", ROOT / "calibrate" / "baselines", ROOT / "calibrate" / "noise", DATA,
           ROOT / "shapes" / "configs", ROOT / "README.md", ROOT / "evidence" / "manifest.json"]


def _mains() -> dict[str, Callable]:
    from bench.__main__ import main as bench
    from calibrate.__main__ import main as calibrate
    from reports.__main__ import main as reports
    from shapes.__main__ import main as shapes
    from tables.cli import main as tables
    return {"bench": bench, "calibrate": calibrate, "reports": reports, "shapes": shapes, "tables": tables}


def table_for(t: Path, profile: str) -> str:
    """The committed H200 table, relabelled as another profile's."""
    data = json.loads((ROOT / "dispatch" / "thresholds" / "h200.json").read_text())
    (t / "table.json").write_text(json.dumps({**data, "profile": profile}))
    return str(t / "table.json")


def snapshot(*roots: Path) -> dict[str, tuple[int, str]]:
    """Every file and folder under roots: (mode, content hash); folders hash to ''."""
    out = {}
    for root in roots:
        if root.is_file():
            out[str(root)] = (os.stat(root).st_mode, hashlib.sha1(root.read_bytes()).hexdigest())
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            if "__pycache__" in dirpath:
                continue
            out[dirpath] = (os.stat(dirpath).st_mode, "")
            for f in filenames:
                p = os.path.join(dirpath, f)
                regular = os.path.isfile(p)  # a FIFO or device is kept by its mode alone: reading it would block
                out[p] = (os.stat(p).st_mode, hashlib.sha1(Path(p).read_bytes()).hexdigest() if regular else "")
    return out


# ---------------------------------------------------------------- inputs
def config(tmp: Path, edit: dict | None = None, raw: bytes | None = None, name: str = "config.json") -> str:
    base = json.loads((ROOT / "shapes" / "configs" / "qwen3.5-4b.json").read_text())
    base["text_config"].update(edit or {})
    p = tmp / name
    p.write_bytes(raw if raw is not None else json.dumps(base).encode())
    return str(p)


def run_folder(tmp: Path, edit_rows: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
               edit_info: Callable[[dict], object] | None = None, csv_text: Callable[[str], str] | None = None,
               source: Path = SWEEP) -> str:
    """A copy of a committed run with its results table and/or run.json edited."""
    d = tmp / "run"
    d.mkdir()
    table = "forward.csv" if (source / "forward.csv").is_file() else "results.csv"
    text = (source / table).read_text()
    if edit_rows is not None:
        df = pd.read_csv(source / table, dtype=str, keep_default_na=False)
        text = edit_rows(df).to_csv(index=False)
    if csv_text is not None:
        text = csv_text(text)
    (d / table).write_text(text)
    info = json.loads((source / "run.json").read_text())
    if edit_info is not None:
        info = edit_info(info) or info
    (d / "run.json").write_bytes(info if isinstance(info, bytes) else json.dumps(info).encode())
    return str(d)


def set_cell(col: str, value: str, where: int = 0):
    def edit(df):
        ok = df.index[df["status"] == "ok"][where]
        df.loc[ok, col] = value
        return df
    return edit


def thresholds(tmp: Path, edit: dict | None = None, raw: bytes | None = None, v2: bool = False) -> str:
    """A table file: the format 1 fixture (what tests/data/h200-sweep measured), or the committed format 2 table."""
    src = ROOT / "dispatch" / "thresholds" / "h200.json" if v2 else DATA / "h200-table-format1.json"
    data = json.loads(src.read_text())
    data.update(edit or {})
    p = tmp / "t.json"
    p.write_bytes(raw if raw is not None else json.dumps(data).encode())
    return str(p)


def baseline(tmp: Path, edit: Callable[[dict], object] | None = None, raw: bytes | None = None) -> str:
    text = (ROOT / "calibrate" / "baselines" / "h200.json").read_text()
    p = tmp / "h200.json"
    if raw is not None:
        p.write_bytes(raw)
        return str(p)
    data = json.loads(text)
    if edit is not None:
        edit(data)
    p.write_text(json.dumps(data))
    tactics = ROOT / "calibrate" / "baselines" / "h200.autotune.json"
    if tactics.is_file():  # a baseline whose runs served one tactics file keeps it beside itself
        shutil.copy(tactics, tmp / "h200.autotune.json")
    return str(p)


def user_folder(tmp: Path, name: str = "mine", inner: str = "notes.txt") -> str:
    d = tmp / name
    (d / inner).parent.mkdir(parents=True, exist_ok=True)
    (d / inner).write_text("the user's own file\n")
    return str(d)


def first_cell(key: str, value):
    def edit(data):
        data["cells"][0][key] = value
    return edit


# ---------------------------------------------------------------- the table: (id, setup -> argv, message needle)
NOT_UTF8 = b'{"a": "\xff\xfe"}'
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    # model configs
    ("config hidden_size null", lambda t: ["shapes", "from-config", config(t, {"hidden_size": None})], "hidden_size is None"),
    ("config kv heads 0", lambda t: ["shapes", "from-config", config(t, {"num_key_value_heads": 0})], "num_key_value_heads is 0"),
    ("config negative size", lambda t: ["shapes", "from-config", config(t, {"hidden_size": -2560})], "hidden_size is -2560"),
    ("config zero size", lambda t: ["shapes", "from-config", config(t, {"intermediate_size": 0})], "intermediate_size is 0"),
    ("config fractional size", lambda t: ["shapes", "from-config", config(t, {"hidden_size": 2560.5})], "integer"),
    ("config text size", lambda t: ["shapes", "from-config", config(t, {"vocab_size": "big"})], "vocab_size is 'big'"),
    ("config bool size", lambda t: ["shapes", "from-config", config(t, {"num_hidden_layers": True})], "num_hidden_layers"),
    ("config head_dim 0", lambda t: ["shapes", "from-config", config(t, {"head_dim": 0})], "head_dim is 0"),
    ("config zero layers", lambda t: ["shapes", "from-config", config(t, {"num_hidden_layers": 0})], "num_hidden_layers is 0"),
    ("config heads not a multiple of kv heads", lambda t: ["shapes", "from-config", config(t, {"num_key_value_heads": 3})],
     "not a multiple of num_key_value_heads"),
    ("config linear v heads not a multiple of k heads",
     lambda t: ["shapes", "from-config", config(t, {"linear_num_value_heads": 20})], "not a multiple of linear_num_key_heads"),
    ("config hidden not divisible without head_dim",
     lambda t: ["shapes", "from-config", config(t, {"head_dim": None, "hidden_size": 2570})], "add head_dim"),
    ("config layer_types not a list", lambda t: ["shapes", "from-config", config(t, {"layer_types": "full"})], "layer_types must be a list"),
    ("config interval 0", lambda t: ["shapes", "from-config", config(t, {"full_attention_interval": 0})], "full_attention_interval"),
    ("config not UTF-8", lambda t: ["shapes", "from-config", config(t, raw=NOT_UTF8)], "not UTF-8"),
    ("config a JSON list", lambda t: ["shapes", "from-config", config(t, raw=b"[1, 2]")], "not an object"),
    ("config a folder", lambda t: ["shapes", "from-config", str(t)], "is a folder"),
    ("config TP does not divide", lambda t: ["shapes", "from-config", config(t), "--tp", "3"], "does not divide"),
    ("shapes list TP out of range", lambda t: ["shapes", "list", "--tp", "0"], "outside 1..64"),
    ("shapes grid M above 16384", lambda t: ["shapes", "grid", "--m", "20000"], "1..16384"),
    # results tables
    ("host-shift arm of one run", lambda t: ["calibrate", "host-shift", "--arm", "a", str(LEAN), "--arm", "b", str(LEAN),
                                             str(LEAN)], "--arm a: an arm needs its own name and two or more runs"),
    ("host-shift one arm", lambda t: ["calibrate", "host-shift", "--arm", "a", str(LEAN), str(LEAN)], "two or more --arm"),
    ("host-shift arm named twice", lambda t: ["calibrate", "host-shift", "--arm", "a", str(LEAN), str(LEAN), "--arm", "a",
                                              str(LEAN), str(LEAN)], "the name twice"),
    ("fit second --forward missing", lambda t: ["calibrate", "fit", str(DATA / "h200-lean-fit"), "--gpu", "h200", "--forward",
                                                str(DATA / "h200-lean-forward"), str(t / "gone"), "--dry-run"], "gone"),
    ("fit --table-forward missing", lambda t: ["calibrate", "fit", str(DATA / "h200-lean-fit"), "--gpu", "h200",
                                               "--table-forward", str(t / "gone"), "--dry-run"], "gone"),
    ("fit --keep without --table-forward", lambda t: ["calibrate", "fit", str(DATA / "h200-lean-fit"), "--gpu", "h200",
                                                      "--keep", str(DATA / "h200-table-107eae0.json"), "--dry-run"],
     "--keep needs --table-forward"),
    ("fit --keep missing", lambda t: ["calibrate", "fit", str(DATA / "h200-lean-fit"), "--gpu", "h200", "--dry-run",
                                      "--table-forward", str(DATA / "h200-settled-forward-5"), "--keep", str(t / "gone")],
     "gone"),
    ("fit --table-forward NaN time", lambda t: ["calibrate", "fit", str(DATA / "h200-lean-fit"), "--gpu", "h200",
                                                "--dry-run", "--table-forward", run_folder(
        t, source=DATA / "h200-forward", edit_rows=lambda df: df.assign(us=df["us"].where(df.index != 0, "nan")))],
     "NaN"),
    ("host-shift run given twice", lambda t: ["calibrate", "host-shift", "--arm", "a", str(LEAN), str(SWEEP), "--arm",
                                              "b", str(LEAN) + "/", str(DATA / "h200-lean-fit")], "given twice"),
    ("host-shift missing run", lambda t: ["calibrate", "host-shift", "--arm", "a", str(LEAN), str(t / "gone"), "--arm",
                                          "b", str(LEAN), str(LEAN)], "gone"),
    ("results gpu_us text", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_us", "fast"))], "non-numeric text in gpu_us"),
    ("results gpu_us NaN", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_us", "nan"))], "NaN or negative time"),
    ("results gpu_us inf", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_us", "inf"))], "infinite"),
    ("results gpu_us negative", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_us", "-3.5"))], "negative time"),
    ("results gpu_us zero", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_us", "0"))], "gpu_us"),
    ("results host_us negative", lambda t: ["calibrate", "validate", run_folder(t, set_cell("host_us", "-20"))], "host_us"),
    ("results host_us NaN", lambda t: ["calibrate", "validate", run_folder(t, set_cell("host_us", "nan"))], "host_us"),
    ("results ok row without event_us", lambda t: ["calibrate", "validate", run_folder(t, set_cell("event_us", ""))], "event_us"),
    ("results samples garbage", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_samples_us", "1.2;x;3"))],
     "gpu_samples_us"),
    ("results samples negative", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_samples_us", "1.2;-3"))],
     "gpu_samples_us"),
    ("results duplicated rows", lambda t: ["calibrate", "validate", run_folder(t, lambda df: pd.concat([df, df.head(3)]))],
     "duplicated cell"),
    ("results M zero", lambda t: ["calibrate", "validate", run_folder(t, set_cell("m", "0"))], "positive integer in m"),
    ("results M fractional", lambda t: ["calibrate", "validate", run_folder(t, set_cell("m", "8.5"))], "positive integer in m"),
    ("results unknown status", lambda t: ["calibrate", "validate", run_folder(t, set_cell("status", "great"))], "unknown status"),
    ("results lacks a column", lambda t: ["calibrate", "validate", run_folder(t, lambda df: df.drop(columns=["gpu_us"]))],
     "lacks column"),
    ("results cut at a line (1 row)", lambda t: ["calibrate", "validate", run_folder(t, csv_text=lambda s: "\n".join(s.splitlines()[:2]) + "\n")],
     "cells of its grid are missing"),
    ("results cut mid-line", lambda t: ["calibrate", "validate", run_folder(t, csv_text=lambda s: s[: len(s) // 2])],
     "cut short"),
    ("results empty file", lambda t: ["calibrate", "validate", run_folder(t, csv_text=lambda s: "")], "cannot read|no rows"),
    ("results header only", lambda t: ["calibrate", "validate", run_folder(t, csv_text=lambda s: s.splitlines()[0] + "\n")], "no rows"),
    ("results of an unfinished run", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {**i, "status": "interrupted"})],
     "interrupted"),
    ("results folder missing", lambda t: ["calibrate", "validate", str(t / "nothing")], "not found"),
    ("report on a cut results file", lambda t: ["reports", "build", run_folder(t, csv_text=lambda s: "\n".join(s.splitlines()[:50]) + "\n"),
                                                 "-o", str(t / "r.html")], "missing"),
    ("fit on one row", lambda t: ["calibrate", "fit", run_folder(t, csv_text=lambda s: "\n".join(s.splitlines()[:2]) + "\n"),
                                  "--gpu", "h200", "--out-file", str(t / "t.json")], "missing"),
    ("fit on one row with --partial", lambda t: ["calibrate", "fit", run_folder(t, csv_text=lambda s: "\n".join(s.splitlines()[:2]) + "\n"),
                                                 "--gpu", "h200", "--partial", "--out-file", str(t / "t.json")], "nothing to fit"),
    ("fit on NaN data", lambda t: ["calibrate", "fit", run_folder(t, set_cell("gpu_us", "nan", 5)), "--gpu", "h200",
                                   "--out-file", str(t / "t.json")], "NaN"),
    ("baseline --from NaN data", lambda t: ["calibrate", "baseline", "--gpu", "h200", "--from",
                                            run_folder(t, set_cell("gpu_samples_us", "nan;1", 2)), "--out-file", str(t / "b.json")],
     "gpu_samples_us"),
    # run.json
    ("run.json a list", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: [i])], "not an object"),
    ("run.json not UTF-8", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: NOT_UTF8)], "not UTF-8"),
    ("run.json not JSON", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: b"{oops")], "not valid JSON"),
    ("run.json fingerprint a string", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {**i, "fingerprint": "H200"})],
     "fingerprint is a str"),
    ("run.json ms not integers", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {**i, "ms": ["a"]})],
     "ms must be a list"),
    ("run.json missing", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: b"{}") and
                                    (os.remove(t / "run" / "run.json") or str(t / "run"))], "run.json not found"),
    ("run.json from another GPU", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: i["fingerprint"].update(
        gpu_name="NVIDIA GH200 480GB"))], "not on a h200"),
    ("results from a B200 judged as GB200", lambda t: ["calibrate", "validate", "--gpu", "gb200", run_folder(
        t, edit_info=lambda i: i["fingerprint"].update(gpu_name="NVIDIA B200", sm=100))], "not on a gb200"),
    # round two: grids, columns that numbers are computed from, shipped and special output files
    ("run.json without ms", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {
        k: v for k, v in i.items() if k != "ms"})], "names no complete grid"),
    ("run.json shapes null", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {**i, "shapes": None})],
     "names no complete grid"),
    ("run.json shapes empty", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {**i, "shapes": []})],
     "names no complete grid"),
    ("fit on a run without its grid", lambda t: ["calibrate", "fit", run_folder(t, edit_info=lambda i: {
        k: v for k, v in i.items() if k != "paths"}), "--gpu", "h200", "--out-file", str(t / "t.json")], "no complete grid"),
    ("results negative span_us", lambda t: ["calibrate", "validate", run_folder(t, set_cell("span_us", "-3"))], "span_us"),
    ("results host p20 negative", lambda t: ["calibrate", "validate", run_folder(t, set_cell("host_us_p20", "-1"))],
     "host_us_p20"),
    ("results p20 above p80", lambda t: ["calibrate", "validate", run_folder(t, set_cell("gpu_us_p20", "99999"))],
     "out of order"),
    ("results rel_err 5", lambda t: ["calibrate", "validate", run_folder(t, set_cell("rel_err", "5.0"))], "rel_err"),
    ("results n not the shape's", lambda t: ["calibrate", "validate", run_folder(t, set_cell("n", "7"))],
     "does not match n and k"),
    ("results span samples text", lambda t: ["calibrate", "validate", run_folder(t, set_cell("span_samples_us", "a;b"))],
     "span_samples_us"),
    ("forward without samples_us", lambda t: ["calibrate", "vllm", "--forward", run_folder(
        t, source=FORWARD, edit_rows=lambda df: df.drop(columns=["samples_us"]))], "samples_us"),
    ("forward samples text", lambda t: ["calibrate", "vllm", "--forward", run_folder(
        t, source=FORWARD, edit_rows=lambda df: df.assign(samples_us="x;y"))], "samples_us"),
    ("forward negative span_us", lambda t: ["calibrate", "vllm", "--forward", run_folder(
        t, source=FORWARD, edit_rows=lambda df: df.assign(span_us="-5"))], "span_us"),
    ("forward unknown status", lambda t: ["calibrate", "vllm", "--forward", run_folder(
        t, source=FORWARD, edit_rows=lambda df: df.assign(status="great"))], "unknown status"),
    ("forward m text", lambda t: ["calibrate", "vllm", "--forward", run_folder(
        t, source=FORWARD, edit_rows=lambda df: df.assign(m="eight"))], "positive integer in m"),
    ("forward run.json without paths", lambda t: ["calibrate", "vllm", "--forward", run_folder(
        t, source=FORWARD, edit_info=lambda i: {**i, "paths": []})], "names no paths"),
    ("table shapes an object", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"shapes": {}}, v2=True)], "shapes must be a list"),
    ("table up_to text", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"default": {"graph": [{"up_to": "7", "path": "aten"}], "eager": []}}, v2=True)], "up_to must be an integer"),
    ("table up_to fractional", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"default": {"graph": [{"up_to": 7.5, "path": "aten"}], "eager": []}}, v2=True)], "up_to must be an integer"),
    ("table low-M backend not low-M", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"low_m_backend": "cublaslt"}, v2=True)], "low_m_backend"),
    ("table low-M backend not the profile's", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"low_m_backend": "cute-dsl"}, v2=True)], "profile's"),
    ("fit --out-file a shipped table", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--out-file",
                                             str(ROOT / "dispatch" / "thresholds" / "h200.json")], "--install"),
    ("noise --out-file a shipped floor", lambda t: ["calibrate", "noise", str(SWEEP), str(LEAN), "--gpu", "h200", "--out-file",
                                               str(ROOT / "calibrate" / "noise" / "h200.json")], "--install"),
    ("fit --out-file empty", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--out-file", ""], "empty"),
    ("table --stop-after no leg", lambda t: ["tables", "--gpu", "h200", "--run-id", "x", "--stop-after",
                                             "lunch"], "no leg"),
    ("table --model empty", lambda t: ["tables", "--gpu", "h200", "--model", "", "--dry-run"],
     "--model is empty"),
    ("table --model unknown", lambda t: ["tables", "--gpu", "h200", "--model", "Qwen9", "--dry-run"],
     "unknown model"),
    ("table --install with --layout", lambda t: ["tables", "--gpu", "h200", "--run-id", "x", "--install",
                                                 "--layout", "transformers"], "run's own scope"),
    ("bench run --table missing", lambda t: ["bench", "run", "--gpu", "h200", "--table", str(t / "none.json"),
                                             "--dry-run"], "not found"),
    ("bench run --tune with --no-tune", lambda t: ["bench", "run", "--gpu", "h200", "--tune", "--no-tune",
                                                   "--dry-run"], "--tune contradicts"),
    ("bench run --replay-us 0", lambda t: ["bench", "run", "--gpu", "h200", "--replay-us", "0", "--dry-run"],
     "--replay-us: 0 is outside"),
    ("bench run --host-rounds 0", lambda t: ["bench", "run", "--gpu", "h200", "--host-rounds", "0", "--dry-run"],
     "--host-rounds: 0 is outside"),
    ("bench forward --tune with --autotune-cache", lambda t: ["bench", "forward", "--gpu", "h200", "--tune",
                                                              "--autotune-cache", str(t / "none.json")],
     "--tune contradicts"),
    ("bench run --cells without M", lambda t: ["bench", "run", "--gpu", "h200", "--cells", "n256_k2048", "--dry-run"],
     "has no M values"),
    ("bench run --cells with --m", lambda t: ["bench", "run", "--gpu", "h200", "--cells", "n256_k2048:80", "--m", "8",
                                              "--dry-run"], "leave out --m"),
    ("bench run --cells a shape twice", lambda t: ["bench", "run", "--gpu", "h200", "--cells",
                                                   "n256_k2048:80;256x2048:96", "--dry-run"], "twice"),
    ("bench run --cells two shapes in one entry", lambda t: ["bench", "run", "--gpu", "h200", "--cells",
                                                             "n256_k2048,n1024_k2048:80", "--dry-run"], "several shapes"),
    ("bench run --cells no shape", lambda t: ["bench", "run", "--gpu", "h200", "--cells", ":80", "--dry-run"],
     "no shape"),
    ("bench run --cells unknown shape", lambda t: ["bench", "run", "--gpu", "h200", "--cells", "n3_k5:8", "--dry-run"],
     "not in the catalog"),
    ("bench run --cells @missing", lambda t: ["bench", "run", "--gpu", "h200", "--cells", f"@{t / 'none.txt'}",
                                              "--dry-run"], "not found"),
    ("fit --add the same run", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--add", str(SWEEP),
                                          "--out-file", str(t / "t.json")], "the same run"),
    ("fit --add a run of other tactics", lambda t: ["calibrate", "fit", str(LEAN), "--gpu", "h200", "--add", run_folder(
        t, source=LEAN, edit_info=lambda i: i["autotune_cache"].update(sha256="0" * 64)), "--out-file", str(t / "t.json")],
     "did not serve"),
    ("fit --machine the same run", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--method", "segments",
                                              "--machine", str(SWEEP), "--out-file", str(t / "t.json")], "the same run"),
    ("fit --machine missing", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--method", "segments",
                                         "--machine", str(t / "none"), "--out-file", str(t / "t.json")], "not found"),
    ("fit --machine of other tactics", lambda t: ["calibrate", "fit", str(LEAN), "--gpu", "h200", "--method",
                                                  "segments", "--machine", run_folder(
        t, source=LEAN, edit_info=lambda i: i["autotune_cache"].update(sha256="0" * 64)), "--out-file", str(t / "t.json")],
     "did not serve"),
    ("fit --machine without segments", lambda t: ["calibrate", "fit", str(LEAN), "--gpu", "h200", "--method", "rules",
                                                  "--machine", run_folder(t, source=LEAN), "--out-file", str(t / "t.json")],
     "needs --method segments"),
    ("table --refit without --run-id", lambda t: ["tables", "--gpu", "h200", "--refit"], "name a run"),
    ("table --refit a run never run", lambda t: ["tables", "--gpu", "h200", "--run-id", "no-such-run-7",
                                                 "--refit"], "run it first"),
    ("table --refit with --install", lambda t: ["tables", "--gpu", "h200", "--run-id", "x", "--refit",
                                                "--install"], "installs nothing"),
    ("table --rejudge without --run-id", lambda t: ["tables", "--gpu", "h200", "--rejudge"], "name a run"),
    ("table --rejudge with --refit", lambda t: ["tables", "--gpu", "h200", "--run-id", "x", "--rejudge", "--refit"],
     "drop --rejudge"),
    ("table --rejudge a run never run", lambda t: ["tables", "--gpu", "h200", "--run-id", "no-such-run-7",
                                                   "--rejudge"], "run it first"),
    ("table --machines 0", lambda t: ["tables", "--gpu", "h200", "--machines", "0", "--dry-run"],
     "--machines"),
    ("table --machines 9", lambda t: ["tables", "--gpu", "h200", "--machines", "9", "--dry-run"],
     "--machines"),
    ("fit --plan-refine a device", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--out-file",
                                              str(t / "t.json"), "--plan-refine", os.devnull], "not a regular file"),
    ("validate --csv a FIFO", lambda t: (os.mkfifo(t / "f"), ["calibrate", "validate", str(SWEEP), "--csv", str(t / "f")])[1],
     "not a regular file"),
    ("validate --csv a device", lambda t: ["calibrate", "validate", str(SWEEP), "--csv", os.devnull], "not a regular file"),
    ("noise one run twice", lambda t: ["calibrate", "noise", str(SWEEP), str(SWEEP) + "/", "--gpu", "h200", "--out-file",
                                       str(t / "n.json")], "the same run"),
    ("forward-noise one run twice", lambda t: ["calibrate", "forward-noise", str(FORWARD), str(FORWARD), "--gpu", "h200",
                                               "--out-file", str(t / "n.json")], "the same run"),
    ("baseline --from one run twice", lambda t: ["calibrate", "baseline", "--gpu", "h200", "--from", str(SWEEP),
                                                 str(SWEEP), "--out-file", str(t / "b.json")], "the same run"),
    ("validate --replicate itself", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--replicate", str(LEAN)],
     "the same run"),
    ("agree a run with itself", lambda t: ["calibrate", "agree", str(SWEEP), str(SWEEP)], "the same run"),
    ("compare a run with itself", lambda t: ["calibrate", "compare", str(SWEEP), str(SWEEP)], "the same run"),
    ("compare with a margin of 2", lambda t: ["calibrate", "compare", str(SWEEP), str(t / "x"), "--margin", "2"],
     "--margin"),
    ("compare a run that is not there", lambda t: ["calibrate", "compare", str(SWEEP), str(t / "none")], "none"),
    ("agree runs of two GPUs", lambda t: ["calibrate", "agree", str(SWEEP), run_folder(
        t, edit_info=lambda i: i["fingerprint"].update(gpu_name="NVIDIA H100 80GB HBM3"))], "different GPUs"),
    ("fit --hold-out every M", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--out-file", str(t / "t.json"),
                                          "--hold-out", ",".join(map(str, json.loads((SWEEP / "run.json").read_text())["ms"]))],
     "hold out fewer"),
    ("fit beside someone's tactics file", lambda t: ((t / "t.autotune.json").write_text("{}"),
                                                     ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--out-file",
                                                      str(t / "t.json")])[1], "would be replaced"),
    ("merge into a folder with a run.json", lambda t: ((t / "m").mkdir(), (t / "m" / "run.json").write_text("{}"),
                                                       ["bench", "merge", str(SHARD), "--out", str(t / "m")])[2],
     "not empty"),
    ("merge a binary shard", lambda t: (shutil.copytree(SHARD, t / "s"), (t / "s" / "results.csv").write_bytes(
        b"\xad\xff" * 500), ["bench", "merge", str(t / "s"), "--out", str(t / "m")])[2], "not a text table"),
    ("bench --paths twice", lambda t: ["bench", "run", "--gpu", "h200", "--paths", "aten,aten", "--dry-run"],
     "more than once"),
    ("forward --paths twice", lambda t: ["bench", "forward", "--gpu", "h200", "--paths", "aten,aten"], "more than once"),
    ("dry run with --devices x,y", lambda t: ["bench", "run", "--gpu", "h200", "--devices", "x,y", "--dry-run"],
     "GPU indices"),
    ("dry run with --devices -1", lambda t: ["bench", "run", "--gpu", "h200", "--devices", "-1", "--dry-run"],
     "distinct and below"),
    ("dry run with a non-JSON tactics file", lambda t: ((t / "c.json").write_text("nope"),
                                                        ["bench", "run", "--gpu", "h200", "--autotune-cache",
                                                         str(t / "c.json"), "--dry-run"])[1], "not valid JSON"),
    ("dry run with a list tactics file", lambda t: ((t / "c.json").write_text("[1, 2]"),
                                                    ["bench", "run", "--gpu", "h200", "--autotune-cache",
                                                     str(t / "c.json"), "--dry-run"])[1], "autotuner cache"),
    ("dry run resuming a garbage results.csv", lambda t: ((t / "o").mkdir(), (t / "o" / "results.csv").write_text("x\n1\n"),
                                                          ["bench", "run", "--gpu", "h200", "--resume", "--out",
                                                           str(t / "o"), "--dry-run"])[2], "not a results table"),
    ("report of two GPUs' runs", lambda t: ["reports", "build", str(SWEEP), run_folder(
        t, edit_info=lambda i: i["fingerprint"].update(gpu_name="NVIDIA H100 80GB HBM3")), "-o", str(t / "r.html")],
     "allow-mismatch"),
    ("report with another GPU's forward", lambda t: ["reports", "build", str(SWEEP), "--forward", run_folder(
        t, source=FORWARD, edit_info=lambda i: i["fingerprint"].update(gpu_name="NVIDIA B200")), "-o", str(t / "r.html")],
     "allow-mismatch"),
    ("report with one forward twice", lambda t: ["reports", "build", str(SWEEP), "--forward", str(FORWARD), str(FORWARD),
                                                 "-o", str(t / "r.html")], "the same run"),
    ("report with another GPU's baseline", lambda t: ["reports", "build", str(SWEEP), "--baseline", baseline(
        t, lambda d: d.update(profile="h100")), "-o", str(t / "r.html")], "h100 baseline"),
    # threshold tables
    ("thresholds not UTF-8", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(t, raw=NOT_UTF8)], "not UTF-8"),
    ("thresholds not JSON", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(t, raw=b"{")], "not valid JSON"),
    ("thresholds a list", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(t, raw=b"[]")], "JSON object"),
    ("thresholds unknown backend", lambda t: ["calibrate", "validate", str(SWEEP), "--table",
                                              thresholds(t, {"low_m_backend": "tinygem"})], "not a FlashInfer backend"),
    ("thresholds negative", lambda t: ["calibrate", "validate", str(SWEEP), "--table",
                                       thresholds(t, {"default_threshold": -1})], ">= 0"),
    ("thresholds above M max", lambda t: ["calibrate", "validate", str(SWEEP), "--table",
                                          thresholds(t, {"default_threshold": 10 ** 9})], "<= 16384"),
    ("thresholds malformed override", lambda t: ["calibrate", "validate", str(SWEEP), "--table",
                                                 thresholds(t, {"overrides": [{"n": 1}]})], "malformed"),
    ("thresholds missing", lambda t: ["calibrate", "validate", str(SWEEP), "--table", str(t / "none.json")], "not found"),
    ("merge a folder that is no shard", lambda t: ["bench", "merge", str(t), "--out", str(t / "m")], "has no results.csv"),
    ("merge into a folder with results", lambda t: ["bench", "merge", str(SWEEP), "--out", str(SWEEP)], "not empty"),
    ("merge a shard with a NaN time", lambda t: ["bench", "merge", run_folder(t, set_cell("gpu_us", "nan"), source=SHARD),
                                                 "--out", str(t / "m")], "gpu_us"),
    ("merge a shard whose table is cut", lambda t: ["bench", "merge", run_folder(t, csv_text=lambda s: s + '"cut',
                                                                                    source=SHARD), "--out", str(t / "m")],
     "cannot read its results.csv"),
    ("shard out of range", lambda t: ["bench", "run", "--gpu", "h200", "--shard", "5/4", "--dry-run"], "--shard"),
    ("shard and devices together", lambda t: ["bench", "run", "--gpu", "h200", "--shard", "1/2", "--devices", "all",
                                              "--dry-run"], "pass one of them"),
    ("full grid with --m", lambda t: ["bench", "run", "--gpu", "h200", "--grid", "full", "--m", "1", "--dry-run"],
     "leave out --m"),
    ("concurrent host timing on one GPU", lambda t: ["bench", "run", "--gpu", "h200", "--host-timing", "concurrent",
                                                     "--dry-run"], "pass --devices too"),
    ("thresholds v2 unknown path", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"default": {"graph": [{"up_to": 8, "path": "flashinfer-lean:tinygem"}], "eager": []}}, v2=True)],
     "not one the dispatcher can run"),
    ("thresholds v2 without eager", lambda t: ["calibrate", "validate", str(SWEEP), "--table", thresholds(
        t, {"default": {"graph": []}}, v2=True)], "lacks the eager regime"),
    ("thresholds v2 on a run without its paths", lambda t: ["calibrate", "validate", str(SWEEP), "--table",
                                                            thresholds(t, v2=True)], "did not measure"),
    # baselines
    ("baseline not UTF-8", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                      baseline(t, raw=NOT_UTF8)], "not UTF-8"),
    ("baseline bound text", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                       baseline(t, first_cell("gpu_ratio_hi", "high"))], "gpu_ratio_hi"),
    ("baseline bound NaN", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                      baseline(t, first_cell("gpu_ratio_lo", float("nan")))], "gpu_ratio_lo"),
    ("baseline ratio outside its bounds", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                                     baseline(t, first_cell("gpu_ratio_lo", 50.0))], "outside"),
    ("baseline M text", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                   baseline(t, first_cell("m", "8"))], "positive integer"),
    ("baseline tolerance NaN", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                          baseline(t, lambda d: d.update(tolerance=float("nan")))], "tolerance"),
    ("baseline cell twice", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                       baseline(t, lambda d: d["cells"].append(d["cells"][0]))], "twice"),
    ("baseline of another profile", lambda t: ["calibrate", "regress", "--gpu", "h100", "--from", str(SWEEP), "--baseline",
                                               baseline(t)], "is for h200"),
    ("baseline of another fingerprint", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                                   baseline(t, lambda d: d["fingerprint"].update(torch="2.0.0"))],
     "another environment"),
    ("baseline missing", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline",
                                    str(t / "none.json")], "no baseline"),
    # CLI numbers
    ("validate margin NaN", lambda t: ["calibrate", "validate", str(SWEEP), "--margin", "nan"], "outside 0..0.5"),
    ("validate margin negative", lambda t: ["calibrate", "validate", str(SWEEP), "--margin", "-0.1"], "outside 0..0.5"),
    ("validate margin text", lambda t: ["calibrate", "validate", str(SWEEP), "--margin", "lots"], "not a number"),
    ("regress tolerance NaN", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--tolerance", "nan"],
     "outside 0..1"),
    ("regress tolerance negative", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(SWEEP), "--tolerance", "-1"],
     "outside 0..1"),
    ("fit min-gain 2", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--min-gain", "2"], "outside 0..1"),
    ("host-cost calls 5", lambda t: ["calibrate", "host-cost", "--gpu", "h200", "--calls", "5"], "outside 100..1000000"),
    ("baseline samples 0", lambda t: ["calibrate", "baseline", "--gpu", "h200", "--samples", "0"], "outside 3..1000"),
    ("bench samples 0", lambda t: ["bench", "run", "--gpu", "h200", "--samples", "0"], "outside 3..1000"),
    ("bench rotations 0", lambda t: ["bench", "run", "--gpu", "h200", "--max-rotations", "0"], "outside 1..4096"),
    ("bench TP 0", lambda t: ["bench", "run", "--gpu", "h200", "--tp", "0"], "outside 1..64"),
    ("anatomy calls 0", lambda t: ["bench", "host-anatomy", "--gpu", "h200", "--calls", "0"], "outside 1..100000"),
    ("anatomy rounds negative", lambda t: ["bench", "host-anatomy", "--gpu", "h200", "--rounds", "-1"], "outside 1..1000"),
    ("bench M above 16384", lambda t: ["bench", "run", "--gpu", "h200", "--m", "1,20000"], "1..16384"),
    ("bench M huge range", lambda t: ["bench", "run", "--gpu", "h200", "--m", "1:1000000000:1"], "1..16384"),
    ("bench M grid too large", lambda t: ["bench", "run", "--gpu", "h200", "--m", "1:16384:1"], "more than 1024"),
    ("bench M zero", lambda t: ["bench", "run", "--gpu", "h200", "--m", "0"], "1..16384"),
    ("bench M comma", lambda t: ["bench", "run", "--gpu", "h200", "--m", ","], "names no M"),
    ("bench shapes comma", lambda t: ["bench", "run", "--gpu", "h200", "--shapes", ","], "names no shape"),
    ("bench paths comma", lambda t: ["bench", "run", "--gpu", "h200", "--paths", ","], "names no path"),
    ("bench unknown path", lambda t: ["bench", "run", "--gpu", "h200", "--paths", "aten,fast"], "unknown path"),
    ("bench unknown shape", lambda t: ["bench", "run", "--gpu", "h200", "--shapes", "n1_k1"], "not in the catalog"),
    ("bench unknown profile", lambda t: ["bench", "run", "--gpu", "nosuchgpu"], "unknown GPU profile 'nosuchgpu'"),
    ("bench profiles unknown", lambda t: ["bench", "profiles", "nosuchgpu"], "unknown GPU profile"),
    ("bench without --gpu", lambda t: ["bench", "run"], "required: --gpu"),
    ("dispatch unknown command", lambda t: ["calibrate", "judge"], "invalid choice"),
    # output paths
    ("validate --csv a folder", lambda t: ["calibrate", "validate", str(SWEEP), "--csv", str(t)], "is a folder"),
    ("fit --out-file a folder", lambda t: ["calibrate", "fit", str(SWEEP), "--gpu", "h200", "--out-file", str(t)], "is a folder"),
    ("report -o a folder", lambda t: ["reports", "build", str(SWEEP), "-o", str(t)], "is a folder"),
    ("baseline --out-file a folder", lambda t: ["calibrate", "baseline", "--gpu", "h200", "--from", str(SWEEP),
                                           "--out-file", str(t)], "is a folder"),
    ("host-cost --out-file a folder", lambda t: ["calibrate", "host-cost", "--gpu", "h200", "--out-file", str(t)], "is a folder"),
    ("bench --out an existing file", lambda t: ["bench", "run", "--gpu", "h200", "--out", user_folder(t) + "/notes.txt"],
     "is a file"),
    ("anatomy --out an existing file", lambda t: ["bench", "host-anatomy", "--gpu", "h200", "--out",
                                                  user_folder(t) + "/notes.txt"], "is a file"),
    ("bench --autotune-cache a folder", lambda t: ["bench", "run", "--gpu", "h200", "--autotune-cache", str(t)], "is a folder"),
    ("bench --autotune-cache missing", lambda t: ["bench", "run", "--gpu", "h200", "--autotune-cache",
                                                  str(t / "none.json")], "no such file"),
    ("bench serve and save tactics", lambda t: ["bench", "run", "--gpu", "h200", "--autotune-cache",
                                                str(DATA / "h200-lean-fit" / "autotune-cache.json"), "--save-autotune-cache",
                                                str(t / "x.json")], "pass one of them"),
    ("bench --save-autotune-cache a folder", lambda t: ["bench", "run", "--gpu", "h200", "--save-autotune-cache",
                                                        str(t)], "is a folder"),
    ("report under a file", lambda t: ["reports", "build", str(SWEEP), "-o", user_folder(t) + "/notes.txt/r.html"], "is a file"),
    # measured forwards and L2 states
    ("forward layers 0", lambda t: ["bench", "forward", "--gpu", "h200", "--layers", "0"], "outside 1..1000"),
    ("forward unknown model", lambda t: ["bench", "forward", "--gpu", "h200", "--model", "llama"], "unknown model"),
    ("forward model and config", lambda t: ["bench", "forward", "--gpu", "h200", "--model", "Qwen3.5-4B", "--config",
                                            config(t)], "exclude each other"),
    ("forward bad config", lambda t: ["bench", "forward", "--gpu", "h200", "--config",
                                      config(t, {"hidden_size": 0})], "hidden_size is 0"),
    ("forward unknown path", lambda t: ["bench", "forward", "--gpu", "h200", "--paths", "aten,fast"], "unknown forward path"),
    ("forward paths comma", lambda t: ["bench", "forward", "--gpu", "h200", "--paths", ","], "names no path"),
    ("forward M above 16384", lambda t: ["bench", "forward", "--gpu", "h200", "--m", "32768"], "1..16384"),
    ("forward --out an existing file", lambda t: ["bench", "forward", "--gpu", "h200", "--out",
                                                  user_folder(t) + "/notes.txt"], "is a file"),
    ("forward, no GPU", lambda t: ["bench", "forward", "--gpu", "h200", "--out", str(t / "out")], "no CUDA GPU"),
    ("forward --table of another GPU", lambda t: ["bench", "forward", "--gpu", "h200", "--table", table_for(t, "h100")],
     "a table for h100, not h200"),
    ("forward --table missing", lambda t: ["bench", "forward", "--gpu", "h200", "--table", str(t / "gone.json")],
     "gone.json"),
    ("forward --skip-slower 1", lambda t: ["bench", "forward", "--gpu", "h200", "--skip-slower", "1"], "outside"),
    ("forward --settle-ms negative", lambda t: ["bench", "forward", "--gpu", "h200", "--settle-ms", "-5"], "outside"),
    ("forward --sustain-ms resumed", lambda t: ["bench", "forward", "--gpu", "h200", "--sustain-ms", "500",
                                                "--resume", "--out", str(t / "out")], "cannot be resumed"),
    ("validate --forward a sweep", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--forward", str(SWEEP)],
     "forward.csv not found"),
    ("validate --forward of another kind", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--forward", run_folder(
        t, source=DATA / "h200-forward", edit_info=lambda i: {**i, "kind": "host-anatomy"})], "not a forward run"),
    ("validate --forward NaN time", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--forward", run_folder(
        t, source=DATA / "h200-forward", edit_rows=lambda df: df.assign(us=df["us"].where(df.index != 0, "nan")))],
     "NaN"),
    ("validate --forward missing", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--forward", str(t / "none")], "not found"),
    ("validate --forward cut", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--forward",
                                          run_folder(t, csv_text=lambda s: "\n".join(s.splitlines()[:9]) + "\n",
                                                     source=DATA / "h200-forward")], "rows missing"),
    ("l2 modes swapped", lambda t: ["calibrate", "l2", "--rotate",
                                    run_folder(t, edit_info=lambda i: i.update(l2="flush")), "--flush", str(SWEEP),
                                    "--warm", str(LEAN)], "swept with --l2 flush"),
    ("l2 within 2", lambda t: ["calibrate", "l2", "--rotate", "a", "--flush", "b", "--warm", "c", "--within", "2"],
     "outside 0..1"),
    ("bench unknown L2 mode", lambda t: ["bench", "run", "--gpu", "h200", "--l2", "cold"], "invalid choice"),
    # folders the harness did not create
    ("baseline --work a user folder, no GPU", lambda t: ["calibrate", "baseline", "--gpu", "h200", "--work", user_folder(t)],
     "no CUDA GPU"),
    ("baseline --runs 0", lambda t: ["calibrate", "baseline", "--gpu", "h200", "--work", user_folder(t), "--runs", "0"],
     "outside 1..20"),
    ("regress --work a user folder, no GPU", lambda t: ["calibrate", "regress", "--gpu", "h200", "--work",
                                                       user_folder(t, inner="fresh/kept.csv")], "no CUDA GPU"),
    ("bench run, no GPU", lambda t: ["bench", "run", "--gpu", "h200", "--out", str(t / "out")], "no CUDA GPU"),
    ("host-anatomy, no GPU", lambda t: ["bench", "host-anatomy", "--gpu", "h200", "--out", str(t / "out")], "no CUDA GPU"),
    # readers that vouch: every kind of input file, read whole and bounded
    ("results M beyond the grid", lambda t: ["calibrate", "validate", run_folder(t, set_cell("m", "1000000000000"))],
     "above 16384"),
    ("results csv and parquet disagree", lambda t: ["calibrate", "validate", _with_parquet(t, 3.0)], "disagree"),
    ("results of another layout than the table", lambda t: ["calibrate", "validate", run_folder(
        t, edit_info=lambda i: {**i, "layout": "transformers"}, source=LEAN), "--table", str(LEAN_TABLE)],
     "measured transformers's layout"),
    ("baseline band of no width limit", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(LEAN),
                                                  "--baseline", baseline(t, _wide_band)], "can fail nothing"),
    ("baseline nested a million deep", lambda t: ["calibrate", "regress", "--gpu", "h200", "--from", str(LEAN),
                                                 "--baseline", baseline(t, raw=b"[" * 10 ** 6)], "nests deeper"),
    ("run.json nested deeply", lambda t: ["calibrate", "validate", run_folder(
        t, edit_info=lambda i: b'{"a": ' * 5000 + b"1" + b"}" * 5000)], "nests deeper"),
    ("--cells @/dev/zero", lambda t: ["bench", "run", "--gpu", "h200", "--cells", "@/dev/zero", "--dry-run"],
     "not a regular file"),
    ("--cells @FIFO", lambda t: ["bench", "run", "--gpu", "h200", "--cells", f"@{_fifo(t)}", "--dry-run"],
     "not a regular file"),
    ("report -o a symlink to the README", lambda t: ["reports", "build", str(LEAN), "-o", _link(t, ROOT / "README.md")],
     "a file of the project's own"),
    ("validate --csv a folder with a trailing slash", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--csv",
                                                                  str(t / "new") + "/"], "names a folder"),
    ("fit --install of a transformers-layout sweep", lambda t: ["calibrate", "fit", run_folder(
        t, edit_info=lambda i: {**i, "layout": "transformers"}, source=LEAN), "--gpu", "h200", "--install"],
     "measured transformers's layout; the shipped h200 table covers"),
    ("run.json of a newer format", lambda t: ["calibrate", "validate", run_folder(t, edit_info=lambda i: {**i, "format": 99})],
     "format 99 is not one this harness reads"),
    ("e2e file empty", lambda t: ["calibrate", "e2e", _e2e_folder(t, b"")], "not a table bench e2e wrote"),
    ("e2e file binary", lambda t: ["calibrate", "e2e", _e2e_folder(t, bytes(range(256)) * 4)], "not UTF-8"),
    ("e2e rows twice", lambda t: ["calibrate", "e2e", _e2e_folder(t, _e2e_rows_twice())], "listed more than once"),
    ("tables --resume of a run never started", lambda t: ["tables", "--gpu", "h200", "--run-id", "no-such-run-9",
                                                          "--resume"], "no table run to resume there"),
    ("fit of a run whose GEMV file is truncated", lambda t: ["calibrate", "fit", _run_with_gemv(t, lambda g: g[:100]),
                                                             "--gpu", "h200", "--out-file", str(t / "table.json")],
     "not valid JSON"),
    ("calibrate table, moved", lambda t: ["calibrate", "table", "--gpu", "h200", "--dry-run"],
     "is now python -m tables"),
    # round four: GEMV files are read wherever they are named, dry runs included
    ("dry run, --autotune-cache with a truncated GEMV file", lambda t: _tactics_with_gemv(t, lambda g: g[:200]),
     "not valid JSON"),
    ("dry run, --autotune-cache with a GEMV file at M = 17", lambda t: _tactics_with_gemv(
        t, lambda g: g.replace('"m": 1,', '"m": 17,', 1)), "not one the GEMV takes"),
    ("dry run, --autotune-cache with a GEMV format true", lambda t: _tactics_with_gemv(
        t, lambda g: g.replace('"format": 1', '"format": true', 1)), "format True is not one this harness reads"),
    ("dry run, --autotune-cache with a GEMV cell twice", lambda t: _tactics_with_gemv(
        t, lambda g: g.replace('"configs": [', '"configs": [' + _first_gemv_entry() + ",", 1)), "a second one"),
    ("dry run, --table whose GEMV file is truncated", lambda t: _table_with_gemv(t, lambda g: g[:200]),
     "sha256 differs"),
    ("dry run, --table whose GEMV file is gone", lambda t: _table_with_gemv(t, None), "which is missing"),
    # round four: outputs never onto the project's own files
    ("compare --out-file README.md", lambda t: ["calibrate", "compare", str(LEAN), run_folder(t, source=LEAN),
                                                "--out-file", str(ROOT / "README.md")], "a file of the project's own"),
    ("validate --csv README.md", lambda t: ["calibrate", "validate", str(LEAN), "--table", str(LEAN_TABLE), "--csv",
                                            str(ROOT / "README.md")], "a file of the project's own"),
    ("report -o docs/cli.md", lambda t: ["reports", "build", str(LEAN), "-o", str(ROOT / "docs" / "cli.md")],
     "a file of the project's own"),
    ("report -o .git/HEAD", lambda t: ["reports", "build", str(LEAN), "-o", str(ROOT / ".git" / "HEAD")],
     "a file of the project's own"),
    ("fit --out-file .git/config", lambda t: ["calibrate", "fit", str(LEAN), "--gpu", "h200", "--out-file",
                                              str(ROOT / ".git" / "config")], "a file of the project's own"),
    ("bench run --out into a package", lambda t: ["bench", "run", "--gpu", "h200", "--out", str(ROOT / "dispatch"),
                                                  "--dry-run"], "inside the project's own files"),
    # round four: empty strings never mean the default
    ("bench run --shapes empty", lambda t: ["bench", "run", "--gpu", "h200", "--shapes", "", "--dry-run"],
     "--shapes is empty"),
    ("bench run --table empty", lambda t: ["bench", "run", "--gpu", "h200", "--table", "", "--dry-run"],
     "is empty"),
    ("bench run --out empty", lambda t: ["bench", "run", "--gpu", "h200", "--out", "", "--dry-run"],
     "--out is empty"),
]


def _first_gemv_entry() -> str:
    return json.dumps(json.loads((ROOT / "dispatch" / "thresholds" / "h200.autotune.gemv.json").read_text())[
        "configs"][0])


def _tactics_with_gemv(t: Path, edit) -> list[str]:
    """A dry run serving a copy of the shipped tactics whose GEMV file beside it is edited."""
    shipped = ROOT / "dispatch" / "thresholds"
    shutil.copy(shipped / "h200.autotune.json", t / "c.json")
    (t / "c.gemv.json").write_text(edit((shipped / "h200.autotune.gemv.json").read_text()))
    return ["bench", "run", "--gpu", "h200", "--autotune-cache", str(t / "c.json"), "--dry-run"]


def _table_with_gemv(t: Path, edit) -> list[str]:
    """A dry run with --table: a copy of the shipped table and its files, the GEMV file edited (None: removed)."""
    shipped = ROOT / "dispatch" / "thresholds"
    for name in ("h200.json", "h200.autotune.json", "h200.autotune.gemv.json"):
        shutil.copy(shipped / name, t / name)
    if edit is None:
        (t / "h200.autotune.gemv.json").unlink()
    else:
        (t / "h200.autotune.gemv.json").write_text(edit((t / "h200.autotune.gemv.json").read_text()))
    return ["bench", "run", "--gpu", "h200", "--table", str(t / "h200.json"), "--dry-run"]


def _with_parquet(t: Path, factor: float) -> str:
    """A copy of a run whose results.parquet says one cell took `factor` times what results.csv says."""
    from bench.results import read_csv_table
    d = run_folder(t, source=LEAN)
    df = read_csv_table(Path(d) / "results.csv")
    ok = df.index[df["status"] == "ok"][0]
    for col in ("gpu_us", "gpu_us_p20", "gpu_us_p80"):
        df.loc[ok, col] *= factor
    pytest.importorskip("pyarrow")
    df.to_parquet(Path(d) / "results.parquet", index=False)
    return d


def _wide_band(data: dict) -> None:
    for cell in data["cells"]:
        cell.update(gpu_ratio_lo=1e-9, gpu_ratio_hi=1e9)


def _fifo(t: Path) -> Path:
    os.mkfifo(t / "cells.fifo")
    return t / "cells.fifo"


def _link(t: Path, target: Path) -> str:
    (t / "link.html").symlink_to(target)
    return str(t / "link.html")


def _run_with_gemv(t: Path, edit) -> str:
    """A copy of a committed sweep that kept GEMV configurations beside its tactics, those edited."""
    d = Path(run_folder(t, source=LEAN))
    shipped = ROOT / "dispatch" / "thresholds"
    shutil.copy(shipped / "h200.autotune.json", d / "autotune-cache.json")
    (d / "autotune-cache.gemv.json").write_text(edit((shipped / "h200.autotune.gemv.json").read_text()))
    return str(d)


def _e2e_rows_twice() -> bytes:
    text = (ROOT / "evidence" / "h200-e2e-20261202T0449-6175bb" / "e2e.csv").read_bytes()
    return text + b"".join(text.splitlines(keepends=True)[1:])


def _e2e_folder(t: Path, csv: bytes) -> str:
    src = ROOT / "evidence" / "h200-e2e-20261202T0449-6175bb"
    d = t / "e2e"
    d.mkdir()
    shutil.copy(src / "run.json", d / "run.json")
    (d / "e2e.csv").write_bytes(csv)
    return str(d)


def _no_gpu() -> bool:
    import torch
    return not torch.cuda.is_available()


@pytest.mark.parametrize("setup, needle", [pytest.param(s, n, id=i) for i, s, n in CASES])
def test_bad_input_is_one_line_and_changes_nothing(setup, needle, tmp_path, capsys):
    argv = setup(tmp_path)
    if "no CUDA GPU" in needle and not _no_gpu():
        pytest.skip("this machine has a GPU")
    prog, *args = argv
    # beside every case's outputs: a file, a FIFO and a symlink that nothing may touch
    planted = tmp_path / "planted"
    planted.mkdir(exist_ok=True)
    (planted / "sentinel.txt").write_text("the user's\n")
    os.mkfifo(planted / "fifo")
    (planted / "link").symlink_to(planted / "sentinel.txt")
    before = snapshot(tmp_path, *WATCHED)
    code = run_cli(_mains()[prog], prog, args)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, err)
    assert "Traceback" not in captured.err + captured.out
    *notes, last = err.splitlines()
    assert last.startswith(f"{prog}: error: ") and all(n.startswith("note (--partial)") for n in notes), err
    assert re.search(needle, last), err
    assert snapshot(tmp_path, *WATCHED) == before, "a file changed"
    assert (planted / "fifo").is_fifo() and (planted / "link").is_symlink()


def test_the_table_covers_at_least_a_hundred_cases():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)


# ---------------------------------------------------------------- beyond one command line
def test_allow_mismatch_and_partial_let_the_user_judge_anyway(tmp_path, capsys):
    from calibrate.__main__ import main
    b = baseline(tmp_path, lambda d: d["fingerprint"].update(torch="2.0.0"))
    assert main(["regress", "--gpu", "h200", "--from", str(SWEEP), "--baseline", b, "--allow-mismatch"]) in (0, 1)
    assert "fingerprint differs" in capsys.readouterr().out
    cut = run_folder(tmp_path, lambda df: df[df["m"].astype(int) <= 64], source=LEAN)
    assert main(["validate", cut, "--partial", "--table", str(LEAN_TABLE)]) in (0, 1)
    assert "--partial" in capsys.readouterr().err


def test_regress_on_a_users_sweep_lists_the_cells_it_skipped_and_fails_a_slow_one(tmp_path, capsys):
    """A user's sweep may skip baseline cells by design (a reason recorded): they are listed, not failed. A cell 3x
    slower than its band fails."""
    from calibrate.__main__ import main
    base = str(tmp_path / "b.json")
    assert main(["baseline", "--gpu", "h200", "--from", str(LEAN), "--out-file", base]) == 0

    def edit(how):
        def rows(df):
            cell = df.index[(df["status"] == "ok") & (df["path"] == "flashinfer:tinygemm") & (df["m"] == "64")][0]
            if how == "skip":
                df.loc[cell, ["status", "reason"]] = ["skipped", "hopeless: 12x F.linear at a smaller M"]
                df.loc[cell, ["gpu_us", "gpu_us_p20", "gpu_us_p80", "gpu_samples_us"]] = ""
            else:  # every time of the cell 3x (a pdl cell is timed by its span)
                for col in ("gpu_us", "gpu_us_p20", "gpu_us_p80", "span_us", "gpu_samples_us", "span_samples_us"):
                    if col in df.columns and df.loc[cell, col]:
                        df.loc[cell, col] = ";".join(str(3 * float(v)) for v in df.loc[cell, col].split(";"))
            return df
        return rows
    (tmp_path / "a").mkdir()
    skipped = run_folder(tmp_path / "a", edit("skip"), source=LEAN)
    assert main(["regress", "--gpu", "h200", "--from", skipped, "--baseline", base]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\d+ cells judged, 0 outside the band; 1 left out by the run", out)
    assert "skipped by the run: hopeless" in out and out.rstrip().endswith("PASS")
    (tmp_path / "b").mkdir()
    slow = run_folder(tmp_path / "b", edit("slow"), source=LEAN)
    assert main(["regress", "--gpu", "h200", "--from", slow, "--baseline", base]) == 1
    assert "1 outside the band" in capsys.readouterr().out


def test_a_table_runs_manifest_of_wrong_types_is_one_line(tmp_path):
    from tables.manifest import MANIFEST, read_manifest
    from harness.errors import HarnessError
    base = json.loads((ROOT / "tests" / "data" / "h200-table-run-manifest" / MANIFEST).read_text())
    for edit, needle in (({"fit_machines": 10 ** 9}, "outside 1..8"), ({"refits": "none"}, "not a list of refits"),
                         ({"legs": {"sweep": 3}}, "not an object with a status"), ({"scope": {"models": 5}}, "scope"),
                         ({"fit_machines": True}, "not an integer")):
        (tmp_path / MANIFEST).write_text(json.dumps({**base, **edit}))
        with pytest.raises(HarnessError, match=needle):
            read_manifest(tmp_path / MANIFEST)
    (tmp_path / MANIFEST).write_text("[" * 100000)
    with pytest.raises(HarnessError, match="nests deeper"):
        read_manifest(tmp_path / MANIFEST)


def test_a_forked_child_of_a_command_exits_quietly_on_a_signal():
    """A child forked from a command (a pool's worker) inherits its handlers; a signal there ends it with no
    traceback, while the command itself still gets its interrupt."""
    code = ("import os, signal, sys, time\n"
            "from harness.errors import raise_on_sigterm\n"
            "raise_on_sigterm()\n"
            "ready, tell = os.pipe()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.write(tell, b'1')  # past fork(): a signal that reached the child inside it would be dropped\n"
            "    time.sleep(30)\n"
            "    os._exit(0)\n"
            "os.read(ready, 1)\n"
            "os.kill(pid, signal.SIGTERM)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "print(os.waitstatus_to_exitcode(status))\n")
    r = _run([sys.executable, "-c", code])
    assert r.stdout.strip() == "143" and "Traceback" not in r.stderr, r.stderr


def test_report_builds_print_no_traceback_and_stop_on_ctrl_c_to_the_group(tmp_path):
    """The drawing workers leave signals to the parent: a finished build prints nothing of theirs, and Ctrl-C to the
    whole process group ends the build within seconds with 130 and one line."""
    import time

    import pandas as pd
    small = tmp_path / "small"  # two of the run's shapes: a build with workers, drawn in a few seconds
    small.mkdir()
    info = json.loads((LEAN / "run.json").read_text())
    info["shapes"] = info["shapes"][:2]
    (small / "run.json").write_text(json.dumps(info))
    df = pd.read_csv(LEAN / "results.csv")
    df[df["shape"].isin(info["shapes"])].to_csv(small / "results.csv", index=False)
    cmd = [sys.executable, "-m", "reports", "build", str(small), "-o", str(tmp_path / "r.html")]
    r = _run(cmd)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = tmp_path / "r.html"
    for delay in (0.5, 1.0, 1.5):  # while it imports, draws, writes (the build takes about 2 s here)
        out.unlink(missing_ok=True)
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=20)
        # 130 and one line; or, where the signal lands once the interpreter has begun to exit (it has put back the
        # default handler), the process ends by the signal itself (a shell shows 130), its page already written
        assert p.returncode in (0, 130, -signal.SIGINT) and "Traceback" not in err, err
        assert p.returncode != 130 or err.strip() == "reports: interrupted", err
        assert not out.exists() or out.read_text().rstrip().endswith("</html>")  # never half a page


def test_a_work_folder_is_cleared_only_when_the_harness_made_it(tmp_path):
    from harness.errors import HarnessError
    from harness.io import WORK_MARKER, claim_work_dir, clear_work_dir
    mine = Path(user_folder(tmp_path))
    with pytest.raises(HarnessError, match="not created by this harness"):
        claim_work_dir(mine, "--work")
    with pytest.raises(HarnessError, match="not removed"):
        clear_work_dir(mine)
    assert (mine / "notes.txt").read_text() == "the user's own file\n"
    work = claim_work_dir(tmp_path / "new" / "work", "--work")
    (work / "run-1").mkdir()
    assert (work / WORK_MARKER).is_file() and claim_work_dir(work, "--work") == work  # its own folder again
    clear_work_dir(work)
    assert not work.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_work_dir(empty, "--work") == empty  # nothing in it to lose


def test_outputs_get_the_users_umask(tmp_path):
    from harness.io import atomic_write_text
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("exc, code", [(KeyboardInterrupt, 130), ("Terminated", 143), (BrokenPipeError, 141)])
def test_interrupts_and_closed_pipes_exit_like_unix_tools(exc, code, capsys):
    from harness import errors

    def main(argv):
        raise (getattr(errors, exc) if isinstance(exc, str) else exc)()
    assert run_cli(main, "bench", []) == code
    assert "Traceback" not in capsys.readouterr().err


def _run(cmd: list[str] | str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120, **kw)


def test_piping_into_head_ends_quietly():
    r = _run(f"{sys.executable} -m shapes list --per-layer | head -2", shell=True)
    assert r.stdout.count("\n") == 2 and r.stderr == "", r.stderr


def test_sigterm_exits_143_without_a_traceback(tmp_path):
    code = ("import time, sys\nfrom harness.errors import run_cli\n"
            "def main(argv):\n    print('ready', flush=True)\n    time.sleep(30)\n"
            "sys.exit(run_cli(main, 'bench'))\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143 and err.strip() == "bench: interrupted", err


def test_ctrl_c_while_the_modules_import_is_one_line():
    """Ctrl-C lands while python -m calibrate's command line imports pandas (the signal sent from inside that import,
    so it cannot miss the imports: a plain timed signal lands after a fast --help's exit): one line, exit 130, no
    traceback."""
    code = ("import builtins, os, runpy, signal, sys, time\n"
            "real = builtins.__import__\n"
            "def imp(name, globals=None, *a, **k):\n"
            "    if name == 'pandas' and (globals or {}).get('__name__') == 'calibrate.cli':\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        time.sleep(10)\n"
            "    return real(name, globals, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "sys.argv = ['calibrate', '--help']\n"
            "runpy.run_module('calibrate', run_name='__main__', alter_sys=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 130 and p.stderr.strip() == "calibrate: interrupted" and p.stdout == "", p.stderr


def test_a_full_standard_output_is_one_line():
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "bench", "profiles"], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr.strip().startswith("bench: error: cannot write to standard output"), r.stderr


def test_native_build_folder_must_be_a_folder(tmp_path, monkeypatch, capsys):
    from dispatch.__main__ import main
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for folder, needle in (("file", "is a file"), ("loop", "symlink loop")):
        monkeypatch.setenv("BLB_NATIVE_DIR", str(tmp_path / folder))
        assert run_cli(main, "dispatch", ["build-native"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("dispatch: error:") and needle in err and len(err.splitlines()) == 1, err


def test_make_never_runs_a_variable_as_shell_code(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make")
    (tmp_path / ".installed").touch()
    planted = tmp_path / "planted"
    r = _run(["make", "-s", "bench", f"GPU=h200;touch {planted}", f"VENV={tmp_path}", f"PY={sys.executable}"])
    assert r.returncode != 0 and "unknown GPU profile" in r.stderr and not planted.exists(), r.stderr


def test_third_party_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path):
    code = ("import os, sys, warnings\nfrom pathlib import Path\nfrom harness.console import divert_noise, terminal\n"
            f"divert_noise(Path({str(tmp_path / 'log.txt')!r}))\n"
            "os.write(2, b'C++ leak report\\n'); os.write(1, b'JIT chatter\\n'); warnings.warn('autotuner noise')\n"
            "print('bench: summary', file=terminal()); print('results: here')\n"
            "from harness.console import third_party_stdout\n"
            "with third_party_stdout():\n    print('cudnn_handle created for device_id = 0')\n")
    r = _run([sys.executable, "-c", code])
    assert r.returncode == 0
    assert r.stderr == "bench: summary\n" and r.stdout == "results: here\n"
    log = (tmp_path / "log.txt").read_text()
    assert "C++ leak report" in log and "JIT chatter" in log and "autotuner noise" in log
    assert "cudnn_handle created" in log  # a third-party Python print during the sweep's tune and check phases


def test_make_bench_names_an_unknown_profile(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make")
    (tmp_path / ".installed").touch()  # a stand-in venv: make's prerequisite is met, its python is this one
    r = _run(["make", "-s", "bench", "GPU=nosuchgpu", f"VENV={tmp_path}", f"PY={sys.executable}"])
    assert r.returncode != 0 and "unknown GPU profile 'nosuchgpu'" in r.stderr and "CUDA" not in r.stderr, r.stderr


def test_dispatch_linear_fails_on_0d_input_exactly_as_f_linear():
    import torch
    import torch.nn.functional as F

    import dispatch
    x, w = torch.tensor(1.0), torch.randn(4, 1)
    with pytest.raises(Exception) as ours:
        dispatch.linear(x, w)
    with pytest.raises(Exception) as theirs:
        F.linear(x, w)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_a_partial_run_gets_no_plain_pass(capsys):
    from calibrate.__main__ import main
    old = ["--table", str(DATA / "h200-table-format1.json"), "--oracle", "candidates"]
    assert main(["validate", str(DATA / "h200-sweep-2"), "--partial", *old]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("PASS on the measured cells only") and "no verdict on the whole grid" in last
    assert main(["validate", str(SWEEP), *old]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "PASS"


def test_validate_checks_its_forward_file_before_printing_anything(tmp_path, capsys):
    """A bad --forward stops validate before any cell verdict or table is printed, not after them."""
    from calibrate.__main__ import main
    bad = run_folder(tmp_path, source=DATA / "h200-forward", edit_rows=lambda df: df.assign(
        us=df["us"].where(df.index != 0, "nan")))
    assert run_cli(main, "calibrate", ["validate", str(LEAN), "--table", str(LEAN_TABLE), "--forward", bad]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "NaN" in captured.err


def test_the_sweep_cost_probe_refuses_a_file_for_its_folder(tmp_path):
    target = tmp_path / "taken"
    target.write_text("mine\n")
    proc = subprocess.run([sys.executable, "-m", "tools.probes.sweep_costs", str(target)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not a folder" in proc.stderr
    assert target.read_text() == "mine\n"


def test_the_old_spelling_of_an_option_still_works_and_says_so_once(capsys):
    """calibrate validate's and reports build's --table was --thresholds: the old spelling is taken for one release,
    with one note on stderr naming the new one."""
    from calibrate.__main__ import main
    args = ["validate", "tests/data/h200-lean-validate", "evidence/h200-table-segments-t002/table.json"]
    new = main([args[0], args[1], "--table", args[2]])
    assert "is now --table" not in capsys.readouterr().err
    old = main([args[0], args[1], "--thresholds", args[2]])
    err = capsys.readouterr().err
    assert old == new and err.count("--thresholds is now --table") == 1


def test_validate_widens_with_the_floor_it_is_given_and_refuses_a_missing_one(tmp_path, capsys):
    """--noise / --forward-floor: the floors a table run measured on its own machines judge its check (a first table
    of a GPU has no shipped floor); a missing file stops validate before it prints anything."""
    from calibrate.__main__ import main
    floor = tmp_path / "noise.json"
    shutil.copyfile(Path("calibrate/noise/h200.json"), floor)
    assert main(["validate", str(LEAN), "--table", str(LEAN_TABLE), "--noise", str(floor)]) in (0, 1)
    assert f"run-to-run floor of {floor} (" in capsys.readouterr().out
    for option in ("--noise", "--forward-floor"):
        args = ["validate", str(LEAN), "--table", str(LEAN_TABLE), option, str(tmp_path / "absent.json")]
        assert run_cli(main, "calibrate", args) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and "absent.json" in captured.err


def test_a_report_refuses_a_missing_floor_file_and_writes_nothing(tmp_path, capsys):
    from reports.__main__ import main
    page = tmp_path / "page.html"
    for option in ("--noise", "--forward-floor"):
        args = ["build", str(LEAN), "--table", str(LEAN_TABLE), "--figures", "none", option,
                str(tmp_path / "absent.json"), "-o", str(page)]
        assert run_cli(main, "reports", args) == 2
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1 and "absent.json" in captured.err and not page.exists()
