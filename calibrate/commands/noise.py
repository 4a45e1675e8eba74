"""python -m calibrate noise RUN RUN...: the run-to-run noise floor of a GPU kind from replicate runs
(calibrate/noise.py)."""
from __future__ import annotations

import json
import math

from calibrate.analysis import Cells
from calibrate.install import Artifact, write_outputs
from calibrate.noise import coverage, coverage_line, fit_floor, noise_check, noise_path
from calibrate.runs import RESULTS, replicate_profile
from calibrate.runs import load_run as _load
from harness.io import shipped_or_results
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_noise = sub.add_parser("noise", parents=parents,
                             help="measure the run-to-run noise floor of GPU-time ratios from replicate runs")
    p_noise.add_argument("runs", nargs="+", help="two or more runs of one grid, each in a fresh process")
    add(p_noise, "out-file", what=": the floor", shown="results/<profile>/noise.json", dest="out")
    add(p_noise, "install", what="calibrate/noise/<profile>.json")
    add(p_noise, "partial")


def run(args) -> int:
    profile = replicate_profile(args.runs, args.gpu, "noise", "replicate runs")
    out = shipped_or_results(args.out, noise_path(profile.name), RESULTS / profile.name / "noise.json", args.install)
    cells = [Cells.from_results(_load(r, args.partial, profile.name)[0]) for r in args.runs]
    pairs = list(zip(cells, cells[1:]))
    floor = fit_floor(pairs, source={"runs": list(args.runs), "profile": profile.name,
                                     "command": "python -m calibrate noise " + " ".join(args.runs)})
    for edge, hw in floor.bands:
        print(f"reference GPU time <= {edge:g} µs: run-to-run log-ratio half-width {hw:.4f} (x{math.exp(hw):.4f})")
    for i, (a, b) in enumerate(pairs):
        # leave this pair out: the floor from the other pairs, judged on this one (in-sample when there is one pair)
        others = [p for j, p in enumerate(pairs) if j != i]
        held = fit_floor(others) if others else floor
        print(coverage_line(coverage(a, b, held), floor.level,
                            f"{args.runs[i + 1]} in {args.runs[i]}" + (", floor from the other pairs" if others else
                                                                      ", in-sample: one pair")))
    write_outputs([Artifact(out, (json.dumps(floor.to_json(), indent=2) + "\n").encode(), "the noise floor",
                            noise_check(profile.name))])
    print(f"wrote {out}")
    return 0
