"""Evidence checks of docs/results-h200.md, "Machines W and X": the default forward against the old method on one
lease (issue 33), and bench e2e's sampling, its verdicts and its A/A control (issue 35). Each recomputes a published
figure from evidence/."""
import json
from pathlib import Path

import pytest
from test_evidence_machines_uv import _info, _moves

from calibrate.e2e_terms import load_e2e, predictions

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence"
W_NEW_FW, W_OLD_FW = EVIDENCE / "h200-forward-20261202T0540-12411b", EVIDENCE / "h200-forward-20261202T0543-d51db5"
W4, W35, X4, X_AA, X4_ONE, X35 = (EVIDENCE / f"h200-e2e-20261202T{s}" for s in (
    "0550-4e9f18", "0552-915952", "0559-0ad85e", "0601-3b87b6", "0602-801696", "0604-36e712"))


def gpu_uuid(path: Path) -> str:
    """The GPU UUID in a gpu-machine-*.txt file (nvidia-smi's CSV, whatever its column order)."""
    return next(t for t in path.read_text().replace(",", " ").split() if t.startswith("GPU-"))


def gpus_in(pattern: str) -> set[str]:
    """Every GPU UUID in the evidence/*/<pattern> files (gpu-machine-*.txt)."""
    return {t for p in EVIDENCE.glob(f"*/{pattern}") for t in p.read_text().replace(",", " ").split()
            if t.startswith("GPU-")}


def _verdicts(folder: Path):
    return predictions(load_e2e(folder)[0]).set_index(["step", "tokens"])


@pytest.mark.evidence
def test_machines_w_and_x_are_new_gpus():
    earlier = gpus_in("gpu-machine-[A-V].txt")
    w, x = gpu_uuid(W_NEW_FW / "gpu-machine-W.txt"), gpu_uuid(X4 / "gpu-machine-X.txt")
    assert w != x and not {w, x} & earlier
    assert {gpu_uuid(f / "gpu-machine-W.txt") for f in (W_OLD_FW, W4, W35)} == {w}
    assert {gpu_uuid(f / "gpu-machine-X.txt") for f in (X_AA, X4_ONE, X35)} == {x}


@pytest.mark.evidence
def test_the_forward_against_the_old_method_on_one_lease():
    """W: 154 s in the run (the old method 229 s); captured, no point outside the floor (uncapped M within 0.35%);
    eagerly 5 of 74 outside the floor, a 95% quantile of replicate runs' moves: 3 are vLLM's op with TinyGEMM,
    whose eager forward is ~6-7x all-aten's, 2 the 4B's dispatcher at M = 8 and 128."""
    assert (_info(W_NEW_FW)["wall_s"], _info(W_OLD_FW)["wall_s"]) == (154.3, 229.2)
    j = _moves(W_OLD_FW, W_NEW_FW)
    probes = _info(W_NEW_FW)["settle_probes"]
    j["capped"] = [probes[model][str(m)]["capped"] for model, m in zip(j["model"], j["m"])]
    graph, eager = j[j["regime"] == "graph"], j[j["regime"] == "eager"]
    assert len(graph) == len(eager) == 74 and not graph["out"].any()
    assert (graph[~graph["capped"]]["rr"] - 1).abs().max() < 0.0035
    out = eager[eager["out"]]
    assert sorted(out["path"]) == ["dispatch"] * 2 + ["vllm-op:tinygemm"] * 3
    assert set(out["model"]) == {"Qwen3.5-4B"} and sorted(out[out["path"] == "dispatch"]["m"]) == [8, 128]


@pytest.mark.evidence
def test_the_captured_decode_step_gains_what_its_linears_gain_inside_it():
    """4B on W and X, 35B-A3B on W and X (CUPTI detached): every decode step FASTER, 0.961-0.962 (4B) and
    0.969-0.972 (35B-A3B); inside the 4B's step the changed linears saved 3.3% and the rest moved 0.0%."""
    for folder, lo, hi in ((W4, 0.961, 0.963), (X4, 0.961, 0.963), (X4_ONE, 0.960, 0.963), (W35, 0.968, 0.973),
                           (X35, 0.968, 0.973)):
        step = _verdicts(folder).loc[("decode-graph", 1)]
        assert step["verdict"] == "FASTER" and lo < step["measured"] < hi, folder.name
    four = _verdicts(X4).loc[("decode-graph", 1)]
    assert round(four["in_step_linears_saved"], 3) == 0.033 and abs(four["in_step_rest_moved"]) < 0.0005


@pytest.mark.evidence
def test_three_calls_per_sample_narrow_the_eager_intervals_and_the_a_a_run_is_never_slower():
    """X, one lease: with the fastest of 3 calls per sample the 4B's eager intervals are 0.040-0.058 wide, with one
    call 0.106-0.141; no eager step is SLOWER in either, nor in the A/A control (a table of no ranges), whose
    decode step is SAME and whose logits equal the stock model's."""
    eager = [("prefill", 8), ("prefill", 128), ("prefill", 1031), ("generate", 24)]
    three, one, aa = (_verdicts(f).loc[eager] for f in (X4, X4_ONE, X_AA))
    w3, w1 = (three["hi"] - three["lo"]), (one["hi"] - one["lo"])
    assert w3.max() < 0.06 and w1.min() > 0.1
    assert "SLOWER" not in set(three["verdict"]) | set(one["verdict"]) | set(aa["verdict"])
    assert _verdicts(X_AA).loc[("decode-graph", 1), "verdict"] == "SAME"
    rows = load_e2e(X_AA)[0]
    assert (rows[rows["variant"] == "patched"]["logits_rel_err"] == 0).all()
    assert json.loads((X4_ONE / "run.json").read_text())["repeats"] == 1


@pytest.mark.evidence
def test_the_one_call_runs_that_said_slower():
    """With one call per sample and the variants in separate blocks, W's 4B prefill at 128 tokens was SLOWER
    (1.059 [1.023, 1.195]), and X's 35B-A3B generate, 3 calls per sample in blocks of 12 s, SLOWER (1.084
    [1.012, 1.322]), where W's was 0.919 [0.841, 1.008]: one-run intervals of eager steps understate the noise
    between runs."""
    w4 = _verdicts(W4).loc[("prefill", 128)]
    assert w4["verdict"] == "SLOWER" and round(w4["per_round"], 3) == 1.059
    x35, w35 = _verdicts(X35).loc[("generate", 24)], _verdicts(W35).loc[("generate", 24)]
    assert x35["verdict"] == "SLOWER" and round(x35["per_round"], 3) == 1.084
    assert w35["verdict"] == "AMBIGUOUS" and round(w35["per_round"], 3) == 0.919 and w35["hi"] < x35["lo"]
