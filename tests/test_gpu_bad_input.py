"""GPU-side bad input: another GPU's profile, a shape that does not fit in memory, an interrupted sweep resumed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def test_another_gpus_profile_is_refused_before_anything_is_written(tmp_path, capsys, gpu_profile):
    from bench.__main__ import main
    from harness.errors import run_cli
    other = "b200" if gpu_profile.sm != 100 else "h200"
    out = tmp_path / "out"
    assert run_cli(main, "bench", ["run", "--gpu", other, "--shapes", "n2048_k4096", "--m", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench: error: GPU profile") and "--allow-mismatch" in err and "\n" not in err
    assert not out.exists()


def test_a_shape_that_does_not_fit_is_skipped_with_the_reason(tmp_path, gpu_profile):
    """Most of the GPU's memory taken by another tensor: the cells that cannot get their operands are rows with status
    skipped and an out-of-memory reason, the others are measured, and the run completes."""
    import torch

    from bench.paths import PATHS
    from bench.results import load_results
    from bench.sweep import SweepConfig, run_sweep
    from shapes.catalog import catalog, select
    free, _ = torch.cuda.mem_get_info()
    blocker = torch.empty(free - (3 << 30), dtype=torch.uint8, device="cuda")  # leave 3 GiB
    try:
        run_sweep(SweepConfig(profile=gpu_profile, shapes=select(catalog(), "n248320_k2560,n64_k2048"), ms=[1, 16384],
                              paths=[PATHS["aten"]], out=tmp_path, samples=3, tune=False))
    finally:
        del blocker
        torch.cuda.empty_cache()
    df = load_results(tmp_path).set_index(["n", "m"])
    assert df.loc[(248320, 16384), "status"] == "skipped" and "out of memory" in df.loc[(248320, 16384), "reason"]
    assert df.loc[(64, 1), "status"] == "ok" and df.loc[(64, 16384), "status"] == "ok"


def test_an_interrupted_sweep_keeps_its_rows_and_resumes(tmp_path, gpu_profile):
    out = tmp_path / "sweep"
    shapes, ms = "n2048_k4096,n1024_k2048,n12288_k2048,n2048_k512", "1,8,16,32,64,128,256,512,1024,4096"
    cmd = [sys.executable, "-m", "bench", "run", "--gpu", gpu_profile.name, "--shapes", shapes, "--m", ms,
           "--paths", "aten,flashinfer:cublaslt", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "results.csv").is_file():
        time.sleep(0.5)
    assert (out / "results.csv").is_file(), "no rows were written within 4 minutes"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert "Traceback" not in err and "--resume" in err.strip().splitlines()[-1], err
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "interrupted"
    kept = (out / "results.csv").read_text().count("\n") - 1
    assert kept >= 1
    log = (out / "log.txt").read_text()
    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    from bench.results import load_results
    df = load_results(out)  # the whole grid: no --partial needed after the resume
    assert len(df) == 4 * 10 * 2 and json.loads((out / "run.json").read_text())["status"] == "complete"
    assert len(json.loads((out / "run.json").read_text())["previous_legs"]) == 1
    assert "cells ok" in r.stderr  # the summary, on the terminal
    # nothing else there: FlashInfer's logs, autotuner warnings and the cuDNN leak report went to log.txt
    lines = [line for line in r.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert all(line.startswith(("bench", "  ")) for line in lines), r.stderr
    assert (out / "log.txt").stat().st_size > len(log)
