"""python -m calibrate forward-ratio --forward RUN --pairs A/B,...: one measured forward rule over another
(calibrate/forward_ratio.py)."""
from __future__ import annotations

import pandas as pd

from calibrate.forward_model import load_forward
from calibrate.forward_noise import load_forward_floor
from calibrate.forward_ratio import parse_pairs, ratios, text
from calibrate.runs import check_gpu as _check_gpu
from calibrate.runs import load_forwards as _load_forwards
from calibrate.runs import profile_of as _profile_of
from calibrate.runs import refuse_overlap as _refuse_overlap
from dispatch.profiles import get_profile
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p = sub.add_parser("forward-ratio", parents=parents,
                       help="one measured forward rule over another per model, regime and M, paired, with its "
                            "interval and verdict (e.g. table-pdl/table-direct)")
    add(p, "forward", nargs="+", required=True, what="of one GPU, measuring both rules of each pair")
    p.add_argument("--pairs", required=True, help="comma list of RULE/REFERENCE, e.g. "
                                                  "table-pdl/table-direct,fused-siblings/table-direct")
    add(p, "no-floor", what="(intervals from the runs' paired rounds alone)")
    add(p, "partial")


def run(args) -> int:
    pairs = parse_pairs(args.pairs)
    first = load_forward(args.forward[0], args.partial)  # read once: it names the profile the others must match
    profile = get_profile(_profile_of(first[1], args.gpu))
    _check_gpu(first[1], profile.name, args.forward[0])
    runs = [first, *_load_forwards(args.forward[1:], profile.name, args.partial)]
    _refuse_overlap([(str(f), df, info) for f, (df, info) in zip(args.forward, runs)])
    floor = None if args.no_floor else load_forward_floor(profile.name)
    print(text(ratios(pd.concat([df for df, _ in runs], ignore_index=True), pairs, floor)))
    where = f"paired rounds widened by the forward floor ({floor.describe()})" if floor else "paired rounds alone"
    print(f"\nintervals: {where}; FASTER / SLOWER: the whole interval below / above 1, AMBIGUOUS: across it")
    return 0
