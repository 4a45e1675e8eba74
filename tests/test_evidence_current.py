"""tools/evidence.py current: the evidence folder behind a shipped table, found by its manifest's hash, which the
Makefile's report defaults name."""
import hashlib
import json

import pytest

from harness.errors import HarnessError


def test_current_finds_the_table_run_by_its_manifest_hash(tmp_path, monkeypatch):
    import tools.evidence as ev
    (tmp_path / "dispatch" / "thresholds").mkdir(parents=True)
    run = tmp_path / "evidence" / "some-table-run"
    (run / "check-sweep").mkdir(parents=True)
    (run / "manifest.json").write_text('{"legs": {}}\n')
    (tmp_path / "evidence" / "other").mkdir()
    (tmp_path / "evidence" / "other" / "manifest.json").write_text('{"legs": {"x": 1}}\n')
    digest = hashlib.sha256((run / "manifest.json").read_bytes()).hexdigest()
    table = {"source": {"manifest": {"file": "results/h200/x/manifest.json", "sha256": digest}}}
    (tmp_path / "dispatch" / "thresholds" / "h200.json").write_text(json.dumps(table))
    monkeypatch.setattr(ev, "ROOT", tmp_path)
    monkeypatch.setattr(ev, "EVIDENCE", tmp_path / "evidence")
    assert ev.current("h200") == run and ev.current("h200", "check-sweep") == run / "check-sweep"
    with pytest.raises(HarnessError, match="holds no check-forward"):
        ev.current("h200", "check-forward")
    (run / "manifest.json").write_text('{"legs": {"changed": 1}}\n')
    with pytest.raises(HarnessError, match="no table run with the manifest"):
        ev.current("h200")
    (tmp_path / "dispatch" / "thresholds" / "h200.json").write_text(json.dumps({"source": {}}))
    with pytest.raises(HarnessError, match="names no table run"):
        ev.current("h200")


def test_the_shipped_h200_table_names_a_run_that_evidence_holds():
    from tools.evidence import current
    assert (current("h200", "check-sweep") / "run.json").is_file()
    assert (current("h200", "check-forward") / "forward.csv").is_file()


def test_restore_copies_a_filed_run_back_with_its_results_decompressed(tmp_path):
    import lzma

    from tools.evidence import load_manifest, restore
    rid = "h200-table-h200-gemv-A"
    assert rid in load_manifest()["runs"]
    out = restore(rid, tmp_path / "results" / "h200" / "h200-gemv-A")
    assert (out / "manifest.json").is_file() and (out / "table.json").is_file()
    packed = sorted(p.relative_to(tmp_path / "results" / "h200" / "h200-gemv-A")
                    for p in out.rglob("results.csv"))
    assert packed and not list(out.rglob("*.xz"))
    from tools.evidence import EVIDENCE
    assert (out / "sweep" / "results.csv").read_bytes() == lzma.decompress(
        (EVIDENCE / rid / "sweep" / "results.csv.xz").read_bytes())
    with pytest.raises(HarnessError, match="exists"):
        restore(rid, out)
    with pytest.raises(HarnessError, match="not a filed run"):
        restore("no-such-run", tmp_path / "x")
