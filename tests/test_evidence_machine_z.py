"""Evidence checks of docs/results-h200.md, "Machine Z": bench e2e at the final sampling (issue 35), two replicates
of the 4B, the 35B-A3B and two A/A runs on one lease. Each recomputes a published figure from evidence/."""
import json
import random
import statistics
from pathlib import Path

import pytest
from test_evidence_machines_wx import gpu_uuid, gpus_in

from calibrate.e2e_terms import load_e2e, predictions
from calibrate.forward_model import load_forward

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence"
Z4, Z_AA, Z35, Z4_B, Z_AA2 = (EVIDENCE / f"h200-e2e-20261202T{s}" for s in (
    "0656-23aaa8", "0659-14bd99", "0701-d9d96e", "0705-be5b0d", "0708-892312"))
RUNS = (Z4, Z_AA, Z35, Z4_B, Z_AA2)
EAGER = [("prefill", 8), ("prefill", 128), ("prefill", 1031), ("generate", 24)]


def _verdicts(folder: Path, forward: Path | None = None):
    return predictions(load_e2e(folder)[0], load_forward(forward)[0] if forward else None).set_index(["step", "tokens"])


@pytest.mark.evidence
def test_z_is_a_new_gpu_and_ran_the_final_code():
    earlier = gpus_in("gpu-machine-[A-Y].txt")
    z = {gpu_uuid(f / "gpu-machine-Z.txt") for f in RUNS}
    assert len(z) == 1 and not z & earlier
    for f in RUNS:
        info = json.loads((f / "run.json").read_text())
        assert info["fingerprint"]["harness_sha"].startswith("3b9db2b") and info["fingerprint"]["harness_source"] \
            == "6f2e4486a461"
        assert (info["rounds"], info["rounds_done"], info["repeats"], info["status"]) == (10, 10, 3, "complete")


@pytest.mark.evidence
def test_every_decode_step_faster_no_eager_step_slower():
    for folder, lo, hi in ((Z4, 0.960, 0.963), (Z4_B, 0.960, 0.963), (Z35, 0.968, 0.972)):
        v = _verdicts(folder)
        assert v.loc[("decode-graph", 1), "verdict"] == "FASTER" and lo < v.loc[("decode-graph", 1), "per_round"] < hi
    for folder in RUNS:
        assert set(_verdicts(folder).loc[EAGER, "verdict"]) == {"AMBIGUOUS"}, folder.name
    for folder in (Z_AA, Z_AA2):
        assert _verdicts(folder).loc[("decode-graph", 1), "verdict"] == "SAME"
        rows = load_e2e(folder)[0]
        assert (rows[rows["variant"] == "patched"]["logits_rel_err"] == 0).all()


@pytest.mark.evidence
def test_the_a_a_spread_holds_every_patched_eager_median():
    """A/A medians 0.935-1.038; the patched runs' 0.944-1.026, inside that range; the forward predicts eager gains of
    0-1.9% (4B) and 0.1-4.1% (35B-A3B)."""
    aa = [m for f in (Z_AA, Z_AA2) for m in _verdicts(f).loc[EAGER, "per_round"]]
    patched = [m for f in (Z4, Z4_B, Z35) for m in _verdicts(f).loc[EAGER, "per_round"]]
    assert (round(min(aa), 3), round(max(aa), 3)) == (0.935, 1.038)
    assert (round(min(patched), 3), round(max(patched), 3)) == (0.944, 1.026)
    four = _verdicts(Z4, EVIDENCE / "h200-tf-table-20261201T1624-E" / "forward").loc[EAGER, "predicted"]
    big = _verdicts(Z35, EVIDENCE / "h200-tf-table-35b-20261202-R" / "forward").loc[EAGER, "predicted"]
    assert (round(1 - four.max(), 3), round(1 - four.min(), 3)) == (0.0, 0.019)
    assert (round(1 - big.max(), 3), round(1 - big.min(), 3)) == (0.001, 0.041)


@pytest.mark.evidence
def test_inside_the_decode_step_and_the_time():
    four, big = _verdicts(Z4).loc[("decode-graph", 1)], _verdicts(Z35).loc[("decode-graph", 1)]
    assert (round(four["in_step_linears_saved"], 3), round(four["in_step_rest_moved"], 3)) == (0.033, 0.001)
    assert (round(big["in_step_linears_saved"], 3), round(big["in_step_rest_moved"], 3)) == (0.036, -0.005)
    real = {f: next(line.split()[1] for line in (f / "e2e.log").read_text().splitlines() if line.startswith("real"))
            for f in RUNS}
    assert real[Z35] == "3m39.189s" and sorted(real[f] for f in (Z4, Z_AA, Z4_B, Z_AA2))[::3] == ["2m20.475s",
                                                                                              "2m52.258s"]


@pytest.mark.evidence
def test_the_variant_run_first_is_not_the_faster_one():
    """A round's variant order comes from random.Random(seed 0) (bench/e2e.py): split by which variant ran first,
    the A/A runs' eager medians move both ways."""
    rng = random.Random(0)
    order = [rng.sample(("stock", "patched"), 2)[0] for _ in range(10)]
    moves = []
    for folder in (Z_AA, Z_AA2):
        rows = load_e2e(folder)[0]
        for step, n in EAGER:
            s = {r.variant: [float(x) for x in str(r.samples_us).split(";")]
                 for r in rows[(rows["step"] == step) & (rows["tokens"] == n)].itertuples()}
            ratio = [p / q for p, q in zip(s["patched"], s["stock"])]
            half = {who: statistics.median(r for r, o in zip(ratio, order) if o == who) for who in ("stock", "patched")}
            moves.append(half["patched"] - half["stock"])
    assert min(moves) < 0 < max(moves)
    rows = load_e2e(Z_AA)[0]
    gen = rows[(rows["step"] == "generate") & (rows["variant"] == "stock")]["samples_us"].iloc[0]
    seconds = [float(x) / 1e6 for x in gen.split(";")]
    assert (round(min(seconds), 2), round(max(seconds), 2)) == (1.05, 1.65)


@pytest.mark.evidence
def test_the_a_a_runs_as_controls():
    """calibrate e2e --control with both A/A runs: margins 2.6%, 3.8%, 1.9% and 6.5%; both 4B runs' prefill at 128
    tokens SAME, the other eager steps AMBIGUOUS."""
    from calibrate.e2e_terms import control_margins
    controls = [(f.name, load_e2e(f)[0]) for f in (Z_AA, Z_AA2)]
    for run in (Z4, Z4_B):
        df = load_e2e(run)[0]
        margins = control_margins(df, controls)
        assert {k: round(v, 3) for k, v in margins.items() if k[0] != "decode-graph"} == {
            ("prefill", 8): 0.026, ("prefill", 128): 0.038, ("prefill", 1031): 0.019, ("generate", 24): 0.065}
        v = predictions(df, margins=margins).set_index(["step", "tokens"])["verdict"]
        assert v[("prefill", 128)] == "SAME" and set(v[[k for k in EAGER if k != ("prefill", 128)]]) == {"AMBIGUOUS"}


@pytest.mark.evidence
def test_the_a_a_runs_table_is_the_one_bench_e2e_control_runs():
    """The A/A runs passed a table file of no ranges; bench e2e --control builds the same table in code."""
    from bench.__main__ import no_ranges
    from dispatch.profiles import get_profile
    from dispatch.table import load_table
    built = no_ranges(get_profile("h200"))
    for folder in (Z_AA, Z_AA2):
        filed = load_table(path=folder / "empty-table.json")
        assert (filed.profile, filed.low_m_backend, filed.default, filed.shapes, filed.tactics) == (
            built.profile, built.low_m_backend, built.default, built.shapes, built.tactics)
