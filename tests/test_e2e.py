"""bench e2e on CPU: transformers' own model from a config, stock against dispatch.patch, rows and the logits check
(the captured decode step needs CUDA: its row says so here)."""
import json

import pytest

pytest.importorskip("transformers")

TINY = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96,
        "max_position_embeddings": 128}


def test_stock_and_patched_rounds_give_a_row_per_step_and_variant(tmp_path):
    from bench.e2e import COLUMNS, E2EConfig, ratio_lines, run_e2e, write_e2e
    rows = run_e2e(E2EConfig("tiny", TINY, tmp_path, layers=2, prefill=(4, 12), generate_tokens=3, rounds=2,
                             device="cpu"))
    got = {(r["step"], r["tokens"], r["variant"]): r for r in rows}
    assert set(got) == {(s, n, v) for s, n in (("prefill", 4), ("prefill", 12), ("generate", 3), ("decode-graph", 1))
                        for v in ("stock", "patched")}
    assert all(got[k]["status"] == "ok" and got[k]["samples"] == 2 for k in got if k[0] != "decode-graph")
    assert got[("decode-graph", 1, "patched")]["status"] == "skipped"
    assert "needs CUDA" in got[("decode-graph", 1, "patched")]["reason"]
    assert got[("decode-graph", 1, "stock")]["kernels_reason"] == "a kernel split needs CUDA"
    # two layers of 7 linears, the LM head left as is; on CPU the dispatcher runs F.linear: identical logits
    assert got[("prefill", 4, "patched")]["patched_linears"] == 14
    assert got[("prefill", 4, "patched")]["logits_rel_err"] == 0.0
    # both variants' error against the fp32 model, the same here: bf16 rounding alone
    errs = {got[("prefill", 4, v)]["logits_err_fp32"] for v in ("stock", "patched")}
    assert len(errs) == 1 and 0 < errs.pop() < 0.05
    # each patched linear against F.linear in fp32 on its own input: bf16 output rounding, from a named linear
    patched = got[("prefill", 4, "patched")]
    assert 0 < patched["linear_rel_err"] < 0.01 and patched["linear_worst"].startswith("model.layers.")
    assert got[("prefill", 4, "stock")]["linear_worst"] == ""
    assert any("patched / stock" in line for line in ratio_lines(rows))
    write_e2e(tmp_path / "out", rows, {"kind": "e2e"})
    header = (tmp_path / "out" / "e2e.csv").read_text().splitlines()[0]
    assert header == ",".join(COLUMNS) and json.loads((tmp_path / "out" / "run.json").read_text())["kind"] == "e2e"


def test_a_config_transformers_cannot_build_is_one_line():
    from bench.e2e import build_model
    from harness.errors import HarnessError
    with pytest.raises(HarnessError, match="cannot build model_type"):
        build_model({"model_type": "no-such-model"}, None, "cpu")


def test_the_prediction_from_the_measured_linears():
    """A step whose linears are half its stock time and run 0.8x under the dispatcher is predicted at 0.9x."""
    import pandas as pd

    from calibrate.e2e_terms import predictions
    e2e = pd.DataFrame([{"model": "A", "step": "prefill", "tokens": 128, "variant": v, "status": "ok", "us": us}
                        for v, us in (("stock", 1000.0), ("patched", 920.0))]
                       + [{"model": "A", "step": "generate", "tokens": 4, "variant": v, "status": "ok", "us": us}
                          for v, us in (("stock", 4000.0), ("patched", 3900.0))])
    fw = pd.DataFrame([{"model": "A", "m": m, "regime": "eager", "path": p, "status": "ok", "us": us}
                       for m, p, us in ((128, "aten", 500.0), (128, "dispatch", 400.0), (1, "aten", 100.0),
                                        (1, "dispatch", 100.0))])
    out = predictions(e2e, fw).set_index("step")
    assert out.at["prefill", "predicted"] == pytest.approx(0.9) and out.at["prefill", "measured"] == pytest.approx(0.92)
    assert out.at["generate", "linears_share_of_step"] == pytest.approx(0.1)  # per token: 100 of 1000 µs
    assert out.at["generate", "predicted"] == pytest.approx(1.0)


def test_patched_logits_that_differ_fail_every_patched_row(tmp_path, monkeypatch):
    """A dispatcher whose kernels changed the model's output beyond bf16 tolerance gets no timing verdict: every
    patched row fails and says why."""
    import torch

    import dispatch
    from bench.e2e import E2EConfig, run_e2e
    real = dispatch.patch

    def wrong(model, *args, **kwargs):
        handle = real(model, *args, **kwargs)
        for _, module in handle.patched:
            module.forward = (lambda w: lambda x: torch.nn.functional.linear(x, w) * 1.5)(module.weight)
        return handle
    monkeypatch.setattr(dispatch, "patch", wrong)
    rows = run_e2e(E2EConfig("tiny", TINY, tmp_path, layers=1, prefill=(4,), generate_tokens=2, rounds=1, device="cpu"))
    patched = [r for r in rows if r["variant"] == "patched"]
    assert patched and all(r["status"] == "failed" and "logits differ from the fp32 model" in r["reason"] for r in patched)
    assert all("differs from F.linear in fp32 by 0.5" in r["reason"] for r in patched)
    assert all(r["status"] != "failed" for r in rows if r["variant"] == "stock")


def test_an_e2e_file_with_a_nan_time_is_one_line(tmp_path):
    from calibrate.e2e_terms import load_e2e
    from harness.errors import HarnessError
    (tmp_path / "e2e.csv").write_text("model,step,tokens,variant,status,us\nA,prefill,8,stock,ok,nan\n")
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(HarnessError, match="no positive time"):
        load_e2e(tmp_path)
    for samples in ("12;abc", "12;nan", "12;-3"):  # the verdict is computed from the samples
        (tmp_path / "e2e.csv").write_text(f"model,step,tokens,variant,status,us,samples_us\nA,prefill,8,stock,ok,12,"
                                          f"{samples}\n")
        with pytest.raises(HarnessError, match="samples_us is not ';'-separated positive numbers"):
            load_e2e(tmp_path)


def test_a_forward_of_other_decoder_layers_is_refused():
    """An e2e of the first 20 decoder layers cannot take its linears' share from a forward of every layer."""
    from calibrate.e2e_terms import check_same_layers
    from harness.errors import HarnessError
    check_same_layers({"layers": None}, {"decoder_layers": None}, "e2e", "fw")
    check_same_layers({"layers": 20}, {"decoder_layers": 20}, "e2e", "fw")
    with pytest.raises(HarnessError, match="e2e ran 20 decoder layers but fw measured every decoder layer.*"
                                           "--layers 20"):
        check_same_layers({"layers": 20}, {"decoder_layers": None}, "e2e", "fw")
    with pytest.raises(HarnessError, match="ran every decoder layer but fw measured 8 decoder layers.*no --layers"):
        check_same_layers({}, {"decoder_layers": 8}, "e2e", "fw")


def test_a_captured_step_says_how_much_the_forwards_kernels_overlapped():
    """Graph regime: the dispatcher forward's summed kernel time over its span (1.2 where 1200 µs of kernels ran in
    1000 µs); eager steps get none."""
    import math

    import pandas as pd

    from calibrate.e2e_terms import predictions
    e2e = pd.DataFrame([{"model": "A", "step": s, "tokens": n, "variant": v, "status": "ok", "us": us}
                        for s, n in (("decode-graph", 1), ("prefill", 8)) for v, us in (("stock", 4000.0),
                                                                                         ("patched", 3800.0))])
    fw = pd.DataFrame([{"model": "A", "m": m, "regime": r, "path": p, "status": "ok", "us": us, "gpu_busy_us": busy,
                        "span_us": us if r == "graph" else math.nan}
                       for m, r in ((1, "graph"), (8, "eager"))
                       for p, us, busy in (("aten", 2000.0, 1900.0), ("dispatch", 1000.0, 1200.0))])
    out = predictions(e2e, fw).set_index("step")
    assert math.isnan(out.at["decode-graph", "in_step_linears_saved"])  # no kernel split in this run
    assert out.at["decode-graph", "dispatch_busy_over_span"] == pytest.approx(1.2)
    assert out.at["decode-graph", "predicted"] == pytest.approx(0.75)
    assert math.isnan(out.at["prefill", "dispatch_busy_over_span"])


def test_the_fp32_reference_runs_a_layer_at_a_time_and_leaves_the_model_as_it_was():
    """The layer-at-a-time fp32 logits equal those of a whole fp32 copy, and afterwards every parameter is the
    same bf16 tensor as before (its storage and values)."""
    import copy

    import torch

    from bench.e2e import build_model, fp32_logits
    model = build_model(TINY, None, "cpu")
    before = {n: (p.dtype, p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    ids = torch.randint(0, TINY["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(0))
    layers = model.model.layers
    seen = []
    probe = layers[1].mlp.register_forward_hook(lambda *_: seen.append(
        [next(layer.parameters()).dtype for layer in layers]))
    got = fp32_logits(model, ids)
    probe.remove()
    assert seen == [[torch.bfloat16, torch.float32, torch.bfloat16]]  # one layer in fp32 while it runs
    with torch.no_grad():
        want = copy.deepcopy(model).float()(ids).logits.float()
    assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    for n, (dtype, ptr, value) in before.items():
        assert after[n].dtype == dtype == torch.bfloat16 and after[n].data_ptr() == ptr
        assert torch.equal(after[n].detach(), value)
    with torch.no_grad():
        bf16 = model(ids).logits.float()
    assert not torch.equal(bf16, got)  # the reference did run in another precision


def test_a_layer_that_raises_inside_the_fp32_reference_leaves_the_model_in_bf16():
    import torch

    from bench.e2e import build_model, fp32_logits
    model = build_model(TINY, None, "cpu")

    def boom(*_):
        raise RuntimeError("boom")
    probe = model.model.layers[1].mlp.register_forward_hook(boom)
    with pytest.raises(RuntimeError, match="boom"):
        fp32_logits(model, torch.zeros(1, 3, dtype=torch.long))
    probe.remove()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_the_kernel_split_matches_kernels_by_name_and_count():
    """Stock runs norm, gemm_a twice, attn; patched runs norm, tinygemm twice, attn (slower beside the new kernels):
    the shared time is norm + attn in each, the own time the linears'."""
    from bench.e2e_kernels import kernel_split, median_split
    stock = [("norm", 2.0), ("gemm_a", 10.0), ("gemm_a", 12.0), ("attn", 5.0)]
    patched = [("norm", 2.0), ("tinygemm", 6.0), ("tinygemm", 6.0), ("attn", 6.0)]
    split = kernel_split(stock, patched)
    assert split["stock"] == {"kernels": 4, "kernels_us": 29.0, "own_kernels_us": 22.0, "shared_kernels_us": 7.0}
    assert split["patched"] == {"kernels": 4, "kernels_us": 20.0, "own_kernels_us": 12.0, "shared_kernels_us": 8.0}
    # a name both run, more often in one: as many as both have are shared
    uneven = kernel_split([("gemm_a", 4.0)] * 3, [("gemm_a", 4.0)])
    assert uneven["stock"]["own_kernels_us"] == 8.0 and uneven["patched"]["own_kernels_us"] == 0.0
    from bench.e2e import ratio_lines
    rows = [{"step": "decode-graph", "tokens": 1, "variant": v, "status": "ok", "us": us, **split[v]}
            for v, us in (("stock", 40.0), ("patched", 31.0))]
    assert ratio_lines(rows)[1] == "  decode-graph kernels: the changed linears 22 -> 12 µs (saved 10), the rest +1 µs"
    again = median_split([split, kernel_split(stock, [("norm", 2.0), ("tinygemm", 8.0), ("attn", 6.0)]), split])
    assert again["patched"]["own_kernels_us"] == 12.0 and again["stock"]["kernels_us"] == 29.0


def test_the_captured_decode_step_says_which_linear_attention_kernels_ran(tmp_path, monkeypatch):
    """decode_split keeps the stock step's kernel names; a package's kernels carry their op's name, so run.json says
    per op what ran in the step (none: transformers' reference), and calibrate e2e says where a package imported but
    none of its kernels ran."""
    import json
    from types import SimpleNamespace

    import torch

    import bench.e2e as e2e
    from bench.e2e_kernels import decode_split, op_kernels
    from calibrate.commands.e2e import kernels_note
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    fla = "fused_recurrent_gated_delta_rule_fwd_kernel"
    kernels = {"stock": [("gemm", 5.0), (fla, 3.0), ("vectorized_elementwise_kernel", 1.0)],
               "patched": [("tinygemm", 3.0), (fla, 3.0), ("vectorized_elementwise_kernel", 1.0)]}

    class Clock:
        t, records = 0, []

        def now(self):
            self.t += 1
            return self.t

        def drain(self):
            out, self.records = self.records, []
            return out
    clock = Clock()
    patched = []

    def capture():
        variant = "patched" if patched else "stock"

        def replay():
            for name, us in kernels[variant]:
                start = clock.now()
                clock.records.append(SimpleNamespace(name=name, start=start, end=start + us * 1e3, graph_id=1))
        return replay, ""
    split, why, names = decode_split(clock, capture, lambda: patched.append(1) or SimpleNamespace(remove=lambda: None))
    assert why == "" and split["stock"]["own_kernels_us"] == 5.0 and split["patched"]["own_kernels_us"] == 3.0
    assert names == {"gemm", fla, "vectorized_elementwise_kernel"}
    seen = op_kernels(names, e2e.MODEL_KERNEL_PACKAGES)
    assert seen == {"gated_delta_rule": [fla], "causal_conv1d": []}
    rows = [{"step": "decode-graph", "tokens": 1, "variant": "stock", "op_kernels": json.dumps(seen)}]
    e2e.write_e2e(tmp_path, rows, {"kind": "e2e", "model_kernels": {"gated_delta_rule": "flash-linear-attention 0.6.0",
                                                                    "causal_conv1d": "causal-conv1d 1.7.0"}})
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["decode_kernels"] == seen
    note = kernels_note(info, "run")
    assert note.startswith("note: run imported the packages") and "none of causal_conv1d's kernels ran" in note
    both = {**info, "decode_kernels": {**seen, "causal_conv1d": ["causal_conv1d_update_kernel"]}}
    assert kernels_note(both, "run").endswith("(each seen in the captured decode step)")
    assert not kernels_note({**info, "decode_kernels": None}, "run").endswith("step)")  # no split: no claim


def test_the_kernel_split_as_shares_of_the_stock_step():
    """Stock step 4000 µs, the changed linears' kernels 1000 -> 700 µs, the rest 2500 -> 2540 µs: 7.5% saved
    inside the step, the rest 1% slower."""
    import pandas as pd

    from calibrate.e2e_terms import predictions
    e2e = pd.DataFrame([{"model": "A", "step": "decode-graph", "tokens": 1, "variant": v, "status": "ok", "us": us,
                         "own_kernels_us": own, "shared_kernels_us": shared}
                        for v, us, own, shared in (("stock", 4000.0, 1000.0, 2500.0),
                                                   ("patched", 3740.0, 700.0, 2540.0))])
    fw = pd.DataFrame([{"model": "A", "m": 1, "regime": "graph", "path": p, "status": "ok", "us": us}
                       for p, us in (("aten", 1600.0), ("dispatch", 1200.0))])
    row = predictions(e2e, fw).iloc[0]
    assert row["in_step_linears_saved"] == pytest.approx(0.075) and row["in_step_rest_moved"] == pytest.approx(0.01)
    assert row["predicted"] == pytest.approx(0.9) and row["measured"] == pytest.approx(0.935)


def test_a_step_slower_in_every_round_is_slower_and_a_noisy_one_ambiguous():
    """The verdict pairs each round's patched sample with its stock one: 5% slower in all eight rounds is SLOWER
    whatever the spread between rounds; ratios straddling 1 widely are AMBIGUOUS; a run without --forward still
    gets its verdicts."""
    import pandas as pd

    from calibrate.e2e_terms import predictions, step_verdict
    stock = [100.0, 140.0, 90.0, 120.0, 100.0, 150.0, 95.0, 110.0]
    slower = ";".join(str(1.05 * s) for s in stock)
    noisy = ";".join(str(s * f) for s, f in zip(stock, (0.8, 1.25, 0.9, 1.2, 0.85, 1.15, 1.1, 0.95)))
    same = ";".join(str(s * f) for s, f in zip(stock, (1.001, 0.999, 1.002, 0.998, 1.0, 1.001, 0.999, 1.0)))
    joined = ";".join(map(str, stock))
    assert step_verdict(joined, slower)["verdict"] == "SLOWER"
    assert step_verdict(joined, slower)["ratio"] == pytest.approx(1.05)
    assert step_verdict(joined, noisy)["verdict"] == "AMBIGUOUS"
    assert step_verdict(joined, same)["verdict"] == "SAME"
    assert step_verdict(joined, "100.0")["verdict"] == "AMBIGUOUS"  # one sample: no interval
    e2e = pd.DataFrame([{"model": "A", "step": "prefill", "tokens": 8, "variant": v, "status": "ok", "us": 100.0,
                         "samples_us": s} for v, s in (("stock", joined), ("patched", slower))])
    row = predictions(e2e).iloc[0]
    assert row["verdict"] == "SLOWER" and row["rounds"] == 8 and "predicted" not in row


def test_a_sample_is_the_fastest_of_its_repeats_and_the_variants_alternate(tmp_path, monkeypatch):
    """Each (round, step, variant) sample is the minimum of `repeats` timed calls, and a step's timed calls alternate
    between the variants A B B A A B, so that a slow phase of the host hits both."""
    import bench.e2e as e2e
    from dispatch.patching import DispatchedLinear
    seen, model_ref = [], []
    times = iter([5.0, 6.0, 3.0, 2.0, 4.0, 7.0] * 1000)  # A B B A A B: A's fastest 2, B's 3

    def fake(fn, sync):
        fn()
        seen.append("patched" if any(isinstance(m, DispatchedLinear) for m in model_ref[0].modules()) else "stock")
        return next(times)
    real_build = e2e.build_model

    def build(*a, **k):
        model_ref.append(real_build(*a, **k))
        return model_ref[0]
    monkeypatch.setattr(e2e, "_timed", fake)
    monkeypatch.setattr(e2e, "build_model", build)
    rows = e2e.run_e2e(e2e.E2EConfig("tiny", TINY, tmp_path, layers=1, prefill=(4, 6), generate_tokens=2, rounds=2,
                                     repeats=3, device="cpu"))
    timed = {(r["step"], r["tokens"], r["variant"]): r for r in rows if r["status"] == "ok"}
    assert len(timed) == 6 and all(r["samples"] == 2 for r in timed.values())
    assert len(seen) == 2 * 3 * 6  # per round: 3 steps x 6 alternating timed calls; warm-up calls are not timed
    for block in (seen[i:i + 6] for i in range(0, len(seen), 6)):
        a, b = block[0], block[1]
        assert a != b and block == [a, b, b, a, a, b]
    # the first variant of each round gets 2.0, the second 3.0; the order is shuffled per round
    assert {tuple(sorted(r["samples_us"])) for r in timed.values()} <= {(2.0, 3.0), (2.0, 2.0), (3.0, 3.0)}


def test_an_interrupt_after_a_round_keeps_the_whole_rounds_and_calibrate_wants_partial(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM in round 2: the rows of round 1 (one sample each, the half-done round dropped); before any
    round finished, nothing. calibrate e2e gives no verdict on an interrupted run unless --partial."""
    import bench.e2e as e2e
    from calibrate.e2e_terms import load_e2e
    from harness.errors import HarnessError, Terminated
    real = e2e._round

    def stop_in_round_2(cfg, model, prompts, r, rng, got):
        if r == 1:
            got.samples[("prefill", 4, "stock")].append(1.0)  # a half-done round
            raise Terminated()
        real(cfg, model, prompts, r, rng, got)
    monkeypatch.setattr(e2e, "_round", stop_in_round_2)
    cfg = e2e.E2EConfig("tiny", TINY, tmp_path, layers=1, prefill=(4,), generate_tokens=2, rounds=3, repeats=1,
                        device="cpu")
    with pytest.raises(e2e.RoundsInterrupted) as stop:
        e2e.run_e2e(cfg)
    assert stop.value.rounds == 1 and stop.value.signum == 15
    assert all(r["samples"] == 1 for r in stop.value.rows if r["status"] == "ok")
    e2e.write_e2e(tmp_path / "out", stop.value.rows, {"kind": "e2e", "status": "interrupted", "rounds": 3,
                                                      "rounds_done": 1})
    with pytest.raises(HarnessError, match="interrupted after 1 of 3 rounds; no verdict on it .*--partial"):
        load_e2e(tmp_path / "out")
    assert not load_e2e(tmp_path / "out", partial=True)[0].empty
    monkeypatch.setattr(e2e, "_round", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt) as first:
        e2e.run_e2e(cfg)
    assert not isinstance(first.value, e2e.RoundsInterrupted)


def _e2e_frame(model: str, stock: list[float], patched: list[float], logits_rel_err: float = 0.0,
               steps=(("prefill", 8), ("generate", 4))):
    import pandas as pd
    return pd.DataFrame([{"model": model, "step": step, "tokens": n, "variant": v, "status": "ok", "us": 100.0,
                          "samples_us": ";".join(map(str, s)), "logits_rel_err": logits_rel_err if v == "patched"
                          else 0.0} for step, n in steps for v, s in (("stock", stock), ("patched", patched))])


def test_a_control_run_sets_each_steps_margin_from_its_medians_move():
    """A/A runs (bench e2e --control) widen a step's SAME band to the farthest their medians moved from 1: a step 3%
    slower in every round is SLOWER against the 1% margin and SAME against a control whose median moved 4%. A
    control of another model, one whose patched logits differ (no A/A run) or one lacking a step is refused."""
    from calibrate.e2e_terms import E2E_MARGIN, control_margins, predictions
    from harness.errors import HarnessError
    stock = [100.0, 140.0, 90.0, 120.0, 100.0, 150.0, 95.0, 110.0]
    run = _e2e_frame("A", stock, [1.03 * s for s in stock])
    quiet = _e2e_frame("A", stock, [1.002 * s for s in stock])
    moved = _e2e_frame("A", stock, [0.96 * s for s in stock])
    assert set(predictions(run)["verdict"]) == {"SLOWER"}
    margins = control_margins(run, [("quiet", quiet), ("moved", moved)])
    assert margins == {("prefill", 8): pytest.approx(0.04), ("generate", 4): pytest.approx(0.04)}
    assert control_margins(run, [("quiet", quiet)]) == {("prefill", 8): E2E_MARGIN, ("generate", 4): E2E_MARGIN}
    judged = predictions(run, margins=margins)
    assert set(judged["verdict"]) == {"SAME"} and list(judged["margin"]) == pytest.approx([0.04, 0.04])
    with pytest.raises(HarnessError, match="ran B, not A; pass a control run of the same model"):
        control_margins(run, [("other", _e2e_frame("B", stock, stock))])
    with pytest.raises(HarnessError, match="patched logits differ from the stock ones, so it is no A/A run"):
        control_margins(run, [("real", _e2e_frame("A", stock, stock, logits_rel_err=0.002))])
    with pytest.raises(HarnessError, match="has no generate at 4 tokens in both variants; run the control with the "
                                           "same --prefill and --tokens"):
        control_margins(run, [("short", _e2e_frame("A", stock, stock, steps=(("prefill", 8),)))])


def test_calibrate_e2e_control_from_the_command_line(tmp_path, capsys):
    """calibrate e2e RUN --control-runs DIR prints each step's margin; a control of other --layers is one line."""
    from bench.e2e import write_e2e
    from calibrate.__main__ import main
    from harness.errors import HarnessError
    stock = [100.0, 140.0, 90.0, 120.0, 100.0, 150.0, 95.0, 110.0]
    fp = {"fingerprint": {"gpu_name": "NVIDIA H200", "sm": 90}, "kind": "e2e", "profile": "h200"}
    for name, factor, layers in (("run", 1.03, None), ("aa", 0.96, None), ("aa-2", 1.0, 2)):
        write_e2e(tmp_path / name, _e2e_frame("A", stock, [factor * s for s in stock]).to_dict("records"),
                  {**fp, "layers": layers})
    assert main(["e2e", str(tmp_path / "run"), "--control-runs", str(tmp_path / "aa")]) == 0
    out = capsys.readouterr().out
    assert "margin" in [line for line in out.splitlines() if not line.startswith("note")][0] and "SAME within ±margin" in out and "SLOWER" not in out
    with pytest.raises(HarnessError, match="ran --layers 2, .* --layers all; run the control with the same --layers"):
        main(["e2e", str(tmp_path / "run"), "--control-runs", str(tmp_path / "aa-2")])
    write_e2e(tmp_path / "aa-cut", _e2e_frame("A", stock, stock).to_dict("records"),
              {**fp, "status": "interrupted", "rounds": 10, "rounds_done": 8})
    with pytest.raises(HarnessError, match="interrupted after 8 of 10 rounds"):
        main(["e2e", str(tmp_path / "run"), "--control-runs", str(tmp_path / "aa-cut")])
    capsys.readouterr()
    assert main(["e2e", str(tmp_path / "run"), "--control-runs", str(tmp_path / "aa-cut"), "--partial"]) == 0
    assert "note (--partial): " + str(tmp_path / "aa-cut") + " holds 8 of 10 rounds" in capsys.readouterr().out
    with pytest.raises(HarnessError, match="are the same run"):
        main(["e2e", str(tmp_path / "run"), "--control-runs", str(tmp_path / "run")])
    write_e2e(tmp_path / "aa-short", _e2e_frame("A", stock, stock).to_dict("records"),
              {**fp, "status": "interrupted", "rounds": 10, "rounds_done": 4})
    with pytest.raises(HarnessError, match="holds 8 samples where run.json records 4 rounds"):
        main(["e2e", str(tmp_path / "aa-short"), "--partial"])


def test_bench_e2e_control_runs_a_table_of_no_ranges_and_excludes_table(tmp_path):
    from bench.cli import main
    from bench.commands.options import no_ranges
    from harness.errors import HarnessError
    from dispatch.profiles import get_profile
    table = no_ranges(get_profile("h200"))
    assert all(table.choose(n, 2048, m, r) == "aten" for n in (1, 4096) for m in (1, 64, 16384)
               for r in ("graph", "eager"))
    with pytest.raises(HarnessError, match="--control runs a table of no ranges; it excludes --table"):
        main(["e2e", "--gpu", "h200", "--control", "--table", "x.json", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_an_e2e_run_says_which_kernels_its_model_ran(tmp_path, monkeypatch):
    """run.json records the linear-attention kernels' package (or the PyTorch reference); calibrate e2e labels a run
    on the reference kernels as such, and an older run without the record says so."""
    import importlib.metadata

    import bench.e2e as e2e
    from calibrate.commands.e2e import kernels_note
    real = importlib.import_module

    def only_fla(name, *a, **k):
        if name == "causal_conv1d":
            raise ImportError(name)
        return object() if name == "fla" else real(name, *a, **k)
    monkeypatch.setattr(importlib, "import_module", only_fla)
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "0.6.0")
    kernels = e2e.model_kernels()
    assert kernels == {"gated_delta_rule": "flash-linear-attention 0.6.0", "causal_conv1d": e2e.REFERENCE}
    note = kernels_note({"model_kernels": kernels}, "run")
    assert note.startswith("note: run ran transformers' PyTorch reference kernels for 1 of its 2 ops")
    assert note.endswith("install causal-conv1d for the kernels a user runs")  # the missing one, not fla
    assert kernels_note({"model_kernels": {"gated_delta_rule": "flash-linear-attention 0.6.0"}}, "run") == \
        "model kernels: gated_delta_rule: flash-linear-attention 0.6.0"
    assert "does not record" in kernels_note({}, "run")


def test_the_patched_variant_binds_each_linear_once_across_its_switches(monkeypatch):
    """bench e2e patches and unpatches the model around every timed call; the bindings survive the switches, so a
    timed patched call never pays for binding every linear again, and a changed weight is bound anew."""
    import torch

    from bench.e2e import _as_variant, _Measured
    from dispatch.patching import DispatchedLinear
    binds = []
    monkeypatch.setattr(DispatchedLinear, "_bind", lambda self, w: binds.append(w) or (lambda x: x @ w.t()))
    model = torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False, dtype=torch.bfloat16),
                                torch.nn.Linear(4, 8, bias=False, dtype=torch.bfloat16))
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    got = _Measured()
    for variant in ("patched", "stock", "patched", "patched"):
        with _as_variant(model, variant, got), torch.no_grad():
            model(x)
    assert len(binds) == 2 and got.patched_count == 2
    with torch.no_grad():
        model[0].weight = torch.nn.Parameter(torch.randn(4, 8, dtype=torch.bfloat16))
    with _as_variant(model, "patched", got), torch.no_grad():
        model(x)
    assert len(binds) == 3 and type(model[0]) is torch.nn.Linear  # the new weight bound; unpatched on the way out
