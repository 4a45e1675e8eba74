"""The results page of a profile: `section` puts a filed run on it, `figure` records one figure of a run (read by a
reader of evidence_store/figures.py: the value is the reader's, never typed), `page` writes docs/results-<profile>.md
from the manifest with every figure read again from its run."""
from __future__ import annotations

from pathlib import Path

from evidence_store import store
from evidence_store.figures import agrees, read, shown
from harness.errors import HarnessError


def page_file(profile: str) -> Path:
    return store.ROOT / "docs" / f"results-{profile}.md"


def section(rid: str, profile: str, title: str, order: int, text: str) -> None:
    manifest, e = store.entry(rid)
    e["page"] = {"profile": profile, "title": title, "order": order, "text": text}
    store.save(manifest)


def figure(rid: str, label: str, of: str, args: dict, tolerance: float) -> object:
    """Reads one figure from the run and records it, with its reader, beside the run's entry."""
    manifest, e = store.entry(rid)
    spec = {"label": label, "of": of, "args": args, "tolerance": tolerance}
    spec["value"] = read(store.EVIDENCE / rid, spec)
    e["figures"] = [f for f in e.get("figures", []) if f["label"] != label] + [spec]
    store.save(manifest)
    return spec["value"]


def page(profile: str) -> str:
    """docs/results-<profile>.md: each run on the page, in order, with its command and every figure read again."""
    runs = [(rid, e) for rid, e in store.load_manifest()["runs"].items() if (e.get("page") or {}).get("profile") == profile]
    if not runs:
        raise HarnessError(f"no filed run is on the {profile} page; put one there with `python -m evidence_store "
                           f"section`")
    lines = [f"# Results on the {profile.upper()}", "",
             f"Written by `python -m evidence_store page {profile}` from `evidence/manifest.json`; do not edit. Each "
             "figure is read again from the run it names (`evidence/<id>/`) by the reader in "
             "`evidence_store/figures.py` that recorded it; `pytest -m evidence` checks that every reading still "
             "agrees with the recorded one.", ""]
    for rid, e in sorted(runs, key=lambda r: (r[1]["page"]["order"], r[0])):
        lines += [f"## {e['page']['title']}", "", e["page"]["text"], "",
                  f"Run `{rid}` (harness {e.get('harness_sha')}, {e.get('gpu')}, started {e.get('started') or 'undated'}).",
                  f"Command: `{e.get('command')}`", ""]
        if e.get("figures"):
            lines += ["| figure | value | read by |", "|---|---|---|"]
        for spec in e.get("figures", []):
            value = read(store.EVIDENCE / rid, spec)
            if not agrees(value, spec["value"], spec.get("tolerance", 0)):
                raise HarnessError(f"evidence/{rid}: {spec['label']!r} reads {value!r} now, recorded "
                                   f"{spec['value']!r}; record it again (python -m evidence_store figure) if the "
                                   f"method changed, else find out why")
            args = ", ".join(f"{k}={v}" for k, v in spec.get("args", {}).items())
            lines.append(f"| {spec['label']} | {shown(value)} | `{spec['of']}({args})` |")
        lines.append("")
    return "\n".join(lines)
