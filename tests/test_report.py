"""The HTML report, built from the committed H200 data: its content, bad input, and a render in headless Chromium."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.errors import HarnessError
from reports.__main__ import main as reports_main

# one worker builds the module's report once for all its tests (pytest-xdist --dist loadgroup, as make test runs)
pytestmark = pytest.mark.xdist_group("report")
DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
TABLE = DATA / "h200-table-rules-fit.json"  # fixtures: a table and a baseline of two runs that tuned apiece
SECTIONS = ("summary", "table", "shapes", "totals", "cells", "problems", "comparison", "anatomy", "forward")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert reports_main(["build", str(DATA / "h200-lean-validate"), str(DATA / "h200-lean-fit"),
                         "--table", str(TABLE), "--baseline", str(DATA / "h200-baseline-tuned-apiece.json"),
                         "--anatomy", str(DATA / "h200-host-anatomy"), "--forward", str(DATA / "h200-lean-forward"),
                         "-o", str(out)]) == 0
    return out


def test_the_report_is_one_self_contained_file_with_every_section(report):
    html = report.read_text()
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in html
    assert "http://" not in html and "https://" not in html  # offline: nothing fetched
    assert len(re.findall(r"<img [^>]*src='data:image/png;base64,", html)) >= 16 + 3  # a figure per shape and more
    assert "NVIDIA H200" in html and "580.159.04" in html and "python -m bench run --gpu h200" in html
    assert "this run is another one (out of sample), with M values the fit never saw: 24, 40, 48, 56, 96, 1031, 6144" in html
    # the committed baseline's runs tuned FlashInfer apiece (no pinned tactics), and the page says what that means
    assert "tuned FlashInfer apiece, so drift includes the autotuner's per-process picks" in html


def test_the_verdict_in_words_agrees_with_validate(report, tmp_path, capsys):
    """The page's yes/no is calibrate validate's PASS/FAIL on the same inputs (the run and its measured forward);
    with the seed PR's table (which validate fails) the page says no."""
    from calibrate.__main__ import main as calibrate_main
    passes = calibrate_main(["validate", str(DATA / "h200-lean-validate"), "--table", str(TABLE), "--forward",
                             str(DATA / "h200-lean-forward")]) == 0
    verdict = re.search(r'<div class="verdict (yes|no|unknown)">(.*?)</div>', report.read_text())
    assert verdict.group(1) == ("yes" if passes else "no")
    assert verdict.group(2).startswith("Yes, the dispatcher holds" if passes else "No, the dispatcher does not hold")
    assert "the seed PR&#x27;s split" in report.read_text()
    seed = tmp_path / "seed.json"
    seed.write_text('{"profile": "h200", "low_m_backend": "tinygemm", "default_threshold": 32}')
    assert calibrate_main(["validate", str(DATA / "h200-sweep"), "--table", str(seed)]) == 1
    # a run that did not measure the table's lean paths is not judged with it; the page says why
    old = tmp_path / "old.html"
    assert reports_main(["build", str(DATA / "h200-sweep"), "--figures", "none", "-o", str(old)]) == 0
    assert "which h200-sweep did not measure" in old.read_text()
    out = tmp_path / "seed.html"
    assert reports_main(["build", str(DATA / "h200-sweep"), "--table", str(seed), "--figures", "none",
                         "-o", str(out)]) == 0
    assert "Figure left out" in out.read_text() and "data:image/png" not in out.read_text()
    seed_verdict = re.search(r'<div class="verdict (yes|no|unknown)">(.*?)</div>', out.read_text())
    assert seed_verdict.group(1) == "no" and "SLOWER" in seed_verdict.group(2)
    capsys.readouterr()


@pytest.mark.evidence
@pytest.mark.parametrize("part", ["", "refit-1"], ids=["the shipped table's check (PASS)", "its first fit (FAIL)"])
def test_the_table_runs_check_gets_the_same_verdict_on_the_page_as_from_validate(tmp_path, capsys, part):
    """The shipped table's run (and its first, failed fit): validate and the page give the same verdict."""
    from calibrate.__main__ import main as calibrate_main
    from evidence_store.store import current
    run = current("h200")
    fit = run / part if part else run
    args = [str(fit / "check-sweep"), "--table", str(fit / "table.json"),
            "--forward", str(fit / "check-forward")]
    out_v = calibrate_main(["validate", *args])
    capsys.readouterr()
    page = tmp_path / "check.html"
    assert reports_main(["build", *args, "--figures", "none", "-o", str(page)]) == 0
    check = re.search(r'<div class="verdict (yes|no|unknown)">(.*?)</div>', page.read_text())
    assert check.group(1) == ("yes" if out_v == 0 else "no")


def test_the_cell_table_has_every_measured_cell(report):
    import pandas as pd
    html = report.read_text()
    n_rows = len(pd.read_csv(DATA / "h200-lean-validate" / "results.csv"))
    assert html.count("<table class=\"cells\">") == 16
    body = "".join(re.findall(r'<table class="cells">.*?</table>', html, re.S))
    assert body.count("<tr>") == n_rows + 16  # a header row per table
    for v in ("v-FASTER", "v-SAME", "v-SLOWER"):
        assert v in body


@pytest.mark.parametrize("setup, needle", [
    (lambda d: None, "not found"),
    (lambda d: (d / "results.csv").write_text("a,b\n1,2\n"), "lacks column"),
    (lambda d: (d / "results.csv").write_bytes(b"\x00\x01garbage"), "lacks column|cannot read|no rows|cut short"),
    (lambda d: __import__("shutil").copy(DATA / "h200-sweep" / "results.csv", d), "run.json"),
])
def test_bad_input_is_one_clear_error_and_no_file(tmp_path, setup, needle):
    run = tmp_path / "run"
    run.mkdir()
    setup(run)
    out = tmp_path / "report.html"
    with pytest.raises(HarnessError, match=needle):
        reports_main(["build", str(run), "-o", str(out)])
    assert not out.exists() and not list(tmp_path.glob(".report.html*"))


def test_the_cli_exits_2_with_one_line(tmp_path, capsys):
    from harness.errors import run_cli
    assert run_cli(reports_main, "reports", ["build", str(tmp_path / "nothing"), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reports: error:")


def test_a_forward_run_with_void_eager_rows_says_so(tmp_path):
    out = tmp_path / "report.html"
    assert reports_main(["build", str(DATA / "h200-lean-validate"), "--forward", str(DATA / "h200-settled-forward-1"),
                         "--figures", "none", "-o", str(out)]) == 0
    html = out.read_text()
    section = html[html.index('<section id="forward">'):]
    section = section[:section.index("</section>")]
    assert "The eager rows of this run are void and left out" in section
    assert "after 200.0 ms of untimed runs of itself" in section


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_report_renders_in_headless_chromium(report, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium on this machine: install the distribution's package (apt-get install chromium); "
                    ".ci/run does")
    from PIL import Image, ImageStat
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *flags, "--window-size=1400,2400", f"--screenshot={shot}", report.as_uri()],
                   check=True, capture_output=True, timeout=120)
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 2400)
    stat = ImageStat.Stat(img)
    assert max(stat.stddev) > 20, "the page rendered blank"
    assert len(img.getcolors(1 << 20)) > 200  # text, tables and plots, not a flat page
    # the page as the browser built it, with the width it laid out at 1400 px (a probe script records it)
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", "<script>window.addEventListener('load', function () {"
                     "document.body.setAttribute('data-sw', document.documentElement.scrollWidth);});</script></body>"))
    dom = subprocess.run([exe, *flags, "--window-size=1400,2400", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], check=True, capture_output=True, text=True, timeout=120).stdout
    for sid in SECTIONS:
        assert f'id="{sid}"' in dom
    for heading in ("Verdict", "Per shape", "Per-forward totals (cell-sum model)", "Measured forward", "Every cell",
                    "Comparison", "Host-time anatomy"):
        assert f">{heading}</h2>" in dom
    # at 1400 px nothing widens the page itself: wide tables scroll inside their own box
    width = re.search(r'data-sw="(\d+)"', dom)
    assert width is not None and int(width.group(1)) <= 1400, f"the page is {width and width.group(1)} px wide"


def test_a_run_measured_in_two_folders_gets_a_forward_section_each(tmp_path):
    """--forward DIR DIR (one folder per model of one run): one section per folder, in the order given, each named."""
    out = tmp_path / "report.html"
    assert reports_main(["build", str(DATA / "h200-lean-validate"), "--forward", str(DATA / "h200-idle-forward-35b-1"),
                         str(DATA / "h200-idle-forward-1"), "--figures", "none", "-o", str(out)]) == 0
    html = out.read_text()
    first, second = html.index('<section id="forward-1">'), html.index('<section id="forward-2">')
    assert first < second and '<section id="forward">' not in html
    assert "Qwen3.5-35B-A3B" in html[first:second] and "Qwen3.5-4B" in html[second:]
    assert "Measured forward (h200-idle-forward-35b-1)" in html


def test_the_run_comparison_is_calibrate_compares(report, capsys):
    """The comparison section's counts are what `calibrate compare` prints for the same two runs (one compare)."""
    from calibrate.__main__ import main as calibrate_main
    calibrate_main(["compare", str(DATA / "h200-lean-validate"), str(DATA / "h200-lean-fit"), "--allow-env-mismatch"])
    total = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"SLOWER \d+, AMBIGUOUS \d+, FASTER \d+, SAME \d+ of \d+ cells", total)
    section = report.read_text().split('<section id="comparison">')[1].split("</section>")[0]
    assert total in section and "docs/compare.md" in section


@pytest.mark.parametrize("edit, table, needle", [
    (lambda info: info["fingerprint"].update(gpu_name="NVIDIA H100 80GB HBM3"), None,
     "measured on &#x27;NVIDIA H100 80GB HBM3&#x27;"),
    (lambda info: None, "b200", "the table is the b200 profile&#x27;s"),
], ids=["an H100 run, the H200 table", "H200 data, the B200 table"])
def test_the_report_judges_only_with_a_table_of_the_runs_gpu(edit, table, needle, tmp_path):
    """As validate: a table of another GPU gives no verdict; the page shows the measurements and says why."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(DATA / "h200-lean-validate", run)
    info = json.loads((run / "run.json").read_text())
    edit(info)
    (run / "run.json").write_text(json.dumps(info))
    argv = ["build", str(run), "--figures", "none", "-o", str(tmp_path / "r.html")]
    if table:
        argv += ["--table", str(ROOT / "dispatch" / "thresholds" / f"{table}.json")]
    assert reports_main(argv) == 0
    page = (tmp_path / "r.html").read_text()
    assert needle in page and "Yes, the dispatcher holds" not in page


def test_a_sweeps_settings_read_in_words_from_codes_and_from_older_sentences():
    from reports.build import sweep_settings
    new = {"host_blocks": {"calls": 10, "rounds": 5, "gpu_bound": {"calls": 3, "rounds": 3, "from_gpu_us": 50.0},
                           "block_us": 1000.0, "min_calls": 3},
           "stopping": {"criterion": "stdrel", "min_samples": 5, "max_noise": 0.005}, "gpu_twins": "read-off-twin",
           "skip_hopeless": 2.0, "skip_unchoosable": True}
    words = sweep_settings(new)
    assert words["host blocks"].startswith("10 calls x 5 rounds (at most 3 x 3")
    assert "at least 5 replays" in words["stopping"] and "gpu_from" in words["GPU twins"]
    assert words["skips"] == ("low-M paths above 2x F.linear's cost at a smaller M of the shape; paths the "
                              "dispatcher cannot choose")
    old = {"host_blocks": "10 calls x 5 rounds", "gpu_twins": "timed in full (--time-twins)",
           "skip_hopeless": "off (--all)"}
    assert sweep_settings(old) == {"host blocks": "10 calls x 5 rounds", "GPU twins": "timed in full (--time-twins)",
                                   "skips": "off (--all)"}
