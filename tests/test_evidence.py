"""The evidence store, read again: one test per figure the manifest records (its reader gives the recorded value
within the recorded tolerance), every filed run readable by the harness's own readers, folders and manifest in step,
and each results page what the manifest writes. Marked `evidence` (make evidence): it reads every filed run."""
import json

import pytest

from bench.results import load_results
from calibrate.hostcost import load_host_cost
from dispatch.table import load_table
from evidence_store.page import page
from evidence_store.store import EVIDENCE, ROOT, check_run, load_manifest
from evidence_store.figures import agrees, read

pytestmark = pytest.mark.evidence
RUNS = load_manifest()["runs"]
FIGURES = [(rid, spec) for rid, entry in sorted(RUNS.items()) for spec in entry.get("figures", [])]
PROFILES = sorted({(e.get("page") or {}).get("profile") for e in RUNS.values()} - {None})


@pytest.mark.parametrize("rid, spec", FIGURES, ids=[f"{rid}: {spec['label']}" for rid, spec in FIGURES])
def test_each_recorded_figure_reads_the_same_from_its_run(rid, spec):
    value = read(EVIDENCE / rid, spec)
    assert agrees(value, spec["value"], spec.get("tolerance", 0)), (value, spec["value"])


def test_the_store_and_its_manifest_hold_the_same_runs():
    folders = {p.name for p in EVIDENCE.iterdir() if p.is_dir()}
    assert folders == set(RUNS), (sorted(folders - set(RUNS)), sorted(set(RUNS) - folders))
    for rid, entry in RUNS.items():
        assert entry.get("backs", "").strip(), f"{rid} says nothing of what it backs"


@pytest.mark.parametrize("rid", sorted(RUNS))
def test_each_filed_run_passes_the_readers_its_commands_use(rid):
    run = EVIDENCE / rid
    if (run / "manifest.json").is_file():  # a table run: its legs' runs
        legs = json.loads((run / "manifest.json").read_text())["legs"]
        for name in ("sweep", "check-sweep", "check-forward"):
            if legs.get(name, {}).get("status") == "done":
                check_run(run / name)
    elif (run / "run.json").is_file():
        check_run(run, partial="partial" in RUNS[rid])
    elif (run / "host_cost.csv").is_file():
        load_host_cost(run / "host_cost.csv")
    elif (run / "table.json").is_file():  # a fitted table kept on its own
        load_table(path=run / "table.json")
    else:  # a folder of runs
        runs = sorted(p.parent for p in run.glob("*/run.json"))
        assert runs, f"{rid} holds no run.json, no table and no runs"
        for sub in runs:
            load_results(sub)


@pytest.mark.parametrize("profile", PROFILES)
def test_each_results_page_is_what_the_manifest_writes(profile):
    assert (ROOT / "docs" / f"results-{profile}.md").read_text() == page(profile) + "\n", \
        f"run python -m evidence_store page {profile}"
