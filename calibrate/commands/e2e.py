"""python -m calibrate e2e RESULTS: an end-to-end run, each step patched over stock with its interval, against the
forward prediction (calibrate/e2e_terms.py)."""
from __future__ import annotations

from bench.e2e import MODEL_KERNEL_PACKAGES, REFERENCE
from calibrate.e2e_terms import E2E_MARGIN, check_same_layers, control_margins, load_e2e, predictions, rounds_note
from calibrate.forward_model import load_forward
from calibrate.runs import check_gpu as _check_gpu
from calibrate.runs import profile_of as _profile_of
from harness.errors import HarnessError
from harness.io import distinct
from harness.options import add, renamed


def add_parser(sub) -> None:
    p_e2e = sub.add_parser("e2e", help="an end-to-end run (bench e2e): each step's patched / stock with its interval "
                                       "and verdict, and with --forward what its model's measured linears predict")
    p_e2e.add_argument("results", help="the folder python -m bench e2e wrote")
    add(p_e2e, "forward", what=": one of the same model and layout (bench forward --layout transformers --paths "
                               "aten,dispatch), on the same GPU: adds each step's prediction")
    p_e2e.add_argument("--control-runs", "--control", dest="control", metavar="DIR", nargs="+",
                       action=renamed("--control-runs", "--control"),
                       help="A/A runs of the same model (bench e2e --control) on the same GPU: each step's margin "
                            "becomes the farthest their medians moved from 1 (at least 1%%); --partial also admits "
                            "interrupted ones")
    add(p_e2e, "partial")


def kernels_note(info: dict, results: str) -> str:
    """Which kernels the model's linear-attention layers ran, said first where it was the PyTorch reference (a run
    no transformers user with the kernels installed would see)."""
    kernels = info.get("model_kernels")
    if not isinstance(kernels, dict):
        return f"note: {results} does not record which kernels its model ran (a run before model_kernels)"
    text = ", ".join(f"{op}: {k}" for op, k in sorted(kernels.items()))
    if REFERENCE in kernels.values():
        missing = [MODEL_KERNEL_PACKAGES[op][1] for op, k in sorted(kernels.items())
                   if k == REFERENCE and op in MODEL_KERNEL_PACKAGES]
        return (f"note: {results} ran {REFERENCE} kernels for {len(missing)} of its {len(kernels)} ops ({text}); "
                f"install {', '.join(missing) or 'the e2e extra'} for the kernels a user runs")
    seen = info.get("decode_kernels")
    seen = seen if isinstance(seen, dict) else {}  # none recorded: no CUPTI split, or a run before decode_kernels
    unseen = sorted(op for op in kernels if seen.get(op) == [])
    if unseen:
        return (f"note: {results} imported the packages ({text}), but none of {', '.join(unseen)}'s kernels ran in "
                f"its captured decode step: transformers ran its PyTorch reference there")
    shown = bool(seen) and all(seen.get(op) for op in kernels)
    return f"model kernels: {text}" + (" (each seen in the captured decode step)" if shown else "")


def run(args) -> int:
    df, info = load_e2e(args.results, args.partial)
    profile = _profile_of(info, None)
    margins = None
    notes = [rounds_note(info, args.results)]
    if args.control:
        distinct([args.results, *args.control], "--control")
        controls = []
        for folder in args.control:
            cdf, cinfo = load_e2e(folder, args.partial)
            if (cinfo.get("layers") or None) != (info.get("layers") or None):
                raise HarnessError(f"{folder} ran --layers {cinfo.get('layers') or 'all'}, {args.results} --layers "
                                   f"{info.get('layers') or 'all'}; run the control with the same --layers")
            _check_gpu(cinfo, profile, folder)
            controls.append((folder, cdf))
            notes.append(rounds_note(cinfo, folder))
        margins = control_margins(df, controls)
    fdf = None
    if args.forward:
        fdf, finfo = load_forward(args.forward)
        check_same_layers(info, finfo, args.results, args.forward)
        _check_gpu(finfo, profile, args.forward)
        if finfo.get("layout", "vllm") != "transformers":
            raise HarnessError(f"{args.forward} measured vLLM's layout; an e2e run of transformers' model needs a "
                               f"forward of --layout transformers")
    table = predictions(df, fdf, margins)
    if table.empty:
        raise HarnessError(f"{args.results} has no step measured in both variants")
    for note in filter(None, [*notes, kernels_note(info, args.results)]):
        print(note)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\nper_round: median of the rounds' patched / stock, [lo, hi] its 95% bootstrap interval; SAME within "
          + (f"±margin: the farthest the {len(args.control)} control run(s)' medians moved from 1, at least "
             f"{E2E_MARGIN:.0%}" if margins is not None else f"±{E2E_MARGIN:.0%}"))
    return 0
