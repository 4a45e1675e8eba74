"""Evidence checks of docs/results-h200.md, "Machine O": the host cost before and after the torch-free package, the
same-table forward, and the fresh default sweep and forward with the shipped table. Each recomputes a published
figure from evidence/; `make evidence` runs them."""
import json
from pathlib import Path

import pandas as pd
import pytest
from evidence_forward import dispatch_over_aten

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence"
LEASE = EVIDENCE / "h200-dispatcher-split-20261201-O"
SWEEP = EVIDENCE / "h200-sweep-20261201T2255-3eb9e3"
FORWARD = EVIDENCE / "h200-forward-20261201T2258-924475"
# the table shipped while machine O ran (run f's), with its tactics beside it
RUN_F_TABLE = EVIDENCE / "h200-table-h200-20261201f" / "table.json"
BIND = "dispatch.bind [C++]"
BIND_LEAN = "dispatch.bind (the table's eager choice) [C++]"


@pytest.mark.evidence
def test_the_cpp_bound_layer_cost_the_same_before_and_after_the_split():
    """Medians over the shapes, C++ bound layer over F.linear: inside the table's F.linear ranges, above them, and at
    M = 8 where the table's eager choice is lean TinyGEMM, per arm and round."""
    from dispatch.table import load_table
    table = load_table(path=RUN_F_TABLE)
    got = {}
    for arm in ("before-1", "after-1", "before-2", "after-2"):
        d = pd.read_csv(LEASE / f"{arm}.csv")
        lean = d[(d["part"] == "lean") & (d["path"] == BIND_LEAN)]
        tiny = lean[[table.choose(int(n), int(k), int(m), "eager") == "flashinfer-lean:tinygemm"
                     for n, k, m in zip(lean["n"], lean["k"], lean["m"])]]
        got[arm] = (round(d[(d["part"] == "aten-both") & (d["path"] == BIND)]["ratio"].median(), 3),
                    round(d[(d["part"] == "above") & (d["path"] == BIND)]["ratio"].median(), 3),
                    len(tiny), round(tiny["ratio"].median(), 3))
    assert got == {"before-1": (0.993, 0.998, 10, 0.49), "after-1": (1.001, 0.999, 10, 0.498),
                   "before-2": (0.998, 0.999, 10, 0.512), "after-2": (0.999, 0.992, 10, 0.514)}


@pytest.mark.evidence
def test_the_same_table_forward_before_and_after():
    """Dispatcher / all-aten, after over before: graph within 0.986-1.003 in both rounds; round 2's eager 0.826-1.016;
    the same per-layer choices in all four runs; round 1's before arm measured all-aten eagerly at 6.1-6.6 ms."""
    r1 = dispatch_over_aten(LEASE / "st-after") / dispatch_over_aten(LEASE / "st-before")
    r2 = dispatch_over_aten(LEASE / "st-after-2") / dispatch_over_aten(LEASE / "st-before-2")
    assert (round(r1["graph"].min(), 3), round(r1["graph"].max(), 3)) == (0.992, 1.003)
    assert (round(r2["graph"].min(), 3), round(r2["graph"].max(), 3)) == (0.986, 1.003)
    assert (round(r2["eager"].min(), 3), round(r2["eager"].max(), 3)) == (0.826, 1.016)
    used = [pd.read_csv(LEASE / f / "forward.csv").query("path == 'dispatch'").set_index(["regime", "m"])["paths_used"]
            for f in ("st-before", "st-after", "st-after-2", "st-before-2")]
    assert all(u.equals(used[0]) for u in used)
    slow = pd.read_csv(LEASE / "st-before" / "forward.csv").query("path == 'aten' and regime == 'eager' and m <= 512")
    assert (round(slow["us"].min() / 1e3, 1), round(slow["us"].max() / 1e3, 1)) == (6.1, 6.6)


@pytest.mark.evidence
def test_the_fresh_default_sweep_and_forward_with_the_shipped_table(tmp_path, capsys):
    """The sweep's time and cells; run f's table (shipped then) FAILs on two cells, where this machine's own cuBLASLt
    tactic is not the table's; make forward's time; 35B-A3B at M = 1, 0.653x captured and 0.573x eagerly."""
    from calibrate.__main__ import main
    info = json.loads((SWEEP / "run.json").read_text())
    assert round(info["wall_s"], 1) == 182.2
    csv = tmp_path / "v.csv"
    assert main(["validate", str(SWEEP), "--table", str(RUN_F_TABLE), "--forward", str(FORWARD), "--csv",
                 str(csv)]) == 1
    said = capsys.readouterr().out
    assert ("at 2 of them this run tuned other tactics than the table's" in said
            and "12288x2560 M=2 CublasltBf16GemmRunner 1 (table: 2); 1x2048 M=64 CublasltBf16GemmRunner 1 (table: 0)"
            in said)
    v = pd.read_csv(csv)
    slower = {(int(r.n), int(r.k), int(r.m)) for r in v.itertuples() if r.verdict == "SLOWER"}
    assert slower == {(1, 2048, 64), (12288, 2560, 2)}
    own = json.loads((SWEEP / "autotune-cache.json").read_text())
    shipped = json.loads(RUN_F_TABLE.with_name("table.autotune.json").read_text())
    for n, k, m in slower:
        key = next(key for key in shipped if "Cublaslt" in key and f"(({m}, {k}), ({k}, {n})," in key)
        assert own[key][1] != shipped[key][1]
    assert round(json.loads((FORWARD / "run.json").read_text())["wall_s"], 1) == 229.0
    fw = pd.read_csv(FORWARD / "forward.csv").query("model == 'Qwen3.5-35B-A3B' and m == 1 and status == 'ok'")
    us = fw.set_index(["regime", "path"])["us"]
    over_aten = {regime: round(us[regime, "dispatch"] / us[regime, "aten"], 3) for regime in ("graph", "eager")}
    assert over_aten == {"graph": 0.653, "eager": 0.573}
