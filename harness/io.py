"""Files in and out, shared by every command: JSON reading with one-line errors, atomic writes with the user's umask,
output paths checked before any work, and work folders the harness may clear because it made them."""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from harness.errors import HarnessError
from harness.shipped import PACKAGES as ROOT, in_shipped_dir, is_own

WORK_MARKER = ".bf16-linear-bench-work"  # a folder holding this file was created by the harness and may be cleared


def resolved(path: Path, option: str = "the output") -> Path:
    """The path with its links followed; one line, not a traceback, for a symlink loop."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        raise HarnessError(f"{option} {path} runs through a symlink loop; name a file that exists or can") from None


def is_tracked(path: Path) -> bool:
    """Whether `path` (links followed) is one of the project's own files (harness.shipped.is_own): never an
    output."""
    return is_own(resolved(path))


def is_shipped(path: Path) -> bool:
    return in_shipped_dir(resolved(path))


def check_target(path: Path, option: str, install: bool = False) -> Path:
    """An output file checked before any work: absent or a regular file (a symlink is followed to its target, never
    replaced), its folder writable, and no shipped file unless `install`. Returns the path to write."""
    path = Path(path)
    real = resolved(path, option) if path.is_symlink() else path
    resolved(real, option)  # a loop further up the path
    if real.exists() and not real.is_file():
        raise HarnessError(f"{option} {path} is not a regular file (a folder, device, FIFO or socket); name a "
                           f"regular file to write")
    folder = next((p for p in real.parents if p.exists()), Path("."))
    if not folder.is_dir():
        raise HarnessError(f"{option} {path}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HarnessError(f"{option} {path}: {folder} is not writable; choose a folder you can write")
    if is_shipped(real):
        if install:
            return real
        raise HarnessError(f"{option} {path} is a file the project ships; pass --install to replace it, or write "
                           f"elsewhere")
    if is_tracked(real):
        link = f"a symlink to {real}, " if path.is_symlink() else ""
        raise HarnessError(f"{option} {path} is {link}a file of the project's own; nothing was written: name "
                           f"another output" + (", or remove the link" if link else " (results/ is for outputs)"))
    return real


MAX_INPUT_BYTES = 256 << 20  # no input file the harness reads is near this; /dev/zero and the like stop here
MAX_JSON_DEPTH = 32  # the deepest file the harness writes nests 6 levels


def read_input(path: str | Path, what: str, fix: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file: a regular file (never a FIFO, device or socket, which could block or never end)
    of at most `limit` bytes; one HarnessError naming `what` and `fix` otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise HarnessError(f"{what} {path} not found; {fix}") from None
    except OSError as exc:
        raise HarnessError(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    if stat.S_ISDIR(st.st_mode):
        raise HarnessError(f"{what} {path} is a folder, not a file; {fix}")
    if not stat.S_ISREG(st.st_mode):
        raise HarnessError(f"{what} {path} is not a regular file (a device, FIFO or socket); {fix}")
    if st.st_size > limit:
        raise HarnessError(f"{what} {path} is {st.st_size} bytes, over the {limit} this input can be; {fix}")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise HarnessError(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    if len(data) > limit:
        raise HarnessError(f"{what} {path} grew past {limit} bytes while read; {fix}")
    return data


def read_input_text(path: str | Path, what: str, fix: str, limit: int = MAX_INPUT_BYTES) -> str:
    data = read_input(path, what, fix, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HarnessError(f"{what} {path} is not UTF-8 text (byte {exc.start}); {fix}") from None


def json_depth(value: Any) -> int:
    """How deep objects and lists nest (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def parse_json_text(text: str, where: str, what: str, fix: str) -> Any:
    try:
        data = json.loads(text)
    except RecursionError:
        raise HarnessError(f"{what} {where} nests deeper than any file the harness writes; {fix}") from None
    except ValueError as exc:
        raise HarnessError(f"{what} {where} is not valid JSON ({exc}); {fix}") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise HarnessError(f"{what} {where} nests deeper than {MAX_JSON_DEPTH} levels, deeper than any file the "
                           f"harness writes; {fix}")
    return data


def read_json(path: str | Path, what: str, fix: str) -> Any:
    """The parsed JSON of `path`; one HarnessError naming `what` and `fix` when it is missing, not a regular file,
    too large, not UTF-8, not JSON or nested deeper than MAX_JSON_DEPTH."""
    return parse_json_text(read_input_text(path, what, fix), str(path), what, fix)


def check_format(data: dict[str, Any], where: str | Path, what: str, known: tuple[int, ...], fix: str) -> int:
    """The `format` of a harness file (no key: format 1, what every file was before it had one), refused in one line
    where this harness does not read it."""
    fmt = data.get("format", 1)
    if isinstance(fmt, bool) or fmt not in known:
        raise HarnessError(f"{where}: {what} format {fmt!r:.20} is not one this harness reads "
                           f"({', '.join(map(str, known))}); {fix}")
    return fmt


def read_json_object(path: str | Path, what: str, fix: str) -> dict[str, Any]:
    data = read_json(path, what, fix)
    if not isinstance(data, dict):
        raise HarnessError(f"{what} {path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


def sha256(path: str | Path) -> str:
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def is_count(value: Any, least: int | None = 1) -> bool:
    """A JSON integer >= least (None: any integer): never a float that looks whole (2560.0 or 2560.5), a bool or a
    numeric string."""
    return isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)


def umask() -> int:
    """The process's umask (read without changing it for longer than the call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, fill: Callable[[Path], object]) -> None:
    """fill(tmp) writes a temp file in the same folder, which is then renamed over `path`: a reader never sees half a
    file, and a failed fill leaves nothing behind. The file gets the user's umask (mkstemp would leave it 0600). A
    symlink is written through (its target replaced, the link kept); a non-regular file is never replaced."""
    path = Path(path)
    if path.is_symlink():
        if is_tracked(path):
            raise HarnessError(f"{path} is a symlink to {resolved(path)}, a file of the project's own; nothing "
                               f"was written")
        path = resolved(path)
    if path.is_dir():
        raise HarnessError(f"{path} is a folder; name a file to write")
    if is_shipped(path):
        raise HarnessError(f"{path} is a file the project ships; it changes only through the installer (--install)")
    if path.exists() and not path.is_file():
        raise HarnessError(f"{path} is not a regular file (a device, FIFO or socket); nothing was written")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        fill(Path(tmp))
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, newline=""))


def output_file(value: str | Path, option: str, install: bool = False) -> Path:
    """An output file option, checked before any work: not a folder, its parent not a file (check_target)."""
    path = Path(value)
    if str(value) == "":
        raise HarnessError(f"{option} is empty; name a file to write")
    if str(value).endswith(os.sep):
        raise HarnessError(f"{option} {value} ends in '{os.sep}', which names a folder; name a file to write "
                           f"(e.g. {path / 'out'})")
    if path.is_dir():
        raise HarnessError(f"{option} {path} is a folder; name a file to write (e.g. {path / 'out'})")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise HarnessError(f"{option} {path}: {parent} is a file, not a folder; choose another path")
    check_target(path, option, install)
    return path


def shipped_or_results(value: str | None, shipped: Path, results: Path, install: bool, option: str = "--out") -> Path:
    """Where a command that makes a shipped kind of file writes: --out where given; else the shipped file with
    --install, else under results/."""
    if value is not None:
        return output_file(value, option, install)
    return output_file(shipped if install else results, "--install" if install else option, install)


def output_dir(value: str | Path, option: str) -> Path:
    """An output folder option, checked before any work: not an existing file, nor below one, and the nearest
    existing folder on its path writable (tried with a temporary file: root ignores modes, not read-only mounts
    or immutable folders)."""
    path = Path(value)
    if str(value) == "":
        raise HarnessError(f"{option} is empty; name a folder to write (e.g. results/run)")
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise HarnessError(f"{option} {path}: {p} is a file, not a folder; choose another output folder")
    if is_tracked(path):
        raise HarnessError(f"{option} {path} is inside the project's own files (a package's folder or .git); "
                           f"choose another output folder (results/ is for outputs)")
    nearest = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        raise HarnessError(f"{option} {path}: {nearest} is not writable ({exc.strerror}); choose a folder you can "
                           f"write") from None
    return path


def claim_work_dir(path: Path, option: str) -> Path:
    """A folder the harness may clear later: created here with a marker file, or one it created before (marker
    present), or an empty one. A folder with other contents and no marker is the user's: refused, never touched."""
    path = output_dir(path, option)
    if path.is_dir() and not (path / WORK_MARKER).is_file() and any(path.iterdir()):
        raise HarnessError(f"{option} {path} exists and was not created by this harness (no {WORK_MARKER} in it); "
                           f"nothing was changed: choose a new or empty folder")
    path.mkdir(parents=True, exist_ok=True)
    (path / WORK_MARKER).touch()
    return path


def clear_work_dir(path: Path) -> None:
    """Removes a folder made by claim_work_dir; anything else is refused (never deleted)."""
    if not path.exists():
        return
    if not (path / WORK_MARKER).is_file():
        raise HarnessError(f"{path} was not created by this harness (no {WORK_MARKER} in it), so it is not removed; "
                           f"move it away or choose another work folder")
    shutil.rmtree(path)


def distinct(runs: list[str], what: str) -> list[str]:
    """Replicates must be different runs: one folder given twice (by any spelling) would measure no noise."""
    seen: dict[Path, str] = {}
    for r in runs:
        key = Path(r).resolve()
        if key in seen:
            raise HarnessError(f"{what}: {r} and {seen[key]} are the same run; pass distinct runs from fresh processes")
        seen[key] = r
    return runs


def same_gpu(infos: list[tuple[str, dict]], allow: bool) -> None:
    """Runs compared with each other (their run.json) must come from one kind of GPU, unless the user asks
    otherwise."""
    names = {r: str((i.get("fingerprint") or {}).get("gpu_name", "?")) for r, i in infos}
    if len(set(names.values())) > 1 and not allow:
        shown = ", ".join(f"{r}: {g}" for r, g in names.items())
        raise HarnessError(f"the runs come from different GPUs ({shown}); compare runs of one GPU, or pass "
                           f"--allow-mismatch")
