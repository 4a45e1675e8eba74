import os

import pytest

# A test process never compiles the C++ bound layer on its own first dispatch.bind (dispatch/native.py): the
# native_module fixture builds it once, shared by the workers, and the test of the first-bind build turns it back on.
os.environ.setdefault("BLB_NATIVE_BUILD", "0")


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


@pytest.fixture(scope="session")
def gpu_table(gpu_profile):
    """The shipped table of this GPU's profile, or the test skips: a test of the dispatcher's rows needs one."""
    from dispatch.table import shipped_table
    table = shipped_table(gpu_profile.name)
    if table is None:
        pytest.skip(f"no table is shipped for the {gpu_profile.name} profile yet (make table GPU={gpu_profile.name})")
    return table


@pytest.fixture(scope="session")
def native_module(tmp_path_factory):
    """The C++ bound layer (dispatch/bound_linear.cpp), built for this torch into a session folder shared by the
    xdist workers (or into $BLB_NATIVE_DIR where that is set, reusing its build): the same build `python -m dispatch
    build-native` makes. Skips, saying why, only where no C++ compiler is installed. Loading it
    registers its capture counter with the hooks; dispatch.bind is not switched to it (a test that wants it patches
    dispatch.native.module), so other tests keep whatever this machine has built."""
    import os
    import shutil
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler (c++) to build the C++ bound layer with")
    import fcntl

    from dispatch import native
    old = os.environ.get("BLB_NATIVE_DIR")
    # pytest-xdist workers share one build: the session folder above each worker's, one worker compiling at a time
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (shared / "native").mkdir(exist_ok=True)
    os.environ["BLB_NATIVE_DIR"] = old or str(shared / "native")
    try:
        with open(shared / "native.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            native.build()
        native.forget()
        mod = native.module()
        native.forget()
    finally:
        if old is None:
            os.environ.pop("BLB_NATIVE_DIR")
        else:
            os.environ["BLB_NATIVE_DIR"] = old
    assert mod is not None, "built, but the C++ bound layer does not load"
    return mod
