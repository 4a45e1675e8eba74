"""calibrate table: its legs, the manifest, resume, the verdict and --install (legs faked: no GPU here)."""
import json

import pytest

from calibrate.table_pipeline import MANIFEST, install, legs, plan_text, run_pipeline
from dispatch.profiles import get_profile
from harness.errors import HarnessError

H200 = get_profile("h200")


def test_the_legs_and_their_order(tmp_path):
    names = [leg.name for leg in legs(H200, tmp_path)]
    assert names == ["sweep", "forward", "fit", "check-sweep", "check-forward", "validate", "baseline", "report"]
    text = plan_text(get_profile("gb200"), tmp_path)
    assert "--gpu gb200" in text and "flashinfer-lean:cute-dsl" in text and text.count("  leg ") == 8
    check = next(leg for leg in legs(H200, tmp_path) if leg.name == "check-sweep")
    assert "3000" in check.argv[check.argv.index("--m") + 1]  # M the fit never saw


def test_a_failed_leg_stops_and_resume_runs_only_what_is_left(tmp_path):
    ran, tries = [], []

    def flaky(leg, log):
        ran.append(leg.name)
        log.write_text("output\n")
        if leg.name == "check-sweep":
            tries.append(1)
            return 3 if len(tries) == 1 else 0
        return 0
    run = tmp_path / "run"
    with pytest.raises(HarnessError, match="leg check-sweep failed"):
        run_pipeline(H200, run, resume=False, execute=flaky)
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["legs"]["fit"]["status"] == "done" and manifest["legs"]["check-sweep"]["status"].startswith("failed")
    with pytest.raises(HarnessError, match="exists; pass --resume"):
        run_pipeline(H200, run, resume=False, execute=flaky)
    ran.clear()
    done = run_pipeline(H200, run, resume=True, execute=flaky)
    assert ran == ["check-sweep", "check-forward", "validate", "baseline", "report"]
    assert done["status"] == "complete" and done["verdict"] == "PASS"


def test_a_failing_check_is_a_verdict_and_blocks_install(tmp_path):
    run = tmp_path / "run"
    done = run_pipeline(H200, run, resume=False, execute=lambda leg, log: 1 if leg.name == "validate" else 0)
    assert done["status"] == "complete" and done["verdict"] == "FAIL"
    with pytest.raises(HarnessError, match="verdict 'FAIL'"):
        install(H200, run)


def test_install_writes_the_shipped_files_of_a_passing_run(tmp_path, monkeypatch):
    import calibrate.baseline as baseline
    import dispatch.table as table
    monkeypatch.setattr(table, "TABLE_DIR", tmp_path / "thresholds")
    monkeypatch.setattr(baseline, "BASELINE_DIR", tmp_path / "baselines")
    (tmp_path / "thresholds").mkdir()
    (tmp_path / "baselines").mkdir()
    run = tmp_path / "run"
    run_pipeline(H200, run, resume=False, execute=lambda leg, log: 0)
    (run / "table.json").write_text(json.dumps({"format": 2, "profile": "h200", "source": {}}))
    (run / "baseline.json").write_text("{}")
    written = install(H200, run)
    assert tmp_path / "thresholds" / "h200.json" in written
    shipped = json.loads((tmp_path / "thresholds" / "h200.json").read_text())
    assert shipped["source"]["manifest"].endswith(MANIFEST)


def test_stop_after_a_leg_and_resume_the_rest_elsewhere(tmp_path):
    """--stop-after forward: sweep and forward run, the manifest says so; a resume (another machine) runs the rest
    and the manifest lists both machines. The fitted sweep leaves the dispatcher out; the check runs the new table."""
    run, ran = tmp_path / "run", []

    def execute(leg, log):
        ran.append(leg.name)
        return 0
    first = run_pipeline(H200, run, resume=False, execute=execute, stop_after="forward")
    assert ran == ["sweep", "forward"] and first["status"] == "stopped after forward"
    done = run_pipeline(H200, run, resume=True, execute=execute)
    assert ran[2:] == ["fit", "check-sweep", "check-forward", "validate", "baseline", "report"]
    assert done["status"] == "complete" and len(done["machines"]) == 2
    with pytest.raises(HarnessError, match="no leg"):
        run_pipeline(H200, tmp_path / "other", resume=False, execute=execute, stop_after="lunch")
    by_name = {leg.name: leg.argv for leg in legs(H200, run)}
    assert "dispatch" not in by_name["sweep"][by_name["sweep"].index("--paths") + 1].split(",")
    assert by_name["check-sweep"][by_name["check-sweep"].index("--table") + 1] == str(run / "table.json")
