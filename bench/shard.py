"""Splitting a sweep over GPUs and machines (CPU only): what a shape costs, longest first, shards, and the full grid.

The unit of work is a shape with all its M values: FlashInfer tunes per shape, so splitting a shape would tune it
twice. Shapes go out longest first (the LPT rule), which keeps the last GPU from finishing long after the others.
"""
from __future__ import annotations

from typing import Any, Sequence

from bench.stats import estimate_call_us
from dispatch.profiles import GpuProfile
from harness.errors import HarnessError
from shapes.catalog import Shape, catalog
from shapes.grid import NAMED_GRIDS

FULL_TPS = (1, 2, 4, 8)
# Rates of H200 default sweeps: per cell the dry run counts, a default sweep serving the shipped tactics (its wall
# time over its cells); per (shape, FlashInfer path) tuning, an own-tuned sweep's tuning time over its tunings. The
# runs are named in docs/results-h200.md, "The dry run's estimate". The dry run's estimate and the queue order scale
# them; they are guesses.
SECONDS_PER_CELL = 77.8 / 2230
SECONDS_PER_TUNING = 28.78 / 31
# A shape's cost for ordering work: the fixed cost per cell (operands, check, capture, host blocks) plus the GPU
# time of what a cell runs: host blocks and replays, ~40 calls' worth.
CALLS_PER_CELL = 40


def shape_cost(shape: Shape, ms: Sequence[int], paths: Sequence[Any], profile: GpuProfile) -> float:
    """Estimated seconds to sweep one shape over `ms` and `paths` (a guess for ordering work, never reported)."""
    per_m = sum(SECONDS_PER_CELL + CALLS_PER_CELL * estimate_call_us(m, shape.n, shape.k, profile.sizing_tflops,
                                                                      profile.sizing_gbps) * 1e-6 for m in ms)
    return per_m * len(paths)


def longest_first(shapes: Sequence[Shape], ms: Sequence[int], paths: Sequence[Any], profile: GpuProfile) -> list[Shape]:
    """The queue order: estimated cost descending, then name (deterministic)."""
    return sorted(shapes, key=lambda s: (-shape_cost(s, ms, paths, profile), s.name))


def assign(shapes: Sequence[Shape], n: int, ms: Sequence[int], paths: Sequence[Any], profile: GpuProfile
           ) -> list[list[Shape]]:
    """n shards of the shapes: longest first, each to the shard with the least estimated work so far (ties to the
    lower index). Every shape lands in exactly one shard; the split depends only on its inputs, so `--shard i/n` on n
    machines covers the grid once."""
    if n < 1:
        raise HarnessError(f"cannot split a sweep into {n} shards")
    bins: list[list[Shape]] = [[] for _ in range(n)]
    load = [0.0] * n
    for shape in longest_first(shapes, ms, paths, profile):
        i = min(range(n), key=lambda j: (load[j], j))
        bins[i].append(shape)
        load[i] += shape_cost(shape, ms, paths, profile)
    return bins


def shard_from_env(env: dict[str, str] | None = None) -> tuple[int, int, str]:
    """`--shard auto`: (I, N, where from) from a Slurm array (SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, the
    array's minimum index SLURM_ARRAY_TASK_MIN honoured, so --array=0-3 and --array=1-4 both give shards 1..4) or
    from torchrun (RANK and WORLD_SIZE, RANK from 0)."""
    import os
    env = dict(os.environ) if env is None else env

    def num(key: str) -> int:
        try:
            return int(env[key])
        except ValueError:
            raise HarnessError(f"--shard auto: {key}={env[key]!r} is not an integer") from None
    if "SLURM_ARRAY_TASK_ID" in env:
        if "SLURM_ARRAY_TASK_COUNT" not in env:
            raise HarnessError("--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not; run it as "
                               "an sbatch --array job, or pass --shard I/N")
        task, count = num("SLURM_ARRAY_TASK_ID"), num("SLURM_ARRAY_TASK_COUNT")
        low = num("SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
        i = task - low + 1
        step = num("SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in env else 1
        if step != 1:
            raise HarnessError(f"--shard auto: the Slurm array steps by {step}; use a contiguous array (--array=1-N)")
        where = f"Slurm array task {task} of {count} (min index {low})"
    elif "RANK" in env and "WORLD_SIZE" in env:
        i, count = num("RANK") + 1, num("WORLD_SIZE")
        where = f"torchrun rank {i - 1} of {count}"
    else:
        raise HarnessError("--shard auto found no Slurm array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT) or "
                           "torchrun (RANK, WORLD_SIZE) variables; pass --shard I/N")
    if not 1 <= i <= count <= 1024:
        raise HarnessError(f"--shard auto: {where} gives shard {i} of {count}; expected 1..N with N <= 1024")
    return i, count, where


def parse_shard(spec: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): shard 2 of 4, counted from 1 (a Slurm array index 1..N); 'auto': from the scheduler's
    environment (shard_from_env)."""
    if spec.strip() == "auto":
        return shard_from_env()[:2]
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise HarnessError(f"--shard {spec!r}: give I/N, e.g. 1/4 (shard I of N, I from 1 to N)") from None
    if not 1 <= i <= n <= 1024:
        raise HarnessError(f"--shard {spec!r}: I must lie in 1..N and N in 1..1024")
    return i, n


def full_catalog(tps: Sequence[int] = FULL_TPS) -> list[Shape]:
    """Both models' catalogs at every TP degree, one entry per distinct weight shape (the lowest TP that has it)."""
    seen: dict[tuple[int, int], Shape] = {}
    for tp in tps:
        for shape in catalog(tp=tp):
            seen.setdefault((shape.n, shape.k), shape)
    return list(seen.values())


def full_grid_ms() -> list[int]:
    """The default M grid and every vLLM capture size."""
    return NAMED_GRIDS["capture"]()
