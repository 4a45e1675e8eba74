"""python -m calibrate vllm: the answer in vLLM terms from measured forwards (calibrate/vllm_terms.py)."""
from __future__ import annotations

import pandas as pd

from calibrate.forward_model import load_forward
from calibrate.forward_noise import load_forward_floor
from calibrate.runs import load_forwards as _load_forwards
from calibrate.runs import profile_of as _profile_of
from calibrate.runs import refuse_overlap as _refuse_overlap
from calibrate.vllm_terms import markdown, text, vllm_terms
from dispatch.profiles import get_profile
from harness.options import add


def add_parser(sub, parents: list) -> None:
    p_vllm = sub.add_parser("vllm", parents=parents,
                            help="the answer in vLLM's terms from measured forwards: vLLM default, its flag, the seed"
                                 " PR's rule, the best single threshold and the table")
    add(p_vllm, "forward", nargs="+", required=True, what="of one GPU (default paths), e.g. one per model")
    add(p_vllm, "no-floor", what="(intervals from the runs' paired rounds alone)")
    p_vllm.add_argument("--markdown", action="store_true", help="print only the short answer as a Markdown table")
    add(p_vllm, "partial")


def run(args) -> int:
    first = load_forward(args.forward[0], args.partial)[1]
    profile = get_profile(_profile_of(first, args.gpu))
    runs = _load_forwards(args.forward, profile.name, args.partial)
    forwards = [(str(f), df, info) for f, (df, info) in zip(args.forward, runs)]
    _refuse_overlap(forwards)
    floor = None if args.no_floor else load_forward_floor(profile.name)
    terms = vllm_terms(pd.concat([df for df, _ in runs], ignore_index=True), profile, floor)
    if args.markdown:
        print(markdown(terms))
        return 0
    print(text(terms))
    where = f"paired rounds widened by the forward floor ({floor.describe()})" if floor else "paired rounds alone"
    print(f"\nintervals: {where}")
    return 0
