"""The stream-K GEMV of the structure probe (tools/probes/gemv_streamk.py): its plan's arithmetic on any machine,
the kernel against fp32 in Triton's interpreter and compiled for SM90 on a CPU where Triton is installed, and on a
GPU against fp32, bitwise repeatable, its counters left at zero."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.probes.gemv_variants import STREAMK_PER_SM, streamk_programs, variants

ROOT = Path(__file__).resolve().parents[1]


def share(p: int, total: int, programs: int) -> tuple[int, int]:
    """Program p's iterations [start, end), as the kernel computes them."""
    return p * total // programs, (p + 1) * total // programs


def owners_by_formula(tile: int, k_iters: int, total: int, programs: int) -> list[int]:
    """The shares the kernel sums for a cut tile: from the one holding its first iteration to its last's."""
    first = ((tile * k_iters + 1) * programs - 1) // total
    last = ((tile + 1) * k_iters * programs - 1) // total
    return list(range(first, last + 1))


@pytest.mark.parametrize("tiles", [1, 3, 7, 160])
@pytest.mark.parametrize("k_iters", [1, 2, 5, 32])
@pytest.mark.parametrize("asked", [1, 2, 5, 13, 132, 264, 528])
def test_the_shares_cover_every_iteration_once_and_each_cut_tile_sums_exactly_its_owners(tiles, k_iters, asked):
    programs = streamk_programs(tiles * 16, k_iters * 64, 16, 64, asked)
    total = tiles * k_iters
    assert 1 <= programs <= min(asked, total)
    owner = [None] * total
    for p in range(programs):
        start, end = share(p, total, programs)
        assert start < end  # every share holds one iteration or more
        for it in range(start, end):
            assert owner[it] is None
            owner[it] = p
    assert None not in owner
    slot_tile = {}
    for tile in range(tiles):
        holders = sorted(set(owner[tile * k_iters:(tile + 1) * k_iters]))
        assert owners_by_formula(tile, k_iters, total, programs)[0] == holders[0]
        if len(holders) > 1:  # a cut tile: the last to arrive waits for exactly these, sums them in this order
            assert owners_by_formula(tile, k_iters, total, programs) == holders
            for q in holders:  # each holder's slot (0: its share's first tile, 1: its last) holds this tile alone
                slot = (q, int(tile != share(q, total, programs)[0] // k_iters))
                assert slot_tile.setdefault(slot, tile) == tile


@pytest.mark.parametrize("m", [1, 2, 8])
def test_the_probe_tries_stream_k_at_every_programs_per_sm(m):
    plan = [v for v in variants(2560, 4096, m, 132) if v[0] == "streamk"]
    assert {v[4] for v in plan} == set(STREAMK_PER_SM)
    assert {v[1] for v in plan} == ({1} if m == 1 else {16})
    assert {v[6] for v in plan} == {3, 4}


# Run by a fresh interpreter: TRITON_INTERPRET must be set before Triton is imported (triton.language's own jit
# functions, tl.zeros and tl.sum among them, are made then). Triton's interpreter multiplies bf16's raw 16-bit
# integers in a dot (3.6 and 3.9): the script converts them to fp32 first.
INTERPRETED = """
import json, sys
import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter
from tools.probes import gemv_streamk as sk
from tools.probes.gemv_variants import streamk_programs
dot = interpreter.InterpreterBuilder.create_dot
def fp32(h):
    if h.dtype.scalar != tl.bfloat16:
        return h
    return interpreter.TensorHandle(
        interpreter._convert_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32)
interpreter.InterpreterBuilder.create_dot = lambda self, a, b, d, *rest: dot(self, fp32(a), fp32(b), d, *rest)
out = []
for n, k, m, tile_m, bn, bk, asked in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n + k + m)
    w = torch.randn(n, k, dtype=torch.bfloat16, generator=gen) * k ** -0.5
    x = torch.randn(m, k, dtype=torch.bfloat16, generator=gen)
    programs = streamk_programs(n, k, bn, bk, asked)
    space = sk.workspace(programs, tile_m, bn, n, "cpu")
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    sk.launch(x, w, y, space, programs, tile_m, bn, bk, 4, 3)
    ref = x.float() @ w.float().t()
    out.append([float((y.float() - ref).norm() / ref.norm()), int(space[1].abs().sum())])
print(json.dumps(out))
"""
CASES = [
    (96, 320, 1, 1, 16, 64, 7),  # K not a multiple of the step: the last step masked
    (100, 300, 3, 16, 16, 64, 5),  # N not a multiple of the tile either, rows past M masked
    (64, 256, 1, 1, 32, 128, 1),  # one program: every tile whole
    (48, 128, 2, 16, 16, 64, 9),  # more programs asked than iterations: cut to the iterations
    (160, 512, 8, 16, 32, 128, 13),  # shares of one or two tiles, cut anywhere
    (32, 1024, 16, 16, 16, 64, 5),  # one tile cut into five shares
]


def test_the_interpreted_kernel_matches_fp32_and_leaves_its_counters_at_zero():
    triton = pytest.importorskip("triton")
    import numpy as np
    import torch
    if torch.cuda.is_available():
        pytest.skip("on a GPU the kernel runs for real (test_the_kernel_on_the_gpu_...)")
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9) and \
            tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 3):
        pytest.skip(f"Triton {triton.__version__}'s interpreter takes numpy < 2.3 (here {np.__version__})")
    done = subprocess.run([sys.executable, "-c", INTERPRETED, json.dumps(CASES)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for case, (err, counters) in zip(CASES, json.loads(done.stdout.splitlines()[-1]), strict=True):
        assert err < 1e-2 and counters == 0, case


def test_the_kernel_compiles_for_sm90_with_its_loop_pipelined():
    """Inside the loop only plain stores, so Triton's pipeliner takes it (cp.async stages); the cut tiles' counters
    and sums after it (an atomic in the loop left it unpipelined)."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tools.probes.gemv_streamk import gemv_streamk
    names = ["x_ptr", "w_ptr", "y_ptr", "part_ptr", "count_ptr", "M", "N", "K", "stride_xm", "stride_wn", "stride_ym"]
    for tile_m in (1, 16):
        const = {"PROGRAMS": 264, "TILE_M": tile_m, "BLOCK_N": 32, "BLOCK_K": 128, "STAGES": 3}
        sig = {**dict(zip(names, ["*bf16"] * 3 + ["*fp32", "*i32"] + ["i32"] * 6)), **{c: "constexpr" for c in const}}
        aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a != "M"}
        ptx = triton.compile(ASTSource(gemv_streamk, sig, const, aligned), target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": 4, "num_stages": 3}).asm["ptx"]
        assert "cp.async" in ptx and "atom" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(2560, 4096), (1000, 3000), (96, 64)])
@pytest.mark.parametrize("tile_m,bn,bk,warps", [(1, 32, 128, 4), (1, 8, 512, 4), (16, 32, 128, 4), (16, 64, 128, 4)])
@pytest.mark.parametrize("per_sm", STREAMK_PER_SM)
def test_the_kernel_on_the_gpu_matches_fp32_and_repeats_bitwise(n, k, tile_m, bn, bk, warps, per_sm):
    import torch

    from bench.gpu import REL_ERR_BOUND, output_error
    from tools.probes.gemv_variants import streamk_runner
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    fn = streamk_runner(tile_m, bn, bk, per_sm, warps, 3, n, w.device)
    for m in ((1,) if tile_m == 1 else (2, 5, 8, 16)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        first = fn(x, w)
        assert output_error(first, x, w) < REL_ERR_BOUND
        for _ in range(20):
            assert torch.equal(fn(x, w), first)  # a cut tile's shares summed in program order
    torch.cuda.synchronize()
    assert fn.spaces and all(int(counters.abs().sum()) == 0 for _, counters in fn.spaces.values())
