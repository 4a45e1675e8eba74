"""python -m calibrate agree RUN_A RUN_B | host-shift --arm NAME RUN RUN...: how closely runs of the same cells
agree, and whether arms of runs differ in host time beyond the run-to-run noise (calibrate/agree.py)."""
from __future__ import annotations

from pathlib import Path

from calibrate.agree import agreement, host_shift, host_shift_lines, ratio_lines, ratio_moves, summary_lines
from calibrate.analysis import Cells
from calibrate.compare import DEFAULT_MARGIN, compare, verdict_totals
from calibrate.runs import load_run as _load
from harness.errors import HarnessError
from harness.io import distinct, same_gpu
from harness.options import add


def add_parser(sub) -> None:
    p_agree = sub.add_parser("agree", help="how closely two runs of the same cells agree (GPU and host time)")
    p_agree.add_argument("run_a")
    p_agree.add_argument("run_b")
    add(p_agree, "partial")
    add(p_agree, "allow-mismatch")
    p_shift = sub.add_parser("host-shift", help="whether arms of runs of the same cells (e.g. 1 GPU, 2 GPUs with and "
                                                 "without the host-timing lock) differ in host time beyond the "
                                                 "run-to-run noise")
    p_shift.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "RUN"),
                         help="an arm: its name, then two or more runs (repeat --arm for each arm, two or more)")
    add(p_shift, "partial")
    add(p_shift, "allow-mismatch")


def run_agree(args) -> int:
    distinct([args.run_a, args.run_b], "agree")
    a, ia = _load(args.run_a, args.partial)
    b, ib = _load(args.run_b, args.partial)
    same_gpu([(args.run_a, ia), (args.run_b, ib)], args.allow_mismatch)
    ca, cb = Cells.from_results(a), Cells.from_results(b)
    shared = agreement(ca, cb)
    lines = summary_lines(shared) + ratio_lines(ratio_moves(ca, cb))
    if not shared.empty:  # GPU time per cell in calibrate compare's classes, no floor: the runs' own replays
        c = compare(a, b, ia, ib, None, DEFAULT_MARGIN)
        lines.append(f"GPU time b/a per cell against the runs' own replays, margin {DEFAULT_MARGIN:.0%} "
                     f"(calibrate compare --no-floor): " + verdict_totals(c.rows["verdict"]))
    print("\n".join(lines))
    return 0


def run_host_shift(args) -> int:
    arms: dict[str, dict[str, Cells]] = {}
    given = [r for _, *runs in args.arm for r in runs]
    infos: list[tuple[str, dict]] = []
    names = [Path(r).name for r in given]  # a run's label: its folder name, or the path where names repeat
    for name, *runs in args.arm:
        if len(runs) < 2 or name in arms:
            raise HarnessError(f"--arm {name}: an arm needs its own name and two or more runs "
                               f"(got {len(runs)} run(s){', and the name twice' if name in arms else ''})")
        loaded = {r: _load(r, args.partial) for r in runs}
        infos += [(r, info) for r, (_, info) in loaded.items()]
        arms[name] = {(Path(r).name if names.count(Path(r).name) == 1 else r): Cells.from_results(df)
                      for r, (df, _) in loaded.items()}
    if len(arms) < 2:
        raise HarnessError("host-shift needs two or more --arm NAME RUN RUN...")
    twice = next((r for r in given if sum(Path(g).resolve() == Path(r).resolve() for g in given) > 1), None)
    if twice is not None:
        raise HarnessError(f"host-shift: {twice} is given twice; each run belongs to one arm, once")
    same_gpu(infos, args.allow_mismatch)
    print("\n".join(host_shift_lines(host_shift(arms))))
    return 0
