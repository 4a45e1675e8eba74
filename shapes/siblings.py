"""Sibling linears: linears of one decoder block that read the same input, which one GEMM over their concatenated
weights could run (the outputs as views of its output). vLLM 0.33.0 builds and calls each as its own layer:
- linear_attn.in_proj_qkvz and in_proj_ba: vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py,
  QwenGatedDeltaNetAttention.__init__ builds both from hidden_states, forward_cuda calls one after the other;
- mlp.shared_expert.gate_up_proj, mlp.gate and mlp.shared_expert_gate: vllm/model_executor/models/qwen3_next.py,
  Qwen3NextSparseMoeBlock.__init__ (the shared expert's Qwen3NextMLP, the router's GateLinear, a ReplicatedLinear),
  all three fed the block's input by FusedMoE.
A measurement only (bench forward's fused-siblings rule): the dispatcher never changes a model's structure."""
from __future__ import annotations

from dataclasses import dataclass

from shapes.derive import ForwardLinear

# per group, its members in vLLM's layout (the forward's default); a member absent from a model is left out
SIBLINGS = (
    ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba"),
    ("mlp.shared_expert.gate_up_proj", "mlp.gate", "mlp.shared_expert_gate"),
)


@dataclass(frozen=True)
class FusedLinear(ForwardLinear):
    """Sibling linears of one decoder layer as one: N the sum of theirs; `members` their positions in the unfused
    forward; `lead` the (N, K) of the largest, whose table choice the fused GEMM runs (a table holds no fused shape)."""
    members: tuple[int, ...] = ()
    lead: tuple[int, int] = (0, 0)


def fuse_siblings(seq: list[ForwardLinear]) -> list[ForwardLinear]:
    """The forward with each group of siblings (two or more present in one decoder layer, one K) as one FusedLinear
    at its first member's place; every other linear as it was."""
    group_of = {name: g for g, names in enumerate(SIBLINGS) for name in names}
    found: dict[tuple[int, int], list[int]] = {}
    for i, lin in enumerate(seq):
        if lin.layer in group_of:
            found.setdefault((lin.index, group_of[lin.layer]), []).append(i)
    groups = {pos[0]: pos for pos in found.values() if len(pos) > 1 and len({seq[i].k for i in pos}) == 1}
    merged = {i for pos in groups.values() for i in pos[1:]}
    out: list[ForwardLinear] = []
    for i, lin in enumerate(seq):
        if i in groups:
            pos = groups[i]
            lead = max(pos, key=lambda j: seq[j].n)
            out.append(FusedLinear(lin.index, "+".join(seq[j].layer for j in pos), sum(seq[j].n for j in pos), lin.k,
                                   members=tuple(pos), lead=(seq[lead].n, seq[lead].k)))
        elif i not in merged:
            out.append(lin)
    return out
