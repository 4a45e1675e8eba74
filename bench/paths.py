"""The path registry: the one place to add a GEMM path.

A path turns (x [M, K], w [N, K]) into y [M, N]. Each has a role, and every consumer asks the registry by role:
- baseline: F.linear (`aten`), what every ratio is taken against;
- low-m: a FlashInfer backend for small M (TinyGEMM, CuTe DSL); which one a GPU uses is its profile's low_m_backend;
- candidate: another FlashInfer backend (cuBLASLt, cuDNN); `flashinfer:cublaslt` is also what vLLM's FlashInfer flag
  runs above M = 32 on SM90 (TUNED_CUBLASLT);
- dispatcher: `dispatch.linear`, which runs the baseline or the low-M backend by its table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import dispatch
from dispatch.backends import ATEN, BACKENDS, DISPATCH, Backend, flashinfer_path
from harness.errors import HarnessError

LinearFn = Callable[[Any, Any], Any]


ROLES = ("baseline", "low-m", "candidate", "dispatcher")
LOW_M_BACKENDS = ("tinygemm", "cute-dsl")


@dataclass(frozen=True)
class GemmPath:
    name: str
    build: Callable[[], LinearFn]  # imports lazily, so CPU-only machines can list paths
    role: str  # one of ROLES
    backend: Backend | None = None  # a FlashInfer path: the backend, whose rule says which cells it can run
    note: str = field(default="")

    @property
    def flashinfer_backend(self) -> str | None:
        return self.backend.name if self.backend else None

    @property
    def sms(self) -> tuple[int, ...] | None:
        return self.backend.sms if self.backend else None

    @property
    def tune_by_default(self) -> bool:
        return self.backend.tune_by_default if self.backend else False

    def skip_reason(self, sm: int, n: int, k: int, m: int) -> str | None:
        """Why this path cannot run a cell here, or None (F.linear and the dispatcher run every cell)."""
        return self.backend.skip_reason(sm, n, k, m) if self.backend else None


def _aten() -> LinearFn:
    import torch.nn.functional as F
    return F.linear


def _flashinfer(backend: str) -> Callable[[], LinearFn]:
    def build() -> LinearFn:
        import flashinfer

        def linear(x, w):
            return flashinfer.mm_bf16(x, w.t(), backend=backend)
        return linear
    return build


def _dispatch() -> LinearFn:
    return dispatch.linear


def _flashinfer_path(b: Backend) -> GemmPath:
    return GemmPath(b.path, _flashinfer(b.name), "low-m" if b.name in LOW_M_BACKENDS else "candidate", b, b.note)


PATHS: dict[str, GemmPath] = {p.name: p for p in (
    GemmPath(ATEN, _aten, "baseline", note="torch.nn.functional.linear(x, w)"),
    *(_flashinfer_path(b) for b in BACKENDS.values()),
    GemmPath(DISPATCH, _dispatch, "dispatcher", note="threshold dispatcher: FlashInfer low-M backend at M <= threshold"),
)}
TUNED_CUBLASLT = flashinfer_path("cublaslt")  # FlashInfer's autotuned cuBLASLt: vLLM's flag above M = 32 on SM90


def low_m_path(profile) -> str:
    """The registry name of the GPU profile's low-M backend."""
    return flashinfer_path(profile.low_m_backend)


def flashinfer_paths(names) -> list[str]:
    """The FlashInfer paths among `names`, in their order."""
    return [n for n in names if n in PATHS and PATHS[n].flashinfer_backend]


def paths_for(profile_backends: tuple[str, ...], spec: str | None = None) -> list[GemmPath]:
    """The profile's paths (aten, its FlashInfer backends, dispatch), or those named in a comma list."""
    if spec:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise HarnessError(f"--paths {spec!r} names no path; known: {', '.join(PATHS)}")
        unknown = [n for n in names if n not in PATHS]
        if unknown:
            raise HarnessError(f"unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
        return [PATHS[n] for n in names]
    return [PATHS[ATEN], *(PATHS[flashinfer_path(b)] for b in profile_backends), PATHS[DISPATCH]]
