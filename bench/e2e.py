"""(GPU) End to end in transformers' own model: the stock model against the same model served by dispatch.patch.

One model built from a catalog config with random weights (bf16), patched and unpatched in turn (the same weights, so
the memory of one model), in rounds whose variant order is shuffled: eager prefill at several lengths, eager greedy
generate, and one decode step captured in a CUDA graph with a static cache (where the dispatcher's graph choices run).
Within a round each step's timed calls alternate between the variants, and each sample is the fastest of a few calls:
the eager steps of a model whose reference kernels are Python are host-bound, and a host's slow phases and single slow
calls move them by far more than the linears do. Before the rounds, replays of that step are split by kernel
(bench.e2e_kernels: what the changed linears took, and the rest). Each row is one (step, tokens, variant) with its
samples; the logits of both variants at the first prefill length are compared with those of the model run in fp32, a
layer at a time (LOGITS_FACTOR), and each patched linear with F.linear in fp32 on its own input. transformers is an
optional extra (pip install -e '.[e2e]').
"""
from __future__ import annotations

import json
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.e2e_kernels import decode_split, make_clock, op_kernels, split_line
from bench.gpu import REL_ERR_BOUND
from bench.results import rows_to_csv, write_run_json
from bench.stats import rel_err, summary
from bench.sweep import _progress
from harness.errors import HarnessError, signal_of
from harness.io import atomic_write_text
from shapes.derive import text_config

E2E_FILE = "e2e.csv"
COLUMNS = ("model", "step", "tokens", "variant", "status", "reason", "us", "us_p20", "us_p80", "samples",
           "samples_us", "patched_linears", "logits_rel_err", "logits_err_fp32", "linear_rel_err", "linear_worst",
           "kernels", "kernels_us", "own_kernels_us", "shared_kernels_us", "kernels_reason", "op_kernels")
VARIANTS = ("stock", "patched")
# The logits check: each variant's relative Frobenius error against the same model run in fp32. Over many layers of
# random weights bf16 rounding grows far beyond a single GEMM's, so the patched model is held to the stock model's own
# error, not to an absolute bound: another kernel of equal accuracy rounds differently but no worse.
# In a MoE model a rounding difference can flip a token's experts, so its logits move by far more than rounding: the
# check that holds there is per linear, each patched call against F.linear in fp32 on its own input (REL_ERR_BOUND).
LOGITS_FACTOR = 1.5  # the patched model's error may be at most this many times the stock model's
LOGITS_FLOOR = 1e-3  # ... or this, where the stock model's error is smaller


@dataclass
class E2EConfig:
    model: str
    hf_config: dict[str, Any]
    out: Path
    layers: int | None = None
    prefill: tuple[int, ...] = (8, 128, 1031)
    generate_tokens: int = 24
    rounds: int = 10
    repeats: int = 3
    seed: int = 0
    device: str = "cuda"


def build_model(hf_config: dict[str, Any], layers: int | None, device: str):
    """transformers' causal LM for a config (its text part), random weights, bf16, in eval mode on `device`."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise HarnessError(f"bench e2e needs transformers ({exc}); pip install -e '.[e2e]'") from None
    fields = {k: v for k, v in text_config(hf_config).items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise HarnessError(f"transformers {transformers.__version__} cannot build model_type {model_type!r} ({exc}); "
                           f"upgrade transformers or pass another --config") from None
    if layers:
        cfg.num_hidden_layers = min(layers, cfg.num_hidden_layers)
        if isinstance(getattr(cfg, "layer_types", None), list):
            cfg.layer_types = cfg.layer_types[:cfg.num_hidden_layers]
    torch.manual_seed(0)
    # initialised where it runs: a random init on the host takes minutes for a model of tens of billions
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.eval()


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter_ns()
    fn()
    sync()
    return (time.perf_counter_ns() - t0) / 1e3


def captured_decode(model, prompt, device: str) -> tuple[Callable[[], None] | None, str]:
    """One greedy decode step after `prompt`, captured in a CUDA graph with a static cache; (replay, '') or
    (None, why not)."""
    import torch
    if device != "cuda":
        return None, "a captured decode step needs CUDA"
    try:
        from transformers import StaticCache
        cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + 8)
        with torch.no_grad():
            model(prompt, past_key_values=cache, use_cache=True)
            tok = prompt[:, -1:].clone()
            pos = torch.tensor([prompt.shape[1]], device=prompt.device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model(tok, past_key_values=cache, cache_position=pos, use_cache=True)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(tok, past_key_values=cache, cache_position=pos, use_cache=True)
    except Exception as exc:  # a model whose cache cannot be static (or captured): the row says why
        return None, f"not captured: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    # The graph reads and writes the cache, the token and the position where they were at capture: they must live as
    # long as the replay does, or a later allocation reuses their memory under it (an out-of-bounds cache index).
    held = (graph, cache, tok, pos)

    def replay() -> None:
        held[0].replay()
    return replay, ""


@dataclass
class _Measured:
    """What the rounds collect: samples per (step, tokens, variant), why a step was not measured, the logits of the
    first prefill, the patched model's linear check, and each patched linear's binding, kept across the variants'
    switches."""
    samples: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    reasons: dict[tuple[str, int, str], str] = field(default_factory=dict)
    logits: dict[str, Any] = field(default_factory=dict)
    patched_count: int = 0
    linear_err: float = 0.0
    linear_worst: str = ""
    bindings: dict[str, Any] = field(default_factory=dict)
    decode_kernels: set[str] | None = None  # the captured stock decode step's kernel names (None: no CUPTI split)


def run_e2e(cfg: E2EConfig) -> list[dict[str, Any]]:
    """The rows of one end-to-end run (see the module); also written to cfg.out/e2e.csv by the caller."""
    import torch

    import dispatch
    bar = _progress(cfg.rounds + 1, "e2e")
    bar.set_postfix_str(f"{cfg.model}: building, fp32 reference, kernel split")
    clock, split_why = make_clock(cfg.device)  # before any capture or JIT load
    model = build_model(cfg.hf_config, cfg.layers, cfg.device)
    vocab = model.config.get_text_config().vocab_size if hasattr(model.config, "get_text_config") else \
        model.config.vocab_size
    gen = torch.Generator().manual_seed(cfg.seed)
    prompts = {n: torch.randint(0, vocab, (1, n), generator=gen).to(cfg.device) for n in cfg.prefill}
    got = _Measured()
    first = prompts[cfg.prefill[0]]
    got.logits["fp32"] = fp32_logits(model, first)
    split = None
    if clock is not None:
        try:
            split, split_why, got.decode_kernels = decode_split(
                clock, lambda: captured_decode(model, first, cfg.device), lambda: dispatch.patch(model))
        except Exception as exc:  # the split is a diagnostic: the timed steps go on without it
            split_why = f"kernel split failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    bar.update()
    if clock is not None:  # detached before the timed steps: a wall-timed step must not pay for the profiler
        clock.close()
    rng = random.Random(cfg.seed)
    done = 0
    try:
        for r in range(cfg.rounds):
            bar.set_postfix_str(f"{cfg.model}: round {r + 1} of {cfg.rounds}")
            _round(cfg, model, prompts, r, rng, got)
            done += 1
            bar.update()
    except KeyboardInterrupt as exc:
        if not done:
            raise
        got.samples = {key: samples[:done] for key, samples in got.samples.items()}  # whole rounds only
        raise RoundsInterrupted(_rows(cfg, got, split, split_why), done, signal_of(exc)) from None
    finally:
        bar.close()
    return _rows(cfg, got, split, split_why)


class RoundsInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM after at least one whole round: the rows of the rounds that finished."""

    def __init__(self, rows: list[dict[str, Any]], rounds: int, signum: int):
        super().__init__()
        self.rows, self.rounds, self.signum = rows, rounds, signum


@contextmanager
def _as_variant(model, variant: str, got: _Measured):
    """The model as one variant: patched by dispatch.patch for 'patched' (removed on the way out), as is for 'stock'.
    remove() drops each linear's binding, so the bindings an earlier patched call made are put back: a timed call
    must not pay for binding every linear again (a user patches once). A binding whose weight changed is made anew."""
    import dispatch
    from dispatch.patching import BOUND  # torch's nn: only where a model is patched
    handle = dispatch.patch(model) if variant == "patched" else None
    if handle is not None:
        got.patched_count = len(handle)
        for name, module in handle.patched:
            if name in got.bindings:
                module.__dict__[BOUND] = got.bindings[name]
    try:
        yield handle
    finally:
        if handle is not None:
            got.bindings.update({name: module.__dict__[BOUND] for name, module in handle.patched
                                 if BOUND in module.__dict__})
            handle.remove()


def _round(cfg: E2EConfig, model, prompts: dict[int, Any], r: int, rng: random.Random, got: _Measured) -> None:
    """One round, its variant order shuffled. Each step's timed calls alternate between the variants (A B B A A B
    ...: a host's slow phase or a drift hits both), and each variant's sample is the fastest of its cfg.repeats
    calls; prefill after an untimed call of the same length, generate after one in the first round. Then a decode
    step captured in a CUDA graph per variant, its replays alternating the same way."""
    import torch
    sync = torch.cuda.synchronize if cfg.device == "cuda" else (lambda: None)
    first = prompts[cfg.prefill[0]]
    order = rng.sample(VARIANTS, len(VARIANTS))
    if r == 0:
        for variant in order:
            with _as_variant(model, variant, got) as handle, torch.no_grad():
                if handle is not None:
                    got.logits[variant], got.linear_err, got.linear_worst = checked_linears(
                        handle, lambda: model(first).logits.float())
                else:
                    got.logits[variant] = model(first).logits.float()
    gen_fn = lambda: model.generate(first, max_new_tokens=cfg.generate_tokens,  # noqa: E731
                                    min_new_tokens=cfg.generate_tokens, do_sample=False)
    steps = [("prefill", n, (lambda ids=ids: model(ids)), True) for n, ids in prompts.items()]
    steps.append(("generate", cfg.generate_tokens, gen_fn, r == 0))
    for step, n, fn, warm in steps:
        def call(variant: str, fn=fn, timed: bool = True) -> Any:
            with _as_variant(model, variant, got), torch.no_grad():
                return _timed(fn, sync) if timed else fn()
        if warm:  # allocator and lazy init outside the timed calls
            for variant in order:
                call(variant, timed=False)
        _alternate(cfg.repeats, order, call, step, n, got)
    replays = {}
    for variant in order:
        with _as_variant(model, variant, got):
            replays[variant], why = captured_decode(model, first, cfg.device)
        if replays[variant] is None:
            got.reasons[("decode-graph", 1, variant)] = why
    captured = [v for v in order if replays[v] is not None]
    for variant in captured:
        replays[variant]()
    _alternate(cfg.repeats, captured, lambda v: _timed(replays[v], sync), "decode-graph", 1, got)


def _alternate(repeats: int, order: list[str], call: Callable[[str], float], step: str, n: int,
               got: _Measured) -> None:
    """repeats timed calls per variant, alternating A B B A A B ...; each variant's fastest is its sample."""
    best: dict[str, float] = {}
    for i in range(repeats):
        for variant in (order if i % 2 == 0 else order[::-1]):
            t = call(variant)
            best[variant] = min(best.get(variant, t), t)
    for variant in order:
        got.samples.setdefault((step, n, variant), []).append(best[variant])


def _rows(cfg: E2EConfig, got: _Measured, split: dict[str, dict[str, float]] | None, split_why: str
          ) -> list[dict[str, Any]]:
    """A row per (step, tokens, variant); the decode step's rows carry the kernel split; the patched rows fail where
    a patched linear or the logits fail their check."""
    logits = got.logits
    rel = rel_err(logits["patched"], logits["stock"])
    err = {v: rel_err(logits[v], logits["fp32"]) for v in VARIANTS}
    bound = max(LOGITS_FACTOR * err["stock"], LOGITS_FLOOR)
    rows = []
    steps = [("prefill", n) for n in cfg.prefill] + [("generate", cfg.generate_tokens), ("decode-graph", 1)]
    for step, n in steps:
        for variant in VARIANTS:
            key = (step, n, variant)
            base = {"model": cfg.model, "step": step, "tokens": n, "variant": variant,
                    "patched_linears": got.patched_count if variant == "patched" else 0,
                    "logits_rel_err": round(rel, 6) if variant == "patched" else 0.0,
                    "logits_err_fp32": round(err[variant], 6),
                    "linear_rel_err": round(got.linear_err, 6) if variant == "patched" else 0.0,
                    "linear_worst": got.linear_worst if variant == "patched" else ""}
            if step == "decode-graph":
                base.update({c: int(v) if c == "kernels" else round(v, 2) for c, v in split[variant].items()}
                            if split else
                            {"kernels_reason": split_why})
                if got.decode_kernels and variant == "stock":  # the names are the stock step's
                    base["op_kernels"] = json.dumps(op_kernels(got.decode_kernels, MODEL_KERNEL_PACKAGES))
            if key not in got.samples:
                rows.append({**base, "status": "skipped", "reason": got.reasons.get(key, "not measured")})
                continue
            us, p20, p80 = summary(got.samples[key])
            rows.append({**base, "status": "ok", "reason": "", "us": us, "us_p20": p20, "us_p80": p80,
                         "samples": len(got.samples[key]), "samples_us": [round(v, 1) for v in got.samples[key]]})
    why = []
    if got.linear_err > REL_ERR_BOUND:
        why.append(f"the patched {got.linear_worst} differs from F.linear in fp32 by {got.linear_err:.3g}, above "
                   f"{REL_ERR_BOUND}")
    if err["patched"] > bound:
        why.append(f"logits differ from the fp32 model's by {err['patched']:.3g}, above {LOGITS_FACTOR}x the stock "
                   f"bf16 model's {err['stock']:.3g}")
    if why:
        for row in rows:
            if row["variant"] == "patched":
                row.update(status="failed", reason="; ".join(why))
    return rows


def checked_linears(handle, run: Callable[[], Any]) -> tuple[Any, float, str]:
    """run() with each linear patched by `handle` checked against F.linear in fp32 on its own input: what run()
    returned, the largest relative error, and the linear it came from."""
    import torch
    worst: list[Any] = [0.0, ""]

    def check(module, args, out, name: str) -> None:
        err = rel_err(out, torch.nn.functional.linear(args[0].float(), module.weight.float()))
        if err > worst[0]:
            worst[:] = [err, name]
    hooks = [module.register_forward_hook(lambda m, a, o, name=name: check(m, a, o, name))
             for name, module in handle.patched]
    try:
        result = run()
    finally:
        for h in hooks:
            h.remove()
    return result, worst[0], worst[1]


def fp32_logits(model, ids):
    """The logits of the model run in float32, one decoder layer in float32 at a time: the model's own tensors are
    swapped back after each layer, so the reference costs one layer's fp32 copy (plus the embeddings and the head)
    rather than a copy of the whole model, and leaves the model exactly as it was."""
    import torch
    layers = _decoder_layers(model)
    in_layers = {id(t) for layer in layers for t in _tensors(layer)}
    outside = [t for t in _tensors(model) if id(t) not in in_layers]
    handles, pending = [], []  # pending: the layers in fp32 now (one, unless a layer raised)
    saved = _to_fp32(outside)
    try:
        for layer in layers:
            handles.append(layer.register_forward_pre_hook(lambda _m, _a, layer=layer:
                                                           pending.append(_to_fp32(_tensors(layer)))))
            handles.append(layer.register_forward_hook(lambda _m, _a, _o: _restore(pending.pop())))
        with torch.no_grad():
            return model(ids).logits.float()
    finally:
        for h in handles:
            h.remove()
        while pending:
            _restore(pending.pop())
        _restore(saved)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _decoder_layers(model) -> list:
    """The model's decoder layers (transformers keeps them in one ModuleList, `layers`), or none."""
    import torch
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def _tensors(module) -> list:
    """Each floating-point parameter and buffer of the module not in float32 yet, once (a tied weight appears once)."""
    import torch
    seen, out = set(), []
    for t in [*module.parameters(), *module.buffers()]:
        if t.is_floating_point() and t.dtype != torch.float32 and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _to_fp32(tensors: list) -> list:
    """Point each tensor at a float32 copy of its data; what _restore needs to put the original data back."""
    saved = [(t, t.data) for t in tensors]
    for t, data in saved:
        t.data = data.float()
    return saved


def _restore(saved: list) -> None:
    for t, data in saved:
        t.data = data


def ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    """'step tokens: patched / stock' per measured step, the terminal's summary."""
    by = {(r["step"], r["tokens"], r["variant"]): r for r in rows}
    out = []
    for (step, n, variant), r in by.items():
        if variant != "patched":
            continue
        stock = by.get((step, n, "stock"))
        if r.get("status") == "ok" and stock is not None and stock.get("status") == "ok":
            out.append(f"  {step:13s} {n:6d} tokens: patched / stock {r['us'] / stock['us']:.3f} "
                       f"({r['us']:.0f} / {stock['us']:.0f} µs)")
        else:
            out.append(f"  {step:13s} {n:6d} tokens: {r.get('status')}: {r.get('reason')}")
        if step == "decode-graph" and stock is not None:
            line = split_line(stock, r)
            out += [line] if line else []
    return out


# the packages transformers' Qwen3.5 takes its gated-delta-net kernels from where they import; else its PyTorch code
MODEL_KERNEL_PACKAGES = {"gated_delta_rule": ("fla", "flash-linear-attention"),
                         "causal_conv1d": ("causal_conv1d", "causal-conv1d")}
REFERENCE = "transformers' PyTorch reference"


def model_kernels() -> dict[str, str]:
    """Which kernels a transformers model's linear-attention layers run: a package and its version, or REFERENCE."""
    import importlib
    import importlib.metadata
    out = {}
    for op, (module, dist) in MODEL_KERNEL_PACKAGES.items():
        try:
            importlib.import_module(module)
            out[op] = f"{dist} {importlib.metadata.version(dist)}"
        except Exception:  # transformers falls back to its own code on any import failure, so this does too
            out[op] = REFERENCE
    return out


def decode_kernels(rows: list[dict[str, Any]]) -> dict[str, list[str]] | None:
    """Per linear-attention op, its kernels that ran in the captured stock decode step (none: the PyTorch reference
    ran there); None where the run had no CUPTI split to read them from."""
    text = next((r.get("op_kernels") for r in rows
                 if r.get("step") == "decode-graph" and r.get("variant") == "stock" and r.get("op_kernels")), None)
    return json.loads(text) if text else None


def write_e2e(out: Path, rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / E2E_FILE, rows_to_csv(rows, COLUMNS))
    write_run_json(out, {**info, "model_kernels": info.get("model_kernels") or model_kernels(),
                         "decode_kernels": info.get("decode_kernels") or decode_kernels(rows)})
