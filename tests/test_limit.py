"""calibrate/limit.py: the distance to the limit that validate prints, on small fixtures."""
import pandas as pd
import pytest

from calibrate.limit import forward_distance, lines, shape_shares


def _cells():
    rows = []
    for n, k in ((2560, 4096), (64, 2048)):  # 21 MB and a small weight the section leaves out
        for m in (1, 2, 4, 8, 16):
            for path, share in (("dispatch", 0.8 + m / 100), ("aten", 0.6)):
                rows.append({"n": n, "k": k, "m": m, "path": path, "status": "ok", "of_ceiling": share})
    rows.append({"n": 2560, "k": 4096, "m": 2, "path": "dispatch", "status": "failed", "of_ceiling": 0.1})
    return pd.DataFrame(rows)


def test_shares_are_the_dispatchers_for_large_weights_at_small_m():
    shares = shape_shares(_cells())  # the failed row is left out
    assert list(shares.index) == [(2560, 4096)] and list(shares.columns) == [1, 2, 4, 8]
    assert shares.loc[(2560, 4096), 8] == 0.88 and shares.loc[(2560, 4096), 2] == pytest.approx(0.82)
    assert shape_shares(_cells().drop(columns=["of_ceiling"])).empty  # a run without ceilings: no section


def test_the_forward_distance_is_the_captured_dispatchers_where_bandwidth_bounds_it():
    fdf = pd.DataFrame([{"model": "m", "m": m, "path": p, "regime": r, "status": "ok", "us": 2.0 * m, "floor_us": 1.0,
                         "over_floor": 2.0 * m, "over_ceiling_sum": 1.5 * m}
                        for m in (1, 8, 512) for p in ("dispatch", "aten") for r in ("graph", "eager")])
    dist = forward_distance(fdf)
    assert list(dist["m"]) == [1, 8] and list(dist["over_floor"]) == [2.0, 16.0]
    text = "\n".join(lines(_cells(), fdf))
    assert "share of the size-matched read ceiling" in text and "over_ceiling_sum" in text
    assert lines(_cells().drop(columns=["of_ceiling"]), fdf.drop(columns=["over_floor"])) == []


def test_the_fused_siblings_forwards_stand_beside_the_dispatchers_where_measured():
    """A forward that measured the fused-siblings rules shows them under the dispatcher at each M, against the same
    floor; one that did not shows the dispatcher alone."""
    fdf = pd.DataFrame([{"model": "m", "m": m, "path": p, "regime": "graph", "status": "ok", "us": us, "floor_us": 1.0,
                         "over_floor": us, "over_ceiling_sum": us / 2}
                        for m in (1, 8) for p, us in (("vllm-fused", 3.0), ("aten", 4.0), ("fused-siblings", 1.5),
                                                      ("dispatch", 2.0))])
    dist = forward_distance(fdf)
    assert list(zip(dist["m"], dist["path"])) == [(1, "dispatch"), (1, "fused-siblings"), (1, "vllm-fused"),
                                                  (8, "dispatch"), (8, "fused-siblings"), (8, "vllm-fused")]
    assert list(dist["over_floor"])[:3] == [2.0, 1.5, 3.0]
    alone = forward_distance(fdf[~fdf["path"].str.contains("fused")])
    assert list(alone["path"]) == ["dispatch", "dispatch"]
