"""Figures as embedded PNG data URIs (matplotlib, Agg), so that the report is one file that works offline."""
from __future__ import annotations

import base64
import html
import io
import math
from contextlib import contextmanager
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator  # noqa: E402

from bench.forward_paths import FLASHINFER_EVERYWHERE, SEED_PR, TABLE_DIRECT, VLLM_DEFAULT, VLLM_FLAG  # noqa: E402
from bench.paths import TUNED_CUBLASLT  # noqa: E402
from dispatch.backends import ATEN, DISPATCH, flashinfer_path, is_kernel_path, lean_path  # noqa: E402
from harness.errors import signals_deferred, worker_signals  # noqa: E402
from shapes.grid import M_MAX

PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # 0.6, 2, 300 instead of 6x10^-1 on log axes

COLORS = {ATEN: "#333333", flashinfer_path("tinygemm"): "#d95f02", TUNED_CUBLASLT: "#1b9e77",
          lean_path("tinygemm"): "#fdae6b", lean_path("cublaslt"): "#66c2a4", lean_path("cute-dsl"): "#f1b6da",
          flashinfer_path("cudnn"): "#7570b3", flashinfer_path("cute-dsl"): "#e7298a", DISPATCH: "#66a61e"}


def _color(path: str) -> str:
    return COLORS.get(path, "#a6761d")


def to_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


_DRAW = [True]  # reports build --figures none turns drawing off for one build


@contextmanager
def drawing(enabled: bool):
    """Figures drawn (True) or left out with a line that says so (False) while inside."""
    before, _DRAW[0] = _DRAW[0], enabled
    try:
        yield
    finally:
        _DRAW[0] = before


def drawn() -> bool:
    return _DRAW[0]


def img(alt: str, make: Callable[[], str]) -> str:
    """An <img> of the figure `make` draws, or, with figures left out, a line in its place."""
    if not _DRAW[0]:
        return f"<p class='muted'>Figure left out ({html.escape(alt)}): built with --figures none.</p>"
    return f"<img alt='{html.escape(alt)}' src='{make()}'>"


def _draw_one(draw, args: tuple) -> str:
    return draw(*args)


class Drawing:
    """draw(*args) for every (draw, args), started on forked workers (Agg figures render independently; a forked
    worker inherits the imports) while the caller computes; `images()` waits for them, in order. With one core or no
    fork they are drawn in this process when asked for. Used as a context manager, it stops the workers however the
    block ends."""

    def __init__(self, jobs: list[tuple[Callable[..., str], tuple]]):
        import multiprocessing
        import os
        self.jobs, self.pool, self.pending = jobs, None, None
        workers = min(len(jobs), os.cpu_count() or 1)
        if workers >= 2 and "fork" in multiprocessing.get_all_start_methods():
            try:
                with signals_deferred():  # a signal inside fork's own hooks would print past the one line
                    self.pool = multiprocessing.get_context("fork").Pool(workers, initializer=worker_signals)
                self.pending = self.pool.starmap_async(_draw_one, jobs)
            except OSError:
                self.pool = None

    def images(self) -> list[str]:
        if self.pending is None:  # one core, or no fork: drawn here
            return [draw(*args) for draw, args in self.jobs]
        return self.pending.get()

    def __enter__(self) -> "Drawing":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is None:
            return
        # terminate() ends the workers by SIGTERM, which ends a worker at once (worker_signals). Never kill a worker
        # before it: one killed while it held the task queue's lock leaves terminate() waiting on that lock forever.
        # A Ctrl-C waits for the teardown (a fraction of a second): raised inside it, it would leave it half done.
        with signals_deferred():
            self.pool.terminate()
            self.pool.join()


def ranges_figure(strips: list[tuple[str, tuple]]) -> str:
    """The table as strips: one row per (shape, regime), each range a coloured span over M (log), F.linear above the
    last one."""
    fig, ax = plt.subplots(figsize=(15, 0.5 + 0.22 * len(strips)))
    seen: dict[str, object] = {}
    for row, (_, ranges) in enumerate(strips):
        lo = 1
        for up, path in [*ranges, (M_MAX, ATEN)]:
            if up >= lo:
                bar = ax.barh(row, up + 1 - lo, left=lo, height=0.8, color=_color(path), edgecolor="white", lw=0.5)
                seen.setdefault(path, bar)
            lo = up + 1
    ax.set(xscale="log", xlim=(1, M_MAX + 1), ylim=(len(strips) - 0.5, -0.5), xlabel="M (tokens)")
    ax.set_yticks(range(len(strips)), [label for label, _ in strips], fontsize=7)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 1.0 + 0.9 / len(strips)),
              ncol=len(seen), frameon=False)
    fig.subplots_adjust(left=0.12, right=0.99, bottom=0.3 / (0.5 + 0.22 * len(strips)) + 0.02, top=0.95)
    return to_uri(fig)


def _floor_lines(ax, ok: pd.DataFrame) -> None:
    """The limit under a shape's times, where the run measured its ceilings (bench/ceiling.py): the bandwidth floor
    (the cell's bytes over the large-buffer ceiling) and the size-matched read of its weight."""
    if "of_large_ceiling" not in ok.columns or not ok["of_large_ceiling"].notna().any():
        return
    # bytes over the ceiling: the same for every path of one M (of_large_ceiling = bytes / time / ceiling)
    large = ok["bytes"] / (ok["gbps"] / ok["of_large_ceiling"]) / 1e3
    read = ok["bytes"] / ok["gbps"] / 1e3 * ok.get("of_ceiling", float("nan"))
    per_m = ok.assign(floor=large, read=read).groupby("m")[["floor", "read"]].median()
    ax.plot(per_m.index, per_m["floor"], color="black", lw=1.2, ls="--", label="bandwidth floor (large-buffer read)")
    if per_m["read"].notna().any():
        ax.plot(per_m.index, per_m["read"], color="black", lw=0.8, ls=":", label="read of the weight alone")


def shape_figure(rows: pd.DataFrame, title: str, threshold: int | None, crossover: float,
                 capture_size: int | None) -> str:
    """Three panels for one shape: GPU time per call, FlashInfer/aten GPU-time ratio, host vs GPU time."""
    ok = rows[rows["status"] == "ok"]
    grid = sorted(set(rows["m"]))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    for path, g in ok.groupby("path"):
        # on the shape's whole M grid: an M the path was not measured at is a gap in its line, not a line across it
        g = g.drop_duplicates("m").set_index("m").reindex(grid).rename_axis("m").reset_index()
        ax1.plot(g["m"], g["gpu_us"], marker=".", color=_color(path), label=path)
        ax1.fill_between(g["m"], g["gpu_us_p20"], g["gpu_us_p80"], color=_color(path), alpha=0.15)
        ax3.plot(g["m"], g["host_us"], marker=".", color=_color(path), label=f"{path} host")
        ax3.plot(g["m"], g["gpu_us"], ls=":", color=_color(path))
        if is_kernel_path(path) and g["ratio"].notna().any():
            ax2.plot(g["m"], g["ratio"], marker=".", color=_color(path), label=path)
            ax2.fill_between(g["m"], g["ratio_lo"], g["ratio_hi"], color=_color(path), alpha=0.25)
    _floor_lines(ax1, ok)
    ax1.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="GPU µs per call (CUPTI, in graph)")
    _title(ax1, f"{title}: GPU time per call")
    _legend_below(ax1)
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="FlashInfer / aten GPU time")
    _title(ax2, "FlashInfer / aten (below 1: FlashInfer faster)")
    if threshold is not None:
        ax2.axvline(max(threshold, 0.8), color="#66a61e", ls="--", lw=1.2,
                    label=f"dispatcher (graph): FlashInfer up to M = {threshold}" if threshold
                    else "dispatcher (graph): never FlashInfer")
    if not math.isnan(crossover):
        ax2.axvline(crossover, color="#e6ab02", ls=":", lw=1.5, label=f"measured crossover M* = {crossover:.0f}")
    if ax2.has_data():
        _legend_below(ax2)
    ax3.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="µs per call")
    _title(ax3, "host (solid) vs GPU (dotted) per call")
    if capture_size:
        ax3.axvspan(capture_size, max(ok["m"].max(), capture_size) * 1.1, color="#cccccc", alpha=0.3,
                    label=f"eager above capture size {capture_size}")
    _legend_below(ax3)
    for ax in (ax1, ax2, ax3):
        ax.grid(True, which="major", alpha=0.25)
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_locator(NullLocator())  # minor log ticks cost most of a figure's drawing time
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(PLAIN)  # 1, 10, 100: no mathtext to lay out
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.38, top=0.92, wspace=0.28)
    return to_uri(fig)


def _title(ax, text: str) -> None:
    """A title at a fixed height: matplotlib otherwise measures the tick labels to place it, at every draw."""
    ax.set_title(text, y=1.0, pad=6)


def _legend_below(ax) -> None:
    """The legend under the panel, where it covers no data."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)


def totals_figure(totals: pd.DataFrame) -> str:
    """Per model: count-weighted per-forward GPU+host cost of aten, FlashInfer alone and the dispatcher vs M."""
    models = sorted(totals["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        t = totals[(totals["model"] == model) & totals["actual"]].sort_values("m")
        for col, color, label in (("aten_us", COLORS[ATEN], "aten (F.linear)"),
                                  ("flashinfer_us", COLORS[TUNED_CUBLASLT], "FlashInfer for every linear"),
                                  ("dispatch_us", COLORS[DISPATCH], "dispatcher")):
            ax.plot(t["m"], t[col] / 1e3, marker=".", color=color, label=label)
        ax.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="ms per forward (linears only)",
               title=f"{model}: graph regime up to the capture size, eager above")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
    return to_uri(fig)


def anatomy_figure(seg: pd.DataFrame, aten: pd.DataFrame) -> str:
    """One stacked bar per (FlashInfer path, M): its host-time segments; beside them F.linear's total."""
    bars = sorted({(p, int(m)) for p, m in zip(seg["path"], seg["m"])})
    names = list(dict.fromkeys(seg["layer"]))
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(bars) + 4), 4.8))
    labels = []
    for i, (path, m) in enumerate(bars):
        s = seg[(seg["path"] == path) & (seg["m"] == m)].set_index("layer")["host_us"]
        bottom = 0.0
        for j, name in enumerate(names):
            v = max(float(s.get(name, 0.0)), 0.0)  # a segment below the noise (negative) draws as nothing
            ax.bar(i, v, bottom=bottom, color=cmap(j % 20), label=name if i == 0 else None, width=0.7)
            bottom += v
        total = float(s.sum())  # the segments add up to the measured whole call
        ax.plot([i - 0.4, i + 0.4], [total, total], color="black", lw=2,
                label="measured whole call" if i == 0 else None)
        if noisy(s):
            ax.annotate("noisy", (i, bottom), ha="center", va="bottom", fontsize=8, color="#b2182b")
        labels.append(f"{path.split(':')[1]}\nM={m}")
    for i, (m, v) in enumerate(sorted(zip(aten["m"], aten["host_us"]))):
        ax.bar(len(bars) + i, v, color="#333333", width=0.7, label="F.linear (whole call)" if i == 0 else None)
        labels.append(f"F.linear\nM={int(m)}")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set(ylabel="host µs per call", title="Host time of one call, layer by layer (eager, no GPU back-pressure)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.25)
    return to_uri(fig)


def noisy(segments: pd.Series, share: float = 0.1) -> bool:
    """Layer medians that disagree: negative segments worth more than `share` of the whole call."""
    return float(-segments[segments < 0].sum()) > share * float(segments.sum())


def compare_figure(comp: pd.DataFrame, label_a: str, label_b: str) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for path, g in comp.groupby("path"):
        ax.scatter(g["ratio_a"], g["ratio_b"], s=10, color=_color(path), label=path)
    lo = min(comp["ratio_a"].min(), comp["ratio_b"].min()) * 0.9
    hi = max(comp["ratio_a"].max(), comp["ratio_b"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel=f"ratio, {label_a}", ylabel=f"ratio, {label_b}",
           title="FlashInfer/aten GPU-time ratio, run against run")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    return to_uri(fig)


FORWARD_COLORS = {ATEN: "#333333", VLLM_DEFAULT: "#333333", VLLM_FLAG: "#1b9e77", SEED_PR: "#d95f02",
                  FLASHINFER_EVERYWHERE: "#7570b3", DISPATCH: "#66a61e", TABLE_DIRECT: "#66a61e"}
FORWARD_STYLES = {SEED_PR: "--", TABLE_DIRECT: ":", VLLM_DEFAULT: ":"}
FORWARD_YMAX = 1.6  # the dispatcher's range of interest; slower paths sit at the top edge with their ratio


def forward_figure(forward: pd.DataFrame) -> str:
    """Per model (rows) and regime (columns): each path's measured per-forward time over aten's against M, with the
    p20-p80 band; aten's own time per forward is printed along the top."""
    ok = forward[forward["status"] == "ok"]
    models = sorted(ok["model"].unique())
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 3.8 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        for ax, regime in zip(row, ("graph", "eager")):
            g = ok[(ok["model"] == model) & (ok["regime"] == regime)]
            aten = g[g["path"] == ATEN].set_index("m")["us"]
            low = 1.0
            for path, p in g.groupby("path"):
                p = p.sort_values("m").set_index("m")
                base = aten.reindex(p.index)
                color = FORWARD_COLORS.get(path, _color(path))
                style = FORWARD_STYLES.get(path, "-")
                ratio = p["us"] / base
                low = min(low, float(ratio.min()))
                ax.plot(p.index, ratio.clip(upper=FORWARD_YMAX), style, marker="o", ms=3, color=color, label=path)
                for m, r in ratio[ratio > FORWARD_YMAX].items():  # off the scale: its value at the top edge
                    ax.annotate(f"{r:.3g}x", (m, FORWARD_YMAX), textcoords="offset points", xytext=(0, 3),
                                ha="center", fontsize=6, color=color)
                if "us_p20" in p and path != ATEN:
                    ax.fill_between(p.index, (p["us_p20"] / base).clip(upper=FORWARD_YMAX),
                                    (p["us_p80"] / base).clip(upper=FORWARD_YMAX), color=color, alpha=0.12)
            ax.set_xscale("log", base=2)
            ax.set_ylim(min(0.9, low - 0.05), FORWARD_YMAX + 0.08)
            ax.xaxis.set_major_formatter(PLAIN)
            for m, us in aten.items():
                ax.annotate(f"{us / 1e3:.3g}", (m, 1), textcoords="offset points", xytext=(0, -11), ha="center",
                            fontsize=6.5, color="#555555")
            ax.set_title(f"{model}, {regime} ({'GPU span' if regime == 'graph' else 'wall time'} / aten's; "
                         f"aten's ms under its line; above {FORWARD_YMAX}x at the top edge)", fontsize=9)
            ax.set_xlabel("M (tokens)")
            ax.set_ylabel("per-forward time / aten")
            ax.grid(alpha=0.3, which="both")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            else:  # no ok row in this regime (e.g. a run whose eager rows are void)
                ax.text(0.5, 0.5, f"no valid {regime} rows in this run", ha="center", va="center",
                        transform=ax.transAxes, fontsize=10, color="#a33")
    fig.tight_layout()
    return to_uri(fig)
