"""A broken shipped table says so at the first bind: with the GPU's identity faked on a CPU machine, each kind of
damage to the shipped table or the files it names is one HarnessError naming the file, never F.linear in silence; a
GPU with no table, or another part than the table was fitted on, runs F.linear and says so once."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import dispatch
import dispatch.layers as layers
import harness.shipped as shipped
from dispatch.lean import _WARNED
from harness.errors import HarnessError

SHIPPED = Path(dispatch.__file__).parent / "thresholds"
H200_PARTS = SimpleNamespace(multi_processor_count=132, total_memory=143771 << 20)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A copy of the shipped tables as the installation's, and a GPU named as the test says."""
    folder = tmp_path / "dispatch" / "thresholds"
    shutil.copytree(SHIPPED, folder)
    monkeypatch.setattr(shipped, "PACKAGES", tmp_path)
    import torch
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: H200_PARTS)
    _WARNED.clear()
    dispatch.reset()
    yield folder
    dispatch.reset()


def _gpu(monkeypatch, name: str, sm: int = 90) -> None:
    monkeypatch.setattr(layers, "this_gpu", lambda index: (name, sm))


def _edit(folder: Path, edit) -> None:
    data = json.loads((folder / "h200.json").read_text())
    edit(data)
    (folder / "h200.json").write_text(json.dumps(data))


def _gemv_upto(up: int):
    def edit(data):
        data["shapes"][0]["graph"] = [{"up_to": up, "path": "triton:gemv"}]
    return edit


DAMAGE = [
    ("truncated", lambda f: (f / "h200.json").write_text((f / "h200.json").read_text()[:500]), "not valid JSON"),
    ("empty", lambda f: (f / "h200.json").write_text(""), "not valid JSON"),
    ("not JSON", lambda f: (f / "h200.json").write_text("table"), "not valid JSON"),
    ("a list", lambda f: (f / "h200.json").write_text("[]"), "a threshold table is a JSON object"),
    ("format 3", lambda f: _edit(f, lambda d: d.update(format=3)), "format 3"),
    ("unknown path", lambda f: _edit(f, lambda d: d["default"]["graph"].append({"up_to": 16384, "path": "x"})),
     "not one the dispatcher can run"),
    ("GEMV up to 32", lambda f: _edit(f, _gemv_upto(32)), "takes M <= 16"),
    ("decreasing ranges", lambda f: _edit(f, lambda d: d["shapes"][0].update(
        graph=[{"up_to": 8, "path": "aten"}, {"up_to": 4, "path": "aten"}])), "increasing"),
    ("a folder", lambda f: ((f / "h200.json").unlink(), (f / "h200.json").mkdir()), "is a folder"),
    ("a symlink loop", lambda f: ((f / "h200.json").unlink(), os.symlink(f / "h200.json", f / "h200.json")),
     "h200.json"),
    ("/dev/zero", lambda f: ((f / "h200.json").unlink(), os.symlink("/dev/zero", f / "h200.json")),
     "not a regular file"),
    ("missing", lambda f: (f / "h200.json").unlink(), "ships a threshold table"),
    ("other GEMV file", lambda f: (f / "h200.autotune.gemv.json").write_text(
        (f / "h200.autotune.gemv.json").read_text().replace('"configs": [', '"configs": [ ')), "sha256 differs"),
    ("no GEMV file", lambda f: (f / "h200.autotune.gemv.json").unlink(), "GEMV configurations .* which is missing"),
    ("GEMV ranges, no configurations", lambda f: _edit(f, lambda d: d["source"].pop("gemv_configs")),
     "names no GEMV configurations"),
    ("no tactics", lambda f: (f / "h200.autotune.json").unlink(), "FlashInfer tactics .* which is missing"),
    ("tactics not JSON", lambda f: (f / "h200.autotune.json").write_text("x"), "sha256 differs"),
]


@pytest.mark.parametrize("damage, needle", [pytest.param(d, n, id=i) for i, d, n in DAMAGE])
def test_a_damaged_shipped_table_is_one_error_at_the_first_bind(damage, needle, site, monkeypatch):
    damage(site)
    _gpu(monkeypatch, "NVIDIA H200")
    with pytest.raises(HarnessError, match=needle):
        layers._device(0)


def test_the_intact_shipped_table_serves(site, monkeypatch, capsys):
    _gpu(monkeypatch, "NVIDIA H200")
    table, sm, _ = layers._device(0)
    assert table is not None and table.profile == "h200" and sm == 90
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name, sm, parts, needle", [
    ("NVIDIA H100 80GB HBM3", 90, SimpleNamespace(multi_processor_count=132, total_memory=81559 << 20), None),
    ("NVIDIA H100 NVL", 90, SimpleNamespace(multi_processor_count=132, total_memory=95830 << 20),
     "132 SMs and 94 GiB, where the h100 table was fitted on 132 SMs and 80 GB"),
    ("NVIDIA RTX 6000 Ada Generation", 89, H200_PARTS, "no GPU profile describes NVIDIA RTX 6000 Ada Generation"),
    ("NVIDIA H100 PCIe", 90, SimpleNamespace(multi_processor_count=114, total_memory=81559 << 20),
     "114 SMs and 80 GiB, where the h100 table was fitted on 132 SMs"),
    ("NVIDIA H200 NVL", 90, SimpleNamespace(multi_processor_count=132, total_memory=143771 << 20), None),
    ("NVIDIA H200", 90, SimpleNamespace(multi_processor_count=16, total_memory=18 << 30),
     "16 SMs and 18 GiB, where the h200 table was fitted on 132 SMs"),  # a MIG slice
])
def test_a_gpu_without_a_table_of_its_part_runs_f_linear_and_says_so_once(name, sm, parts, needle, site,
                                                                          monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: parts)
    _gpu(monkeypatch, name, sm)
    table = layers._device(0)[0]
    layers._STATE.devices.clear()
    layers._device(0)
    err = capsys.readouterr().err.strip().splitlines()
    if needle is None:  # same name, same parts: served
        assert table is not None and err == []
        return
    assert table is None and len(err) == 1 and needle in err[0] and "make table GPU=" in err[0]
