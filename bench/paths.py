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

from dispatch.backends import ATEN, BACKENDS, DISPATCH, Backend, flashinfer_path

LinearFn = Callable[[Any, Any], Any]


ROLES = ("baseline", "low-m", "candidate", "dispatcher")
LOW_M_BACKENDS = ("tinygemm", "cute-dsl")


@dataclass(frozen=True)
class GemmPath:
    name: str
    sms: tuple[int, ...] | None  # SMs it runs on; None = any CUDA GPU
    build: Callable[[], LinearFn]  # imports lazily, so CPU-only machines can list paths
    max_m: int | None = None  # not swept above this M (skipped with the reason)
    min_n_multiple: int = 1  # N must be a multiple of this
    min_k_multiple: int = 1
    flashinfer_backend: str | None = None
    tune_by_default: bool = True  # FlashInfer's autotuner runs before timing unless --no-tune
    note: str = field(default="")
    role: str = "candidate"

    def skip_reason(self, sm: int, n: int, k: int, m: int) -> str | None:
        """Why this path cannot run a cell here, or None."""
        if self.sms is not None and sm not in self.sms:
            return f"{self.name} needs SM{'/'.join(map(str, self.sms))}, this GPU is SM{sm}"
        if n % self.min_n_multiple:
            return f"{self.name} needs N % {self.min_n_multiple} == 0, N = {n}"
        if k % self.min_k_multiple:
            return f"{self.name} needs K % {self.min_k_multiple} == 0, K = {k}"
        if self.max_m is not None and m > self.max_m:
            return f"{self.name} is a low-M kernel, not swept above M = {self.max_m}"
        return None


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
    import dispatch
    return dispatch.linear


def _flashinfer_path(b: Backend) -> GemmPath:
    return GemmPath(b.path, b.sms, _flashinfer(b.name), max_m=b.max_m, min_n_multiple=b.n_multiple,
                    min_k_multiple=b.k_multiple, flashinfer_backend=b.name, tune_by_default=b.tune_by_default,
                    note=b.note, role="low-m" if b.name in LOW_M_BACKENDS else "candidate")


PATHS: dict[str, GemmPath] = {p.name: p for p in (
    GemmPath(ATEN, None, _aten, note="torch.nn.functional.linear(x, w)", role="baseline"),
    *(_flashinfer_path(b) for b in BACKENDS.values()),
    GemmPath(DISPATCH, None, _dispatch, note="threshold dispatcher: FlashInfer low-M backend at M <= threshold",
             role="dispatcher"),
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
    from harness.errors import HarnessError
    if spec:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise HarnessError(f"--paths {spec!r} names no path; known: {', '.join(PATHS)}")
        unknown = [n for n in names if n not in PATHS]
        if unknown:
            raise HarnessError(f"unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
        return [PATHS[n] for n in names]
    return [PATHS[ATEN], *(PATHS[flashinfer_path(b)] for b in profile_backends), PATHS[DISPATCH]]
