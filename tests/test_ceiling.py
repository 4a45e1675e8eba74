"""The distance to the memory ceiling on CPU: bytes a cell moves, achieved bandwidth and its share of the ceilings."""
import pytest

from bench.ceiling import annotate, cell_bytes


def test_a_cell_moves_its_weight_input_and_output_in_bf16():
    assert cell_bytes(2560, 4096, 1) == (2560 * 4096 + 4096 + 2560) * 2
    assert cell_bytes(10, 20, 30) == (200 + 600 + 300) * 2


def test_every_ok_row_gets_its_bandwidth_and_share_of_both_ceilings():
    weight = 2560 * 4096 * 2
    ceilings = {"large_buffer": {"gbps": 4000.0}, "size_matched": {str(weight): {"gpu_us": 6.0}}}
    rows = [{"n": 2560, "k": 4096, "m": 1, "status": "ok", "gpu_us": 8.0},
            {"n": 2560, "k": 4096, "m": 1, "status": "skipped", "gpu_us": None},
            {"n": 64, "k": 64, "m": 1, "status": "ok", "gpu_us": 2.0}]
    annotate(rows, ceilings)
    first = rows[0]
    assert first["bytes"] == cell_bytes(2560, 4096, 1)
    assert first["gbps"] == pytest.approx(first["bytes"] / 8.0 / 1e3, rel=1e-3)
    assert first["of_large_ceiling"] == pytest.approx(first["gbps"] / 4000.0, rel=1e-3)
    assert first["of_ceiling"] == pytest.approx(0.75)
    assert "gbps" not in rows[1]  # nothing measured, nothing derived
    assert "of_ceiling" not in rows[2] and rows[2]["of_large_ceiling"] > 0  # no read of its size was measured


def test_no_ceilings_leaves_the_rows_as_they_were():
    rows = [{"n": 1, "k": 1, "m": 1, "status": "ok", "gpu_us": 1.0}]
    annotate(rows, None)
    assert rows == [{"n": 1, "k": 1, "m": 1, "status": "ok", "gpu_us": 1.0}]


def test_a_forwards_floor_is_its_bytes_over_the_large_buffer_ceiling():
    from bench.ceiling import annotate_forward, forward_floor
    shapes = [(2560, 4096), (1024, 4096), (2560, 4096)]
    ceilings = {"large_buffer": {"gbps": 4000.0},
                "size_matched": {str(2560 * 4096 * 2): {"gpu_us": 6.0}}}
    floor = forward_floor(shapes, 8, ceilings)
    assert floor["bytes"] == sum(cell_bytes(n, k, 8) for n, k in shapes)
    assert floor["floor_us"] == pytest.approx(floor["bytes"] / 4000.0 / 1e3, rel=1e-3)
    assert floor["ceiling_sum_us"] is None  # no read of 1024 x 4096's bytes was measured
    ceilings["size_matched"][str(1024 * 4096 * 2)] = {"gpu_us": 6.0}
    rows = [{"m": 8, "status": "ok", "us": 40.0}, {"m": 8, "status": "failed", "us": None}]
    annotate_forward(rows, shapes, ceilings)
    assert rows[0]["over_floor"] == pytest.approx(40.0 / rows[0]["floor_us"], rel=1e-3)
    assert rows[0]["ceiling_sum_us"] == pytest.approx(18.0) and rows[0]["over_ceiling_sum"] == pytest.approx(40 / 18, rel=1e-3)
    assert "over_floor" not in rows[1]


def test_reads_cycle_through_enough_copies_to_come_from_hbm():
    from bench.ceiling import ROTATIONS, copies_for
    l2 = 60 << 20
    assert copies_for(16 << 20, l2) == ROTATIONS
    assert copies_for(64 << 20, l2) == 3
    assert copies_for(1 << 30, l2) == 1


def test_a_size_that_did_not_fit_gets_no_share():
    rows = [{"n": 1024, "k": 1024, "m": 1, "status": "ok", "gpu_us": 1.0}]
    annotate(rows, {"large_buffer": {"bytes": 1, "skipped": "out of memory"},
                    "size_matched": {str(1024 * 1024 * 2): {"bytes": 1024 * 1024 * 2, "skipped": "out of memory"}}})
    assert "of_ceiling" not in rows[0] and "of_large_ceiling" not in rows[0] and rows[0]["gbps"] > 0


def test_the_gemv_path_runs_only_the_cells_it_takes():
    """The project's GEMV is a registry path for M <= 16 on SM 80 and newer; the sweep records every other cell as
    skipped with the reason, and the fit may choose it where it was measured."""
    from bench.paths import GEMV, PATHS
    from calibrate.analysis import dispatch_candidates
    path = PATHS[GEMV]
    assert path.skip_reason(90, 2560, 4096, 16) is None and path.skip_reason(100, 2560, 4096, 1) is None
    assert "M <= 16" in path.skip_reason(90, 2560, 4096, 17)
    assert "SM 80" in path.skip_reason(75, 2560, 4096, 1)
    assert path.max_m == 16 and path.role == "candidate"

    class Measured:
        def paths(self):
            return {"aten", GEMV, "flashinfer-lean:cublaslt"}
    assert dispatch_candidates(Measured(), None) == ["aten", "flashinfer-lean:cublaslt", GEMV]

    class Unmeasured:
        def paths(self):
            return {"aten", "flashinfer-lean:cublaslt"}
    assert GEMV not in dispatch_candidates(Unmeasured(), None)


def test_a_pdl_cells_share_comes_from_the_span_of_its_calls():
    weight = 2560 * 4096 * 2
    ceilings = {"large_buffer": {"gbps": 4000.0}, "size_matched": {str(weight): {"gpu_us": 6.0}}}
    rows = [{"n": 2560, "k": 4096, "m": 1, "status": "ok", "gpu_us": 12.0, "span_us": 8.0, "pdl": True},
            {"n": 2560, "k": 4096, "m": 1, "status": "ok", "gpu_us": 12.0, "span_us": 8.0, "pdl": False}]
    annotate(rows, ceilings)
    assert rows[0]["of_ceiling"] == pytest.approx(0.75) and rows[1]["of_ceiling"] == pytest.approx(0.5)


def test_the_dispatchers_share_is_read_as_the_path_whose_kernels_it_ran():
    """The dispatch row takes its GPU time from the path it ran (gpu_from); where that path is a pdl one, its share
    comes from the span of the calls, as the path's own row does."""
    weight = 2560 * 4096 * 2
    ceilings = {"large_buffer": {"gbps": 4000.0}, "size_matched": {str(weight): {"gpu_us": 6.0}}}
    cell = {"n": 2560, "k": 4096, "m": 1, "status": "ok", "gpu_us": 12.0, "span_us": 8.0}
    rows = [{**cell, "path": "flashinfer-lean:tinygemm", "pdl": True},
            {**cell, "path": "dispatch", "pdl": None, "gpu_from": "flashinfer-lean:tinygemm"},
            {**cell, "path": "aten", "pdl": None},
            {**cell, "path": "dispatch2", "pdl": None, "gpu_from": "aten"}]
    annotate(rows, ceilings)
    assert [r["of_ceiling"] for r in rows] == pytest.approx([0.75, 0.75, 0.5, 0.5])
