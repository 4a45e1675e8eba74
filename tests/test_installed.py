"""The package as a user installs it: a wheel built from this checkout, installed (not editable) into a fresh virtual
environment, and the README's commands run from a folder outside the clone on committed runs. Each must print what
the checkout prints. `make test-installed` (CI) runs these; `make test` leaves them out (the wheel build and the
interpreters' start-up take longer than the rest of the suite allows)."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from harness.floors import FLOORS

pytestmark = pytest.mark.installed

ROOT = Path(__file__).resolve().parent.parent


def _shipped_check_run() -> Path:
    """The shipped H200 table's own table run, as filed in evidence/ (found by its manifest's hash)."""
    from evidence_store.store import current
    return current("h200")


def _dependency_dirs() -> list[str]:
    """The site folders this interpreter takes torch, pandas and the rest from; the checkout itself is not one."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir() and Path(d).resolve() != ROOT]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh virtual environment holding the wheel (no editable install) and, through one .pth
    line per folder, the dependencies this interpreter already has (their .pth files, an editable install's
    finder among them, are not read from there)."""
    work = tmp_path_factory.mktemp("installed")
    src = work / "src"  # a copy of what the wheel is built from: the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in FLOORS:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(work / "wheel"), str(src)], check=True, cwd=work)
    wheel = next((work / "wheel").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    python = work / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "zz-dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", purelib, str(wheel)],
                   check=True, cwd=work)
    where = subprocess.run([str(python), "-c", "import calibrate; print(calibrate.__file__)"], check=True,
                           capture_output=True, text=True, cwd=work).stdout.strip()
    assert Path(where).is_relative_to(purelib), where
    return python


def _run(python: Path | str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPU")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def _same(installed: Path, args: list[str], tmp_path: Path) -> str:
    """Runs `args` in the checkout and, installed, from a folder outside it; both exit 0 and print the same."""
    here, there = _run(sys.executable, args, ROOT), _run(installed, args, tmp_path)
    assert here.returncode == 0, here.stderr
    assert there.returncode == 0, there.stderr
    site_data = str(installed.parent.parent)
    assert there.stdout.replace(site_data, "<site>") == here.stdout.replace(site_data, "<site>"), args
    return there.stdout


def test_validate_of_the_shipped_tables_check_gives_the_checkouts_verdict(installed, tmp_path):
    run = _shipped_check_run()
    out = _same(installed, ["-m", "calibrate", "validate", str(run / "check-sweep"), "--forward",
                            str(run / "check-forward")], tmp_path)
    assert "bootstrap alone" not in out and out.rstrip().endswith("PASS")


def test_regress_finds_the_shipped_baseline(installed, tmp_path):
    out = _same(installed, ["-m", "calibrate", "regress", "--gpu", "h200", "--from",
                            str(_shipped_check_run() / "check-sweep")], tmp_path)
    assert out.rstrip().endswith("PASS")


def test_the_catalog_and_a_dry_run_plan_read_the_packages_data(installed, tmp_path):
    _same(installed, ["-m", "shapes", "list"], tmp_path)
    plan = _run(installed, ["-m", "bench", "run", "--gpu", "h200", "--dry-run"], tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "site-packages" in plan.stdout and "tactics served from" in plan.stdout
    assert "cells to measure" in plan.stdout


def test_a_report_builds_outside_the_checkout(installed, tmp_path):
    run = _shipped_check_run()
    done = _run(installed, ["-m", "reports", "build", str(run / "check-sweep"), "-o", "r.html"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").stat().st_size > 100_000


def test_the_dispatcher_binds_and_patches_installed(installed, tmp_path):
    script = ("import torch, dispatch\n"
              "w = torch.randn(64, 128, dtype=torch.bfloat16)\n"
              "x = torch.randn(3, 128, dtype=torch.bfloat16)\n"
              "assert torch.equal(dispatch.bind(w)(x), torch.nn.functional.linear(x, w))\n"
              "m = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False).bfloat16())\n"
              "ref = m(x)\n"
              "h = dispatch.patch(m)\n"
              "assert torch.equal(m(x), ref)\n"
              "h.remove()\n"
              "print(dispatch.load_table('h200').profile)\n")
    done = _run(installed, ["-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "h200"
