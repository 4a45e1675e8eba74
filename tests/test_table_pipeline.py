"""python -m tables: its legs, the manifest, resume, the verdict and --install (legs faked: no GPU here)."""
import json
import shutil

import pytest

from tables.install import fewer_baseline_runs, install as install_run
from tables.legs import legs as legs_of
from tables.manifest import MANIFEST, TableRun
from tables.pipeline import plan_text as plan_of, run_pipeline as pipeline_of
from dispatch.profiles import get_profile
from harness.errors import HarnessError
from harness.io import ROOT

H200 = get_profile("h200")
LEGS = ["sweep", "forward", "first-fit", "refine", "machine-2", "machine-3", "fit", "check-sweep", "check-forward",
        "noise", "forward-noise", "validate", "baseline", "report"]


def legs(profile, folder, scope=None, machines=None):
    return legs_of(TableRun(profile, folder), scope, machines)


def run_pipeline(profile, folder, resume, **kw):
    return pipeline_of(TableRun(profile, folder), resume, **kw)


def install(profile, folder):
    return install_run(TableRun(profile, folder))


def plan_text(profile, folder):
    return plan_of(TableRun(profile, folder))


def machines(*uuids):
    """A fake GPU identity per call of run_pipeline: the machine each part of a run runs on."""
    it = iter(uuids)
    return lambda: next(it)


def test_the_legs_and_their_order(tmp_path):
    names = [leg.name for leg in legs(H200, tmp_path)]
    assert names == LEGS
    text = plan_text(get_profile("gb200"), tmp_path)
    assert "--gpu gb200" in text and "flashinfer-lean:cute-dsl" in text and text.count("  leg ") == len(LEGS)
    by_name = {leg.name: leg.argv for leg in legs(H200, tmp_path)}
    check = by_name["check-sweep"]
    assert "3000" in check[check.index("--m") + 1]  # M the fit never saw
    table_tactics = str(tmp_path / "table.autotune.json")  # the check serves the table's tactics, as dispatch does
    assert table_tactics in by_name["check-sweep"] and table_tactics in by_name["check-forward"]
    paths = {name: set(by_name[name][by_name[name].index("--paths") + 1].split(",")) for name in ("forward",
                                                                                                 "check-forward")}
    assert paths["forward"] < paths["check-forward"]  # the check can confirm the fit forward's vetoes
    # and measures the GEMV's PDL choices: the dispatcher beside its choices with every GEMV call launched plainly
    assert {"dispatch", "table-plain"} <= paths["check-forward"]
    assert str(tmp_path / "refine") in by_name["fit"]  # the refine cells are fitted with the sweep
    fit = by_name["fit"]  # and every other fitting machine's sweep, each serving the first sweep's tactics
    assert fit[fit.index("--machine") + 1:fit.index("--machine") + 3] == [str(tmp_path / "machine-2"),
                                                                         str(tmp_path / "machine-3")]
    assert "--tune" in by_name["sweep"]  # the first sweep tunes; every later GPU leg serves a tactics file
    fitted = by_name["sweep"][by_name["sweep"].index("--paths") + 1].split(",")
    assert "flashinfer-lean:tinygemm" in fitted and "flashinfer:cudnn" not in fitted  # no lean call: unchoosable
    cpu = ("sweep", "first-fit", "fit", "noise", "forward-noise", "validate", "baseline", "report")
    assert all("--autotune-cache" in argv for name, argv in by_name.items() if name not in cpu)
    # the check is judged with the run's own floors: every sweep of the grid, both forwards
    noise, fnoise = by_name["noise"], by_name["forward-noise"]
    assert noise[noise.index("noise") + 1:noise.index("--gpu")] == [str(tmp_path / x) for x in (
        "sweep", "machine-2", "machine-3", "check-sweep")]
    assert fnoise[fnoise.index("forward-noise") + 1:fnoise.index("--gpu")] == [str(tmp_path / "forward"),
                                                                              str(tmp_path / "check-forward")]
    judged = by_name["validate"]
    assert judged[judged.index("--noise") + 1] == str(tmp_path / "noise.json")
    assert judged[judged.index("--forward-floor") + 1] == str(tmp_path / "forward-noise.json")
    page = by_name["report"]  # the page judges the check as validate does
    assert page[page.index("--noise"):page.index("--noise") + 4] == judged[judged.index("--noise"):][:4]
    other = by_name["machine-2"]
    assert other[other.index("--autotune-cache") + 1] == str(tmp_path / "sweep" / "autotune-cache.json")
    assert other[other.index("--paths") + 1] == "aten,flashinfer-lean:tinygemm,flashinfer-lean:cublaslt,triton:gemv"
    one = [leg.name for leg in legs(H200, tmp_path, machines=1)]
    assert one == [x for x in LEGS if not x.startswith("machine-")]
    assert "--machine" not in next(leg for leg in legs(H200, tmp_path, machines=1) if leg.name == "fit").argv
    forward = by_name["check-forward"]
    checked = forward[forward.index("--paths") + 1].split(",")
    assert {"aten", "dispatch", "vllm-default", "vllm-flag", "seed-pr", "vllm-op:tinygemm"} <= set(checked)


def test_no_gap_to_refine_skips_the_refine_leg(tmp_path):
    run, ran = tmp_path / "run", []

    def execute(leg, log):
        ran.append(leg.name)
        if leg.name == "first-fit":
            (run / "refine-cells.txt").write_text("\n")  # the first fit changes its choice in no gap
        return 0
    done = run_pipeline(H200, run, resume=False, execute=execute, machine=machines("A"), same_machine=True)
    assert "refine" not in ran and done["legs"]["refine"]["skipped"]
    fit = next(leg for leg in legs(H200, run) if leg.name == "fit")
    assert "--add" not in fit.argv and done["out_of_machine"] is False


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
        run_pipeline(H200, run, resume=False, execute=flaky, same_machine=True)
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["legs"]["fit"]["status"] == "done" and manifest["legs"]["check-sweep"]["status"].startswith("failed")
    with pytest.raises(HarnessError, match="exists; pass --resume"):
        run_pipeline(H200, run, resume=False, execute=flaky)
    ran.clear()
    done = run_pipeline(H200, run, resume=True, execute=flaky, same_machine=True)
    assert ran == ["check-sweep", "check-forward", "noise", "forward-noise", "validate", "baseline", "report"]
    assert done["status"] == "complete" and done["verdict"] == "PASS"
    before = (run / MANIFEST).read_bytes()  # a resume with nothing left leaves the manifest as it is
    assert run_pipeline(H200, run, resume=True, execute=flaky)["verdict"] == "PASS" and (run / MANIFEST).read_bytes() == before


def test_a_measurement_cut_off_mid_leg_continues_with_resume(tmp_path):
    """A leg killed mid-measurement (a timeout: no manifest entry, a partial forward table in its folder) continues
    with bench's --resume, keeping its finished rows; a leg whose folder holds no rows starts afresh."""
    run, argv = tmp_path / "run", {}

    def execute(leg, log):
        argv[leg.name] = leg.argv
        if leg.name == "check-forward" and "--resume" not in leg.argv:
            (run / "check-forward").mkdir()
            (run / "check-forward" / "forward.csv").write_text("model,m\n")
            raise KeyboardInterrupt  # the pipeline killed before the leg ends
        return 0
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(H200, run, resume=False, execute=execute, same_machine=True)
    assert "--resume" not in argv["check-sweep"] and "check-forward" not in json.loads(
        (run / MANIFEST).read_text())["legs"]
    done = run_pipeline(H200, run, resume=True, execute=execute, same_machine=True)
    assert argv["check-forward"][-1] == "--resume" and done["status"] == "complete"
    assert "--resume" not in done["legs"]["validate"]["command"]


def test_a_failing_check_is_a_verdict_and_blocks_install(tmp_path):
    run = tmp_path / "run"
    done = run_pipeline(H200, run, resume=False, execute=lambda leg, log: 1 if leg.name == "validate" else 0,
                        same_machine=True)
    assert done["status"] == "complete" and done["verdict"] == "FAIL"
    with pytest.raises(HarnessError, match="verdict 'FAIL'"):
        install(H200, run)


def _passing_run(tmp_path, monkeypatch):
    """A passing run whose table, baseline and tactics are the shipped ones, and the shipped folders in tmp_path."""
    import harness.shipped as shipped
    from evidence_store.store import current
    checks = {leg: current("h200", leg) for leg in ("check-sweep", "check-forward")}  # before the site moves
    monkeypatch.setattr(shipped, "PACKAGES", tmp_path / "site")
    for folder in shipped.shipped_dirs():
        folder.mkdir(parents=True)
    run = tmp_path / "run"
    run_pipeline(H200, run, resume=False, execute=lambda leg, log: 0, same_machine=True)
    shipped_table = json.loads((ROOT / "dispatch/thresholds/h200.json").read_text())
    shipped_table["source"]["tactics"]["file"] = "table.autotune.json"
    shipped_table["source"]["gemv_configs"]["file"] = "table.autotune.gemv.json"
    (run / "table.json").write_text(json.dumps(shipped_table))
    for kept, copy in (("dispatch/thresholds/h200.autotune.json", "table.autotune.json"),
                          ("dispatch/thresholds/h200.autotune.gemv.json", "table.autotune.gemv.json"),
                          ("calibrate/baselines/h200.json", "baseline.json"),
                          ("calibrate/baselines/h200.autotune.json", "baseline.autotune.json"),
                          ("calibrate/baselines/h200.autotune.gemv.json", "baseline.autotune.gemv.json")):
        shutil.copyfile(ROOT / kept, run / copy)
    for leg, kept in checks.items():  # the shipped table's own check, which install judges again
        shutil.rmtree(run / leg, ignore_errors=True)
        shutil.copytree(kept, run / leg)
    for floor in (ROOT / "calibrate" / "noise").glob("*.json"):  # the floors every verdict reads
        shutil.copyfile(floor, shipped.shipped_dir("noise") / floor.name)
    for floor, name in (("h200.json", "noise.json"), ("h200-forward.json", "forward-noise.json")):  # the run's own
        shutil.copyfile(ROOT / "calibrate" / "noise" / floor, run / name)
    old = {tmp_path / "site/dispatch/thresholds/h200.json": "old table",
           tmp_path / "site/calibrate/baselines/h200.json": "old baseline"}
    for path, text in old.items():
        path.write_text(text)
    return run, old


def test_install_writes_the_shipped_files_of_a_passing_run(tmp_path, monkeypatch):
    run, _ = _passing_run(tmp_path, monkeypatch)
    written = install(H200, run)
    assert tmp_path / "site/dispatch/thresholds" / "h200.json" in written
    assert tmp_path / "site/calibrate/noise/h200.json" not in written  # the floor every verdict reads: on its own
    shipped = json.loads((tmp_path / "site/dispatch/thresholds" / "h200.json").read_text())
    assert shipped["source"]["tactics"]["file"] == "h200.autotune.json"  # beside it, under its shipped name
    assert shipped["source"]["manifest"]["file"].endswith(MANIFEST) and len(shipped["source"]["manifest"]["sha256"]) == 64
    # a baseline of fewer source runs than the shipped one gets a note that says how to widen it
    assert fewer_baseline_runs(TableRun(H200, run)) is None
    (tmp_path / "site/calibrate/baselines" / "h200.json").write_text(json.dumps({"sources": [{}] * 6}))
    (run / "baseline.json").write_text(json.dumps({"sources": [{}] * 2}))
    note = fewer_baseline_runs(TableRun(H200, run))
    assert note.startswith("the shipped baseline held 6 source runs, this run's holds 2")
    assert "BENCH_REGRESSION_WORK" in note


@pytest.mark.parametrize("damage, needle", [
    (lambda run: (run / "table.json").write_text("{}"), "lacks profile"),
    (lambda run: shutil.copyfile(ROOT / "dispatch/thresholds/b200.json", run / "table.json"), "'b200' profile"),
    (lambda run: (run / "table.json").unlink(), "has no table.json"),
    (lambda run: (run / "table.json").write_text((run / "table.json").read_text().replace('"aten"', '"nosuch"')),
     "not one the dispatcher can run"),
    (lambda run: (run / "baseline.json").write_text((run / "baseline.json").read_text()[:300]), "not valid JSON"),
    (lambda run: (run / "baseline.json").write_text("[" * 100000), "nests deeper"),
    (lambda run: (run / "table.autotune.json").write_text('{"k": [1, 2], "x": [3, 4]}'), "fitted with"),
    (lambda run: (run / "baseline.autotune.json").unlink(), "autotuner cache"),
    # the manifest says complete and PASS at the top; install reads the legs: each done, the validate leg's PASS,
    # the check judged again with the staged table, every file read back
    (lambda run: _manifest_edit(run, lambda m: m["legs"]["check-sweep"].update(status="failed (exit 1)")),
     "legs check-sweep are not done"),
    (lambda run: _manifest_edit(run, lambda m: m.update(legs={})), "are not done"),
    (lambda run: _manifest_edit(run, lambda m: m["legs"]["validate"].update(verdict="FAIL")),
     "its validate leg's verdict is 'FAIL'"),
    (lambda run: (run / "check-sweep" / "run.json").unlink(), "its check judged again does not pass"),
    (lambda run: (run / "baseline.autotune.gemv.json").write_text(
        (run / "baseline.autotune.gemv.json").read_text()[:300]), "GEMV configurations .* does not pass its reader"),
    (lambda run: (run / "table.autotune.gemv.json").write_text('{"format": true, "kind": "gemv-configs"}'),
     "not the one it was fitted with"),
], ids=["empty table", "another GPU's table", "no table", "unknown path", "truncated baseline",
        "deep baseline", "other tactics", "missing baseline tactics", "a check leg failed", "no legs",
        "validate said FAIL", "check run damaged", "truncated baseline GEMV", "table GEMV format true"])
def test_install_is_all_or_nothing(tmp_path, monkeypatch, damage, needle):
    """Every artifact is read back by the runtime's reader before any shipped file changes: one bad file and none is
    written, the old ones stay byte for byte, and no staging folder is left behind."""
    run, old = _passing_run(tmp_path, monkeypatch)
    damage(run)
    with pytest.raises(HarnessError, match=needle):
        install(H200, run)
    for path, text in old.items():
        assert path.read_text() == text
        assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_install_of_a_sound_run_replaces_every_file(tmp_path, monkeypatch):
    run, old = _passing_run(tmp_path, monkeypatch)
    written = install(H200, run)
    assert {p.name for p in written} == {"h200.json", "h200.autotune.json", "h200.autotune.gemv.json"}
    assert len(written) == 6 and all(p.read_text() not in old.values() for p in written)
    assert sorted(p.name for p in (tmp_path / "site/dispatch/thresholds").iterdir()) == ["h200.autotune.gemv.json",
                                                                          "h200.autotune.json", "h200.json"]


def _with_layout(path, layout):
    data = json.loads(path.read_text())
    data["source"]["layout"] = layout
    path.write_text(json.dumps(data))


def test_a_union_table_replaces_a_vllm_layout_one_and_is_not_replaced_by_one(tmp_path, monkeypatch):
    """A default run's table covers both layouts' shapes, so it installs over a shipped table of vLLM's layout; once
    shipped, a table of vLLM's layout alone would drop transformers' shapes and is refused, nothing written."""
    run, _ = _passing_run(tmp_path, monkeypatch)
    shipped = tmp_path / "site/dispatch/thresholds" / "h200.json"
    shutil.copyfile(ROOT / "dispatch/thresholds/h200.json", shipped)
    _with_layout(shipped, "vllm")
    _with_layout(run / "table.json", "union")
    install(H200, run)
    assert json.loads(shipped.read_text())["source"]["layout"] == "union"
    before = shipped.read_bytes()
    _with_layout(run / "table.json", "vllm")
    with pytest.raises(HarnessError, match="covers vllm's layout; the shipped h200 table covers union's"):
        install(H200, run)
    assert shipped.read_bytes() == before


def test_the_check_waits_for_another_machine_and_resumes_there(tmp_path):
    """Sweep to fit on machine A; the check legs do not run there (the run waits, exit 0), a resume on machine B runs
    them; the manifest names each leg's machine and says the check was out of machine. The fitted sweep leaves the
    dispatcher out; the check runs the new table."""
    run, ran = tmp_path / "run", []

    def execute(leg, log):
        ran.append(leg.name)
        return 0
    first = run_pipeline(H200, run, resume=False, execute=execute, machine=machines("A"))
    assert ran == LEGS[:4] and first["status"].startswith("waiting before machine-2")
    run_pipeline(H200, run, resume=True, execute=execute, machine=machines("B"))
    assert ran[4:] == ["machine-2"]
    again = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("B"))  # B's sweep is taken
    assert ran[5:] == [] and again["status"].startswith("waiting before machine-3")
    third = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("C"))
    assert ran[5:] == ["machine-3", "fit"] and third["status"].startswith("waiting before check-sweep")
    with pytest.raises(HarnessError, match="fits on 3 machine"):
        run_pipeline(H200, run, resume=True, execute=execute, machine=machines("D"), machines=2)
    done = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("D"))
    assert ran[7:] == LEGS[7:] and done["status"] == "complete" and len(done["machines"]) == 5
    assert done["legs"]["sweep"]["machine"] == "A" and done["legs"]["check-sweep"]["machine"] == "D"
    assert done["legs"]["machine-2"]["machine"] == "B" and done["legs"]["machine-3"]["machine"] == "C"
    assert done["out_of_machine"] is True and "machine" not in done["legs"]["fit"]
    assert done["fitted_on"] == ["sweep", "forward", "refine", "machine-2", "machine-3"]
    by_name = {leg.name: leg.argv for leg in legs(H200, run)}
    assert "dispatch" not in by_name["sweep"][by_name["sweep"].index("--paths") + 1].split(",")
    assert by_name["check-sweep"][by_name["check-sweep"].index("--table") + 1] == str(run / "table.json")


def test_stop_after_a_leg_and_an_unknown_leg(tmp_path):
    run, ran = tmp_path / "run", []
    first = run_pipeline(H200, run, resume=False, execute=lambda leg, log: ran.append(leg.name) or 0,
                         stop_after="forward", machine=machines("A"))
    assert ran == ["sweep", "forward"] and first["status"] == "stopped after forward"
    with pytest.raises(HarnessError, match="no leg"):
        run_pipeline(H200, tmp_path / "other", resume=False, execute=lambda leg, log: 0, stop_after="lunch")


def test_a_run_for_transformers_layout_keeps_its_scope_in_every_gpu_leg_and_is_not_installed(tmp_path):
    """A table for one model in transformers' module layout: every GPU leg measures those shapes, a resume keeps the
    scope the manifest records (and refuses another), and --install refuses it: the shipped table covers every
    catalog model in both layouts."""
    from tables.manifest import Scope, parse_scope
    scope = parse_scope("transformers", "Qwen3.5-4B")
    assert scope == Scope("transformers", ("Qwen3.5-4B",)) and parse_scope(None, None) is None
    run, argv = tmp_path / "run", {}

    def execute(leg, log):
        argv[leg.name] = leg.argv
        return 0
    run_pipeline(H200, run, resume=False, execute=execute, stop_after="fit", same_machine=True, scope=scope)
    with pytest.raises(HarnessError, match="covers"):
        run_pipeline(H200, run, resume=True, execute=execute, same_machine=True, scope=Scope())
    done = run_pipeline(H200, run, resume=True, execute=execute, same_machine=True)
    assert done["scope"] == {"layout": "transformers", "models": ["Qwen3.5-4B"]}
    for leg in legs(H200, run):
        given = " ".join(argv[leg.name])
        assert ("--layout transformers --model Qwen3.5-4B" in given) == leg.gpu, leg.name
    (run / "table.json").write_text(json.dumps({"format": 2, "profile": "h200"}))
    done = run_pipeline(H200, tmp_path / "pass", resume=False, execute=lambda leg, log: 0, same_machine=True,
                        scope=scope)
    assert done["verdict"] == "PASS"
    with pytest.raises(HarnessError, match="both layouts"):
        install(H200, tmp_path / "pass")
    with pytest.raises(HarnessError, match="unknown model"):
        parse_scope(None, "Qwen9")


def test_a_default_run_sweeps_both_layouts_and_runs_its_forwards_in_vllms(tmp_path):
    """The default table run covers the union of vLLM's layers and transformers' modules (one shipped table for
    both): its sweep legs take --layout union, its forward legs vLLM's layout (a forward runs one layout), and the
    manifest records the scope, so a resume keeps it; a run made before scopes were recorded stays vLLM's."""
    from tables.manifest import Scope
    run, argv = tmp_path / "run", {}

    def execute(leg, log):
        argv[leg.name] = " ".join(leg.argv)
        return 0
    run_pipeline(H200, run, resume=False, execute=execute, stop_after="fit", same_machine=True)
    assert json.loads((run / MANIFEST).read_text())["scope"] == {"layout": "union", "models": None}
    assert TableRun(H200, run).scope == Scope() and Scope().layout == "union"
    for name in ("sweep", "refine", "machine-2", "machine-3"):
        if name in argv:
            assert "--layout union" in argv[name], name
    assert "--layout" not in argv["forward"]
    old = json.loads((run / MANIFEST).read_text())
    del old["scope"]
    (run / MANIFEST).write_text(json.dumps(old))
    assert TableRun(H200, run).scope == Scope("vllm")


def test_a_damaged_manifest_is_refused_by_resume_and_install_and_left_as_it_is(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / MANIFEST).write_text("{not json")
    with pytest.raises(HarnessError, match="table run manifest .* is not valid JSON"):
        run_pipeline(H200, run, resume=True, execute=lambda leg, log: 0, machine=machines("A"))
    with pytest.raises(HarnessError, match="table run manifest .* is not valid JSON"):
        install(H200, run)
    from tables.pipeline import set_aside_legs
    with pytest.raises(HarnessError, match="table run manifest .* is not valid JSON"):
        set_aside_legs(TableRun(H200, run))
    assert (run / MANIFEST).read_text() == "{not json" and [p.name for p in run.iterdir()] == [MANIFEST]


def test_refit_runs_the_fit_and_every_later_leg_again_and_keeps_the_earlier_ones(tmp_path):
    """A changed fit rule: --refit keeps what the fitted legs measured, moves the fit's and the check's entries and
    outputs to refit-1/, and a resume on a machine that fitted none runs the fit and everything after it again."""
    from tables.pipeline import legs_run_again, set_aside_legs
    run, ran = tmp_path / "run", []

    def execute(leg, log):
        ran.append(leg.name)
        log.write_text(f"{leg.name} on its machine\n")
        if leg.name == "fit":
            (run / "table.json").write_text(json.dumps({"fit": len(ran)}))
        if leg.name == "check-sweep":
            (run / "check-sweep").mkdir()
        return 0
    first = run_pipeline(H200, run, resume=False, execute=execute, machine=machines("A"), same_machine=True)
    assert first["verdict"] == "PASS"
    old_table = (run / "table.json").read_text()
    assert legs_run_again(TableRun(H200, run)) == LEGS[LEGS.index("fit"):]
    kept = set_aside_legs(TableRun(H200, run))
    assert kept == run / "refit-1" and (kept / "table.json").read_text() == old_table
    assert (kept / "check-sweep").is_dir() and (kept / "fit.log").is_file() and not (run / "table.json").exists()
    assert (run / "sweep.log").is_file()  # what the fitted legs measured stays where the fit reads it
    manifest = json.loads((run / MANIFEST).read_text())
    assert "verdict" not in manifest and set(manifest["legs"]) == set(LEGS[:LEGS.index("fit")])
    (old,) = manifest["refits"]
    assert old["verdict"] == "PASS" and old["folder"] == "refit-1" and set(old["legs"]) == set(LEGS[LEGS.index("fit"):])
    ran.clear()
    done = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("D"))
    assert ran == LEGS[LEGS.index("fit"):] and done["verdict"] == "PASS" and done["out_of_machine"] is True
    assert done["refits"][0]["legs"]["check-sweep"]["machine"] == "A" and done["legs"]["check-sweep"]["machine"] == "D"
    assert set_aside_legs(TableRun(H200, run)) == run / "refit-2"


def test_refit_of_a_run_that_has_not_fitted_is_refused_and_changes_nothing(tmp_path):
    from tables.pipeline import set_aside_legs
    run = tmp_path / "run"
    with pytest.raises(HarnessError, match="run it first"):
        set_aside_legs(TableRun(H200, run))
    run_pipeline(H200, run, resume=False, execute=lambda leg, log: 0, stop_after="refine", machine=machines("A"))
    before = sorted(p.name for p in run.iterdir()), (run / MANIFEST).read_bytes()
    with pytest.raises(HarnessError, match="nothing to refit, its legs machine-2, machine-3 are not done"):
        set_aside_legs(TableRun(H200, run))
    assert (sorted(p.name for p in run.iterdir()), (run / MANIFEST).read_bytes()) == before


def test_stop_after_a_leg_already_done_runs_nothing_after_it(tmp_path):
    run, ran = tmp_path / "run", []
    run_pipeline(H200, run, resume=False, execute=lambda leg, log: ran.append(leg.name) or 0, stop_after="forward",
                 machine=machines("A"))
    ran.clear()
    again = run_pipeline(H200, run, resume=True, execute=lambda leg, log: ran.append(leg.name) or 0,
                         stop_after="sweep", machine=machines("A"))
    assert ran == [] and again["status"] == "stopped after sweep"


def test_a_refit_can_add_fitting_machines_each_measured_on_a_machine_of_its_own(tmp_path):
    """--refit --machines N on a run fitted on fewer: the earlier fit and check are kept in refit-1/, the new
    machine-<i> legs run before the fit, and the check waits for a machine that ran none of the fitted legs."""
    from tables.pipeline import set_aside_legs
    run, ran = tmp_path / "run", []

    def execute(leg, log):
        ran.append(leg.name)
        if leg.name == "fit":
            (run / "table.json").write_text(json.dumps({"fit": len(ran)}))
        return 1 if leg.name == "validate" else 0
    first = run_pipeline(H200, run, resume=False, execute=execute, machine=machines("A"), machines=1,
                         same_machine=True)
    assert first["verdict"] == "FAIL" and "machine-2" not in ran
    with pytest.raises(HarnessError, match="never drops"):
        set_aside_legs(TableRun(H200, run), machines=0)
    kept = set_aside_legs(TableRun(H200, run), machines=2)
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["fit_machines"] == 2 and manifest["refits"][0]["fit_machines"] == 1
    assert manifest["refits"][0]["verdict"] == "FAIL" and (kept / "table.json").is_file()
    ran.clear()
    waiting = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("C"))
    assert ran == ["machine-2", "fit"] and waiting["status"].startswith("waiting before check-sweep")
    ran.clear()
    done = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("D"))
    assert ran[0] == "check-sweep" and done["legs"]["machine-2"]["machine"] == "C"
    assert done["out_of_machine"] is True and "--machine" in done["legs"]["fit"]["command"]


@pytest.mark.parametrize("scope, machines", [(None, None), ("vllm", 1), ("transformers", 2)])
def test_every_legs_arguments_parse_with_its_tools_own_parser(tmp_path, scope, machines):
    """The legs name only options their tools declare (bench, calibrate and reports parse them, nothing runs)."""
    from tables.manifest import Scope
    for leg in legs(H200, tmp_path, Scope(scope) if scope else None, machines):
        leg.check()
    for leg in legs(get_profile("gb200"), tmp_path):
        leg.check()


def test_a_leg_its_tool_does_not_parse_stops_the_run_before_any_leg(tmp_path, monkeypatch):
    import dataclasses

    import tables.pipeline as pipeline
    real = pipeline.legs

    def renamed(run, *a, **k):
        out = real(run, *a, **k)
        return [dataclasses.replace(x, args=(*x.args, "--colour", "red")) if x.name == "noise" else x for x in out]
    monkeypatch.setattr(pipeline, "legs", renamed)
    ran = []
    with pytest.raises(HarnessError, match="leg noise: python -m calibrate does not take its arguments"):
        pipeline.run_pipeline(TableRun(H200, tmp_path / "run"), False, execute=lambda leg, log: ran.append(1) or 0)
    assert ran == []


def _manifest_edit(run, edit):
    data = json.loads((run / MANIFEST).read_text())
    edit(data)
    (run / MANIFEST).write_text(json.dumps(data))


def test_rejudge_runs_validate_and_the_legs_after_it_again_on_any_machine(tmp_path):
    """A changed verdict rule: --rejudge moves the validate leg's and every later leg's entries and outputs to
    refit-1/ (its entry saying it started at validate), and a resume runs those legs alone, none of them a GPU leg;
    the fit and the check's measurements stay. A run that has not reached validate is refused."""
    from tables.pipeline import REJUDGE_FROM, legs_run_again, set_aside_legs
    run, ran, verdicts = tmp_path / "run", [], iter([1, 0])  # validate: FAIL, then PASS by the changed rule

    def execute(leg, log):
        ran.append(leg.name)
        log.write_text(f"{leg.name}\n")
        return next(verdicts) if leg.name == "validate" else 0
    first = run_pipeline(H200, run, resume=False, execute=execute, machine=machines("A"), same_machine=True)
    assert first["verdict"] == "FAIL"
    late = legs_run_again(TableRun(H200, run), REJUDGE_FROM)
    assert late == LEGS[LEGS.index("validate"):] and not any(leg.gpu for leg in legs(H200, run) if leg.name in late)
    kept = set_aside_legs(TableRun(H200, run), start=REJUDGE_FROM)
    assert (kept / "validate.log").is_file() and (run / "check-sweep.log").is_file() and (run / "fit.log").is_file()
    ran.clear()
    done = run_pipeline(H200, run, resume=True, execute=execute, machine=machines("A"))
    assert ran == late and done["verdict"] == "PASS" and done["refits"][0]["from"] == "validate"
    assert done["refits"][0]["verdict"] == "FAIL" and done["legs"]["check-sweep"]["machine"] == "A"
    fresh = tmp_path / "fresh"
    run_pipeline(H200, fresh, resume=False, execute=lambda leg, log: 0, stop_after="fit", machine=machines("A"),
                 same_machine=True)
    with pytest.raises(HarnessError, match="nothing to rejudge, its legs check-sweep"):
        set_aside_legs(TableRun(H200, fresh), start=REJUDGE_FROM)
