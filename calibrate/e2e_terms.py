"""What a model's measured linears predict for an end-to-end step (bench e2e), beside what the step measured.

A step of transformers' model spends part of its time in the linears. A measured forward of the same layout
(`bench forward --layout transformers --paths aten,dispatch`) gives, at the step's M and regime, the linears' time
under F.linear and under the dispatcher. If the rest of the step is unchanged, the patched step takes
1 - (aten linears / stock step) x (1 - dispatch / aten) of the stock step: that is the prediction. Prefill at L
tokens is an eager forward at M = L; a captured decode step is the graph regime at M = 1; generate is eager at M = 1
per token, its prompt aside.

Each step also gets a verdict on its own samples: the rounds pair a patched sample with a stock one, and the median
of their ratios has a bootstrap interval (calibrate.analysis.paired_ratio_ci); SLOWER or FASTER only when the whole
interval is beyond the margin, SAME when it lies within it, AMBIGUOUS otherwise. The margin is E2E_MARGIN, or, with
A/A control runs (bench e2e --control: the same model, both variants on F.linear's kernels), the farthest a control's
median moved from 1 at that step, where that is more: an eager step's median moves between runs by more than one run's
interval shows.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from bench.results import check_format, samples_missing, samples_ok
from calibrate.analysis import paired_ratio_ci, parse_samples, ratio_ci, verdict
from dispatch.backends import ATEN, DISPATCH
from harness.errors import HarnessError
from harness.io import read_input_text, read_json_object

STEP_REGIME = {"prefill": "eager", "generate": "eager", "decode-graph": "graph"}
E2E_MARGIN = 0.01  # the band around 1 within which a step's interval says SAME


def load_e2e(folder: str | Path, partial: bool = False) -> tuple[pd.DataFrame, dict[str, Any]]:
    """e2e.csv and its run.json, validated; a run that was interrupted only with `partial`."""
    p = Path(folder)
    csv = p / "e2e.csv"
    if not csv.is_file():
        raise HarnessError(f"{p} holds no e2e.csv; pass a folder that python -m bench e2e wrote")
    info = read_json_object(p / "run.json", "run.json", "pass the folder bench e2e wrote, with its run.json")
    check_format(info, p / "run.json")
    if info.get("status", "complete") != "complete" and not partial:
        raise HarnessError(f"{p} was interrupted after {info.get('rounds_done', '?')} of {info.get('rounds', '?')} "
                           f"rounds; no verdict on it (pass --partial to judge what it holds)")
    import io
    text = read_input_text(csv, "e2e file", "restore the file bench e2e wrote or run it again")
    try:
        df = pd.read_csv(io.StringIO(text))
    except (ValueError, pd.errors.ParserError) as exc:  # EmptyDataError is a ValueError
        raise HarnessError(f"{csv} is not a table bench e2e wrote ({str(exc).splitlines()[0] if str(exc) else exc}); "
                           f"restore it or run it again") from None
    missing = [c for c in ("model", "step", "tokens", "variant", "status", "us") if c not in df.columns]
    if missing:
        raise HarnessError(f"{csv} lacks the column(s) {', '.join(missing)}; it is not a bench e2e file")
    key = ["model", "step", "tokens", "variant"]
    twice = df[df.duplicated(key, keep=False)]
    if not twice.empty:
        first = twice.iloc[0]
        raise HarnessError(f"{csv}: {first['step']} at {first['tokens']} tokens, {first['variant']}, is listed more "
                           f"than once; one row per step and variant: restore the file bench e2e wrote or run it "
                           f"again")
    ok = df["status"] == "ok"
    us = pd.to_numeric(df.loc[ok, "us"], errors="coerce")
    tokens = pd.to_numeric(df["tokens"], errors="coerce")
    if not (us > 0).all() or us.isna().any() or tokens.isna().any() or (tokens != tokens.round()).any():
        raise HarnessError(f"{csv}: an ok row has no positive time, or a row's tokens are not an integer; restore "
                           f"the file bench e2e wrote or run it again")
    if "samples_us" in df.columns and not df.loc[ok, "samples_us"].map(samples_ok).all():
        raise HarnessError(f"{csv}: an ok row's samples_us is not ';'-separated positive numbers; restore the file "
                           f"bench e2e wrote or run it again")
    rounds = info.get("rounds_done", info.get("rounds")) if info.get("status", "complete") != "complete" \
        else info.get("rounds")
    if "samples_us" in df.columns and isinstance(rounds, int) and not isinstance(rounds, bool):
        counts = df.loc[ok, "samples_us"].map(lambda v: len(str(v).split(";")) if not samples_missing(v) else rounds)
        if (counts != rounds).any():
            raise HarnessError(f"{csv}: an ok row holds {counts[counts != rounds].iloc[0]:g} samples where run.json "
                               f"records {rounds} rounds; the file and its run.json do not belong together: restore "
                               f"them or run it again")
    return df, info


def rounds_note(info: dict[str, Any], where: str) -> str | None:
    """For a run judged with --partial: how many of its rounds it holds (no verdict on the whole run)."""
    if info.get("status", "complete") == "complete":
        return None
    return (f"note (--partial): {where} holds {info.get('rounds_done', '?')} of {info.get('rounds', '?')} rounds "
            f"(it was {info.get('status')}); the verdicts below judge those rounds only, not the whole run")


def check_same_layers(e2e_info: dict[str, Any], forward_info: dict[str, Any], e2e_dir: str, forward_dir: str) -> None:
    """The linears' share of a step is only known for a forward of the same decoder layers as the e2e model."""
    ran, measured = e2e_info.get("layers"), forward_info.get("decoder_layers")
    if (ran or None) != (measured or None):
        said = {None: "every decoder layer"}
        fix = f"--layers {ran}" if ran else "no --layers"
        raise HarnessError(f"{e2e_dir} ran {said.get(ran, f'{ran} decoder layers')} but {forward_dir} measured "
                           f"{said.get(measured, f'{measured} decoder layers')}; pass a forward of the same model "
                           f"(bench forward --layout transformers {fix})")


def step_verdict(stock: Any, patched: Any, margin: float = E2E_MARGIN) -> dict[str, Any]:
    """patched / stock over a step's samples (bench e2e's samples_us, in round order): the median of the per-round
    ratios, its interval and the verdict; unpaired (ratio of medians) where the variants have different counts."""
    a, b = parse_samples(patched), parse_samples(stock)
    if len(a) < 2 or len(b) < 2:
        return {"ratio": math.nan, "lo": math.nan, "hi": math.nan, "verdict": "AMBIGUOUS", "rounds": min(len(a), len(b))}
    ratio, lo, hi = paired_ratio_ci(a, b) if len(a) == len(b) else ratio_ci(a, b)
    return {"ratio": ratio, "lo": lo, "hi": hi, "verdict": verdict(lo, hi, margin), "rounds": min(len(a), len(b))}


def control_margins(e2e: pd.DataFrame, controls: list[tuple[str, pd.DataFrame]]) -> dict[tuple[str, int], float]:
    """Per (step, tokens) of the e2e run: the largest |median per-round ratio - 1| over the A/A control runs, at least
    E2E_MARGIN. A control must be of the same model, have every step of the run, and show patched logits equal to
    the stock ones (else it changed kernels and is no A/A run)."""
    models = set(e2e["model"])
    margins: dict[tuple[str, int], float] = {}
    for where, c in controls:
        if set(c["model"]) != models:
            raise HarnessError(f"{where} ran {', '.join(sorted(set(c['model'])))}, not {', '.join(sorted(models))}; "
                               f"pass a control run of the same model (bench e2e --control)")
        patched = c[c["variant"] == "patched"]
        if "logits_rel_err" not in c.columns or not (pd.to_numeric(patched["logits_rel_err"]) == 0).all():
            raise HarnessError(f"{where}: the patched logits differ from the stock ones, so it is no A/A run; make "
                               f"one with bench e2e --control")
        judged = predictions(c).set_index(["step", "tokens"])["per_round"]
        for key in e2e[e2e["status"] == "ok"].groupby(["step", "tokens"]).groups:
            key = (str(key[0]), int(key[1]))
            if key not in judged.index or math.isnan(judged[key]):
                raise HarnessError(f"{where} has no {key[0]} at {key[1]} tokens in both variants; run the control "
                                   f"with the same --prefill and --tokens")
            margins[key] = max(margins.get(key, E2E_MARGIN), abs(float(judged[key]) - 1))
    return margins


def predictions(e2e: pd.DataFrame, forward: pd.DataFrame | None = None,
                margins: dict[tuple[str, int], float] | None = None) -> pd.DataFrame:
    """Per measured step: measured patched / stock (the ratio of the medians), the per-round ratio with its interval
    and verdict (step_verdict), and, with a forward, the linears' dispatch / aten at that M and regime, their share
    of the stock step and the predicted ratio (NaN where the forward did not measure that M). In the graph regime,
    dispatch_busy_over_span is the dispatcher forward's summed kernel time over its span: above 1, neighbouring
    linears' kernels overlapped (programmatic dependent launch), which a model with other kernels between its linears
    need not repeat, so the prediction may then overstate the gain. Where the e2e split its captured step by kernel,
    in_step_linears_saved is what the changed linears' kernels saved inside the step and in_step_rest_moved what the
    other kernels' time moved, each as a share of the stock step. margins (control_margins): each step's margin,
    added as a column."""
    ok = e2e[e2e["status"] == "ok"]
    fw = forward[forward["status"] == "ok"] if forward is not None else None
    rows = []
    for (model, step, tokens), g in ok.groupby(["model", "step", "tokens"]):
        by = g.set_index("variant")["us"]
        if not {"stock", "patched"} <= set(by.index):
            continue
        samples = g.set_index("variant")["samples_us"] if "samples_us" in g.columns else None
        margin = (margins or {}).get((str(step), int(tokens)), E2E_MARGIN)
        judged = step_verdict(*((samples["stock"], samples["patched"]) if samples is not None else ("", "")), margin)
        row = {"model": model, "step": step, "tokens": int(tokens), "measured": by["patched"] / by["stock"],
               "per_round": judged["ratio"], "lo": judged["lo"], "hi": judged["hi"], "verdict": judged["verdict"],
               "rounds": judged["rounds"], **({"margin": margin} if margins is not None else {})}
        if fw is not None:
            row.update(_predicted(fw, model, step, int(tokens), float(by["stock"])))
        saved, moved = _in_step(g)
        rows.append({**row, "in_step_linears_saved": saved, "in_step_rest_moved": moved})
    return pd.DataFrame(rows)


def _predicted(fw: pd.DataFrame, model: str, step: str, tokens: int, stock_us: float) -> dict[str, float]:
    """What a forward's linears predict for one step (see predictions)."""
    m = 1 if step in ("generate", "decode-graph") else tokens
    cell = fw[(fw["model"] == model) & (fw["m"] == m) & (fw["regime"] == STEP_REGIME.get(step, "eager"))]
    lin = cell.set_index("path")["us"] if not cell.empty else pd.Series(dtype=float)
    aten, disp = lin.get(ATEN, math.nan), lin.get(DISPATCH, math.nan)
    overlap = math.nan
    if STEP_REGIME.get(step) == "graph" and {"gpu_busy_us", "span_us"} <= set(cell.columns):
        d = cell[cell["path"] == DISPATCH]
        if len(d) == 1 and float(d["span_us"].iloc[0]) > 0:
            overlap = float(d["gpu_busy_us"].iloc[0]) / float(d["span_us"].iloc[0])
    stock = stock_us / (tokens if step == "generate" else 1)  # generate: per token
    share = aten / stock if stock > 0 else math.nan
    return {"linears_dispatch_over_aten": disp / aten if aten > 0 else math.nan, "linears_share_of_step": share,
            "predicted": 1 - share * (1 - disp / aten) if aten > 0 else math.nan, "dispatch_busy_over_span": overlap}


def _in_step(g: pd.DataFrame) -> tuple[float, float]:
    """A step's kernel split (bench e2e's own_kernels_us and shared_kernels_us, stock and patched) as shares of the
    stock step: (saved by the changed linears, moved in the rest); NaN where the run has none."""
    if not {"own_kernels_us", "shared_kernels_us"} <= set(g.columns):
        return math.nan, math.nan
    v = g.set_index("variant")[["us", "own_kernels_us", "shared_kernels_us"]].apply(pd.to_numeric, errors="coerce")
    stock, patched = v.loc["stock"], v.loc["patched"]
    if not stock["us"] > 0:
        return math.nan, math.nan
    return ((stock["own_kernels_us"] - patched["own_kernels_us"]) / stock["us"],
            (patched["shared_kernels_us"] - stock["shared_kernels_us"]) / stock["us"])
