"""GPU test of --devices on a machine with two or more GPUs (skips otherwise): a small grid on every GPU against the
same grid on one, and the merged run's completeness."""
import pytest

pytestmark = pytest.mark.gpu


def test_a_sweep_over_every_gpu_matches_one_gpu(tmp_path, gpu_profile):
    import json

    import torch

    from bench.multi import run_on_devices
    from bench.paths import paths_for
    from bench.results import load_results
    from bench.sweep import SweepConfig, run_sweep
    from calibrate.agree import agreement
    from calibrate.analysis import Cells
    from shapes.catalog import catalog
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two or more GPUs")
    shapes = catalog()[:6]
    base = SweepConfig(profile=gpu_profile, shapes=shapes, ms=[1, 8, 64, 1024], paths=paths_for(("cublaslt",)),
                       out=tmp_path / "one", samples=5)
    run_sweep(base)
    many = run_on_devices(SweepConfig(**{**base.__dict__, "out": tmp_path / "many"}), "all")
    info = json.loads((many / "run.json").read_text())
    assert info["status"] == "complete" and len(info["shards"]) == torch.cuda.device_count()
    a, b = Cells.from_results(load_results(tmp_path / "one")), Cells.from_results(load_results(many))
    agree = agreement(a, b)
    assert len(agree) == len(a.samples)
    assert agree["gpu_diff"].abs().median() <= 0.02, agree.sort_values("gpu_diff").tail()
