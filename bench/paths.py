"""The path registry: the one place to add a GEMM path.

A path turns (x [M, K], w [N, K]) into y [M, N]. Names are the interface to dispatch/ and reports/.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dispatch.backends import BACKENDS, Backend

LinearFn = Callable[[Any, Any], Any]


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
                    note=b.note)


PATHS: dict[str, GemmPath] = {p.name: p for p in (
    GemmPath("aten", None, _aten, note="torch.nn.functional.linear(x, w)"),
    *(_flashinfer_path(b) for b in BACKENDS.values()),
    GemmPath("dispatch", None, _dispatch, note="threshold dispatcher: FlashInfer low-M backend at M <= threshold"),
)}


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
    return [PATHS["aten"], *(PATHS[f"flashinfer:{b}"] for b in profile_backends), PATHS["dispatch"]]
