"""Host-time anatomy, the logic: timed entry points ("layers"), paired subtraction into self costs ("segments"),
and the opaque custom op registered the way vLLM registers its FlashInfer GEMM. Pure Python plus torch.library;
tested on CPU. The GPU layers themselves are in bench/anatomy_gpu.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from bench.stats import summary
from dispatch.vllm import cutedsl_tensors_ok

LIBRARY = "blb_anatomy"  # our own fragment, so vLLM's "vllm" namespace is never touched


@dataclass(frozen=True)
class Segment:
    """A self cost: `outer` minus every layer in `inner`, computed per round (paired), then summarised."""
    name: str
    outer: str
    inner: tuple[str, ...] = ()
    unless: str | None = None  # left out where this layer was timed (an alternative split of the same cost)


# Outermost to innermost: the FlashInfer path as vLLM's compiled region runs it above the capture size.
FLASHINFER_SEGMENTS: tuple[Segment, ...] = (
    Segment("inductor size/stride/alignment asserts", "inductor_wrapper", ("custom_op",)),
    Segment("torch.library dispatch to the Python kernel", "custom_op", ("vllm_impl",)),
    Segment("vLLM eligibility checks and views", "vllm_impl", ("mm_bf16",)),
    Segment("backend_requirement checks", "mm_bf16", ("mm_bf16_skip_check",)),
    Segment("decorator wrappers (skip_check path)", "mm_bf16_skip_check", ("mm_bf16_body",)),
    Segment("mm_bf16 body: output alloc, workspace, backend pick", "mm_bf16_body", ("gemm_dispatch",)),
    Segment("runner construction", "runner_build"),
    Segment("autotuner lookup (choose_one)", "choose_one"),
    Segment("gemm dispatch glue", "gemm_dispatch", ("choose_one", "runner_call_fresh")),
    Segment("per-call runner state (cuBLASLt heuristic query)", "runner_call_fresh", ("runner_build", "runner_call_cached")),
    Segment("runner forward", "runner_call_cached", ("raw_kernel",)),
    Segment("raw kernel call (TVM-FFI launch)", "raw_kernel"),
    # CuTe DSL's compiled launch has no entry point of its own: the runner's whole call is one segment there, so the
    # segments still add up to the whole call
    Segment("runner forward with the kernel launch (no separate raw entry point)", "runner_call_cached",
            unless="raw_kernel"),
)
FLASHINFER_TOTAL = "inductor_wrapper"
NULL_OP_SEGMENT = Segment("torch.library dispatch (null op over F.linear)", "null_custom_op", ("F.linear",))
ATEN_LAYERS = ("F.linear", "torch.mm", "torch.mm(out=)", "aten.linear.default", "inductor aten: empty_strided+mm(out=)")


def segment_costs(per_round: dict[str, Sequence[float]], segments: Sequence[Segment]
                  ) -> list[tuple[Segment, float, float, float]]:
    """(segment, value, p20, p80) in µs. The value is median(outer) minus the medians of its inner layers, so the
    segments of a chain add up exactly to its outermost layer (a stacked bar's height is the measured total); p20/p80
    are those of the per-round paired differences, the segment's spread. A segment whose layers were not all timed
    is left out. Values are reported as measured: a small negative one means 'below the noise'."""
    out = []
    for seg in segments:
        names = (seg.outer, *seg.inner)
        if any(n not in per_round for n in names) or (seg.unless is not None and seg.unless in per_round):
            continue
        value = summary(per_round[seg.outer])[0] - sum(summary(per_round[n])[0] for n in seg.inner)
        rounds = min(len(per_round[n]) for n in names)
        diffs = [per_round[seg.outer][r] - sum(per_round[n][r] for n in seg.inner) for r in range(rounds)]
        _, p20, p80 = summary(diffs)
        out.append((seg, value, p20, p80))
    return out


def register_op(name: str, impl: Callable, dispatch_key: str, fake: Callable | None = None):
    """Define LIBRARY::name from impl's type hints and register impl for one dispatch key, as vLLM's
    direct_register_custom_op does (infer_schema, Library(..., "FRAGMENT"), impl, fake). Returns the op packet.
    Registering the same name twice in a process returns the first registration."""
    import torch
    from torch.library import Library, infer_schema
    if name in _REGISTERED:
        return _REGISTERED[name][1]
    lib = Library(LIBRARY, "FRAGMENT")
    lib.define(name + infer_schema(impl, mutates_args=[]))
    lib.impl(name, impl, dispatch_key=dispatch_key)
    if fake is not None:
        lib._register_fake(name, fake)
    op = getattr(getattr(torch.ops, LIBRARY), name)
    _REGISTERED[name] = (lib, op)  # the Library object must stay alive, or the registration is undone
    return op


_REGISTERED: dict[str, tuple[Any, Any]] = {}


def inductor_style(op_default: Callable, args: tuple, size: tuple[int, ...], stride: tuple[int, ...], name: str
                   ) -> Callable[[], Any]:
    """What Inductor's wrapper code does around a FallbackKernel: call op.default, then assert the output's size,
    stride and 16-byte alignment (config.size_asserts and alignment_asserts default to on)."""
    from torch._C._dynamo.guards import assert_alignment, assert_size_stride

    def call():
        buf = op_default(*args)
        assert_size_stride(buf, size, stride, name)
        assert_alignment(buf, 16, name)
        return buf
    return call


# vLLM's per-call eligibility test for its FlashInfer BF16 GEMM (utils.py _can_use_flashinfer_cutedsl_bf16), minus
# the platform check, which vLLM caches; the same ~20 tensor attribute reads (one function, no wrapper frame)
can_use_flashinfer = cutedsl_tensors_ok
