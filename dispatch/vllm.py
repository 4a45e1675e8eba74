"""What vLLM runs for an unquantized BF16 linear: the one model of vLLM in the harness, for one named version.

Every rule below cites the vLLM (or FlashInfer, at the version vLLM pins) file and function it models; docs/vllm.md
lists them. Nothing here imports vLLM: the rules are plain functions of the SM, the tensors' facts and the options a
server is started with, so they run and are tested on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shapes.grid import hybrid_buckets

VLLM_VERSION = "0.33.0"
FLASHINFER_VERSION = "0.7.2.post1"  # the flashinfer-python vLLM 0.33.0 pins

# vllm/model_executor/layers/utils.py, _FLASHINFER_BF16_BACKENDS: the only --linear-backend with a FlashInfer entry
FLAG = "flashinfer_cutedsl"
FLAG_BACKEND = "cute-dsl"
# FlashInfer's cute-dsl support (flashinfer/gemm/gemm_base.py, the cute-dsl requirement's SM list), which
# vllm/utils/flashinfer.py is_flashinfer_cutedsl_bf16_gemm_supported asks through is_flashinfer_bf16_gemm_supported
FLAG_SMS = (100, 103, 107)
# flashinfer/gemm/gemm_base.py _CUTE_DSL_BF16_MAX_M: CuTe DSL kernels up to this M, its cuBLASLt fallback above
CUTE_DSL_MAX_M = 32
# vllm/envs.py VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD; used by fused_moe/runner/shared_experts.py
# _determine_shared_experts_order: a MoE layer's shared expert runs on an auxiliary stream at <= this many tokens
SHARED_EXPERTS_STREAM_TOKENS = 256
# The seed PR (shared/context/seed-pr.txt): with the flag on, FlashInfer only at M <= 32, F.linear above
SEED_PR_MAX_M = 32


@dataclass(frozen=True)
class ServerDefaults:
    """vllm/engine/arg_utils.py EngineArgs.get_batch_defaults for the OpenAI API server, by device memory."""
    max_num_seqs: int
    max_num_batched_tokens: int


def server_defaults(memory_gib: float) -> ServerDefaults:
    """>= 160 GiB (B200, B300): 1024 sequences, 16384 tokens; >= 70 GiB (H100, H200; A100 excluded by name, which
    no profile here is): 1024 and 8192; smaller GPUs: 256 and 2048."""
    if memory_gib >= 160:
        return ServerDefaults(1024, 16384)
    if memory_gib >= 70:
        return ServerDefaults(1024, 8192)
    return ServerDefaults(256, 2048)


def flag_supported(sm: int) -> bool:
    """vllm/model_executor/layers/utils.py dispatch_unquantized_gemm: the flag's backend is taken only where
    is_flashinfer_cutedsl_bf16_gemm_supported() holds (FlashInfer's cute-dsl SMs, sm100a); elsewhere vLLM logs a
    warning and returns default_unquantized_gemm, which is F.linear."""
    return sm in FLAG_SMS


def capture_size(sm: int, max_num_seqs: int, decode_query_len: int = 1) -> int:
    """vllm/config/vllm.py VllmConfig._set_cudagraph_sizes, when max_cudagraph_capture_size is not given:
    min(max_num_seqs * decode_query_len * 2, 1024 on the SM 10.x family, 512 otherwise)."""
    ceiling = 1024 if sm // 10 == 10 else 512
    return min(max_num_seqs * decode_query_len * 2, ceiling)


def pdl(sm: int) -> bool:
    """vllm/platforms/cuda.py is_arch_support_pdl (passed by dispatch_unquantized_gemm): SM >= 90."""
    return sm >= 90


def can_use_cutedsl(sm: int, x: Any, weight: Any, bias: Any) -> bool:
    """vllm/model_executor/layers/utils.py _can_use_flashinfer_cutedsl_bf16, the per-call check inside the custom
    op: the SM 10.x family (is_device_capability_family(100)), then the tensors' half (cutedsl_tensors_ok)."""
    return sm // 10 == 10 and cutedsl_tensors_ok(x, weight, bias)


def cutedsl_tensors_ok(x: Any, weight: Any, bias: Any, k_multiple: int = 128) -> bool:
    """The tensors' half of _can_use_flashinfer_cutedsl_bf16: bf16 CUDA tensors on one device, both contiguous,
    K % 128 == 0, 32-byte aligned data pointers, non-empty; a bias bf16, 1-D of length N, contiguous, on that device,
    or none. F.linear otherwise."""
    import torch
    if x.ndim < 1 or weight.ndim != 2:
        return False
    if (not x.is_cuda or not weight.is_cuda or x.device != weight.device or x.dtype != torch.bfloat16
            or weight.dtype != torch.bfloat16 or not x.is_contiguous() or not weight.is_contiguous()):
        return False
    k, n = x.shape[-1], weight.shape[0]
    if (k <= 0 or n <= 0 or x.numel() == 0 or weight.shape[1] != k or k % k_multiple != 0 or x.data_ptr() % 32
            or weight.data_ptr() % 32):
        return False
    return bias is None or (bias.is_cuda and bias.device == x.device and bias.dtype == torch.bfloat16
                            and bias.ndim == 1 and bias.shape[0] == n and bias.is_contiguous())


def seed_pr_uses_flashinfer(sm: int, m: int) -> bool:
    """The seed PR's rule: gated on the flag (KernelConfig.use_flashinfer_cutedsl_bf16_gemm), so nothing changes
    where the flag is unsupported; where it is, FlashInfer at M <= 32 and F.linear above."""
    return flag_supported(sm) and m <= SEED_PR_MAX_M


def autotune_buckets(max_num_batched_tokens: int) -> list[int]:
    """vllm/model_executor/warmup/kernel_warmup.py _run_flashinfer_autotune_dummy_runs: one dummy forward at
    max_num_batched_tokens inside autotune(tuning_buckets=flashinfer_get_hybrid_num_tokens_buckets(that max),
    round_up=True); FlashInfer's get_hybrid_num_tokens_buckets (flashinfer/fused_moe/utils.py)."""
    return hybrid_buckets(max_num_batched_tokens)

