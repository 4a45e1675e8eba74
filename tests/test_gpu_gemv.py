"""(GPU) The project's split-K GEMV against an fp32 reference, at every M it takes, split and unsplit, called
repeatedly on one workspace (each call leaves it cleared for the next)."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n, k", [(2560, 4096), (1000, 3000), (96, 64)])
@pytest.mark.parametrize("config", [(16, 128, 1, 4), (32, 256, 4, 4), (8, 128, 16, 4), (64, 256, 8, 8)])
def test_the_gemv_matches_fp32_and_clears_its_workspace(n, k, config):
    import torch

    from bench.gpu import REL_ERR_BOUND, output_error
    from dispatch.gemv import MAX_M, Gemv, GemvConfig
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    gemv = Gemv(w, GemvConfig(*config))
    for m in (m for m in (1, 2, 3, 4, 8, MAX_M) if gemv.config.takes(m)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        first = gemv(x)
        assert first.shape == (m, n) and first.dtype == torch.bfloat16
        assert output_error(first, x, w) < REL_ERR_BOUND
        again = gemv(x)
        assert torch.equal(again, first) or output_error(again, x, w) < REL_ERR_BOUND  # atomics: order may differ
    torch.cuda.synchronize()
    assert int(gemv.count.abs().sum()) == 0 and float(gemv.acc.abs().sum()) == 0.0


def test_the_gemv_refuses_what_it_does_not_take():
    import torch

    from dispatch.gemv import MAX_M, Gemv, GemvConfig
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    gemv = Gemv(w, GemvConfig(16, 128, 1, 4))
    with pytest.raises(ValueError):
        gemv(torch.randn(MAX_M + 1, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        Gemv(w.float(), GemvConfig(16, 128, 1, 4))
    with pytest.raises(ValueError):  # eight columns a tile: one row only (a tensor-core tile needs 16)
        Gemv(w, GemvConfig(8, 128, 1, 4))(torch.randn(2, 64, device="cuda", dtype=torch.bfloat16))
