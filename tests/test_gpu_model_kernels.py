"""GPU tests: the model kernels bench e2e runs inside transformers' Qwen3.5, where installed, against fp32 references
written here (causal-conv1d's short convolution, the prefill and the decode forms, at the 4B's and the 35B-A3B's
widths)."""
import pytest

pytestmark = pytest.mark.gpu

# (batch, channels, tokens): a decode-sized and two prefill-sized inputs; channels as the models' conv dims
SHAPES = [(1, 8192, 8), (2, 512, 129), (1, 4096, 1031)]
WIDTH = 4  # Qwen3.5's linear_conv_kernel_dim
TOL = 2e-2  # of the reference's largest magnitude: bf16 inputs and outputs, fp32 accumulation


def _rel(out, ref) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("b,d,length", SHAPES)
def test_causal_conv1d_matches_an_fp32_depthwise_convolution(b, d, length):
    import torch
    import torch.nn.functional as F
    cc = pytest.importorskip("causal_conv1d", reason="causal-conv1d is not installed (tools/build_causal_conv1d.sh)")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(b, d, length, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(d, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen) / WIDTH
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = cc.causal_conv1d_fn(x, w, bias, activation="silu")
    ref = F.silu(F.conv1d(x.float(), w.float().unsqueeze(1), bias.float(), padding=WIDTH - 1, groups=d)[..., :length])
    assert out.shape == x.shape and _rel(out, ref) < TOL


@pytest.mark.parametrize("b,d", [(1, 8192), (2, 4096)])
def test_causal_conv1d_update_matches_one_fp32_step_and_shifts_its_state(b, d):
    import torch
    import torch.nn.functional as F
    cc = pytest.importorskip("causal_conv1d", reason="causal-conv1d is not installed (tools/build_causal_conv1d.sh)")
    gen = torch.Generator(device="cuda").manual_seed(1)
    state = torch.randn(b, d, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen)
    x = torch.randn(b, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(d, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen) / WIDTH
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16, generator=gen)
    full = torch.cat([state.float(), x.float().unsqueeze(-1)], -1)  # the state, then the new token
    ref = F.silu((full[..., -WIDTH:] * w.float()).sum(-1) + bias.float())
    out = cc.causal_conv1d_update(x, state, w, bias, activation="silu")  # updates state in place
    assert _rel(out, ref) < TOL
    assert torch.equal(state.float(), full[..., 1:])  # shifted by one token, the new one last: exact in bf16
