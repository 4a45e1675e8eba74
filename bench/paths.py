"""The path registry: the one place to add a GEMM path.

A path turns (x [M, K], w [N, K]) into y [M, N]. Each has a role, and every consumer asks the registry by role:
- baseline: F.linear (`aten`), what every ratio is taken against;
- low-m: a FlashInfer backend for small M (TinyGEMM, CuTe DSL); which one a GPU uses is its profile's low_m_backend;
- candidate: another FlashInfer backend (cuBLASLt, cuDNN); `flashinfer:cublaslt` is also what the all-FlashInfer
  hypothetical (flashinfer-everywhere) runs above M = 32 on SM90 (TUNED_CUBLASLT);
- a low-M backend also has `vllm-op:<backend>`: the public call inside vLLM's custom-op wrapper and per-call check;
- dispatcher: `dispatch.linear`, which runs the baseline or a FlashInfer path by its table and the regime.

Each FlashInfer backend has two paths: `flashinfer:<backend>`, FlashInfer's public mm_bf16 with every per-call check,
and `flashinfer-lean:<backend>` (dispatch/lean.py), the same kernel with runner and tactic resolved once. Both run
the same tuned tactics: tuning goes through the public call, whose autotuner cache the lean call reads.

A path is built with the pdl flag of the GPU profile (vLLM's: True on SM >= 90); backends that take no pdl ignore it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import dispatch
from bench.vllm_op import op_call
from dispatch.backends import (ATEN, BACKENDS, DISPATCH, GEMV, LOW_M_BACKENDS, Backend, backend_of, flashinfer_path,
                               is_lean, lean_path)
from dispatch.gemv import KERNEL_NAME as GEMV_KERNEL
from dispatch.gemv import GemvCall
from dispatch.lean import LEAN_BACKENDS, lean_call, public_call
from harness.errors import HarnessError

LinearFn = Callable[[Any, Any], Any]
GEMV_PDL = "triton:gemv-pdl"  # the GEMV launched with PDL: a forward measurement (table-pdl), not a table's choice
GEMV_PLAIN = "triton:gemv-plain"  # the GEMV launched without PDL: a forward measurement (table-plain)


ROLES = ("baseline", "low-m", "candidate", "dispatcher")


@dataclass(frozen=True)
class GemmPath:
    name: str
    build: Callable[[bool], LinearFn]  # build(pdl); imports lazily, so CPU-only machines can list paths
    role: str  # one of ROLES
    backend: Backend | None = None  # a FlashInfer path: the backend, whose rule says which cells it can run
    note: str = field(default="")
    max_m: int | None = None  # a kernel of the project's own that takes M up to this only
    kernel: str | None = None  # the one kernel a captured call must run (a project kernel), else no check

    def foreign_kernels(self, kernels) -> str | None:
        """Why a captured graph of this path's calls is not a measurement of it (it ran other kernels than its
        own: a fallback taken while capturing), or None."""
        if self.kernel is None or set(kernels) == {self.kernel}:
            return None
        return (f"its captured calls ran {', '.join(sorted(set(kernels))) or 'no kernel'}, not {self.kernel}: the "
                f"call fell back while captured, so the row would time another path")

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
        if self.max_m is not None and m > self.max_m:
            return f"{self.name} takes M <= {self.max_m}"
        if self.max_m is not None and sm < 80:
            return f"{self.name} needs SM 80 or newer (Triton's tensor-core tiles), this GPU is SM {sm}"
        return self.backend.skip_reason(sm, n, k, m) if self.backend else None

    def tuning_call(self, pdl: bool) -> LinearFn:
        """What FlashInfer's autotuner is run through for this path: the public call of its backend (a lean call
        has no choose_one; it reads the entries the public call tuned, keyed alike, pdl included)."""
        if self.backend is None:
            raise HarnessError(f"{self.name} is not a FlashInfer path; nothing to tune")
        return _public(self.backend.name)(pdl)


def _aten(pdl: bool) -> LinearFn:
    import torch.nn.functional as F
    return F.linear


def _two_arg(fn) -> LinearFn:
    def linear(x, w):
        return fn(x, w, None)
    return linear


def _public(backend: str) -> Callable[[bool], LinearFn]:
    def build(pdl: bool) -> LinearFn:
        return _two_arg(public_call(backend, BACKENDS[backend].pdl(pdl)))
    return build


def _lean(backend: str) -> Callable[[bool], LinearFn]:
    def build(pdl: bool) -> LinearFn:
        return _two_arg(lean_call(backend, BACKENDS[backend].pdl(pdl)))
    return build


def _vllm_op(backend: str) -> Callable[[bool], LinearFn]:
    def build(pdl: bool) -> LinearFn:
        return op_call(backend, BACKENDS[backend].pdl(pdl))
    return build


# how each GEMV path launches (GemvCall's pdl): as its configuration says (as the dispatcher does), every call with
# PDL, every call plainly
GEMV_LAUNCHES: dict[str, bool | None] = {GEMV: None, GEMV_PDL: True, GEMV_PLAIN: False}


def _gemv(name: str) -> Callable[[bool], LinearFn]:
    """The build of GEMV path `name`: launched as GEMV_LAUNCHES says for it, whatever the profile's pdl."""
    def build(pdl: bool) -> LinearFn:
        return GemvCall(tune=True, pdl=GEMV_LAUNCHES[name])
    return build


def _dispatch(pdl: bool) -> LinearFn:
    return dispatch.linear  # the dispatcher reads pdl from the GPU's profile itself


def _role(b: Backend) -> str:
    return "low-m" if b.name in LOW_M_BACKENDS else "candidate"


def _flashinfer_paths(b: Backend) -> list[GemmPath]:
    paths = [GemmPath(b.path, _public(b.name), _role(b), b, b.note)]
    if b.name in LEAN_BACKENDS:
        paths.append(GemmPath(lean_path(b.name), _lean(b.name), _role(b), b,
                              f"{b.note}; lean call: runner and tactic resolved once (dispatch/lean.py)"))
    if b.name in LOW_M_BACKENDS:
        paths.append(GemmPath(vllm_op_path(b.name), _vllm_op(b.name), _role(b), b,
                              f"{b.note}; through a custom op with vLLM's per-call check, as vLLM calls FlashInfer "
                              f"(bench/vllm_op.py)"))
    return paths


def unchoosable_reason(path: GemmPath) -> str | None:
    """Why a default sweep does not time this path: a candidate backend without a lean call is one the dispatcher
    cannot run (it runs lean calls and F.linear only), and whose public call's host time already rules it out
    eagerly; None for every other path."""
    if path.role != "candidate" or path.backend is None or path.backend.name in LEAN_BACKENDS:
        return None
    return (f"{path.name} has no lean call, so the dispatcher cannot choose it: not timed by default "
            f"(--all or --paths times it)")


def vllm_op_path(backend: str) -> str:
    """The registry name of a backend called the way vLLM calls FlashInfer (bench/vllm_op.py)."""
    return f"vllm-op:{backend}"


PATHS: dict[str, GemmPath] = {p.name: p for p in (
    GemmPath(ATEN, _aten, "baseline", note="torch.nn.functional.linear(x, w)"),
    *(p for b in BACKENDS.values() for p in _flashinfer_paths(b)),
    GemmPath(GEMV, _gemv(GEMV), "candidate", max_m=16, kernel=GEMV_KERNEL,
             note="dispatch/gemv.py: the project's split-K GEMV (Triton, one kernel), its configuration tuned per "
                  "(N, K, M) over rotated operands by CUDA-graph timing, served like FlashInfer's tactics"),
    GemmPath(GEMV_PDL, _gemv(GEMV_PDL), "candidate", max_m=16, kernel=GEMV_KERNEL,
             note="the GEMV with each call a programmatic dependent launch: its first weight loads overlap the kernel "
                  "before it (SM90 and newer); measured in forwards (table-pdl), never chosen by a table"),
    GemmPath(GEMV_PLAIN, _gemv(GEMV_PLAIN), "candidate", max_m=16, kernel=GEMV_KERNEL,
             note="the GEMV with every call launched plainly, whatever its configuration says: measured in forwards "
                  "(table-plain, beside the dispatcher's PDL choices), never chosen by a table"),
    GemmPath(DISPATCH, _dispatch, "dispatcher", note="dispatch.linear: its table's path for the shape, M and regime "
                                                     "(graph while capturing, eager otherwise)"),
)}
TUNED_CUBLASLT = flashinfer_path("cublaslt")  # FlashInfer's autotuned cuBLASLt: flashinfer-everywhere above M = 32


def low_m_path(profile) -> str:
    """The registry name of the GPU profile's low-M backend (FlashInfer's public call)."""
    return flashinfer_path(profile.low_m_backend)


def lean_low_m_path(profile) -> str:
    """The registry name of the lean call of the GPU profile's low-M backend."""
    return lean_path(profile.low_m_backend)


def flashinfer_paths(names) -> list[str]:
    """The FlashInfer paths among `names`, in their order."""
    return [n for n in names if n in PATHS and PATHS[n].flashinfer_backend]


def paths_for(profile_backends: tuple[str, ...], spec: str | None = None) -> list[GemmPath]:
    """The profile's paths (aten, its FlashInfer backends' public and lean calls, the GEMV, dispatch), or those named
    in a comma list."""
    if spec:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise HarnessError(f"--paths {spec!r} names no path; known: {', '.join(PATHS)}")
        unknown = [n for n in names if n not in PATHS]
        if unknown:
            raise HarnessError(f"unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise HarnessError(f"--paths names {', '.join(twice)} more than once; name each path once")
        return [PATHS[n] for n in names]
    fi = [PATHS[f(b)] for b in profile_backends for f in (flashinfer_path, lean_path) if f(b) in PATHS]
    return [PATHS[ATEN], *fi, PATHS[GEMV], PATHS[DISPATCH]]


def kernel_twins(names: list[str]) -> dict[str, tuple[str, ...]]:
    """Per path, the paths that may run its very kernels (replay_interleaved checks their digests): a public
    FlashInfer call its lean twin; the dispatcher whatever it chose (lean calls first, then F.linear, then public)."""
    twins: dict[str, tuple[str, ...]] = {}
    for name in names:
        backend = backend_of(name)
        if backend is not None and not is_lean(name) and lean_path(backend) in names:
            twins[name] = (lean_path(backend),)
    if DISPATCH in names:
        # not the GEMV: its kernel has one name for every configuration, so a digest cannot tell the dispatcher's
        # configuration from the GEMV path's; where the dispatcher runs it, it is timed itself
        order = sorted((n for n in names if n not in (DISPATCH, GEMV)),
                       key=lambda n: (0 if is_lean(n) else 1 if n == ATEN else 2, n))
        twins[DISPATCH] = tuple(order)
    return twins
