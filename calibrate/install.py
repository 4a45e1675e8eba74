"""The one installer: every write of a shipped file (dispatch/thresholds, calibrate/noise, calibrate/baselines) goes
through `install`, which stages all of an install's files, reads each staged file back with the reader the runtime
uses, and only then renames them all into place. On any failure the shipped files are as they were.

Each artifact is staged in a hidden folder beside its destination, under its final name, so that a check that
looks for a sibling (a table's tactics file, a baseline's autotuner cache) finds the staged sibling, and the final
rename stays on one file system.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.autotune_cache import read_entries
from dispatch.gemv import parse
from dispatch.table import load_table
from harness.errors import HarnessError, signals_deferred
from harness.io import atomic_write, check_target, is_shipped, read_json, sha256, umask
from harness.shipped import shipped_file
from shapes.derive import layout_covers


@dataclass(frozen=True)
class Artifact:
    dest: Path
    content: bytes
    what: str  # "the table", "the baseline", ...: names it in a refusal
    check: Callable[[Path], None] | None = None  # reads the staged file as the runtime would; raises HarnessError


def install(artifacts: list[Artifact]) -> list[Path]:
    """Writes every artifact or none. Returns the destinations written."""
    if not artifacts:
        raise HarnessError("nothing to install")
    dests = [Path(a.dest) for a in artifacts]
    if len(set(map(os.path.abspath, dests))) != len(dests):
        raise HarnessError("an install names one destination twice")
    for a in artifacts:
        check_target(a.dest, a.what, install=True)
    stages: dict[Path, Path] = {}
    try:
        staged = []
        for a in artifacts:
            parent = Path(a.dest).parent
            parent.mkdir(parents=True, exist_ok=True)
            if parent not in stages:
                stages[parent] = Path(tempfile.mkdtemp(prefix=".install-", dir=parent))
            path = stages[parent] / Path(a.dest).name
            path.write_bytes(a.content)
            os.chmod(path, 0o666 & ~umask())
            staged.append(path)
        read_back(artifacts, staged, "install", "installed")
        with signals_deferred():
            _commit(dests, staged, stages)
    finally:
        for folder in stages.values():
            shutil.rmtree(folder, ignore_errors=True)
    return dests


def read_back(artifacts: list[Artifact], staged: list[Path], verb: str, done: str) -> None:
    """Each artifact's check on its staged copy; the first that fails is one line, nothing written."""
    for a, path in zip(artifacts, staged):
        if a.check is not None:
            try:
                a.check(path)
            except HarnessError as exc:
                why = str(exc).replace(f"{path}: ", "").replace(str(path), "it")
                raise HarnessError(f"{a.what} to {verb} as {a.dest} does not pass its reader ({why}); nothing was "
                                   f"{done}") from None


def _commit(dests: list[Path], staged: list[Path], stages: dict[Path, Path]) -> None:
    """Renames the staged files over their destinations, keeping the old ones until all are in; a failure puts the
    old files back and removes the new ones."""
    backups: list[tuple[Path, Path | None]] = []
    try:
        for dest, path in zip(dests, staged):
            keep = None
            if dest.exists():
                keep = stages[dest.parent] / f".old-{dest.name}"
                try:
                    os.link(dest, keep)
                except OSError:  # a file system without hard links
                    shutil.copy2(dest, keep)
            backups.append((dest, keep))
            os.replace(path, dest)
    except BaseException:
        for dest, keep in reversed(backups):
            try:
                if keep is not None:
                    os.replace(keep, dest)
                else:
                    dest.unlink(missing_ok=True)
            except OSError:
                pass
        raise


def write_outputs(artifacts: list[Artifact]) -> list[Path]:
    """An output that may be shipped: where any destination is a shipped file, all go through `install`; else each
    is read back by its check from a staged copy (siblings beside it, as install stages them), then written
    atomically (a user's own --out), as any output."""
    if any(is_shipped(a.dest) for a in artifacts):
        return install(artifacts)
    with tempfile.TemporaryDirectory(prefix="bf16-linear-bench-check-") as stage:
        staged = [Path(stage) / Path(a.dest).name for a in artifacts]
        for a, path in zip(artifacts, staged):
            path.write_bytes(a.content)
        read_back(artifacts, staged, "write", "written")
    for a in artifacts:
        atomic_write(Path(a.dest), lambda tmp, data=a.content: tmp.write_bytes(data))
    return [Path(a.dest) for a in artifacts]


def shipped_layout(profile: str) -> str:
    """The layout of the profile's shipped table (vLLM's where none is shipped or it names none)."""
    path = shipped_file("table", profile)
    if not path.is_file():
        return "vllm"
    try:
        data = read_json(path, "the shipped table", "restore it with git")
    except HarnessError:
        return "vllm"
    source = data.get("source") if isinstance(data, dict) else None
    return str(source.get("layout") or "vllm") if isinstance(source, dict) else "vllm"


def table_check(profile: str, layout: str | None) -> Callable[[Path], None]:
    """A staged table: it loads as the dispatcher loads it, is this profile's, of `layout` or the union of both
    layouts (`layout` None: any), and its
    tactics file, where it names one, is staged beside it with the recorded hash and reads as a tactics file."""
    def check(path: Path) -> None:
        table = load_table(path=path)
        if table.profile != profile:
            raise HarnessError(f"it is a table of the {table.profile!r} profile, not {profile!r}")
        got = str(table.source.get("layout") or "vllm")
        if layout is not None and not layout_covers(got, layout):
            raise HarnessError(f"it covers {got}'s layout; the shipped {profile} table covers {layout}'s. Give the "
                               f"dispatcher that table by path instead (dispatch.configure, or --table)")
        tactics = _staged_sibling(path, table.source.get("tactics"), "tactics file")
        if tactics is not None:
            read_entries(tactics)
        configs = _staged_sibling(path, table.source.get("gemv_configs"), "GEMV configuration file")
        if configs is not None:
            parse(read_json(configs, "GEMV configuration file", "refit the table"), configs.name)
    return check


def _staged_sibling(table: Path, spec: object, what: str) -> Path | None:
    """A file a staged table names beside it ({file, sha256}): staged with it and the one it was fitted with; None
    where the table names none."""
    if not isinstance(spec, dict) or not spec.get("file"):
        return None
    sibling = table.parent / str(spec["file"])
    if not sibling.is_file():
        raise HarnessError(f"its {what} {spec['file']} is not part of the install")
    if spec.get("sha256") and sha256(sibling) != spec["sha256"]:
        raise HarnessError(f"its {what} {spec['file']} is not the one it was fitted with (sha256)")
    return sibling


def gemv_check(path: Path) -> None:
    """A staged GEMV configuration file reads as the GEMV's parser reads it."""
    parse(read_json(path, "GEMV configuration file", "tune it afresh"), path.name)
