"""The GEMV structure probe's plan (tools/probes/gemv_variants): what it tries and how it packs, on CPU."""
import pytest

from dispatch.gemv import tile_rows
from tools.probes.gemv_variants import REG_BUDGET, STREAMK_PER_SM, pack, variants


@pytest.mark.parametrize("n,k", [(2560, 4096), (4096, 2048), (2560, 9216)])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_every_variant_fits_its_budget_and_splits_k_into_whole_tiles_where_packed(n, k, m):
    plan = variants(n, k, m, 132)
    assert plan[0][0] == "rows" and len(set(plan)) == len(plan)  # today's kernel first, nothing twice
    for family, rows, bn, bk, sk, warps, stages in plan:
        tensor_core = family.endswith("16") or family.startswith("tc16")
        if family == "swap":  # the weight tile a warpgroup's 64 or 128 MMA rows, x's rows the MMA's 8 or 16 columns
            assert rows in ((8, 16) if m <= 8 else (16,)) and bn in (64, 128) and warps == 4
        elif family == "streamk":  # one row or the 16-row tile; the fifth field is the programs per SM
            assert rows == (1 if m == 1 else 16) and sk in STREAMK_PER_SM
            continue
        else:
            assert rows == (16 if tensor_core else tile_rows(m)) and not (tensor_core and m == 1)
        if family in ("defer", "tma"):
            assert rows * bn * bk / (32 * warps) <= REG_BUDGET
        if family.startswith("packed"):
            assert n % bn == 0 and k % (sk * bk) == 0  # no mask: every split reads whole tiles inside the weight
        assert sk == 1 or bk * sk <= k


def test_pack_stores_each_weight_tile_as_one_contiguous_block():
    import torch
    w = torch.arange(32 * 64, dtype=torch.float32).view(32, 64)
    p = pack(w, 8, 16)
    assert p.shape == (4, 4, 8, 16) and p.is_contiguous()
    for i in range(4):
        for j in range(4):
            assert torch.equal(p[i, j], w[i * 8:(i + 1) * 8, j * 16:(j + 1) * 16])


def test_the_swapped_product_compiles_to_hoppers_wgmma_and_the_16_row_tile_to_mma_sync():
    """What the swap family tries: with the weight tile as the MMA's A (64 rows a warpgroup), Triton emits SM90's
    wgmma fed from shared memory by its cp.async pipeline; dispatch/gemv.py's 16-row tile (x as A) can only emit
    mma.sync. A compile for SM90 on the CPU (Triton's ptxas), with the alignment a real launch specializes on."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dispatch.gemv import GemvConfig, arguments, kernel
    from tools.probes.gemv_variants import kernels
    ints = ["M", "N", "K", "k_per", "stride_xm", "stride_wn", "stride_ym"]

    def ptx(fn, pointers, extra, const):
        names = [*pointers, *ints, *extra]
        sig = {**{a: t for a, t in zip(names, ["*bf16"] * 3 + ["*fp32", "*i32"] + ["i32"] * (len(names) - 5))},
               **{c: "constexpr" for c in const}}
        aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a != "M"}
        return triton.compile(ASTSource(fn, sig, const, aligned), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4}).asm["ptx"]
    heads = ["x_ptr", "w_src", "y_ptr", "part_ptr", "count_ptr"]
    swapped = ptx(kernels()["swap"][0], heads, ["k_tiles"],
                  {"TILE_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 4, "LOAD": 0})
    assert "wgmma.mma_async" in swapped and "cp.async" in swapped and "mma.sync" not in swapped
    _, _, options = arguments(4, 2560, 4096, GemvConfig(32, 128, 4, 4, 16), None, (4096, 4096, 2560))
    today = ptx(kernel(), ["x_ptr", "w_ptr", *heads[2:]], [], {k: v for k, v in options.items() if k.isupper()})
    assert "mma.sync" in today and "wgmma" not in today
