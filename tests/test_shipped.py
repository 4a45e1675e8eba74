"""The project's own files, decided without git: what each profile ships is in the package, a shipped file that is
missing is one line (never a silently different verdict), and no output lands on a file of the project's own."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import harness.shipped as shipped
from dispatch.profiles import PROFILES
from harness.errors import HarnessError
from harness.io import check_target, output_dir, output_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_file_a_profile_ships_is_in_the_package_and_declared(profile):
    declared = set(PROFILES[profile].ships)
    present = {kind for kind in shipped.KINDS if shipped.shipped_file(kind, profile).is_file()}
    assert declared == present, f"{profile} declares {sorted(declared)}, the package holds {sorted(present)}"


def test_every_shipped_folder_is_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    for folder in {f for f, _ in shipped.KINDS.values()}:
        package, sub = folder.split("/", 1)
        assert f'"{sub}/*.json"' in text.split(f"\n{package} = [", 1)[1].split("]", 1)[0], folder


@pytest.mark.parametrize("kind, load", [
    ("noise", lambda p: __import__("calibrate.noise", fromlist=["x"]).load_noise(p)),
    ("forward-noise", lambda p: __import__("calibrate.forward_noise", fromlist=["x"]).load_forward_floor(p)),
])
def test_a_noise_floor_the_profile_ships_and_the_install_lacks_is_one_line(kind, load, tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "PACKAGES", tmp_path)
    with pytest.raises(HarnessError, match=rf"h200 profile ships a .*\({shipped.shown(kind, 'h200')}\).*reinstall"):
        load("h200")
    assert load("b200") is None  # ships none: the bootstrap alone, as the CLI says


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_the_tracked_files_are_read_from_the_index_without_git(version, tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git makes the fixture's index")
    repo = tmp_path / "repo"
    (repo / "harness").mkdir(parents=True)
    names = ["README.md", "docs/a.md", "docs/a-much-longer-name-that-shares-a-prefix.md", "harness/x.py",
             "z/" + "/".join(["n" * 100] * 3) + ".txt", "zz.txt"]  # format 4 drops 300 characters: a 2-byte count
    for n in names:
        (repo / n).parent.mkdir(parents=True, exist_ok=True)
        (repo / n).write_text(n)
    _git("init", "-q", cwd=repo)
    _git("add", *names, cwd=repo)
    if version == 3:  # an intent-to-add entry sets the extended flags that only format 3 carries
        (repo / "later.md").write_text("x")
        _git("add", "-N", "later.md", cwd=repo)
        names.append("later.md")
    _git("update-index", f"--index-version={version}", cwd=repo)
    monkeypatch.setattr(shipped, "PACKAGES", repo)
    assert shipped.tracked() == frozenset(names)
    monkeypatch.setenv("PATH", "")  # no git to run: the answer is the same
    assert shipped.is_own(repo / "docs/a.md") and shipped.is_own(repo / ".git/config")
    assert shipped.is_own(repo / "harness/new.py")  # inside a package's folder: the package's own, tracked or not
    assert not shipped.is_own(repo / "docs/new.md") and not shipped.is_own(repo / "results/x.csv")
    assert not shipped.is_own(tmp_path / "elsewhere.txt")


def test_an_installed_tree_owns_its_packages_and_nothing_beside_them(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "dispatch" / "thresholds").mkdir(parents=True)
    monkeypatch.setattr(shipped, "PACKAGES", site)
    assert shipped.checkout() is None and shipped.tracked() is None
    assert shipped.is_own(site / "dispatch" / "thresholds" / "h200.json")
    assert not shipped.is_own(site / "numpy" / "x.py") and not shipped.is_own(tmp_path / "out.csv")


@pytest.mark.parametrize("target", ["README.md", "docs/cli.md", ".git/config", ".git/HEAD", "dispatch/new.json",
                                    "calibrate/baselines/h200.json"])
def test_no_output_lands_on_the_projects_own_files(target):
    with pytest.raises(HarnessError, match="the project's own|the project ships"):
        output_file(ROOT / target, "--out-file")
    with pytest.raises(HarnessError, match="the project's own|the project ships"):
        check_target(Path(target) if (ROOT / target).exists() else ROOT / target, "--csv")


def test_an_output_folder_inside_a_package_or_git_is_refused(tmp_path):
    for folder in (ROOT / "dispatch", ROOT / ".git" / "x", ROOT / "calibrate" / "noise"):
        with pytest.raises(HarnessError, match="inside the project's own files"):
            output_dir(folder, "--out")
    with pytest.raises(HarnessError, match="--out is empty"):
        output_dir("", "--out")
    assert output_dir(tmp_path / "new", "--out") == tmp_path / "new"


@pytest.mark.parametrize("profile", sorted(p for p in PROFILES if PROFILES[p].sm_count is not None
                                           and "table" in PROFILES[p].ships))
def test_a_shipped_table_was_fitted_on_the_part_its_profile_names(profile):
    """The SM count and memory a profile names are those of the GPU its shipped table was fitted on."""
    from dispatch.profiles import variant_problem
    from dispatch.table import load_table
    fp = load_table(profile).source["fingerprint"]
    assert variant_problem(PROFILES[profile], fp["sm_count"], fp["memory_bytes"]) == ""
