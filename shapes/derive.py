"""HF config.json of the Qwen3.5 / Qwen3-Next family -> the BF16 linears vLLM runs through its unquantized method.

Formulas follow vLLM's modules (qwen3_5.py, qwen3_next.py, qwen2_moe.py, linear.py); see
shared/context/research/qwen35-shapes.md section 2 for the sources.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shapes.errors import HarnessError

SUPPORTED_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "qwen3_5", "qwen3_5_moe")
COMMON_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "vocab_size",
)
TP_DEGREES = (1, 2, 4, 8)
LM_HEAD_PAD = 64
LAYER_ORDER = (
    "linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj", "self_attn.qkv_proj",
    "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "mlp.shared_expert.gate_up_proj",
    "mlp.shared_expert.down_proj", "mlp.gate", "mlp.shared_expert_gate",
)  # vLLM pads the vocab of ParallelLMHead/VocabParallelEmbedding to a multiple of 64


@dataclass(frozen=True)
class LinearLayer:
    """One BF16 linear of a model at one TP degree: weight [n, k] per rank."""
    model: str
    layer: str
    n: int
    k: int
    tp: int
    style: str  # column | row | replicated | vocab
    count: int  # calls per forward pass
    in_cuda_graph: bool
    tags: tuple[str, ...] = field(default=())


def load_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f"config file {path} not found; pass the path of a HF config.json")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HarnessError(f"config file {path} is not valid JSON ({exc}); fix or re-download it") from exc
    if not isinstance(data, dict):
        raise HarnessError(f"config file {path} holds a JSON {type(data).__name__}, not an object; expected a HF config.json")
    return data


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The decoder's fields: multimodal checkpoints nest them under text_config."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def _check_family(tc: dict[str, Any], name: str) -> None:
    model_type = tc.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise HarnessError(
            f"{name}: model_type {model_type!r} is not of the Qwen3.5/Qwen3-Next family "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}); add a derivation rule in shapes/derive.py for it")
    missing = [f for f in COMMON_FIELDS if f not in tc]
    if "layer_types" not in tc and "full_attention_interval" not in tc:
        missing.append("layer_types or full_attention_interval")
    if missing:
        raise HarnessError(f"{name}: config lacks {', '.join(missing)}; a Qwen3.5/Qwen3-Next config.json has them")


def layer_types(tc: dict[str, Any]) -> list[str]:
    n_layers = int(tc["num_hidden_layers"])
    if "layer_types" in tc:
        types = list(tc["layer_types"])
        if len(types) != n_layers:
            raise HarnessError(f"layer_types has {len(types)} entries but num_hidden_layers is {n_layers}; make them agree")
        unknown = sorted(set(types) - {"linear_attention", "full_attention"})
        if unknown:
            raise HarnessError(f"layer_types holds {unknown}; only linear_attention and full_attention are known")
        return types
    interval = int(tc["full_attention_interval"])
    if interval < 1:
        raise HarnessError(f"full_attention_interval must be >= 1, got {interval}")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def _split(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise HarnessError(f"TP {tp} does not divide {what} = {value}; pick a TP degree that divides it")
    return value // tp


def _mlp_is_moe(tc: dict[str, Any], index: int) -> bool:
    if tc.get("model_type") in ("qwen3_5_text", "qwen3_5"):
        return False
    if int(tc.get("num_experts") or 0) <= 0:
        return False
    if index in (tc.get("mlp_only_layers") or []):
        return False
    step = int(tc.get("decoder_sparse_step") or 1)
    return (index + 1) % step == 0


def derive_layers(cfg: dict[str, Any], model: str, tp: int = 1) -> list[LinearLayer]:
    """Every unquantized BF16 linear of one forward pass (plus lm_head), with vLLM's fusions and TP splits."""
    if tp < 1:
        raise HarnessError(f"TP degree must be >= 1, got {tp}")
    tc = text_config(cfg)
    _check_family(tc, model)
    hidden = int(tc["hidden_size"])
    heads, kv_heads = int(tc["num_attention_heads"]), int(tc["num_key_value_heads"])
    head_dim = int(tc.get("head_dim") or hidden // heads)
    gate = 2 if tc.get("attn_output_gate", True) else 1
    key_dim = int(tc["linear_num_key_heads"]) * int(tc["linear_key_head_dim"])
    value_dim = int(tc["linear_num_value_heads"]) * int(tc["linear_value_head_dim"])
    types = layer_types(tc)
    counts: dict[str, int] = {}
    for index, kind in enumerate(types):
        names = (["linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj"]
                 if kind == "linear_attention" else ["self_attn.qkv_proj", "self_attn.o_proj"])
        if _mlp_is_moe(tc, index):
            names += ["mlp.gate", "mlp.shared_expert_gate"]
            if int(tc.get("shared_expert_intermediate_size") or 0) > 0:
                names += ["mlp.shared_expert.gate_up_proj", "mlp.shared_expert.down_proj"]
        else:
            names += ["mlp.gate_up_proj", "mlp.down_proj"]
        for name in names:
            counts[name] = counts.get(name, 0) + 1

    # KV heads are replicated across ranks once TP exceeds them (QKVParallelLinear).
    if tp >= kv_heads:
        if tp % kv_heads:
            raise HarnessError(f"TP {tp} is not a multiple of num_key_value_heads = {kv_heads}; vLLM cannot replicate them")
        kv_per_rank = 1
    else:
        kv_per_rank = _split(kv_heads, tp, "num_key_value_heads")
    q_per_rank = _split(heads, tp, "num_attention_heads")
    _split(int(tc["linear_num_key_heads"]), tp, "linear_num_key_heads")
    v_heads = _split(int(tc["linear_num_value_heads"]), tp, "linear_num_value_heads")

    def inter(name: str) -> int:
        if name not in tc:
            raise HarnessError(f"{model}: config lacks {name}, which its MLP layers need")
        return int(tc[name])

    shapes: dict[str, tuple[int, int, str]] = {
        "linear_attn.in_proj_qkvz": (_split(2 * key_dim + 2 * value_dim, tp, "in_proj_qkvz N"), hidden, "column"),
        "linear_attn.in_proj_ba": (2 * v_heads, hidden, "column"),
        "linear_attn.out_proj": (hidden, _split(value_dim, tp, "linear value dim"), "row"),
        "self_attn.qkv_proj": ((q_per_rank * gate + 2 * kv_per_rank) * head_dim, hidden, "column"),
        "self_attn.o_proj": (hidden, q_per_rank * head_dim, "row"),
    }
    if "mlp.gate_up_proj" in counts:
        shapes["mlp.gate_up_proj"] = (_split(2 * inter("intermediate_size"), tp, "2 x intermediate_size"), hidden, "column")
        shapes["mlp.down_proj"] = (hidden, _split(inter("intermediate_size"), tp, "intermediate_size"), "row")
    if "mlp.gate" in counts:
        shapes["mlp.gate"] = (int(tc["num_experts"]), hidden, "replicated")
        shapes["mlp.shared_expert_gate"] = (1, hidden, "replicated")
    if "mlp.shared_expert.gate_up_proj" in counts:
        si = inter("shared_expert_intermediate_size")
        shapes["mlp.shared_expert.gate_up_proj"] = (_split(2 * si, tp, "2 x shared_expert_intermediate_size"), hidden, "column")
        shapes["mlp.shared_expert.down_proj"] = (hidden, _split(si, tp, "shared_expert_intermediate_size"), "row")

    layers = []
    for name, count in sorted(counts.items(), key=lambda item: LAYER_ORDER.index(item[0])):
        n, k, style = shapes[name]
        # H1: every decoder linear inside the graph; H2: dense projections + lm_head (no MoE router/gates).
        tags = ("H1",) if name in ("mlp.gate", "mlp.shared_expert_gate") else ("H1", "H2")
        layers.append(LinearLayer(model, name, n, k, tp, style, count, True, tags))
    padded_vocab = math.ceil(int(tc["vocab_size"]) / LM_HEAD_PAD) * LM_HEAD_PAD
    layers.append(LinearLayer(model, "lm_head", math.ceil(padded_vocab / tp), hidden, tp, "vocab", 1, False, ("H2",)))
    return layers
