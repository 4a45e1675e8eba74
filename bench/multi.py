"""(GPU) One sweep over several GPUs of this machine: `python -m bench run --devices 0,1 | all`.

One worker process per GPU (spawned: its own CUDA context and CUPTI session, CUDA_VISIBLE_DEVICES set to its GPU
before torch loads, pinned to the CPU cores local to its GPU where NVML reports them). Shapes are handed out from one
queue, longest first. Each worker writes its own shard folder (<out>/shards/gpu<i>/, resumable); at the end the shards
are merged into <out>/results.csv and run.json (bench.merge). Host timing is serialized across workers by one lock
by default, so that no worker's host-time blocks run while another's do; `--host-timing concurrent` drops the lock.
Unlocked workers' host times showed no shift beyond the run-to-run noise against one-GPU runs on two GPUs
(`calibrate host-shift` compares such runs); more GPUs were not measured, so the lock stays the default.
"""
from __future__ import annotations

import os
import queue as queue_mod
import signal
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from bench.envinfo import nvml_index
from bench.merge import MERGED, merge_shards
from bench.paths import PATHS
from bench.results import done_keys, load_run_info
from bench.shard import longest_first
from bench.sweep import SweepConfig, _progress, require_cuda, run_sweep
from dispatch.profiles import check_device, this_gpu
from harness.errors import HarnessError, Interrupted

SHARD_DIR = "shards"


def parse_devices(spec: str, count: int) -> list[int]:
    """'all' or a comma list of distinct indices below `count`."""
    if spec.strip() == "all":
        devices = list(range(count))
    else:
        try:
            devices = [int(t) for t in spec.split(",") if t.strip()]
        except ValueError:
            raise HarnessError(f"--devices {spec!r}: give GPU indices like 0,1 or 'all'") from None
    if not devices:
        raise HarnessError(f"--devices {spec!r} names no GPU; this machine has {count}")
    bad = [d for d in devices if not 0 <= d < count]
    if bad or len(set(devices)) != len(devices):
        raise HarnessError(f"--devices {spec!r}: indices must be distinct and below {count} (GPUs on this machine)")
    return devices


def shard_dir(out: Path, device: int) -> Path:
    return out / SHARD_DIR / f"gpu{device}"


def split_resumed(shapes: list, ms: list[int], paths: list, devices: list[int], out: Path
                  ) -> tuple[list, dict[int, list]]:
    """On --resume: shapes finished in some shard are dropped, shapes begun in a shard go back to that shard's GPU
    (its folder holds their rows), the rest go to the shared queue."""
    queue, pinned = [], {d: [] for d in devices}
    done_in = {d: (done_keys(shard_dir(out, d))[1] if (shard_dir(out, d) / "results.csv").is_file() else set())
               for d in devices}
    for shape in shapes:
        want = {(shape.n, shape.k, m, p.name) for m in ms for p in paths}
        holders = [d for d in devices if want & done_in[d]]
        if not holders:
            queue.append(shape)
        elif not want <= done_in[holders[0]]:
            pinned[holders[0]].append(shape)
    return queue, pinned


def cpu_affinity(index: int) -> list[int] | None:
    """The CPU cores NVML reports as local to the GPU of NVML index `index`, or None where NVML cannot say."""
    try:
        import pynvml as nv
        nv.nvmlInit()
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            words = nv.nvmlDeviceGetCpuAffinity(handle, (os.cpu_count() + 63) // 64)
        finally:
            nv.nvmlShutdown()
    except Exception:
        return None
    cores = [64 * i + b for i, w in enumerate(words) for b in range(64) if w >> b & 1]
    return [c for c in cores if c < (os.cpu_count() or 0)] or None


def visible_entry(device: int, visible: str | None) -> str:
    """What a worker puts in CUDA_VISIBLE_DEVICES for this process's CUDA device `device`: its entry in the parent's
    own CUDA_VISIBLE_DEVICES (an index or a UUID), so that `CUDA_VISIBLE_DEVICES=2,3 ... --devices 0` measures GPU 2."""
    entries = [e.strip() for e in visible.split(",")] if visible and visible.strip() else []
    if not entries:
        return str(device)
    if device >= len(entries):
        raise HarnessError(f"GPU {device} is not among CUDA_VISIBLE_DEVICES={visible}")
    return entries[device]


def local_gpus() -> dict[int, tuple[str, int]]:
    """index -> (name, SM) of every CUDA device this process sees."""
    require_cuda()
    import torch

    return {d: this_gpu(d) for d in range(torch.cuda.device_count())}


HOST_TIMING = {"serialized": "serialized across the workers of --devices (one worker at a time)",
               "concurrent": "concurrent: the workers of --devices timed host calls at the same time (no lock)"}


def run_on_devices(cfg, spec: str, gpus: dict[int, tuple[str, int]] | None = None, worker: Any = None,
                   host_timing: str = "serialized") -> Path:
    """`gpus` and `worker` stand in for the machine's GPUs and the measuring worker in CPU tests of the orchestration
    (a worker must be a module-level function: workers are spawned)."""
    import multiprocessing as mp

    devices = _checked_devices(cfg, spec, local_gpus() if gpus is None else gpus)
    cfg = replace(cfg, host_timing=HOST_TIMING[host_timing])
    order = longest_first(cfg.shapes, cfg.ms, cfg.paths, cfg.profile)
    todo, pinned = split_resumed(order, cfg.ms, cfg.paths, devices, cfg.out) if cfg.resume else (order, {d: [] for d in devices})
    ctx = mp.get_context("spawn")
    work, events, lock = ctx.Queue(), ctx.Queue(), ctx.Lock()
    for shape in todo:
        work.put(shape.name)
    payload = _payload(cfg, devices)
    grid = [s.name for s in cfg.shapes]
    procs = {d: ctx.Process(target=worker or _worker, name=f"bench-gpu{d}",
                            args=(d, WorkerJob(payload, grid, [s.name for s in pinned[d]], work, events,
                                               lock if host_timing == "serialized" else None,
                                               str(shard_dir(cfg.out, d)), devices)))
             for d in devices}
    total = len(todo) + sum(len(v) for v in pinned.values())
    bar = _progress(total, f"bench x{len(devices)} GPUs")
    t0 = time.perf_counter()
    for p in procs.values():
        p.start()
    failures, interrupted = _follow(procs, events, bar)
    wall = time.perf_counter() - t0
    shards = [shard_dir(cfg.out, d) for d in devices if (shard_dir(cfg.out, d) / "results.csv").is_file()]
    if not shards:
        raise HarnessError("no worker measured anything" + (f": {'; '.join(failures)}" if failures else ""))
    if (cfg.out / "results.csv").exists():  # an earlier leg's merge: the harness wrote it, the shards hold its rows
        (cfg.out / "results.csv").unlink()
    merge_shards(shards, cfg.out, partial=True)
    if interrupted:
        raise Interrupted(f"interrupted; finished shapes are in {cfg.out}/{SHARD_DIR}/ and merged into "
                          f"{cfg.out}/results.csv; continue with the same command and --resume")
    if failures:
        raise HarnessError(f"{len(failures)} worker(s) failed ({'; '.join(failures)}); the others' shapes are merged "
                           f"into {cfg.out}; fix it and continue with --resume")
    print(f"bench: {len(shards)} GPUs, {total} shapes in {wall:.0f} s; merged into {cfg.out}/results.csv "
          f"(shards in {cfg.out}/{SHARD_DIR}/)\n  next: python -m calibrate validate {cfg.out}", flush=True)
    return cfg.out


def _checked_devices(cfg, spec: str, gpus: dict[int, tuple[str, int]]) -> list[int]:
    """The GPUs of `spec`, each the profile's and all alike, and the run's options and --out fit for them: checked
    before anything is written."""
    devices = parse_devices(spec, len(gpus))
    names = {}
    for d in devices:
        name, sm = gpus[d]
        check_device(cfg.profile, name, sm, cfg.allow_mismatch)
        names[d] = name
    if len(set(names.values())) > 1:
        raise HarnessError(f"--devices mixes GPU models ({', '.join(f'{d}: {n}' for d, n in names.items())}); "
                           f"one sweep measures one GPU type")
    if cfg.save_autotune_cache is not None:
        raise HarnessError("with --devices each GPU tunes its own shapes, and the merged run keeps each shard's tactics "
                           "(autotune-cache-shardN.json); --save-autotune-cache is for a run on one GPU")
    if (cfg.out / "results.csv").exists():
        if not cfg.resume:
            raise HarnessError(f"{cfg.out}/results.csv exists; pass --resume to continue it or choose another --out")
        if load_run_info(cfg.out / "results.csv").get("kind") != MERGED:  # only a merge is redone from its shards
            raise HarnessError(f"{cfg.out}/results.csv is not a merge of --devices shards (a run on one GPU?); "
                               f"resume it without --devices, or choose another --out")
    return devices


def _payload(cfg, devices: list[int]) -> dict[str, Any]:
    """What each worker rebuilds its sweep from (a spawned process gets no live objects)."""
    payload = {f.name: getattr(cfg, f.name) for f in fields(cfg)
               if f.name not in ("paths", "next_shape", "host_lock", "on_shape_done", "progress", "out", "resume")}
    payload["path_names"] = [p.name for p in cfg.paths]
    # per GPU, found here where torch maps CUDA indices to NVML's (they differ under CUDA_VISIBLE_DEVICES or another
    # device order): what the worker makes visible, and the CPU cores local to that GPU
    payload["visible"] = {d: visible_entry(d, os.environ.get("CUDA_VISIBLE_DEVICES")) for d in devices}
    payload["cores"] = {d: cpu_affinity(nvml_index(d)) for d in devices}
    return payload


def _follow(procs: dict, events, bar) -> tuple[list[str], bool]:
    """Follow the workers' events until all have exited: (their failures, whether the run was interrupted)."""
    failures, interrupted = [], False

    def handle(event: tuple) -> None:
        nonlocal interrupted
        kind, device, *rest = event
        if kind == "done":
            bar.update(1)
            bar.set_postfix_str(f"gpu{device}: {rest[0]} in {rest[1]:.0f} s")
        elif kind == "error":
            failures.append(f"gpu{device}: {rest[0]}")
        elif kind == "interrupted":
            interrupted = True
    try:
        while any(p.is_alive() for p in procs.values()) or not events.empty():
            try:
                handle(events.get(timeout=0.5))
            except queue_mod.Empty:
                continue
    except KeyboardInterrupt:  # Ctrl-C reached the workers too; SIGTERM (Terminated) reached only this process
        interrupted = True
        for p in procs.values():
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGINT)  # each worker writes its finished rows and stops
        for p in procs.values():
            p.join(timeout=120)
    finally:
        bar.close()
    for p in procs.values():
        p.join()
    while True:  # events put just before a worker exited may arrive after the loop saw it gone
        try:
            handle(events.get(timeout=0.2))
        except queue_mod.Empty:
            break
    return failures, interrupted


@dataclass
class WorkerJob:
    """What one GPU's worker process gets: the sweep's settings (`payload`), the grid's shapes, the shapes pinned to
    it (a resume's), the shared queue of shapes, the event queue to the parent, the host-time lock (None:
    concurrent), its shard folder and every device of the run."""
    payload: dict[str, Any]
    grid: list[str]
    pinned: list[str]
    work: Any
    events: Any
    lock: Any
    out: str
    devices: list[int]


def _worker(device: int, job: WorkerJob) -> None:
    """One GPU's worker: its own process, CUDA context and CUPTI session; shapes from `pinned`, then the queue."""
    payload, grid, pinned, work, events, lock, out, devices = (job.payload, job.grid, job.pinned, job.work,
                                                                job.events, job.lock, job.out, job.devices)
    os.environ["CUDA_VISIBLE_DEVICES"] = payload["visible"][device]  # before torch is imported in this process
    cores = payload["cores"][device]
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    by_name = {s.name: s for s in payload["shapes"]}
    own = list(pinned)

    def next_shape():
        if own:
            return by_name[own.pop(0)]
        try:
            return by_name[work.get_nowait()]
        except queue_mod.Empty:
            return None

    def done(shape, seconds: float) -> None:
        events.put(("done", device, shape.name, seconds))

    args = {k: v for k, v in payload.items() if k not in ("path_names", "visible", "cores")}
    cfg = SweepConfig(**{**args, "shard": {"device": device, "devices": devices, "grid_shapes": grid,
                                           "cpu_affinity": cores}},
                      paths=[PATHS[n] for n in payload["path_names"]], out=Path(out), resume=True,
                      next_shape=next_shape, host_lock=lock, on_shape_done=done, progress=False)
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        run_sweep(replace(cfg, quiet=True))
    except Interrupted:
        events.put(("interrupted", device))
        sys.exit(130)
    except KeyboardInterrupt:
        events.put(("interrupted", device))
        sys.exit(130)
    except HarnessError as exc:
        events.put(("error", device, str(exc)))
        sys.exit(2)
    except Exception as exc:  # a worker's crash is reported by the parent, with the shapes it finished kept
        events.put(("error", device, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
