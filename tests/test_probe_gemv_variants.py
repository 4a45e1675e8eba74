"""The GEMV structure probe's plan (tools/probes/gemv_variants): what it tries and how it packs, on CPU."""
import pytest

from dispatch.gemv import tile_rows
from tools.probes.gemv_variants import REG_BUDGET, pack, variants


@pytest.mark.parametrize("n,k", [(2560, 4096), (4096, 2048), (2560, 9216)])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_every_variant_fits_its_budget_and_splits_k_into_whole_tiles_where_packed(n, k, m):
    plan = variants(n, k, m, 132)
    assert plan[0][0] == "rows" and len(set(plan)) == len(plan)  # today's kernel first, nothing twice
    for family, rows, bn, bk, sk, warps, stages in plan:
        tensor_core = family.endswith("16") or family.startswith("tc16")
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
