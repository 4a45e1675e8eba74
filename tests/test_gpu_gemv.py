"""(GPU) The project's split-K GEMV against an fp32 reference, at every M its tile takes, split and unsplit, on the
CUDA cores (1, 2, 4 or 8 rows) and the tensor cores (16 rows); called repeatedly, bitwise the same output, its
counters left at zero for the next call."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def clean_store():
    """Each test starts from an empty GEMV store that tunes, and a dispatcher that loads its table's files, as a fresh
    process does (a sweep earlier in the session serves its own configurations and turns the table's files off)."""
    import dispatch
    from dispatch import gemv
    saved = (dict(gemv.STORE.configs), dict(gemv.STORE.local), set(gemv.STORE.files), gemv.STORE.tuning)
    gemv.STORE.configs.clear(), gemv.STORE.local.clear(), gemv.STORE.files.clear()
    gemv.STORE.tuning = True
    gemv.STORE.version += 1
    dispatch.tactics_from_table(True)
    yield
    gemv.STORE.configs.clear(), gemv.STORE.local.clear(), gemv.STORE.files.clear()
    gemv.STORE.configs.update(saved[0]), gemv.STORE.local.update(saved[1]), gemv.STORE.files.update(saved[2])
    gemv.STORE.tuning = saved[3]
    gemv.STORE.version += 1


@pytest.mark.parametrize("n, k", [(2560, 4096), (1000, 3000), (96, 64)])
@pytest.mark.parametrize("config", [(16, 128, 1, 4, 16), (32, 256, 4, 4, 16), (8, 128, 16, 4, 1), (64, 256, 8, 8, 16),
                                    (16, 256, 8, 4, 2), (32, 128, 4, 4, 4), (8, 256, 16, 4, 8), (16, 512, 1, 8, 8)])
def test_the_gemv_matches_fp32_and_repeats_bitwise(n, k, config):
    import torch

    from bench.gpu import REL_ERR_BOUND, output_error
    from dispatch.gemv import MAX_M, Gemv, GemvConfig
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    gemv = Gemv(w, GemvConfig(*config))
    for m in (m for m in (1, 2, 3, 4, 5, 8, 12, MAX_M) if gemv.config.takes(m)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        first = gemv(x)
        assert first.shape == (m, n) and first.dtype == torch.bfloat16
        assert output_error(first, x, w) < REL_ERR_BOUND
        for _ in range(20):
            assert torch.equal(gemv(x), first)  # the splits are summed in a fixed order
    torch.cuda.synchronize()
    assert int(gemv.space[1].abs().sum()) == 0  # every tile's counter back at zero


def test_the_gemv_refuses_what_it_does_not_take():
    import torch

    from dispatch.gemv import MAX_M, Gemv, GemvConfig
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    gemv = Gemv(w, GemvConfig(16, 128, 1, 4, 16))
    with pytest.raises(ValueError):
        gemv(torch.randn(MAX_M + 1, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        Gemv(w.float(), GemvConfig(16, 128, 1, 4, 16))
    with pytest.raises(ValueError):  # eight columns a tile: no tensor-core tile (it needs 16)
        Gemv(w, GemvConfig(8, 128, 1, 4, 16))
    with pytest.raises(ValueError):  # a 2-row tile holds no third row
        Gemv(w, GemvConfig(16, 128, 1, 4, 2))(torch.randn(3, 64, device="cuda", dtype=torch.bfloat16))


def test_the_tuner_picks_a_candidate_and_the_call_matches_fp32():
    from dataclasses import replace

    import torch

    from bench.gpu import REL_ERR_BOUND, output_error
    from dispatch.gemv import GemvCall, candidates
    torch.manual_seed(0)
    ws = [torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(2)]
    call = GemvCall(tune=True)
    for m in (1, 3, 4):
        xs = [torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        secs = call.tunes_here(ws, xs)
        assert secs is not None and secs > 0 and call.tunes_here(ws, xs) is None  # tuned once
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        chosen = call.config(2048, 4096, m)  # a candidate, launched with PDL where the tuner found that faster
        assert replace(chosen, pdl=False) in candidates(2048, 4096, m, sms)
        assert not chosen.pdl or torch.cuda.get_device_capability()[0] >= 9
        assert output_error(call(xs[0], ws[0]), xs[0], ws[0]) < REL_ERR_BOUND
        out = torch.empty(m, 2048, device="cuda", dtype=torch.bfloat16)
        call.into(xs[1], ws[1], out)
        assert output_error(out, xs[1], ws[1]) < REL_ERR_BOUND
    assert call.choice_key(ws[0], xs[0]).startswith("bn")


def test_the_dispatcher_runs_the_gemv_its_table_names_captured_and_eager(tmp_path):
    import json

    import torch

    import dispatch
    from bench.gpu import REL_ERR_BOUND, output_error
    from dispatch import gemv
    from dispatch.backends import GEMV
    torch.manual_seed(1)
    w = torch.randn(2560, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    tuner = gemv.GemvCall(tune=True)
    for m in (1, 8):
        tuner.tunes_here([w], [torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)])
    gemv.save(tmp_path / "t.autotune.gemv.json")
    gemv.STORE.configs.clear()
    table = {"format": 2, "profile": "h200", "low_m_backend": "tinygemm",
             "default": {"graph": [{"up_to": 8, "path": GEMV}], "eager": [{"up_to": 8, "path": GEMV}]},
             "source": {"gemv_configs": {"file": "t.autotune.gemv.json"}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    try:
        dispatch.configure(tmp_path / "t.json")
        layer = dispatch.bind(w)
        assert str(tmp_path / "t.autotune.gemv.json") in gemv.STORE.files
        for m in (1, 3, 8):
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            assert output_error(layer(x), x, w) < REL_ERR_BOUND
            assert output_error(dispatch.linear(x, w), x, w) < REL_ERR_BOUND
            graph, static = torch.cuda.CUDAGraph(), x.clone()
            layer(static)  # warm
            with torch.cuda.graph(graph):
                y = layer(static)
            static.copy_(torch.randn_like(static))
            graph.replay()
            assert output_error(y, static, w) < REL_ERR_BOUND
    finally:
        dispatch.reset()


def test_the_kernels_compiled_ahead_are_the_ones_the_calls_then_launch():
    """CompileAhead over a sweep's cells compiles every kernel their calls then launch: the calls after it add
    nothing to Triton's kernel cache, and match fp32."""
    import torch

    from bench.gpu import REL_ERR_BOUND, output_error
    from dispatch import gemv
    from dispatch.gemv import GemvCall, GemvConfig
    from dispatch.gemv_ahead import CompileAhead
    gemv.STORE.tuning = False
    pdl = torch.cuda.get_device_capability()[0] >= gemv.PDL_MIN_SM
    stored = {(1008, 4096, 1): GemvConfig(8, 512, 2, 8, tile_m=1, pdl=pdl),
              (1008, 4096, 3): GemvConfig(32, 256, 2, 8, tile_m=4),
              (2560, 2048, 16): GemvConfig(64, 256, 1, 8, tile_m=16),
              (96, 64, 1): GemvConfig(16, 512, 1, 8, tile_m=1)}
    gemv.STORE.configs.update(stored)
    gemv.STORE.version += 1
    cells = [(n, k, m) for n, k in {(n, k) for n, k, _ in stored} for m in (1, 2, 3, 4, 8, 16)]
    done = CompileAhead(cells).wait()
    assert done["failed"] == 0 and done["launches"] >= len(stored), done
    cache = gemv.kernel().device_caches[torch.cuda.current_device()][0]
    before = len(cache)
    call = GemvCall()
    for n, k, m in cells:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        assert output_error(call(x, w), x, w) <= REL_ERR_BOUND
    torch.cuda.synchronize()
    assert len(cache) == before, f"{len(cache) - before} kernels compiled at their first call"
