"""python -m evidence_store, the store of measured runs: `current` finds the folder behind a shipped table by its
manifest's hash (what the Makefile's report defaults name); `figure` and `page` record and read back its figures."""
import hashlib
import re
import json
import shutil
from pathlib import Path

import pytest

from harness.errors import HarnessError, run_cli


def test_current_finds_the_table_run_by_its_manifest_hash(tmp_path, monkeypatch):
    import evidence_store.store as ev
    (tmp_path / "dispatch" / "thresholds").mkdir(parents=True)
    run = tmp_path / "evidence" / "some-table-run"
    (run / "check-sweep").mkdir(parents=True)
    (run / "manifest.json").write_text('{"legs": {}}\n')
    (tmp_path / "evidence" / "other").mkdir()
    (tmp_path / "evidence" / "other" / "manifest.json").write_text('{"legs": {"x": 1}}\n')
    digest = hashlib.sha256((run / "manifest.json").read_bytes()).hexdigest()
    table = {"source": {"manifest": {"file": "results/h200/x/manifest.json", "sha256": digest}}}
    (tmp_path / "dispatch" / "thresholds" / "h200.json").write_text(json.dumps(table))
    import harness.shipped as shipped
    monkeypatch.setattr(shipped, "PACKAGES", tmp_path)
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
    from evidence_store.store import current
    assert (current("h200", "check-sweep") / "run.json").is_file()
    assert (current("h200", "check-forward") / "forward.csv").is_file()


def test_restore_copies_a_filed_run_back_with_its_results_decompressed(tmp_path):
    import lzma

    from evidence_store.store import load_manifest, restore
    rid = "h200-table-h200-gemv-A"
    assert rid in load_manifest()["runs"]
    out = restore(rid, tmp_path / "results" / "h200" / "h200-gemv-A")
    assert (out / "manifest.json").is_file() and (out / "table.json").is_file()
    packed = sorted(p.relative_to(tmp_path / "results" / "h200" / "h200-gemv-A")
                    for p in out.rglob("results.csv"))
    assert packed and not list(out.rglob("*.xz"))
    from evidence_store.store import EVIDENCE
    assert (out / "sweep" / "results.csv").read_bytes() == lzma.decompress(
        (EVIDENCE / rid / "sweep" / "results.csv.xz").read_bytes())
    with pytest.raises(HarnessError, match="exists"):
        restore(rid, out)
    with pytest.raises(HarnessError, match="not a filed run"):
        restore("no-such-run", tmp_path / "x")


def _store(tmp_path, monkeypatch):
    """A store of one filed run (a host-cost table of two shapes) with python -m evidence_store pointed at it."""
    import types

    import evidence_store.__main__ as cli
    import evidence_store.page as pages
    import evidence_store.store as store
    run = tmp_path / "evidence" / "h200-host-cost-x"
    run.mkdir(parents=True)
    (run / "host_cost.csv").write_text("part,n,k,m,path,host_us,f_linear_host_us,ratio\n"
                                       "low,64,2048,8,triton:gemv,30.0,20.0,1.5\n"
                                       "low,2048,4096,8,triton:gemv,40.0,20.0,2.0\n")
    (tmp_path / "evidence" / "manifest.json").write_text(json.dumps(
        {"format": 1, "runs": {run.name: {"backs": "a test", "command": "python -m calibrate host-cost"}}}))
    (tmp_path / "docs").mkdir()
    for name, value in (("ROOT", tmp_path), ("EVIDENCE", tmp_path / "evidence"),
                        ("MANIFEST", tmp_path / "evidence" / "manifest.json")):
        monkeypatch.setattr(store, name, value)
    ev = types.SimpleNamespace(section=pages.section, figure=pages.figure, page=pages.page, main=cli.main,
                               EVIDENCE=store.EVIDENCE, MANIFEST=store.MANIFEST)
    return ev, run


def test_a_figure_is_the_readers_value_and_the_page_reads_it_again(tmp_path, monkeypatch):
    ev, run = _store(tmp_path, monkeypatch)
    ev.section(run.name, "h200", "Host time", 1, "One paragraph.")
    assert ev.figure(run.name, "GEMV median", "host_cost", {"m": 8, "path": "triton:gemv", "stat": "median"}, 0) == 1.75
    assert ev.figure(run.name, "GEMV most", "host_cost", {"m": 8, "path": "triton:gemv", "stat": "max"}, 0) == 2.0
    text = ev.page("h200")
    assert "## Host time" in text and "| GEMV median | 1.75 |" in text and "| GEMV most | 2 |" in text
    assert ev.main(["page", "h200"]) == 0 and ev.main(["page", "h200", "--check"]) == 0
    # the run changes under its recorded figure: the page refuses, and --check says the page is stale
    (run / "host_cost.csv").write_text((run / "host_cost.csv").read_text().replace(",2.0\n", ",2.5\n"))
    with pytest.raises(HarnessError, match="'GEMV median' reads 2.0 now, recorded 1.75"):
        ev.page("h200")
    with pytest.raises(HarnessError, match="no reader 'guess'"):
        ev.figure(run.name, "x", "guess", {}, 0)
    with pytest.raises(HarnessError, match="not a filed run"):
        ev.figure("nothing", "x", "host_cost", {}, 0)


def test_readings_agree_within_the_recorded_tolerance_element_by_element():
    from evidence_store.figures import agrees
    assert agrees([1.0, 2.0], [1.0, 2.004], 0.005) and not agrees([1.0, 2.0], [1.0, 2.01], 0.005)
    assert not agrees([1.0], [1.0, 2.0], 1) and agrees("PASS", "PASS", 0) and not agrees("FAIL", "PASS", 0)


def test_a_figure_with_arguments_its_reader_does_not_take_is_one_line(tmp_path, monkeypatch, capsys):
    ev, run = _store(tmp_path, monkeypatch)
    before = (tmp_path / "evidence" / "manifest.json").read_text()
    assert run_cli(ev.main, "python -m evidence_store", ["figure", run.name, "--label", "x", "--of", "host_cost",
                                                  "--args", '{"m": 8, "colour": "red"}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m evidence_store: error: figure 'x': host_cost(")
    assert (tmp_path / "evidence" / "manifest.json").read_text() == before


def test_add_from_the_command_line_files_a_run_and_refuses_it_twice(tmp_path, monkeypatch, capsys):
    ev, _ = _store(tmp_path, monkeypatch)
    run = tmp_path / "limit-run"
    shutil.copytree(Path(__file__).parent / "data" / "h200-lean-fit", run)
    assert ev.main(["add", str(run), "--backs", "a test of add"]) == 0
    rid = capsys.readouterr().out.strip()
    import lzma
    assert not (ev.EVIDENCE / rid / "results.csv").exists()  # filed xz-packed, as restore and the readers expect
    assert lzma.decompress((ev.EVIDENCE / rid / "results.csv.xz").read_bytes()) == (run / "results.csv").read_bytes()
    assert json.loads(ev.MANIFEST.read_text())["runs"][rid]["backs"] == "a test of add"
    with pytest.raises(HarnessError, match="filed already|exists already"):
        ev.main(["add", str(run), "--backs", "again"])


def test_a_table_run_is_filed_by_its_manifest_and_an_unfinished_one_is_refused(tmp_path, monkeypatch, capsys):
    ev, _ = _store(tmp_path, monkeypatch)
    run = tmp_path / "table-run"
    shutil.copytree(Path(__file__).parent / "data" / "h200-table-run-manifest", run)
    shutil.copytree(Path(__file__).parent / "data" / "h200-lean-fit", run / "sweep")  # a leg's results, read
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "status": "waiting before check-sweep"}))
    with pytest.raises(HarnessError, match="not a complete table run"):
        ev.main(["add", str(run), "--backs", "a table run"])
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert ev.main(["add", str(run), "--backs", "a table run"]) == 0
    rid = capsys.readouterr().out.strip()
    entry = json.loads(ev.MANIFEST.read_text())["runs"][rid]
    assert rid.startswith("h200-table-") and "python -m tables --gpu h200" in entry["command"]
    assert (ev.EVIDENCE / rid / "sweep" / "results.csv.xz").is_file()


@pytest.mark.parametrize("field, value, needle", [
    ("started", "../../../../x", "started '../../../../x' is not a time"),
    ("started", 20261203, "is not a time"),
    ("profile", "../h200", "not one of"),
    ("kind", "a/b", "not a short lower-case word"),
])
def test_an_id_is_never_made_from_unchecked_fields(field, value, needle, tmp_path, monkeypatch):
    ev, _ = _store(tmp_path, monkeypatch)
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "h200-lean-fit", run)
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, field: value}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(HarnessError, match=re.escape(needle)):
        ev.main(["add", str(run), "--backs", "x"])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_an_interrupted_run_is_filed_only_with_partial_and_says_so(tmp_path, monkeypatch, capsys):
    ev, _ = _store(tmp_path, monkeypatch)
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "h200-lean-fit", run)
    lines = (run / "results.csv").read_text().splitlines(keepends=True)
    (run / "results.csv").write_text("".join(lines[:len(lines) // 2]))  # the cells it measured before it stopped
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "status": "interrupted"}))
    with pytest.raises(HarnessError, match="not a complete run"):
        ev.main(["add", str(run), "--backs", "x"])
    assert ev.main(["add", str(run), "--backs", "x", "--partial"]) == 0
    rid = capsys.readouterr().out.strip()
    assert "interrupted" in json.loads(ev.MANIFEST.read_text())["runs"][rid]["partial"]


def test_a_leg_of_a_filed_table_run_is_not_filed_again(tmp_path, monkeypatch, capsys):
    import lzma
    ev, _ = _store(tmp_path, monkeypatch)
    filed = ev.EVIDENCE / "h200-table-20261203T1101-abcdef" / "sweep"
    filed.mkdir(parents=True)
    leg = Path(__file__).parent / "data" / "h200-lean-fit"
    (filed / "results.csv.xz").write_bytes(lzma.compress((leg / "results.csv").read_bytes()))
    with pytest.raises(HarnessError, match="evidence/h200-table-20261203T1101-abcdef"):
        ev.main(["add", str(leg), "--backs", "x"])


@pytest.mark.parametrize("argv, needle", [
    (["section", "ID", "--profile", "h999", "--title", "t", "--order", "1", "--text", "x"], "invalid choice: 'h999'"),
    (["figure", "ID", "--label", "x", "--of", "host_cost", "--tolerance", "nan"], "outside"),
    (["figure", "ID", "--label", "x", "--of", "host_cost", "--tolerance", "-1"], "outside"),
    (["figure", "ID", "--label", "x", "--of", "host_cost", "--args", "[1]"], "not a JSON object"),
    (["page", "h999"], "invalid choice"),
    (["add", "RUN", "--backs", ""], "--backs is empty"),
])
def test_the_stores_options_are_checked_before_anything_is_read(argv, needle, tmp_path, monkeypatch, capsys):
    ev, run = _store(tmp_path, monkeypatch)
    before = ev.MANIFEST.read_text()
    assert run_cli(ev.main, "python -m evidence_store", [a.replace("ID", run.name) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert ev.MANIFEST.read_text() == before


def test_a_signal_while_the_store_imports_is_one_line(tmp_path):
    """SIGTERM sent from inside the store's first heavy import (pandas, by way of the profiles and readers)."""
    import signal
    import subprocess
    import sys
    code = ("import builtins, os, signal, runpy, sys\n"
            "real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'dispatch.profiles':\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "sys.argv = ['evidence_store', 'list']\n"
            "runpy.run_module('evidence_store', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 128 + signal.SIGTERM
    assert done.stderr.strip() == "evidence_store: interrupted"


def _table_run(folder: Path, refits: int, seconds: float) -> Path:
    """A complete table run's manifest (no legs measured), `refits` refits since it started."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({
        "format": 1, "profile": "h200", "started": "2026-12-01T00:00:00+00:00", "status": "complete",
        "verdict": "PASS", "legs": {"validate": {"command": "x", "seconds": seconds, "status": "done"}},
        "refits": [{"folder": f"refit-{i + 1}", "legs": {}} for i in range(refits)]}))
    return folder


def test_a_later_state_of_a_filed_table_run_replaces_it_with_its_figures_read_again(tmp_path, monkeypatch):
    """add --replaces: the same table run refitted or judged again takes the filed one's place (its folder and
    entry), its page section and figures carried over and read again, a changed reading said; a run that is not a
    later state of it, or a filing without --replaces, is refused and nothing is written."""
    ev, _ = _store(tmp_path, monkeypatch)
    import evidence_store.store as store
    first, changed = store.add(_table_run(tmp_path / "results" / "a", 0, 10.0), "the first state", "")
    assert changed == []
    ev.section(first, "h200", "The table", 1, "Text.")
    ev.figure(first, "validate seconds", "leg", {"name": "validate"}, 0)
    later = _table_run(tmp_path / "results" / "b", 1, 12.5)
    with pytest.raises(HarnessError, match=f"a later state of that table run replaces it with --replaces {first}"):
        store.add(later, "the refit", "")
    before = ev.MANIFEST.read_text()
    other = _table_run(tmp_path / "results" / "c", 0, 11.0)
    with pytest.raises(HarnessError, match="is not a later state of that table run"):
        store.add(other, "not a refit", "", replaces=first)
    assert ev.MANIFEST.read_text() == before and (ev.EVIDENCE / first).is_dir()
    rid, changed = store.add(later, "the refit", "", replaces=first)
    runs = json.loads(ev.MANIFEST.read_text())["runs"]
    assert first not in runs and not (ev.EVIDENCE / first).exists() and (ev.EVIDENCE / rid).is_dir()
    assert changed == ["validate seconds: 10.0 -> 12.5"] and runs[rid]["figures"][0]["value"] == 12.5
    assert runs[rid]["page"]["title"] == "The table" and "| validate seconds | 12.5 |" in ev.page("h200")
    assert not [p for p in ev.EVIDENCE.iterdir() if p.name.startswith(".add-")]


def test_a_later_state_with_the_same_manifest_replaces_the_filed_run_under_its_id(tmp_path, monkeypatch):
    """A leg's output made again by hand (the manifest, and so the id, unchanged) files over the run it is, with
    --replaces naming that id: the folder is the new one, the entry keeps its page section and figures; without
    --replaces it is refused as filed already."""
    ev, _ = _store(tmp_path, monkeypatch)
    import evidence_store.store as store
    run = _table_run(tmp_path / "results" / "a", 1, 10.0)
    (run / "baseline.log").write_text("first\n")
    rid, _ = store.add(run, "the run", "")
    ev.section(rid, "h200", "The table", 1, "Text.")
    ev.figure(rid, "validate seconds", "leg", {"name": "validate"}, 0)
    (run / "baseline.log").write_text("again\n")
    with pytest.raises(HarnessError, match="exists already; this run is filed"):
        store.add(run, "the run", "")
    again, changed = store.add(run, "the run, its baseline leg again", "", replaces=rid)
    runs = json.loads(ev.MANIFEST.read_text())["runs"]
    assert again == rid and changed == [] and (ev.EVIDENCE / rid / "baseline.log").read_text() == "again\n"
    assert runs[rid]["backs"] == "the run, its baseline leg again" and runs[rid]["page"]["title"] == "The table"
    assert runs[rid]["figures"][0]["value"] == 10.0
    assert not [p for p in ev.EVIDENCE.iterdir() if p.name.startswith(".add-")]
