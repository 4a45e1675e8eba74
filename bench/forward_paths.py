"""Which registry path each linear of a forward runs under a forward-wide rule (CPU only, shared by the measured
forward in bench/forward.py and the cell-sum model of it in calibrate/forward_model.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from bench.paths import ATEN, DISPATCH, GEMV, GEMV_PDL, GEMV_PLAIN, PATHS, TUNED_CUBLASLT, low_m_path, vllm_op_path
from dispatch import vllm
from dispatch.profiles import GpuProfile
from harness.errors import HarnessError
from shapes.derive import ForwardLinear
from shapes.siblings import FusedLinear

# What vLLM 0.33.0 runs (dispatch/vllm.py models it, docs/vllm.md cites each rule's source)
VLLM_DEFAULT = "vllm-default"
VLLM_FLAG = "vllm-flag"
SEED_PR = "seed-pr"
# Not a vLLM behaviour: FlashInfer on every linear, its low-M backend at M <= 32 and its tuned cuBLASLt above (what
# the harness called vLLM's flag before it modelled vLLM per SM; on SM90 vLLM never runs it)
FLASHINFER_EVERYWHERE = "flashinfer-everywhere"
# The table's choices called straight through the registry's path functions, bound per regime: the dispatcher with
# no per-call work of its own. dispatch over this, in the same forward, is what the bound layer itself costs.
TABLE_DIRECT = "table-direct"
# The dispatcher with its Python bound layer, where `dispatch` runs the C++ one (dispatch/native.py): the two side
# by side in one run
DISPATCH_PYTHON = "dispatch-python"
# table-direct with every GEMV call a programmatic dependent launch (dispatch/gemv.py): what PDL gives the GEMV in a
# forward, where consecutive linears may overlap
TABLE_PDL = "table-pdl"
# table-direct with every GEMV call launched plainly, whatever its configuration says: beside the dispatcher, which
# launches each as its configuration says, what the tuner's PDL choices give a captured forward
TABLE_PLAIN = "table-plain"
GEMV_PATH_OF_RULE = {TABLE_PDL: GEMV_PDL, TABLE_PLAIN: GEMV_PLAIN}  # the GEMV path each of these two rules runs
# table-direct over the forward with each group of sibling linears as one GEMM (shapes/siblings.py): what fusing
# them would give; a measurement, not something the dispatcher does
FUSED_SIBLINGS = "fused-siblings"
VLLM_FUSED = "vllm-fused"  # vLLM default's F.linear over the fused forward: what fusing the siblings gives vLLM
FUSED_RULES = (FUSED_SIBLINGS, VLLM_FUSED)  # the rules that run the forward with its siblings fused
# the table's choices called directly, per regime
TABLE_DIRECT_RULES = (TABLE_DIRECT, TABLE_PDL, TABLE_PLAIN, FUSED_SIBLINGS)
NOT_SINGLE_PATHS = (*TABLE_DIRECT_RULES, DISPATCH_PYTHON)  # the dispatcher's twins: never the best single path
BOUND_LAYER_RULES = (DISPATCH, DISPATCH_PYTHON)  # the dispatcher bound per layer (dispatch.bind)
DISPATCHER_RULES = (DISPATCH, *NOT_SINGLE_PATHS)  # every rule that runs the table's choices
NEVER_BEST = (*NOT_SINGLE_PATHS, VLLM_FUSED)  # never the best single path: twins, and forwards of another structure
RULES = {
    ATEN: "F.linear for every linear",
    VLLM_DEFAULT: f"what vLLM {vllm.VLLM_VERSION} runs by default: F.linear for every linear",
    VLLM_FLAG: f"what vLLM {vllm.VLLM_VERSION} runs with --linear-backend {vllm.FLAG} on this SM: F.linear where "
               f"the flag is unsupported (SM90); on SM {'/'.join(map(str, vllm.FLAG_SMS))} its custom op with "
               f"FlashInfer's cute-dsl backend at every M (CuTe DSL kernels to M = {vllm.CUTE_DSL_MAX_M}, its "
               f"cuBLASLt fallback above) where vLLM's per-call check passes; lm_head F.linear",
    SEED_PR: f"the seed PR's rule as it runs on this SM: nothing changes where the flag is unsupported (F.linear); "
             f"on SM100 vLLM's op with cute-dsl at M <= {vllm.SEED_PR_MAX_M}, F.linear above; lm_head F.linear",
    FLASHINFER_EVERYWHERE: "a hypothetical no vLLM version runs on SM90: FlashInfer's public low-M backend at "
                           "M <= 32 where eligible, its tuned cuBLASLt above (SM100: cute-dsl with its own "
                           "fallback); lm_head F.linear",
    DISPATCH: "the dispatcher bound per layer (dispatch.bind) with the committed table: its graph ranges while "
              "capturing, eager ranges otherwise; lm_head F.linear",
    TABLE_DIRECT: "the committed table's graph and eager choices called directly, without the bound layer: the "
                  "dispatcher's choices at no per-call cost (dispatch over it is the bound layer's own cost)",
    TABLE_PDL: "table-direct with every GEMV call launched as a programmatic dependent launch, each one's first "
               "weight loads overlapping the kernel before it (a measurement: the dispatcher launches each as its "
               "configuration says)",
    TABLE_PLAIN: "table-direct with every GEMV call launched plainly (a measurement: beside dispatch, which launches "
                 "each as its configuration says, what the tuner's PDL choices give a captured forward)",
    FUSED_SIBLINGS: "table-direct with the linears of a block that read one input as one GEMM over their "
                    "concatenated weights (in_proj_qkvz + in_proj_ba; shared-expert gate_up + router gate + "
                    "shared-expert gate), each running the table's choice for its largest member where that kernel takes "
                    "the fused shape, else the GEMV at M <= 16, else F.linear (a measurement: vLLM 0.33.0 and the "
                    "dispatcher run them apart)",
    VLLM_FUSED: f"vLLM {vllm.VLLM_VERSION} default's F.linear on every linear of the forward with the same sibling "
                "linears fused as in fused-siblings: what fusing them would give vLLM (a measurement)",
    DISPATCH_PYTHON: "the dispatcher bound per layer with its Python bound layer (dispatch.bind(w, native=False)); "
                     "`dispatch` runs the C++ layer where it is built (run.json: dispatch_layer)",
}
# Rules that forward runs measured before the vLLM rules were modelled per SM (docs/vllm.md): read, never run anew.
# 'vllm-flashinfer' is flashinfer-everywhere under its old name; 'seed-fix' ran the public low-M backend at
# M <= 32 and F.linear above, which vLLM does not run on SM90.
# 'dispatch-no-idle' was the dispatcher with its table's idle ranges left out, which is what `dispatch` is now.
LEGACY_RULES = {"vllm-flashinfer": FLASHINFER_EVERYWHERE, "seed-fix": "seed-fix", "dispatch-no-idle": DISPATCH}


def threshold_base(profile: GpuProfile) -> str:
    """The registry path a single-threshold rule for vLLM runs at M <= T: the low-M backend through vLLM's op."""
    return vllm_op_path(profile.low_m_backend)


def default_rules(profile: GpuProfile) -> tuple[str, ...]:
    """What `bench forward` measures by default: all-aten (every ratio's reference), the three vLLM rules (those
    that run the same paths as an earlier one on every linear are measured once: bench/forward.py), the low-M
    backend through vLLM's op everywhere it runs (the single-threshold rules are read off it and vllm-default), and
    the dispatcher."""
    return (ATEN, VLLM_DEFAULT, VLLM_FLAG, SEED_PR, threshold_base(profile), DISPATCH)


# vLLM calls its LM head through dispatch_unquantized_gemm("auto") (vllm/model_executor/layers/
# vocab_parallel_embedding.py, UnquantizedEmbeddingMethod.apply), which is F.linear on every GPU, so no rule a
# dispatcher in vLLM could follow changes it: every rule, a registry path run everywhere included, runs it with
# F.linear. Forward runs from before this (no `lm_head_rule` in run.json) ran registry paths on the LM head too.
LM_HEAD_RULE = "F.linear under every rule"


class Table(Protocol):
    def choose(self, n: int, k: int, m: int, regime: str = "graph") -> str: ...


def known_rules() -> list[str]:
    return list(dict.fromkeys([*RULES, *PATHS]))


def check_rules(names: list[str]) -> list[str]:
    if not names:
        raise HarnessError(f"--paths names no path; known: {', '.join(known_rules())}")
    unknown = [n for n in names if n not in RULES and n not in PATHS]
    if unknown:
        raise HarnessError(f"unknown forward path(s) {', '.join(unknown)}; known: {', '.join(known_rules())}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise HarnessError(f"--paths names {', '.join(twice)} more than once; name each path once")
    return names


def runnable(path: str, sm: int, linear: ForwardLinear, m: int) -> bool:
    return PATHS[path].skip_reason(sm, linear.n, linear.k, m) is None


def flashinfer_everywhere_choice(low: str, low_m_backend: str, m: int, can_run: Callable[[str], bool]) -> str:
    """The all-FlashInfer hypothetical for one linear at M: `low` is the low-M backend's path; CuTe DSL (SM100) is
    one runner set with its own cuBLASLt fallback above M = 32; otherwise FlashInfer's tuned cuBLASLt above."""
    if low_m_backend == "cute-dsl":
        return low if can_run(low) else ATEN
    if m <= vllm.CUTE_DSL_MAX_M and can_run(low):
        return low
    return TUNED_CUBLASLT if can_run(TUNED_CUBLASLT) else ATEN


def vllm_choice(rule: str, m: int, sm: int, can_run: Callable[[str], bool]) -> str:
    """What vLLM runs for one linear under vllm-default, vllm-flag or seed-pr (dispatch/vllm.py): F.linear, or the
    flag's backend through vLLM's op where the flag is supported, the rule takes M, and vLLM's check passes."""
    op = vllm_op_path(vllm.FLAG_BACKEND)
    if rule == VLLM_FLAG and vllm.flag_supported(sm):
        return op if can_run(op) else ATEN
    if rule == SEED_PR and vllm.seed_pr_uses_flashinfer(sm, m):
        return op if can_run(op) else ATEN
    return ATEN


@dataclass(frozen=True)
class Target:
    """Where a forward's rules choose: this GPU's SM and profile, the table the dispatcher rules run, and whether
    registry paths run the LM head too (as forwards did before they ran them on it)."""
    sm: int
    profile: GpuProfile
    table: Table | None
    paths_run_lm_head: bool = False


def path_for(rule: str, linear: ForwardLinear, m: int, target: Target, regime: str = "graph") -> str:
    """The registry path name one linear runs in a regime; 'aten' wherever the rule's kernel cannot take the linear,
    and on the LM head (LM_HEAD_RULE, unless target.paths_run_lm_head). Only the dispatcher's choice depends on the
    regime."""
    sm, profile, table, paths_run_lm_head = target.sm, target.profile, target.table, target.paths_run_lm_head
    low = low_m_path(profile)
    if rule == "seed-fix":
        return low if linear.layer != "lm_head" and m <= vllm.SEED_PR_MAX_M and runnable(low, sm, linear, m) else ATEN
    rule = LEGACY_RULES.get(rule, rule)
    if rule not in RULES and rule not in PATHS:
        raise HarnessError(f"unknown forward path {rule!r}; known: {', '.join(known_rules())}")
    if linear.layer == "lm_head" and (rule in RULES or not paths_run_lm_head):
        return ATEN  # vLLM's LM head always dispatches F.linear (LM_HEAD_RULE)
    if rule not in RULES:
        return rule if runnable(rule, sm, linear, m) else ATEN  # a registry path everywhere else it can run
    if rule in (ATEN, VLLM_FUSED):
        return ATEN
    if rule in (VLLM_DEFAULT, VLLM_FLAG, SEED_PR):
        return vllm_choice(rule, m, sm, lambda p: runnable(p, sm, linear, m))
    if rule == FLASHINFER_EVERYWHERE:
        return flashinfer_everywhere_choice(low, profile.low_m_backend, m, lambda p: runnable(p, sm, linear, m))
    if rule in DISPATCHER_RULES:
        if table is None:
            raise HarnessError(f"the {rule} path needs a threshold table for this GPU; fit one with python -m calibrate fit")
        n, k = linear.lead if isinstance(linear, FusedLinear) else (linear.n, linear.k)
        chosen = table.choose(n, k, m, regime)
        chosen = GEMV_PATH_OF_RULE.get(rule, GEMV) if chosen == GEMV else chosen
        if isinstance(linear, FusedLinear) and chosen != ATEN and not runnable(chosen, sm, linear, m):
            # the largest member's kernel cannot take the fused shape (TinyGEMM's N % 16): the GEMV where it can
            chosen = GEMV
        return chosen if chosen == ATEN or runnable(chosen, sm, linear, m) else ATEN
    raise AssertionError(rule)
