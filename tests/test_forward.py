"""CPU tests of measured forwards: the layer sequence, the forward-path rules and the cell-sum model of a forward."""
import contextlib
import json
from pathlib import Path

import pandas as pd
import pytest

from bench.forward_paths import Target, check_rules, path_for
from calibrate.analysis import Cells
from calibrate.forward_model import forward_verdicts, load_forward, model_vs_measured, modelled_us
from dispatch.profiles import get_profile
from dispatch.table import ThresholdTable, load_table
from harness.errors import HarnessError
from shapes.catalog import model_configs, model_layers
from shapes.derive import ForwardLinear, forward_sequence, load_config

DATA = Path(__file__).parent / "data"
ROOT = DATA.parent.parent
EVIDENCE = ROOT / "evidence"  # the runs behind docs/results-h200.md


def _filed(name: str) -> Path:
    """A committed run: in evidence/ where only evidence tests read it, in tests/data/ where a fixture is."""
    return EVIDENCE / name if (EVIDENCE / name).is_dir() else DATA / name


H200 = get_profile("h200")


@pytest.mark.parametrize("model", ["Qwen3.5-4B", "Qwen3.5-35B-A3B"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_forward_holds_exactly_the_catalog_counts(model, tp):
    seq = forward_sequence(load_config(model_configs()[model]), model, tp)
    counts = {}
    for lin in seq:
        counts[(lin.layer, lin.n, lin.k)] = counts.get((lin.layer, lin.n, lin.k), 0) + 1
    assert counts == {(l.layer, l.n, l.k): l.count for l in model_layers(model, tp)}
    assert seq[-1].layer == "lm_head" and [lin.index for lin in seq[:-1]] == sorted(lin.index for lin in seq[:-1])


def test_the_sequence_runs_layer_by_layer_in_order():
    seq = forward_sequence(load_config(model_configs()["Qwen3.5-4B"]), "Qwen3.5-4B")
    first = [lin.layer for lin in seq if lin.index == 0]
    full = [lin.layer for lin in seq if lin.index == 3]  # full_attention_interval 4: layer 3 is full attention
    assert first == ["linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj",
                     "mlp.gate_up_proj", "mlp.down_proj"]
    assert full == ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]


def test_a_qwen3_next_style_config_and_a_layer_limit(tmp_path):
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16,
           "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "vocab_size": 151936,
           "full_attention_interval": 4, "num_experts": 512, "shared_expert_intermediate_size": 512,
           "decoder_sparse_step": 1, "mlp_only_layers": [5], "intermediate_size": 5120}
    seq = forward_sequence(cfg, "next", 1)
    kinds = {lin.index: lin.layer for lin in seq if lin.layer.startswith(("self_attn.qkv", "linear_attn.in_proj_qkvz"))}
    assert [i for i, name in kinds.items() if name.startswith("self_attn")] == [3, 7]
    assert [lin.layer for lin in seq if lin.index == 5][-2:] == ["mlp.gate_up_proj", "mlp.down_proj"]  # mlp_only layer
    assert ("mlp.gate", 512, 2048) in {(lin.layer, lin.n, lin.k) for lin in seq if lin.index == 0}
    two = forward_sequence(cfg, "next", 1, decoder_layers=2)
    assert {lin.index for lin in two} == {0, 1, -1} and len(two) == 2 * 7 + 1


def test_forward_rules_on_the_h200():
    lin = ForwardLinear(0, "linear_attn.out_proj", 2560, 4096)
    gate = ForwardLinear(0, "mlp.shared_expert_gate", 1, 2048)
    head = ForwardLinear(-1, "lm_head", 248320, 2560)
    table = load_table(path=DATA / "h200-table-format1.json")
    # vLLM 0.33 on SM90: the flag is unsupported, so the default, the flag and the seed PR all run F.linear
    for rule in ("vllm-default", "vllm-flag", "seed-pr"):
        assert {path_for(rule, x, m, Target(90, H200, table)) for x in (lin, gate, head) for m in (1, 8, 32, 64)} == {"aten"}
    assert path_for("flashinfer-everywhere", lin, 8, Target(90, H200, table)) == "flashinfer:tinygemm"  # the hypothetical
    assert path_for("flashinfer-everywhere", gate, 8, Target(90, H200, table)) == "flashinfer:cublaslt"  # N = 1: no TinyGEMM
    assert path_for("flashinfer-everywhere", lin, 64, Target(90, H200, table)) == "flashinfer:cublaslt"
    assert path_for("flashinfer-everywhere", head, 8, Target(90, H200, table)) == "aten"  # vLLM's LM head is F.linear
    assert path_for("vllm-op:tinygemm", lin, 8, Target(90, H200, table)) == "vllm-op:tinygemm"
    t16 = ThresholdTable.from_thresholds("h200", "tinygemm", 16)
    assert path_for("dispatch", lin, 8, Target(90, H200, t16)) == "flashinfer-lean:tinygemm"
    assert path_for("dispatch", gate, 8, Target(90, H200, t16)) == "aten"
    both = ThresholdTable("h200", "tinygemm", {"graph": ((16, "flashinfer-lean:tinygemm"),), "eager": ()})
    assert path_for("dispatch", lin, 8, Target(90, H200, both), "graph") == "flashinfer-lean:tinygemm"
    assert path_for("dispatch", lin, 8, Target(90, H200, both), "eager") == "aten"
    assert path_for("table-direct", lin, 8, Target(90, H200, both), "graph") == "flashinfer-lean:tinygemm"  # per regime
    assert path_for("table-direct", lin, 8, Target(90, H200, both), "eager") == "aten"
    assert path_for("table-direct", head, 8, Target(90, H200, both), "graph") == "aten"
    gemv = ThresholdTable("h200", "tinygemm", {"graph": ((8, "triton:gemv"), (16, "flashinfer-lean:tinygemm")),
                                               "eager": ()})
    assert path_for("table-direct", lin, 4, Target(90, H200, gemv), "graph") == "triton:gemv"
    assert path_for("table-pdl", lin, 4, Target(90, H200, gemv), "graph") == "triton:gemv-pdl"  # the GEMV with PDL
    assert path_for("table-pdl", lin, 12, Target(90, H200, gemv), "graph") == "flashinfer-lean:tinygemm"  # the rest
    assert path_for("table-pdl", lin, 4, Target(90, H200, gemv), "eager") == "aten"
    assert path_for("table-plain", lin, 4, Target(90, H200, gemv), "graph") == "triton:gemv-plain"  # no PDL
    assert path_for("table-plain", lin, 12, Target(90, H200, gemv), "graph") == "flashinfer-lean:tinygemm"
    assert path_for("flashinfer:tinygemm", lin, 8, Target(90, H200, table)) == "flashinfer:tinygemm"  # a registry path...
    assert path_for("flashinfer:tinygemm", head, 8, Target(90, H200, table)) == "aten"  # ...but not on vLLM's LM head
    assert path_for("flashinfer:tinygemm", head, 8, Target(90, H200, table, paths_run_lm_head=True)) == "flashinfer:tinygemm"
    b200 = get_profile("b200")
    assert path_for("flashinfer-everywhere", lin, 4096, Target(100, b200, None)) == "flashinfer:cute-dsl"  # own fallback
    # vLLM 0.33 on SM100: the flag runs its op with cute-dsl at every M; the seed PR only at M <= 32
    assert path_for("vllm-flag", lin, 4096, Target(100, b200, None)) == "vllm-op:cute-dsl"
    assert path_for("vllm-flag", lin, 1, Target(100, b200, None)) == "vllm-op:cute-dsl"
    assert path_for("vllm-flag", head, 1, Target(100, b200, None)) == "aten"
    assert path_for("vllm-flag", ForwardLinear(0, "x", 2560, 4000), 1, Target(100, b200, None)) == "aten"  # K % 128
    assert path_for("seed-pr", lin, 32, Target(100, b200, None)) == "vllm-op:cute-dsl"
    assert path_for("seed-pr", lin, 33, Target(100, b200, None)) == "aten"
    assert path_for("vllm-default", lin, 8, Target(100, b200, None)) == "aten"
    with pytest.raises(HarnessError, match="unknown forward path"):
        check_rules(["aten", "fast"])


def test_the_model_of_an_aten_forward_is_the_sum_of_its_cells():
    from bench.results import load_results
    df = load_results(DATA / "h200-sweep")
    cells = Cells.from_results(df)
    seq = forward_sequence(load_config(model_configs()["Qwen3.5-4B"]), "Qwen3.5-4B")
    ok = df[(df["status"] == "ok") & (df["path"] == "aten") & (df["m"] == 128)].set_index(["n", "k"])["gpu_us"]
    by_hand = sum(l.count * ok[(l.n, l.k)] for l in model_layers("Qwen3.5-4B"))
    assert modelled_us(cells, seq, "aten", 128, "graph", 90, H200, None) == pytest.approx(by_hand)


def _forward_dir(tmp_path, rows, **info):
    d = tmp_path / "fw"
    d.mkdir()
    pd.DataFrame(rows).to_csv(d / "forward.csv", index=False)
    run = {"kind": "forward", "models": ["Qwen3.5-4B"], "ms": [8, 4096], "paths": ["aten", "dispatch"],
           "regimes": ["graph", "eager"], "status": "complete", "tp": 1, "decoder_layers": None, "lm_head": True,
           "fingerprint": {"gpu_name": "NVIDIA H200", "sm": 90}, "profile": "h200", **info}
    (d / "run.json").write_text(json.dumps(run))
    return d


def _rows(dispatch_factor=1.0):
    rows = []
    for m in (8, 4096):
        for regime in ("graph", "eager"):
            for path, f in (("aten", 1.0), ("dispatch", dispatch_factor)):
                rows.append({"model": "Qwen3.5-4B", "tp": 1, "m": m, "path": path, "regime": regime, "status": "ok",
                             "us": 1000.0 * f, "linears": 153,
                             "samples_us": ";".join(f"{1000.0 * f * (1 + d):.3f}" for d in (0, .001, -.001))})
    return rows


def test_measured_forward_verdicts_and_the_model_beside_them(tmp_path):
    from bench.results import load_results
    d = _forward_dir(tmp_path, _rows(1.02))
    fdf, info = load_forward(d)
    v = forward_verdicts(fdf, capture_size=512).set_index(["m", "regime"])
    assert len(v) == 4  # both regimes at every M
    assert v.loc[(8, "graph"), "vllm_regime"] and v.loc[(4096, "eager"), "vllm_regime"]
    assert not v.loc[(8, "eager"), "vllm_regime"]
    assert not v["ok"].any() and (v["best"] == "aten").all()
    assert v["dispatch_over_aten"].tolist() == pytest.approx([1.02] * 4)
    # the dispatcher's choices called without the bound layer are no single path: never the verdict's best
    direct = [{**r, "path": "table-direct", "us": 900.0,
               "samples_us": ";".join(f"{900 * (1 + d):.3f}" for d in (0, .001, -.001))}
              for r in _rows() if r["path"] == "aten"]
    v2 = forward_verdicts(pd.concat([fdf, pd.DataFrame(direct)]), capture_size=512)
    assert (v2["best"] == "aten").all()
    # ...and it splits the ratio: the table's choices alone 0.9x the best, the binding 1.02 / 0.9 of them
    assert v2["choices_over_best"].tolist() == pytest.approx([0.9] * 4)
    assert v2["binding_cost"].tolist() == pytest.approx([1.02 / 0.9] * 4)
    assert v["binding_cost"].isna().all()  # not measured: no split
    cells = Cells.from_results(load_results(DATA / "h200-sweep"))
    mv = model_vs_measured(cells, fdf, info, H200, load_table(path=DATA / "h200-table-format1.json"))
    assert len(mv) == 8 and mv["modelled_us"].notna().all() and "miss" in mv


@pytest.mark.parametrize("edit, needle", [
    (lambda rows, info: (rows[:-1], info), "missing"),
    (lambda rows, info: (rows + rows[:1], info), "twice"),
    (lambda rows, info: ([{**r, "us": -1.0} for r in rows], info), "non-positive"),
    (lambda rows, info: (rows, {**info, "kind": "sweep"}), "not a forward run"),
    (lambda rows, info: (rows, {**info, "status": "interrupted"}), "interrupted"),
])
def test_bad_forward_results_are_one_clear_error(tmp_path, edit, needle):
    rows, info = edit(_rows(), {})
    d = _forward_dir(tmp_path, rows, **info)
    with pytest.raises(HarnessError, match=needle):
        load_forward(d)


def test_identical_captured_forwards_pool_their_ratios_and_measure_the_noise():
    """dispatch and table-direct replaying the same kernels (one kernel_digest) in the graph regime are two
    measurements of one forward: the ratio to best is their geometric mean with an interval spanning both, and their
    own ratio is reported as noise. Eager rows, other digests and runs without digests are judged as before."""
    from calibrate.forward_model import null_pair_spread

    def rows(digest_td: str, regime: str = "graph"):
        out = []
        for path, base, digest in (("aten", 1000.0, "a"), ("flashinfer-lean:cublaslt", 980.0, "c"),
                                   ("dispatch", 1000.0, "t"), ("table-direct", 985.0, digest_td)):
            samples = [base * (1 + 0.001 * (i % 3)) for i in range(6)]
            out.append({"model": "Qwen3.5-4B", "tp": 1, "m": 16384, "path": path, "regime": regime, "status": "ok",
                        "us": base, "linears": 153, "kernel_digest": digest,
                        "samples_us": ";".join(f"{v:.1f}" for v in samples)})
        return pd.DataFrame(out)

    same = forward_verdicts(rows("t"), 512).iloc[0]
    assert same["same_kernels"] and same["best"] == "flashinfer-lean:cublaslt"
    assert same["dispatch_over_best"] == pytest.approx((1000 / 980 * 985 / 980) ** 0.5, rel=1e-3)
    assert same["ratio_lo"] == pytest.approx(985 / 980, rel=2e-3)  # spans table-direct's interval
    assert same["binding_cost"] == pytest.approx(1000 / 985, rel=1e-3)
    assert same["ok"]  # 1.013 pooled, and table-direct's measurement of the same kernels reaches 1.005
    n, med, worst = null_pair_spread(forward_verdicts(rows("t"), 512))
    assert n == 1 and med == worst == pytest.approx(1000 / 985 - 1, rel=1e-2)
    other = forward_verdicts(rows("x"), 512).iloc[0]  # other kernels: the dispatcher's own measurement alone
    assert not other["same_kernels"] and not other["ok"]
    assert other["dispatch_over_best"] == pytest.approx(1000 / 980, rel=1e-3)
    eager = forward_verdicts(rows("t", "eager"), 512).iloc[0]  # eagerly the host work differs: never pooled
    assert not eager["same_kernels"] and eager["dispatch_over_best"] == pytest.approx(1000 / 980, rel=1e-3)
    old = forward_verdicts(rows("t").drop(columns="kernel_digest"), 512).iloc[0]
    assert not old["same_kernels"] and null_pair_spread(forward_verdicts(rows("x"), 512))[0] == 0


def test_kernel_digest_tells_kernel_sequences_apart():
    from bench.stats import kernel_digest
    assert kernel_digest(["gemm_a", "gemm_b"]) == kernel_digest(("gemm_a", "gemm_b"))
    assert kernel_digest(["gemm_a", "gemm_b"]) != kernel_digest(["gemm_b", "gemm_a"])  # order counts
    assert kernel_digest(["gemm_a"]) != kernel_digest(["gemm_a", "gemm_a"]) and kernel_digest([]) == ""


def test_eager_rounds_shuffle_whole_m_blocks_and_the_paths_inside():
    from bench.forward import round_orders
    keys = [(m, p) for m in (1, 8, 4096, 16384) for p in ("aten", "vllm-flag", "seed-pr", "dispatch")]
    orders = round_orders(keys, 10)
    assert all(sorted(o) == sorted(keys) for o in orders)
    for o in orders:  # each M's paths stay together
        ms = [m for m, _ in o]
        assert all(ms[i] == ms[4 * (i // 4)] for i in range(len(ms)))
    predecessors = {tuple(o[i - 1]) for o in orders for i in range(1, len(o)) if o[i] == (4096, "dispatch")}
    assert len(predecessors) > 2  # no fixed neighbour
    assert round_orders(keys, 10) == orders  # seeded: the same plan for the same seed...
    assert round_orders(keys, 10, seed=7) != orders  # ...and another for another (bench forward draws one per run)


def test_two_fresh_runs_agree_and_the_measured_verdict_names_its_failure(capsys):
    """The repeatability figures of the README, recomputed from the committed pair; and validate --forward judges the
    dispatcher on the measured forwards (it fails where its extra host time shows in an eager forward)."""
    a, _ = load_forward(DATA / "h200-forward")
    b, _ = load_forward(DATA / "h200-forward-2")
    j = a.merge(b, on=["model", "m", "path", "regime"])
    dev = (j["us_x"] / j["us_y"] - 1).abs().groupby(j["regime"]).median()
    assert dev["graph"] <= 0.02 and dev["eager"] <= 0.05, dev
    from calibrate.__main__ import main
    old_table = ["--table", str(DATA / "h200-table-format1.json"), "--oracle", "candidates"]
    assert main(["validate", str(DATA / "h200-sweep"), "--forward", str(DATA / "h200-forward"), *old_table]) == 1
    out = capsys.readouterr().out
    assert "measured / cell-sum model" in out and "FAIL: measured forward of the dispatcher" in out


def test_forward_picks_take_a_single_path_only_beyond_the_noise(tmp_path):
    """A lean single path 20% faster than all-aten in every paired round is picked, in each regime; one 0.5% faster
    is not (inside the 1% gain)."""
    from calibrate.forward_model import forward_picks
    rows = []
    for m, lean_factor in ((1, 0.8), (8, 0.995)):
        for regime in ("graph", "eager"):
            for path, f in (("aten", 1.0), ("flashinfer-lean:tinygemm", lean_factor), ("dispatch", 1.0)):
                samples = ";".join(f"{1000.0 * f * (1 + 0.001 * i):.2f}" for i in range(10))
                rows.append({"model": "Qwen3.5-4B", "tp": 1, "m": m, "path": path, "regime": regime, "status": "ok",
                             "us": 1000.0 * f, "linears": 153, "samples_us": samples})
    d = _forward_dir(tmp_path, rows, ms=[1, 8], paths=["aten", "flashinfer-lean:tinygemm", "dispatch"])
    fdf, _ = load_forward(d)
    picks = forward_picks(fdf, ["aten", "flashinfer-lean:tinygemm"], 0.01)
    assert set(picks) == {("eager", "Qwen3.5-4B", 1), ("graph", "Qwen3.5-4B", 1)}
    assert picks[("eager", "Qwen3.5-4B", 1)][0] == "flashinfer-lean:tinygemm"
    assert picks[("graph", "Qwen3.5-4B", 1)][1] == pytest.approx(0.8)


def test_a_bound_forward_calls_each_layer_as_a_model_would(tmp_path):
    """The dispatch rule's linears are bound layers called with x alone (no adapter of the harness in their time),
    the LM head and every other rule's linears path functions called with (x, w); each distinct one is checked
    against the fp32 reference once per shape before timing (CPU tensors: the dispatcher runs F.linear)."""
    import torch

    import dispatch
    from bench.forward import ForwardAt, ForwardConfig, Forwarding, _bind, _check
    seq = [ForwardLinear(0, "mlp.down_proj", 64, 128), ForwardLinear(1, "mlp.down_proj", 64, 128),
           ForwardLinear(-1, "lm_head", 32, 128)]
    weights = [torch.randn(lin.n, lin.k, dtype=torch.bfloat16) / 8 for lin in seq]
    xs = {128: torch.randn(4, 128, dtype=torch.bfloat16)}
    table = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()})
    cfg = ForwardConfig(profile=H200, models={}, ms=[4], rules=["dispatch"], out=tmp_path, table=table)
    fns = {"aten": torch.nn.functional.linear}
    dispatch.reset()
    at = ForwardAt("m", seq, weights, 4, xs)

    def run(calls):
        return Forwarding(cfg, None, None, None, None, 90, calls)
    b = _bind(run(fns), at, "dispatch")
    assert [len(args) for _, args, _ in b.calls] == [1, 1, 2]
    _check(b, "dispatch")
    b()
    direct = _bind(run(fns), at, "aten")
    assert [len(args) for _, args, _ in direct.calls] == [2, 2, 2] and direct.used == {"aten": 3}
    bad = _bind(run({"aten": lambda x, w: torch.zeros(x.shape[0], w.shape[0])}), at, "aten")
    with pytest.raises(HarnessError, match="differs from the fp32 reference"):
        _check(bad, "aten")


def test_clock_columns_summarise_the_readings_and_skip_missing_ones():
    from bench.forward import clock_columns
    assert clock_columns([None, None]) == {}
    cols = clock_columns([(1980, 512.4, 0), None, (1755, 699.6, 4), (1830, 650.0, 4)])
    assert cols["sm_mhz"] == 1830 and cols["sm_mhz_samples"] == [1980, 1755, 1830]
    assert cols["power_w_samples"] == [512, 700, 650] and cols["clock_reasons_samples"] == [0, 4, 4]
    from bench.forward import FORWARD_COLUMNS
    from bench.results import rows_to_csv
    assert rows_to_csv([cols], FORWARD_COLUMNS).splitlines()[1].endswith(",1830,1980;1755;1830,512;700;650,0;4;4" + "," * 6)


def test_sustain_summary_names_the_settled_time_and_when_it_was_reached():
    from bench.sustain import summary_line
    # 3 fast replays after the idle gap, then a slower settled load: settled 1.1x, first reached by the fourth (40 ms)
    recs = [{"t_ms": 10.0 * (i + 1), "us": 10_000.0 if i < 3 else 11_000.0, "sm_mhz": 1980 if i < 3 else 1800}
            for i in range(12)]
    line = summary_line("aten", recs)
    assert "settled   11000.0 µs (1.100x)" in line and "at 40 ms" in line and "1800 MHz" in line
    flat = [{"t_ms": 10.0 * (i + 1), "us": 500.0, "sm_mhz": None} for i in range(6)]
    assert "at 10 ms" in summary_line("aten", flat) and "nan MHz" in summary_line("aten", flat)


class _LoggingClock:
    """A CUPTI stand-in that logs its calls; drain returns no records."""
    name = "events"

    def __init__(self, log: list):
        self.log, self.t = log, 0

    def now(self) -> int:
        self.t += 1
        self.log.append("now")
        return self.t

    def drain(self) -> list:
        self.log.append("drain")
        return []

    @contextlib.contextmanager
    def paused(self):
        self.log.append("pause")
        yield
        self.log.append("resume")


def test_timed_eager_forwards_run_unprofiled_and_one_profiled_forward_each_follows(monkeypatch):
    """With CUPTI recording, the H200's eager samples came in two modes 1.5x apart (h200-settled-forward-3): every
    timed forward runs with the profiler paused, right after its settle; then one settled forward of each runs
    profiled (busy time, kernels), its drain before its settle (a flush between a settle and its window stretched
    the window's host time 4-6x in h200-settled-forward-1)."""
    import torch

    from bench.forward import EagerRounds, eager_forwards
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    log: list = []
    forwards = {(1, "aten"): lambda: log.append("f"), (1, "dispatch"): lambda: log.append("f")}
    out = eager_forwards(_LoggingClock(log), forwards, EagerRounds(3, seed=1, settle_s=1e-9))
    assert all(len(v["wall"]) == len(v["submit"]) == 3 for v in out.values())
    start, stop = log.index("pause"), log.index("resume")
    assert log[:start] == ["f", "f", "drain"]  # the allocator's first forwards, drained
    assert log[start + 1:stop] == ["f"] * 12  # 6 timed forwards, each after its settle run; no clock inside
    assert log[stop + 1:] == ["drain", "f", "now", "f", "now"] * 2 + ["drain"]  # drain, settle, profiled window


def test_only_capped_eager_forwards_settle_and_they_run_first_in_each_round(monkeypatch):
    """--settle-at capped: the forwards of a power-capped M settle and run first in a round; of the others the first
    after them settles in full (its clock recovers from their load), the rest briefly (LIGHT_SETTLE_MS)."""
    import torch

    from bench.forward import EagerRounds, eager_forwards
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    log: list = []
    names = [(1, "aten"), (1, "dispatch"), (4096, "aten"), (4096, "dispatch")]
    forwards = {k: (lambda k=k: log.append(k)) for k in names}
    eager_forwards(_LoggingClock(log), forwards, EagerRounds(2, seed=3, settle_s=1e-9, capped=set(names[2:])))
    timed = log[log.index("pause") + 1:log.index("resume")]
    assert len(timed) == 2 * 8  # a settle is one untimed run just before the timed one (the settle is 1 ns)
    for r in (timed[:8], timed[8:]):
        assert {r[0], r[2]} == set(names[2:]) and r[0] == r[1] and r[2] == r[3]  # capped first, each settled
        assert r[4] == r[5] and r[4][0] == 1 and r[6] == r[7] and r[6][0] == 1 and r[6] != r[4]
    import bench.forward as fw
    monkeypatch.setattr(fw, "LIGHT_SETTLE_MS", 0.0)  # the brief settle alone goes: the last forward runs once
    log.clear()
    eager_forwards(_LoggingClock(log), forwards, EagerRounds(1, seed=3, settle_s=1e-9, capped=set(names[2:])))
    timed = log[log.index("pause") + 1:log.index("resume")]
    assert len(timed) == 7 and timed[4] == timed[5] and timed[6][0] == 1 and timed[6] != timed[5]


def test_the_settle_probe_reads_a_cap_from_nvml():
    from bench.forward import power_capped

    class Graph:
        def replay(self):
            pass

    class Reader:
        def __init__(self, read):
            self.value = read

        def read(self):
            return self.value

        def max_mhz(self):
            return 1980
    graphs = {"aten": Graph()}
    import bench.forward as fw
    fw.replay_seconds, real = (lambda g: 0.001), fw.replay_seconds
    try:
        assert power_capped(graphs, 0.0, Reader((1980, 400.0, 0)))[0] is False
        assert power_capped(graphs, 0.0, Reader((1980, 690.0, 4)))[0] is True  # SW power cap
        capped, probe = power_capped(graphs, 0.0, Reader((1755, 700.0, 0)))
        assert capped and probe["sm_mhz"] == 1755 and probe["path"] == "aten"
        assert power_capped(graphs, 0.0, Reader(None))[0] is True  # no NVML: the safe side
    finally:
        fw.replay_seconds = real


def test_skip_slower_drops_only_single_paths_far_slower_than_all_aten():
    from bench.forward import too_slow
    seconds = {"aten": 0.012, "flashinfer-lean:tinygemm": 0.268, "flashinfer-lean:cublaslt": 0.0121,
               "flashinfer-everywhere": 0.013, "dispatch": 0.9, "table-direct": 0.9, "dispatch-python": 0.9}
    slow = too_slow(seconds, 3.0)
    assert list(slow) == ["flashinfer-lean:tinygemm"] and round(slow["flashinfer-lean:tinygemm"], 1) == 22.3
    assert too_slow(seconds, 25.0) == {}


def test_a_run_with_void_eager_rows_takes_no_part_in_eager_picks():
    """fit --forward lean-forward settled-forward-1: the settled run's graph rows take part (a graph pick must hold
    in both), its void eager rows do not (the eager picks are lean-forward's alone, not none)."""
    from calibrate.forward_model import picks_in_every_run
    candidates = ["aten", "flashinfer-lean:cublaslt", "flashinfer-lean:tinygemm"]
    lean = load_forward(DATA / "h200-lean-forward")[0]
    settled = load_forward(DATA / "h200-settled-forward-1")[0]
    both = picks_in_every_run([lean, settled], candidates, 0.01)
    alone = picks_in_every_run([lean], candidates, 0.01)
    eager = lambda picks: {k: v[0] for k, v in picks.items() if k[0] == "eager"}
    assert eager(both) == eager(alone) and eager(alone)
    graph_both = {k for k in both if k[0] == "graph"}
    graph_settled = {k for k in picks_in_every_run([settled], candidates, 0.01) if k[0] == "graph"}
    assert graph_both == {k for k in alone if k[0] == "graph"} & graph_settled
    assert ("graph", "Qwen3.5-4B", 1031) in alone and ("graph", "Qwen3.5-4B", 1031) not in both


def _replicate(ratio: float, spread: float, paths_used: str = "x:1", n: int = 12) -> pd.DataFrame:
    """A forward run of one path beside aten at n M values per regime: aten at 1000 µs, the path at ratio x it, each
    round's samples moving by `spread` around that (a tight paired interval)."""
    rows = []
    for regime in ("graph", "eager"):
        for m in range(1, n + 1):
            for path, f in (("aten", 1.0), ("flashinfer-lean:cublaslt", ratio)):
                samples = [1000.0 * f * (1 + spread * ((i % 3) - 1)) for i in range(6)]
                rows.append({"model": "Qwen3.5-4B", "tp": 1, "m": m, "path": path, "regime": regime, "status": "ok",
                             "us": 1000.0 * f, "linears": 153, "paths_used": paths_used if path != "aten" else "aten",
                             "samples_us": ";".join(f"{v:.2f}" for v in samples)})
    return pd.DataFrame(rows)


def test_forward_noise_floor_is_the_replicates_spread_and_widens_the_verdicts():
    """Two fresh-process runs whose ratios differ by 3% while each run's paired interval is far tighter: the floor
    is that 3% (log), it widens a run's interval until the other run's ratio falls inside, and a 2% excess over the
    best path that the paired interval alone called a FAIL is then within the noise."""
    import math

    from calibrate.forward_noise import fit_forward_floor, forward_coverage, replicate_forward_diffs
    a, b = _replicate(1.00, 0.0001), _replicate(1.03, 0.0001)
    floor = fit_forward_floor([(a, b)])
    assert floor.half_widths["graph"] == pytest.approx(math.log(1.03), rel=1e-3)
    cov = forward_coverage(a, b, floor)
    assert len(cov) == 24 and not cov["boot_inside"].any() and cov["calibrated_inside"].all()
    # another table's choices under the same rule name are no replicate of these
    assert replicate_forward_diffs(a, _replicate(1.03, 0.0001, paths_used="y:1")).empty
    with pytest.raises(HarnessError, match="fewer than 10 ratios"):
        fit_forward_floor([(a, _replicate(1.03, 0.0001, paths_used="y:1"))])
    run = a.copy()
    run.loc[run["path"] == "flashinfer-lean:cublaslt", "path"] = "dispatch"
    run.loc[run["path"] == "aten", "us"] = 980.0  # aten the best path; the dispatcher 1000/980 = 1.020x it
    run.loc[run["path"] == "aten", "samples_us"] = ";".join(["980.00"] * 6)
    alone = forward_verdicts(run, 512)
    widened = forward_verdicts(run, 512, floor)
    assert not alone["ok"].any() and widened["ok"].all()
    assert set(alone["verdict"]) == {"OVER"} and set(widened["verdict"]) == {"within noise"}  # 1.02 stays named
    assert (widened["dispatch_over_best"] == alone["dispatch_over_best"]).all()  # the point estimate stays


@pytest.mark.evidence
def test_the_committed_forward_floor_is_the_committed_runs_and_covers_held_out_pairs(capsys, tmp_path):
    """calibrate/noise/h200-forward.json is what forward-noise computes from the committed forward runs, and each
    replicate pair's ratios fall inside the other's intervals, widened by the floor of the other pairs, at close to
    the nominal 95% (the paired intervals alone: 8-93%)."""
    import json
    import re

    from calibrate.__main__ import main
    stored = json.loads((ROOT / "calibrate" / "noise" / "h200-forward.json").read_text())
    runs = stored["source"]["runs"]
    assert main(["forward-noise", *[str(ROOT / r) for r in runs], "--gpu", "h200", "--out-file",
                 str(tmp_path / "f.json")]) == 0
    again = json.loads((tmp_path / "f.json").read_text())
    assert again["half_widths"] == pytest.approx(stored["half_widths"])
    out = capsys.readouterr().out
    held = [(int(n), float(c)) for n, c in re.findall(r"floor from the other pairs, (\d+) ratios, nominal 95%\): "
                                                      r"bootstrap alone [\d.]+%, with the run-to-run floor ([\d.]+)%", out)]
    assert len(held) == 10  # five pairs, two regimes, each judged by the other pairs' floor
    inside = sum(n * c / 100 for n, c in held) / sum(n for n, _ in held)
    assert abs(inside - 0.95) <= 0.10


def test_forward_floor_and_replicate_bad_input_get_one_line(tmp_path):
    from calibrate.__main__ import main
    from calibrate.forward_noise import load_forward_floor
    bad = tmp_path / "floor.json"
    bad.write_text(json.dumps({"level": 0.95, "half_widths": {"graph": "wide"}}))
    with pytest.raises(HarnessError, match="malformed forward noise floor"):
        load_forward_floor("h200", bad)
    bad.write_text(json.dumps({"level": 0.95, "half_widths": {"graph": -0.1}}))
    with pytest.raises(HarnessError, match="finite and >= 0"):
        load_forward_floor("h200", bad)
    with pytest.raises(HarnessError, match="--forward-replicate needs --forward"):
        main(["validate", str(DATA / "h200-lean-validate"), "--table", str(DATA / "h200-lean-table.json"), "--forward-replicate", str(DATA / "h200-settled-forward-8")])
    with pytest.raises(HarnessError, match="two or more"):
        main(["forward-noise", str(DATA / "h200-settled-forward-8"), "--gpu", "h200"])
    # another GPU's runs: the fix offered is one the command has (forward-noise has no --allow-mismatch)
    with pytest.raises(HarnessError, match="not on a h100 GPU; pass --gpu for that GPU$"):
        main(["forward-noise", str(DATA / "h200-settled-forward-8"), str(DATA / "h200-settled-forward-9"),
              "--gpu", "h100"])
    with pytest.raises(HarnessError, match=r"\(or --allow-mismatch to judge it anyway\)$"):
        main(["validate", str(DATA / "h200-lean-validate"), "--gpu", "h100"])


def test_fit_forward_tests_widened_by_the_forward_floor_drop_gains_inside_the_noise():
    """A lean path 2% faster than all-aten with a tight paired interval is a forward pick; with a forward floor of 3%
    (log) the same gain lies inside the run-to-run noise and is not (fit --forward-noise); 10% still is."""
    import math

    from calibrate.forward_model import picks_in_every_run
    from calibrate.forward_noise import ForwardFloor
    floor = ForwardFloor({"graph": math.log(1.03), "eager": math.log(1.03)})
    small, large = _replicate(0.98, 0.0001), _replicate(0.90, 0.0001)
    cands = ["aten", "flashinfer-lean:cublaslt"]
    assert len(picks_in_every_run([small], cands, 0.01)) == 24
    assert picks_in_every_run([small], cands, 0.01, floor) == {}
    picked = picks_in_every_run([large], cands, 0.01, floor)
    assert len(picked) == 24 and all(p == "flashinfer-lean:cublaslt" and hi < 0.99 for p, _, hi in picked.values())



def test_fused_siblings_join_the_linears_that_read_one_input_and_run_the_largest_ones_choice():
    from shapes.siblings import FusedLinear, fuse_siblings
    seq = [ForwardLinear(0, "linear_attn.in_proj_qkvz", 12288, 2048), ForwardLinear(0, "linear_attn.in_proj_ba", 64, 2048),
           ForwardLinear(0, "linear_attn.out_proj", 2048, 4096),
           ForwardLinear(0, "mlp.shared_expert.gate_up_proj", 1024, 2048),
           ForwardLinear(0, "mlp.shared_expert.down_proj", 2048, 512), ForwardLinear(0, "mlp.gate", 256, 2048),
           ForwardLinear(0, "mlp.shared_expert_gate", 1, 2048),
           ForwardLinear(1, "linear_attn.in_proj_ba", 64, 2048),  # alone in its layer: stays as it is
           ForwardLinear(-1, "lm_head", 248320, 2048)]
    fused = fuse_siblings(seq)
    assert [(f.layer, f.n) for f in fused] == [
        ("linear_attn.in_proj_qkvz+linear_attn.in_proj_ba", 12352), ("linear_attn.out_proj", 2048),
        ("mlp.shared_expert.gate_up_proj+mlp.gate+mlp.shared_expert_gate", 1281),
        ("mlp.shared_expert.down_proj", 2048), ("linear_attn.in_proj_ba", 64), ("lm_head", 248320)]
    assert fused[2].members == (3, 5, 6) and fused[2].lead == (1024, 2048) and isinstance(fused[0], FusedLinear)
    assert sum(f.n * f.k for f in fused) == sum(s.n * s.k for s in seq)  # the same bytes, fewer kernels
    table = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()},
                           shapes={(12288, 2048): {"graph": ((8, "flashinfer-lean:tinygemm"),), "eager": ()},
                                   (1024, 2048): {"graph": ((8, "triton:gemv"),), "eager": ()}})
    assert path_for("fused-siblings", fused[0], 4, Target(90, H200, table)) == "flashinfer-lean:tinygemm"  # N % 16
    assert path_for("fused-siblings", fused[2], 4, Target(90, H200, table)) == "triton:gemv"
    assert path_for("fused-siblings", fused[2], 4, Target(90, H200, table), "eager") == "aten"
    assert path_for("vllm-fused", fused[0], 4, Target(90, H200, table)) == "aten"  # vLLM default, fused
    tiny = ThresholdTable("h200", "tinygemm", {"graph": (), "eager": ()},
                          shapes={(1024, 2048): {"graph": ((64, "flashinfer-lean:tinygemm"),), "eager": ()}})
    # TinyGEMM cannot take N = 1281 (N % 16): the GEMV where it can (M <= 16), else F.linear
    assert path_for("fused-siblings", fused[2], 4, Target(90, H200, tiny)) == "triton:gemv"
    assert path_for("fused-siblings", fused[2], 32, Target(90, H200, tiny)) == "aten"


def test_forward_ratio_pairs_two_rules_and_refuses_a_bad_pair(capsys):
    from calibrate.cli import main
    from calibrate.forward_ratio import parse_pairs
    assert parse_pairs("table-pdl/table-direct, a/b") == [("table-pdl", "table-direct"), ("a", "b")]
    for bad in ("table-pdl", "a/", "/b", "a/b/c"):
        with pytest.raises(HarnessError, match="RULE/REFERENCE"):
            parse_pairs(bad)
    run = str(DATA / "h200-settled-forward-8")
    assert main(["forward-ratio", "--forward", run, "--pairs", "dispatch/table-direct", "--no-floor"]) == 0
    out = capsys.readouterr().out
    assert "dispatch/table-direct  Qwen3.5-4B, graph:" in out and "geometric mean over M" in out
    with pytest.raises(HarnessError, match="measured both rules"):
        main(["forward-ratio", "--forward", run, "--pairs", "table-pdl/table-direct"])


def test_a_fused_forward_is_never_the_best_single_path_the_dispatcher_is_judged_by():
    import pandas as pd

    from calibrate.forward_model import forward_verdicts
    rows = [{"model": "m", "m": 1, "regime": "graph", "path": p, "status": "ok", "us": us, "reason": None}
            for p, us in (("aten", 100.0), ("dispatch", 90.0), ("vllm-fused", 60.0), ("fused-siblings", 50.0))]
    v = forward_verdicts(pd.DataFrame(rows), capture_size=512)
    assert v.iloc[0]["best"] == "dispatch" and v.iloc[0]["ok"]


def test_a_path_is_slower_in_every_run_only_where_each_run_that_measured_it_says_so():
    """forward_model.slower_in_every_run: cuBLASLt's whole forward 6% above all-aten in both runs at M = 512 is
    slower there; at M = 8 one run says 6% above and the other 4% below, so it is not; a floor wider than the gap
    leaves none."""
    from calibrate.forward_noise import ForwardFloor
    from calibrate.forward_model import slower_in_every_run
    from tests.test_vllm import _forward
    lt = "flashinfer-lean:cublaslt"
    a = _forward({("M", 512): {"aten": 100.0, lt: 106.0}, ("M", 8): {"aten": 100.0, lt: 106.0}}, ("graph",))
    b = _forward({("M", 512): {"aten": 100.0, lt: 106.0}, ("M", 8): {"aten": 100.0, lt: 96.0}}, ("graph",))
    slow = slower_in_every_run([a, b], ["aten", lt])
    assert set(slow) == {("graph", "M", 512)} and slow[("graph", "M", 512)][lt] == pytest.approx(1.06, abs=0.01)
    assert slower_in_every_run([a, b], ["aten", lt], ForwardFloor({"graph": 0.1, "eager": 0.1})) == {}


def test_a_forward_compiles_ahead_the_gemv_launches_its_rules_make(tmp_path, monkeypatch):
    """start_ahead of a forward: the C++ layer where a rule binds the dispatcher; the GEMV's kernels of every linear
    and M, launched as each GEMV-running rule launches them (table-pdl with PDL, table-plain plainly, the
    dispatcher as configured); nothing for rules that never run the GEMV, nor with --no-compile-ahead."""
    from bench import ahead as ahead_mod
    from bench.forward import ForwardConfig, start_ahead, used_paths
    from dispatch.backends import GEMV
    from dispatch.table import shipped_table
    table = shipped_table("h200")
    seq = [ForwardLinear(0, "self_attn.o_proj", 2560, 4096), ForwardLinear(-1, "lm_head", 248320, 2560)]
    assert table.choose(2560, 4096, 1, "graph") == GEMV  # the premise: the table runs the GEMV here
    started = []
    monkeypatch.setattr(ahead_mod.Ahead, "start", classmethod(lambda cls, on, native_layer, cells, pdls=(None,):
                                                                  started.append((on, native_layer, sorted(cells),
                                                                                  pdls))))

    def run(rules, **kw):
        cfg = ForwardConfig(profile=H200, models={}, ms=[1, 64], rules=rules, out=tmp_path, table=table, **kw)
        start_ahead(cfg, {"m": seq}, used_paths(cfg, {"m": seq}, 90))
        return started[-1]
    cells = [(2560, 4096, 1), (2560, 4096, 64), (248320, 2560, 1), (248320, 2560, 64)]
    assert run(["aten", "table-pdl", "table-plain"]) == (True, False, cells, (False, True))
    assert run(["aten", "dispatch"]) == (True, True, cells, (None,))
    assert run(["aten", "table-direct"]) == (True, False, cells, (None,))
    assert run(["aten", "vllm-default"]) == (True, False, [], ())
    assert run(["aten", "dispatch"], compile_ahead=False)[0] is False
