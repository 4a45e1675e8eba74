"""CPU tests of the work split over GPUs and machines: queue order, shard arithmetic, the full grid, merging shards
(and refusing to), resuming a --devices run. Shards here are cut from a committed H200 run, rows unedited."""
import json
from pathlib import Path

import pandas as pd
import pytest

from bench.merge import merge_shards
from bench.multi import parse_devices, shard_dir, split_resumed
from bench.paths import paths_for
from bench.results import load_results
from bench.shard import assign, full_catalog, full_grid_ms, longest_first, parse_shard, shape_cost
from dispatch.profiles import get_profile
from harness.errors import HarnessError
from shapes.catalog import catalog
from shapes.grid import default_grid, vllm_capture_sizes

DATA = Path(__file__).parent / "data"
EVIDENCE = Path(__file__).resolve().parent.parent / "evidence"  # the measured runs docs cite
RUN = DATA / "h200-lean-fit"
H200 = get_profile("h200")
PATHS = paths_for(H200.flashinfer_backends)


def test_the_queue_hands_out_the_longest_shapes_first():
    ms = default_grid()
    order = longest_first(catalog(), ms, PATHS, H200)
    costs = [shape_cost(s, ms, PATHS, H200) for s in order]
    assert costs == sorted(costs, reverse=True)
    assert {order[0].n, order[1].n} == {248320}  # the lm_heads: the longest groups of the catalog
    assert [s.name for s in longest_first(list(reversed(catalog())), ms, PATHS, H200)] == [s.name for s in order]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 20])
def test_shards_cover_every_shape_once_and_balance_the_work(n):
    ms, shapes = default_grid(), catalog()
    bins = assign(shapes, n, ms, PATHS, H200)
    names = [s.name for b in bins for s in b]
    assert sorted(names) == sorted(s.name for s in shapes) and len(bins) == n
    loads = [sum(shape_cost(s, ms, PATHS, H200) for s in b) for b in bins]
    biggest = max(shape_cost(s, ms, PATHS, H200) for s in shapes)
    assert max(loads) - min(loads) <= biggest + 1e-9  # LPT: no shard exceeds another by more than one shape
    assert assign(shapes, n, ms, PATHS, H200) == bins  # the same split on every machine


def test_shard_specs():
    assert parse_shard("1/1") == (1, 1) and parse_shard("3/4") == (3, 4)
    for bad in ("0/4", "5/4", "a/b", "3", "1/0"):
        with pytest.raises(HarnessError, match="--shard"):
            parse_shard(bad)


def test_the_full_grid_size():
    shapes = full_catalog()
    keys = {(s.n, s.k) for tp in (1, 2, 4, 8) for s in catalog(tp=tp)}
    assert len(shapes) == len(keys) == 53 and len({(s.n, s.k) for s in shapes}) == len(shapes)
    ms = full_grid_ms()
    assert set(vllm_capture_sizes(512)) <= set(ms) and set(default_grid()) <= set(ms) and len(ms) == 58
    assert min(s.tp for s in shapes if (s.n, s.k) == (248320, 2560)) == 1


def test_devices():
    assert parse_devices("all", 2) == [0, 1] and parse_devices("1", 2) == [1]
    for bad in ("2", "0,0", "x", ""):
        with pytest.raises(HarnessError, match="--devices"):
            parse_devices(bad, 2)


def _shards(tmp_path: Path, n: int = 2, edit=None) -> list[Path]:
    """The committed run cut into n shards by shape (its own lines, unedited), each with a shard run.json."""
    lines = (RUN / "results.csv").read_text().splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    df = pd.read_csv(RUN / "results.csv")
    info = json.loads((RUN / "run.json").read_text())
    names = sorted(set(df["shape"]))
    out = []
    for i in range(n):
        mine = set(names[i::n])
        d = tmp_path / f"shard{i}"
        d.mkdir(parents=True)
        keep = [line for line, shape in zip(body, df["shape"]) if shape in mine]
        (d / "results.csv").write_text(header + "".join(keep))
        shard_info = {**info, "shard": {"index": i + 1, "of": n, "grid_shapes": info["shapes"]}}
        if edit:
            edit(i, shard_info)
        (d / "run.json").write_text(json.dumps(shard_info))
        out.append(d)
    return out


def test_merged_shards_are_the_run_itself(tmp_path):
    def resumed(i, info):  # shard 2 was interrupted once and resumed
        if i == 1:
            info["previous_legs"] = [{"command": "c", "started": "s", "wall_s": 500.0, "status": "interrupted"}]
    merged = merge_shards(_shards(tmp_path, 3, resumed), tmp_path / "merged")
    a, b = load_results(merged), load_results(RUN)
    key = ["n", "k", "m", "path"]
    assert a.sort_values(key).reset_index(drop=True).equals(b.sort_values(key).reset_index(drop=True))
    assert sorted((merged / "results.csv").read_text().splitlines()) == sorted((RUN / "results.csv").read_text().splitlines())
    info = json.loads((merged / "run.json").read_text())
    assert info["status"] == "complete" and len(info["shards"]) == 3 and info["missing_shapes"] == []
    one_leg = json.loads((RUN / "run.json").read_text())["wall_s"]
    assert info["wall_s"] == one_leg and info["wall_s_all_legs"] == round(one_leg + 500.0, 1)
    assert [len(sh["previous_legs"]) for sh in info["shards"]] == [0, 1, 0]
    with pytest.raises(HarnessError, match="exists"):
        merge_shards(_shards(tmp_path / "again", 2), merged)


@pytest.mark.parametrize("edit, needle", [
    (lambda i, info: info["fingerprint"].update(driver="590.1") if i else None, "fingerprint driver"),
    (lambda i, info: info["fingerprint"].update(gpu_name="NVIDIA H100 80GB HBM3") if i else None, "gpu_name"),
    (lambda i, info: info["clocks_start"].update(power_limit_w=600.0) if i else None, "power_limit_w"),
    (lambda i, info: info.update(samples=5) if i else None, "samples"),
    (lambda i, info: info.update(pdl=False) if i else None, "pdl"),
    (lambda i, info: info.update(status="interrupted") if i else None, "did not finish"),
])
def test_mismatched_shards_are_refused_naming_the_field(tmp_path, edit, needle):
    with pytest.raises(HarnessError, match=needle):
        merge_shards(_shards(tmp_path, 2, edit), tmp_path / "merged")
    assert not (tmp_path / "merged" / "results.csv").exists()


def test_overlapping_or_missing_shards_are_refused(tmp_path):
    s = _shards(tmp_path, 2)
    with pytest.raises(HarnessError, match="more than one shard"):
        merge_shards([s[0], s[0]], tmp_path / "dup")
    with pytest.raises(HarnessError, match="no shard measured"):
        merge_shards([s[0]], tmp_path / "half")
    merged = merge_shards([s[0]], tmp_path / "half", partial=True)
    assert json.loads((merged / "run.json").read_text())["status"] == "incomplete"
    with pytest.raises(HarnessError, match="incomplete|missing"):
        load_results(merged)  # a merged run with missing shapes is no verdict unless --partial


def test_resuming_devices_keeps_begun_shapes_on_their_gpu(tmp_path):
    """A shape finished in a shard is not measured again; a shape begun there goes back to that GPU (its rows are in
    that folder); the rest go to the shared queue."""
    df = pd.read_csv(RUN / "results.csv")
    shapes = catalog()
    ms = sorted(set(df["m"]))
    paths = [p for p in PATHS if p.name in set(df["path"])]
    done_shape, begun_shape = shapes[0], shapes[1]
    for device, rows in ((0, df[df["shape"] == done_shape.name]),
                         (1, df[(df["shape"] == begun_shape.name) & (df["m"] <= 8)])):
        d = shard_dir(tmp_path, device)
        d.mkdir(parents=True)
        rows.to_csv(d / "results.csv", index=False)
    queue, pinned = split_resumed(shapes, ms, paths, [0, 1], tmp_path)
    assert done_shape not in queue and begun_shape not in queue and pinned == {0: [], 1: [begun_shape]}
    assert len(queue) == len(shapes) - 2


def test_devices_orchestration_hands_out_every_shape_once_and_merges(tmp_path):
    """Two stand-in workers (spawned processes, as the GPU workers are) share the queue; every shape is measured once
    (by whichever worker took it: timing decides the split),
    the parent merges the shards into one run equal to the source, and a run on a GPU of another profile is refused
    before anything is written."""
    from dataclasses import replace

    from bench.multi import run_on_devices
    from bench.sweep import SweepConfig
    from tests.fake_worker import copy_rows_worker
    info = json.loads((RUN / "run.json").read_text())
    shapes = [s for s in catalog() if s.name in info["shapes"]]
    cfg = SweepConfig(profile=H200, shapes=shapes, ms=info["ms"], paths=[p for p in PATHS if p.name in info["paths"]],
                      out=tmp_path / "out", command=["python", "-m", "bench", "run", str(RUN)])
    two = {0: ("NVIDIA H200", 90), 1: ("NVIDIA H200", 90)}
    with pytest.raises(HarnessError, match="expects an SM90 H200"):
        run_on_devices(cfg, "all", {0: ("NVIDIA H200", 90), 1: ("NVIDIA H100 80GB HBM3", 90)}, copy_rows_worker)
    assert not (tmp_path / "out").exists()
    out = run_on_devices(cfg, "all", two, copy_rows_worker)
    merged = json.loads((out / "run.json").read_text())
    assert merged["status"] == "complete" and 1 <= len(merged["shards"]) <= 2  # a fast worker may take every shape
    shard_shapes = [s for shard in merged["shards"] for s in shard["shapes"]]
    assert sorted(shard_shapes) == sorted(set(shard_shapes)) == sorted(info["shapes"])  # each shape once
    assert sorted((out / "results.csv").read_text().splitlines()) == sorted((RUN / "results.csv").read_text().splitlines())
    with pytest.raises(HarnessError, match="exists"):
        run_on_devices(cfg, "all", two, copy_rows_worker)
    again = run_on_devices(replace(cfg, resume=True), "all", two, copy_rows_worker)  # nothing left: merged again
    assert sorted((again / "results.csv").read_text().splitlines()) == sorted((RUN / "results.csv").read_text().splitlines())
    assert merged["host_timing"].startswith("serialized") and merged["worker_had_lock"]
    loose = run_on_devices(replace(cfg, out=tmp_path / "loose"), "all", two, copy_rows_worker, host_timing="concurrent")
    info_loose = json.loads((loose / "run.json").read_text())
    assert info_loose["host_timing"].startswith("concurrent") and not info_loose["worker_had_lock"]


def test_devices_resume_refuses_a_single_gpu_run_and_deletes_nothing(tmp_path):
    """--resume with --devices redoes only a merge of shards: a folder holding a run on one GPU is refused, untouched."""
    import shutil

    from bench.multi import run_on_devices
    from bench.sweep import SweepConfig
    from tests.fake_worker import copy_rows_worker
    out = tmp_path / "out"
    shutil.copytree(RUN, out)
    before = (out / "results.csv").read_bytes()
    info = json.loads((RUN / "run.json").read_text())
    cfg = SweepConfig(profile=H200, shapes=[s for s in catalog() if s.name in info["shapes"]], ms=info["ms"],
                      paths=[p for p in PATHS if p.name in info["paths"]], out=out, resume=True,
                      command=["python", "-m", "bench", "run", str(RUN)])
    with pytest.raises(HarnessError, match="not a merge of --devices shards"):
        run_on_devices(cfg, "all", {0: ("NVIDIA H200", 90), 1: ("NVIDIA H200", 90)}, copy_rows_worker)
    assert (out / "results.csv").read_bytes() == before and not (out / "shards").exists()


def test_a_worker_makes_visible_the_gpu_the_parent_calls_by_that_index():
    """--devices indices are this process's CUDA indices: under CUDA_VISIBLE_DEVICES=2,3 device 0 is GPU 2."""
    from bench.multi import visible_entry
    assert [visible_entry(d, None) for d in (0, 1)] == ["0", "1"]
    assert [visible_entry(d, "2,3") for d in (0, 1)] == ["2", "3"]
    assert visible_entry(1, "GPU-aaaa, GPU-bbbb") == "GPU-bbbb"
    with pytest.raises(HarnessError, match="not among CUDA_VISIBLE_DEVICES"):
        visible_entry(2, "2,3")


HOST_TIMING = DATA.parent.parent / "evidence" / "h200x2-host-timing"  # the whole 2-GPU study (evidence tests)
HOST_TIMING_FIXTURE = DATA / "h200x2-host-timing"  # four of its runs, for the tests of the command itself


def _arms() -> dict:
    from calibrate.analysis import Cells
    return {arm: {n: Cells.from_results(load_results(HOST_TIMING / n)) for n in
                  (f"{prefix}-{s}" for s in ("a", "b", "c", "c2", "d", "d2"))}
            for arm, prefix in (("1-gpu", "x1"), ("serialized", "ser"), ("concurrent", "conc"))}


def test_host_shift_finds_a_shift_beyond_the_noise_and_none_without_one():
    """Synthetic arms: runs whose host times scatter by ~1% per run; an arm 20% slower is a shift, an arm equal to
    the base is not; fewer than two runs per arm is refused."""
    import numpy as np

    from calibrate.agree import host_shift
    from calibrate.analysis import Cells
    rng = np.random.default_rng(3)
    keys = [(64, 2048, m, "aten") for m in (1, 2, 4, 8, 16, 32)]

    def run(scale):
        factor = scale * float(np.exp(rng.normal(0, 0.01)))
        return Cells.from_results(pd.DataFrame([{"n": n, "k": k, "m": m, "path": p, "status": "ok", "gpu_us": 5.0,
                                                 "host_us": 10.0 * (1 + m / 100) * factor, "tp": 1}
                                                for n, k, m, p in keys]))
    base = {f"b{i}": run(1.0) for i in range(4)}
    slow = {f"s{i}": run(1.2) for i in range(4)}
    same = {f"e{i}": run(1.0) for i in range(4)}
    pairs = {p["pair"]: p for p in host_shift({"base": base, "slow": slow, "same": same}).pairs}
    assert pairs["slow / base"]["beyond_noise"] and round(pairs["slow / base"]["cells"], 1) == 1.2
    assert not pairs["same / base"]["beyond_noise"]
    with pytest.raises(ValueError, match="two or more runs"):
        host_shift({"base": base, "one": {"x": run(1.0)}})


def test_two_shards_measured_as_two_machines_merge_into_one_run(tmp_path):
    """tests/data/h200-shards: `bench run --shard 1/2` on GPU 0 and `--shard 2/2` on GPU 1 of one lease at the same
    time (as two Slurm jobs would), then `bench merge`: the merge again gives the committed merged table byte for
    byte; each shard measured its half of the shapes; the merged run agrees with a 1-GPU run of the same cells from
    the same lease (GPU time within the issue's bounds)."""
    from calibrate.agree import agreement
    from calibrate.analysis import Cells
    root = DATA / "h200-shards"
    out = merge_shards([root / "shard-1", root / "shard-2"], tmp_path / "merged")
    assert (out / "results.csv").read_bytes() == (root / "merged" / "results.csv").read_bytes()
    specs = [json.loads((root / s / "run.json").read_text())["shard"] for s in ("shard-1", "shard-2")]
    assert [(s["index"], s["of"]) for s in specs] == [(1, 2), (2, 2)]
    shapes = [set(pd.read_csv(root / s / "results.csv")["shape"]) for s in ("shard-1", "shard-2")]
    assert not shapes[0] & shapes[1] and len(shapes[0] | shapes[1]) == 16
    df = agreement(Cells.from_results(load_results(HOST_TIMING_FIXTURE / "x1-b")), Cells.from_results(load_results(root / "merged")))
    d = df["gpu_diff"].abs()
    assert len(df) == 188 and d.median() <= 0.01 and d.quantile(0.9) <= 0.03


def test_host_shift_labels_runs_by_folder_name_or_by_path_where_names_repeat(tmp_path, capsys):
    """Two runs whose folders share a name stay two runs (labelled by their paths), not one."""
    from calibrate.__main__ import main
    for d, run in (("a", "x1-a"), ("b", "x1-b")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "run").symlink_to(HOST_TIMING_FIXTURE / run)
    same = [str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]
    assert main(["host-shift", "--arm", "one", *same, "--arm", "conc", str(HOST_TIMING_FIXTURE / "conc-a"),
                 str(HOST_TIMING_FIXTURE / "conc-b")]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in same) and "conc-a" in out and str(HOST_TIMING_FIXTURE) not in out


def test_shard_auto_reads_a_slurm_array_or_torchrun():
    from bench.shard import shard_from_env
    from harness.errors import HarnessError
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"})[:2] \
        == (1, 4)
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"})[:2] \
        == (4, 4)
    assert shard_from_env({"RANK": "2", "WORLD_SIZE": "3"})[:2] == (3, 3)
    assert "Slurm" in shard_from_env({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2",
                                      "SLURM_ARRAY_TASK_MIN": "1"})[2]
    for env, needle in (({}, "no Slurm"), ({"SLURM_ARRAY_TASK_ID": "1"}, "COUNT"),
                        ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"}, "not an integer"),
                        ({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0"},
                         "shard 10 of 2"),
                        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0",
                          "SLURM_ARRAY_TASK_STEP": "2"}, "steps by 2")):
        with pytest.raises(HarnessError, match=needle):
            shard_from_env(env)


def test_dry_run_says_which_shard_auto_is(monkeypatch, capsys):
    from bench.__main__ import main
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    assert main(["run", "--gpu", "h200", "--shard", "auto", "--dry-run"]) == 0
    assert "shard 2/3 (Slurm array task 2 of 3 (min index 1))" in capsys.readouterr().out


def test_agree_says_how_far_each_paths_ratio_to_f_linear_moved():
    """Both runs' GPU times 10% slower in b (a slower machine) move no ratio; a path 4% slower against F.linear at one
    cell moves that one by 4%, and the dispatcher row is not a path of its own."""
    from calibrate.agree import ratio_lines, ratio_moves
    from calibrate.analysis import Cells

    def run(scale, slow_at):
        rows = []
        for m in (1, 8, 64):
            for path, t in (("aten", 10.0), ("flashinfer-lean:cublaslt", 9.0), ("dispatch", 9.0)):
                t = t * scale * (1.04 if path != "aten" and m == slow_at else 1.0)
                rows.append({"n": 64, "k": 32, "m": m, "path": path, "status": "ok", "gpu_us": t, "host_us": 20.0})
        return Cells.from_results(pd.DataFrame(rows))
    moves = ratio_moves(run(1.0, None), run(1.1, 8))
    assert set(moves["path"]) == {"flashinfer-lean:cublaslt"} and len(moves) == 3
    assert [round(v, 4) for v in moves.sort_values("m")["move"]] == [0.0, 0.04, 0.0]
    assert "moved > 3%: 1, > 5%: 0" in "\n".join(ratio_lines(moves))
