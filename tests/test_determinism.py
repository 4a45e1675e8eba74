"""Determinism and batch invariance as measured properties: bench's per-cell probe, the per-path summary validate
prints and the fit records, and the dispatcher's deterministic mode, which chooses only among the paths measured
repeatable (on small fixtures and fake calls: no GPU here)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.errors import HarnessError

ROOT = Path(__file__).resolve().parent.parent


def test_the_probe_tells_a_repeatable_call_from_one_that_is_not():
    from bench.gpu import determinism
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    plain = lambda a, b: (a[:, None, :] * b[None]).sum(-1)  # noqa: E731  (each row on its own)
    assert determinism(plain, x, w, plain(x, w)) == (True, True)
    calls = iter(range(100))
    drifting = lambda a, b: a @ b.t() + next(calls) * 1e-3  # noqa: E731  (another sum each call)
    first = drifting(x, w)
    assert determinism(drifting, x, w, first)[0] is False
    by_rows = lambda a, b: a @ b.t() + (a.shape[0] == 1)  # noqa: E731  (another kernel at M = 1)
    assert determinism(by_rows, x, w, by_rows(x, w)) == (True, False)


def _run(rows):
    return pd.DataFrame(rows, columns=["n", "k", "m", "path", "status", "repeatable", "batch_invariant"])


def test_the_summary_per_path_counts_the_measured_cells_and_the_fit_records_it():
    from calibrate.determinism import by_path, lines, source_entry
    df = _run([(64, 64, 1, "aten", "ok", "True", "True"), (64, 64, 8, "aten", "ok", "True", "False"),
               (64, 64, 1, "triton:gemv", "ok", "True", "True"), (64, 64, 8, "triton:gemv", "ok", "False", "False"),
               (64, 64, 16, "triton:gemv", "failed", "", ""), (64, 64, 32, "dispatch", "ok", "", "")])
    table = by_path(df).set_index("path")
    assert table.loc["aten"].tolist() == [2, 2, 1] and table.loc["triton:gemv"].tolist() == [2, 1, 1]
    assert "dispatch" not in table.index  # no flag recorded: not counted as either
    assert any("triton:gemv" in line and "repeatable 1/2" in line for line in lines(df))
    assert source_entry(df) == {"aten": {"repeatable": True, "batch_invariant": False, "cells": 2},
                                "triton:gemv": {"repeatable": False, "batch_invariant": False, "cells": 2}}
    assert set(source_entry(df)) == {"aten", "triton:gemv"}
    old = df.drop(columns=["repeatable", "batch_invariant"])  # a run from before they were measured
    assert source_entry(old) is None and "not measured" in lines(old)[0]


def _table(determinism=None):
    from dispatch.table import parse_table
    data = json.loads((ROOT / "dispatch" / "thresholds" / "h200.json").read_text())
    if determinism is not None:
        data["source"]["determinism"] = determinism
    else:
        data["source"].pop("determinism", None)
    return parse_table(data, "t")


def test_deterministic_mode_keeps_only_the_paths_measured_repeatable():
    table = _table({"triton:gemv": {"repeatable": True, "batch_invariant": False, "cells": 40},
                    "flashinfer-lean:tinygemm": {"repeatable": False, "batch_invariant": False, "cells": 40}})
    kept = table.deterministic()
    assert "flashinfer-lean:tinygemm" not in kept.paths() and "triton:gemv" in kept.paths()
    assert kept.paths() <= {"aten", "triton:gemv"}
    for (n, k), own in kept.shapes.items():
        for regime, ranges in own.items():
            assert all(a[1] != b[1] for a, b in zip(ranges, ranges[1:]))  # neighbouring F.linear ranges merged
            assert ranges[-1][0] == table.shapes[(n, k)][regime][-1][0]  # the same M covered
    with pytest.raises(HarnessError, match="records no determinism measurements"):
        _table().deterministic()


def test_the_dispatcher_in_deterministic_mode_serves_the_restricted_table(tmp_path, monkeypatch):
    import dispatch
    import dispatch.layers as layers
    import harness.shipped as shipped
    from types import SimpleNamespace
    folder = tmp_path / "dispatch" / "thresholds"
    folder.mkdir(parents=True)
    for name in ("h200.autotune.json", "h200.autotune.gemv.json"):
        (folder / name).write_bytes((ROOT / "dispatch" / "thresholds" / name).read_bytes())
    data = json.loads((ROOT / "dispatch" / "thresholds" / "h200.json").read_text())
    data["source"]["determinism"] = {"triton:gemv": {"repeatable": True, "batch_invariant": False, "cells": 1}}
    (folder / "h200.json").write_text(json.dumps(data))
    monkeypatch.setattr(shipped, "PACKAGES", tmp_path)
    monkeypatch.setattr(layers, "this_gpu", lambda index: ("NVIDIA H200", 90))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(multi_processor_count=132, total_memory=143771 << 20))
    try:
        dispatch.deterministic(True)
        assert layers._device(0)[0].paths() <= {"aten", "triton:gemv"}
        dispatch.deterministic(False)
        assert "flashinfer-lean:tinygemm" in layers._device(0)[0].paths()
        data["source"].pop("determinism")
        (folder / "h200.json").write_text(json.dumps(data))
        dispatch.deterministic(True)
        with pytest.raises(HarnessError, match="records no determinism measurements"):
            layers._device(0)
    finally:
        dispatch.deterministic(False)
        dispatch.reset()
