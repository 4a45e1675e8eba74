"""dispatch.patch on a model the project did not write: a tiny transformers Qwen3 (random weights, bf16, CPU)."""
import pytest
import torch

import dispatch

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
    assert all("forward" in m.__dict__ for _, m in handle.patched)
    with torch.no_grad():
        patched = tiny(ids).logits
    assert torch.equal(patched, stock)
    modules = [m for _, m in handle.patched]
    handle.remove()
    assert len(handle) == 0 and all("forward" not in m.__dict__ for m in modules)
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
