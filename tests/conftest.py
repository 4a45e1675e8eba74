import pytest


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_addoption(parser):
    parser.addoption("--regression-tolerance", type=float, default=None,
                     help="GPU-ratio band of the regression tests (default: the baseline's own, 0.05)")


@pytest.fixture(scope="session")
def gpu_profile():
    """The GPU profile of this machine's CUDA device 0, or the test skips saying which GPU has none."""
    from dispatch.profiles import detect_profile, this_gpu
    name, sm = this_gpu(0)
    profile = detect_profile(name, sm)
    if profile is None:
        pytest.skip(f"no GPU profile for {name} (SM{sm}); add one in dispatch/profiles.py")
    return profile
