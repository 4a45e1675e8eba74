"""CPU tests of the bench logic with fake timers: attribution, kernel counts, sizing, statistics, results files."""
import json
import shutil
from pathlib import Path

import pytest

from bench.paths import PATHS, paths_for
from bench.results import COLUMNS, done_keys, load_results, write_results, write_run_json
from bench.stats import (KernelCountError, KernelRecord, Window, attribute, calls_per_graph, kernels_per_call, quantile,
                         rotation_count, summary)
from dispatch.profiles import check_device, get_profile
from harness.errors import HarnessError

DATA = Path(__file__).parent / "data"

L2 = 62_914_560  # H200, as torch reports it


def test_rotation_touches_five_l2s_until_capped():
    w = 2048 * 4096 * 2
    r = rotation_count(w, L2)
    assert r * w >= 5 * L2 and (r - 1) * w < 5 * L2
    assert rotation_count(10 * L2, L2) == 1
    assert rotation_count(4096, L2, cap=512) == 512


def test_calls_per_graph_covers_every_copy():
    assert calls_per_graph(19, est_call_us=8) >= 19
    assert calls_per_graph(1, est_call_us=5) == 100  # 500 µs target
    assert calls_per_graph(1, est_call_us=30_000) == 1


def test_quantiles_match_numpy():
    """The pure-Python quantile is numpy's linear method: over samples of every size a sweep takes, ties, negative
    values, the bounds and NaN; bad input is refused as numpy refuses it."""
    import math
    import random
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 3.0, 9.0, 7.0, 2.0]
    for q in (0.2, 0.5, 0.8):
        assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))
    assert summary([1.0, 2.0, 3.0]) == (2.0, pytest.approx(1.4), pytest.approx(2.6))
    rng = random.Random(7)
    for _ in range(2000):
        sample = [rng.choice((rng.uniform(0, 1e4), rng.uniform(-10, 10), float(rng.randint(0, 3))))
                  for _ in range(rng.randint(1, 40))]
        for q in (0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0, rng.random()):
            assert math.isclose(quantile(sample, q), float(np.quantile(sample, q)), rel_tol=1e-12, abs_tol=1e-12)
        assert summary(sample) == tuple(quantile(sample, q) for q in (0.5, 0.2, 0.8))
    assert math.isnan(quantile([1.0, float("nan"), 2.0], 0.5))
    assert quantile((4, 2), 0.5) == 3.0  # ints and tuples, as numpy takes them
    for bad, q in (([], 0.5), ([1.0], 1.5), ([1.0], -0.1)):
        with pytest.raises(ValueError):
            quantile(bad, q)


def _fake_replays(per_call, calls, windows, gap=1000, dur=500, extra=None):
    """Kernel records as CUPTI would report them for back-to-back replays; eager kernels have graph id 0."""
    recs, t = [], 10_000
    out_windows = []
    for i, path in enumerate(windows):
        t0 = t
        for c in range(calls):
            for j in range(per_call[path]):
                recs.append(KernelRecord(t, t + dur, f"{path}_k{j}", graph_id=7))
                t += dur + 10
        if extra and i in extra:
            recs.append(KernelRecord(t, t + dur, "stray", graph_id=7))
            t += dur
        recs.append(KernelRecord(t + 1, t + 2, "sleep", graph_id=0))
        t += gap
        out_windows.append(Window(path, i, t0 - 1, t - 1))
    return sorted(recs, key=lambda r: r.start), out_windows


def test_attribution_by_window_and_busy_time():
    recs, windows = _fake_replays({"a": 2, "b": 1}, calls=4, windows=["a", "b", "b", "a"])
    timings = attribute(recs, windows, {"a": 8, "b": 4})
    assert [t.count for t in timings] == [8, 4, 4, 8]
    assert timings[0].busy_ns == 8 * 500 and timings[1].busy_ns == 4 * 500
    assert timings[1].span_ns == 4 * 500 + 3 * 10
    assert "sleep" not in timings[0].names


def test_extra_or_missing_kernels_fail_loudly():
    recs, windows = _fake_replays({"a": 1}, calls=4, windows=["a", "a"], extra={1})
    with pytest.raises(KernelCountError, match="5 kernel records"):
        attribute(recs, windows, {"a": 4})
    with pytest.raises(KernelCountError, match="expected 4"):
        attribute(recs[:2], windows[:1], {"a": 4})
    assert kernels_per_call(8, 4, "a") == 2
    with pytest.raises(KernelCountError):
        kernels_per_call(7, 4, "a")
    with pytest.raises(KernelCountError):
        kernels_per_call(0, 4, "a")


def test_profiles_and_device_check():
    assert get_profile("H200").sm == 90
    with pytest.raises(HarnessError, match="unknown GPU profile"):
        get_profile("a100")
    check_device(get_profile("h200"), "NVIDIA H200", 90)
    with pytest.raises(HarnessError, match="--allow-mismatch"):
        check_device(get_profile("h200"), "NVIDIA H100 80GB HBM3", 90)
    with pytest.raises(HarnessError):
        check_device(get_profile("b200"), "NVIDIA GB200", 100)
    check_device(get_profile("b200"), "NVIDIA GB200", 100, allow_mismatch=True)


def test_path_registry_gates():
    assert [p.name for p in paths_for(get_profile("h200").flashinfer_backends)] == [
        "aten", "flashinfer:tinygemm", "flashinfer-lean:tinygemm", "flashinfer:cublaslt", "flashinfer-lean:cublaslt",
        "flashinfer:cudnn", "triton:gemv", "dispatch"]
    # one rule per backend, whichever call (public or lean) runs it
    assert PATHS["flashinfer-lean:tinygemm"].skip_reason(90, 1, 2048, 8) == PATHS["flashinfer:tinygemm"].skip_reason(90, 1, 2048, 8)
    assert "SM100" in PATHS["flashinfer:cute-dsl"].skip_reason(90, 2048, 4096, 8)
    assert "N % 16" in PATHS["flashinfer:tinygemm"].skip_reason(90, 1, 2048, 8)
    assert PATHS["flashinfer:cute-dsl"].skip_reason(100, 2048, 64, 8).startswith("flashinfer:cute-dsl needs K % 128")
    assert PATHS["aten"].skip_reason(90, 1, 2048, 16384) is None
    with pytest.raises(HarnessError, match="unknown path"):
        paths_for((), "aten,nope")


def _row(n, k, m, path, **kw):
    return {"shape": f"n{n}_k{k}", "n": n, "k": k, "m": m, "path": path, "status": "ok", "gpu_us": 1.0,
            "gpu_us_p20": 0.9, "gpu_us_p80": 1.1, "event_us": 1.0, "host_us": 20.0, "kernels": ("a", "b"),
            "kernels_per_call": 1, "timer": "cupti", "rel_err": 1e-3, **kw}


def test_results_roundtrip_and_resume(tmp_path):
    rows = [_row(64, 2048, m, "aten") for m in (1, 8)]
    path = write_results(tmp_path, rows)
    write_run_json(tmp_path, {"shapes": ["n64_k2048"], "ms": [1, 8], "paths": ["aten"], "status": "complete"})
    assert path.read_text().splitlines()[0].split(",") == list(COLUMNS)
    df = load_results(tmp_path)
    assert list(df["kernels"]) == ["a;b", "a;b"]
    kept, keys = done_keys(tmp_path)
    assert keys == {(64, 2048, 1, "aten"), (64, 2048, 8, "aten")} and len(kept) == 2
    write_results(tmp_path, kept + [_row(64, 2048, 16, "aten")])  # resumed rows survive a rewrite
    partial = load_results(tmp_path, partial=True)
    assert len(partial) == 2  # a row outside the run's grid is not judged, and the caller is told
    assert partial.attrs["incomplete"] == ["1 row(s) outside the run's grid left out"]
    write_run_json(tmp_path, {"shapes": ["n64_k2048"], "ms": [1, 8, 16], "paths": ["aten"], "status": "complete"})
    assert len(load_results(tmp_path)) == 3
    assert not list(tmp_path.glob(".results.csv.*"))  # no temp file left behind


def test_results_written_as_they_grow_match_a_full_rewrite(tmp_path):
    """A sweep rewrites results.csv as cells finish, formatting each row once (CsvLines): every write reads back
    as the whole list written afresh, resumed rows included; a list that shrank is refused, not half-written."""
    from bench.results import CsvLines, rows_to_csv
    kept = [_row(64, 2048, 1, "aten", tags=("a", "b"), tune_s=None)]
    write_results(tmp_path, kept)
    rows, lines = done_keys(tmp_path)[0], CsvLines()
    for m in (8, 16, 32):
        rows += [_row(64, 2048, m, "aten", gpu_us=1.0 / 3), _row(64, 2048, m, "triton:gemv", status="skipped")]
        write_results(tmp_path, rows, lines)
        assert (tmp_path / "results.csv").read_text() == rows_to_csv(rows)
    assert len(lines.lines) == len(rows) == 7
    with pytest.raises(ValueError, match="only grows"):
        lines.text(rows[:2])


def test_replay_pass_survives_the_table_and_an_older_run_gets_one_at_load(tmp_path):
    """A row's pass token reads back as the string written (never a number); a run recorded before the column gets
    the passes its timing implied (bench.results.legacy_passes)."""
    from bench.results import LEGACY_PASS
    rows = [{**_row(64, 2048, m, "aten"), "replay_pass": token} for m, token in ((1, "p1e5"), (8, "p000123"))]
    write_results(tmp_path, rows)
    write_run_json(tmp_path, {"shapes": ["n64_k2048"], "ms": [1, 8], "paths": ["aten"], "status": "complete"})
    assert list(load_results(tmp_path)["replay_pass"]) == ["p1e5", "p000123"]
    old = tmp_path / "old"
    old.mkdir()
    import csv
    rows_read = list(csv.reader((tmp_path / "results.csv").read_text().splitlines()))
    drop = rows_read[0].index("replay_pass")  # a run recorded before the column
    (old / "results.csv").write_text("\n".join(",".join(r[:drop] + r[drop + 1:]) for r in rows_read) + "\n")
    (old / "run.json").write_text((tmp_path / "run.json").read_text())
    assert list(load_results(old)["replay_pass"]) == [LEGACY_PASS, LEGACY_PASS]


@pytest.mark.parametrize("content,needle", [
    (None, "not found"), ("", "cannot read|no rows"), ("n,k,m\n1,2,3\n", "lacks column"),
])
def test_bad_results_files(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "results.csv").write_text(content)
    with pytest.raises(HarnessError, match=needle):
        load_results(tmp_path)


def test_bench_cli_bad_input(capsys):
    from bench.__main__ import main
    from harness.errors import run_cli
    assert run_cli(main, "bench", ["run", "--gpu", "x100"]) == 2
    assert "unknown GPU profile" in capsys.readouterr().err
    assert run_cli(main, "bench", ["run", "--gpu", "h200", "--shapes", "n3_k3"]) == 2
    assert "not in the catalog" in capsys.readouterr().err


def test_bench_without_gpu_writes_nothing(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from bench.__main__ import main
    from harness.errors import run_cli
    out = tmp_path / "out"
    assert run_cli(main, "bench", ["run", "--gpu", "h200", "--out", str(out)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_resume_keeps_earlier_legs(tmp_path):
    from bench.results import write_run_json
    from bench.sweep import previous_legs
    write_run_json(tmp_path, {"command": "leg1", "started": "t1", "wall_s": 560.0, "status": "interrupted"})
    legs = previous_legs(tmp_path / "run.json")
    write_run_json(tmp_path, {"command": "leg2", "started": "t2", "wall_s": 50.0, "status": "complete",
                              "previous_legs": legs})
    assert [l["command"] for l in previous_legs(tmp_path / "run.json")] == ["leg1", "leg2"]
    (tmp_path / "run.json").write_text("{broken")
    assert "unreadable" in previous_legs(tmp_path / "run.json")[0]["error"]


def test_detect_profile_tells_gb200_from_b200():
    from dispatch.profiles import detect_profile
    assert detect_profile("NVIDIA GB200", 100).name == "gb200"
    assert detect_profile("NVIDIA B200", 100).name == "b200"
    assert detect_profile("NVIDIA H200", 90).name == "h200"
    assert detect_profile("NVIDIA H200", 100) is None and detect_profile("NVIDIA A100", 80) is None


def test_phase_timer_accumulates_wall_time_per_phase_even_on_errors():
    import time as _time

    from bench.stats import PhaseTimer
    phase = PhaseTimer()
    for _ in range(2):
        with phase("capture"):
            _time.sleep(0.01)
    with pytest.raises(RuntimeError):
        with phase("replay"):
            _time.sleep(0.05)
            raise RuntimeError("a failing cell")
    out = phase.rounded()
    assert list(out) == ["replay", "capture"]  # largest first
    assert 0.015 <= phase.seconds["capture"] < 0.2 and 0.045 <= phase.seconds["replay"] < 0.3


@pytest.mark.parametrize("name, sm, profile", [
    ("NVIDIA H200", 90, "h200"), ("NVIDIA H200 NVL", 90, "h200"), ("NVIDIA GH200 480GB", 90, None),
    ("NVIDIA H100 80GB HBM3", 90, "h100"), ("NVIDIA B200", 100, "b200"), ("NVIDIA GB200", 100, "gb200"),
    ("NVIDIA H200", 100, None),
])
def test_one_gpu_identity_rule_takes_whole_model_names(name, sm, profile):
    from dispatch.profiles import detect_profile
    found = detect_profile(name, sm)
    assert (found.name if found else None) == profile


@pytest.mark.parametrize("profile", ["h100", "h200", "b200", "gb200"])
def test_a_dry_run_prints_the_plan_of_every_profile_without_a_gpu(profile, tmp_path, capsys):
    from bench.__main__ import main
    from dispatch.profiles import get_profile
    out = tmp_path / "out"
    assert main(["run", "--gpu", profile, "--dry-run", "--paths", "aten,flashinfer:tinygemm,flashinfer:cute-dsl",
                 "--m", "8,64,4096", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    sm = get_profile(profile).sm
    assert f"dry run: {profile} (SM{sm}), 16 shapes x 3 M x 3 paths = 144 rows" in text
    if sm == 90:  # CuTe DSL needs SM100: every cell skipped, with the reason
        assert "skipped   48: flashinfer:cute-dsl needs SM100/103/107" in text
    else:  # N = 1 runs on cute-dsl (vLLM's rule has no N multiple), K % 128 holds for every catalog K
        assert "flashinfer:cute-dsl    low-m         48 cells measured" in text
    assert "skipped    3: flashinfer:tinygemm needs N % 16 == 0" in text and "is a low-M kernel" in text
    assert "estimated" in text and not out.exists()


def test_every_flashinfer_path_sends_its_own_backend_and_pdl(monkeypatch):
    """A fake flashinfer module (of no version the lean calls know, so they take the public call and say so) records
    what each registry path and the dispatcher's kernels send to mm_bf16: their own backend, and pdl exactly where
    the backend takes it (vLLM's pdl=True on SM >= 90; cuBLASLt raises on it, cuDNN ignores it)."""
    import sys
    import types

    import torch
    sent = []

    def mm_bf16(a, b, **kwargs):
        sent.append(kwargs)
        return a @ b
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(mm_bf16=mm_bf16, __version__="0.0.fake"))
    from bench.paths import PATHS
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    takes_pdl = {"tinygemm", "cute-dsl", "tgv"}
    for path in PATHS.values():
        if path.backend is None or path.name.startswith("vllm-op:"):  # a CUDA-only op: tests/test_vllm.py
            continue
        for pdl in (False, True):
            sent.clear()
            assert torch.allclose(path.build(pdl)(x, w), x @ w.t())
            assert [(s["backend"], s["pdl"]) for s in sent] == [(path.backend.name, pdl and path.backend.name in takes_pdl)], path.name
    import dispatch.layers
    for path, pdl in (("flashinfer:cute-dsl", True), ("flashinfer-lean:cute-dsl", True), ("flashinfer:cublaslt", True)):
        kernel = dispatch.layers._kernel(path, pdl)
        sent.clear()
        kernel(x, w, None)
        assert [(s["backend"], s["pdl"]) for s in sent] == [(path.split(":")[1], "cublaslt" not in path)]
    dispatch.reset()
    dispatch.layers._STATE.kernels.clear()


def test_a_damaged_results_file_stops_a_resume_with_one_line(tmp_path):
    (tmp_path / "results.csv").write_text("n,k,m,path\n64,2048,eight,aten\n")
    with pytest.raises(HarnessError, match="not an integer"):
        done_keys(tmp_path)
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(HarnessError, match="is not a results table"):
        done_keys(tmp_path)


def test_flashinfer_choices_records_the_runner_that_ran_not_the_autotuners_answer(monkeypatch):
    """bf16_gemm_sm100 replaces a cached CuTe DSL entry that does not fit the real M by runners[0] with tactic -1;
    the recorded choice is what ran (a fake flashinfer.autotuner with FlashInfer's TunableRunner.__call__)."""
    import sys
    import types

    from bench.gpu import flashinfer_choices

    class TunableRunner:
        def __call__(self, inputs, **kwargs):
            return self.forward(inputs, **kwargs)

    class Direct(TunableRunner):
        def forward(self, inputs, tactic=-1):
            return "direct"

    class Fallback(TunableRunner):
        def forward(self, inputs, tactic=-1):
            return "fallback"

    class AutoTuner:
        def choose_one(self, *args):
            return Direct(), 7

    def gemm():  # the shape of bf16_gemm_sm100: the tuner's answer, a post-check, the call
        runner, tactic = AutoTuner().choose_one()
        runner, tactic = Fallback(), -1  # the post-check failed
        return runner(inputs=[], tactic=tactic)

    fake = types.ModuleType("flashinfer.autotuner")
    fake.TunableRunner, fake.AutoTuner = TunableRunner, AutoTuner
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.autotuner", fake)
    with flashinfer_choices() as seen:
        assert gemm() == "fallback"
    assert seen == [("Fallback", -1)]
    assert TunableRunner.__call__.__name__ == "__call__"  # restored


def test_a_low_m_path_far_behind_f_linear_is_skipped_above_that_m():
    from bench.skips import Skips, hopeless_after, split_runnable
    from bench.paths import PATHS
    from shapes.catalog import catalog
    rows = [{"path": "aten", "status": "ok", "gpu_us": 10.0, "host_us": 15.0},
            {"path": "flashinfer-lean:tinygemm", "status": "ok", "gpu_us": 40.0},
            {"path": "flashinfer:tinygemm", "status": "ok", "gpu_us": 25.0},  # 2.5x GPU but under 2x the eager cost
            {"path": "flashinfer-lean:cublaslt", "status": "ok", "gpu_us": 90.0}]  # not a low-M path: never skipped
    hopeless = hopeless_after(rows, 64, 2.0)
    assert list(hopeless) == ["flashinfer-lean:tinygemm"] and "M = 64" in hopeless["flashinfer-lean:tinygemm"]
    assert hopeless_after(rows, 64, None) == {}
    shape = next(s for s in catalog() if s.n % 16 == 0)
    paths = [PATHS[p] for p in ("aten", "flashinfer-lean:tinygemm", "flashinfer:tinygemm")]
    live, skipped = split_runnable(paths, shape, 128, Skips(90, "cupti"), hopeless)
    assert [p.name for p in live] == ["aten", "flashinfer:tinygemm"]
    assert skipped[0]["path"] == "flashinfer-lean:tinygemm" and "--all" in skipped[0]["reason"]


def test_a_backend_the_dispatcher_cannot_choose_is_a_skipped_row_unless_asked_for():
    from bench.paths import unchoosable_reason
    from bench.skips import Skips, split_runnable
    from shapes.catalog import catalog
    assert unchoosable_reason(PATHS["flashinfer:cudnn"]) and not unchoosable_reason(PATHS["flashinfer:cublaslt"])
    assert not unchoosable_reason(PATHS["aten"]) and not unchoosable_reason(PATHS["flashinfer-lean:tinygemm"])
    paths = [PATHS[p] for p in ("aten", "flashinfer:cudnn")]
    shape = catalog()[0]
    live, skipped = split_runnable(paths, shape, 8, Skips(90, "cupti", skip_unchoosable=True))
    assert [p.name for p in live] == ["aten"] and skipped[0]["status"] == "skipped" and "--all" in skipped[0]["reason"]
    live, skipped = split_runnable(paths, shape, 8, Skips(90, "cupti"))
    assert len(live) == 2 and not skipped


class _FakeCupti:
    """A CUPTI stand-in on a counter clock: each fake graph replay records its kernels at the current time."""
    name = "cupti"

    def __init__(self):
        self.t, self.records = 0, []

    def now(self) -> int:
        self.t += 1
        return self.t

    def drain(self) -> list:
        out, self.records = sorted(self.records, key=lambda r: r.start), []
        return out


class _FakeGraph:
    def __init__(self, clock: _FakeCupti, kernels: tuple[str, ...], ns: list[int], log: list, name: str):
        self.clock, self.kernels, self.ns, self.log, self.name, self.i = clock, kernels, ns, log, name, 0

    def replay(self) -> None:
        from bench.stats import KernelRecord
        ns = self.ns[min(self.i, len(self.ns) - 1)]
        self.i += 1
        self.log.append(self.name)
        for k in self.kernels:
            start = self.clock.now()
            self.clock.records.append(KernelRecord(start, start + ns, k, graph_id=1))
            self.clock.t += ns


def _fake_cuda(monkeypatch, event_ms: dict):
    import torch
    import bench.gpu as gpu

    class Event:
        def __init__(self, enable_timing=True):
            self.t = 0.0

        def record(self):
            self.t = event_ms["now"]

        def elapsed_time(self, other):
            return other.t - self.t
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda *a, **k: None)
    monkeypatch.setattr(gpu, "sleep_cycles_per_us", lambda: 1.0)


def test_twins_with_the_same_kernels_are_replayed_once_and_a_mismatch_is_timed_in_full(monkeypatch):
    """A public call whose warm-up kernels match its lean twin's is not replayed after the warm-up: its timing is the
    twin's, gpu_from says so; the dispatcher with other kernels than every candidate is timed itself, in a second
    pass (its warm-ups again, then its timed replays)."""
    from bench.gpu import Replays, replay_interleaved
    from bench.paths import kernel_twins
    clock, log, ms = _FakeCupti(), [], {"now": 0.0}
    _fake_cuda(monkeypatch, ms)
    graphs = {"aten": _FakeGraph(clock, ("gemm_a",), [100], log, "aten"),
              "flashinfer-lean:cublaslt": _FakeGraph(clock, ("lt",), [80], log, "lean"),
              "flashinfer:cublaslt": _FakeGraph(clock, ("lt",), [80], log, "public"),
              "dispatch": _FakeGraph(clock, ("other",), [90], log, "dispatch")}
    twins = kernel_twins(list(graphs))
    assert twins == {"flashinfer:cublaslt": ("flashinfer-lean:cublaslt",),
                     "dispatch": ("flashinfer-lean:cublaslt", "aten", "flashinfer:cublaslt")}
    out = replay_interleaved(clock, graphs, Replays(1, 4, twins=twins))
    assert log.count("public") == 2 and log.count("lean") == 6 and log.count("dispatch") == 2 + 6
    assert out["flashinfer:cublaslt"].gpu_from == "flashinfer-lean:cublaslt" and out["dispatch"].gpu_from is None
    assert out["flashinfer:cublaslt"].gpu_us == out["flashinfer-lean:cublaslt"].gpu_us == [0.08] * 4
    assert out["dispatch"].gpu_us == [0.09] * 4
    # one pass token per interleaved pass: a read-off twin keeps its twin's, the second pass has its own
    passes = {p: t.replay_pass for p, t in out.items()}
    assert passes["aten"] == passes["flashinfer-lean:cublaslt"] == passes["flashinfer:cublaslt"] != passes["dispatch"]
    assert all(v.startswith("p") and len(v) > 4 for v in passes.values())


def test_without_a_settle_cupti_is_drained_once_and_the_records_are_kept(monkeypatch):
    """One drain per call of replay_interleaved (each costs milliseconds); `keep` gets every record drained, so that
    windows from before the replays (a checked call's) can be read from the same drain."""
    from bench.gpu import Replays, replay_interleaved
    clock, log, ms = _FakeCupti(), [], {"now": 0.0}
    _fake_cuda(monkeypatch, ms)
    drains = []
    drain = clock.drain
    clock.drain = lambda: drains.append(1) or drain()
    from bench.stats import KernelRecord
    clock.records.append(KernelRecord(0, 1, "eager_gemm", graph_id=0))  # an eager call before the replays
    kept: list = []
    out = replay_interleaved(clock, {"a": _FakeGraph(clock, ("k",), [50], log, "a")}, Replays(1, 3, keep=kept))
    assert len(drains) == 1 and out["a"].gpu_us == [0.05] * 3 and out["a"].kernels_per_call == 1
    assert kept[0].name == "eager_gemm" and len(kept) == 1 + 2 + 3


def test_a_public_call_running_its_lean_twins_kernels_is_not_captured(monkeypatch):
    """The sweep reads a public call's GPU time off its lean twin where their checked (eager) calls ran the same
    kernels, without capturing it; where they differ, the public call is captured and timed itself."""
    import bench.sweep as sweep
    from bench.stats import KernelRecord
    from shapes.catalog import catalog
    clock, log, ms = _FakeCupti(), [], {"now": 0.0}
    _fake_cuda(monkeypatch, ms)
    kernels = {"aten": ("gemm_a",), "flashinfer-lean:cublaslt": ("lt",), "flashinfer:cublaslt": ("lt",),
               "flashinfer-lean:tinygemm": ("tg",), "flashinfer:tinygemm": ("tg", "extra")}
    captured = []

    def fake_capture(fn, ops, calls, before=None):
        captured.append(fn.name)
        return _FakeGraph(clock, kernels[fn.name], [70], log, fn.name)
    monkeypatch.setattr(sweep, "capture", fake_capture)
    fns, windows = {}, {}
    for name, ks in kernels.items():  # each checked call ran its kernels eagerly inside its window
        fn = lambda x, w: None  # noqa: E731
        fn.name = name
        fns[name] = fn
        t0 = clock.now()
        for k in ks:
            start = clock.now()
            clock.records.append(KernelRecord(start, start + 1, k, graph_id=0))
        windows[name] = Window(name, 0, t0, clock.now())
    shape = catalog()[0]
    cfg = sweep.SweepConfig(profile=get_profile("h200"), shapes=[shape], ms=[8],
                            paths=[PATHS[n] for n in kernels], out=Path("unused"), samples=3)
    run = sweep.Sweeping(cfg, clock, sweep.PhaseTimer(), fns, 90, L2)
    group = sweep.plan_group(run, shape, 8, cfg.paths)
    group.calls = 1  # a fake graph records one call's kernels per replay
    sweep.time_gpu(run, group, fns, windows)
    assert "flashinfer:cublaslt" not in captured and captured.count("flashinfer:tinygemm") == 1
    rows = group.rows
    assert rows["flashinfer:cublaslt"]["gpu_from"] == "flashinfer-lean:cublaslt"
    assert rows["flashinfer:cublaslt"]["gpu_us"] == rows["flashinfer-lean:cublaslt"]["gpu_us"]
    assert rows["flashinfer:tinygemm"]["gpu_from"] == "" and rows["flashinfer:tinygemm"]["status"] == "ok"
    # the late capture is another pass: its samples never pair with the first pass's
    assert rows["aten"]["replay_pass"] == rows["flashinfer:cublaslt"]["replay_pass"] != rows["flashinfer:tinygemm"][
        "replay_pass"]


def test_replays_stop_once_the_stopping_criterion_is_met(monkeypatch):
    """stdrel: a path whose event times agree stops at min_samples; a noisy one runs to the sample count; each
    says why in `stop`."""
    from bench.gpu import Replays, Stopping, replay_interleaved
    clock, log, ms = _FakeCupti(), [], {"now": 0.0}
    _fake_cuda(monkeypatch, ms)
    steady = _FakeGraph(clock, ("k",), [100], log, "steady")
    noisy = _FakeGraph(clock, ("k2",), [100], log, "noisy")
    times = iter([1.0, 1.0, 1.0, 1.5, 1.0, 1.0, 1.0, 0.5] + [1.0, 1.2] * 10)

    def tick(graph):
        def replay():
            graph.__class__.replay(graph)
            ms["now"] += next(times) if graph.name == "noisy" else 1.0
        return replay
    steady.replay, noisy.replay = tick(steady), tick(noisy)
    out = replay_interleaved(clock, {"steady": steady, "noisy": noisy}, Replays(1, 9, stopping=Stopping(3, 0.01)))
    assert len(out["steady"].gpu_us) == 3 and out["steady"].stop == "stdrel <= 0.01 after 3"
    assert len(out["noisy"].gpu_us) == 9 and out["noisy"].stop == "max samples (9)"


def test_a_cells_run_expects_each_shape_at_its_own_m_only():
    from bench.results import expected_cells
    info = {"shapes": ["a", "b"], "ms": [8, 80, 96], "paths": ["aten"], "cells": {"a": [80, 96], "b": [8]}}
    assert expected_cells(info) == {("a", 80, "aten"), ("a", 96, "aten"), ("b", 8, "aten")}
    del info["cells"]
    assert len(expected_cells(info)) == 6


def test_select_cells_reads_a_spec_or_a_file(tmp_path):
    from shapes.catalog import catalog, select_cells
    shapes, cells = select_cells(catalog(), "n256_k2048:80,96;1024x2048:20")
    assert [s.name for s in shapes] == ["n256_k2048", "n1024_k2048"] and cells["n1024_k2048"] == [20]
    (tmp_path / "c.txt").write_text("n256_k2048:80\n")
    assert select_cells(catalog(), f"@{tmp_path / 'c.txt'}")[1] == {"n256_k2048": [80]}


def test_a_modelled_forward_fails_only_beyond_the_forward_floor():
    from calibrate.analysis import sum_exceeds
    from calibrate.forward_noise import ForwardFloor
    floor = ForwardFloor({"graph": 0.0155, "eager": 0.15})
    assert sum_exceeds(1.02, "graph") and not sum_exceeds(1.02, "graph", floor)
    assert sum_exceeds(1.03, "graph", floor) and not sum_exceeds(1.10, "eager", floor)


def test_one_reference_serves_every_path_of_a_cell():
    """check_output against a reference computed once per cell gives what it gives with its own, and catches a
    wrong output all the same (CPU tensors)."""
    import torch
    from bench.gpu import check_output, reference
    x, w = torch.randn(300, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    ref = reference(x, w)
    assert len(ref[0]) == 256  # at most 256 rows, spread over M
    good = lambda a, b: torch.nn.functional.linear(a, b)
    assert check_output(good, x, w, ref) == check_output(good, x, w) < 2e-2
    assert check_output(lambda a, b: good(a, b) * 1.5, x, w, ref) > 0.3


def _plan(capsys, *extra: str) -> str:
    from bench.__main__ import main
    assert main(["run", "--gpu", "h200", "--dry-run", *extra]) == 0
    return capsys.readouterr().out


def test_a_run_serves_the_tactics_of_the_table_its_dispatcher_runs_unless_it_tunes(tmp_path, capsys):
    """By default a sweep serves the tactics file of the table its dispatch path runs (the file the dispatcher loads),
    so that two runs of one command run the same cuBLASLt kernels; --tune, a tuning-bucket M the file lacks, or a run
    of F.linear alone tunes (or needs nothing)."""
    from harness.shipped import shipped_dir
    shipped = shipped_dir("table") / "h200.autotune.json"
    plan = _plan(capsys)
    assert f"tactics served from {shipped}" in plan and "0 (shape, path) tunings" in plan
    for extra in (["--tune"], ["--m", "768"], ["--paths", "aten"], ["--no-tune"]):
        assert "tactics served" not in _plan(capsys, *extra), extra
    assert "tactics served" in _plan(capsys, "--m", "1,3000")  # 3000 is no bucket: served as the dispatcher serves it
    # another table: its own tactics file, beside it, where it holds the run's cells
    table = json.loads((shipped_dir("table") / "h200.json").read_text())
    table["source"]["tactics"] = {"file": "mine.autotune.json"}
    (tmp_path / "mine.json").write_text(json.dumps(table))
    entries = json.loads(shipped.read_text())
    one = {k: v for k, v in entries.items() if k.startswith("_") or "((1, 2048), (2048, 1024)," in k}
    (tmp_path / "mine.autotune.json").write_text(json.dumps(one))
    shutil.copy(shipped_dir("table") / "h200.autotune.gemv.json", tmp_path)  # the GEMV file the table names
    mine = ["--table", str(tmp_path / "mine.json"), "--shapes", "n1024_k2048"]
    assert f"tactics served from {tmp_path / 'mine.autotune.json'}" in _plan(capsys, *mine, "--m", "1")
    assert "tactics served" not in _plan(capsys, *mine, "--m", "1,2")  # M = 2 is a bucket the file lacks


def test_a_forward_serves_the_tables_tactics_where_they_hold_its_linears():
    from argparse import Namespace

    from bench.commands.options import served as _served
    from bench.forward import FORWARD_MS
    from harness.shipped import shipped_dir
    from shapes.catalog import catalog
    args = Namespace(tune=False, autotune_cache=None, no_tune=False, save_autotune_cache=None)
    h200 = get_profile("h200")
    cells = [(s.n, s.k, m) for s in catalog("Qwen3.5-35B-A3B") for m in FORWARD_MS]
    assert _served(args, h200, None, cells, ["aten", "dispatch"]) == shipped_dir("table") / "h200.autotune.json"
    assert _served(args, h200, None, [*cells, (4096, 4096, 8)], ["aten", "dispatch"]) is None  # a linear it lacks: tune
    assert _served(Namespace(**{**vars(args), "tune": True}), h200, None, cells, ["aten", "dispatch"]) is None


def test_replay_and_host_block_sizes_reach_the_sweep(monkeypatch, tmp_path, capsys):
    """--replay-us sets the GPU time a path's graph aims at (fewer calls per graph, where the rotated copies do not
    set them), --host-calls and --host-rounds the host blocks; the dry run says them."""
    import bench.commands.run as cli
    from bench.cli import main
    from bench.sweep import plan_group
    from shapes.catalog import catalog
    seen = {}
    monkeypatch.setattr(cli, "run_sweep", lambda cfg: seen.setdefault("cfg", cfg))
    args = ["run", "--gpu", "h200", "--replay-us", "125", "--host-calls", "4", "--host-rounds", "3",
            "--out", str(tmp_path / "out")]
    assert main(args) == 0
    cfg = seen["cfg"]
    assert (cfg.target_replay_us, cfg.host_calls, cfg.host_rounds) == (125.0, 4, 3)
    shape = next(s for s in catalog() if (s.n, s.k) == (12288, 2560))  # few rotations: the replay time sets calls
    from bench.sweep import PhaseTimer, Sweeping
    clock = type("Clock", (), {"name": "cupti"})()
    fewer = plan_group(Sweeping(cfg, clock, PhaseTimer(), {}, 90, 50 << 20), shape, 8, cfg.paths).calls
    plain = cli.SweepConfig(profile=cfg.profile, shapes=cfg.shapes, ms=cfg.ms, paths=cfg.paths, out=cfg.out)
    more = plan_group(Sweeping(plain, clock, PhaseTimer(), {}, 90, 50 << 20), shape, 8, cfg.paths).calls
    assert fewer < more
    assert main([*args, "--dry-run"]) == 0
    assert "graphs of ~125 µs; host blocks of 4 calls x 3 rounds" in capsys.readouterr().out


def test_the_source_digest_names_the_code_that_ran(tmp_path):
    """run.json's harness_source changes with any harness source file and with nothing else."""
    from bench.envinfo import source_digest
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.py").write_text("x = 1\n")
    (tmp_path / "bench" / "notes.txt").write_text("not code\n")
    first = source_digest(tmp_path)
    (tmp_path / "bench" / "notes.txt").write_text("still not code\n")
    assert source_digest(tmp_path) == first
    (tmp_path / "bench" / "a.py").write_text("x = 2\n")
    assert source_digest(tmp_path) != first and len(first) == 12


def test_a_project_kernel_path_whose_graph_ran_other_kernels_is_no_measurement_of_it():
    from bench.paths import PATHS
    gemv = PATHS["triton:gemv"]
    assert gemv.foreign_kernels(("gemv_splitk",)) is None
    why = gemv.foreign_kernels(("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "splitKreduce_kernel"))
    assert "fell back while captured" in why and "nvjet" in why
    assert PATHS["triton:gemv-pdl"].foreign_kernels(()) is not None
    assert PATHS["aten"].foreign_kernels(("anything",)) is None  # library paths choose their own kernels


def test_weight_pool_serves_a_shape_s_copies_again_and_drops_another_s():
    from bench.sweep import WeightPool
    pool = WeightPool()
    assert pool.take(64, 128, 4) is None  # empty
    copies = ["w0", "w1", "w2", "w3"]
    pool.keep(64, 128, copies)
    assert pool.take(64, 128, 2) == ["w0", "w1"]  # a later M needs fewer copies: the first ones
    assert pool.take(64, 128, 4) == copies
    assert pool.take(64, 128, 5) is None and pool.ws == []  # too few: emptied, to be made afresh
    pool.keep(64, 128, copies)
    assert pool.take(32, 128, 1) is None and pool.shape is None  # another shape: emptied first


def test_input_pool_serves_a_shape_s_m_from_one_allocation_made_for_its_largest_need():
    """InputPool: one allocation per shape, sized at its first M for the most any of its M takes (inputs_most), each
    M's copies views into it on 256-byte boundaries; a need above it or another shape makes it again."""
    import torch

    from bench.gpu import ALIGN_ELEMENTS, InputPool, aligned
    from bench.sweep import SweepConfig, inputs_most, rotations_of
    from shapes.catalog import catalog
    made = []

    def fill(elements, seed):
        made.append(elements)
        return torch.empty(elements, dtype=torch.bfloat16)  # the values do not matter here, only where views lie
    shape = next(s for s in catalog() if (s.n, s.k) == (2560, 4096))
    cfg = SweepConfig(get_profile("h200"), [shape], [1, 8, 2048, 16384], [], None)
    l2 = 60 << 20
    most = inputs_most(cfg, l2, shape)
    needs = {m: rotations_of(cfg, l2, shape, m) * aligned(m * shape.k) for m in cfg.ms}
    assert most == max(needs.values()) and needs[16384] == most  # the largest M's copies need the most here
    assert rotations_of(cfg, l2, shape, 1) > rotations_of(cfg, l2, shape, 16384) >= 1
    pool = InputPool(fill=fill)
    for m in cfg.ms:
        rot = rotations_of(cfg, l2, shape, m)
        xs = pool.take(shape.n, shape.k, m, rot, most)
        assert len(xs) == rot and all(tuple(x.shape) == (m, shape.k) for x in xs)
        assert all((x.data_ptr() - pool.flat.data_ptr()) % (2 * ALIGN_ELEMENTS) == 0 for x in xs)
        assert len({x.data_ptr() for x in xs}) == rot  # every rotation its own copy
    assert made == [most]  # one allocation served every M
    pool.take(shape.n, shape.k, 16384, rotations_of(cfg, l2, shape, 16384) + 1, most)  # more than it holds
    pool.take(64, 4096, 1, 1, 0)  # another shape
    assert len(made) == 3 and pool.shape == (64, 4096)
    with pytest.raises(ValueError, match="cannot hold"):
        from bench.gpu import copies_of
        copies_of(pool.flat, 64, 4096, 2)


def test_the_dispatch_row_is_read_as_a_pdl_launch_where_its_table_runs_a_pdl_kernel():
    """The dispatch row's pdl column follows its table's graph choice: a pdl TinyGEMM call overlaps the call before
    it, so its kernels' summed durations exceed their span and the row must be read by its span, as that path's own
    row is; cuBLASLt (no pdl), the GEMV (launched plainly), F.linear, a cell the kernel cannot take and a profile
    without pdl are plain launches."""
    from dataclasses import replace

    from bench.sweep import dispatcher_pdl
    from dispatch.table import ThresholdTable
    from shapes.catalog import Shape
    table = ThresholdTable("h100", "tinygemm", {"graph": (), "eager": ()},
                           {(2048, 4096): {"graph": ((8, "flashinfer-lean:tinygemm"), (16, "triton:gemv"),
                                                     (512, "flashinfer-lean:cublaslt")), "eager": ()},
                            (1, 2048): {"graph": ((8, "flashinfer-lean:tinygemm"),), "eager": ()}})
    h100 = get_profile("h100")
    wide, tiny = Shape(2048, 4096, 1, ()), Shape(1, 2048, 1, ())
    assert h100.pdl and dispatcher_pdl(table, h100, 90, wide, 1)
    assert [dispatcher_pdl(table, h100, 90, wide, m) for m in (16, 64, 1024)] == [False, False, False]
    assert not dispatcher_pdl(table, h100, 90, tiny, 1)  # TinyGEMM takes N % 16 == 0 only: F.linear runs
    assert not dispatcher_pdl(table, replace(h100, pdl=False), 90, wide, 1)
    assert not dispatcher_pdl(None, h100, 90, wide, 1)
    from dispatch import gemv  # the GEMV: as its configuration launches
    saved = dict(gemv.STORE.configs)
    try:
        gemv.STORE.configs[(2048, 4096, 16)] = gemv.GemvConfig(16, 256, 4, 4, 16, pdl=True)
        assert dispatcher_pdl(table, h100, 90, wide, 16)
        gemv.STORE.configs[(2048, 4096, 16)] = gemv.GemvConfig(16, 256, 4, 4, 16)
        assert not dispatcher_pdl(table, h100, 90, wide, 16)
    finally:
        gemv.STORE.configs.clear()
        gemv.STORE.configs.update(saved)


def test_a_public_flashinfer_call_is_timed_only_where_the_flashinfer_alone_comparison_runs_it():
    from bench.skips import Skips, split_runnable
    from shapes.catalog import catalog
    names = ("aten", "flashinfer:tinygemm", "flashinfer-lean:tinygemm", "flashinfer:cublaslt",
             "flashinfer-lean:cublaslt")
    paths = [PATHS[p] for p in names]
    skips = Skips(90, "cupti", skip_unchoosable=True, paths=frozenset(names), low_m_backend="tinygemm")
    wide = next(s for s in catalog() if s.n % 16 == 0)
    narrow = next(s for s in catalog() if s.n % 16)  # TinyGEMM cannot run it: cuBLASLt is FlashInfer's there

    def timed(shape, m, hopeless=None, how=skips):
        return {p.name for p in split_runnable(paths, shape, m, how, hopeless)[0]}
    assert timed(wide, 8) == set(names) - {"flashinfer:cublaslt"}
    assert timed(wide, 64) == set(names) - {"flashinfer:tinygemm"}
    assert timed(narrow, 8) == {"aten", "flashinfer:cublaslt", "flashinfer-lean:cublaslt"}
    # the public TinyGEMM call lost by far at a smaller M: the comparison runs cuBLASLt, which is then timed
    lost = {"flashinfer:tinygemm": "hopeless"}
    assert "flashinfer:cublaslt" in timed(wide, 16, lost) and "flashinfer:tinygemm" not in timed(wide, 16, lost)
    # without the lean call in the run, the public one is what a table could run: timed
    alone = Skips(90, "cupti", skip_unchoosable=True, paths=frozenset({"aten", "flashinfer:cublaslt"}),
                  low_m_backend="tinygemm")
    assert timed(wide, 8, how=alone) >= {"flashinfer:cublaslt"}
    # --all or --paths: every path timed
    assert timed(wide, 8, how=Skips(90, "cupti")) == set(names)


def test_a_table_whose_tactics_lack_a_shape_is_tuned_afresh_and_says_so(capsys):
    from argparse import Namespace
    from types import SimpleNamespace

    from bench.commands.options import table_tactics
    from dispatch.profiles import PROFILES
    tactics = Path(__file__).resolve().parents[1] / "dispatch" / "thresholds" / "h200.autotune.json"
    args = Namespace(tune=False, no_tune=False, save_autotune_cache=None, tuning="grid")
    table = SimpleNamespace(tactics=tactics)
    covered = [(2560, 4096, 16)]
    assert table_tactics(args, PROFILES["h200"], table, covered, ["aten", "flashinfer-lean:cublaslt"]) == tactics
    assert capsys.readouterr().err == ""
    lacking = covered + [(7, 2048, 16)]  # no catalog shape: no tactic for it
    assert table_tactics(args, PROFILES["h200"], table, lacking, ["aten", "flashinfer-lean:cublaslt"]) is None
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "1 cell(s)" in said[0] and "7x2048 M=16" in said[0] and "afresh" in said[0]
    assert "GEMV" not in said[0]  # this table names no GEMV configurations
    gemv_file = tactics.with_name("h200.autotune.gemv.json")
    with_gemv = SimpleNamespace(tactics=tactics, gemv_configs=gemv_file)
    assert table_tactics(args, PROFILES["h200"], with_gemv, lacking, ["aten", "flashinfer-lean:cublaslt"]) is None
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "the GEMV serves the table's configurations" in said[0]


def test_a_cell_the_tactics_lack_of_a_shape_they_hold_runs_the_default_tactic_as_dispatch_does(tmp_path, capsys):
    """FlashInfer's tuning can leave a held shape's large M without an entry: the run serves the file as the
    dispatcher does (FlashInfer's default tactic there), says so once, and does not tune."""
    from argparse import Namespace
    from types import SimpleNamespace

    from bench import autotune_cache
    from bench.commands.options import table_tactics
    from dispatch.profiles import PROFILES
    shipped = Path(__file__).resolve().parents[1] / "dispatch" / "thresholds" / "h200.autotune.json"
    entries = autotune_cache.read_entries(shipped)
    # the shipped file without its 2560 x 4096 entry at M = 16384
    gone = [key for key in entries if "((16384, 4096), (4096, 2560)," in key]
    assert gone
    doc = json.loads(shipped.read_text())
    for key in gone:
        doc.pop(key)
    tactics = tmp_path / "t.autotune.json"
    tactics.write_text(json.dumps(doc))
    assert (2560, 4096, 16384) not in autotune_cache.held_cells(tactics)
    args = Namespace(tune=False, no_tune=False, save_autotune_cache=None, tuning="grid")
    cells = [(2560, 4096, 16), (2560, 4096, 16384)]
    assert table_tactics(args, PROFILES["h200"], SimpleNamespace(tactics=tactics), cells,
                         ["aten", "flashinfer-lean:cublaslt"]) == tactics
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "2560x4096 M=16384" in said[0] and "default tactic" in said[0]
    assert "tuning FlashInfer afresh" not in said[0]
    # a shape the file lacks beside it still tunes, and the line names that shape
    assert table_tactics(args, PROFILES["h200"], SimpleNamespace(tactics=tactics), cells + [(7, 2048, 16)],
                         ["aten", "flashinfer-lean:cublaslt"]) is None
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "7x2048 M=16" in said[0] and "2560x4096" not in said[0] and "tuning FlashInfer afresh" in said[0]


def test_a_run_that_tunes_flashinfer_for_want_of_tactics_serves_the_tables_gemv(tmp_path):
    """The GEMV tunes afresh with --tune (tune_gemv), or where there is nothing to serve; never where tactics are
    served or nothing tunes."""
    from types import SimpleNamespace

    from bench.sweep import SweepConfig, gemv_tuning
    served = tmp_path / "t.autotune.gemv.json"
    served.write_text("{}")
    table, bare = SimpleNamespace(gemv_configs=served), SimpleNamespace(gemv_configs=tmp_path / "none.json")
    cfg = SweepConfig(get_profile("h200"), [], [1], [], tmp_path, tune_gemv=False)
    assert not gemv_tuning(cfg, None, table)  # FlashInfer tunes for want of cells; the GEMV serves
    assert gemv_tuning(cfg, None, bare) and gemv_tuning(cfg, None, None)  # nothing to serve: tuned
    explicit = SweepConfig(get_profile("h200"), [], [1], [], tmp_path, tune_gemv=True)
    assert gemv_tuning(explicit, None, table)  # --tune
    assert not gemv_tuning(explicit, {"file": "served"}, table)  # tactics served: their GEMV file too
    assert not gemv_tuning(SweepConfig(get_profile("h200"), [], [1], [], tmp_path, tune=False), None, table)


def test_a_sweep_compiles_ahead_only_what_it_serves_and_only_unless_told_not_to(tmp_path, monkeypatch):
    """start_ahead: the C++ layer where the dispatch path runs, the GEMV's kernels of every (N, K, M) cell where
    the GEMV or the dispatcher runs and configurations are served; nothing where the run tunes them or where
    --no-compile-ahead says so (run.json says which)."""
    from bench import sweep
    from bench.cli import parser
    from dispatch import gemv, gemv_ahead, native
    from shapes.catalog import catalog
    started, built = [], []

    class FakeAhead:
        def __init__(self, cells, pdls):
            started.append(sorted(cells))

        def wait(self):
            return {"launches": len(started[-1]), "seconds": 0.0, "failed": 0}
    monkeypatch.setattr(gemv_ahead, "CompileAhead", FakeAhead)
    monkeypatch.setattr(native, "build_ahead", lambda: built.append(True) or True)
    monkeypatch.setattr(gemv.STORE, "tuning", False)
    shape = next(s for s in catalog() if (s.n, s.k) == (2560, 4096))
    by = PATHS

    def cfg(names, **kw):
        return sweep.SweepConfig(get_profile("h200"), [shape], [1, 8], [by[n] for n in names], tmp_path, **kw)
    ahead = sweep.start_ahead(cfg(["aten", "dispatch"]))
    assert ahead.native and built == [True] and started == [[(2560, 4096, 1), (2560, 4096, 8)]]
    assert ahead.wait() == {"native_layer": True, "gemv": {"launches": 2, "seconds": 0.0, "failed": 0}}
    ahead = sweep.start_ahead(cfg(["aten", "triton:gemv"]))  # no dispatch path: no C++ layer
    assert not ahead.native and len(built) == 1 and len(started) == 2
    assert sweep.start_ahead(cfg(["aten"])).wait() == {"native_layer": False, "gemv": None}
    off = sweep.start_ahead(cfg(["aten", "dispatch"], compile_ahead=False))
    assert off.wait() == {"native_layer": False, "gemv": None, "off": "--no-compile-ahead"}
    monkeypatch.setattr(gemv.STORE, "tuning", True)  # a tuning run compiles its candidates as it tunes
    assert sweep.start_ahead(cfg(["triton:gemv"])).gemv is None and len(started) == 2 and len(built) == 1
    args = parser().parse_args(["run", "--gpu", "h200", "--no-compile-ahead"])
    assert args.no_compile_ahead


def test_each_gemv_path_launches_as_its_entry_says_whatever_the_profiles_pdl():
    """triton:gemv as each configuration says (None), triton:gemv-pdl every call with PDL, triton:gemv-plain every
    call plainly: the built call's pdl, under a profile with PDL and one without."""
    from bench.paths import GEMV, GEMV_LAUNCHES, GEMV_PDL, GEMV_PLAIN, PATHS
    assert GEMV_LAUNCHES == {GEMV: None, GEMV_PDL: True, GEMV_PLAIN: False}
    for name, launch in GEMV_LAUNCHES.items():
        assert [PATHS[name].build(pdl).pdl for pdl in (True, False)] == [launch, launch]
