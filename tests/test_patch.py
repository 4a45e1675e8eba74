"""dispatch.patch on a model the project did not write: a tiny transformers Qwen3 (random weights, bf16, CPU)."""
import pytest
import torch

import dispatch
from dispatch.patching import DispatchedLinear
from harness.shipped import shipped_dir

transformers = pytest.importorskip("transformers")


@pytest.fixture()
def tiny():
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=96, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()


def test_patched_and_stock_outputs_match_and_remove_restores(tiny):
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        stock = tiny(ids).logits
    handle = dispatch.patch(tiny)
    # 7 linears per decoder layer (q, k, v, o, gate, up, down), the LM head left to F.linear as vLLM runs it
    assert len(handle) == 2 * 7 and not any("lm_head" in n for n in handle.names())
    assert all(type(m) is DispatchedLinear for _, m in handle.patched)
    with torch.no_grad():
        patched = tiny(ids).logits
    assert torch.equal(patched, stock)
    modules = [m for _, m in handle.patched]
    handle.remove()
    assert len(handle) == 0 and all(type(m) is torch.nn.Linear and not m.__dict__.get("_dispatch_bound")
                                    for m in modules)
    with torch.no_grad():
        assert torch.equal(tiny(ids).logits, stock)


def test_the_lm_head_on_request_and_ineligible_linears_left_alone(tiny):
    tiny.model.layers[0].mlp.up_proj.weight.data = tiny.model.layers[0].mlp.up_proj.weight.data.float()
    handle = dispatch.patch(tiny, lm_head=True)
    names = handle.names()
    assert "lm_head" in names and "model.layers.0.mlp.up_proj" not in names and len(names) == 2 * 7
    again = dispatch.patch(tiny)  # patching twice changes nothing more
    assert len(again) == 0
    handle.remove()


def test_compiled_patch_runs_through_the_custom_op(tiny):
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        stock = tiny(ids).logits
    handle = dispatch.patch(tiny, compiled=True)
    torch._dynamo.reset()
    compiled = torch.compile(tiny, backend="eager")  # dynamo traces the op as one call (no inductor on CPU CI)
    with torch.no_grad():
        assert torch.equal(tiny(ids).logits, stock)
        assert torch.equal(compiled(ids).logits, stock)
    handle.remove()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _fresh_weights(model) -> dict:
    torch.manual_seed(1)
    return {k: torch.randn_like(v) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("change", ["load_state_dict(assign=True)", "module.weight = ...", "in-place copy"])
def test_a_patched_linear_computes_with_its_modules_current_weight(tiny, change):
    """After patch, whatever replaces or rewrites the weights, the patched model computes what the stock model
    with those weights computes (the binding follows the module's weight, never an old tensor)."""
    import copy
    ids = torch.randint(0, 96, (1, 7))
    stock = copy.deepcopy(tiny)
    dispatch.patch(tiny)
    _logits(tiny, ids)  # bound to the first weights
    new = _fresh_weights(tiny)
    if change == "load_state_dict(assign=True)":
        tiny.load_state_dict(new, assign=True)
    elif change == "module.weight = ...":
        for name, module in tiny.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.weight = torch.nn.Parameter(new[f"{name}.weight"])
        tiny.load_state_dict(new)
    else:
        tiny.load_state_dict(new)
    stock.load_state_dict(new)
    assert torch.equal(_logits(tiny, ids), _logits(stock, ids))


def test_deepcopy_save_and_load_of_a_patched_model(tiny, tmp_path):
    import copy
    ids = torch.randint(0, 96, (1, 6))
    dispatch.patch(tiny)
    before = _logits(tiny, ids)
    twin = copy.deepcopy(tiny)
    twin.load_state_dict(_fresh_weights(twin))  # the copy's weights, not the original's
    assert torch.equal(_logits(tiny, ids), before)
    assert not torch.equal(_logits(twin, ids), before)
    torch.save(tiny, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert torch.equal(_logits(loaded, ids), before)
    assert tiny.state_dict().keys() == loaded.state_dict().keys()


def test_a_model_patched_on_the_meta_device_runs_once_materialised():
    def stack():
        return torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(32, 8, bias=False)).to(
            torch.bfloat16)
    torch.manual_seed(0)
    real = stack()
    with torch.device("meta"):
        meta = stack()
    handle = dispatch.patch(meta)
    assert len(handle) == 2
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    assert meta(x.to("meta")).is_meta  # still meta: F.linear's meta result, nothing bound
    meta.load_state_dict(real.state_dict(), assign=True)
    with torch.no_grad():
        assert torch.equal(meta(x), real(x))


def test_patch_of_something_that_is_not_a_module_is_a_type_error():
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        dispatch.patch(None)


def test_patch_says_once_how_many_linears_the_table_does_not_hold(tiny):
    """With a table that holds only the q/o_proj's and the MLP's up/gate shapes, patch names the rest (k, v and down
    projections) in one warning (count, shapes) and keeps them in handle.outside; they run F.linear. Without a known table (CPU, none
    configured), it says nothing."""
    import warnings

    from dispatch.table import ThresholdTable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dispatch.patch(tiny).remove()  # no table known for CPU weights: nothing to say
    held = {(64, 64): {"graph": (), "eager": ()}, (128, 64): {"graph": (), "eager": ()}}
    dispatch.configure(ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()}, held))
    try:
        with pytest.warns(UserWarning, match=r"dispatch.patch: 6 of 14 linears \(2 shapes: 32x64, 64x128\)"):
            handle = dispatch.patch(tiny)
        assert {shape for _, shape in handle.outside} == {(32, 64), (64, 128)}
        assert sorted(n.rsplit(".", 1)[-1] for n, _ in handle.outside) == ["down_proj"] * 2 + ["k_proj"] * 2 + \
            ["v_proj"] * 2
        handle.remove()
        # a default with ranges (a rule for every shape, like the seed PR's M <= 32) serves the rest: nothing to say
        every = {"graph": ((32, "flashinfer-lean:tinygemm"),), "eager": ()}
        dispatch.configure(ThresholdTable("h200", "tinygemm", every, held))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            handle = dispatch.patch(tiny)
        assert handle.outside == []
        handle.remove()
    finally:
        dispatch.configure(None)


SHIPPED = sorted(p.stem for p in shipped_dir("table").glob("*.json") if ".autotune" not in p.name)


@pytest.mark.parametrize("profile", SHIPPED)
def test_a_shipped_table_holds_every_catalog_shape_of_its_layout(profile):
    """What `dispatch.patch` finds in the table by default: a union table holds every shape transformers builds for
    the catalog models as well as vLLM's fused ones, so no linear of a stock model falls outside it."""
    from dispatch.table import load_table
    from shapes.catalog import catalog
    table = load_table(profile)
    if any(table.default.values()):
        pytest.skip(f"{profile}'s table has one rule for every shape (its default), no shape of its own")
    layout = str(table.source.get("layout") or "vllm")
    wanted = {(s.n, s.k) for s in catalog(layout=layout)}
    assert wanted - set(table.shapes) == set(), f"{profile} ({layout}) lacks these catalog shapes"
    if layout == "union":
        for single in ("vllm", "transformers"):
            assert {(s.n, s.k) for s in catalog(layout=single)} <= set(table.shapes)


def test_a_patched_linear_follows_a_bias_set_after_its_first_call():
    lin = torch.nn.Linear(64, 32, bias=False).bfloat16()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    handle = dispatch.patch(torch.nn.Sequential(lin))
    lin(x)  # bound now
    lin.bias = torch.nn.Parameter(torch.randn(32, dtype=torch.bfloat16))
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
    lin.bias = None
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))
    handle.remove()


def test_the_compiled_patch_traces_before_any_eager_call_in_a_fresh_process():
    """torch.compile(fullgraph=True) of a model patched with compiled=True, first called compiled: the custom op is
    registered at patch time, not inside the traced forward."""
    import subprocess
    import sys
    code = ("import torch, dispatch\n"
            "m = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 16, bias=False))\n"
            "m = m.bfloat16()\n"
            "x = torch.randn(3, 64, dtype=torch.bfloat16)\n"
            "ref = m(x)\n"
            "dispatch.patch(m, compiled=True)\n"
            "out = torch.compile(m, fullgraph=True, backend='eager')(x)\n"
            "assert torch.equal(out, ref), (out - ref).abs().max()\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "BLB_NATIVE_BUILD": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_custom_op_has_the_gradients_of_f_linear():
    op = dispatch.op()
    for bias in (None, torch.randn(16, dtype=torch.float32)):
        x = torch.randn(2, 3, 24, requires_grad=True)
        w = torch.randn(16, 24, requires_grad=True)
        b = bias.clone().requires_grad_(True) if bias is not None else None
        op(x, w, b).square().sum().backward()
        grads = [x.grad, w.grad, *([b.grad] if b is not None else [])]
        x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
        b2 = b.detach().clone().requires_grad_(True) if b is not None else None
        torch.nn.functional.linear(x2, w2, b2).square().sum().backward()
        for got, want in zip(grads, [x2.grad, w2.grad, *([b2.grad] if b2 is not None else [])]):
            torch.testing.assert_close(got, want)
