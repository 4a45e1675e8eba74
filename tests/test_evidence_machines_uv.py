"""Evidence checks of docs/results-h200.md, "Machines U and V": the sweep and forward at the speed of their kernels
(issue 33) against the old method on the same lease, where the old sweep's time went (machine T's probe), and bench
e2e's captured decode step with its kernel split. Each recomputes a published figure from evidence/."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from evidence_forward import gpu_uuid

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence"
NEW_SWEEP, OLD_SWEEP = EVIDENCE / "h200-sweep-20261202T0436-7b3841", EVIDENCE / "h200-sweep-20261202T0438-6de517"
U_NEW_FW, U_OLD_FW = EVIDENCE / "h200-forward-20261202T0442-a9bbba", EVIDENCE / "h200-forward-20261202T0444-7d64de"
V_NEW_FW, V_OLD_FW = EVIDENCE / "h200-forward-20261202T0454-9426d2", EVIDENCE / "h200-forward-20261202T0456-1f34d8"
E2E_U4, E2E_U35, E2E_V4 = (EVIDENCE / f"h200-e2e-20261202T{s}" for s in ("0449-6175bb", "0450-8f1979", "0500-a24bc5"))
COSTS_T = EVIDENCE / "h200-sweep-costs-20261202-T"
FLOOR = {"graph": 0.015485734550090724, "eager": 0.1485315310046783}  # calibrate/noise/h200-forward.json


def _info(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


def _ratios(folder: Path) -> pd.DataFrame:
    """Every ok row's per-forward time over all-aten's at its (model, M, regime)."""
    d = pd.read_csv(folder / "forward.csv").query("status == 'ok'")
    aten = d[d["path"] == "aten"].set_index(["model", "m", "regime"])["us"]
    d = d[d["path"] != "aten"].set_index(["model", "m", "regime", "path"])
    return (d["us"] / aten.reindex(d.index.droplevel("path")).to_numpy()).rename("ratio").reset_index()


def _moves(a: Path, b: Path) -> pd.DataFrame:
    """Each ratio's move from run a to run b, and whether it is outside the shipped forward floor."""
    j = _ratios(a).merge(_ratios(b), on=["model", "m", "regime", "path"], suffixes=("_a", "_b"))
    j["rr"] = j["ratio_b"] / j["ratio_a"]
    j["out"] = [abs(np.log(r)) > np.log(1 + FLOOR[g]) for r, g in zip(j["rr"], j["regime"])]
    return j


@pytest.mark.evidence
def test_machines_t_u_and_v_are_new_gpus():
    earlier = {line for p in EVIDENCE.glob("*/gpu-machine-[A-S].txt") for line in p.read_text().replace(",", "\n").split()
               if line.startswith("GPU-")}
    assert len(earlier) >= 19
    mine = [gpu_uuid(f / f"gpu-machine-{m}.txt") for f, m in ((COSTS_T, "T"), (NEW_SWEEP, "U"), (V_NEW_FW, "V"))]
    assert len(set(mine)) == 3 and not set(mine) & earlier


@pytest.mark.evidence
def test_where_the_old_sweeps_time_went():
    """Machine T: a graph of 299 public cuBLASLt calls took 100-200 ms to capture, one of 2 calls 2.4-2.7 ms; a
    public cuDNN call's first use at a cell built its plan (26 ms per cell in the profile)."""
    c = pd.read_csv(COSTS_T / "sweep-costs.csv").query("n == 256 and m == 1 and path == 'flashinfer:cublaslt'")
    full, two = c[c["calls"] == 299]["capture_ms"], c[c["calls"] == 2]["capture_ms"]
    assert (round(full.min()), round(full.max())) == (101, 202) and (round(two.min(), 1), round(two.max(), 1)) == (2.4, 2.7)
    assert "100    0.004    0.000    2.604    0.026" in (COSTS_T / "prof.txt").read_text()  # build_cudnn_gemm_bf16_graph


@pytest.mark.evidence
def test_the_new_default_sweep_is_under_90_s_and_every_cell_has_a_row():
    """Machine U, `python -m bench run --gpu h200` at 7472531: 77.8 s inside the run (the old method: 188.9 s on the
    same lease); 1934 rows ok, 866 skipped with a reason, none failed; each public call's GPU time read off its lean
    twin, the dispatcher's off the path it chose."""
    new, old = _info(NEW_SWEEP), _info(OLD_SWEEP)
    assert new["status"] == old["status"] == "complete" and (new["wall_s"], old["wall_s"]) == (77.8, 188.9)
    assert new["command"] == "python -m bench run --gpu h200 --out /tmp/r/new-sweep"
    assert (NEW_SWEEP / "autotune-cache.json").read_bytes() == (OLD_SWEEP / "autotune-cache.json").read_bytes()
    df = pd.read_csv(NEW_SWEEP / "results.csv.xz")
    assert len(df) == 2800 and df["status"].value_counts().to_dict() == {"ok": 1934, "skipped": 866}
    assert df.query("status == 'skipped'")["reason"].str.len().min() > 20
    ok = df.query("status == 'ok'")
    twins = ok[ok["path"].isin(["flashinfer:cublaslt", "flashinfer:tinygemm", "dispatch"])]
    assert (twins["gpu_from"].fillna("") != "").all()
    assert "real\t1m53.473s" in (NEW_SWEEP / "sweep.log").read_text()  # the process, FlashInfer's JIT included


@pytest.mark.evidence
def test_the_new_sweep_agrees_with_the_old_and_both_pass(capsys):
    """calibrate agree old new: GPU time |b/a - 1| median 0.23%, p90 1.11% over 1926 cells; validate with the shipped
    table: PASS on both, no SLOWER cell."""
    from calibrate.__main__ import main
    assert main(["agree", str(OLD_SWEEP), str(NEW_SWEEP), "--partial"]) == 0
    out = capsys.readouterr().out
    assert "1926 cells measured ok in both runs" in out and "median 0.23%, p90 1.11%" in out
    for run in (OLD_SWEEP, NEW_SWEEP):
        assert main(["validate", str(run)]) == 0
        out = capsys.readouterr().out
        assert out.rstrip().endswith("PASS") and "SLOWER" not in out.split("max regret")[0]


@pytest.mark.evidence
def test_the_new_default_forward_and_its_settle_probes():
    """Machine V, make forward's command at b1e0715: 135.7 s inside the run; the probe found both models' M <= 128 at
    the maximum clock, every larger M power-capped (on U the 4B's M = 128 read 1935 MHz, capped)."""
    info = _info(V_NEW_FW)
    assert info["command"] == "python -m bench forward --gpu h200 --skip-slower 3 --out /tmp/g/new-forward"
    assert info["wall_s"] == 135.7 and info["settle_at"] == "capped" and _info(U_OLD_FW)["wall_s"] == 234.1
    uncapped = {(model, int(m)) for model, ms in info["settle_probes"].items() for m, p in ms.items() if not p["capped"]}
    assert uncapped == {(model, m) for model in ("Qwen3.5-35B-A3B", "Qwen3.5-4B") for m in (1, 8, 32, 128)}
    u = _info(U_NEW_FW)["settle_probes"]["Qwen3.5-4B"]["128"]
    assert u["capped"] and u["sm_mhz"] == 1935


@pytest.mark.evidence
def test_the_forward_against_the_old_method():
    """Same lease (U), no settle at uncapped M: every captured ratio at an uncapped M moved by at most 0.5%; 3 of 74
    captured points outside the floor, all at power-capped M, where both methods settle alike; 5 of 74 eager points
    outside, 3 of them the dispatcher at uncapped M. Same lease (V), the 20 ms eager settle, the 35B-A3B's
    dispatcher: no point outside the floor."""
    u = _moves(U_OLD_FW, U_NEW_FW)
    probes = _info(U_NEW_FW)["settle_probes"]
    u["capped"] = [probes[model][str(m)]["capped"] for model, m in zip(u["model"], u["m"])]
    graph = u[u["regime"] == "graph"]
    assert len(graph) == 74 and (graph[~graph["capped"]]["rr"] - 1).abs().max() < 0.005
    assert graph["out"].sum() == 3 and graph[graph["out"]]["capped"].all()
    eager = u[(u["regime"] == "eager") & u["out"]]
    assert len(eager) == 5 and len(eager[(eager["path"] == "dispatch") & ~eager["capped"]]) == 3
    v = _moves(V_OLD_FW, V_NEW_FW).query("path == 'dispatch'")
    assert len(v) == 16 and set(v["model"]) == {"Qwen3.5-35B-A3B"} and not v["out"].any()


@pytest.mark.evidence
def test_the_4b_decode_step_saves_what_its_linears_save_inside_it():
    """Machine V at b1e0715: the captured decode step 0.963 (8172 -> 7873 µs); inside it the changed linears went
    814 -> 546 µs and the rest +18 µs. On U, with CUPTI attached through the timed rounds, the same step took 13.0 ms
    stock, its samples 11.2-13.8 ms."""
    df = pd.read_csv(E2E_V4 / "e2e.csv").query("step == 'decode-graph'").set_index("variant")
    assert round(df.loc["patched", "us"] / df.loc["stock", "us"], 3) == 0.963
    assert (round(df.loc["stock", "own_kernels_us"]), round(df.loc["patched", "own_kernels_us"])) == (814, 546)
    assert round(df.loc["patched", "shared_kernels_us"] - df.loc["stock", "shared_kernels_us"]) == 18
    u = pd.read_csv(E2E_U4 / "e2e.csv").query("step == 'decode-graph' and variant == 'stock'").iloc[0]
    samples = [float(s) for s in str(u["samples_us"]).split(";")]
    assert round(u["us"]) == 13007 and (round(min(samples)), round(max(samples))) == (11197, 13844)


@pytest.mark.evidence
def test_the_whole_35b_ran_end_to_end():
    """Machine U: all 40 layers of the 35B-A3B in transformers, the layer-at-a-time fp32 reference and the kernel
    split; every row ok; the changed linears 1398 -> 895 µs inside the captured step."""
    df = pd.read_csv(E2E_U35 / "e2e.csv")
    assert set(df["status"]) == {"ok"} and "--layers" not in _info(E2E_U35)["command"]
    step = df.query("step == 'decode-graph'").set_index("variant")
    assert (round(step.loc["stock", "own_kernels_us"]), round(step.loc["patched", "own_kernels_us"])) == (1398, 895)


@pytest.mark.evidence
def test_the_dry_runs_rates(capsys):
    """bench/shard.py: U's default sweep over the 2230 cells the dry run counts for it, and P's tuning (28.78 s over 31
    tunings); the default's estimate 1.3 min, 1.8 with --tune."""
    from bench.__main__ import main
    from bench.shard import SECONDS_PER_CELL, SECONDS_PER_TUNING
    p = _info(EVIDENCE / "h200-sweep-20261201T2344-074a4c")
    assert SECONDS_PER_CELL == pytest.approx(_info(NEW_SWEEP)["wall_s"] / 2230)
    assert SECONDS_PER_TUNING == pytest.approx(p["phase_s"]["tune"] / 31)
    assert main(["run", "--gpu", "h200", "--dry-run"]) == 0
    # 2230 of U's paths, and the GEMV's 80 cells at M <= 16 since it joined the default paths
    assert capsys.readouterr().out.splitlines()[-1].startswith("  2310 cells to measure, 0 (shape, path) tunings; "
                                                                "estimated 1.3 min")
    assert main(["run", "--gpu", "h200", "--tune", "--dry-run"]) == 0
    assert "estimated 1.8 min" in capsys.readouterr().out
