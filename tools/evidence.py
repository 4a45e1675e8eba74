"""Files a measured run into evidence/ under a generated id and records it in evidence/manifest.json.

    python tools/evidence.py add RUN_DIR --backs "what it backs" [--note "..."]
    python tools/evidence.py list

The id is <profile>-<kind>-<started, UTC>-<first 6 hex of the results file's sha256>: made from the run, never by
hand. The manifest keeps, per id: the run's command, harness sha, fingerprint's GPU, start time and what it backs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "evidence"
MANIFEST = EVIDENCE / "manifest.json"
RESULT_FILES = ("results.csv", "forward.csv", "host_cost.csv", "sustain.csv", "e2e.csv")


def _fail(msg: str) -> None:
    print(f"tools/evidence.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def run_id(run: Path, info: dict) -> str:
    data = next((run / f for f in RESULT_FILES if (run / f).is_file()), None)
    if data is None:
        _fail(f"{run} holds none of {', '.join(RESULT_FILES)}; pass a results folder the harness wrote")
    digest = hashlib.sha256(data.read_bytes()).hexdigest()[:6]
    started = str(info.get("started", "")).replace("-", "").replace(":", "")[:13] or "undated"
    return f"{info.get('profile', 'gpu')}-{info.get('kind', 'sweep')}-{started}-{digest}"


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {"runs": {}}


def add(run: Path, backs: str, note: str) -> str:
    if not (run / "run.json").is_file():
        _fail(f"{run}/run.json not found; pass a results folder the harness wrote")
    info = json.loads((run / "run.json").read_text())
    rid = run_id(run, info)
    dest = EVIDENCE / rid
    if dest.exists():
        _fail(f"{dest} exists already; this run is filed")
    shutil.copytree(run, dest)
    manifest = load_manifest()
    fp = info.get("fingerprint") or {}
    manifest["runs"][rid] = {"command": info.get("command"), "harness_sha": fp.get("harness_sha"),
                             "gpu": fp.get("gpu_name"), "started": info.get("started"), "backs": backs,
                             **({"note": note} if note else {})}
    EVIDENCE.mkdir(exist_ok=True)
    tmp = MANIFEST.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(MANIFEST)
    return rid


def main() -> int:
    p = argparse.ArgumentParser(prog="tools/evidence.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("run")
    a.add_argument("--backs", required=True)
    a.add_argument("--note", default="")
    sub.add_parser("list")
    args = p.parse_args()
    if args.cmd == "add":
        print(add(Path(args.run), args.backs, args.note))
    else:
        for rid, r in sorted(load_manifest()["runs"].items()):
            print(f"{rid}  {r['backs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
