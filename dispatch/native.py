"""dispatch.bind's bound layer in C++ (dispatch/bound_linear.cpp): built once per machine and torch, loaded if built.

`python -m dispatch build-native` compiles it with torch's extension builder (a C++ compiler and ninja; under half
a minute) into a folder per (torch, Python, source) under ~/.cache/bf16-linear-bench/native, or $BLB_NATIVE_DIR.
`dispatch.bind` then returns the C++ layer wherever it can (the capture signal is the hooks' counter, the weight and
bias are plain tensors or parameters); without a build it returns the Python layer, with the same choices.
BLB_NATIVE=0 turns it off.

The first `dispatch.bind` (or `dispatch.patch`) of a process where no build exists builds it, once per machine and
torch, where a C++ compiler and ninja are on PATH, saying so in one line: the Python layer costs more host time per
call than the C++ one, and a user should not have to know to build it. BLB_NATIVE_BUILD=0 keeps a process from
compiling (the Python layer then serves until `python -m dispatch build-native` ran); nothing is compiled at import.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

from dispatch import capture
from dispatch.lean import warn_once

NAME = "blb_bound_linear"
SOURCE = Path(__file__).with_name("bound_linear.cpp")
_LOADED: list[ModuleType | None] = []  # [module or None] once looked up
_TRIED: list[bool] = []  # [True] once this process tried to build it
_BUILDING: list[threading.Thread] = []  # build_ahead's thread, until module() waits for it


def enabled() -> bool:
    return os.environ.get("BLB_NATIVE", "1") != "0"


def build_dir() -> Path:
    """One folder per source, torch and Python: a build for another torch is never loaded."""
    root = Path(os.environ.get("BLB_NATIVE_DIR") or Path.home() / ".cache" / "bf16-linear-bench" / "native")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}".replace("+", "_")
    return root / tag


def library() -> Path:
    return build_dir() / f"{NAME}.so"


def build(verbose: bool = False) -> Path:
    """Compiles the layer (incremental: ninja rebuilds only a changed source) and returns the library's path."""
    from torch.utils.cpp_extension import load
    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    load(name=NAME, sources=[str(SOURCE)], build_directory=str(folder), extra_cflags=["-O2"], verbose=verbose,
         with_cuda=False)
    _LOADED.clear()
    return library()


def toolchain_missing() -> list[str]:
    """The build tools that are not on PATH (a C++ compiler, ninja)."""
    import shutil
    return [tool for tool in ("c++", "ninja") if shutil.which(tool) is None]


def auto_build_enabled() -> bool:
    return os.environ.get("BLB_NATIVE_BUILD", "1") != "0"


def _build_once() -> None:
    """The first bind's build where none exists and the tools are there; a failure is said once, and the Python
    layer serves."""
    _TRIED.append(True)
    warn_once("native-build", f"building the C++ bound layer once for this torch and Python into {build_dir()} "
                              f"(a half minute; BLB_NATIVE_BUILD=0 skips it, python -m dispatch build-native does it "
                              f"ahead)")
    try:
        build()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warn_once("native-build-failed", f"the C++ bound layer did not build ({first}); dispatch.bind runs the "
                                         f"Python layer (python -m dispatch build-native --verbose shows why)")


def _would_build() -> bool:
    """Whether the first bind of this process builds the layer: none exists, the tools are there, nothing turned
    it off, and no build was tried yet."""
    return not _TRIED and enabled() and auto_build_enabled() and not library().exists() and not toolchain_missing()


def build_ahead() -> bool:
    """Starts the build the first bind would make (where it would) in a thread, so that it runs beside the caller's
    other start-up work (the compiler is a subprocess); the first module() waits for it. True where one started."""
    if not _would_build():
        return False
    _LOADED.clear()
    _TRIED.append(True)  # a second build_ahead or bind starts none
    _BUILDING.append(threading.Thread(target=_build_once, name="blb-native-build", daemon=True))
    _BUILDING[0].start()
    return True


def module(build_if_missing: bool = False) -> ModuleType | None:
    """The built layer's module, or None (not built, turned off, or built against something else: said once).
    build_if_missing (dispatch.bind's lookup): build it first where none exists (auto_build_enabled, the tools on
    PATH), once per process. A build build_ahead started is waited for first."""
    while _BUILDING:
        _BUILDING.pop().join()
    if build_if_missing and _would_build():
        _LOADED.clear()
        _build_once()
    if _LOADED:
        return _LOADED[0]
    mod = None
    path = library()
    if enabled() and path.exists():
        try:
            spec = importlib.util.spec_from_file_location(
                NAME, path, loader=importlib.machinery.ExtensionFileLoader(NAME, str(path)))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except (ImportError, OSError) as exc:
            warn_once("native", f"the C++ bound layer at {path} does not load ({exc}); dispatch.bind runs the Python "
                                f"layer (rebuild: python -m dispatch build-native)")
            mod = None
        if mod is not None:
            capture.add_listener(mod.capture_enter, mod.capture_exit)
    _LOADED.append(mod)
    return mod


def forget() -> None:
    """Look the library up again at the next bind (tests, and after a build)."""
    _LOADED.clear()
