"""The GEMV's configurations as data: which the tuner tries, the file they are kept in, what a call without its own
configuration runs, and the table and tactics plumbing that carries them (no GPU: nothing here launches a kernel)."""
import json

import pytest

from harness.errors import HarnessError


@pytest.fixture
def store():
    from dispatch import gemv
    saved = (dict(gemv.STORE.configs), dict(gemv.STORE.local), set(gemv.STORE.files), gemv.STORE.tuning)
    gemv.STORE.configs.clear(), gemv.STORE.local.clear(), gemv.STORE.files.clear()
    yield gemv.STORE
    gemv.STORE.configs.clear(), gemv.STORE.local.clear(), gemv.STORE.files.clear()
    gemv.STORE.configs.update(saved[0]), gemv.STORE.local.update(saved[1]), gemv.STORE.files.update(saved[2])
    gemv.STORE.tuning = saved[3]


def test_the_candidates_are_configurations_the_kernel_takes_with_enough_programs():
    from dispatch.gemv import CONFIGS, candidates
    for n, k in ((2560, 4096), (2048, 4096), (9216, 2048), (248320, 2560), (96, 64)):
        for m in (1, 2, 8, 16):
            cands = candidates(n, k, m, 132)
            assert cands and all(c.astuple() in CONFIGS for c in cands)
            assert all(c.takes(m) for c in cands) and len(cands) <= (27 if 1 < m <= 8 else 15)
            assert len(set(cands)) == len(cands)
            # at M = 2-8 the tuner also tries a CUDA-core tile of the fewest rows that hold M, beside the 16-row tiles
            assert {c.tile_m for c in cands} == ({1} if m == 1 else {m if m in (2, 4, 8) else 4, 16} if m <= 8
                                                 else {16})
    # a small-N, large-K weight is split until the programs fill the SMs twice (each tile shape's largest split);
    # a tall one is also tried unsplit
    small = candidates(2048, 4096, 1, 132)
    for tile in {(c.block_n, c.block_k) for c in small}:
        assert max(-(-2048 // c.block_n) * c.split_k for c in small if (c.block_n, c.block_k) == tile) >= 264
    assert min(c.split_k for c in candidates(248320, 2560, 1, 132)) == 1


def test_configurations_round_trip_through_their_file(tmp_path, store):
    from dispatch import gemv
    store.configs[(2560, 4096, 1)] = gemv.GemvConfig(16, 256, 4, 4)
    store.configs[(2560, 4096, 8)] = gemv.GemvConfig(32, 256, 8, 8)
    gemv.save(tmp_path / "a.gemv.json")
    data = json.loads((tmp_path / "a.gemv.json").read_text())
    assert data["format"] == gemv.FILE_FORMAT and data["kind"] == "gemv-configs" and len(data["configs"]) == 2
    store.configs.clear()
    assert gemv.load(tmp_path / "a.gemv.json") == 2
    assert store.configs[(2560, 4096, 8)] == gemv.GemvConfig(32, 256, 8, 8)


@pytest.mark.parametrize("data, says", [
    ([], "not a GEMV configuration file"),
    ({"kind": "gemv-configs", "format": 9, "configs": []}, "format 9"),
    ({"kind": "gemv-configs", "format": 1, "configs": [{"n": 1}]}, "needs positive integers"),
    ({"kind": "gemv-configs", "format": 1, "configs": [{"n": 64, "k": 64, "m": 17, "block_n": 16, "block_k": 128,
                                                        "split_k": 1, "num_warps": 4}]}, "not one the GEMV takes"),
    ({"kind": "gemv-configs", "format": 1, "configs": [{"n": 64, "k": 64, "m": 2, "block_n": 8, "block_k": 128,
                                                        "split_k": 1, "num_warps": 4}]}, "not one the GEMV takes"),
    ({"kind": "gemv-configs", "format": 1, "configs": [{"n": 64, "k": 64, "m": 2, "block_n": 24, "block_k": 128,
                                                        "split_k": 1, "num_warps": 4}]}, "not one the GEMV takes"),
])
def test_a_bad_configuration_file_is_refused_in_one_line(tmp_path, store, data, says):
    from dispatch import gemv
    f = tmp_path / "bad.gemv.json"
    f.write_text(json.dumps(data))
    with pytest.raises(HarnessError) as err:
        gemv.load(f)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert not store.configs


def test_a_call_without_its_own_configuration_runs_the_nearest_stored_one_or_f_linear(store):
    from dispatch.gemv import GemvCall, GemvConfig, pinned
    one, four, sixteen = GemvConfig(8, 512, 2, 4), GemvConfig(16, 256, 4, 4), GemvConfig(32, 256, 4, 8)
    store.configs.update({(2560, 4096, 1): one, (2560, 4096, 4): four, (2560, 4096, 16): sixteen})
    assert pinned(2560, 4096, 4) is four
    assert pinned(2560, 4096, 3) is four and pinned(2560, 4096, 5) is sixteen  # the nearest M above
    assert pinned(2560, 4096, 2) is four  # not the M = 1 one: eight columns a tile take one row only
    assert pinned(4096, 2560, 1) is None  # another shape: F.linear
    dispatcher, bench = GemvCall(tune=False), GemvCall(tune=True)
    assert dispatcher.config(2560, 4096, 3) is four and dispatcher.config(2560, 4096, 17) is None
    store.tuning = True  # a run that tunes tunes what it lacks
    assert bench.config(2560, 4096, 3) is None and bench.config(2560, 4096, 4) is four
    store.tuning = False  # a run that serves runs what the dispatcher would
    assert bench.config(2560, 4096, 3) is four
    store.local[(2560, 4096, 3)] = one
    assert bench.config(2560, 4096, 3) is one and dispatcher.config(2560, 4096, 3) is four


def test_the_table_takes_the_gemv_only_where_it_runs(tmp_path):
    from dispatch.backends import GEMV, GEMV_RULE, rule_of
    from dispatch.table import dispatchable_paths, load_table, parse_table
    assert GEMV in dispatchable_paths() and rule_of(GEMV) is GEMV_RULE and GEMV_RULE.path == GEMV
    assert 90 in GEMV_RULE.sms and rule_of("flashinfer-lean:tinygemm").name == "tinygemm"

    def table(up_to):
        return {"format": 2, "profile": "h200", "low_m_backend": "tinygemm",
                "default": {"graph": [{"up_to": up_to, "path": GEMV}], "eager": []},
                "source": {"gemv_configs": {"file": "t.autotune.gemv.json"}}}
    assert parse_table(table(16), "t").choose(1, 1, 16) == GEMV
    with pytest.raises(HarnessError, match="it takes M <= 16"):
        parse_table(table(17), "t")
    (tmp_path / "t.json").write_text(json.dumps(table(8)))
    assert load_table(path=tmp_path / "t.json").gemv_configs == tmp_path / "t.autotune.gemv.json"


def test_a_tactics_file_takes_its_gemv_configurations_along(tmp_path):
    from bench import autotune_cache
    src, dst = tmp_path / "a" / "autotune-cache.json", tmp_path / "b" / "table.autotune.json"
    src.parent.mkdir(), dst.parent.mkdir()
    src.write_text("{}")
    assert autotune_cache.gemv_file(src).name == "autotune-cache.gemv.json"
    autotune_cache.copy(src, dst)
    assert not autotune_cache.gemv_file(dst).exists() and "gemv_configs" not in autotune_cache.describe(dst, "x")
    autotune_cache.gemv_file(src).write_text('{"kind": "gemv-configs", "format": 1, "configs": []}')
    autotune_cache.copy(src, dst)
    assert autotune_cache.gemv_file(dst).read_text() == autotune_cache.gemv_file(src).read_text()
    assert autotune_cache.describe(dst, "x")["gemv_configs"]["file"] == "table.autotune.gemv.json"


def test_an_install_refuses_a_table_whose_gemv_file_is_not_the_fitted_one(tmp_path):
    from calibrate.install import table_check
    gemv = tmp_path / "h200.autotune.gemv.json"
    gemv.write_text('{"kind": "gemv-configs", "format": 1, "configs": []}')
    t = {"format": 2, "profile": "h200", "low_m_backend": "tinygemm", "default": {"graph": [], "eager": []},
         "source": {"gemv_configs": {"file": gemv.name, "sha256": "0" * 64}}}
    (tmp_path / "h200.json").write_text(json.dumps(t))
    with pytest.raises(HarnessError, match="not the one it was fitted with"):
        table_check("h200", None)(tmp_path / "h200.json")
    gemv.unlink()
    with pytest.raises(HarnessError, match="not part of the install"):
        table_check("h200", None)(tmp_path / "h200.json")


def test_the_dispatcher_loads_a_tables_gemv_file_once_and_only_where_it_serves_the_tables_files(tmp_path, store,
                                                                                                monkeypatch):
    import dispatch
    import dispatch.layers as layers
    from dispatch import gemv
    from dispatch.table import load_table
    (tmp_path / "t.autotune.gemv.json").write_text(json.dumps(
        {"kind": "gemv-configs", "format": 1, "configs": [{"n": 64, "k": 64, "m": 1, "block_n": 16, "block_k": 128,
                                                           "split_k": 1, "num_warps": 4}]}))
    t = {"format": 2, "profile": "h200", "low_m_backend": "tinygemm",
         "default": {"graph": [{"up_to": 8, "path": "triton:gemv"}], "eager": []},
         "source": {"gemv_configs": {"file": "t.autotune.gemv.json"}}}
    (tmp_path / "t.json").write_text(json.dumps(t))
    table = load_table(path=tmp_path / "t.json")
    loads = []
    monkeypatch.setattr(gemv, "load", lambda path: loads.append(str(path)) or 1)
    monkeypatch.setattr(layers._STATE, "tactics_loaded", set())
    try:
        dispatch.tactics_from_table(False)
        layers._load_tactics(table)
        assert loads == []  # a benchmark serves its own configurations
        dispatch.tactics_from_table(True)
        layers._load_tactics(table)
        layers._load_tactics(table)
        assert loads == [str(tmp_path / "t.autotune.gemv.json")]  # once per process
        t["default"]["graph"] = []
        (tmp_path / "u.json").write_text(json.dumps(t))
        layers._STATE.tactics_loaded.clear()
        layers._load_tactics(load_table(path=tmp_path / "u.json"))
        assert len(loads) == 1  # a table that runs no GEMV loads no GEMV file
    finally:
        dispatch.tactics_from_table(True)


def test_a_format_1_file_reads_as_the_tiles_it_ran_and_saves_as_the_current_format(store, tmp_path):
    """Format 1 named no tile: it ran one row at M = 1 and a 16-row tensor-core tile above; later formats name it."""
    from dispatch import gemv
    (tmp_path / "old.gemv.json").write_text(json.dumps({"format": 1, "kind": "gemv-configs", "configs": [
        {"n": 2560, "k": 4096, "m": 1, "block_n": 64, "block_k": 128, "split_k": 16, "num_warps": 4},
        {"n": 2560, "k": 4096, "m": 4, "block_n": 32, "block_k": 128, "split_k": 8, "num_warps": 4}]}))
    assert gemv.load(tmp_path / "old.gemv.json") == 2
    assert store.configs[(2560, 4096, 1)].tile_m == 1 and store.configs[(2560, 4096, 4)].tile_m == 16
    store.configs[(2560, 4096, 2)] = gemv.GemvConfig(16, 256, 8, 4, 2)
    gemv.save(tmp_path / "new.gemv.json")
    saved = json.loads((tmp_path / "new.gemv.json").read_text())
    assert saved["format"] == gemv.FILE_FORMAT and {c["m"]: c["tile_m"] for c in saved["configs"]} == {1: 1, 2: 2,
                                                                                                   4: 16}
    assert not any(c["pdl"] for c in saved["configs"])  # formats 1 and 2 launched every configuration plainly
    store.configs.clear()
    gemv.load(tmp_path / "new.gemv.json")
    assert store.configs[(2560, 4096, 2)] == gemv.GemvConfig(16, 256, 8, 4, 2)
    bad = dict(saved, configs=[{**saved["configs"][2], "tile_m": 2}])  # a 2-row tile cannot hold M = 4
    (tmp_path / "bad.gemv.json").write_text(json.dumps(bad))
    with pytest.raises(HarnessError, match="not one the GEMV takes"):
        gemv.load(tmp_path / "bad.gemv.json")


def test_a_configuration_that_launches_with_pdl_keeps_it_through_its_file(store, tmp_path):
    """Format 3 says per configuration whether it launches with PDL (the tuner's choice); format 2 read as plain; a
    format 3 entry without a boolean pdl is refused in one line."""
    from dispatch import gemv
    chained = gemv.GemvConfig(16, 256, 4, 4, 1, pdl=True)
    assert chained.key().endswith("_pdl") and not gemv.GemvConfig(16, 256, 4, 4, 1).key().endswith("_pdl")
    assert chained.astuple() in gemv.CONFIGS  # the same kernel geometry
    store.configs[(2560, 4096, 1)] = chained
    gemv.save(tmp_path / "a.gemv.json")
    saved = json.loads((tmp_path / "a.gemv.json").read_text())
    assert saved["format"] == 3 and saved["configs"][0]["pdl"] is True
    store.configs.clear()
    gemv.load(tmp_path / "a.gemv.json")
    assert store.configs[(2560, 4096, 1)] == chained
    two = dict(saved, format=2, configs=[{k: v for k, v in saved["configs"][0].items() if k != "pdl"}])
    (tmp_path / "two.gemv.json").write_text(json.dumps(two))
    gemv.load(tmp_path / "two.gemv.json")
    assert store.configs[(2560, 4096, 1)].pdl is False
    for pdl in (None, 1, "yes"):
        bad = dict(saved, configs=[{**saved["configs"][0], "pdl": pdl}])
        (tmp_path / "bad.gemv.json").write_text(json.dumps(bad))
        with pytest.raises(HarnessError, match="needs pdl, true or false"):
            gemv.load(tmp_path / "bad.gemv.json")


def test_a_configuration_that_launches_with_pdl_is_launched_so(store):
    """launch() asks Triton for a programmatic dependent launch where the configuration or the call says so, and
    the GEMV path's row says so (launches_pdl), so that its time is read by the span of its calls."""
    from dispatch import gemv
    seen = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((grid, kw.get("USE_PDL"), kw.get("launch_pdl", False)))

    class T:  # a tensor's shape and strides, all launch() reads
        def __init__(self, *shape):
            self.shape = shape

        def stride(self, i):
            return self.shape[1] if i == 0 else 1
    x, w, y = T(1, 4096), T(2560, 4096), T(1, 2560)
    # pdl None: as the configuration says; True or False: every launch so, whatever it says
    for cfg, forced, want in ((gemv.GemvConfig(16, 256, 1, 4, 1), None, False),
                              (gemv.GemvConfig(16, 256, 1, 4, 1, pdl=True), None, True),
                              (gemv.GemvConfig(16, 256, 1, 4, 1), True, True),
                              (gemv.GemvConfig(16, 256, 1, 4, 1, pdl=True), False, False)):
        gemv.launch(FakeKernel(), x, w, y, (None, None), cfg, forced)
        assert seen[-1][1:] == (want, want)
    store.configs[(2560, 4096, 1)] = gemv.GemvConfig(16, 256, 1, 4, 1, pdl=True)
    store.configs[(2560, 4096, 2)] = gemv.GemvConfig(16, 256, 1, 4, 16)
    call = gemv.GemvCall(tune=False)
    assert call.launches_pdl(2560, 4096, 1) and not call.launches_pdl(2560, 4096, 2)
    assert not call.launches_pdl(2560, 4096, 17)  # F.linear
    assert gemv.GemvCall(tune=False, pdl=True).launches_pdl(2560, 4096, 2)
    assert not gemv.GemvCall(tune=False, pdl=False).launches_pdl(2560, 4096, 1)  # table-plain's GEMV


def test_the_tuner_keeps_pdl_only_where_it_is_faster_beyond_its_margin(monkeypatch):
    from dispatch import gemv
    plain = gemv.GemvConfig(16, 256, 4, 4, 1)
    for pdl_us, kept in ((9.7, True), (9.9, False), (10.5, False)):
        monkeypatch.setattr(gemv, "time_config", lambda cfg, ws, xs, us=pdl_us: us)
        best, us = gemv.with_pdl_if_faster(plain, 10.0, [], [])
        assert best.pdl is kept and us == (pdl_us if kept else 10.0)

    def refuses(cfg, ws, xs):
        raise RuntimeError("no PDL launch here")
    monkeypatch.setattr(gemv, "time_config", refuses)
    assert gemv.with_pdl_if_faster(plain, 10.0, [], []) == (plain, 10.0)


def test_the_launches_compiled_ahead_are_those_calls_make_once_each(store):
    """The kernels compiled ahead of a sweep: one per distinct launch its cells make with their served configurations
    (options, split or not, which integer arguments are 1 or multiples of 16), none above MAX_M or for a shape
    without a configuration; the launch's arguments are launch()'s own."""
    from dispatch import gemv
    from dispatch.gemv import GemvConfig
    from dispatch.gemv_ahead import launches
    store.configs[(2560, 4096, 1)] = GemvConfig(8, 256, 8, 4, tile_m=1, pdl=True)
    store.configs[(2560, 4096, 4)] = GemvConfig(16, 256, 4, 4, tile_m=4)
    store.configs[(2048, 4096, 1)] = GemvConfig(8, 256, 8, 4, tile_m=1, pdl=True)
    store.configs[(96, 64, 2)] = GemvConfig(16, 128, 1, 4, tile_m=2)
    cells = [(2560, 4096, m) for m in (1, 2, 4, 16, 32)] + [(2048, 4096, 1), (96, 64, 2), (4096, 4096, 1)]
    got = launches(cells)
    # M = 1 on 2560 and 2048 rows: one specialization (N both multiples of 16, K the same); M = 2 and 4 take the
    # 4-row configuration with M 2 and 4 (neither 1 nor a multiple of 16: one kernel); 16 rows have none stored;
    # M = 32 is above MAX_M; 96 x 64 at M = 2 unsplit
    assert len(got) == 3
    by_rows = {ints[0]: (grid, ints, options, split) for grid, ints, options, split in got}
    grid, ints, options, split = by_rows[1]
    assert split and options["USE_PDL"] and options["launch_pdl"] and options["TILE_M"] == 1
    assert grid == (2560 // 8, 8) and ints == (1, 2560, 4096, 512, 4096, 4096, 2560)
    assert gemv.arguments(1, 2560, 4096, store.configs[(2560, 4096, 1)], None, (4096, 4096, 2560)) == \
        (grid, ints, options)
    assert not by_rows[2][3] and "launch_pdl" not in by_rows[2][2]
    assert launches(cells, pdls=(False,))[0][2]["USE_PDL"] is False  # a plain call's launches
    assert len(launches(cells, pdls=(None, True, False))) == 6  # each of the three with PDL and plainly
    store.configs.clear()
    assert launches(cells) == []


def test_the_native_build_started_ahead_is_waited_for_by_the_first_bind(tmp_path, monkeypatch):
    """build_ahead starts the build a first bind would make in a thread; module() waits for it, and neither a second
    build_ahead nor the bind builds again. Where nothing would build (turned off), it starts none."""
    import threading

    from dispatch import native
    monkeypatch.setenv("BLB_NATIVE_DIR", str(tmp_path / "native"))
    monkeypatch.setenv("BLB_NATIVE_BUILD", "1")
    monkeypatch.setattr(native, "_LOADED", [])
    monkeypatch.setattr(native, "_TRIED", [])
    monkeypatch.setattr(native, "_BUILDING", [])
    monkeypatch.setattr(native, "toolchain_missing", lambda: [])
    release, built = threading.Event(), []

    def slow_build(verbose=False):
        release.wait(5)
        built.append(threading.current_thread().name)
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(native, "build", slow_build)
    assert native.build_ahead() and not native.build_ahead()
    assert built == []  # still building
    release.set()
    assert native.module(build_if_missing=True) is None
    assert built == ["blb-native-build"] and native._BUILDING == []
    monkeypatch.setattr(native, "_TRIED", [])
    monkeypatch.setenv("BLB_NATIVE_BUILD", "0")
    assert not native.build_ahead() and native._BUILDING == []


def test_the_specialization_compiled_ahead_is_tritons_own():
    """CompileAhead merges the launches whose integer arguments Triton specializes alike: its classes (1, a multiple
    of 16, anything else) are those of Triton's own specializer, which keys the kernel a launch runs."""
    pytest.importorskip("triton")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from dispatch.gemv_ahead import specialization
    classes: dict = {}
    for v in (1, 2, 3, 8, 15, 16, 17, 48, 96, 100, 512, 1000, 2560, 3000, 4096, 9216, 248320):
        classes.setdefault(specialization((v,)), set()).add(str(native_specialize_impl(BaseBackend, v, False, True,
                                                                                       True)[:2]))
    assert len(classes) == 3 and all(len(real) == 1 for real in classes.values()), classes
