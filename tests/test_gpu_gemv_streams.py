"""(GPU) The GEMV a server can trust: bitwise the same output on every call and replay, and correct when two calls of
one N run at once on two streams, eagerly and inside one captured graph that forks and joins. Written against the
call the dispatcher makes (GemvCall.into with a stored configuration), so that the same tests can be run against an
earlier kernel to show what they catch."""
import pytest

pytestmark = pytest.mark.gpu

N, K = 2560, 4096  # the 4B's out_proj: a split configuration, many programs a call
SPLIT = (32, 128, 16, 4)  # BLOCK_N, BLOCK_K, SPLIT_K, num_warps: 80 tiles x 16 splits a call
ROUNDS, CALLS = 10, 40  # eager: rounds of CALLS calls queued on each stream before one synchronize


@pytest.fixture
def gemv_store():
    """The GEMV module, its configuration store put back as it was after the test."""
    from dispatch import gemv
    saved = dict(gemv.STORE.configs)
    yield gemv
    gemv.STORE.configs.clear()
    gemv.STORE.configs.update(saved)
    gemv.STORE.version += 1


@pytest.fixture
def stored(gemv_store):
    """The split configuration stored for (N, K) at every M the test runs, the store put back afterwards."""
    for m in (1, 4, 8):
        gemv_store.STORE.configs[(N, K, m)] = gemv_store.GemvConfig(*SPLIT)
    gemv_store.STORE.version += 1
    return gemv_store


def _operands(m: int, seed: int):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16, generator=g)
    return x, w


def _wrong(outs, x, w) -> int:
    from bench.gpu import REL_ERR_BOUND, output_error
    return sum(output_error(o, x, w) >= REL_ERR_BOUND for o in outs)


def _outputs(m: int) -> tuple[list, list]:
    """CALLS output buffers for each of the two streams."""
    import torch
    return tuple([torch.empty(m, N, device="cuda", dtype=torch.bfloat16) for _ in range(CALLS)] for _ in range(2))


def _queue_pairs(call, first, second, outs1, outs2, stream1, stream2) -> None:
    """CALLS pairs of calls, each pair's first (x, w) on stream1 (None: the current one) and second on stream2."""
    import contextlib

    import torch
    for o1, o2 in zip(outs1, outs2):
        with torch.cuda.stream(stream1) if stream1 is not None else contextlib.nullcontext():
            call.into(*first, o1)
        with torch.cuda.stream(stream2):
            call.into(*second, o2)


@pytest.mark.parametrize("m", [1, 8])
def test_two_streams_at_once_eagerly(stored, m):
    import torch
    call = stored.GemvCall(tune=False)
    (x1, w1), (x2, w2) = _operands(m, 1), _operands(m, 2)
    call.prepare(N, K, w1.device)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    wrong = 0
    for _ in range(ROUNDS):
        outs1, outs2 = _outputs(m)
        _queue_pairs(call, (x1, w1), (x2, w2), outs1, outs2, s1, s2)
        torch.cuda.synchronize()
        wrong += _wrong(outs1, x1, w1) + _wrong(outs2, x2, w2)
    assert wrong == 0, f"{wrong} of {2 * ROUNDS * CALLS} outputs wrong with two streams at once"


@pytest.mark.parametrize("m", [1, 8])
def test_two_streams_at_once_in_one_graph_that_forks_and_joins(stored, m):
    import torch
    call = stored.GemvCall(tune=False)
    (x1, w1), (x2, w2) = _operands(m, 3), _operands(m, 4)
    call.prepare(N, K, w1.device)
    side = torch.cuda.Stream()
    outs1, outs2 = _outputs(m)
    for s in (torch.cuda.current_stream(), side):  # a warm-up on each stream, as before any capture
        with torch.cuda.stream(s):
            call.into(x1, w1, outs1[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        side.wait_stream(main)  # fork
        _queue_pairs(call, (x1, w1), (x2, w2), outs1, outs2, None, side)
        main.wait_stream(side)  # join
    wrong = 0
    for _ in range(ROUNDS):
        for o in outs1 + outs2:
            o.zero_()
        graph.replay()
        torch.cuda.synchronize()
        wrong += _wrong(outs1, x1, w1) + _wrong(outs2, x2, w2)
    assert wrong == 0, f"{wrong} of {2 * ROUNDS * CALLS} outputs wrong in a graph whose two branches run at once"


@pytest.mark.parametrize("m", [1, 8])
def test_every_call_and_replay_is_bitwise_the_same(stored, m):
    import torch
    call = stored.GemvCall(tune=False)
    x, w = _operands(m, 5)
    call.prepare(N, K, w.device)
    first = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
    call.into(x, w, first)
    outs = [torch.empty_like(first) for _ in range(200)]
    for o in outs:
        call.into(x, w, o)
    torch.cuda.synchronize()
    differ = sum(not torch.equal(o, first) for o in outs)
    static = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call.into(x, w, static)
    replays = []
    for _ in range(200):
        graph.replay()
        replays.append(static.clone())
    torch.cuda.synchronize()
    differ += sum(not torch.equal(r, first) for r in replays)
    assert differ == 0, f"{differ} of 400 calls and replays differ bitwise from the first call"


def _dependent_chain(d: int, m: int, seed: int):
    """(six d x d weights, an M-row input, chain(call)): chain runs the weights four times over, each call's input
    the previous call's output."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    ws = [torch.randn(d, d, device="cuda", dtype=torch.bfloat16, generator=g) * d ** -0.5 for _ in range(6)]
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16, generator=g)

    def chain(call):
        y = x
        for w in ws * 4:
            y = call(y, w)
        return y
    return ws, x, chain


def _eager_and_replayed(chain, call, times: int) -> list:
    """Every output to compare: `times` eager chains of `call`, one more, and that chain captured in a CUDA graph and
    replayed `times` times (each replay's output copied)."""
    import torch
    outs = [chain(call) for _ in range(times + 1)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = chain(call)
    for _ in range(times):
        graph.replay()
        outs.append(static_out.clone())
    torch.cuda.synchronize()
    return outs


@pytest.mark.parametrize("m,rows", [(1, 1), (4, 4), (8, 16)])
def test_a_chain_of_dependent_pdl_calls_reads_each_output_after_it_is_written(gemv_store, m, rows):
    """Programmatic dependent launch lets a call start beside the one before it: each call's input is the previous
    call's output, so a call that read x (or wrote its workspace) before the wait would differ. PDL launches give
    bitwise the plain launches' outputs, eagerly and captured, and both match an fp32 chain."""
    import torch
    gemv, d = gemv_store, 2048
    gemv.STORE.configs[(d, d, m)] = gemv.GemvConfig(32, 128, 8, 4, rows)
    gemv.STORE.version += 1
    ws, x, chain = _dependent_chain(d, m, 7)
    plain, pdl = gemv.GemvCall(tune=False), gemv.GemvCall(tune=False, pdl=True)
    for c in (plain, pdl):
        c.prepare(d, d, x.device)
    want = chain(plain)
    ref = x.float()
    for w in ws * 4:
        ref = (ref @ w.float().t()).to(torch.bfloat16).float()
    assert (want.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    differ = sum(not torch.equal(o, want) for o in _eager_and_replayed(chain, pdl, 20))
    assert differ == 0, f"{differ} of 41 PDL chains differ bitwise from the plain launches' chain"


@pytest.mark.parametrize("tune", [False, True])
def test_a_call_warmed_up_on_a_side_stream_is_the_gemv_in_a_graph_captured_after(stored, monkeypatch, tune):
    """The benchmark's order (bench/gpu.py capture_graph): eager calls on a side stream, then torch.cuda.graph on its
    default capture stream. The first eager call makes that stream's workspace too, so the graph holds the GEMV, not
    F.linear (which it runs, saying so, only on a stream no eager call or bind prepared)."""
    import torch
    launches = []
    real = stored.launch
    monkeypatch.setattr(stored, "launch", lambda *a, **k: (launches.append(1), real(*a, **k)))
    call = stored.GemvCall(tune=tune)
    x, w = _operands(4, 6)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        want = call(x, w)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    launches.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(x, w)
    assert launches == [1], "the captured call ran F.linear"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("m,rows", [(1, 1), (8, 16)])
def test_a_configuration_tuned_to_launch_with_pdl_gives_the_plain_launches_outputs(gemv_store, m, rows):
    """A stored configuration that launches with PDL (the tuner's choice, as the dispatcher serves it: no pdl of the
    call's own) gives bitwise the plain configuration's outputs along a chain of dependent calls, eagerly and in a
    captured graph."""
    from dataclasses import replace

    import torch
    gemv, d = gemv_store, 2048
    plain_cfg = gemv.GemvConfig(32, 128, 8, 4, rows)
    _, x, chain = _dependent_chain(d, m, 11)

    def served(cfg):
        gemv.STORE.configs[(d, d, m)] = cfg
        gemv.STORE.version += 1
        call = gemv.GemvCall(tune=False)
        call.prepare(d, d, x.device)
        return call
    plain = served(plain_cfg)
    assert not plain.launches_pdl(d, d, m)
    want = chain(plain)
    chained = served(replace(plain_cfg, pdl=True))
    assert chained.launches_pdl(d, d, m)
    differ = sum(not torch.equal(o, want) for o in _eager_and_replayed(chain, chained, 10))
    assert differ == 0, f"{differ} of 21 chains of a PDL configuration differ bitwise from the plain one's"
