"""GPU profiles: the one place to add a GPU."""
from __future__ import annotations

import re
from dataclasses import dataclass

from dispatch import vllm
from harness.errors import HarnessError


@dataclass(frozen=True)
class GpuProfile:
    name: str
    sm: int  # major*10 + minor
    name_pattern: str  # the model name as a whole word of torch.cuda.get_device_name() ("H200" is not "GH200")
    flashinfer_backends: tuple[str, ...]  # mm_bf16 backends measured on this GPU
    low_m_backend: str  # what the dispatcher uses at M <= threshold
    memory_gb: float  # the GPU's memory (vendor figure, GB): vLLM's server defaults depend on it
    # A roofline guess of one GEMM's GPU time, only to size graphs and host-timing blocks (never reported): sustained
    # bf16 TFLOP/s and HBM GB/s. H100/H200 keep the figures every committed H200 run was sized with; the SM100
    # figures scale them by the B200's peaks (about 2.3x the math, 1.7x the memory bandwidth of an H200).
    sizing_tflops: float = 600.0
    sizing_gbps: float = 4000.0
    # Programmatic dependent launch as vLLM sets it (dispatch/vllm.py pdl): True on SM >= 90.
    # Every FlashInfer call of the harness passes it to the backends that take it (Backend.supports_pdl).
    pdl: bool = True
    # The vendor's nominal HBM bandwidth (GB/s), shown beside the ceilings a run measures (bench/ceiling.py); never
    # a ceiling itself.
    hbm_peak_gbps: float = 0.0
    # The files the package ships for this GPU (harness.shipped.KINDS): a kind named here and missing from an
    # installation is an error where it is read, never a silently different verdict.
    ships: tuple[str, ...] = ()
    # The part its table is fitted on: the SM count (the GEMV's K splits and every tile count depend on it) and the
    # memory (memory_gb, within MEMORY_SLACK). A GPU of the same model name that differs (PCIe, NVL, a MIG slice) is
    # served no table. None: the table does not depend on the part (a single threshold rule).
    sm_count: int | None = None

    @property
    def server(self) -> vllm.ServerDefaults:
        """vLLM's OpenAI-server defaults on this GPU (max_num_seqs, max_num_batched_tokens)."""
        return vllm.server_defaults(self.memory_gb * 1e9 / 2 ** 30)

    @property
    def capture_size(self) -> int:
        """vLLM's default largest CUDA-graph capture size on this GPU (dispatch/vllm.py capture_size)."""
        return self.capture_size_for()

    def capture_size_for(self, max_num_seqs: int | None = None) -> int:
        """The capture size vLLM derives from max_num_seqs (its server default on this GPU when None)."""
        return vllm.capture_size(self.sm, max_num_seqs or self.server.max_num_seqs)


PROFILES: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("h100", 90, "H100", ("tinygemm", "cublaslt", "cudnn"), "tinygemm", 80, hbm_peak_gbps=3350.0,
               ships=("table", "noise", "forward-noise", "baseline"), sm_count=132),  # the H100 SXM 80 GB (HBM3)
    GpuProfile("h200", 90, "H200", ("tinygemm", "cublaslt", "cudnn"), "tinygemm", 141, hbm_peak_gbps=4800.0,
               ships=("table", "noise", "forward-noise", "baseline"), sm_count=132),  # the H200 SXM 141 GB
    # TinyGEMM's SM list includes 100: measured beside cute-dsl, the low-M backend vLLM runs there
    GpuProfile("b200", 100, "B200", ("cute-dsl", "tinygemm", "cublaslt", "cudnn"), "cute-dsl", 180, 1380.0, 6700.0,
               hbm_peak_gbps=8000.0, ships=("table",)),
    GpuProfile("gb200", 100, "GB200", ("cute-dsl", "tinygemm", "cublaslt", "cudnn"), "cute-dsl", 186, 1380.0, 6700.0,
               hbm_peak_gbps=8000.0, ships=("table",)),
)}


MEMORY_SLACK = 0.05  # a part's memory as torch reports it (GiB) within this share of its vendor figure


def variant_problem(profile: GpuProfile, sm_count: int, memory_bytes: int) -> str:
    """'' where a GPU of the profile's model is the part its table was fitted on; else what differs."""
    if profile.sm_count is None:
        return ""
    gib = memory_bytes / 2 ** 30
    if sm_count != profile.sm_count or abs(gib / profile.memory_gb - 1) > MEMORY_SLACK:
        return (f"{sm_count} SMs and {gib:.0f} GiB, where the {profile.name} table was fitted on {profile.sm_count} "
                f"SMs and {profile.memory_gb:g} GB")
    return ""


def get_profile(name: str) -> GpuProfile:
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise HarnessError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)} (add one in dispatch/profiles.py)") from None


def matches(profile: GpuProfile, device_name: str, sm: int) -> bool:
    """The one GPU-identity rule: the model name as a whole word and the SM. A substring test would take a GB200
    for a B200 and a GH200 for an H200 (other memory, other clocks, another host link)."""
    return sm == profile.sm and re.search(rf"(?<![A-Za-z0-9]){re.escape(profile.name_pattern)}(?![A-Za-z0-9])",
                                          device_name) is not None


def sm_of(device: int = 0) -> int:
    """The SM number (major * 10 + minor) of a CUDA device, as the profiles name it."""
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def this_gpu(device: int = 0) -> tuple[str, int]:
    """(device name, SM) of a CUDA device: what the identity rule reads."""
    import torch
    return torch.cuda.get_device_name(device), sm_of(device)


def detect_profile(device_name: str, sm: int) -> GpuProfile | None:
    """The profile of this GPU, or None when no profile describes it."""
    return next((p for p in PROFILES.values() if matches(p, device_name, sm)), None)


def check_device(profile: GpuProfile, device_name: str, sm: int, allow_mismatch: bool = False) -> None:
    """Stop when the detected GPU is not the profile's, unless the user overrides."""
    if allow_mismatch:
        return
    if not matches(profile, device_name, sm):
        raise HarnessError(
            f"GPU profile {profile.name} expects an SM{profile.sm} {profile.name_pattern}, but this GPU is "
            f"{device_name!r} (SM{sm}); pick the matching profile or pass --allow-mismatch")
