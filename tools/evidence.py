"""Files a measured run into evidence/ under a generated id and records it in evidence/manifest.json.

    python tools/evidence.py add RUN_DIR --backs "what it backs" [--note "..."]
    python tools/evidence.py list
    python tools/evidence.py current PROFILE [check-sweep|check-forward|run]
    python tools/evidence.py restore ID --to DIR
    python tools/evidence.py section ID --profile P --title T --order N --text "..."
    python tools/evidence.py figure ID --label "..." --of READER --args JSON [--tolerance T]
    python tools/evidence.py page PROFILE [--check]

`current` prints the evidence folder of the table run a profile's shipped table came from (the run whose manifest
has the hash the table's source.manifest records), or one of its check runs: what `make report` shows by default.

`section` puts a filed run on the results page of a profile; `figure` records one figure of it, read from the run
by a reader of tools/figures.py (the value is the reader's, never typed); `page` writes docs/results-<profile>.md
from the manifest, every figure read again from its run (`--check`: exit 1 where the page on disk differs).

The id is <profile>-<kind>-<started, UTC>-<first 6 hex of the results file's sha256>: made from the run, never by
hand. The manifest keeps, per id: the run's command, harness sha, fingerprint's GPU, start time and what it backs.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness.errors import HarnessError, run_cli  # noqa: E402
from harness.io import atomic_write_text, check_format, read_json_object  # noqa: E402

EVIDENCE = ROOT / "evidence"
MANIFEST = EVIDENCE / "manifest.json"
RESULT_FILES = ("results.csv", "forward.csv", "host_cost.csv", "sustain.csv", "e2e.csv", "limit.csv")
FIX = "pass a results folder the harness wrote"
TABLE_MANIFEST = "manifest.json"  # calibrate.table_pipeline.MANIFEST
MANIFEST_FORMAT = 1


def _result_file(run: Path) -> Path:
    if not (run / "run.json").is_file() and (run / TABLE_MANIFEST).is_file():
        return run / TABLE_MANIFEST  # a make-table run: its manifest names every leg and its verdict
    data = next((run / f for f in (*RESULT_FILES, "results.csv.xz") if (run / f).is_file()), None)
    if data is None:
        raise HarnessError(f"{run} holds none of {', '.join(RESULT_FILES)}; {FIX}")
    return data


def run_id(run: Path, info: dict) -> str:
    digest = hashlib.sha256(_result_file(run).read_bytes()).hexdigest()[:6]
    started = str(info.get("started", "")).replace("-", "").replace(":", "")[:13] or "undated"
    return f"{info.get('profile', 'gpu')}-{info.get('kind', 'sweep')}-{started}-{digest}"


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
    from dispatch.profiles import PROFILES
    if not run.is_dir():
        raise HarnessError(f"{run} is not a folder; {FIX}")
    if _result_file(run).name == TABLE_MANIFEST:
        return _check_table_run(run, partial)
    info = read_json_object(run / "run.json", "run.json", FIX)
    profile, kind = info.get("profile"), info.get("kind", "sweep")
    if profile not in PROFILES:
        raise HarnessError(f"{run}/run.json names profile {profile!r:.40}, not one of {', '.join(PROFILES)}; {FIX}")
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", kind):
        raise HarnessError(f"{run}/run.json names kind {kind!r:.40}, not a short lower-case word; {FIX}")
    if info.get("status", "complete") != "complete" and not partial:
        raise HarnessError(f"{run} is {info.get('status')!r}, not a complete run; finish it (--resume) before it is "
                           f"filed, or file what it holds with --partial")
    data = _result_file(run)
    if data.name in ("results.csv", "results.csv.xz"):
        from bench.results import load_results
        load_results(run)
    elif data.name == "forward.csv":
        from calibrate.forward_model import load_forward
        load_forward(run)
    elif data.name == "e2e.csv":
        from calibrate.e2e_terms import load_e2e
        load_e2e(run)
    elif data.name == "host_cost.csv":
        from calibrate.hostcost import load_host_cost
        load_host_cost(run)
    else:
        from bench.results import _read_table
        _read_table(data)
    return info


def _check_table_run(run: Path, partial: bool) -> dict:
    """A make-table run (calibrate table): its manifest read as a resume reads it, complete with a verdict (PASS or
    FAIL: a failed check is evidence too), each of its measured legs' results passing their reader. Returns what
    run_id and the manifest entry need, in run.json's terms."""
    from calibrate.table_pipeline import read_manifest
    from dispatch.profiles import PROFILES
    m = read_manifest(run / TABLE_MANIFEST)
    if m.get("profile") not in PROFILES:
        raise HarnessError(f"{run}/{TABLE_MANIFEST} names profile {m.get('profile')!r:.40}, not one of "
                           f"{', '.join(PROFILES)}; {FIX}")
    if m.get("status") != "complete" and not partial:
        raise HarnessError(f"{run} is {m.get('status')!r}, not a complete table run; finish it (calibrate table "
                           f"--resume) before it is filed, or file what it holds with --partial")
    for leg in m.get("legs", {}):
        if (run / leg / "run.json").is_file():
            check_run(run / leg, partial)
    first = (m.get("machines") or [{}])[0]
    verdict = m.get("verdict") or "none"
    return {"profile": m["profile"], "kind": "table", "started": m.get("started"), "status": m.get("status"),
            "fingerprint": {**(first.get("fingerprint") or {}), "harness_sha": m.get("harness_sha")},
            "command": f"python -m calibrate table --gpu {m['profile']} (verdict {verdict})"}


def _filed_digests() -> dict[str, str]:
    """sha256 of each filed run's results file -> its id."""
    out = {}
    for folder in EVIDENCE.iterdir() if EVIDENCE.is_dir() else ():
        data = next((folder / f for f in RESULT_FILES if (folder / f).is_file()), None)
        if data is not None:
            out[hashlib.sha256(data.read_bytes()).hexdigest()] = folder.name
    return out


def add(run: Path, backs: str, note: str, partial: bool = False) -> str:
    if not backs.strip():
        raise HarnessError("--backs is empty; say which figure or file of docs/ the run backs")
    info = check_run(run, partial)
    rid = run_id(run, info)
    dest = EVIDENCE / rid
    if dest.exists():
        raise HarnessError(f"{dest} exists already; this run is filed")
    same = _filed_digests().get(hashlib.sha256(_result_file(run).read_bytes()).hexdigest())
    if same is not None:
        raise HarnessError(f"{run} holds the same results as evidence/{same}, filed already; nothing was written")
    manifest = {"format": MANIFEST_FORMAT, **load_manifest()}
    fp = info.get("fingerprint") or {}
    manifest["runs"][rid] = {"command": info.get("command"), "harness_sha": fp.get("harness_sha"),
                             "gpu": fp.get("gpu_name"), "started": info.get("started"), "backs": backs,
                             **({"note": note} if note else {}),
                             **({"partial": f"the run is {info.get('status')!r}: it backs only what it holds"}
                                if info.get("status", "complete") != "complete" else {})}
    EVIDENCE.mkdir(exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".add-", dir=EVIDENCE))
    try:
        shutil.copytree(run, stage / rid, symlinks=True)
        (stage / rid).rename(dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    try:
        atomic_write_text(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return rid


PARTS = ("run", "check-sweep", "check-forward")


def current(profile: str, part: str = "run") -> Path:
    """The evidence folder of the table run behind the shipped table of `profile` (or its check-sweep or
    check-forward); one clear error where the table names no run that evidence/ holds."""
    if part not in PARTS:
        raise HarnessError(f"no part {part!r} of a table run; name one of {', '.join(PARTS)}")
    table = read_json_object(ROOT / "dispatch" / "thresholds" / f"{profile}.json", "shipped table",
                             "name a profile with a shipped table (python -m bench profiles)")
    named = (table.get("source") or {}).get("manifest") or {}
    want = named.get("sha256") if isinstance(named, dict) else None
    if not want:
        raise HarnessError(f"the shipped {profile} table names no table run (source.manifest); it was not installed "
                           f"by calibrate table --install")
    for folder in sorted(EVIDENCE.iterdir()) if EVIDENCE.is_dir() else ():
        manifest = folder / "manifest.json"
        if manifest.is_file() and hashlib.sha256(manifest.read_bytes()).hexdigest() == want:
            out = folder if part == "run" else folder / part
            if not out.is_dir():
                raise HarnessError(f"{folder.relative_to(ROOT)} holds no {part}/; file the run's {part} with it")
            return out
    raise HarnessError(f"evidence/ holds no table run with the manifest the shipped {profile} table names "
                       f"({named.get('file')}); file that run under evidence/")


def restore(rid: str, to: Path) -> Path:
    """A filed run copied back to a working folder (e.g. results/<profile>/<run-id> of a table run, to --resume or
    --refit it), each xz-compressed results.csv decompressed beside it; nothing is written where `to` exists."""
    import lzma
    _entry(rid)  # a filed run, or one line saying so
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


def _entry(rid: str) -> tuple[dict, dict]:
    manifest = {"format": MANIFEST_FORMAT, **load_manifest()}
    if rid not in manifest["runs"] or not (EVIDENCE / rid).is_dir():
        raise HarnessError(f"evidence/{rid} is not a filed run; `python tools/evidence.py list` names them")
    return manifest, manifest["runs"][rid]


def _save(manifest: dict) -> None:
    atomic_write_text(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def section(rid: str, profile: str, title: str, order: int, text: str) -> None:
    manifest, entry = _entry(rid)
    entry["page"] = {"profile": profile, "title": title, "order": order, "text": text}
    _save(manifest)


def figure(rid: str, label: str, of: str, args: dict, tolerance: float) -> object:
    """Reads one figure from the run and records it, with its reader, beside the run's entry."""
    from tools.figures import read
    manifest, entry = _entry(rid)
    spec = {"label": label, "of": of, "args": args, "tolerance": tolerance}
    spec["value"] = read(EVIDENCE / rid, spec)
    entry["figures"] = [f for f in entry.get("figures", []) if f["label"] != label] + [spec]
    _save(manifest)
    return spec["value"]


def page(profile: str) -> str:
    """docs/results-<profile>.md: each run on the page, in order, with its command and every figure read again."""
    from tools.figures import agrees, read, shown
    runs = [(rid, e) for rid, e in load_manifest()["runs"].items() if (e.get("page") or {}).get("profile") == profile]
    if not runs:
        raise HarnessError(f"no filed run is on the {profile} page; put one there with `tools/evidence.py section`")
    lines = [f"# Results on the {profile.upper()}", "",
             f"Written by `python tools/evidence.py page {profile}` from `evidence/manifest.json`; do not edit. Each "
             "figure is read again from the run it names (`evidence/<id>/`) by the reader in `tools/figures.py` "
             "that recorded it; `pytest -m evidence` checks that every reading still agrees with the recorded one.", ""]
    for rid, e in sorted(runs, key=lambda r: (r[1]["page"]["order"], r[0])):
        lines += [f"## {e['page']['title']}", "", e["page"]["text"], "",
                  f"Run `{rid}` (harness {e.get('harness_sha')}, {e.get('gpu')}, started {e.get('started') or 'undated'}).",
                  f"Command: `{e.get('command')}`", ""]
        if e.get("figures"):
            lines += ["| figure | value | read by |", "|---|---|---|"]
        for spec in e.get("figures", []):
            value = read(EVIDENCE / rid, spec)
            if not agrees(value, spec["value"], spec.get("tolerance", 0)):
                raise HarnessError(f"evidence/{rid}: {spec['label']!r} reads {value!r} now, recorded "
                                   f"{spec['value']!r}; record it again (tools/evidence.py figure) if the method "
                                   f"changed, else find out why")
            args = ", ".join(f"{k}={v}" for k, v in spec.get("args", {}).items())
            lines.append(f"| {spec['label']} | {shown(value)} | `{spec['of']}({args})` |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    from harness.cli import Parser
    from harness.options import add as add_option
    p = Parser(prog="tools/evidence.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("run")
    a.add_argument("--backs", required=True)
    a.add_argument("--note", default="")
    add_option(a, "partial", what="(the manifest says so)")
    sub.add_parser("list")
    r = sub.add_parser("restore")
    r.add_argument("id")
    r.add_argument("--to", required=True, help="the working folder to create (e.g. results/h200/<run-id>)")
    c = sub.add_parser("current")
    c.add_argument("profile")
    c.add_argument("part", nargs="?", default="run", choices=PARTS)
    s = sub.add_parser("section")
    s.add_argument("id")
    s.add_argument("--profile", required=True)
    s.add_argument("--title", required=True)
    s.add_argument("--order", type=int, required=True)
    s.add_argument("--text", required=True)
    f = sub.add_parser("figure")
    f.add_argument("id")
    f.add_argument("--label", required=True)
    f.add_argument("--of", required=True, help="a reader of tools/figures.py")
    f.add_argument("--args", type=json.loads, default={}, help="the reader's arguments, a JSON object")
    f.add_argument("--tolerance", type=float, default=0.0)
    g = sub.add_parser("page")
    g.add_argument("profile")
    g.add_argument("--check", action="store_true", help="exit 1 where docs/results-PROFILE.md differs")
    args = p.parse_args(argv)
    if args.cmd == "add":
        print(add(Path(args.run), args.backs, args.note, args.partial))
    elif args.cmd == "restore":
        print(f"restored evidence/{args.id} into {restore(args.id, Path(args.to))}")
    elif args.cmd == "section":
        section(args.id, args.profile, args.title, args.order, args.text)
    elif args.cmd == "figure":
        print(json.dumps(figure(args.id, args.label, args.of, args.args, args.tolerance)))
    elif args.cmd == "page":
        out, text = ROOT / "docs" / f"results-{args.profile}.md", page(args.profile) + "\n"
        if args.check:
            if not out.is_file() or out.read_text() != text:
                print(f"{out.relative_to(ROOT)} is not what the manifest writes; run tools/evidence.py page "
                      f"{args.profile}", file=sys.stderr)
                return 1
            return 0
        atomic_write_text(out, text)
        print(f"wrote {out.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    elif args.cmd == "current":
        print(current(args.profile, args.part).relative_to(ROOT))
    else:
        for rid, r in sorted(load_manifest()["runs"].items()):
            print(f"{rid}  {r.get('backs', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "tools/evidence.py"))
