"""python -m calibrate l2 RUNS...: which dispatch decisions flip between L2 states (calibrate/l2.py)."""
from __future__ import annotations

from bench.results import load_run_info
from calibrate.analysis import Cells, low_m_measured
from calibrate.forward_model import load_forward, model_vs_measured
from calibrate.l2 import MODES, close_cells, decisions
from calibrate.runs import load_run as _load
from calibrate.runs import profile_of as _profile_of
from dispatch.profiles import get_profile
from dispatch.table import load_table
from harness.cli import float_in
from harness.errors import HarnessError
from harness.io import atomic_write_text, output_file
from harness.options import add


def add_parser(sub) -> None:
    p_l2 = sub.add_parser("l2", help="which dispatch decisions flip between L2 states (runs swept with bench run --l2)")
    p_l2.add_argument("--rotate", required=True, help="results of bench run --l2 rotate")
    p_l2.add_argument("--flush", required=True, help="results of bench run --l2 flush")
    p_l2.add_argument("--warm", required=True, help="results of bench run --l2 warm")
    p_l2.add_argument("--cells-from", default=None,
                      help="pick the cells where the table's choice is within --within of the alternative from this "
                           "run (default: the --rotate run)")
    p_l2.add_argument("--within", type=float_in(0, 1), default=0.10, help="closeness of a cell (default 0.10)")
    add(p_l2, "forward", what=": one; which L2 state's cell-sum model is closest to it")
    add(p_l2, "csv")
    add(p_l2, "partial")


def run(args) -> int:
    csv_out = output_file(args.csv, "--csv") if args.csv else None
    runs, profile = {}, None
    for mode in MODES:
        src = getattr(args, mode)
        info = load_run_info(src)
        if info.get("l2", "rotate") != mode:
            raise HarnessError(f"--{mode} {src} was swept with --l2 {info.get('l2', 'rotate')}, not {mode}")
        profile = get_profile(_profile_of(info, None))
        df, _ = _load(src, args.partial, profile.name)
        runs[mode] = Cells.from_results(df)
    table = load_table(profile.name)
    pick = runs["rotate"] if args.cells_from is None else Cells.from_results(_load(args.cells_from, args.partial,
                                                                                   profile.name)[0])
    keys = close_cells(pick, table, args.within)
    if not keys:
        raise HarnessError(f"no cell where {low_m_measured(pick, table)} and aten are within {args.within:.0%}; "
                           f"nothing to judge")
    d = decisions(runs, table, keys)
    print(f"{len(d)} cells where {low_m_measured(pick, table)} and aten are within {args.within:.0%}; low-M/aten GPU-time "
          f"ratio per L2 state:")
    cols = ["n", "k", "m", "table_choice"] + [f"{m}_ratio" for m in MODES] + [f"{m}_faster" for m in MODES] + ["flips"]
    print(d[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"decisions that flip with the L2 state: {int(d['flips'].sum())} of {len(d)}")
    if csv_out:
        atomic_write_text(csv_out, d.to_csv(index=False))
    if args.forward:
        fdf, finfo = load_forward(args.forward, args.partial)
        print("\nmeasured forward (graph regime) / cell-sum model, per L2 state of the cells:")
        for mode, cells in runs.items():
            mv = model_vs_measured(cells, fdf[fdf["regime"] == "graph"], finfo, profile, table).dropna()
            if mv.empty:
                print(f"  {mode}: no forward row whose cells this run covers")
                continue
            dev = (mv["measured_over_model"] - 1).abs()
            print(f"  {mode}: {len(mv)} rows, median |measured/model - 1| {dev.median():.1%}, max {dev.max():.1%}, "
                  f"median measured/model {mv['measured_over_model'].median():.3f}")
    return 0
