"""The path registry: the one place to add a GEMM path.

A path turns (x [M, K], w [N, K]) into y [M, N]. Names are the interface to dispatch/ and reports/.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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


PATHS: dict[str, GemmPath] = {p.name: p for p in (
    GemmPath("aten", None, _aten, note="torch.nn.functional.linear(x, w)"),
    GemmPath("flashinfer:tinygemm", (90, 100, 103, 110, 120, 121), _flashinfer("tinygemm"), max_m=2048,
             min_n_multiple=16, flashinfer_backend="tinygemm", note="TinyGEMM, tiles of 8 tokens"),
    GemmPath("flashinfer:cublaslt", None, _flashinfer("cublaslt"), flashinfer_backend="cublaslt",
             note="FlashInfer's autotuned cuBLASLt"),
    # Tuning cuDNN builds and times every engine plan per bucket (~14 s for 3 buckets of one shape on an H200),
    # which alone would outlast the sweep; it runs its heuristic plan unless --tune-all.
    GemmPath("flashinfer:cudnn", None, _flashinfer("cudnn"), flashinfer_backend="cudnn", tune_by_default=False,
             note="cuDNN graph GEMM (heuristic plan; --tune-all tunes it)"),
    GemmPath("flashinfer:cute-dsl", (100, 103, 107), _flashinfer("cute-dsl"), min_k_multiple=128,
             flashinfer_backend="cute-dsl", note="CuTeDSL kernels for M <= 32, cuBLASLt fallback above"),
    GemmPath("dispatch", None, _dispatch, note="threshold dispatcher: FlashInfer low-M backend at M <= threshold"),
)}


def paths_for(profile_backends: tuple[str, ...], spec: str | None = None) -> list[GemmPath]:
    """The profile's paths (aten, its FlashInfer backends, dispatch), or those named in a comma list."""
    from shapes.errors import HarnessError
    if spec:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise HarnessError(f"--paths {spec!r} names no path; known: {', '.join(PATHS)}")
        unknown = [n for n in names if n not in PATHS]
        if unknown:
            raise HarnessError(f"unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
        return [PATHS[n] for n in names]
    return [PATHS["aten"], *(PATHS[f"flashinfer:{b}"] for b in profile_backends), PATHS["dispatch"]]
