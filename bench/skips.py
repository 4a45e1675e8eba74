"""Which paths a sweep times at a cell, and why each other one is a skipped row: it cannot run there, it lost by far
at a smaller M of the shape (hopeless), or, in a default sweep, it cannot change a decision: a backend the dispatcher
cannot run (no lean call), and FlashInfer's public call wherever the FlashInfer-alone comparison runs another path."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.forward_paths import flashinfer_everywhere_choice
from bench.paths import ATEN, PATHS, GemmPath, unchoosable_reason
from dispatch.backends import backend_of, flashinfer_path, is_flashinfer, is_lean, lean_path
from shapes.catalog import Shape


@dataclass(frozen=True)
class Skips:
    """What decides which paths a cell times: this SM, the cells already done (a resume), the timer the skipped
    rows name, whether paths that cannot change a decision are skipped (a default sweep), and for that the run's
    paths and its profile's low-M backend."""
    sm: int
    timer: str
    done: frozenset[tuple] | set[tuple] = frozenset()
    skip_unchoosable: bool = False
    paths: frozenset[str] = frozenset()
    low_m_backend: str | None = None

    @classmethod
    def of(cls, cfg: Any, sm: int, timer: str, done: frozenset[tuple] | set[tuple] = frozenset()) -> "Skips":
        """The skips of a sweep's settings (bench.sweep.SweepConfig) on this SM."""
        return cls(sm, timer, done, cfg.skip_unchoosable, frozenset(p.name for p in cfg.paths),
                   cfg.profile.low_m_backend)


def shape_fields(shape: Shape) -> dict[str, Any]:
    return {"shape": shape.name, "n": shape.n, "k": shape.k, "tp": shape.tp, "count": shape.count,
            "models": shape.models, "layers": shape.layers, "in_cuda_graph": shape.in_cuda_graph, "tags": shape.tags}


def hopeless_after(rows: list[dict[str, Any]], m: int, factor: float | None) -> dict[str, str]:
    """Low-M paths whose GPU time at this (shape, M) exceeded `factor` x F.linear's cost in both regimes: the reason
    their later M of the shape are skipped."""
    if factor is None:
        return {}
    aten = next((r for r in rows if r.get("path") == ATEN and r.get("status") == "ok"), None)
    if aten is None:
        return {}
    eager_cost = max(float(aten["gpu_us"]), float(aten.get("host_us") or 0.0))
    out = {}
    for r in rows:
        name = r.get("path")
        if r.get("status") != "ok" or name not in PATHS or PATHS[name].role != "low-m":
            continue
        ratio = float(r["gpu_us"]) / float(aten["gpu_us"])
        if float(r["gpu_us"]) > factor * eager_cost and ratio > factor:
            out[name] = (f"{name} took {ratio:.1f}x F.linear's GPU time at M = {m} on this shape (above {factor:g}x "
                         f"its cost in both regimes); a low-M kernel only falls further behind at larger M "
                         f"(--all times it)")
    return out


def outside_comparison_reason(p: GemmPath, shape: Shape, m: int, skips: Skips, hopeless: dict[str, str]
                              ) -> str | None:
    """Why FlashInfer's public call of a backend is not timed at (shape, M): the dispatcher runs its lean call,
    never the public one, whose GPU time is read off that lean call's anyway (the same kernels); the public call's
    one use is the FlashInfer-alone comparison (bench.forward_paths.flashinfer_everywhere_choice, which validate's
    per-forward sums follow), and at this M that comparison runs another path. None for every other path and where
    the comparison runs this one (its choice is made with the same skips, hopeless ones included)."""
    backend = backend_of(p.name)
    if (skips.low_m_backend is None or backend is None or not is_flashinfer(p.name) or is_lean(p.name)
            or lean_path(backend) not in skips.paths):
        return None

    def can_run(name: str) -> bool:
        return name in skips.paths and name in PATHS and _cannot_run(PATHS[name], shape, m, skips, hopeless) is None
    chosen = flashinfer_everywhere_choice(flashinfer_path(skips.low_m_backend), skips.low_m_backend, m, can_run)
    if chosen == p.name:
        return None
    return (f"{p.name} cannot change a decision here: the dispatcher runs its lean call, and the FlashInfer-alone "
            f"comparison runs {chosen} at this M (--all times it)")


def skip_reason_at(p: GemmPath, shape: Shape, m: int, skips: Skips, hopeless: dict[str, str] | None = None
                   ) -> str | None:
    """Why a path is not timed at (shape, M), or None: it cannot run here, it cannot matter above an M where it lost
    (hopeless, known only during a run), or, where skips.skip_unchoosable, it cannot change a decision."""
    hopeless = hopeless or {}
    reason = _cannot_run(p, shape, m, skips, hopeless)
    if reason or not skips.skip_unchoosable:
        return reason
    return unchoosable_reason(p) or outside_comparison_reason(p, shape, m, skips, hopeless)


def _cannot_run(p: GemmPath, shape: Shape, m: int, skips: Skips, hopeless: dict[str, str]) -> str | None:
    """Why a path does not run at (shape, M) in any sweep: it cannot run here, or it lost by far at a smaller M."""
    return p.skip_reason(skips.sm, shape.n, shape.k, m) or hopeless.get(p.name)


def split_runnable(paths: list[GemmPath], shape: Shape, m: int, skips: Skips,
                   hopeless: dict[str, str] | None = None) -> tuple[list[GemmPath], list[dict[str, Any]]]:
    """The paths still to measure at (shape, M), and the rows of those that cannot run here or cannot matter, with
    the reason."""
    live, skipped = [], []
    for p in paths:
        if (shape.n, shape.k, m, p.name) in skips.done:
            continue
        reason = skip_reason_at(p, shape, m, skips, hopeless)
        if reason:
            skipped.append({**shape_fields(shape), "m": m, "path": p.name, "status": "skipped", "reason": reason,
                            "timer": skips.timer})
        else:
            live.append(p)
    return live, skipped
