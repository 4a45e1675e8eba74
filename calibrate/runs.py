"""What every calibrate command that reads runs shares: a run's GPU check, its profile, its loading (run.json first,
then the validated results), and the PASS/FAIL word."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.results import load_results, load_run_info
from calibrate.forward_model import load_forward
from dispatch.profiles import PROFILES, get_profile, matches
from harness.console import terminal
from harness.errors import HarnessError
from harness.io import check_target, distinct
from shapes.derive import layout_covers

RESULTS = Path("results")  # where a command writes by default: never a shipped file


def check_gpu(info: dict, profile_name: str, results: str, allow_mismatch: bool | None = None) -> None:
    """The run must come from the profile's GPU (one identity rule: dispatch.profiles.matches). allow_mismatch: the
    command's --allow-mismatch; None where the command has no such option (the error then does not offer it)."""
    fp = info.get("fingerprint") or {}
    profile = get_profile(profile_name)
    gpu, sm = str(fp.get("gpu_name", "")), fp.get("sm")
    if not allow_mismatch and not matches(profile, gpu, sm if isinstance(sm, int) else -1):
        raise HarnessError(f"{results} was measured on {gpu!r} (SM{sm}), not on a {profile.name} GPU; "
                           f"pass --gpu for that GPU" + (" (or --allow-mismatch to judge it anyway)"
                                                         if allow_mismatch is not None else ""))


def table_problem(table, info: dict, measured_paths: set[str], results: str, allow_mismatch: bool = False) -> str:
    """Why `table` cannot judge a run (its run.json `info`, the paths it measured), or "": the one rule of validate
    and the report. The table must be of the run's GPU (the identity rule on the run's fingerprint, unless
    allow_mismatch), of a layout that holds the run's, and choose only paths the run measured (else it would count
    F.linear where the table runs a kernel the run never timed)."""
    fp = info.get("fingerprint") or {}
    gpu, sm = str(fp.get("gpu_name", "")), fp.get("sm")
    profile = PROFILES.get(table.profile)
    if profile is None or (not allow_mismatch and not matches(profile, gpu, sm if isinstance(sm, int) else -1)):
        return (f"the table is the {table.profile} profile's and {results} was measured on {gpu or 'an unnamed GPU'!r}"
                f" (SM{sm}): judge it with its own GPU's table (--table FILE)")
    run_layout, table_layout = info.get("layout", "vllm"), table.source.get("layout", "vllm")
    if not layout_covers(table_layout, run_layout):
        return (f"{results} measured {run_layout}'s layout and the table was fitted on {table_layout}'s: judge it "
                f"with a table of that layout (--table FILE), or measure the table's layout (bench run --layout "
                f"{table_layout})")
    unmeasured = sorted(table.paths() - measured_paths)
    if unmeasured:
        return (f"the table chooses {', '.join(unmeasured)}, which {results} did not measure; judge it on a run that "
                f"did (python -m bench run --paths ...)")
    return ""


def profile_of(info: dict, given: str | None) -> str:
    if given:
        return given
    name = info.get("profile")
    if not name:
        raise HarnessError("run.json names no GPU profile; pass --gpu")
    return name


def load_run(results: str, partial: bool, profile_name: str | None = None, allow_mismatch: bool | None = None):
    """run.json first (the GPU check names the real problem before the grid check), then the validated table."""
    info = load_run_info(results)
    if profile_name is not None:
        check_gpu(info, profile_name, results, allow_mismatch)
    df = load_results(results, partial=partial)
    for problem in df.attrs["incomplete"]:
        print(f"note (--partial): {results}: {problem}; judging only the measured cells", file=terminal())
    return df, info


def verdict_word(ok: bool, results: str | None, incomplete: list[str]) -> str:
    """PASS or FAIL, and, on data that --partial let through incomplete, that it is no verdict on the whole grid."""
    word = "PASS" if ok else "FAIL"
    if incomplete:
        word += f" on the measured cells only: {results} is incomplete, so this is no verdict on the whole grid"
    return word


def load_forwards(folders: list[str], profile_name: str, partial: bool) -> list[tuple[pd.DataFrame, dict]]:
    """Measured-forward runs (forward.csv and run.json), each checked to come from the profile's GPU."""
    runs = []
    for folder in folders:
        fdf, finfo = load_forward(folder, partial)
        check_gpu(finfo, profile_name, folder)
        runs.append((fdf, finfo))
    return runs


def refuse_overlap(forwards: list[tuple[str, pd.DataFrame, dict]]) -> None:
    """Several --forward folders must not share a (model, M): which one's verdict would stand is not defined."""
    seen: dict[tuple[str, int], str] = {}
    for folder, fdf, _ in forwards:
        for key in sorted(set(zip(fdf["model"], fdf["m"].astype(int)))):  # the first overlap, reproducibly
            if key in seen:
                raise HarnessError(f"--forward {seen[key]} and {folder} both measured {key[0]} M={key[1]}; pass one "
                                   f"folder per (model, M) (a replicate goes to --forward-replicate)")
            seen[key] = folder


def replicate_profile(runs: list[str], gpu: str, command: str, what: str):
    """The profile a command over replicate runs (noise, forward-noise) works for: two or more runs, each once."""
    if len(runs) < 2:
        raise HarnessError(f"{command} needs two or more {what}")
    distinct(runs, command)
    return get_profile(gpu)


def sibling_free(sibling: Path, out: Path, install: bool) -> None:
    """A tactics file written beside a table or baseline: the user named only the table, so an existing file there
    is replaced only inside results/ (the harness's own folder) or with --install."""
    inside_results = RESULTS.resolve() in out.resolve().parents
    if sibling.exists() and not (install or inside_results):
        raise HarnessError(f"{sibling} exists and would be replaced by the tactics written beside {out}; remove it "
                           f"or choose another --out")
    if sibling.exists() or sibling.is_symlink():
        check_target(sibling, "the tactics file", install)
