"""Which registry path each linear of a forward runs under a forward-wide rule (CPU only, shared by the measured
forward in bench/forward.py and the cell-sum model of it in calibrate/forward_model.py)."""
from __future__ import annotations

from typing import Callable, Protocol

from bench.paths import ATEN, DISPATCH, PATHS, TUNED_CUBLASLT, low_m_path
from dispatch.profiles import GpuProfile
from harness.errors import HarnessError
from shapes.derive import ForwardLinear

SEED_FIX_M = 32  # the seed PR's dispatcher, and vLLM's flag on SM90: FlashInfer's low-M backend at M <= 32
VLLM_FLASHINFER = "vllm-flashinfer"
SEED_FIX = "seed-fix"
# The table's choices called straight through the registry's path functions, bound per regime: the dispatcher with
# no per-call work of its own. dispatch over this, in the same forward, is what the bound layer itself costs.
TABLE_DIRECT = "table-direct"
# The dispatcher with its Python bound layer, where `dispatch` runs the C++ one (dispatch/native.py): the two side
# by side in one run
DISPATCH_PYTHON = "dispatch-python"
# The dispatcher bound per layer with the table's idle ranges left out: beside `dispatch` in one run, what the
# idle signal and the idle choices change
DISPATCH_NO_IDLE = "dispatch-no-idle"
NOT_SINGLE_PATHS = (TABLE_DIRECT, DISPATCH_PYTHON, DISPATCH_NO_IDLE)  # the dispatcher's twins: never the best single path
RULES = {
    ATEN: "F.linear for every linear",
    VLLM_FLASHINFER: "FlashInfer as vLLM's FlashInfer-BF16 flag runs it: the low-M backend at M <= 32 where "
                       "eligible, FlashInfer's cuBLASLt above (SM100: cute-dsl with its own fallback); lm_head F.linear",
    SEED_FIX: f"the seed PR's fix: the low-M backend at M <= {SEED_FIX_M} where eligible, F.linear above; "
                "lm_head F.linear",
    DISPATCH: "the dispatcher bound per layer (dispatch.bind) with the committed table: its graph ranges while "
              "capturing, eager ranges otherwise, and its idle ranges where the idle signal says the GPU waits on "
              "the host (default 'pace': while this thread's host runs slow; run.json: idle_signal); "
              "lm_head F.linear",
    TABLE_DIRECT: "the committed table's graph and eager choices called directly, without the bound layer: the "
                  "dispatcher's choices at no per-call cost (dispatch over it is the bound layer's own cost); it "
                  "never runs the idle ranges (those need the bound layer's per-call idle signal)",
    DISPATCH_NO_IDLE: "the dispatcher bound per layer as `dispatch`, with the table's idle ranges left out: an eager call "
                      "runs the eager choice whatever the idle signal says",
    DISPATCH_PYTHON: "the dispatcher bound per layer with its Python bound layer (dispatch.bind(w, native=False)); "
                     "`dispatch` runs the C++ layer where it is built (run.json: dispatch_layer)",
}
DEFAULT_RULES = (ATEN, VLLM_FLASHINFER, SEED_FIX, DISPATCH, TABLE_DIRECT)
# vLLM calls its LM head through dispatch_unquantized_gemm("auto"), which is F.linear on every GPU, so no rule a
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
    return names


def runnable(path: str, sm: int, linear: ForwardLinear, m: int) -> bool:
    return PATHS[path].skip_reason(sm, linear.n, linear.k, m) is None


def vllm_flag_choice(low: str, low_m_backend: str, m: int, can_run: Callable[[str], bool]) -> str:
    """What vLLM's FlashInfer-BF16 flag runs for one linear at M: `low` is the low-M backend's path; CuTe DSL (SM100)
    is one runner set with its own cuBLASLt fallback above M = 32; otherwise FlashInfer's tuned cuBLASLt above."""
    if low_m_backend == "cute-dsl":
        return low if can_run(low) else ATEN
    if m <= SEED_FIX_M and can_run(low):
        return low
    return TUNED_CUBLASLT if can_run(TUNED_CUBLASLT) else ATEN


def path_for(rule: str, linear: ForwardLinear, m: int, sm: int, profile: GpuProfile, table: Table | None,
             regime: str = "graph", paths_run_lm_head: bool = False) -> str:
    """The registry path name one linear runs in a regime; 'aten' wherever the rule's kernel cannot take the linear,
    and on the LM head (LM_HEAD_RULE; `paths_run_lm_head`: as forward runs before it ran registry paths). Only the
    dispatcher's choice depends on the regime."""
    low = low_m_path(profile)
    if rule not in RULES and rule not in PATHS:
        raise HarnessError(f"unknown forward path {rule!r}; known: {', '.join(known_rules())}")
    if linear.layer == "lm_head" and (rule in RULES or not paths_run_lm_head):
        return ATEN  # vLLM's LM head always dispatches F.linear (LM_HEAD_RULE)
    if rule not in RULES:
        return rule if runnable(rule, sm, linear, m) else ATEN  # a registry path everywhere else it can run
    if rule == ATEN:
        return ATEN
    if rule == VLLM_FLASHINFER:
        return vllm_flag_choice(low, profile.low_m_backend, m, lambda p: runnable(p, sm, linear, m))
    if rule == SEED_FIX:
        return low if m <= SEED_FIX_M and runnable(low, sm, linear, m) else ATEN
    if rule in (DISPATCH, TABLE_DIRECT, DISPATCH_PYTHON, DISPATCH_NO_IDLE):
        if table is None:
            raise HarnessError(f"the {rule} path needs a threshold table for this GPU; fit one with python -m calibrate fit")
        chosen = table.choose(linear.n, linear.k, m, regime)
        return chosen if chosen == ATEN or runnable(chosen, sm, linear, m) else ATEN
    raise AssertionError(rule)
