"""FlashInfer's autotuner choices kept in a file (its own v1 JSON cache), so that another process runs the same tactics.

Why: each process's autotuner times near-tied cuBLASLt algorithms itself (cold L2, 10 repeats) and the winner differs
from process to process. On the H200, 34 of 218 regression cells ran another kernel in a fresh process, moving the
FlashInfer/aten ratio by up to 13% at M=1. vLLM keeps the same file across restarts
(`$VLLM_CACHE_ROOT/flashinfer_autotune_cache/.../autotune_configs_*.json`), so pinned tactics are what a restarted
server runs. Every complete sweep writes the tactics it ran to `<out>/autotune-cache.json`.

The project's GEMV (dispatch/gemv.py) keeps its tuned configurations beside a tactics file, in
`<tactics stem>.gemv.json`: serving, copying and describing a tactics file takes that file along where it exists.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from dispatch import gemv
from dispatch.gemv import beside
from harness.errors import HarnessError
from harness.io import atomic_write, read_json, sha256

FILE_NAME = "autotune-cache.json"
# an entry key of FlashInfer's bf16_gemm: "('bf16_gemm', '<Runner>', ((M, K), (K, N), ...), ...)"
_BF16_GEMM_KEY = re.compile(r"\('bf16_gemm', '(\w+)', \(\((\d+), (\d+)\), \((\d+), (\d+)\),")


def read_entries(path: Path) -> dict[str, Any]:
    """The file's tactic entries (metadata left out); one clear error when it is unreadable or not FlashInfer's."""
    data = read_json(path, "autotuner cache", "tune afresh (leave --autotune-cache out; --save-autotune-cache FILE "
                                              "keeps the tactics)")
    if not isinstance(data, dict) or not all(isinstance(v, list) and len(v) >= 2
                                             for k, v in data.items() if not k.startswith("_")):
        raise HarnessError(f"{path} is not a FlashInfer autotuner cache (expected {{key: [runner, tactic]}}); "
                           f"delete it and tune afresh")
    return {k: v for k, v in data.items() if not k.startswith("_")}


def gemv_file(tactics: Path) -> Path:
    """Where the GEMV configurations served with a tactics file live (dispatch.gemv.beside)."""
    return beside(tactics)


def read_gemv(path: Path) -> int:
    """The GEMV configurations beside a tactics file read and checked without serving them (a dry run refuses what
    the real run would); how many (0 where there is no such file)."""
    target = gemv_file(path)
    if not target.is_file() and not target.is_symlink():
        return 0
    return len(gemv.read(target))


def describe(path: Path, mode: str) -> dict[str, Any]:
    """What run.json records: where the tactics came from and which file, by hash (and the GEMV's file beside it)."""
    out = {"mode": mode, "source": str(path), "sha256": sha256(path), "entries": len(read_entries(path))}
    if gemv_file(path).is_file():
        out["gemv_configs"] = {"file": gemv_file(path).name, "sha256": sha256(gemv_file(path))}
    return out


def load_gemv(path: Path) -> int:
    """Serves the GEMV configurations kept beside a tactics file (0 where there is no such file)."""
    return gemv.load(gemv_file(path)) if gemv_file(path).is_file() else 0


def keep_gemv(out: Path) -> dict[str, Any]:
    """The GEMV configurations this process ran (served and tuned), written beside <out>/autotune-cache.json."""
    target = gemv_file(Path(out) / FILE_NAME)
    gemv.save(target)
    tuned = gemv.STORE.tune_s
    return {"file": target.name, "sha256": sha256(target), "entries": len(gemv.STORE.configs),
            "served_from": sorted(gemv.STORE.files), "tuned_here": len(tuned),
            "tune_s": round(sum(tuned.values()), 2)}


def load(path: Path) -> dict[str, Any]:
    """Makes FlashInfer serve every tuned call from `path` (no tuning in this process). Stops when FlashInfer
    refuses the file, which it does silently (a warning) when the file was written in another environment."""
    read_entries(path)
    from flashinfer.autotuner import AutoTuner
    if not AutoTuner.get().load_configs(str(path)):
        raise HarnessError(f"FlashInfer ignored the autotuner cache {path}: it was written in another environment "
                           f"(FlashInfer, CUDA, cuBLAS, cuDNN or GPU differ); tune afresh (bench: --tune) to write a new "
                           f"one")
    load_gemv(path)
    return describe(path, "loaded")


def save(path: Path) -> None:
    """This process's tuned tactics (and any loaded ones) written atomically to `path`."""
    from flashinfer.autotuner import AutoTuner

    def fill(tmp: Path) -> None:
        tmp.unlink()  # save_configs reads an existing file's metadata first; give it none
        AutoTuner.get().save_configs(str(tmp))
        read_entries(tmp)
    atomic_write(path, fill)


def copy(src: Path, dst: Path) -> None:
    """An atomic byte copy (a pinned file is kept beside the results that ran it), its GEMV file along."""
    if Path(src).resolve() != Path(dst).resolve():
        atomic_write(dst, lambda tmp: shutil.copyfile(src, tmp))
        if gemv_file(src).is_file():
            atomic_write(gemv_file(dst), lambda tmp: shutil.copyfile(gemv_file(src), tmp))


def _shape_of(key: str) -> tuple[str, int, int, int] | None:
    """(runner, M, K, N) of an entry key (_BF16_GEMM_KEY); None for any other key."""
    hit = _BF16_GEMM_KEY.match(key)
    if hit is None or hit.group(3) != hit.group(4):
        return None
    return hit.group(1), int(hit.group(2)), int(hit.group(3)), int(hit.group(5))


def held_cells(path: Path) -> set[tuple[int, int, int]]:
    """The (N, K, M) cells for which the file holds a bf16_gemm entry of some runner."""
    held = set()
    for key in read_entries(path):
        shape = _shape_of(key)
        if shape is not None:
            _, m, k, n = shape
            held.add((n, k, m))
    return held


def tactic_differences(own: Path, other: Path, cells: list[tuple[int, int, int]]
                       ) -> list[tuple[int, int, int, str, Any, Any]]:
    """Per (N, K, M) cell, the runners whose tuned tactic differs between two autotuner files:
    [(n, k, m, runner, tactic in `own`, tactic in `other`)]; an entry only one file holds is not a difference."""
    mine, theirs = read_entries(own), read_entries(other)
    wanted = set(cells)
    out = []
    for key, entry in sorted(mine.items()):
        shape = _shape_of(key)
        if shape is None or key not in theirs:
            continue
        runner, m, k, n = shape
        if (n, k, m) in wanted and entry[1] != theirs[key][1]:
            out.append((n, k, m, runner, entry[1], theirs[key][1]))
    return out
