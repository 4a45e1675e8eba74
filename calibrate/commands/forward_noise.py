"""python -m calibrate forward-noise RUN RUN...: the run-to-run floor of measured forwards
(calibrate/forward_noise.py)."""
from __future__ import annotations

import json
import math

from calibrate.forward_noise import fit_forward_floor, forward_coverage, forward_noise_check, forward_noise_path
from calibrate.install import Artifact, write_outputs
from calibrate.noise import coverage_line
from calibrate.runs import RESULTS, replicate_profile
from calibrate.runs import load_forwards as _load_forwards
from harness.errors import HarnessError
from harness.io import shipped_or_results
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_fnoise = sub.add_parser("forward-noise", parents=parents,
                              help="measure the run-to-run noise of measured forwards' ratios from runs in fresh "
                                   "processes")
    p_fnoise.add_argument("runs", nargs="+", help="two or more measured-forward folders (python -m bench forward); "
                                                  "each consecutive pair is a replicate pair")
    add(p_fnoise, "out-file", what=": the floor", shown="results/<profile>/forward-noise.json", dest="out")
    add(p_fnoise, "install", what="calibrate/noise/<profile>-forward.json")
    add(p_fnoise, "partial")


def run(args) -> int:
    profile = replicate_profile(args.runs, args.gpu, "forward-noise", "measured-forward runs")
    out = shipped_or_results(args.out, forward_noise_path(profile.name), RESULTS / profile.name / "forward-noise.json",
                             args.install)
    runs = [fdf for fdf, _ in _load_forwards(args.runs, profile.name, args.partial)]
    pairs = list(zip(runs, runs[1:]))
    floor = fit_forward_floor(pairs, source={"runs": list(args.runs), "profile": profile.name,
                                             "command": "python -m calibrate forward-noise " + " ".join(args.runs)})
    for regime, hw in floor.half_widths.items():
        print(f"{regime}: run-to-run log-ratio half-width {hw:.4f} (x{math.exp(hw):.4f}) at {floor.level:.0%}")
    for i, (a, b) in enumerate(pairs):
        # leave this pair out: the floor from the other pairs, judged on this one (in-sample when there is one pair)
        others = [p for j, p in enumerate(pairs) if j != i]
        try:
            held = fit_forward_floor(others) if others else floor
        except HarnessError:  # the other pairs share too few ratios: judged in-sample
            held, others = floor, []
        cov = forward_coverage(a, b, held)
        for regime in ("graph", "eager"):
            print(coverage_line(cov[cov["regime"] == regime], floor.level,
                                f"{regime}, {args.runs[i + 1]} in {args.runs[i]}"
                                + (", floor from the other pairs" if others else ", in-sample")))
    write_outputs([Artifact(out, (json.dumps(floor.to_json(), indent=2) + "\n").encode(),
                            "the forward noise floor", forward_noise_check(profile.name))])
    print(f"wrote {out}")
    return 0
