"""calibrate compare: a run against itself is never FASTER or SLOWER (SAME where its replays are tight, AMBIGUOUS where
they spread beyond the margin); a path made slower beyond the noise is SLOWER and the command exits 1; runs of
different environments are refused unless allowed (small fixtures, no GPU)."""
import json
import shutil

import pandas as pd
import pytest

from calibrate.__main__ import main
from harness.errors import HarnessError

RUN = "tests/data/h200-lean-fit"


def _slowed(tmp_path, factor: float, path: str = "aten", m: int = 1):
    out = tmp_path / f"b-{factor}"
    shutil.copytree(RUN, out)
    df = pd.read_csv(out / "results.csv")
    hit = (df["path"] == path) & (df["m"] == m) & (df["status"] == "ok")
    for col in ("gpu_us", "gpu_us_p20", "gpu_us_p80", "span_us"):
        if col in df:
            df.loc[hit, col] = df.loc[hit, col] * factor
    df.loc[hit, "gpu_samples_us"] = df.loc[hit, "gpu_samples_us"].map(
        lambda s: ";".join(str(float(v) * factor) for v in s.split(";") if v) if isinstance(s, str) else s)
    df.to_csv(out / "results.csv", index=False)
    return out, int(hit.sum())


def test_a_run_against_itself_is_never_faster_or_slower(tmp_path, capsys):
    copy = tmp_path / "a"
    shutil.copytree(RUN, copy)
    assert main(["compare", RUN, str(copy), "--no-floor", "--out-file", str(tmp_path / "c.csv")]) == 0
    rows = pd.read_csv(tmp_path / "c.csv")
    assert len(rows) > 0 and set(rows["verdict"]) <= {"SAME", "AMBIGUOUS"} and rows["ratio"].eq(1.0).all()
    assert (rows["verdict"] == "SAME").mean() > 0.9
    wide = rows[rows["verdict"] == "AMBIGUOUS"]
    assert ((wide["lo"] < 0.97) | (wide["hi"] > 1.03)).all()  # wide only where the replays spread
    assert "environment: the same" in capsys.readouterr().out


def test_a_path_slower_beyond_the_noise_is_slower_and_exits_1(tmp_path, capsys):
    slow, hit = _slowed(tmp_path, 1.5)
    assert hit > 0
    assert main(["compare", RUN, str(slow)]) == 1
    out = capsys.readouterr().out
    assert f"SLOWER {hit}," in out
    assert main(["compare", RUN, str(slow), "--paths", "flashinfer-lean:tinygemm"]) == 0


def test_runs_of_different_environments_are_refused_unless_allowed(tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(RUN, other)
    info = json.loads((other / "run.json").read_text())
    info["fingerprint"]["flashinfer"] = "9.9.9"
    (other / "run.json").write_text(json.dumps(info))
    with pytest.raises(HarnessError, match="different environments .*flashinfer"):
        main(["compare", RUN, str(other)])
    assert main(["compare", RUN, str(other), "--allow-env-mismatch", "--no-floor"]) == 0
    assert "environment differs: flashinfer" in capsys.readouterr().out


def test_agree_reports_compares_verdicts(tmp_path, capsys):
    slow, hit = _slowed(tmp_path, 1.5)
    assert main(["agree", RUN, str(slow)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "calibrate compare --no-floor" in line and f"SLOWER {hit}," in line
