"""--install of a table run: its table (with its tactics and GEMV configurations) and baseline (with theirs) become
the shipped files, all or none (calibrate.install). Judged from the legs themselves, never from the manifest's
summary alone: every leg done, the validate leg's PASS, and the check run judged again here."""
from __future__ import annotations

import io
import json
from pathlib import Path

from bench.autotune_cache import gemv_file
from calibrate.baseline import autotune_cache_path, baseline_check, baseline_path
from calibrate.install import Artifact, gemv_check, shipped_layout, table_check
from calibrate.install import install as install_all
from harness.errors import HarnessError
from harness.io import ROOT, parse_json_text, read_input, read_input_text, sha256
from harness.shipped import shipped_file
from tables.legs import in_process, legs
from tables.manifest import MANIFEST, TableRun


def fewer_baseline_runs(run: TableRun) -> str | None:
    """A note when the run's baseline holds fewer source runs than the shipped one it replaces: a cell with two
    speeds across processes can then fail make regress on a healthy machine (docs/design.md, Noise floors)."""
    def runs(path: Path) -> int:
        try:
            return len(json.loads(path.read_text()).get("sources") or [])
        except (OSError, ValueError, AttributeError):
            return 0
    name = run.profile.name
    shipped, new = runs(baseline_path(name)), runs(run.folder / "baseline.json")
    if new >= shipped:
        return None
    return (f"the shipped baseline held {shipped} source runs, this run's holds {new}. To widen it, run make regress "
            f"with BENCH_REGRESSION_WORK=DIR on other machines, then python -m calibrate baseline --gpu {name} "
            f"--from {run.folder / 'sweep'} {run.folder / 'check-sweep'} DIR/fresh ... --install")


def judged_from_the_legs(run: TableRun) -> None:
    """A run whose table may be installed: complete, of the default scope, every leg done, its validate leg's
    verdict PASS (and install judges its check again with the table it stages: judged_again)."""
    m = run.manifest
    if m is None:
        raise HarnessError(f"{run.folder} has no {MANIFEST}; run python -m tables first")
    if m.get("status") != "complete" or m.get("verdict") != "PASS":
        raise HarnessError(f"{run.folder}: status {m.get('status')!r}, verdict {m.get('verdict')!r}; only a complete "
                           f"run whose out-of-sample check passed is installed")
    if not run.scope.is_default():
        raise HarnessError(f"{run.folder} covers {run.scope.to_json()}; the shipped table covers every catalog model "
                           f"in both layouts (union). Give the dispatcher {run.folder / 'table.json'} instead "
                           f"(dispatch.configure, or --table)")
    undone = [leg.name for leg in legs(run) if not run.done(leg.name)]
    if undone:
        raise HarnessError(f"{run.folder}: the manifest says complete but its legs {', '.join(undone)} are not done; "
                           f"resume it (--resume); nothing was installed")
    if (m["legs"].get("validate") or {}).get("verdict") != "PASS":
        raise HarnessError(f"{run.folder}: its validate leg's verdict is "
                           f"{(m['legs'].get('validate') or {}).get('verdict')!r}, not PASS; nothing was installed")
    for name in ("table.json", "baseline.json"):
        if not (run.folder / name).is_file():
            raise HarnessError(f"{run.folder} has no {name}; a passing run has both: restore it, or run the legs again "
                               f"with --refit; nothing was installed")


def judged_again(run: TableRun, table: Path) -> None:
    """The run's check (its validate leg: check-sweep and check-forward) judged again now with `table` (the staged
    table, as it would be installed): anything but PASS refuses the install."""
    validate = next(leg for leg in legs(run) if leg.name == "validate")
    args = list(validate.args)
    args[args.index("--table") + 1] = str(table)
    said = io.StringIO()
    if in_process(validate.tool, args, said) != 0:
        last = (said.getvalue().strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"its check judged again does not pass ({last[:200]})")


def install(run: TableRun) -> list[Path]:
    """The run's table and baseline, their tactics and GEMV configurations, as the shipped files, each read back
    with the runtime's reader first. The run's cross-machine floor (noise.json) is installed on its own, where it
    should replace the profile's (python -m calibrate noise ... --install): every verdict and fit reads that floor."""
    judged_from_the_legs(run)
    profile, folder = run.profile.name, run.folder
    table, base = shipped_file("table", profile), baseline_path(profile)
    where = run.file.resolve()
    named = {"file": str(where.relative_to(ROOT) if ROOT in where.parents else where), "sha256": sha256(run.file)}
    fix = f"restore it from the run's copy, or run the table again (--run-id {folder.name} --refit)"

    def edited(src: Path, what: str, edit) -> bytes:
        data = parse_json_text(read_input_text(src, what, fix), str(src), what, fix)
        if not isinstance(data, dict):
            raise HarnessError(f"{what} {src} holds a JSON {type(data).__name__}, not an object; {fix}")
        return (json.dumps(edit(data), indent=2) + "\n").encode()

    def as_table(data: dict) -> dict:  # the tactics beside the shipped table under its shipped name; the manifest
        if not isinstance(data.get("source", {}), dict):
            raise HarnessError(f"{folder / 'table.json'}: source is not an object; {fix}")
        data.setdefault("source", {})["manifest"] = named
        if isinstance(data["source"].get("tactics"), dict):
            data["source"]["tactics"]["file"] = autotune_cache_path(table).name
        if isinstance(data["source"].get("gemv_configs"), dict):
            data["source"]["gemv_configs"]["file"] = gemv_file(autotune_cache_path(table)).name
        return data

    def as_baseline(data: dict) -> dict:
        if isinstance(data.get("autotune_cache"), dict):
            data["autotune_cache"]["file"] = autotune_cache_path(base).name
        return data
    readable = table_check(profile, shipped_layout(profile))
    artifacts = [Artifact(table, edited(folder / "table.json", "the run's table", as_table), "the table",
                          lambda staged: (readable(staged), judged_again(run, staged))),
                 Artifact(base, edited(folder / "baseline.json", "the run's baseline", as_baseline), "the baseline",
                          baseline_check(profile))]
    for src, dst, what, check in (
            (folder / "table.autotune.json", autotune_cache_path(table), "the table's tactics", None),
            (gemv_file(folder / "table.autotune.json"), gemv_file(autotune_cache_path(table)),
             "the table's GEMV configurations", gemv_check),
            (gemv_file(autotune_cache_path(folder / "baseline.json")), gemv_file(autotune_cache_path(base)),
             "the baseline's GEMV configurations", gemv_check),
            (autotune_cache_path(folder / "baseline.json"), autotune_cache_path(base), "the baseline's tactics", None)):
        if src.is_file():
            artifacts.append(Artifact(dst, read_input(src, what, fix), what, check))
    return install_all(artifacts)
