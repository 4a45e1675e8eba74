"""Host-time anatomy logic on CPU: paired subtraction, interleaved block timing, the custom op through torch.library."""
import time

import pytest
import torch
import torch.nn.functional as F

from bench.anatomy import (FLASHINFER_SEGMENTS, NULL_OP_SEGMENT, Segment, can_use_flashinfer, inductor_style,
                           segment_costs)
from bench.hosttime import time_blocks


def test_a_segment_is_the_difference_of_medians_with_the_spread_of_paired_differences():
    per_round = {"outer": [10.0, 12.0, 40.0], "a": [3.0, 5.0, 20.0], "b": [1.0, 1.0, 1.0]}
    [(seg, value, p20, p80)] = segment_costs(per_round, [Segment("s", "outer", ("a", "b"))])
    assert value == pytest.approx(12.0 - 5.0 - 1.0)
    # paired per-round differences 6, 6, 19
    assert p20 == pytest.approx(6.0) and p80 == pytest.approx(13.8)


def test_negative_segments_are_reported_as_measured():
    [(_, med, _, _)] = segment_costs({"o": [5.0], "i": [5.5]}, [Segment("s", "o", ("i",))])
    assert med == pytest.approx(-0.5)


def test_segments_with_an_untimed_layer_are_left_out():
    out = segment_costs({"custom_op": [3.0]}, FLASHINFER_SEGMENTS)
    assert out == []


def test_each_segment_recovers_its_layers_own_cost():
    """A call tree with a known self cost per layer (the time of a layer is its own cost plus its callees' times):
    every segment must come out as exactly its outer layer's own cost, which fails if a segment lists the wrong
    callees, leaves one out or counts one twice."""
    chain = [s for s in FLASHINFER_SEGMENTS if s.unless is None]
    own = {s.outer: 10.0 * (i + 1) for i, s in enumerate(chain)}
    callees = {s.outer: s.inner for s in chain}

    def total(layer: str) -> float:
        return own[layer] + sum(total(c) for c in callees[layer])
    per_round = {layer: [total(layer)] * 3 for layer in own}
    got = {seg.outer: value for seg, value, _, _ in segment_costs(per_round, FLASHINFER_SEGMENTS)}
    assert got == pytest.approx(own)
    broken = [Segment("glue", "gemm_dispatch", ("choose_one",))]  # leaves runner_call_fresh out
    [(_, value, _, _)] = segment_costs(per_round, broken)
    assert value != pytest.approx(own["gemm_dispatch"])


def test_segments_add_up_to_the_whole_call_with_and_without_a_raw_kernel_layer():
    """TinyGEMM and cuBLASLt time a raw kernel call; CuTe DSL has none: either way the segments sum to the outermost
    layer (the stacked bar's height is the measured whole call), and no cost is counted twice."""
    chain = [s for s in FLASHINFER_SEGMENTS if s.unless is None]
    own = {s.outer: 3.0 + i for i, s in enumerate(chain)}
    callees = {s.outer: s.inner for s in chain}

    def total(layer: str) -> float:
        return own[layer] + sum(total(c) for c in callees[layer])
    full = {layer: [total(layer)] * 3 for layer in own}
    without_raw = {k: v for k, v in full.items() if k != "raw_kernel"}
    for per_round in (full, without_raw):
        values = [value for _, value, _, _ in segment_costs(per_round, FLASHINFER_SEGMENTS)]
        assert sum(values) == pytest.approx(per_round["inductor_wrapper"][0])
    names = [seg.name for seg, *_ in segment_costs(without_raw, FLASHINFER_SEGMENTS)]
    assert "runner forward with the kernel launch (no separate raw entry point)" in names and "runner forward" not in names


def test_time_blocks_orders_layers_by_their_cost_and_calls_the_guard():
    slow_ns = 200_000

    def slow():
        t0 = time.perf_counter_ns()
        while time.perf_counter_ns() - t0 < slow_ns:
            pass
    tokens = []
    per_round, protected = time_blocks({"fast": lambda: None, "slow": slow}, calls=5, rounds=3,
                                       guard=(lambda us: tokens.append(us) or len(tokens), lambda tok: tok != 2))
    assert len(per_round["fast"]) == len(per_round["slow"]) == 3
    assert min(per_round["slow"]) >= slow_ns / 1e3 > max(per_round["fast"])
    assert len(tokens) == 6  # one guard per layer block
    assert protected == {"fast": True, "slow": False}  # round 0 runs fast then slow: token 2 is slow's


def test_custom_op_registers_through_torch_library_and_runs_on_cpu():
    from bench.anatomy_ops import register_gemm_op, register_null_op
    calls = []

    def mm(a, b, bias, pdl, backend):
        calls.append(backend)
        return a @ b
    op = register_gemm_op(mm, dispatch_key="CPU", name="cpu_test_gemm", eligible=lambda x, w, b: True)
    assert "Tensor? bias" in str(op.default._schema) and "str backend" in str(op.default._schema)
    x, w = torch.randn(2, 3, 8), torch.randn(5, 8)
    y = op.default(x, w, None, False, "tinygemm")
    assert y.shape == (2, 3, 5) and calls == ["tinygemm"]
    torch.testing.assert_close(y, F.linear(x, w))
    null = register_null_op(dispatch_key="CPU", name="cpu_test_null")
    torch.testing.assert_close(null.default(x, w, None), F.linear(x, w))
    assert register_null_op(dispatch_key="CPU", name="cpu_test_null") is null  # a second registration is a no-op


def test_ineligible_input_falls_back_to_f_linear_like_vllm():
    from bench.anatomy_ops import register_gemm_op
    op = register_gemm_op(lambda *a: pytest.fail("FlashInfer must not be called"), dispatch_key="CPU",
                          name="cpu_test_fallback")
    x, w = torch.randn(4, 128), torch.randn(8, 128)
    assert not can_use_flashinfer(x, w, None)  # CPU tensors are not eligible
    torch.testing.assert_close(op.default(x, w, None, False, "cublaslt"), F.linear(x, w))


def test_inductor_wrapper_asserts_the_output_layout():
    x = torch.randn(4, 6)
    ok = inductor_style(lambda t: t * 2, (x,), (4, 6), (6, 1), "op")
    ok()
    bad = inductor_style(lambda t: t.t(), (x,), (6, 4), (4, 1), "op")
    with pytest.raises(AssertionError):
        bad()


def test_null_op_segment_names_existing_layers():
    from bench.anatomy import ATEN_LAYERS
    assert NULL_OP_SEGMENT.inner[0] in ATEN_LAYERS


def test_a_block_sized_by_time_gives_a_slow_call_fewer_calls():
    from bench.hosttime import MIN_CALLS, block_calls
    assert block_calls(20.0, 10, 1000.0) == 10  # a fast call: the most calls
    assert block_calls(400.0, 10, 1000.0) == MIN_CALLS  # 1200 µs already
    assert block_calls(120.0, 10, 1000.0) == 9
    assert block_calls(400.0, 10, None) == 10  # no block size: every layer `calls`
    assert block_calls(400.0, 2, 1000.0) == 2  # never more than asked for
    counts = {"fast": 0, "slow": 0}

    def call(name, ns):
        def fn():
            counts[name] += 1
            t0 = time.perf_counter_ns()
            while time.perf_counter_ns() - t0 < ns:
                pass
        return fn
    time_blocks({"fast": call("fast", 0), "slow": call("slow", 2_000_000)}, calls=10, rounds=2, block_us=1000.0)
    assert counts == {"fast": 5 + 2 * 10, "slow": 5 + 2 * MIN_CALLS}  # 5 warm-up calls each


def test_host_blocks_shrink_where_the_gpu_time_hides_the_host_time():
    from bench.sweep import GPU_BOUND_HOST_BLOCKS, HIDDEN_HOST_BLOCKS, HIDDEN_HOST_US, SweepConfig, host_blocks
    cfg = SweepConfig(profile=None, shapes=[], ms=[], paths=[], out=None)
    assert host_blocks(cfg, 20.0) == (cfg.host_calls, cfg.host_rounds, 3)
    assert host_blocks(cfg, cfg.gpu_bound_us) == (*GPU_BOUND_HOST_BLOCKS, 3)
    assert host_blocks(cfg, HIDDEN_HOST_US) == (*HIDDEN_HOST_BLOCKS, 0)  # no warm-up: the check just ran it
    few = SweepConfig(profile=None, shapes=[], ms=[], paths=[], out=None, host_calls=2, host_rounds=1)
    assert host_blocks(few, HIDDEN_HOST_US) == (2, 1, 0)  # never more than asked for
    counts = {"a": 0}

    def call():
        counts["a"] += 1
    time_blocks({"a": call}, calls=3, rounds=1, warmup=0)
    assert counts["a"] == 2 + 3  # the two timed estimate calls and one block
