"""Assemble report.html from one or more runs, an optional stored baseline and an optional host-anatomy run."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from bench.forward_paths import DISPATCH_PYTHON, RULES, TABLE_DIRECT
from bench.results import load_run_info
from calibrate.baseline import cells_from_results, load_baseline
from calibrate.baseline import compare as compare_with_baseline
from calibrate.compare import DEFAULT_MARGIN, VERDICTS, compare, counts_per_path, not_same, verdict_totals
from calibrate.determinism import by_path
from calibrate.forward_model import (EAGER_VOID, MODEL_MISS, eager_void, forward_ratios, forward_verdicts, load_forward,
                                     model_vs_measured)
from calibrate.vllm_terms import COMPARED, LABELS, geomean, required_paths, vllm_terms
from dispatch.backends import ATEN, is_flashinfer
from dispatch.table import describe_ranges
from dispatch.vllm import VLLM_VERSION, flag_supported
from harness.console import terminal
from harness.errors import HarnessError, signals_deferred
from harness.io import atomic_write_text, distinct, same_gpu
from reports import figures
from reports.data import (Run, compare_runs, headline, load_anatomy, load_run, ratio_rows, shape_crossovers,
                          with_dispatch_verdicts)
from reports.page import esc, kv_table, page, table

FINGERPRINT_KEYS = ("gpu_name", "sm", "sm_count", "l2_bytes", "driver", "cuda", "torch", "cublas", "cudnn",
                    "flashinfer", "cupti_python", "libcupti", "cutlass_dsl", "python", "harness_sha")


def sweep_settings(info: dict) -> dict[str, str]:
    """A sweep's settings in words, from run.json's codes (format 3) or the sentences older runs stored."""
    out = {}
    blocks = info.get("host_blocks")
    if isinstance(blocks, dict):
        bound = blocks.get("gpu_bound") or {}
        out["host blocks"] = (f"{blocks.get('calls')} calls x {blocks.get('rounds')} rounds (at most "
                              f"{bound.get('calls')} x {bound.get('rounds')} where a call is estimated at >= "
                              f"{bound.get('from_gpu_us')} µs of GPU time)" +
                              (f"; a block holds the calls that last {blocks['block_us']:g} µs by a warm-up estimate, "
                               f"at least {blocks.get('min_calls')}" if blocks.get("block_us") else ""))
    elif blocks:
        out["host blocks"] = str(blocks)
    stop = info.get("stopping")
    if isinstance(stop, dict):
        out["stopping"] = (f"fixed: {stop.get('samples')} replays" if stop.get("criterion") == "fixed" else
                           f"{stop.get('criterion')}: at least {stop.get('min_samples')} replays, relative standard "
                           f"deviation at most {stop.get('max_noise')}")
    elif stop:
        out["stopping"] = str(stop)
    twins = info.get("gpu_twins")
    out["GPU twins"] = {"full": "timed in full (--time-twins)",
                        "read-off-twin": "a public call or the dispatcher that ran its twin's kernels takes that "
                                         "path's GPU time (gpu_from names it); a mismatch is timed itself"
                        }.get(twins, str(twins)) if twins else None
    hopeless = info.get("skip_hopeless")
    out["skips"] = ((f"low-M paths above {hopeless:g}x F.linear's cost at a smaller M of the shape" if
                     isinstance(hopeless, (int, float)) and not isinstance(hopeless, bool) else str(hopeless or "none"))
                    + ("; paths the dispatcher cannot choose" if info.get("skip_unchoosable") is True else ""))
    return {k: v for k, v in out.items() if v}


def environment(run: Run) -> str:
    fp = run.info.get("fingerprint") or {}
    items = {"results": run.path, "command": run.info.get("command"), "started": run.info.get("started"),
             "status": run.info.get("status"), "wall s": run.info.get("wall_s"), "profile": run.info.get("profile"),
             "timer": run.info.get("timer"), "replays per cell": run.info.get("samples"),
             "warm L2": run.info.get("warm_l2"), **sweep_settings(run.info)}
    items.update({k: fp.get(k) for k in FINGERPRINT_KEYS})
    return kv_table({k: v for k, v in items.items() if v is not None})


def summary_section(run: Run, head) -> str:
    cls = {True: "yes", False: "no", None: "unknown"}[head.holds]
    first, rest = head.sentences[0], head.sentences[1:]
    items = "".join(f"<li>{esc(s)}</li>" for s in rest)
    return (f'<div class="verdict {cls}">{esc(first)}</div><ul>{items}</ul>'
            f"<p class='muted'>Verdicts: a 95% interval of the GPU-time ratio (bootstrap over replays, widened by the "
            f"run-to-run floor measured from replicate runs where calibrate/noise has one) wholly below 1 - 3% is FASTER, "
            f"wholly above 1 + 3% SLOWER, inside ±3% SAME, otherwise AMBIGUOUS. GPU time is CUPTI kernel time inside "
            f"CUDA graphs (cold L2); host time is the eager call's wall time with the GPU kept busy.</p>"
            f"<h3>Environment</h3>{environment(run)}")


def range_strips(run: Run) -> list[tuple[str, tuple]]:
    """The table's rows for the ranges figure: one per (shape, regime)."""
    return [(f"{n}x{k} {regime}", own[regime]) for (n, k), own in sorted(run.table.shapes.items())
            for regime in ("graph", "eager")] if run.table is not None else []


def table_section(run: Run, ranges_img: Callable[[], str] | None = None) -> str:
    """The dispatch table a reviewer changes: per shape, each regime's M ranges, and where it came from.
    `ranges_img`: the ranges figure, drawn already (build draws it on workers); None: drawn here."""
    t = run.table
    if t is None:
        return f"<p>{esc(run.table_problem or 'No dispatch table for this GPU.')}</p>"
    src = t.source
    rule = str(src.get("rule") or "")
    meta = {"fitted from": src.get("fitted_from"), "fit command": src.get("fit_command"), "date": src.get("date"),
            "M held out": ", ".join(map(str, src.get("held_out_m") or [])) or None,
            "tactics": (src.get("tactics") or {}).get("file"), "rule": rule.split(";")[0] or None,
            "note": src.get("note")}
    rows = [{"shape": f"{n}x{k}", "graph": describe_ranges(own["graph"]), "eager": describe_ranges(own["eager"])}
            for (n, k), own in sorted(t.shapes.items())]
    rows.append({"shape": "any other shape", "graph": t.describe("graph"), "eager": t.describe("eager")})
    cols = [("shape", "shape"), ("graph", "graph regime"), ("eager", "eager regime")]
    strips = range_strips(run)
    return ('<div class="wrapkv">' + kv_table({k: v for k, v in meta.items() if v}) + "</div>"
            + (f"<details><summary>The fit's whole rule</summary><p>{esc(rule)}</p></details>" if ";" in rule else "")
            + "<p>graph: ranges used while a CUDA graph is being captured (GPU time counts); eager: otherwise (host "
              "and GPU time count). M above a shape's last range runs F.linear.</p>"
            + figures.img("the table's ranges", ranges_img or (lambda: figures.ranges_figure(strips)))
            + "<details><summary>The ranges as text</summary>"
            + table(pd.DataFrame(rows), cols, cls="wrap", left=tuple(c for c, _ in cols)) + "</details>")


def shape_jobs(run: Run, rows: pd.DataFrame, xo: dict[tuple[int, int], float]) -> list[tuple]:
    """shape_figure's arguments per shape, in the order shapes_section lists them; `xo`: shape_crossovers(run)."""
    cap = run.profile.capture_size if run.profile else None
    return [(g, f"{n}x{k}", run.table.threshold(n, k, "graph") if run.table else None, xo.get((n, k), float("nan")),
             cap) for (n, k), g in rows.groupby(["n", "k"], sort=True)]


def shapes_section(run: Run, rows: pd.DataFrame, images: list[str], xo: dict[tuple[int, int], float]) -> str:
    """Per shape its figure and the table's ranges; `images`: the figures of shape_jobs, in order (build draws them
    on workers); `xo`: shape_crossovers(run), computed once for both."""
    out = []
    for ((n, k), g), img in zip(rows.groupby(["n", "k"], sort=True), images):
        first = g.iloc[0]
        meta = f"models: {first.get('models', '')} · layers: {first.get('layers', '')} · per-forward count: {first.get('count', '')}"
        xs = xo.get((n, k), float("nan"))
        note = ("dispatcher, graph: " + describe_ranges(run.table.ranges(n, k, "graph")) + "; eager: "
                + describe_ranges(run.table.ranges(n, k, "eager"))) if run.table else "no threshold table"
        note += "" if xs != xs else f"; {run.table.low_m_backend} stops being FASTER than aten at M* = {xs:.0f}"
        out.append(f"<h3>N={n}, K={k} <span class='muted'>({esc(first['shape'])})</span></h3>"
                   f"<p class='muted'>{esc(meta)} · {esc(note)}</p>{figures.img(f'{n}x{k}', lambda: img)}")
    return "".join(out)


def totals_section(head) -> str:
    t = head.totals
    if t.empty:
        return "<p>No per-forward totals: the run lacks a threshold table or aten cells for a model's layers.</p>"
    show = t.copy()
    for c in ("aten_us", "flashinfer_us", "dispatch_us", "best_us"):
        show[c] = show[c] / 1e3
    cols = [("model", "model"), ("m", "M"), ("regime", "regime"), ("actual", "vLLM runs M here"),
            ("aten_us", "aten ms"), ("flashinfer_us", "FlashInfer ms"), ("dispatch_us", "dispatcher ms"),
            ("best_us", "best ms"), ("dispatch_over_best", "dispatcher / best")]
    fmt = {c: "{:.4g}" for c, _ in cols}
    return (figures.img('per-forward totals', lambda: figures.totals_figure(t)) +
            "<p class='muted'><b>A model, not a measurement:</b> the count-weighted sum over a model's in-graph linear "
            "layers (lm_head excluded) of GPU time per call in the CUDA-graph regime and of max(host, GPU) per call in "
            "the eager regime. It leaves out the gaps, clocks and L2 state of a real sequence and the overlap of host "
            "and GPU across layers; the Measured forward section (bench forward, where given) is the ground truth. "
            "'FlashInfer' is the low-M backend at M <= 32 and FlashInfer's cuBLASLt above (flashinfer-everywhere: a "
            "hypothetical on SM90, where vLLM runs F.linear; docs/vllm.md).</p>"
            f"<details><summary>Table ({len(show)} rows)</summary>"
            f"{table(show.sort_values(['model', 'regime', 'm']), cols, fmt=fmt, left=('model', 'regime'))}</details>")


CELL_COLS = [("m", "M"), ("path", "path"), ("status", "status"), ("gpu_us", "GPU µs"), ("gpu_us_p20", "p20"),
             ("gpu_us_p80", "p80"), ("event_us", "events µs"), ("host_us", "host µs"), ("ratio", "ratio vs aten"),
             ("ratio_lo", "lo"), ("ratio_hi", "hi"), ("verdict", "verdict"), ("same_kernel", "aten's kernel"),
             ("kernels_per_call", "kernels/call"), ("kernels", "kernels"), ("timer", "timer"), ("reason", "reason")]


def cells_section(rows: pd.DataFrame) -> str:
    fmt = {c: "{:.4g}" for c in ("gpu_us", "gpu_us_p20", "gpu_us_p80", "event_us", "host_us")}
    fmt.update({c: "{:.3f}" for c in ("ratio", "ratio_lo", "ratio_hi")})
    fmt["kernels_per_call"] = "{:.0f}"
    parts = ["<p><input id='filter' placeholder='filter rows: e.g. tinygemm, SLOWER, failed, nvjet…' "
             "oninput='filterCells(this.value)'></p>",
             "<p class='muted'>One table per shape; a row per (M, path). Ratio = the path's median GPU time over "
             "aten's, with its 95% interval; the dispatch row's verdict is the dispatcher's against the best "
             "candidate. 'aten's kernel' says whether the path ran exactly aten's kernels.</p>"]
    for (n, k), g in rows.groupby(["n", "k"], sort=True):
        counts = g["verdict"].str.split().str[0].value_counts().to_dict()
        tag = ", ".join(f"{v} {c}" for v, c in sorted(counts.items()) if v)
        parts.append(f"<details class='shape'><summary>N={n} K={k} ({esc(g.iloc[0]['shape'])}): {len(g)} cells"
                     f"{' · FlashInfer vs aten:' if tag else ''}"
                     f"{' ' + esc(tag) if tag else ''}</summary>"
                     f"{table(g, CELL_COLS, cls='cells', fmt=fmt, left=('path', 'status', 'verdict', 'reason', 'timer'))}"
                     "</details>")
    return "".join(parts)


def determinism_section(run: Run) -> str:
    """Per path: of its measured cells, how many were repeatable (bitwise the same output on repeated calls) and
    batch-invariant (row 0 alone at M = 1 bitwise row 0 of the M rows): what a deterministic serving mode chooses
    on (dispatch.deterministic)."""
    per = by_path(run.df)
    if per.empty:
        return ("<p>Not measured by this run: bench run records each cell's repeatability and batch invariance "
                "since its results carry those columns.</p>")
    per["repeatable"] = [f"{r}/{c}" for r, c in zip(per["repeatable"], per["cells"])]
    per["batch_invariant"] = [f"{b}/{c}" for b, c in zip(per["batch_invariant"], per["cells"])]
    return table(per, [("path", "path"), ("cells", "cells measured"), ("repeatable", "repeatable"),
                       ("batch_invariant", "batch-invariant")], left=("path",))


def problems_section(rows: pd.DataFrame) -> str:
    bad = rows[rows["status"] != "ok"]
    if bad.empty:
        return "<p>None: every cell was measured.</p>"
    grouped = (bad.groupby(["status", "path", "reason"]).agg(cells=("m", "size"),
               where=("shape", lambda s: f"{s.nunique()} shape(s): " + ", ".join(sorted(set(s))))).reset_index())
    return table(grouped, [("status", "status"), ("path", "path"), ("cells", "cells"), ("reason", "reason"),
                           ("where", "shapes")], cls="wrap", left=("status", "path", "reason", "where"))


def _run_against_run(primary: Run, other: Run, rows: pd.DataFrame) -> str:
    """Run B (other) against run A (primary) as `calibrate compare` judges it (calibrate/compare.py): per path the
    cells per verdict class, the cells not SAME, the environment's differences first; and the FlashInfer/aten
    ratio of both runs side by side (what a table's decision at a cell rests on)."""
    noise = primary.noise
    c = compare(primary.df, other.df, primary.info, other.info, noise, DEFAULT_MARGIN)
    counts = counts_per_path(c.rows).reset_index()
    env = ("<p class='verdict no'>The environments differ (" + esc("; ".join(c.env_differences)) + "): a verdict "
           "may be the environment's, not the code's.</p>") if c.env_differences else ""
    odd = not_same(c.rows)
    out = (f"<h3>{esc(primary.label)} vs {esc(other.label)}</h3>{env}"
           f"<p>B = {esc(other.path)} against A = {esc(primary.path)}, GPU time B / A per cell with its interval "
           f"(replays resampled" + (", widened by the noise floor" if noise is not None else "") + f"), margin "
           f"{DEFAULT_MARGIN:.0%} (docs/compare.md; <code>python -m calibrate compare</code> prints the same): "
           + verdict_totals(c.rows["verdict"]) + f" of {len(c.rows)} cells"
           + (f"; measured in one run only: {c.only_a} in A, {c.only_b} in B" if c.only_a or c.only_b else "")
           + ".</p>" + table(counts, [("path", "path")] + [(v, v) for v in VERDICTS], left=("path",)))
    if not odd.empty:
        out += ("<details><summary>Cells not SAME (SLOWER first)</summary>"
                + table(odd.head(60), [("shape", "shape"), ("m", "M"), ("path", "path"), ("a_us", "A µs"),
                                       ("b_us", "B µs"), ("ratio", "B / A"), ("lo", "lo"), ("hi", "hi"),
                                       ("verdict", "verdict"), ("same_kernels", "same kernels")],
                        fmt={"a_us": "{:.2f}", "b_us": "{:.2f}", "ratio": "{:.3f}", "lo": "{:.3f}", "hi": "{:.3f}"},
                        left=("shape", "path", "verdict")) + "</details>")
    try:
        drift = compare_runs(primary, other, rows)
    except HarnessError:
        return out
    return out + figures.img('run vs run', lambda: figures.compare_figure(drift, 'A', 'B'))


def comparison_section(primary: Run, rows: pd.DataFrame, others: list[Run], baseline: str | None) -> str:
    parts = []
    for other in others:
        parts.append(_run_against_run(primary, other, rows))
    if baseline:
        b = load_baseline(Path(baseline))
        fi = sorted({c.path for c in b.cells})
        checks = compare_with_baseline(b, cells_from_results(primary.df, fi))
        rows = pd.DataFrame([{"shape": c.cell.shape, "m": c.cell.m, "path": c.cell.path,
                              "stored": c.cell.gpu_ratio, "stored_lo": c.cell.gpu_ratio_lo,
                              "stored_hi": c.cell.gpu_ratio_hi,
                              "fresh": c.fresh.gpu_ratio if c.fresh else float("nan"),
                              "drift": (c.fresh.gpu_ratio / c.cell.gpu_ratio - 1) if c.fresh else float("nan"),
                              "status_check": c.verdict,
                              "result": c.status, "kernel_changed": c.kernel_changed, "note": c.message}
                             for c in checks])
        nbad = int((rows["result"] != "ok").sum())
        served = primary.info.get("autotune_cache")
        served_sha = served.get("sha256") if isinstance(served, dict) else None
        if not b.autotune_cache:
            tactics = "The baseline's runs tuned FlashInfer apiece, so drift includes the autotuner's per-process picks."
        elif served_sha == b.autotune_cache["sha256"]:
            tactics = f"This run served the baseline's pinned FlashInfer tactics ({esc(b.autotune_cache['file'])})."
        else:
            tactics = (f"The baseline pins FlashInfer tactics ({esc(b.autotune_cache['file'])}) and this run did not "
                       "serve them: drift includes the autotuner's own picks, not only a change of speed.")
        parts.append(
            f"<h3>Against the stored baseline {esc(baseline)}</h3>"
            f"<p>{len(rows)} baseline cells from {len(b.sources)} run(s); {nbad} outside the stored interval "
            f"±{b.tolerance:.0%} (or host ratio beyond ×{1 + b.host_tolerance:.0f}); new kernels in "
            f"{int(rows['kernel_changed'].sum())}. Median |drift| {rows['drift'].abs().median():.2%}. {tactics}</p>"
            "<details><summary>Every baseline cell, worst first</summary>"
            + table(rows.sort_values("drift", key=lambda s: -s.abs()),
                    [("shape", "shape"), ("m", "M"), ("path", "path"), ("stored", "stored"), ("stored_lo", "lo"),
                     ("stored_hi", "hi"), ("fresh", "this run"), ("drift", "drift"), ("result", "result"),
                     ("kernel_changed", "new kernels"), ("note", "note")],
                    fmt={"stored": "{:.3f}", "stored_lo": "{:.3f}", "stored_hi": "{:.3f}", "fresh": "{:.3f}",
                         "drift": "{:+.1%}"}, left=("shape", "path", "result", "note")) + "</details>")
    return "".join(parts)


def anatomy_section(path: str) -> str:
    df, info = load_anatomy(path)
    ok = df[df["status"] == "ok"]
    seg = ok[(ok["kind"] == "segment") & ok["path"].map(is_flashinfer)]
    aten = ok[(ok["kind"] == "layer") & (ok["layer"] == "F.linear")].groupby("m", as_index=False)["host_us"].median()
    totals = ok[(ok["kind"] == "layer") & (ok["layer"] == "inductor_wrapper")]
    lines = []
    for r in totals.itertuples():
        fl = aten[aten["m"] == r.m]["host_us"]
        top = seg[(seg["path"] == r.path) & (seg["m"] == r.m)].sort_values("host_us", ascending=False).head(2)
        segs = seg[(seg["path"] == r.path) & (seg["m"] == r.m)].set_index("layer")["host_us"]
        flag = (" <b>Noisy:</b> its layer medians disagree (negative segments above 10% of the call), so this "
                "breakdown is not reliable." if figures.noisy(segs) else "")
        lines.append(f"<li>{esc(r.path)} at M={int(r.m)} (N={int(r.n)}, K={int(r.k)}): {r.host_us:.0f} µs per call "
                     f"through the opaque op, against {fl.iloc[0]:.0f} µs for F.linear ({r.host_us / fl.iloc[0]:.1f}x); "
                     f"largest layers: " + ", ".join(f"{esc(t.layer)} {t.host_us:.0f} µs" for t in top.itertuples())
                     + f".{flag}</li>")
    first = ok[ok["kind"] == "first_call"]
    cols = [("path", "path"), ("m", "M"), ("layer", "layer"), ("host_us", "µs"), ("host_us_p20", "p20"),
            ("host_us_p80", "p80"), ("cache_state", "autotuner"), ("gpu_busy", "GPU kept busy")]
    fmt = {c: "{:.1f}" for c in ("host_us", "host_us_p20", "host_us_p80")}
    return (f"<p class='muted'>{esc(info.get('command', ''))} · {esc(info.get('started', ''))} · "
            f"{esc((info.get('fingerprint') or {}).get('gpu_name', ''))}</p><ul>{''.join(lines)}</ul>"
            + figures.img('host anatomy', lambda: figures.anatomy_figure(seg, aten)) +
            "<p class='muted'>Each segment is the median time of one entry point minus the medians of the entry points "
            "it calls, so the segments add up to the measured whole call (black line); p20/p80 are those of the per-round "
            "paired differences. A negative segment is below the noise and draws as nothing, so a stack above its "
            "black line shows how noisy that breakdown is.</p>"
            "<details><summary>Segments</summary>" + table(seg, cols, fmt=fmt, left=("path", "layer", "cache_state"))
            + "</details><details><summary>Every timed layer</summary>"
            + table(ok[ok["kind"] == "layer"], cols, fmt=fmt, left=("path", "layer", "cache_state"))
            + "</details><details><summary>First-call costs</summary>"
            + table(first, cols, fmt=fmt, left=("path", "layer")) + "</details>")


def forward_section(run: Run, path: str, loaded: tuple[pd.DataFrame, dict]) -> str:
    """One measured-forward folder's section; `loaded`: its (forward.csv, run.json) as load_forward read them."""
    fdf, info = loaded
    ratios = forward_ratios(fdf)
    measured = [c for c in ratios.columns if c not in ("model", "m", "regime", ATEN)]
    paths = [c for c in RULES if c in measured] + [c for c in measured if c not in RULES]
    parts = _forward_intro(fdf, info, ratios)
    cols = [("model", "model"), ("m", "M"), ("regime", "regime")] + [(p, f"{p} / aten") for p in paths]
    parts.append("<h3>Per-forward time over aten's (measured)</h3>"
                 + table(ratios.sort_values(["model", "regime", "m"]), cols, fmt={p: "{:.3f}" for p in paths},
                         left=("model", "regime")))
    if run.profile is not None:
        parts += _forward_verdicts_part(run, fdf) + _model_vs_measured_part(run, fdf, info)
    return "".join(parts)


def _forward_intro(fdf: pd.DataFrame, info: dict, ratios: pd.DataFrame) -> list[str]:
    """The run's provenance line, what the regimes and rule names mean, and the figure."""
    return [f"<p class='muted'>{esc(info.get('command', ''))} · {esc(info.get('started', ''))} · "
            f"{esc((info.get('fingerprint') or {}).get('gpu_name', ''))} · decoder layers: "
            f"{esc(info.get('decoder_layers') or 'all')} · lm_head: {esc(info.get('lm_head'))}"
            + (f" · dispatch ran the {esc(info['dispatch_layer'])} bound layer" if info.get("dispatch_layer") else "")
            + (f" · LM head: {esc(info['lm_head_rule'])}" if info.get("lm_head_rule") else
               " · registry paths also ran the LM head (runs before lm_head_rule)")
            + (f" · every timed forward after {esc(info['settle_ms'])} ms of untimed runs of itself"
               if info.get("settle_ms") else
               " · eager forwards timed right after an untimed run of themselves" if info.get("eager_settle") else "")
            + (f", shuffle seed {esc(info.get('eager_order_seed'))}" if info.get("eager_settle") else "") + "</p>",
            *([f"<p class='verdict no'>The eager rows of this run are void and left out: {esc(EAGER_VOID)}.</p>"]
              if eager_void(info) else []),
            "<p>Every BF16 linear of one forward, in layer order with one weight per instance, timed as a whole: "
            "<b>graph</b> = the forward captured as one CUDA graph, CUPTI first-kernel-start to last-kernel-end; "
            "<b>eager</b> = the forward launched op by op from an idle GPU to one synchronize (host and GPU overlap "
            "as in a real eager step" + ("; timed with the profiler paused, busy time from one profiled forward "
                                         "after them" if info.get("eager_profiler") else
                                         "; timed with CUPTI recording, whose per-launch cost is in the host time")
            + "). 'vllm-default', 'vllm-flag' and 'seed-pr' are what vLLM " + esc(VLLM_VERSION)
            + " runs by default, with its FlashInfer flag, and under the seed PR's rule on this GPU (on SM90 all "
            "three are F.linear everywhere: docs/vllm.md); runs older than these names measured 'vllm-flashinfer' "
            "(FlashInfer everywhere, a hypothetical on SM90) and 'seed-fix' (TinyGEMM at M <= 32, F.linear above); "
            "lm_head is F.linear in every rule, as in vLLM." + (
                " 'table-direct' (dotted) runs the dispatcher's table choices called directly, without the bound "
                "layer: the distance from it to 'dispatch' is what the dispatcher's per-call work costs."
                if TABLE_DIRECT in ratios.columns else "") + (
                " 'dispatch-python' is the dispatcher with its Python bound layer, beside 'dispatch' (the layer named "
                "above)."
                if DISPATCH_PYTHON in ratios.columns else "") + "</p>",
            figures.img('measured forwards', lambda: figures.forward_figure(fdf))]


def _forward_verdicts_part(run: Run, fdf: pd.DataFrame) -> list[str]:
    """The measured verdict of the dispatcher's forward against the best path, both regimes."""
    parts: list[str] = []
    floor = run.forward_floor
    fv = forward_verdicts(fdf, run.profile.capture_size, floor)
    if not fv.empty:
        bad, noisy = fv[~fv["ok"]], fv[fv["verdict"] == "within noise"]
        parts.append("<p><b>Measured verdict, both regimes:</b> the dispatcher's forward is within 1% of the "
                     "best measured path (or its paired interval"
                     + (f", widened by the run-to-run noise of measured forwards ({esc(floor.describe())}),"
                        if floor else "") + f" reaches there) at {int(fv['ok'].sum())} of "
                     f"{len(fv)} (model, M, regime) points"
                     + (": over it at " + ", ".join(f"{r.model} M={r.m} {r.regime} ({r.dispatch_over_best:.3f}x "
                                                    f"{r.best})" for r in bad.itertuples()) if len(bad) else "")
                     + (". Above 1% by the point ratio but within the noise: " + ", ".join(
                         f"{r.model} M={r.m} {r.regime} ({r.dispatch_over_best:.3f}x {r.best})"
                         for r in noisy.itertuples()) if len(noisy) else "")
                     + ".</p>"
                     + table(fv, [("model", "model"), ("m", "M"), ("regime", "regime"),
                                  ("vllm_regime", "vLLM runs M here"), ("best", "best path"),
                                  ("dispatch_over_best", "dispatch / best"), ("ratio_lo", "lo"),
                                  ("ratio_hi", "hi"), ("dispatch_over_aten", "dispatch / aten"), ("verdict", "verdict")]
                             + ([("choices_over_best", "table's choices / best"),
                                 ("binding_cost", "dispatch / table-direct"), ("binding_lo", "lo"),
                                 ("binding_hi", "hi"), ("same_kernels", "same kernels (ratio pooled)")]
                                if fv["binding_cost"].notna().any() else []),
                             fmt={c: "{:.3f}" for c in ("dispatch_over_best", "ratio_lo", "ratio_hi",
                                                        "dispatch_over_aten", "choices_over_best", "binding_cost",
                                                        "binding_lo", "binding_hi")},
                             left=("model", "regime", "best")))
    return parts


def _model_vs_measured_part(run: Run, fdf: pd.DataFrame, info: dict) -> list[str]:
    """How far the cell-sum model misses the measured forwards."""
    parts: list[str] = []
    mv = model_vs_measured(run.cells, fdf, info, run.profile, run.table)
    if not mv.empty:
        miss = mv[mv["miss"]]
        worst = mv.iloc[(mv["measured_over_model"] - 1).abs().argsort()[::-1]]
        parts.append(f"<h3>Model against measurement</h3><p>The cell-sum model (GPU time per call summed in the "
                     f"graph regime, max(host, GPU) per call summed in the eager regime, from {esc(run.path)}) "
                     f"misses the measured forward by more than {MODEL_MISS:.0%} in <b>{len(miss)} of {len(mv)}</b> "
                     f"rows; the largest miss is {(mv['measured_over_model'] - 1).abs().max():.1%}. Per-forward "
                     f"verdicts use the measured forwards wherever they exist.</p>"
                     "<details><summary>Every row, largest miss first</summary>"
                     + table(worst, [("model", "model"), ("m", "M"), ("path", "path"), ("regime", "regime"),
                                     ("measured_us", "measured µs"), ("modelled_us", "model µs"),
                                     ("measured_over_model", "measured / model"), ("miss", "miss > 5%")],
                             fmt={"measured_us": "{:.0f}", "modelled_us": "{:.0f}", "measured_over_model": "{:.3f}"},
                             left=("model", "path", "regime")) + "</details>")
    return parts


def vllm_section(run: Run, frames: list[pd.DataFrame]) -> str | None:
    """The answer in vLLM's terms (calibrate/vllm_terms.py) from the forwards (their forward.csv tables) that
    measured vLLM's rules; None when none did (older runs)."""
    fdf = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if run.profile is None or fdf.empty or not set(required_paths(run.profile)) <= set(fdf[fdf["status"] == "ok"]["path"]):
        return None
    floor = run.forward_floor
    terms = vllm_terms(fdf, run.profile, floor)
    r = terms.rows
    summary = []
    for (model, regime), g in r.groupby(["model", "regime"], sort=False):
        mine = g[g["vllm_regime"]]
        summary.append({"model": model, "regime": regime, "ms": ", ".join(map(str, mine["m"])) or "none",
                        "T": terms.thresholds[regime],
                        **{c: geomean(mine[c]) if len(mine) else float("nan") for c in COMPARED}})
    cols = [("model", "model"), ("regime", "regime"), ("ms", "M (vLLM runs this regime)"), ("T", "best T")] + \
        [(c, f"{LABELS[c]} / default") for c in COMPARED]
    per_m = [("model", "model"), ("regime", "regime"), ("m", "M"), ("default_us", "vLLM default µs")] + \
        [(c, f"{LABELS[c]} / default") for c in COMPARED] + [("table_over_threshold", "table / best threshold")]
    cells = r.copy()
    for c in [*COMPARED, "table_over_threshold"]:
        lo, hi = (c + "_lo", c + "_hi") if c != "table_over_threshold" else ("tot_lo", "tot_hi")
        cells[c] = [f"{v:.3f}" if a != a else f"{v:.3f} [{a:.3f}, {b:.3f}]" for v, a, b in zip(r[c], r[lo], r[hi])]
    return (f"<p>What vLLM {esc(VLLM_VERSION)} runs on this GPU and what it could run, from measured forwards "
            f"(per-forward linear time over vLLM's default, F.linear on every linear). On "
            f"{esc(run.profile.name)} (SM{run.profile.sm}) vLLM's FlashInfer flag "
            + ("is unsupported, so the flag and the seed PR's rule run F.linear too (docs/vllm.md). "
               if not flag_supported(run.profile.sm) else
               "runs FlashInfer's cute-dsl backend through its custom op at every M. ")
            + f"The best single threshold runs the low-M backend through vLLM's op ({esc(terms.low_path)}) at "
            f"M &lt;= T and F.linear above; T is chosen per regime from the measured M. Geometric means over the M "
            f"at which vLLM runs each regime (capture size {run.profile.capture_size}):</p>"
            + table(pd.DataFrame(summary), cols, fmt={c: "{:.3f}" for c in COMPARED}, left=("model", "regime", "ms"))
            + "<details><summary>Every M, with 95% intervals"
            + (f" widened by the forward noise floor ({esc(floor.describe())})" if floor else "")
            + "</summary>" + table(cells, per_m, fmt={"default_us": "{:.0f}"}, left=("model", "regime"))
            + "</details>")


def check_inputs(results: list[str], forward: list[str], anatomy: str | None, baseline: str | None,
                 allow_mismatch: bool) -> None:
    """What validate refuses, the report refuses too: a folder given twice, and data of another GPU than the first
    run's (unless allow_mismatch)."""
    distinct(list(results), "reports build")
    distinct(list(forward), "reports build --forward")

    def has_info(p: str) -> bool:  # without run.json the folder's own loader names what is wrong with it
        return ((Path(p) if Path(p).is_dir() else Path(p).parent) / "run.json").is_file()
    if not has_info(results[0]):
        return
    primary = load_run_info(results[0])
    others = [o for o in [*results[1:], *forward, *([anatomy] if anatomy else [])] if has_info(o)]
    same_gpu([(results[0], primary), *((o, load_run_info(o)) for o in others)], allow_mismatch)
    if baseline:
        b = load_baseline(Path(baseline))
        if b.profile != primary.get("profile") and not allow_mismatch:
            raise HarnessError(f"--baseline {baseline} is the {b.profile} baseline, {results[0]} a "
                               f"{primary.get('profile')} run; pass that GPU's baseline, or --allow-mismatch")


def build(results: list[str], out: Path, baseline: str | None = None, anatomy: str | None = None,
          thresholds: str | None = None, partial: bool = False, forward: str | list[str] | None = None,
          allow_mismatch: bool = False, draw_figures: bool = True, noise: str | None = None,
          forward_floor: str | None = None) -> Path:
    """The report of results[0] (the others compared with it); `forward`: measured-forward folders, e.g. one per model
    of one run, each its own section; `draw_figures` False: text and tables only (a quick look); `noise`,
    `forward_floor`: the floor files that judge results[0] in place of the profile's shipped ones."""
    check_inputs(results, [forward] if isinstance(forward, str) else list(forward or []), anatomy, baseline,
                 allow_mismatch)
    folders = [forward] if isinstance(forward, str) else list(forward or [])
    with progress(len(results) + 1, "report: loading") as bar:
        runs = []
        for r in results:
            runs.append(load_run(r, thresholds, partial, noise, forward_floor))
            bar.update()
        primary = runs[0]
        if noise or forward_floor:  # a floor file named on the command line: a bad one stops the build here
            _ = (primary.noise, primary.forward_floor)
        loaded = {f: load_forward(f, partial) for f in folders}  # read once: the verdict, its section, vLLM terms
        ratios = ratio_rows(primary)
        # the figures draw on forked workers while the verdicts are computed here
        crossovers = shape_crossovers(primary)
        strips, shape_args = range_strips(primary), shape_jobs(primary, ratios, crossovers)
        jobs = [*([(figures.ranges_figure, (strips,))] if strips else []),
                *((figures.shape_figure, a) for a in shape_args)]
        with figures.Drawing(jobs if draw_figures else []) as drawing:
            head = headline(primary, list(loaded.values()))
            rows = with_dispatch_verdicts(primary, ratios, head.verdicts)
            images = drawing.images() if draw_figures else [""] * len(jobs)
        bar.update()
    ranges_img, shape_imgs = ((lambda: images[0]) if strips else None), images[1 if strips else 0:]
    gpus = " vs ".join(dict.fromkeys(r.gpu for r in runs))
    todo = [("summary", "Verdict", lambda: summary_section(primary, head)),
            ("table", "Dispatch table", lambda: table_section(primary, ranges_img)),
            ("shapes", "Per shape", lambda: shapes_section(primary, rows, shape_imgs, crossovers)),
            ("totals", "Per-forward totals (cell-sum model)", lambda: totals_section(head)),
            ("cells", "Every cell", lambda: cells_section(rows)),
            ("determinism", "Determinism per path", lambda: determinism_section(primary)),
            ("problems", "Failed and skipped cells", lambda: problems_section(rows))]
    if len(runs) > 1 or baseline:
        todo.append(("comparison", "Comparison", lambda: comparison_section(primary, rows, runs[1:], baseline)))
    several = len(folders) > 1
    todo[1:1] = [(f"forward-{i}" if several else "forward",  # the measured answer, right after the verdict
                  "Measured forward" + (f" ({Path(f).name})" if several else ""),
                  lambda f=f: forward_section(primary, f, loaded[f])) for i, f in enumerate(folders, 1)]
    if anatomy:
        todo.append(("anatomy", "Host-time anatomy", lambda: anatomy_section(anatomy)))
    answer = vllm_section(primary, [fdf for fdf, _ in loaded.values()])
    if answer is not None:
        todo.insert(0, ("vllm", "In vLLM's terms", lambda: answer))
    sections = []
    with progress(len(todo), "report: sections") as bar, figures.drawing(draw_figures):
        for key, title, make in todo:
            bar.set_postfix_str(title)
            sections.append((key, title, make()))
            bar.update()
    html = page(f"BF16 linear paths on {gpus}", f"{primary.info.get('command', '')} · run started "
                f"{primary.info.get('started', '?')}", sections)
    with signals_deferred():  # Ctrl-C here: the file is written whole, then the interrupt ends the command
        atomic_write_text(out, html)  # built in memory first: a failure above leaves no partial file
    return out


def progress(total: int, desc: str):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, file=terminal(), leave=False, dynamic_ncols=True, disable=None)  # off when not a TTY
