"""FlashInfer's mm_bf16 backends and what each accepts: the one eligibility rule per backend, as data (SMs, shape
multiples, alignment, M limit). The bench registry and the analyses apply it to (SM, N, K, M) cells here
(Backend.skip_reason); the dispatcher applies it to tensors (dispatch/eligible.py, the module that imports torch)."""
from __future__ import annotations

from dataclasses import dataclass

# Path names shared by every floor (the bench registry gives each its role): F.linear, the dispatcher itself, and
# the project's split-K GEMV (dispatch/gemv.py).
ATEN = "aten"
DISPATCH = "dispatch"
GEMV = "triton:gemv"
GEMV_MAX_M = 16  # dispatch.gemv.MAX_M, without importing it


LOW_M_BACKENDS = ("tinygemm", "cute-dsl")  # the backends a GPU profile can name as its low-M backend


def flashinfer_path(backend: str) -> str:
    return f"flashinfer:{backend}"


def lean_path(backend: str) -> str:
    """The registry name of a backend's lean call (dispatch/lean.py): runner and tactic resolved once, raw kernel."""
    return f"flashinfer-lean:{backend}"


def is_flashinfer(path: str) -> bool:
    return path.startswith((flashinfer_path(""), lean_path("")))


def is_lean(path: str) -> bool:
    return path.startswith(lean_path(""))


def is_kernel_path(path: str) -> bool:
    """Whether the dispatcher can run this path as a kernel of its own (a FlashInfer call or the GEMV), not F.linear."""
    return is_flashinfer(path) or path == GEMV


def is_choosable(path: str) -> bool:
    """Whether a table may choose this measured path cheaply: a lean FlashInfer call or the GEMV (a public FlashInfer
    call pays its per-call checks; F.linear is always a choice)."""
    return is_lean(path) or path == GEMV


def backend_of(path: str) -> str | None:
    """The FlashInfer backend a path name runs ('flashinfer:tinygemm' and 'flashinfer-lean:tinygemm' alike)."""
    return path.split(":", 1)[1] if is_flashinfer(path) else None


@dataclass(frozen=True)
class Backend:
    name: str  # mm_bf16(backend=...)
    sms: tuple[int, ...] | None  # SMs it runs on; None = any CUDA GPU
    n_multiple: int = 1
    k_multiple: int = 1
    align_bytes: int = 16  # data_ptr() alignment of input and weight
    max_m: int | None = None  # a low-M kernel: not swept above this M
    tune_by_default: bool = True  # FlashInfer's autotuner runs before timing unless --no-tune
    note: str = ""
    # FlashInfer's cuBLASLt keys its tuned entries by the exact M, so only bucket values find them; the CuTe DSL
    # runners key by the bucket M rounds up to, so every M up to this value finds its bucket's entry.
    bucketed_up_to: int = 0
    # Whether the kernel takes pdl=True. vLLM passes pdl=True on SM >= 90 (current_platform.is_arch_support_pdl());
    # FlashInfer's cuBLASLt requirement raises on pdl=True, and cute-dsl's cuBLASLt fallback ignores it.
    supports_pdl: bool = False

    path_name: str = ""  # the registry path where it is not flashinfer:<name> (the GEMV)

    @property
    def path(self) -> str:
        return self.path_name or flashinfer_path(self.name)

    def skip_reason(self, sm: int, n: int, k: int, m: int) -> str | None:
        """Why this backend cannot run a (shape, M) cell on this SM, or None."""
        if self.sms is not None and sm not in self.sms:
            return f"{self.path} needs SM{'/'.join(map(str, self.sms))}, this GPU is SM{sm}"
        if n % self.n_multiple:
            return f"{self.path} needs N % {self.n_multiple} == 0, N = {n}"
        if k % self.k_multiple:
            return f"{self.path} needs K % {self.k_multiple} == 0, K = {k}"
        if self.max_m is not None and m > self.max_m:
            return f"{self.path} is a low-M kernel, not swept above M = {self.max_m}"
        return None

    def tuned_entry_reachable(self, m: int, buckets: set[int]) -> bool:
        """Whether a call at this M can find the autotuner's tuned entry (m_is_bucket in the results)."""
        return m in buckets or m <= self.bucketed_up_to

    def pdl(self, wanted: bool) -> bool:
        """The pdl flag this backend is called with when the profile wants `wanted`."""
        return wanted and self.supports_pdl


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("tinygemm", (90, 100, 103, 110, 120, 121), n_multiple=16, k_multiple=8, max_m=2048,
            supports_pdl=True, note="TinyGEMM, tiles of 8 tokens"),
    Backend("cublaslt", None, note="FlashInfer's autotuned cuBLASLt"),
    # Tuning cuDNN builds and times every engine plan per bucket (~14 s for 3 buckets of one shape on an H200),
    # which alone would outlast the sweep; it runs its heuristic plan unless --tune-all.
    Backend("cudnn", None, tune_by_default=False, note="cuDNN graph GEMM (heuristic plan; --tune-all tunes it)"),
    # vLLM's _can_use_flashinfer_cutedsl_bf16: K % 128 and 32-byte aligned input and weight; any N.
    Backend("cute-dsl", (100, 103, 107), k_multiple=128, align_bytes=32, bucketed_up_to=32, supports_pdl=True,
            note="CuTeDSL kernels for M <= 32, cuBLASLt fallback above"),
    # SM100 backends that FlashInfer gates to [100, 103, 107]; their shape requirements are FlashInfer's own
    # requirement functions, which the correctness gate meets as a failed row, not modelled here.
    Backend("cutlass", (100, 103, 107), note="CUTLASS bf16 GEMM (SM100; not run here)"),
    Backend("tgv", (100, 103, 107), supports_pdl=True, note="TGV GEMM (SM100; not run here)"),
)}

# What the project's GEMV takes, as the dispatcher checks it (dispatch/eligible.py): Triton's tensor-core tiles (SM 80
# and newer; the SMs the profiles name), 16-byte aligned rows, M <= 16, no bias.
GEMV_RULE = Backend("gemv", (80, 86, 87, 89, 90, 100, 103, 107, 110, 120, 121), max_m=GEMV_MAX_M,
                    tune_by_default=False, note="the project's split-K GEMV (Triton)", path_name=GEMV)


def rule_of(path: str) -> Backend:
    """The eligibility rule of a kernel path (is_kernel_path): its FlashInfer backend's, or the GEMV's."""
    return GEMV_RULE if path == GEMV else BACKENDS[backend_of(path)]
