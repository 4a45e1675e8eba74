"""The store of measured runs: files a run into evidence/ under an id made from the run, records it in
evidence/manifest.json, restores a filed run to a working folder, and finds the run behind a shipped table.

The id is <profile>-<kind>-<started, UTC>-<first 6 hex of the results file's sha256>: made from the run's checked
fields, never by hand. The manifest keeps, per id: the run's command, harness sha, fingerprint's GPU, start time and
what it backs.
"""
from __future__ import annotations

# The readers of the runs (pandas) are imported where a command reads one: `current`, what the Makefile asks with
# the system python, needs none of them.

import hashlib
import json
import lzma
import re
import shutil
import tempfile
from pathlib import Path

from dispatch.profiles import PROFILES
from harness.errors import HarnessError
from harness.io import atomic_write_text, check_format, read_json_object, sha256
from harness.shipped import PACKAGES as ROOT, shipped_file
from tables.manifest import MANIFEST as TABLE_MANIFEST, read_manifest

EVIDENCE = ROOT / "evidence"
MANIFEST = EVIDENCE / "manifest.json"
RESULT_FILES = ("results.csv", "forward.csv", "host_cost.csv", "sustain.csv", "e2e.csv", "limit.csv", "gemv_ab.csv",
                "variants.csv")
FIX = "pass a results folder the harness wrote"
MANIFEST_FORMAT = 1


def _result_file(run: Path) -> Path:
    if not (run / "run.json").is_file() and (run / TABLE_MANIFEST).is_file():
        return run / TABLE_MANIFEST  # a make-table run: its manifest names every leg and its verdict
    data = next((run / f for f in (*RESULT_FILES, "results.csv.xz") if (run / f).is_file()), None)
    if data is None:
        raise HarnessError(f"{run} holds none of {', '.join(RESULT_FILES)}; {FIX}")
    return data


STARTED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?([+-]\d\d:\d\d|Z)?")  # what run.json's `started` holds
KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")


def run_id(run: Path, info: dict) -> str:
    """The run's id, from fields checked here: a known profile, a short lower-case kind, a start time (or none)."""
    profile, kind, started = info.get("profile"), info.get("kind", "sweep"), info.get("started")
    if profile not in PROFILES:
        raise HarnessError(f"{run}: profile {profile!r:.40} is not one of {', '.join(PROFILES)}; {FIX}")
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise HarnessError(f"{run}: kind {kind!r:.40} is not a short lower-case word; {FIX}")
    if started is not None and not (isinstance(started, str) and STARTED.fullmatch(started)):
        raise HarnessError(f"{run}: started {started!r:.40} is not a time (YYYY-MM-DDTHH:MM:SS+00:00); {FIX}")
    digest = sha256(_result_file(run))[:6]
    stamp = started.replace("-", "").replace(":", "")[:13] if started else "undated"
    return f"{profile}-{kind}-{stamp}-{digest}"


def load_manifest() -> dict:
    if not MANIFEST.is_file():
        return {"format": MANIFEST_FORMAT, "runs": {}}
    data = read_json_object(MANIFEST, "evidence manifest", "restore it with git")
    check_format(data, MANIFEST, "evidence manifest", (MANIFEST_FORMAT,), "read it with the harness that wrote it")
    if not isinstance(data.get("runs"), dict):
        raise HarnessError(f"{MANIFEST}: runs is not an object; restore it with git")
    return data


def check_run(run: Path, partial: bool = False) -> dict:
    """run.json and the run's results, read by the readers every command uses: a complete run of a known profile,
    whose results file passes its own reader. Returns run.json."""
    if not run.is_dir():
        raise HarnessError(f"{run} is not a folder; {FIX}")
    if _result_file(run).name == TABLE_MANIFEST:
        return _check_table_run(run, partial)
    info = read_json_object(run / "run.json", "run.json", FIX)
    run_id(run, info)  # the fields the id is made of, checked
    if info.get("status", "complete") != "complete" and not partial:
        raise HarnessError(f"{run} is {info.get('status')!r}, not a complete run; finish it (--resume) before it is "
                           f"filed, or file what it holds with --partial")
    data = _result_file(run)
    if data.name in ("results.csv", "results.csv.xz"):
        from bench.results import load_results
        load_results(run, partial=partial)
    elif data.name == "forward.csv":
        from calibrate.forward_model import load_forward
        load_forward(run, partial=partial)
    elif data.name == "e2e.csv":
        from calibrate.e2e_terms import load_e2e
        load_e2e(run, partial=partial)
    elif data.name == "host_cost.csv":
        from calibrate.hostcost import load_host_cost
        load_host_cost(run)
    else:
        from bench.results import read_table
        read_table(data)
    return info


def _check_table_run(run: Path, partial: bool) -> dict:
    """A make-table run (python -m tables): its manifest read as a resume reads it, complete with a verdict (PASS or
    FAIL: a failed check is evidence too), each of its measured legs' results passing their reader. Returns what
    run_id and the manifest entry need, in run.json's terms."""
    m = read_manifest(run / TABLE_MANIFEST)
    if m.get("profile") not in PROFILES:
        raise HarnessError(f"{run}/{TABLE_MANIFEST} names profile {m.get('profile')!r:.40}, not one of "
                           f"{', '.join(PROFILES)}; {FIX}")
    if m.get("status") != "complete" and not partial:
        raise HarnessError(f"{run} is {m.get('status')!r}, not a complete table run; finish it (python -m tables "
                           f"--resume) before it is filed, or file what it holds with --partial")
    for leg in m.get("legs", {}):
        if (run / leg / "run.json").is_file():
            check_run(run / leg, partial)
    first = (m.get("machines") or [{}])[0]
    verdict = m.get("verdict") or "none"
    run_id(run, {"profile": m["profile"], "kind": "table", "started": m.get("started")})
    return {"profile": m["profile"], "kind": "table", "started": m.get("started"), "status": m.get("status"),
            "fingerprint": {**(first.get("fingerprint") or {}), "harness_sha": m.get("harness_sha")},
            "command": f"python -m tables --gpu {m['profile']} (verdict {verdict})"}


def _results_digests(run: Path) -> set[str]:
    """sha256 of every results file of a run and of its legs (a table run's sweeps and forwards), as written: an
    xz-packed one by its unpacked bytes."""
    out = set()
    for folder in (run, *sorted(p for p in run.iterdir() if p.is_dir())):
        for name in RESULT_FILES:
            for f, unpack in ((folder / name, False), (folder / f"{name}.xz", True)):
                if f.is_file():
                    data = lzma.decompress(f.read_bytes()) if unpack else f.read_bytes()
                    out.add(hashlib.sha256(data).hexdigest())
    return out


def _filed_digests() -> dict[str, str]:
    """sha256 of each filed run's results files, its legs' included -> its id."""
    return {digest: folder.name for folder in (sorted(EVIDENCE.iterdir()) if EVIDENCE.is_dir() else ())
            if folder.is_dir() for digest in _results_digests(folder)}


def add(run: Path, backs: str, note: str, partial: bool = False, replaces: str | None = None) -> tuple[str, list[str]]:
    """Files a run; `replaces`: the id of a filed table run this one is a later state of (the same run refitted or
    judged again: its earlier legs kept under refit-<n>/), whose folder and entry it takes the place of, its page
    section and figures carried over and each figure read again from the new folder (all or nothing). Returns the id
    and one line per figure whose reading changed."""
    if not backs.strip():
        raise HarnessError("--backs is empty; say which figure or file of docs/ the run backs")
    info = check_run(run, partial)
    rid = run_id(run, info)
    dest = EVIDENCE / rid
    if dest.exists() and rid != replaces:  # the same results in a later state (judged again) keep their id
        raise HarnessError(f"{dest} exists already; this run is filed")
    if replaces:
        _check_replaces(run, replaces, same_manifest=rid == replaces)
    filed = {d: r for d, r in _filed_digests().items() if r != replaces}
    same = next((filed[d] for d in sorted(_results_digests(run)) if d in filed), None)
    if same is None and info.get("kind") == "table":
        same = next((r for r in _filed_table_runs(info["profile"], info.get("started")) if r != replaces), None)
    if same is not None:
        raise HarnessError(f"{run} holds results that evidence/{same} holds already (the same file, a leg of a "
                           f"filed table run, or that table run); nothing was written" + ("" if replaces else
                           f"; a later state of that table run replaces it with --replaces {same}"))
    manifest = {"format": MANIFEST_FORMAT, **load_manifest()}
    replaced = manifest["runs"].pop(replaces) if replaces else None
    fp = info.get("fingerprint") or {}
    manifest["runs"][rid] = {"command": info.get("command"), "harness_sha": fp.get("harness_sha"),
                             "gpu": fp.get("gpu_name"), "started": info.get("started"), "backs": backs,
                             **({"note": note} if note else {}),
                             **({"partial": f"the run is {info.get('status')!r}: it backs only what it holds"}
                                if info.get("status", "complete") != "complete" else {})}
    EVIDENCE.mkdir(exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".add-", dir=EVIDENCE))
    changed: list[str] = []
    try:
        shutil.copytree(run, stage / rid, symlinks=True)
        _pack(stage / rid)
        old_kept = stage / f"replaced-{replaces}"
        if replaces:
            changed = _carry_over(replaced, manifest["runs"][rid], stage / rid)
            (EVIDENCE / replaces).rename(old_kept)  # removed once the manifest is saved
        (stage / rid).rename(dest)
        try:
            save(manifest)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            if replaces:
                old_kept.rename(EVIDENCE / replaces)
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return rid, changed


def _pack(folder: Path) -> None:
    """Every results.csv of a filed run (its legs' included) xz-packed in place, as the store keeps them (readers and
    `restore` unpack them)."""
    for f in sorted(folder.rglob("results.csv")):
        if f.is_file() and not f.is_symlink():
            f.with_name(f.name + ".xz").write_bytes(lzma.compress(f.read_bytes(), preset=9))
            f.unlink()


def _filed_table_runs(profile: str, started: str | None) -> list[str]:
    """The ids of the filed table runs of this profile and start: states of one table run."""
    out = []
    for folder in sorted(EVIDENCE.iterdir()) if EVIDENCE.is_dir() else ():
        if (folder / TABLE_MANIFEST).is_file():
            m = read_manifest(folder / TABLE_MANIFEST)
            if (m.get("profile"), m.get("started")) == (profile, started):
                out.append(folder.name)
    return out


def _check_replaces(run: Path, replaces: str, same_manifest: bool = False) -> None:
    """One line unless `replaces` names a filed table run that `run` is a later state of: both table runs of one
    profile and start, the new one with more refits (the earlier legs kept under refit-<n>/), or the same manifest
    (`same_manifest`: a leg's output made again by its own command)."""
    old = EVIDENCE / replaces
    if replaces not in load_manifest()["runs"] or not (old / TABLE_MANIFEST).is_file():
        raise HarnessError(f"--replaces {replaces}: not a filed table run; `python -m evidence_store list` names "
                           f"the filed runs")
    a, b = read_manifest(old / TABLE_MANIFEST), read_manifest(run / TABLE_MANIFEST)
    if (a.get("profile"), a.get("started")) != (b.get("profile"), b.get("started")) or \
            len(b.get("refits") or []) < len(a.get("refits") or []) + (0 if same_manifest else 1):
        raise HarnessError(f"--replaces {replaces}: {run} is not a later state of that table run (the same profile "
                           f"and start, refitted or judged again since); file it on its own")


def _carry_over(old: dict, new: dict, folder: Path) -> list[str]:
    """The replaced entry's page section and figures onto the new entry, each figure read again from `folder`. One
    line per figure whose reading changed."""
    from evidence_store.figures import agrees, read
    if "page" in old:
        new["page"] = old["page"]
    changed, figures = [], []
    for spec in old.get("figures", []):
        value = read(folder, spec)
        if not agrees(value, spec["value"], spec.get("tolerance", 0)):
            changed.append(f"{spec['label']}: {spec['value']!r} -> {value!r}")
        figures.append({**spec, "value": value})
    if figures:
        new["figures"] = figures
    return changed


PARTS = ("run", "check-sweep", "check-forward")


def current(profile: str, part: str = "run") -> Path:
    """The evidence folder of the table run behind the shipped table of `profile` (or its check-sweep or
    check-forward); one clear error where the table names no run that evidence/ holds."""
    if part not in PARTS:
        raise HarnessError(f"no part {part!r} of a table run; name one of {', '.join(PARTS)}")
    table = read_json_object(shipped_file("table", profile), "shipped table",
                             "name a profile with a shipped table (python -m bench profiles)")
    named = (table.get("source") or {}).get("manifest") or {}
    want = named.get("sha256") if isinstance(named, dict) else None
    if not want:
        raise HarnessError(f"the shipped {profile} table names no table run (source.manifest); it was not installed "
                           f"by python -m tables --install")
    for folder in sorted(EVIDENCE.iterdir()) if EVIDENCE.is_dir() else ():
        manifest = folder / "manifest.json"
        if manifest.is_file() and sha256(manifest) == want:
            out = folder if part == "run" else folder / part
            if not out.is_dir():
                raise HarnessError(f"{folder.relative_to(ROOT)} holds no {part}/; file the run's {part} with it")
            return out
    raise HarnessError(f"evidence/ holds no table run with the manifest the shipped {profile} table names "
                       f"({named.get('file')}); file that run under evidence/")


def restore(rid: str, to: Path) -> Path:
    """A filed run copied back to a working folder (e.g. results/<profile>/<run-id> of a table run, to --resume or
    --refit it), each xz-compressed results.csv decompressed beside it; nothing is written where `to` exists."""
    entry(rid)  # a filed run, or one line saying so
    src = EVIDENCE / rid
    if to.exists():
        raise HarnessError(f"{to} exists; restore into a new folder (nothing was written)")
    to.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".restore-", dir=to.parent))
    try:
        shutil.copytree(src, stage / "run", symlinks=True)
        for packed in (stage / "run").rglob("results.csv.xz"):
            packed.with_suffix("").write_bytes(lzma.decompress(packed.read_bytes()))
            packed.unlink()
        (stage / "run").rename(to)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return to


def entry(rid: str) -> tuple[dict, dict]:
    manifest = {"format": MANIFEST_FORMAT, **load_manifest()}
    if rid not in manifest["runs"] or not (EVIDENCE / rid).is_dir():
        raise HarnessError(f"evidence/{rid} is not a filed run; `python -m evidence_store list` names them")
    return manifest, manifest["runs"][rid]


def save(manifest: dict) -> None:
    atomic_write_text(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
