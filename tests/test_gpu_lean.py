"""GPU tests of the lean FlashInfer calls and of the capture-aware dispatcher: the lean call against F.linear (the
correctness gate) and against FlashInfer's public mm_bf16 (the same kernel and tactic, so the same bits), inside and
outside CUDA graphs; the regime switch; bound layers; torch.compile."""
import pytest

pytestmark = pytest.mark.gpu

SHAPES = ((2048, 4096), (64, 2048), (1024, 2048))


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _lean_backends(profile):
    from dispatch.backends import BACKENDS
    return [b for b in ("tinygemm", "cublaslt", "cute-dsl") if BACKENDS[b].sms is None or profile.sm in BACKENDS[b].sms]


def _tune(backend, pdl, n, k, ms):
    import flashinfer
    import torch
    from dispatch.lean import public_call
    x = torch.randn(max(ms), k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    with flashinfer.autotune(True, tuning_buckets=tuple(ms)):
        public_call(backend, pdl)(x, w)
    torch.cuda.synchronize()


@pytest.mark.parametrize("n,k", SHAPES)
def test_lean_calls_match_public_mm_bf16_and_f_linear(gpu_profile, n, k):
    import torch
    import torch.nn.functional as F

    from bench.gpu import REL_ERR_BOUND
    from dispatch.backends import BACKENDS
    from dispatch.lean import lean_call, public_call
    for b in _lean_backends(gpu_profile):
        backend = BACKENDS[b]
        pdl = backend.pdl(gpu_profile.pdl)
        ms = [m for m in (1, 8, 48, 1024, 1031) if not backend.skip_reason(gpu_profile.sm, n, k, m)]
        if not ms:
            continue
        tuned = [m for m in ms if m in (1, 8, 1024)]
        _tune(b, pdl, n, k, tuned)
        lean, public = lean_call(b, pdl), public_call(b, pdl)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ w.float().t()
            y, yp = lean(x, w), public(x, w)
            assert y.shape == (m, n) and y.dtype == torch.bfloat16
            assert _rel(y, ref) < REL_ERR_BOUND, (b, m)
            assert _rel(F.linear(x, w), ref) < REL_ERR_BOUND
            if b == "cublaslt" and m not in tuned:  # no tuned entry at this exact M: F.linear's matmul
                assert torch.equal(y, F.linear(x, w)), f"cublaslt M={m}: the untuned lean call is not F.linear's"
            else:
                assert torch.equal(y, yp), f"{b} M={m}: the lean call ran another kernel or tactic than mm_bf16"


def test_into_writes_what_the_call_returns(gpu_profile):
    """`into(x, w, out)`, what a bound layer calls with the output it allocated, gives the bits of the call itself,
    for every lean backend and for the public mm_bf16 (the fallback on another FlashInfer version)."""
    import torch

    from dispatch.backends import BACKENDS
    from dispatch.lean import lean_call, public_call
    n, k, m = 2048, 4096, 8
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for b in _lean_backends(gpu_profile):
        pdl = BACKENDS[b].pdl(gpu_profile.pdl)
        for make in (lean_call, public_call):
            fn = make(b, pdl)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            fn.into(x, w, out)
            assert torch.equal(out, fn(x, w)), f"{make.__name__} {b}: into differs from the call"


def test_lean_calls_resolve_inside_graph_capture(gpu_profile):
    """The first call at a new M may come while a graph is being captured (vLLM captures at warm-up): the lean
    call resolves there and the replayed graph computes the right result on new inputs."""
    import torch

    from bench.gpu import REL_ERR_BOUND
    from dispatch.backends import BACKENDS
    from dispatch.lean import lean_call
    n, k = 2048, 4096
    for b in _lean_backends(gpu_profile):
        lean = lean_call(b, BACKENDS[b].pdl(gpu_profile.pdl))
        x = torch.randn(24, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = lean(x, w)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert _rel(y, x.float() @ w.float().t()) < REL_ERR_BOUND, b


def _two_regime_table(profile, n, k):
    """Graph: the lean low-M call up to M = 32; eager: F.linear everywhere."""
    from dispatch.backends import lean_path
    from dispatch.table import ThresholdTable
    return ThresholdTable(profile.name, profile.low_m_backend, {"graph": (), "eager": ()},
                          {(n, k): {"graph": ((32, lean_path(profile.low_m_backend)),), "eager": ()}})


def _layer_kind(request, monkeypatch, kind: str) -> None:
    """dispatch.bind returns this bound layer, and dispatch.linear is this drop-in: 'Python', or 'C++' built for this
    session (conftest.native_module)."""
    import dispatch.layers
    from dispatch import native
    mod = request.getfixturevalue("native_module") if kind == "C++" else None
    monkeypatch.setattr(native, "module", lambda build_if_missing=False: mod)
    fresh = dispatch.layers._native_linear() or dispatch.layers._linear_python  # the package's and the layers' name
    monkeypatch.setattr(dispatch.layers, "linear", fresh)
    monkeypatch.setattr(dispatch, "linear", fresh)
    assert dispatch.layer_kind(dispatch.linear) == kind


@pytest.mark.parametrize("kind", ["Python", "C++"])
def test_the_dispatcher_switches_regime_with_capture(gpu_profile, kind, request, monkeypatch):
    """One table, two regimes: captured, the call runs the lean low-M kernel (its bits, not F.linear's); eager,
    F.linear (its bits). The two references differ, so each comparison can fail. Both bound layers and both
    dispatch.linear."""
    import torch
    import torch.nn.functional as F

    import dispatch.layers
    _layer_kind(request, monkeypatch, kind)
    from dispatch.backends import BACKENDS
    from dispatch.lean import lean_call
    n, k = 2048, 4096
    dispatch.configure(_two_regime_table(gpu_profile, n, k))
    try:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(2, 4, k, device="cuda", dtype=torch.bfloat16)  # M = 8 over two leading dims
        low = lean_call(gpu_profile.low_m_backend, BACKENDS[gpu_profile.low_m_backend].pdl(gpu_profile.pdl))
        ref_low, ref_aten = low(x.reshape(8, k), w).view(2, 4, n), F.linear(x, w)
        assert not torch.equal(ref_low, ref_aten), "the two kernels gave the same bits; pick other inputs"
        assert torch.equal(dispatch.linear(x, w), ref_aten)
        layer = dispatch.bind(w)
        assert dispatch.layer_kind(layer) == kind
        assert torch.equal(layer(x), ref_aten)
        for fn in (lambda: dispatch.linear(x, w), lambda: layer(x)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = fn()
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, ref_low)
        # above the graph range: F.linear in both regimes
        x64 = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(layer(x64), F.linear(x64, w))
        assert torch.equal(dispatch.linear(x64, w), F.linear(x64, w))
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(dispatch.linear(x64, w, bias), F.linear(x64, w, bias))
    finally:
        dispatch.reset()


@pytest.mark.parametrize("kind", ["Python", "C++"])
def test_bound_layers_fall_back_on_inputs_the_kernel_cannot_take(gpu_profile, kind, request, monkeypatch):
    import torch
    import torch.nn.functional as F

    import dispatch.layers
    _layer_kind(request, monkeypatch, kind)
    n, k = 2048, 4096
    dispatch.configure(_two_regime_table(gpu_profile, n, k))
    try:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        layer = dispatch.bind(w)
        assert dispatch.layer_kind(layer) == kind
        xt = torch.randn(k, 8, device="cuda", dtype=torch.bfloat16).t()  # not contiguous
        xs = torch.randn(8 * k + 1, device="cuda", dtype=torch.bfloat16)[1:].view(8, k)  # 2-byte aligned
        xf = torch.randn(8, k, device="cuda", dtype=torch.float32)
        for x in (xt, xs):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = layer(x)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, F.linear(x, w))
        with pytest.raises(RuntimeError):
            layer(xf)  # F.linear's own error for mixed dtypes, as a drop-in must
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        with_bias = dispatch.bind(w, b)
        x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = with_bias(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, F.linear(x, w, b))  # bias: the table's kernel takes none, F.linear runs
    finally:
        dispatch.reset()


def test_the_custom_op_under_torch_compile_and_graph_capture(gpu_profile):
    """dispatch.op() under torch.compile(fullgraph=True): no graph break; eager calls of the compiled function run
    F.linear, and the same compiled function captured in a CUDA graph runs the lean low-M kernel."""
    import torch
    import torch.nn.functional as F

    import dispatch.layers
    from dispatch.backends import BACKENDS
    from dispatch.lean import lean_call
    n, k = 2048, 4096
    dispatch.configure(_two_regime_table(gpu_profile, n, k))
    try:
        op = dispatch.op()
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
        fn = torch.compile(lambda a, b: op(a, b, None) * 2, fullgraph=True)
        low = lean_call(gpu_profile.low_m_backend, BACKENDS[gpu_profile.low_m_backend].pdl(gpu_profile.pdl))
        assert torch.equal(fn(x, w), F.linear(x, w) * 2)
        fn(x, w)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = fn(x, w)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, low(x, w) * 2)
    finally:
        dispatch.reset()


def test_the_hooked_capture_counter_agrees_with_cuda_in_every_capture(gpu_profile, monkeypatch, native_module):
    """The dispatcher's capture test (the counter that hooks on torch.cuda.CUDAGraph keep) against CUDA's own answer
    on every call the dispatcher makes: eager, inside torch.cuda.graph, after a capture left by an exception, and inside the
    captures torch.compile(mode='reduce-overhead') makes itself, whose replay must run the graph regime's kernel."""
    import torch

    import dispatch.layers
    from dispatch import capture
    from dispatch.backends import BACKENDS
    from dispatch.lean import lean_call
    n, k = 2048, 4096
    seen = []

    def both():  # the C++ bound layer's counter (moved by the same hooks) must agree too
        pair = (bool(capture.hooked_flag()), bool(capture.cuda_query()))
        seen.append(pair)
        assert bool(native_module.capture_depth()) == pair[0]
        return pair[0]
    monkeypatch.setattr(dispatch.layers._STATE, "capturing", both)
    dispatch.configure(_two_regime_table(gpu_profile, n, k))
    try:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
        low = lean_call(gpu_profile.low_m_backend, BACKENDS[gpu_profile.low_m_backend].pdl(gpu_profile.pdl))
        dispatch.linear(x, w)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dispatch.linear(x, w)
        with pytest.raises(KeyError):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                dispatch.linear(x, w)
                raise KeyError("a model that raised while being captured")
        assert not capture.hooked_flag() and not capture.cuda_query()
        dispatch.linear(x, w)
        assert (False, False) in seen and (True, True) in seen
        op = dispatch.op()
        fn = torch.compile(lambda a, b: op(a, b, None) * 2, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # warm-up runs, then cudagraph trees record, then replays
            y = fn(x, w)
        torch.cuda.synchronize()
        assert torch.equal(y, low(x, w) * 2), "torch.compile's CUDA graph did not run the graph regime's kernel"
        assert all(h == c for h, c in seen), f"the hooked counter and CUDA disagreed: {seen}"
    finally:
        dispatch.reset()

