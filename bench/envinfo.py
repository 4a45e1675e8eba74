"""Environment fingerprint of a run: GPU, driver, libraries, harness SHA, clocks."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dispatch.profiles import sm_of
from harness.floors import FLOORS

ROOT = Path(__file__).resolve().parent.parent


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    """The harness commit; BENCH_GIT_SHA stands in where the tree was copied without .git (remote GPU hosts)."""
    if os.environ.get("BENCH_GIT_SHA"):
        return os.environ["BENCH_GIT_SHA"]
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def source_digest(root: Path | None = None) -> str:
    """A digest of the harness's own source (every .py and .cpp file of its packages, by path and content): which code
    ran, also where the copy's git state is stale or absent (a GPU host's copy of a working tree)."""
    import hashlib

    root = root or ROOT
    h = hashlib.sha256()
    for pkg in FLOORS:
        for f in sorted(p for p in (root / pkg).rglob("*") if p.suffix in (".py", ".cpp") and p.is_file()):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def nvml_index(cuda_device: int = 0) -> int:
    """NVML's index of a CUDA device: NVML ignores CUDA_VISIBLE_DEVICES (a --devices worker sees its GPU as CUDA
    device 0, which NVML may call 1). torch maps it where it can (its private helper); else the same index."""
    try:
        import torch
        return int(torch.cuda._get_nvml_device_index(cuda_device))
    except Exception:
        return cuda_device


def nvml_clocks() -> dict[str, Any]:
    """SM/memory clocks now and their maxima, and the throttle reasons seen (NVML, when present)."""
    try:
        import pynvml as nv
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(nvml_index(0))
        info = {
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "throttle_reasons": int(nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "power_limit_w": nv.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        }
        nv.nvmlShutdown()
        return info
    except Exception as exc:  # NVML missing or not permitted: record why, never fail the run
        return {"error": f"{type(exc).__name__}: {exc}"}


class ClockReader:
    """The SM clock, board power and clock-event (throttle) reasons now, read through NVML after a timed sample (out
    of its timing window): what explains a sample that ran slow. read() gives None where NVML is missing."""

    def __init__(self, cuda_device: int = 0):
        try:
            import pynvml as nv
            nv.nvmlInit()
            self._nv, self._h = nv, nv.nvmlDeviceGetHandleByIndex(nvml_index(cuda_device))
        except Exception:
            self._nv = None

    def max_mhz(self) -> int | None:
        """The SM clock's maximum (NVML), or None."""
        if self._nv is None:
            return None
        try:
            return int(self._nv.nvmlDeviceGetMaxClockInfo(self._h, self._nv.NVML_CLOCK_SM))
        except Exception:
            return None

    def read(self) -> tuple[int, float, int] | None:
        if self._nv is None:
            return None
        nv, h = self._nv, self._h
        try:
            return (nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), nv.nvmlDeviceGetPowerUsage(h) / 1000,
                    int(nv.nvmlDeviceGetCurrentClocksEventReasons(h)))
        except Exception:
            return None


def fingerprint() -> dict[str, Any]:
    import torch
    props = torch.cuda.get_device_properties(0)
    try:
        import flashinfer
        fi_version = flashinfer.__version__
    except Exception:
        fi_version = None
    try:
        cublas = torch._C._cuda_getCompiledVersion()  # CUDA runtime torch was built with
    except Exception:
        cublas = None
    driver = None
    try:
        import pynvml as nv
        nv.nvmlInit()
        driver = nv.nvmlSystemGetDriverVersion()
        nv.nvmlShutdown()
    except Exception:
        pass
    return {
        "gpu_name": torch.cuda.get_device_name(0),
        "sm": sm_of(0),
        "sm_count": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size,
        "memory_bytes": props.total_memory,
        "driver": driver,
        "driver_major": int(driver.split(".")[0]) if driver else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "cublas": _version("nvidia-cublas") or _version("nvidia-cublas-cu12") or cublas,
        "cudnn": torch.backends.cudnn.version(),
        "flashinfer": fi_version,
        "cupti_python": _version("cupti-python"),
        "libcupti": _version("nvidia-cuda-cupti") or _version("nvidia-cuda-cupti-cu12"),
        "cutlass_dsl": _version("nvidia-cutlass-dsl"),
        "python": platform.python_version(),
        "harness_sha": git_sha(),
        "harness_source": source_digest(),
        "preferred_blas": str(torch.backends.cuda.preferred_blas_library()),
        "allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }


# run.json's format: 1 for the runs written before the key existed, 2 from the run that records its read ceilings.
# Readers take every format in RUN_FORMATS and refuse a newer one (bench.results.load_run_info).
RUN_FORMAT = 3  # 3: a sweep's settings as codes and numbers (host_blocks, stopping, gpu_twins, skip_*), not prose
RUN_FORMATS = (1, 2, 3)


def run_info(command: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"format": RUN_FORMAT, "fingerprint": fingerprint(), "command": " ".join(command or sys.argv),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra}
