"""Where the project's own files are, checked out or installed: the files each package ships (one function knows
where each kind lives), the packages' folders, and, in a checkout, the repository's tracked files and `.git/`,
all decided without running git.

Installed from a wheel, the packages sit side by side in site-packages and ship their data inside them; in a
checkout they sit side by side at the repository's root. Either way the folder above this package holds them.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from harness.floors import FLOORS as PACKAGE_NAMES  # every package of the project

PACKAGES = Path(__file__).resolve().parent.parent  # the folder holding the packages: the checkout, or site-packages
# kind -> (folder under PACKAGES, file name of a profile's file): everything the runtime reads that a profile ships
KINDS = {
    "table": ("dispatch/thresholds", "{profile}.json"),
    "noise": ("calibrate/noise", "{profile}.json"),
    "forward-noise": ("calibrate/noise", "{profile}-forward.json"),
    "baseline": ("calibrate/baselines", "{profile}.json"),
}
WHAT = {"table": "threshold table", "noise": "cell noise floor", "forward-noise": "forward noise floor",
        "baseline": "regression baseline"}


def shipped_dir(kind: str) -> Path:
    return PACKAGES / KINDS[kind][0]


def shipped_dirs() -> tuple[Path, ...]:
    """The folders of shipped files: written only through the installer (--install)."""
    return tuple(dict.fromkeys(PACKAGES / folder for folder, _ in KINDS.values()))


def shipped_file(kind: str, profile: str) -> Path:
    """Where the package keeps `profile`'s file of `kind` (a table, a noise floor, a baseline)."""
    folder, name = KINDS[kind]
    return PACKAGES / folder / name.format(profile=profile)


def shown(kind: str, profile: str = "<profile>") -> str:
    """The file's place as a user reads it: relative to the packages' folder (calibrate/noise/h200.json)."""
    folder, name = KINDS[kind]
    return f"{folder}/{name.format(profile=profile)}"


def missing_line(kind: str, profile: str) -> str:
    """The one line for a file its profile ships and this installation lacks."""
    return (f"the {profile} profile ships a {WHAT[kind]} ({shown(kind, profile)}) and this installation has none: "
            f"reinstall the package (pip install --force-reinstall bf16-linear-bench) or, in a checkout, restore it "
            f"with git checkout -- {shown(kind, profile)}")


def checkout() -> Path | None:
    """The repository root when the packages sit in a git checkout (a .git folder, or a worktree's .git file)."""
    return PACKAGES if (PACKAGES / ".git").exists() else None


def git_dir() -> Path | None:
    root = checkout()
    if root is None:
        return None
    dot = root / ".git"
    if dot.is_dir():
        return dot
    try:
        line = dot.read_text().strip()
    except OSError:
        return None
    if not line.startswith("gitdir:"):
        return None
    target = Path(line.removeprefix("gitdir:").strip())
    return target if target.is_absolute() else (root / target).resolve()


def tracked() -> frozenset[str] | None:
    """The tracked files of the checkout (paths relative to its root), read from git's index; None where there is
    no checkout or its index cannot be read (then everything in the checkout but results/ counts as its own)."""
    gd = git_dir()
    if gd is None:
        return None
    index = gd / "index"
    try:
        st = os.stat(index)
    except OSError:
        return None
    return _index_paths(str(index), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _index_paths(index: str, mtime_ns: int, size: int) -> frozenset[str] | None:
    """The paths in a git index file (formats 2, 3 and 4; the mtime and size only key the cache)."""
    try:
        data = Path(index).read_bytes()
    except OSError:
        return None
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return None
    paths, pos, previous = [], 12, b""
    try:
        for _ in range(count):
            start = pos
            flags = int.from_bytes(data[pos + 60:pos + 62], "big")
            pos += 62
            if version >= 3 and flags & 0x4000:  # extended flags
                pos += 2
            if version == 4:  # the name: how much of the previous one to drop (a varint), then the rest
                byte = data[pos]
                drop = byte & 0x7F
                pos += 1
                while byte & 0x80:
                    byte = data[pos]
                    drop = ((drop + 1) << 7) | (byte & 0x7F)
                    pos += 1
                end = data.index(b"\0", pos)
                name = previous[:len(previous) - drop] + data[pos:end]
                pos = end + 1
            else:
                end = data.index(b"\0", pos)
                name = data[pos:end]
                pos = start + ((end - start + 8) // 8) * 8  # entries are padded with NULs to a multiple of 8
            paths.append(name.decode("utf-8", "surrogateescape"))
            previous = name
    except (IndexError, ValueError):
        return None
    return frozenset(paths)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def in_shipped_dir(real: Path) -> bool:
    """Whether a resolved path lies in a folder of shipped files (written only through the installer)."""
    return any(_inside(real, folder) for folder in shipped_dirs())


def is_own(real: Path) -> bool:
    """Whether a resolved path is one of the project's own files: inside a package's folder (and so every file a
    package ships), under `.git/`, or a tracked file of the checkout (without an index: anything in the checkout
    but results/). Outputs never go there."""
    if any(_inside(real, PACKAGES / name) for name in PACKAGE_NAMES):
        return True
    root = checkout()
    if root is None or not _inside(real, root):
        return False
    if _inside(real, root / ".git") or (git_dir() is not None and _inside(real, git_dir())):
        return True
    files = tracked()
    if files is None:
        return not _inside(real, root / "results")
    rel = real.relative_to(root).as_posix()
    return rel in files
