"""Regression baselines on recorded H200 data (CPU): planted regressions fail, noise within tolerance passes,
corrupted or mismatched baselines give one clear error."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench.results import load_results, load_run_info
from calibrate.__main__ import main as dispatch_main
from calibrate.baseline import (REGRESSION_MS, baseline_text, cells_from_results, check_cell, compare,
                                fingerprint_mismatch, fingerprint_of, load_baseline, merge_runs)
from harness.errors import HarnessError

DATA = Path(__file__).parent / "data"
SWEEP = DATA / "h200-sweep"
FI = ["flashinfer:tinygemm", "flashinfer:cublaslt"]


@pytest.fixture(scope="module")
def recorded():
    df = load_results(SWEEP)
    return df[df["m"].isin(REGRESSION_MS)].reset_index(drop=True), load_run_info(SWEEP)


@pytest.fixture(scope="module")
def baseline_file(recorded, tmp_path_factory):
    df, info = recorded
    path = tmp_path_factory.mktemp("b") / "h200.json"
    path.write_text(baseline_text("h200", [(str(SWEEP), info)], cells_from_results(df, FI)))
    return path


def _scaled(df, n, k, m, path, factor):
    """A copy of the table with one cell's GPU samples scaled, as a regression of that kernel would."""
    out = df.copy()
    i = out.index[(out.n == n) & (out.k == k) & (out.m == m) & (out.path == path)][0]
    samples = np.array([float(v) for v in out.at[i, "gpu_samples_us"].split(";")]) * factor
    out.at[i, "gpu_samples_us"] = ";".join(f"{v:.4f}" for v in samples)
    out.at[i, "gpu_us"] = float(np.median(samples))
    out.at[i, "gpu_us_p20"], out.at[i, "gpu_us_p80"] = (float(np.percentile(samples, q)) for q in (20, 80))
    return out


def test_the_baseline_round_trips_and_covers_the_regression_grid(baseline_file, recorded):
    b = load_baseline(baseline_file)
    assert b.profile == "h200" and b.fingerprint["gpu_name"] == "NVIDIA H200" and b.fingerprint["sm"] == 90
    assert {c.m for c in b.cells} == set(REGRESSION_MS)
    assert {c.path for c in b.cells} == set(FI)
    assert all(c.gpu_ratio_lo <= c.gpu_ratio <= c.gpu_ratio_hi for c in b.cells)
    assert all(c.samples >= 10 and c.kernels and c.aten_kernels for c in b.cells)
    # reviewable: one cell per line
    assert sum(1 for line in baseline_file.read_text().splitlines() if '"gpu_ratio"' in line) == len(b.cells)


def test_a_planted_regression_fails_and_only_that_cell(baseline_file, recorded):
    df, _ = recorded
    slow = _scaled(df, 2048, 4096, 256, "flashinfer:cublaslt", 1.10)  # 10% slower FlashInfer cuBLASLt
    checks = compare(load_baseline(baseline_file), cells_from_results(slow, FI))
    bad = [c for c in checks if c.status != "ok"]
    assert [(c.cell.n, c.cell.k, c.cell.m, c.cell.path) for c in bad] == [(2048, 4096, 256, "flashinfer:cublaslt")]
    assert "GPU ratio" in bad[0].message


def test_a_faster_aten_is_a_regression_of_the_ratio_too(baseline_file, recorded):
    df, _ = recorded
    fast_aten = _scaled(df, 9216, 2048, 4096, "aten", 0.85)
    bad = [c for c in compare(load_baseline(baseline_file), cells_from_results(fast_aten, FI)) if c.status != "ok"]
    assert {c.cell.path for c in bad} == {"flashinfer:cublaslt"}  # TinyGEMM is not swept at M = 4096


def test_noise_within_tolerance_passes(baseline_file, recorded):
    df, _ = recorded
    noisy = df.copy()
    rng = np.random.default_rng(7)
    for i in noisy.index[noisy.status == "ok"]:
        s = np.array([float(v) for v in noisy.at[i, "gpu_samples_us"].split(";")])
        s = s * (1 + rng.uniform(-0.015, 0.015))  # every cell moves by up to 1.5%, independently
        noisy.at[i, "gpu_samples_us"] = ";".join(f"{v:.4f}" for v in s)
    assert all(c.status == "ok" for c in compare(load_baseline(baseline_file), cells_from_results(noisy, FI)))


def test_host_ratio_beyond_a_factor_two_fails(baseline_file):
    b = load_baseline(baseline_file)
    cell = b.cells[0]
    worse = dataclasses.replace(cell, host_ratio=cell.host_ratio * 2.5)  # a single run: lo == hi == the ratio
    assert check_cell(cell, worse, b.tolerance, b.host_tolerance).status == "FAIL"
    assert check_cell(cell, dataclasses.replace(cell, host_ratio=cell.host_ratio * 1.5), b.tolerance,
                      b.host_tolerance).status == "ok"


def test_a_kernel_change_warns_but_does_not_fail(baseline_file):
    b = load_baseline(baseline_file)
    cell = b.cells[0]
    check = check_cell(cell, dataclasses.replace(cell, kernels="other_kernel"), b.tolerance, b.host_tolerance)
    assert check.status == "ok" and check.kernel_changed


def test_a_missing_cell_is_reported(baseline_file, recorded):
    df, _ = recorded
    fewer = df[~((df.n == 64) & (df.m == 1))]
    checks = compare(load_baseline(baseline_file), cells_from_results(fewer, FI))
    assert {c.status for c in checks if c.cell.n == 64 and c.cell.m == 1} == {"missing"}


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    ('{"format": 1, "profile": "h200"}', "malformed"),
    ('{"format": 99, "profile": "h200", "cells": []}', "malformed"),
])
def test_a_corrupted_baseline_is_one_clear_error(tmp_path, text, needle):
    bad = tmp_path / "h200.json"
    bad.write_text(text)
    with pytest.raises(HarnessError, match=needle):
        load_baseline(bad)
    with pytest.raises(HarnessError, match="no baseline"):
        load_baseline(tmp_path / "absent.json")


def test_a_truncated_cell_is_malformed(baseline_file, tmp_path):
    data = json.loads(baseline_file.read_text())
    del data["cells"][3]["gpu_ratio"]
    bad = tmp_path / "h200.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(HarnessError, match="malformed"):
        load_baseline(bad)


def test_a_fingerprint_mismatch_names_the_keys(baseline_file):
    b = load_baseline(baseline_file)
    other = {**b.fingerprint, "flashinfer": "0.8.0", "driver_major": 590}
    assert fingerprint_mismatch(b.fingerprint, other) == ["driver_major: 580 -> 590",
                                                          "flashinfer: '0.7.2.post1' -> '0.8.0'"]
    assert fingerprint_mismatch(b.fingerprint, fingerprint_of({"fingerprint": b.full_fingerprint})) == []


def test_regress_cli_on_recorded_runs(baseline_file, recorded, tmp_path, capsys):
    df, _ = recorded
    assert dispatch_main(["regress", "--gpu", "h200", "--baseline", str(baseline_file), "--from", str(SWEEP)]) == 0
    assert "PASS" in capsys.readouterr().out
    slow = _scaled(df, 2048, 4096, 256, "flashinfer:cublaslt", 1.10)
    run = tmp_path / "slow"
    run.mkdir()
    slow.to_csv(run / "results.csv", index=False)
    info = json.loads((SWEEP / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "ms": list(REGRESSION_MS)}))  # the regression grid's M
    assert dispatch_main(["regress", "--gpu", "h200", "--baseline", str(baseline_file), "--from", str(run)]) == 1
    out = capsys.readouterr().out
    assert "SLOWER: n2048_k4096 M=256 flashinfer:cublaslt" in out and "SLOWER 1," in out
    fast = _scaled(df, 2048, 4096, 256, "flashinfer:cublaslt", 0.90)  # a change either way moves a decision
    fast.to_csv(run / "results.csv", index=False)
    assert dispatch_main(["regress", "--gpu", "h200", "--baseline", str(baseline_file), "--from", str(run)]) == 1
    assert "FASTER: n2048_k4096 M=256 flashinfer:cublaslt" in capsys.readouterr().out


def test_several_runs_widen_the_interval_to_their_envelope(recorded):
    df, _ = recorded
    one = cells_from_results(df, FI)
    other = [dataclasses.replace(c, gpu_ratio=c.gpu_ratio * 1.2, gpu_ratio_lo=c.gpu_ratio_lo * 1.2,
                                 gpu_ratio_hi=c.gpu_ratio_hi * 1.2, kernels="another_algo") for c in one]
    merged = {c.key: c for c in merge_runs([one, other])}
    for c in one:
        m = merged[c.key]
        assert m.runs == 2 and m.samples == 2 * c.samples
        assert m.gpu_ratio_lo == c.gpu_ratio_lo and m.gpu_ratio_hi == pytest.approx(c.gpu_ratio_hi * 1.2)
        assert set(m.kernels.split(" | ")) == {c.kernels, "another_algo"}
    # a fresh run that picked either algorithm passes, and no kernel warning for a variant seen before
    check = check_cell(merged[other[0].key], other[0], 0.05, 1.0)
    assert check.status == "ok" and not check.kernel_changed


def test_runs_of_two_environments_make_no_baseline(recorded):
    df, info = recorded
    other = {**info, "fingerprint": {**info["fingerprint"], "torch": "2.12.0"}}
    with pytest.raises(HarnessError, match="another fingerprint"):
        baseline_text("h200", [("a", info), ("b", other)], cells_from_results(df, FI))


@pytest.mark.evidence
def test_the_committed_h200_baseline_is_readable_and_from_real_runs():
    from calibrate.baseline import baseline_path
    b = load_baseline(baseline_path("h200"))
    assert b.fingerprint["gpu_name"] == "NVIDIA H200" and len(b.sources) >= 1
    root = Path(__file__).parent.parent
    for src in b.sources:  # every run behind the baseline is committed, and was measured in its environment
        info = load_run_info(_committed(root, src["results"], src["started"]))
        assert fingerprint_mismatch(b.fingerprint, fingerprint_of(info)) == [] and info["started"] == src["started"]
    assert {c.m for c in b.cells} == set(REGRESSION_MS)
    if b.autotune_cache:  # pinned tactics: the file beside the baseline is the one every source run served
        from bench.autotune_cache import FILE_NAME, sha256
        tactics = b.tactics_file()
        for src in b.sources:  # the tactics each run served, by the sha256 its run.json records, or its kept copy
            run = _committed(root, src["results"], src["started"])
            served = load_run_info(run).get("autotune_cache") or {}
            kept = run / FILE_NAME
            assert (sha256(kept) if kept.is_file() else served.get("sha256")) == sha256(tactics)


def _committed(root: Path, results: str, started: str) -> Path:
    """Where a baseline's source run is committed: its results path, or else the evidence folder whose run.json has its
    start time (a table run's legs are filed under evidence/, a refit's under the run it refitted)."""
    if (root / results).exists():
        return root / results
    found = [p.parent for p in (root / "evidence").glob("**/run.json")
             if json.loads(p.read_text()).get("started") == started]
    assert len(found) == 1, f"{results} (started {started}) is not committed"
    return found[0]


def _tactics(path: Path, tactic: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"_metadata": {"gpu": "NVIDIA H200"},
                                "('bf16_gemm', 'CublasltBf16GemmRunner', ((1, 2048),))": ["CublasltBf16GemmRunner", tactic]}))
    return path


def test_runs_that_served_one_autotuner_cache_pin_it(tmp_path):
    from calibrate.baseline import shared_tactics
    a, b, c = (tmp_path / x for x in "abc")
    for run, tactic in ((a, 3), (b, 3), (c, 0)):
        _tactics(run / "autotune-cache.json", tactic)
    assert shared_tactics([str(a), str(b)]) == a / "autotune-cache.json"
    assert shared_tactics([str(a), str(c)]) is None  # tuned apiece: another tactic
    assert shared_tactics([str(a), str(tmp_path / "none")]) is None  # a run that kept no tactics
    # the GEMV's configurations beside them compare by content: a run that served a format 1 file keeps it in the
    # current format, the same configurations byte for byte different
    one = {"format": 1, "kind": "gemv-configs", "configs": [
        {"n": 2560, "k": 4096, "m": 1, "block_n": 64, "block_k": 128, "split_k": 16, "num_warps": 4}]}
    now = {"format": 3, "kind": "gemv-configs", "configs": [{**one["configs"][0], "tile_m": 1, "pdl": False}]}
    (a / "autotune-cache.gemv.json").write_text(json.dumps(one))
    (b / "autotune-cache.gemv.json").write_text(json.dumps(now, indent=1))
    assert shared_tactics([str(a), str(b)]) == a / "autotune-cache.json"
    (b / "autotune-cache.gemv.json").write_text(json.dumps({**now, "configs": [{**now["configs"][0], "pdl": True}]}))
    assert shared_tactics([str(a), str(b)]) is None  # another launch: not the same configurations
    (b / "autotune-cache.gemv.json").write_text("{")
    (a / "autotune-cache.gemv.json").write_text("{")
    assert shared_tactics([str(a), str(b)]) is None  # unreadable files are not the same configurations


def test_a_pinned_baseline_checks_its_tactics_file(recorded, tmp_path):
    from bench.autotune_cache import sha256
    df, info = recorded
    tactics = _tactics(tmp_path / "h200.autotune.json", 3)
    path = tmp_path / "h200.json"
    path.write_text(baseline_text("h200", [(str(SWEEP), info)], cells_from_results(df, FI),
                                  {"file": tactics.name, "sha256": sha256(tactics)}))
    b = load_baseline(path)
    assert b.tactics_file() == tactics
    _tactics(tactics, 0)  # edited after the baseline was measured
    with pytest.raises(HarnessError, match="not the autotuner cache the baseline was measured with"):
        b.tactics_file()
    tactics.unlink()
    with pytest.raises(HarnessError, match="autotuner cache .* is missing"):
        b.tactics_file()
    bad = json.loads(path.read_text())
    bad["autotune_cache"] = {"file": 3}
    path.write_text(json.dumps(bad))
    with pytest.raises(HarnessError, match="malformed .*autotune_cache"):
        load_baseline(path)


@pytest.mark.parametrize("text, needle", [("{not json", "not valid JSON"), ('{"k": 3}', "not a FlashInfer autotuner cache"),
                                          ("[1, 2]", "not a FlashInfer autotuner cache")])
def test_a_malformed_autotuner_cache_is_one_clear_error(tmp_path, text, needle):
    from bench.autotune_cache import read_entries
    f = tmp_path / "c.json"
    f.write_text(text)
    with pytest.raises(HarnessError, match=needle):
        read_entries(f)
    with pytest.raises(HarnessError, match="autotuner cache .* not found"):
        read_entries(tmp_path / "missing.json")


def test_serving_tactics_without_tuning_is_refused(tmp_path):
    from bench.sweep import SweepConfig, _load_pinned_tactics
    from dispatch.profiles import get_profile
    cfg = SweepConfig(get_profile("h200"), [], [1], [], tmp_path, tune=False,
                      autotune_cache=_tactics(tmp_path / "c.json", 1))
    with pytest.raises(HarnessError, match="--no-tune and --autotune-cache"):
        _load_pinned_tactics(cfg)


def test_a_fresh_process_measurement_reports_the_childs_error(tmp_path):
    """The regression grid runs in a spawned interpreter; its one-line error comes back to the caller unchanged."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the child would measure")
    from calibrate.regress import measure_in_fresh_process
    from dispatch.profiles import get_profile
    with pytest.raises(HarnessError, match="no CUDA GPU"):
        measure_in_fresh_process(get_profile("h200"), tmp_path / "x", ["n2048_k4096"], (1,))
    assert not (tmp_path / "x").exists()


def test_a_kept_autotuner_cache_is_an_exact_copy(tmp_path):
    from bench.autotune_cache import copy, sha256
    src = _tactics(tmp_path / "a" / "autotune-cache.json", 3)
    dst = tmp_path / "b" / "kept.json"
    copy(src, dst)
    assert sha256(dst) == sha256(src) and list(dst.parent.iterdir()) == [dst]  # no temp file left
    copy(dst, dst)  # onto itself: nothing to do
    assert sha256(dst) == sha256(src)


def test_tactic_differences_name_the_cells_where_two_tunings_disagree(tmp_path):
    """Two autotuner files: at the cells asked about, the runners whose tactic differs; an entry one file lacks, a
    key of another op and a cell not asked about are not reported."""
    from bench.autotune_cache import tactic_differences

    def key(runner, m, k, n):
        return f"('bf16_gemm', '{runner}', (({m}, {k}), ({k}, {n}), (0,), (0,), (-1, {n}), (41943040,)), (x))"
    own = {key("CublasltBf16GemmRunner", 64, 2048, 1): ["CublasltBf16GemmRunner", 1, []],
           key("CublasltBf16GemmRunner", 2, 2560, 12288): ["CublasltBf16GemmRunner", 2, []],
           key("CublasltBf16GemmRunner", 8, 2560, 12288): ["CublasltBf16GemmRunner", 3, []],
           key("TinyGemmBf16GemmRunner", 64, 2048, 1): ["TinyGemmBf16GemmRunner", 0, []],
           "('other_op', 'X', ((64, 2048), (2048, 1),)": ["X", 5, []]}
    table = {**own, key("CublasltBf16GemmRunner", 64, 2048, 1): ["CublasltBf16GemmRunner", 0, []],
             key("CublasltBf16GemmRunner", 8, 2560, 12288): ["CublasltBf16GemmRunner", 4, []],
             "('other_op', 'X', ((64, 2048), (2048, 1),)": ["X", 6, []]}
    del table[key("CublasltBf16GemmRunner", 2, 2560, 12288)]
    (tmp_path / "own.json").write_text(json.dumps({"_metadata": {}, **own}))
    (tmp_path / "table.json").write_text(json.dumps({"_metadata": {}, **table}))
    got = tactic_differences(tmp_path / "own.json", tmp_path / "table.json", [(1, 2048, 64), (12288, 2560, 2)])
    assert got == [(1, 2048, 64, "CublasltBf16GemmRunner", 1, 0)]


def test_validate_notes_a_damaged_tactics_file_beside_its_verdict(tmp_path, capsys):
    """The tactics note under validate's SLOWER cells: an unreadable autotune-cache.json in the run is said in one
    line and does not stop the verdict; a readable one names the differing tactic."""
    from types import SimpleNamespace

    import pandas as pd

    from calibrate.commands.validate import _say_tactic_differences
    key = "('bf16_gemm', 'CublasltBf16GemmRunner', ((64, 2048), (2048, 1), (0,), (0,), (-1, 1), (41943040,)), (x))"
    (tmp_path / "table.json").write_text(json.dumps({key: ["CublasltBf16GemmRunner", 0, []]}))
    table = SimpleNamespace(tactics=tmp_path / "table.json")
    slower = pd.DataFrame([{"n": 1, "k": 2048, "m": 64}])
    run = tmp_path / "run"
    run.mkdir()
    (run / "autotune-cache.json").write_text('{"x": 3}')
    _say_tactic_differences(str(run), table, slower)
    assert "tactics not compared with the table's" in capsys.readouterr().out
    (run / "autotune-cache.json").write_text(json.dumps({key: ["CublasltBf16GemmRunner", 1, []]}))
    _say_tactic_differences(str(run), table, slower)
    assert "1x2048 M=64 CublasltBf16GemmRunner 1 (table: 0)" in capsys.readouterr().out


def test_the_regression_grid_host_times_as_its_baselines_did(monkeypatch, tmp_path):
    """The gate compares with baselines whose host blocks held --host-calls calls each: it does not size them by time."""
    import calibrate.regress as regress
    from dispatch.profiles import get_profile
    seen = []
    monkeypatch.setattr(regress, "run_sweep", lambda cfg: seen.append(cfg))
    monkeypatch.setattr(regress, "load_results", lambda out: None)
    monkeypatch.setattr(regress, "cells_from_results", lambda *a: [])
    monkeypatch.setattr(regress, "load_run_info", lambda out: {})
    regress.measure(get_profile("h200"), tmp_path)
    assert seen[0].host_block_us is None and not seen[0].skip_unchoosable


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_regression_grid_measures_every_shape_of_the_shipped_baseline(gpu, monkeypatch, tmp_path):
    """A union baseline's transformers-only shapes (in_proj_a/b 32 x 2048, q_proj 8192 x 2048, ...) are measured
    afresh, not reported as missing from the fresh run."""
    import calibrate.regress as regress
    from calibrate.baseline import baseline_path, load_baseline
    from dispatch.profiles import get_profile
    baseline = load_baseline(baseline_path(gpu))
    seen = {}

    def measured(profile, out, shapes=None, ms=(), samples=10, autotune_cache=None):
        seen["shapes"] = shapes
        return [], {}
    monkeypatch.setattr(regress, "measure_in_fresh_process", measured)
    monkeypatch.setattr(regress, "compare", lambda *a: [])
    regress.regress(get_profile(gpu), baseline, tmp_path)
    assert set(seen["shapes"]) == {c.shape for c in baseline.cells}
    by_name = {s.name: s for s in regress.grid_catalog()}
    assert [s for s in seen["shapes"]] == [s for s in by_name if s in set(seen["shapes"])]  # catalog order


def test_a_baseline_shape_no_catalog_holds_stops_regress_before_it_measures(monkeypatch, tmp_path):
    import dataclasses

    import calibrate.regress as regress
    from calibrate.baseline import baseline_path, load_baseline
    from dispatch.profiles import get_profile
    baseline = load_baseline(baseline_path("h200"))
    stray = dataclasses.replace(baseline.cells[0], shape="n12345_k678", n=12345, k=678)
    baseline = dataclasses.replace(baseline, cells=[*baseline.cells, stray])
    monkeypatch.setattr(regress, "measure_in_fresh_process", lambda *a, **k: pytest.fail("measured"))
    with pytest.raises(HarnessError, match="n12345_k678 that no catalog model has"):
        regress.regress(get_profile("h200"), baseline, tmp_path)
