"""Merging shards of one grid into one results folder (CPU only): `python -m bench merge DIR... --out DIR`.

Shards are runs of the same grid split by shape (`bench run --shard I/N` on several machines, or the workers of
`bench run --devices`). They merge only when they measured alike: the same GPU model, SM, memory, driver, software
and clocks, and the same grid settings; the first field that differs is named. A cell measured by two shards, or a
shape of the grid that no shard measured (unless --partial), stops the merge.
"""
from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any, Sequence

from bench.autotune_cache import FILE_NAME as TACTICS_FILE
from bench.autotune_cache import copy as copy_file
from bench.results import KEY, load_run_info, read_csv_table, validate_results, write_run_json
from harness.errors import HarnessError
from harness.io import atomic_write_text

# What must agree between shards: the GPU and its software (fingerprint), its clocks (run.json clocks_start), and
# what was measured (run.json).
FINGERPRINT_FIELDS = ("gpu_name", "sm", "sm_count", "memory_bytes", "driver", "cuda", "torch", "cublas", "cudnn",
                      "flashinfer", "cupti_python")
CLOCK_FIELDS = ("sm_clock_max_mhz", "power_limit_w")  # limits, not the clocks of the moment
GRID_FIELDS = ("profile", "timer", "l2", "samples", "ms", "paths", "pdl")
MERGED = "merged sweep"  # run.json kind of a merged run


def _grid_shapes(info: dict[str, Any]) -> list[str]:
    shard = info.get("shard") or {}
    return list(shard.get("grid_shapes") or info.get("shapes") or [])


def fingerprint_difference(ref: dict[str, Any], info: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first FINGERPRINT_FIELDS field in which two runs' run.json differ, with ref's and info's values."""
    for field in FINGERPRINT_FIELDS:
        a, b = (ref.get("fingerprint") or {}).get(field), (info.get("fingerprint") or {}).get(field)
        if a != b:
            return field, a, b
    return None


def check_alike(infos: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """Stops at the first field in which a shard differs from the first one."""
    (first, ref), *rest = infos
    for path, info in rest:
        differs = fingerprint_difference(ref, info)
        if differs is not None:
            field, a, b = differs
            raise HarnessError(f"{path} was measured on another machine setup than {first}: fingerprint {field} "
                               f"{b!r} vs {a!r}; merge only shards of one GPU type and software stack")
        for field in CLOCK_FIELDS:
            a, b = (ref.get("clocks_start") or {}).get(field), (info.get("clocks_start") or {}).get(field)
            if a is not None and b is not None and a != b:
                raise HarnessError(f"{path} ran under other clocks than {first}: {field} {b!r} vs {a!r}; "
                                   f"merge only shards measured under the same clock limits")
        for field in GRID_FIELDS:
            if ref.get(field) != info.get(field):
                raise HarnessError(f"{path} measured another grid than {first}: {field} {info.get(field)!r} vs "
                                   f"{ref.get(field)!r}; shards of one grid share every setting but the shapes")
        if _grid_shapes(ref) != _grid_shapes(info):
            raise HarnessError(f"{path} belongs to another grid than {first} (its shape list differs)")


def _all_legs_s(info: dict[str, Any]) -> float:
    """Seconds of a run's last leg and of every earlier leg it was resumed from."""
    legs = [leg.get("wall_s") for leg in info.get("previous_legs", [])] + [info.get("wall_s")]
    return round(sum(float(w or 0) for w in legs), 1)


def merge_shards(shards: Sequence[Path], out: Path, partial: bool = False) -> Path:
    """One results.csv and run.json from the shards (rows unedited), each shard's run.json kept in run.json."""
    if (out / "results.csv").exists():
        raise HarnessError(f"{out}/results.csv exists; merge into a new folder")
    infos, tables, texts = [], [], []
    for d in shards:
        d = Path(d)
        csv = d / "results.csv"
        if not csv.is_file():
            raise HarnessError(f"shard {d} has no results.csv; pass the folders that bench run wrote")
        info = load_run_info(csv)
        if info.get("status") != "complete" and not partial:
            raise HarnessError(f"shard {d} did not finish (status {info.get('status')!r}); finish it with --resume, "
                               f"or pass --partial")
        infos.append((d, info))
        try:
            texts.append(csv.read_text())  # read once: parsed here, its lines copied byte for byte below
        except (UnicodeDecodeError, OSError) as exc:
            raise HarnessError(f"shard {d}: its results.csv is not a text table ({type(exc).__name__}); re-run or "
                               f"restore that shard") from None
        try:
            table = read_csv_table(io.StringIO(texts[-1]))
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise HarnessError(f"shard {d}: cannot read its results.csv ({type(exc).__name__}: {first}); re-run or "
                               f"restore that shard") from None
        validate_results(table, csv)  # columns, types, finite times: a damaged shard stops the merge
        tables.append(table)
    check_alike(infos)
    header = texts[0].splitlines(keepends=True)[0]
    for (d, _), text in zip(infos, texts):
        if text.splitlines(keepends=True)[0] != header:
            raise HarnessError(f"shard {d} has other columns than {infos[0][0]} (another harness version); "
                               f"re-run it with the same harness")
    bodies = ["".join(t.splitlines(keepends=True)[1:]) for t in texts]
    bodies = [b if not b or b.endswith("\n") else b + "\n" for b in bodies]
    import pandas as pd
    df = pd.concat(tables, ignore_index=True)
    dup = df.duplicated(list(KEY), keep=False)
    if dup.any():
        row = df[dup].iloc[0]
        raise HarnessError(f"cell {row['shape']} M={row['m']} {row['path']} was measured by more than one shard; "
                           f"shards must split the grid, not overlap")
    grid = _grid_shapes(infos[0][1])
    measured = sorted(set(df["shape"]))
    missing = [s for s in grid if s not in measured]
    if missing and not partial:
        raise HarnessError(f"no shard measured {len(missing)} shape(s) of the grid ({', '.join(missing[:4])}"
                           f"{', ...' if len(missing) > 4 else ''}); merge every shard, or pass --partial")
    ref = dict(infos[0][1])
    for key in ("shard", "previous_legs", "wall_s", "phase_s", "started", "command", "autotune_cache", "clocks_end",
                "kernel_records", "cupti_invalid_records"):
        ref.pop(key, None)
    complete = not missing and all(i.get("status") == "complete" for _, i in infos)
    out.mkdir(parents=True, exist_ok=True)
    kept = []
    for n, (d, _) in enumerate(infos, 1):
        if (d / TACTICS_FILE).is_file():  # each shard tuned its own shapes: its tactics stay apart
            copy_file(d / TACTICS_FILE, out / f"autotune-cache-shard{n}.json")
            kept.append(f"autotune-cache-shard{n}.json")
    atomic_write_text(out / "results.csv", header + "".join(bodies))  # the shards' rows byte for byte
    write_run_json(out, {**ref, "kind": MERGED, "shapes": grid, "status": "complete" if complete else "incomplete",
                         "missing_shapes": missing, "merged": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "wall_s": max(float(i.get("wall_s") or 0) for _, i in infos),
                         # a shard resumed after an interruption: its legs added up (the slowest shard's)
                         "wall_s_all_legs": max(_all_legs_s(i) for _, i in infos),
                         "started": min((str(i["started"]) for _, i in infos if i.get("started")), default=None),
                         "shards": [{"source": str(d), "command": i.get("command"), "started": i.get("started"),
                                     "wall_s": i.get("wall_s"), "previous_legs": i.get("previous_legs", []),
                                     "status": i.get("status"), "shard": i.get("shard"),
                                     "device": (i.get("shard") or {}).get("device"),
                                     "fingerprint": i.get("fingerprint"), "clocks_start": i.get("clocks_start"),
                                     "clocks_end": i.get("clocks_end"),
                                     "shapes": sorted(set(t["shape"]))}
                                    for (d, i), t in zip(infos, tables)],
                         "autotune_caches": kept})
    return out
