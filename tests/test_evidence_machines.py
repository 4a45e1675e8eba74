"""Evidence checks of docs/results-h200.md, "Why several machines": the cross-machine spread of the lean paths'
ratios to F.linear over the five machines that measured with machine A's tactics, and today's fit rule left one
machine out at a time ("The eager cost of a call on F.linear's kernels"). Each recomputes a published figure from
evidence/; `make evidence` runs them."""
import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence"
# machine -> a sweep made with machine A's tactics (A's own sweep and the other machines' check sweeps)
MACHINES = {"A": "h200-table-20261201T1244-run/sweep", "D": "h200-table-h200-20261201c/check-sweep",
            "F": "h200-table-h200-20261201d/check-sweep", "G": "h200-table-h200-20261201e/check-sweep",
            "H": "h200-table-h200-20261201f/machine-5"}


def _cells(machine: str):
    from bench.results import load_results
    from calibrate.analysis import Cells
    return Cells.from_results(load_results(EVIDENCE / MACHINES[machine]))


@pytest.mark.evidence
def test_cross_machine_spread_of_the_lean_paths():
    """Over the 10 machine pairs, at the sweep's M: |log(ratio on one / ratio on the other)| of each lean path's ratio
    to F.linear, per band of F.linear's GPU time (the table's p99 and maximum), and the cells each pair moves > 3%."""
    from calibrate.noise import BANDS_US, replicate_diffs
    cells = {m: _cells(m) for m in MACHINES}
    grid = set(cells["A"].ms(1, 2048))
    d = pd.concat([replicate_diffs(cells[a], cells[b]).assign(pair=a + b) for a, b in itertools.combinations(cells, 2)])
    d = d[d["m"].isin(grid) & d["path"].str.startswith("flashinfer-lean:")]
    assert len(d) == 5415
    lo, got = 0.0, []
    for edge in BANDS_US:
        band = d[(d["ref_us"] > lo) & (d["ref_us"] <= edge)]["d"].abs()
        got.append((len(band), round(100 * np.quantile(band, 0.99), 1), round(100 * band.max(), 1)))
        lo = edge
    assert got == [(2512, 2.8, 9.4), (1573, 5.8, 12.7), (341, 8.2, 11.7), (989, 7.2, 24.7)]
    moved = (d["d"].abs() > math.log(1.03)).groupby(d["pair"]).sum()
    assert (int(moved.min()), int(moved.max())) == (5, 38)


@pytest.mark.evidence
@pytest.mark.parametrize("held_out, slower, ranges", [("D", set(), 2.66), ("F", {(12288, 2560, 16)}, 2.47),
                                                     ("G", set(), 2.41), ("H", set(), 2.47)])
def test_todays_rule_fitted_on_three_machines_besides_a(held_out, slower, ranges, tmp_path):
    """Today's fit rule on A's sweep, forward and refine cells plus the three other machines' sweeps, judged on the
    machine left out: its SLOWER cells at the sweep's M (F's M = 10 cell, measured before the lean call's F.linear
    fallback, is not at the sweep's M), and its ranges per shape and regime."""
    from calibrate.segments import range_counts
    from dispatch.table import load_table
    from calibrate.__main__ import main
    others = [str(EVIDENCE / MACHINES[m]) for m in MACHINES if m not in ("A", held_out)]
    table, csv = tmp_path / "t.json", tmp_path / "cells.csv"
    assert main(["fit", str(EVIDENCE / MACHINES["A"]), "--gpu", "h200", "--method", "segments", "--forward",
                 str(EVIDENCE / "h200-table-20261201T1244-run" / "forward"), "--tolerance", "0.04", "--add",
                 str(EVIDENCE / "h200-table-h200-20261201d" / "refine"), "--machine", *others, "--out", str(table)]) == 0
    main(["validate", str(EVIDENCE / MACHINES[held_out]), "--table", str(table), "--csv", str(csv)])
    verdicts = pd.read_csv(csv)
    grid = set(_cells("A").ms(1, 2048))
    found = {(int(r.n), int(r.k), int(r.m)) for r in verdicts.itertuples() if r.verdict == "SLOWER" and r.m in grid}
    assert found == slower and round(range_counts(load_table(path=table))["mean_ranges"], 2) == ranges


@pytest.mark.evidence
@pytest.mark.parametrize("fitting, slower, ranges", [
    ("DF", {"G": set(), "H": set()}, 2.41), ("DG", {"F": {(12288, 2560, 16)}, "H": set()}, 2.47),
    ("DH", {"F": {(12288, 2560, 16), (18432, 2560, 32)}, "G": set()}, 2.28),
    ("FG", {"D": set(), "H": {(10240, 2560, 64)}}, 2.50), ("FH", {"D": set(), "G": set()}, 2.47),
    ("GH", {"D": set(), "F": {(12288, 2560, 16)}}, 2.47)])
def test_todays_rule_fitted_on_two_machines_besides_a(fitting, slower, ranges, tmp_path):
    """docs/results-h200.md's leave-one-out table, two machines besides A: per pair of fitting machines, the SLOWER
    cells at the sweep's M on each of the two left out (5 in 12 judgments, as before the eager alike rule) and the
    ranges per shape and regime (2.28-2.50; 2.66-2.97 before)."""
    from calibrate.__main__ import main
    from calibrate.segments import range_counts
    from dispatch.table import load_table
    table = tmp_path / "t.json"
    assert main(["fit", str(EVIDENCE / MACHINES["A"]), "--gpu", "h200", "--method", "segments", "--forward",
                 str(EVIDENCE / "h200-table-20261201T1244-run" / "forward"), "--tolerance", "0.04", "--add",
                 str(EVIDENCE / "h200-table-h200-20261201d" / "refine"), "--machine",
                 *[str(EVIDENCE / MACHINES[m]) for m in fitting], "--out", str(table)]) == 0
    grid = set(_cells("A").ms(1, 2048))
    found = {}
    for held_out in slower:
        csv = tmp_path / f"{held_out}.csv"
        main(["validate", str(EVIDENCE / MACHINES[held_out]), "--table", str(table), "--csv", str(csv)])
        found[held_out] = {(int(r.n), int(r.k), int(r.m)) for r in pd.read_csv(csv).itertuples()
                           if r.verdict == "SLOWER" and r.m in grid}
    assert found == slower and round(range_counts(load_table(path=table))["mean_ranges"], 2) == ranges
