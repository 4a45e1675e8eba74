"""GPU test: the real host-time layers of the FlashInfer path, timed and decomposed."""
import pytest

pytestmark = pytest.mark.gpu


def test_host_anatomy_times_every_layer_and_the_segments_add_up(tmp_path, gpu_profile):
    import pandas as pd

    from bench.anatomy import FLASHINFER_SEGMENTS, FLASHINFER_TOTAL
    from bench.anatomy_gpu import Anatomy, run_anatomy
    from shapes.catalog import catalog, select
    profile = gpu_profile
    backends = ["cublaslt"] + ([profile.low_m_backend] if profile.low_m_backend != "cute-dsl" else [])
    run_anatomy(Anatomy(profile, select(catalog(), "n2048_k4096"), [8, 48], backends, tmp_path, calls=10, rounds=3,
                        command=["pytest"]))
    df = pd.read_csv(tmp_path / "results.csv")
    assert (df["status"] == "ok").all()
    for b in backends:
        path = f"flashinfer:{b}"
        for m in (8, 48):
            cell = df[(df["m"] == m) & (df["path"] == path)]
            layers = dict(zip(cell[cell.kind == "layer"]["layer"], cell[cell.kind == "layer"]["host_us"]))
            segs = cell[cell.kind == "segment"]
            # a segment with `unless` is an alternative split, left out where its alternative layer was timed
            assert len(segs) == len([s for s in FLASHINFER_SEGMENTS if s.unless is None or s.unless not in layers])
            assert segs["host_us"].sum() == pytest.approx(layers[FLASHINFER_TOTAL], rel=1e-3)  # telescoping
            aten = df[(df["m"] == m) & (df["path"] == "aten") & (df["layer"] == "F.linear")]["host_us"].iloc[0]
            assert layers[FLASHINFER_TOTAL] > aten  # an opaque op over FlashInfer never costs less host time
            assert set(cell[(cell.layer == "choose_one")]["cache_state"]) >= {"untuned"}
    assert (df[df.kind == "layer"]["gpu_busy"] == True).mean() > 0.9  # noqa: E712  (read back as bool)
