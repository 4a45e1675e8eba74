"""HF config.json of the Qwen3.5 / Qwen3-Next family -> the BF16 linears vLLM runs through its unquantized method.

Formulas follow vLLM's modules (qwen3_5.py, qwen3_next.py, qwen2_moe.py, linear.py); see
shared/context/research/qwen35-shapes.md section 2 for the sources.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.io import read_json_object

SUPPORTED_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "qwen3_5", "qwen3_5_moe")
COMMON_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "vocab_size",
)
TP_DEGREES = (1, 2, 4, 8)
LM_HEAD_PAD = 64
LAYER_ORDER = (
    "linear_attn.in_proj_qkvz", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_ba",
    "linear_attn.in_proj_b", "linear_attn.in_proj_a", "linear_attn.out_proj", "self_attn.qkv_proj",
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_up_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.shared_expert.gate_up_proj",
    "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj", "mlp.gate",
    "mlp.shared_expert_gate",
)
LAYOUTS = ("vllm", "transformers")  # the layouts a forward runs in
UNION = "union"  # a catalog's layout: vLLM's layers and transformers' modules that vLLM fuses, one table for both
CATALOG_LAYOUTS = (*LAYOUTS, UNION)
# transformers' modules for each of vLLM's fused linears (Qwen3.5 / Qwen3-Next): (name, share of the fused N)
UNFUSED = {
    "linear_attn.in_proj_qkvz": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z"),
    "linear_attn.in_proj_ba": ("linear_attn.in_proj_b", "linear_attn.in_proj_a"),
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.shared_expert.gate_up_proj": ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj"),
}  # vLLM pads the vocab of ParallelLMHead/VocabParallelEmbedding to a multiple of 64


def layout_covers(table_layout: str, needed: str) -> bool:
    """Whether a table of `table_layout` holds the shapes of `needed`: its own layout, or the union of both."""
    return table_layout in (needed, UNION)


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
    return read_json_object(path, "config file", "pass the path of a HF config.json (fix or re-download it)")


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


def size(tc: dict[str, Any], name: str, model: str, minimum: int = 1) -> int:
    """A config field that is a size or count: an integer >= minimum (JSON 2560 or 2560.0), else one clear error."""
    value = tc.get(name)
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok or value < minimum:
        raise HarnessError(f"{model}: config field {name} is {value!r}; it must be an integer >= {minimum}: "
                           f"fix the config.json")
    return value


def optional_size(tc: dict[str, Any], name: str, model: str, minimum: int = 0) -> int | None:
    """A size that may be absent or null (then None)."""
    return None if tc.get(name) is None else size(tc, name, model, minimum)


def layer_types(tc: dict[str, Any], model: str = "config") -> list[str]:
    n_layers = size(tc, "num_hidden_layers", model)
    if "layer_types" in tc:
        types = tc["layer_types"]
        if not isinstance(types, list):
            raise HarnessError(f"{model}: layer_types must be a list of layer kinds; fix the config.json")
        if len(types) != n_layers:
            raise HarnessError(f"layer_types has {len(types)} entries but num_hidden_layers is {n_layers}; make them agree")
        unknown = sorted(set(types) - {"linear_attention", "full_attention"})
        if unknown:
            raise HarnessError(f"layer_types holds {unknown}; only linear_attention and full_attention are known")
        return types
    interval = size(tc, "full_attention_interval", model)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def _split(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise HarnessError(f"TP {tp} does not divide {what} = {value}; pick a TP degree that divides it")
    return value // tp


def _mlp_is_moe(tc: dict[str, Any], index: int, model: str) -> bool:
    if tc.get("model_type") in ("qwen3_5_text", "qwen3_5"):
        return False
    if not optional_size(tc, "num_experts", model):
        return False
    only = tc.get("mlp_only_layers") or []
    if not isinstance(only, list):
        raise HarnessError(f"{model}: mlp_only_layers must be a list of layer indices; fix the config.json")
    if index in only:
        return False
    step = optional_size(tc, "decoder_sparse_step", model, 1) or 1
    return (index + 1) % step == 0


@dataclass(frozen=True)
class ForwardLinear:
    """One linear instance of a forward, in execution order: decoder layer index (-1 for lm_head), name, weight."""
    index: int
    layer: str
    n: int
    k: int


def derive_layers(cfg: dict[str, Any], model: str, tp: int = 1, layout: str = "vllm") -> list[LinearLayer]:
    """Every unquantized BF16 linear of one forward pass (plus lm_head), with vLLM's fusions and TP splits (or as
    transformers' modules are laid out: `layout`; UNION: vLLM's layers, then the transformers modules that vLLM
    fuses, each counted in its own layout's forward); a row per distinct layer name with its count per forward."""
    if layout == UNION:
        if tp != 1:
            raise HarnessError("the union layout holds transformers' modules, which are one rank; use --tp 1")
        fused = derive_layers(cfg, model, tp, "vllm")
        known = {(layer.layer, layer.n, layer.k) for layer in fused}
        return fused + [layer for layer in derive_layers(cfg, model, tp, "transformers")
                        if (layer.layer, layer.n, layer.k) not in known]
    steps, shapes, lm_head = _plan(cfg, model, tp, layout)
    counts: dict[str, int] = {}
    for _, name in steps:
        counts[name] = counts.get(name, 0) + 1
    layers = []
    for name, count in sorted(counts.items(), key=lambda item: LAYER_ORDER.index(item[0])):
        n, k, style = shapes[name]
        # H1: every decoder linear inside the graph; H2: dense projections + lm_head (no MoE router/gates).
        tags = ("H1",) if name in ("mlp.gate", "mlp.shared_expert_gate") else ("H1", "H2")
        layers.append(LinearLayer(model, name, n, k, tp, style, count, True, tags))
    layers.append(LinearLayer(model, "lm_head", *lm_head, tp, "vocab", 1, False, ("H2",)))
    return layers


def forward_sequence(cfg: dict[str, Any], model: str, tp: int = 1, decoder_layers: int | None = None,
                     layout: str = "vllm") -> list[ForwardLinear]:
    """Every BF16 linear of one forward in the order it runs: decoder layer by decoder layer (attention or
    linear-attention projections, then the dense MLP or the MoE's dense parts), then lm_head. decoder_layers: only
    the first N decoder layers (a GPU without memory for every distinct weight)."""
    steps, shapes, lm_head = _plan(cfg, model, tp, layout)
    if decoder_layers is not None:
        steps = [(i, name) for i, name in steps if i < decoder_layers]
    return [ForwardLinear(i, name, *shapes[name][:2]) for i, name in steps] + [ForwardLinear(-1, "lm_head", *lm_head)]


def _plan(cfg: dict[str, Any], model: str, tp: int, layout: str = "vllm"
          ) -> tuple[list[tuple[int, str]], dict[str, tuple[int, int, str]], tuple[int, int]]:
    """(decoder layer index, linear name) in execution order, each name's (n, k, style), lm_head's (n, k): vLLM's
    fused layers, or transformers' modules (`layout`: each fused layer unfused, one rank, the vocab unpadded)."""
    _check_layout(layout, tp)
    tc = text_config(cfg)
    _check_family(tc, model)
    dims = _dims(tc, model, tp)
    steps = _steps(tc, model)
    shapes = _fused_shapes(tc, model, tp, dims, {name for _, name in steps})
    if layout == "transformers":
        return _unfused(steps, shapes, dims) + ((dims["vocab"], dims["hidden"]),)
    padded_vocab = math.ceil(dims["vocab"] / LM_HEAD_PAD) * LM_HEAD_PAD
    return steps, shapes, (math.ceil(padded_vocab / tp), dims["hidden"])


def _check_layout(layout: str, tp: int) -> None:
    if layout == UNION:
        raise HarnessError("a forward runs one layout: vllm or transformers (the union is a catalog of shapes)")
    if layout not in LAYOUTS:
        raise HarnessError(f"unknown layout {layout!r}; known: {', '.join(CATALOG_LAYOUTS)}")
    if layout == "transformers" and tp != 1:
        raise HarnessError("the transformers layout is one rank (transformers shards no linear); use --tp 1")
    if tp < 1:
        raise HarnessError(f"TP degree must be >= 1, got {tp}")


def _dims(tc: dict[str, Any], model: str, tp: int) -> dict[str, int]:
    """The config's sizes the linears are made of, per rank where vLLM shards them."""
    hidden = size(tc, "hidden_size", model)
    heads, kv_heads = size(tc, "num_attention_heads", model), size(tc, "num_key_value_heads", model)
    if heads % kv_heads:
        raise HarnessError(f"{model}: num_attention_heads = {heads} is not a multiple of num_key_value_heads = "
                           f"{kv_heads}; fix the config.json")
    head_dim = optional_size(tc, "head_dim", model, 1)
    if head_dim is None:
        if hidden % heads:
            raise HarnessError(f"{model}: config has no head_dim and hidden_size = {hidden} is not a multiple of "
                               f"num_attention_heads = {heads}; add head_dim")
        head_dim = hidden // heads
    lin_k_heads, lin_v_heads = size(tc, "linear_num_key_heads", model), size(tc, "linear_num_value_heads", model)
    if lin_v_heads % lin_k_heads:
        raise HarnessError(f"{model}: linear_num_value_heads = {lin_v_heads} is not a multiple of "
                           f"linear_num_key_heads = {lin_k_heads}; fix the config.json")
    # KV heads are replicated across ranks once TP exceeds them (QKVParallelLinear).
    if tp >= kv_heads:
        if tp % kv_heads:
            raise HarnessError(f"TP {tp} is not a multiple of num_key_value_heads = {kv_heads}; vLLM cannot replicate them")
        kv_per_rank = 1
    else:
        kv_per_rank = _split(kv_heads, tp, "num_key_value_heads")
    _split(lin_k_heads, tp, "linear_num_key_heads")
    return {"hidden": hidden, "head_dim": head_dim, "gate": 2 if tc.get("attn_output_gate", True) else 1,
            "key_dim": lin_k_heads * size(tc, "linear_key_head_dim", model),
            "value_dim": lin_v_heads * size(tc, "linear_value_head_dim", model),
            "vocab": size(tc, "vocab_size", model), "kv_per_rank": kv_per_rank,
            "q_per_rank": _split(heads, tp, "num_attention_heads"),
            "v_heads": _split(lin_v_heads, tp, "linear_num_value_heads")}


def _steps(tc: dict[str, Any], model: str) -> list[tuple[int, str]]:
    """(layer index, fused linear name) in execution order."""
    steps: list[tuple[int, str]] = []
    for index, kind in enumerate(layer_types(tc, model)):
        names = (["linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj"]
                 if kind == "linear_attention" else ["self_attn.qkv_proj", "self_attn.o_proj"])
        if _mlp_is_moe(tc, index, model):
            names += ["mlp.gate", "mlp.shared_expert_gate"]
            if optional_size(tc, "shared_expert_intermediate_size", model):
                names += ["mlp.shared_expert.gate_up_proj", "mlp.shared_expert.down_proj"]
        else:
            names += ["mlp.gate_up_proj", "mlp.down_proj"]
        steps += [(index, name) for name in sorted(names, key=LAYER_ORDER.index)]
    return steps


def _fused_shapes(tc: dict[str, Any], model: str, tp: int, d: dict[str, int], present: set[str]
                  ) -> dict[str, tuple[int, int, str]]:
    """Each of vLLM's fused linears present in the model: (n, k, style) on one rank."""
    hidden, head_dim = d["hidden"], d["head_dim"]

    def inter(name: str) -> int:
        if name not in tc:
            raise HarnessError(f"{model}: config lacks {name}, which its MLP layers need")
        return size(tc, name, model)

    shapes: dict[str, tuple[int, int, str]] = {
        "linear_attn.in_proj_qkvz": (_split(2 * d["key_dim"] + 2 * d["value_dim"], tp, "in_proj_qkvz N"), hidden,
                                     "column"),
        "linear_attn.in_proj_ba": (2 * d["v_heads"], hidden, "column"),
        "linear_attn.out_proj": (hidden, _split(d["value_dim"], tp, "linear value dim"), "row"),
        "self_attn.qkv_proj": ((d["q_per_rank"] * d["gate"] + 2 * d["kv_per_rank"]) * head_dim, hidden, "column"),
        "self_attn.o_proj": (hidden, d["q_per_rank"] * head_dim, "row"),
    }
    if "mlp.gate_up_proj" in present:
        shapes["mlp.gate_up_proj"] = (_split(2 * inter("intermediate_size"), tp, "2 x intermediate_size"), hidden, "column")
        shapes["mlp.down_proj"] = (hidden, _split(inter("intermediate_size"), tp, "intermediate_size"), "row")
    if "mlp.gate" in present:
        shapes["mlp.gate"] = (size(tc, "num_experts", model), hidden, "replicated")
        shapes["mlp.shared_expert_gate"] = (1, hidden, "replicated")
    if "mlp.shared_expert.gate_up_proj" in present:
        si = inter("shared_expert_intermediate_size")
        shapes["mlp.shared_expert.gate_up_proj"] = (_split(2 * si, tp, "2 x shared_expert_intermediate_size"), hidden, "column")
        shapes["mlp.shared_expert.down_proj"] = (hidden, _split(si, tp, "shared_expert_intermediate_size"), "row")
    return shapes


def _unfused(steps: list[tuple[int, str]], shapes: dict[str, tuple[int, int, str]], d: dict[str, int]
             ) -> tuple[list[tuple[int, str]], dict[str, tuple[int, int, str]]]:
    """transformers' modules: each fused layer split into the linears it was made of (one rank)."""
    head_dim = d["head_dim"]
    parts = {"linear_attn.in_proj_qkv": 2 * d["key_dim"] + d["value_dim"], "linear_attn.in_proj_z": d["value_dim"],
             "linear_attn.in_proj_b": d["v_heads"], "linear_attn.in_proj_a": d["v_heads"],
             "self_attn.q_proj": d["q_per_rank"] * d["gate"] * head_dim, "self_attn.k_proj": d["kv_per_rank"] * head_dim,
             "self_attn.v_proj": d["kv_per_rank"] * head_dim}
    shapes = dict(shapes)
    for fused, names in UNFUSED.items():
        if fused not in shapes:
            continue
        n, k, style = shapes.pop(fused)
        for name in names:
            shapes[name] = (parts.get(name, n // 2), k, style)  # gate and up: half of gate_up each
    return [(i, name) for i, fused in steps for name in UNFUSED.get(fused, (fused,))], shapes
