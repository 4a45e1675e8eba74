"""Verdicts, per-forward totals and threshold fitting on a results table (CPU only)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.forward_paths import flashinfer_everywhere_choice
from dispatch.backends import (ATEN, BACKENDS, DISPATCH, GEMV, backend_of, is_flashinfer, is_kernel_path, is_lean,
                               lean_path)
from dispatch.backends import flashinfer_path as public_path
from dispatch.table import REGIMES, ThresholdTable, compress, describe_ranges
from harness.errors import HarnessError
from shapes.catalog import model_layers

VERDICTS = ("FASTER", "SAME", "SLOWER", "AMBIGUOUS")


def parse_samples(value: Any) -> np.ndarray:
    if isinstance(value, (list, tuple, np.ndarray)):
        return np.asarray(value, dtype=float)
    if not isinstance(value, str) or not value.strip():
        return np.empty(0)
    return np.array([float(v) for v in value.split(";") if v], dtype=float)


def _boot_medians(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """The medians of n_boot resamples of x (sorted rows: about twice as fast as np.median for short samples)."""
    n = len(x)
    rows = np.sort(x[rng.integers(0, n, (n_boot, n))], axis=1)
    return rows[:, n // 2] if n % 2 else 0.5 * (rows[:, n // 2 - 1] + rows[:, n // 2])


def _interval(boot: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    lo, hi = np.quantile(boot, (tail, 1 - tail))
    return float(lo), float(hi)


def ratio_ci(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, level: float = 0.95, seed: int = 0
             ) -> tuple[float, float, float]:
    """median(a)/median(b) and its bootstrap percentile interval (a and b resampled independently)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("ratio of empty samples")
    rng = np.random.default_rng(seed)
    ratios = _boot_medians(a, rng, n_boot) / _boot_medians(b, rng, n_boot)
    return (float(np.median(a) / np.median(b)), *_interval(ratios, level))


def paired_ratio_ci(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, level: float = 0.95, seed: int = 0
                    ) -> tuple[float, float, float]:
    """median(a_i / b_i) over samples taken side by side (interleaved replays) and its bootstrap interval (pairs
    resampled). A clock change that hits both samples of a pair cancels (a power cap that lowers the clock a few
    replays into a long GEMM widens the unpaired interval; docs/design.md)."""
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"paired ratio needs equal, non-empty samples ({len(a)} vs {len(b)})")
    r = np.asarray(a, dtype=float) / np.asarray(b, dtype=float)
    return (float(np.median(r)), *_interval(_boot_medians(r, np.random.default_rng(seed), n_boot), level))


def verdict(lo: float, hi: float, margin: float) -> str:
    """A's time over B's: FASTER/SLOWER only when the whole interval is beyond the margin, SAME when inside it."""
    if hi < 1 - margin:
        return "FASTER"
    if lo > 1 + margin:
        return "SLOWER"
    if lo >= 1 - margin and hi <= 1 + margin:
        return "SAME"
    return "AMBIGUOUS"


@dataclass
class Cells:
    """The ok rows of a results table, indexed by (n, k, m, path)."""
    df: pd.DataFrame
    samples: dict[tuple[int, int, int, str], np.ndarray]

    @classmethod
    def from_results(cls, df: pd.DataFrame) -> "Cells":
        """The per-call GPU time of a cell is CUPTI's sum of its kernel durations (gpu_us), except for a kernel
        launched with programmatic dependent launch (pdl): it starts before its predecessor ends and waits inside,
        so its duration counts time that overlaps the previous call. On the H200, TinyGEMM with pdl=True showed a
        sum of durations above the span of the calls in 94% of cells (median 1.04x the span); for such a row the
        per-call time is the span of the back-to-back calls (span_us, and its per-replay samples where the run kept
        them; older runs kept only the median, so such a cell's interval is the run-to-run floor alone)."""
        ok = df[df["status"] == "ok"].copy()
        if ok.empty:
            raise HarnessError("the results table has no ok rows to judge")
        for col in ("n", "k", "m"):
            ok[col] = ok[col].astype(int)
        pdl = ok["pdl"].map(_truthy) if "pdl" in ok.columns and ok["pdl"].notna().any() else \
            ok["path"].map(lambda p: bool(df.attrs.get("run_pdl")) and _backend_takes_pdl(p))
        ok["pdl"] = pdl.astype(bool)
        ok["gpu_metric"] = np.where(ok["pdl"], "span", "kernel-sum")
        if ok["pdl"].any():
            ok.loc[ok["pdl"], "gpu_us"] = pd.to_numeric(ok.loc[ok["pdl"], "span_us"], errors="coerce")
        samples = {}
        for row in ok.itertuples(index=False):
            column = "span_samples_us" if row.pdl else "gpu_samples_us"
            s = parse_samples(getattr(row, column, ""))
            samples[(row.n, row.k, row.m, row.path)] = s if len(s) else np.array([float(row.gpu_us)])
        return cls(ok.set_index(["n", "k", "m", "path"]).sort_index(), samples)

    def __post_init__(self) -> None:
        # plain dicts for the per-cell lookups that verdicts, totals and the fit make by the thousand
        keys = list(self.df.index)
        self._gpu = dict(zip(keys, self.df["gpu_us"].astype(float)))
        passes = self.df["replay_pass"] if "replay_pass" in self.df.columns else pd.Series("", index=self.df.index)
        self._pass = {key: v for key, v in zip(keys, passes) if isinstance(v, str) and v.strip()}
        host = self.df["host_us"] if "host_us" in self.df.columns else pd.Series(np.nan, index=self.df.index)
        self._host = dict(zip(keys, pd.to_numeric(host, errors="coerce").astype(float)))
        self._kernels = dict(zip(keys, self.df["kernels"])) if "kernels" in self.df.columns else {}
        self._ms: dict[tuple[int, int], list[int]] = {}
        for n, k, m, _ in self.samples:
            self._ms.setdefault((n, k), set()).add(m)
        self._ms = {shape: sorted(ms) for shape, ms in self._ms.items()}
        self._paths = frozenset(p for *_, p in self.samples)

    def has(self, n: int, k: int, m: int, path: str) -> bool:
        return (n, k, m, path) in self.samples

    def gpu(self, n: int, k: int, m: int, path: str) -> float:
        return self._gpu[(n, k, m, path)]

    def host(self, n: int, k: int, m: int, path: str) -> float:
        return self._host[(n, k, m, path)]

    def side_by_side(self, n: int, k: int, m: int, a: str, b: str) -> tuple[np.ndarray, np.ndarray, bool]:
        """Two paths' GPU-time samples at a cell, and whether they pair: timed in one interleaved pass (the same
        replay_pass), sample i of each in round i, so they pair over the rounds both ran (a path whose replays met
        the stopping criterion stops early; the other's later rounds, at a clock the first never saw, are left out).
        Where the clock falls mid-cell (a power cap; docs/design.md), medians of unpaired samples set one path's
        fast rounds against the other's slow ones."""
        sa, sb = self.samples[(n, k, m, a)], self.samples[(n, k, m, b)]
        pa = self._pass.get((n, k, m, a))
        if pa is None or pa != self._pass.get((n, k, m, b)):
            return sa, sb, False
        rounds = min(len(sa), len(sb))
        return sa[:rounds], sb[:rounds], True

    def ratio_ci(self, n: int, k: int, m: int, a: str, b: str, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float, float]:
        """GPU time of path a over path b at a cell and its bootstrap interval: paired where the two were timed side
        by side (side_by_side), medians of independent resamples otherwise."""
        sa, sb, paired = self.side_by_side(n, k, m, a, b)
        return (paired_ratio_ci if paired else ratio_ci)(sa, sb, n_boot=n_boot, level=level, seed=seed)

    def gpu_ratio(self, n: int, k: int, m: int, a: str, b: str) -> float:
        """The point estimate of ratio_ci without its bootstrap: the median of the paired ratios where a and b were
        timed side by side, the ratio of their medians otherwise."""
        sa, sb, paired = self.side_by_side(n, k, m, a, b)
        return float(np.median(sa / sb)) if paired else self.gpu(n, k, m, a) / self.gpu(n, k, m, b)

    def gpu_beside_aten(self, n: int, k: int, m: int, path: str) -> float:
        """A path's GPU time as compared side by side: F.linear's times the path's ratio to it (gpu_ratio), so that
        paths compare in the rounds each shared with F.linear; its own median where F.linear is not measured."""
        if path == ATEN or not self.has(n, k, m, ATEN):
            return self.gpu(n, k, m, path)
        return self.gpu(n, k, m, ATEN) * self.gpu_ratio(n, k, m, path, ATEN)

    def cost(self, n: int, k: int, m: int, path: str, regime: str, beside_aten: bool = False) -> float:
        """A call's cost: GPU time inside CUDA graphs, max(host, GPU) when eager (the host-bound model). beside_aten:
        the GPU time as compared side by side with F.linear's (gpu_beside_aten), not the path's own median."""
        gpu = self.gpu_beside_aten(n, k, m, path) if beside_aten else self.gpu(n, k, m, path)
        if regime == "graph":
            return gpu
        host = self.host(n, k, m, path)
        return max(gpu, host) if not np.isnan(host) else gpu

    def percentile(self, n: int, k: int, m: int, path: str, col: str, which: str) -> float:
        """A column's 20th or 80th percentile (`which` 'p20' or 'p80'; its median where absent; NaN where neither)."""
        row = self.df.loc[(n, k, m, path)]
        v = row.get(f"{col}_{which}", np.nan)
        return float(v) if pd.notna(v) else float(row[col]) if pd.notna(row[col]) else float("nan")

    def cost_bound(self, n: int, k: int, m: int, path: str, which: str) -> float:
        """The eager cost max(host, GPU) from the 20th or 80th percentiles of both (the medians where absent)."""
        host, gpu = (self.percentile(n, k, m, path, c, which) for c in ("host_us", "gpu_us"))
        return max(gpu, host) if not np.isnan(host) else gpu

    def same_kernels(self, n: int, k: int, m: int, path: str, other: str = ATEN) -> bool:
        """Whether two measured paths ran the very same kernels at a cell (by name, in order), so that their GPU
        times differ by measurement noise alone."""
        a, b = self._kernels.get((n, k, m, path)), self._kernels.get((n, k, m, other))
        return isinstance(a, str) and bool(a) and a == b

    def kernels(self, n: int, k: int, m: int, path: str) -> str | None:
        """The kernel names a cell's path ran, in order (None where the run did not record them)."""
        names = self._kernels.get((n, k, m, path))
        return names if isinstance(names, str) and names else None

    def paths(self) -> frozenset[str]:
        return self._paths

    def shapes(self) -> list[tuple[int, int]]:
        return sorted(self._ms)

    def ms(self, n: int, k: int) -> list[int]:
        return list(self._ms.get((n, k), ()))


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")


def _backend_takes_pdl(path: str) -> bool:
    backend = backend_of(path)
    return backend is not None and backend in BACKENDS and BACKENDS[backend].supports_pdl


def calibrated_ratio(cells: Cells, n: int, k: int, m: int, a: str, b: str, noise: Any, seed: int
                     ) -> tuple[float, float, float]:
    """GPU time of path a over path b at a cell, with its bootstrap interval widened by the run-to-run floor `noise`
    (None: the bootstrap alone), banded by F.linear's GPU time as the floor was measured (b's where aten is absent)."""
    ratio, lo, hi = cells.ratio_ci(n, k, m, a, b, seed=seed)
    if noise is not None:
        lo, hi = noise.widen(ratio, lo, hi, cells.gpu(n, k, m, ATEN if cells.has(n, k, m, ATEN) else b))
    return ratio, lo, hi


@dataclass(frozen=True)
class Provenance:
    """Which run a table was fitted on, against the run it is judged on."""
    fitted_from: str  # "" where the table does not say
    in_sample: bool  # judged on the very run it was fitted on
    held_out: list[int]
    unseen: list[int]  # M values of the judged run that the fit never saw (none claimed where it did not record them)


def provenance(table: ThresholdTable, results: str | Path, ms) -> Provenance:
    src = table.source
    fitted = str(src.get("fitted_from") or "").rstrip("/")
    ms = {int(m) for m in ms}
    return Provenance(fitted, bool(fitted) and fitted == str(results).rstrip("/"), list(src.get("held_out_m") or []),
                      sorted(ms - set(src.get("fitted_ms") or ms)))


def chosen_path(table: ThresholdTable, cells: Cells, n: int, k: int, m: int, regime: str = "graph") -> str:
    """The dispatcher's path for a cell in a regime; where the chosen kernel has no ok row (ineligible), F.linear."""
    path = table.choose(n, k, m, regime)
    return path if cells.has(n, k, m, path) else ATEN


def flashinfer_path(table: ThresholdTable, cells: Cells, n: int, k: int, m: int) -> str:
    """'FlashInfer alone' (bench.forward_paths.flashinfer_everywhere_choice: the all-FlashInfer hypothetical, not
    what vLLM runs on SM90), on the measured cells."""
    return flashinfer_everywhere_choice(public_path(table.low_m_backend), table.low_m_backend, m,
                            lambda p: cells.has(n, k, m, p))


def dispatch_candidates(cells: Cells, table: ThresholdTable) -> list[str]:
    """What the dispatcher can choose from in this run: F.linear, every lean FlashInfer call measured and the GEMV; a
    run without lean calls (older runs) offers the table's own paths and the public low-M call."""
    lean = sorted({p for p in cells.paths() if is_lean(p)})
    own = [GEMV] if GEMV in cells.paths() else []
    return [ATEN, *(lean or sorted(table.paths() | {public_path(table.low_m_backend)} - {ATEN, GEMV})), *own]


def oracle_pool(cells: Cells, table: ThresholdTable, oracle: str, among: list[str] | None = None) -> list[str]:
    """The paths the best achievable is taken over: every measured path ('all'), or the dispatcher's own."""
    if oracle == "all":
        return [ATEN, *sorted(p for p in cells.paths() if is_kernel_path(p))]
    return among if among is not None else dispatch_candidates(cells, table)


def candidates(table: ThresholdTable, cells: Cells, n: int, k: int, m: int, oracle: str,
               among: list[str] | None = None) -> list[str]:
    """The oracle's paths measured ok at this cell."""
    return [p for p in oracle_pool(cells, table, oracle, among) if cells.has(n, k, m, p)]


Veto = tuple[str, int, int, int]  # (regime, n, k, m)


def veto_key(regime: str, n: int, k: int, m: int) -> str:
    """How a table's source names a cell of a veto: 'graph 18432x2560 M=512'."""
    return f"{regime} {n}x{k} M={m}"


def forward_vetoes(table: ThresholdTable) -> dict[Veto, frozenset[str]]:
    """The paths a table's fit kept out of cells because a measured forward of the model ran slower with them alone
    than all-aten, beyond the noise, where the cells said they would not (calibrate fit; the table's source,
    measured_forwards.vetoes)."""
    raw = ((table.source or {}).get("measured_forwards") or {}).get("vetoes") or {}
    out = {}
    for key, paths in raw.items():
        parts = str(key).split(" ")
        try:
            (n, k), m = map(int, parts[1].split("x")), int(parts[2].removeprefix("M="))
        except (IndexError, ValueError):
            raise HarnessError(f"threshold table of {table.profile}: veto {key!r} is not 'REGIME NxK M=m'; fit the "
                               f"table again (python -m calibrate fit)") from None
        out[(parts[0], n, k, m)] = frozenset(map(str, paths))
    return out


def _vetoed(path: str, vetoed) -> bool:
    """Whether a veto covers a path: the lean call vetoed covers the public call of its backend (the same kernel)."""
    return path in vetoed or (is_flashinfer(path) and lean_path(backend_of(path)) in vetoed)


def _not_vetoed(cands: list[str], vetoes: dict[Veto, frozenset[str]], cell: Veto) -> list[str]:
    """The candidates no veto at this (regime, n, k, m) covers; all of them where a veto would leave none."""
    return [p for p in cands if not _vetoed(p, vetoes.get(cell, ()))] or cands


def cell_verdicts(cells: Cells, table: ThresholdTable, margin: float = 0.03, oracle: str = "all",
                  noise: Any = None, vetoes: dict[Veto, frozenset[str]] | None = None) -> pd.DataFrame:
    """Per cell, in the graph regime (GPU time): the dispatcher's choice against the fastest path of the oracle, with
    the ratio's interval (bootstrap, widened by the run-to-run floor `noise` where given). Beside it, the eager
    regime's choice and its cost (max(host, GPU)) over the best eager cost, a point estimate. A path the table's fit
    vetoed at a cell (`vetoes`, default the table's own: forward_vetoes) is no oracle there; where it was the fastest,
    `vetoed` names it and `vetoed_regret` is the choice's cost over it."""
    rows = []
    among = dispatch_candidates(cells, table)
    low = low_m_measured(cells, table)
    vetoes = forward_vetoes(table) if vetoes is None else vetoes
    for n, k in cells.shapes():
        for m in cells.ms(n, k):
            cands = candidates(table, cells, n, k, m, oracle, among)
            if not cands:
                continue
            chosen = chosen_path(table, cells, n, k, m)
            fastest = min(cands, key=lambda p: cells.gpu_beside_aten(n, k, m, p))
            best = min(_not_vetoed(cands, vetoes, ("graph", n, k, m)),
                       key=lambda p: cells.gpu_beside_aten(n, k, m, p))
            ratio, lo, hi = calibrated_ratio(cells, n, k, m, chosen, best, noise, hash((n, k, m)) & 0xFFFF)
            v = "SAME" if chosen == best else verdict(lo, hi, margin)
            low_vs_aten = ""
            if cells.has(n, k, m, low) and cells.has(n, k, m, ATEN):
                _, llo, lhi = calibrated_ratio(cells, n, k, m, low, ATEN, noise, (hash((n, k, m)) + 1) & 0xFFFF)
                low_vs_aten = verdict(llo, lhi, margin)
            eager = chosen_path(table, cells, n, k, m, "eager")
            eager_best = min(_not_vetoed(cands, vetoes, ("eager", n, k, m)),
                             key=lambda p: cells.cost(n, k, m, p, "eager"))
            rows.append({"n": n, "k": k, "m": m, "chosen": chosen, "oracle": best,
                         "chosen_us": cells.gpu(n, k, m, chosen), "oracle_us": cells.gpu(n, k, m, best),
                         "regret": ratio - 1, "ratio_lo": lo, "ratio_hi": hi, "verdict": v,
                         "vetoed": fastest if fastest != best else "",
                         "vetoed_regret": (cells.gpu(n, k, m, chosen) / cells.gpu(n, k, m, fastest) - 1
                                           if fastest != best else np.nan),
                         "low_m_vs_aten": low_vs_aten,
                         "measured_dispatch_us": cells.gpu(n, k, m, DISPATCH) if cells.has(n, k, m, DISPATCH) else np.nan,
                         "eager_chosen": eager, "eager_oracle": eager_best,
                         "eager_regret": cells.cost(n, k, m, eager, "eager") / cells.cost(n, k, m, eager_best, "eager") - 1})
    return pd.DataFrame(rows)


FORWARD_TOLERANCE = 1.01  # a per-forward total may exceed the best achievable by at most 1%


def sum_exceeds(ratio: float, cost_model: str, floor: Any = None) -> bool:
    """Whether a modelled per-forward ratio (dispatcher / best) lies above FORWARD_TOLERANCE beyond the forward noise
    floor (calibrate.forward_noise: `cost_model` 'graph' for sums of GPU time, 'eager' for sums of max(host, GPU)),
    as a measured forward's ratio is judged; the point estimate alone where no floor is measured."""
    hw = floor.half_widths.get(cost_model, 0.0) if floor is not None else 0.0
    return ratio * math.exp(-hw) > FORWARD_TOLERANCE


def failures(verdicts: pd.DataFrame, totals: pd.DataFrame, floor: Any = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pass rule, in one place: the cells where the dispatcher is SLOWER than the best path, and the (model, M)
    whose per-forward total, in the regime vLLM runs that M in, exceeds the best by more than FORWARD_TOLERANCE beyond
    the forward floor (sum_exceeds). The dispatcher holds when both are empty."""
    slower = verdicts[verdicts["verdict"] == "SLOWER"] if len(verdicts) else verdicts
    if not len(totals):
        return slower, totals
    above = [sum_exceeds(r, c, floor) for r, c in zip(totals["dispatch_over_best"], totals["cost_model"])]
    return slower, totals[totals["actual"] & pd.Series(above, index=totals.index)]


def model_uses(df: pd.DataFrame) -> dict[str, list[tuple[int, int, int]]]:
    """model -> [(n, k, count per forward)] of its in-graph layers whose shapes the results cover (from the catalog).
    lm_head is left out: its M is the sampled rows, not the step's tokens."""
    present = {(int(n), int(k)) for n, k in zip(df["n"], df["k"])}
    tps = sorted({int(t) for t in df["tp"]}) if "tp" in df.columns else [1]
    uses: dict[str, dict[tuple[int, int], int]] = {}
    for tp in tps:
        for layer in model_layers(tp=tp):
            if layer.in_cuda_graph and (layer.n, layer.k) in present:
                per_model = uses.setdefault(layer.model, {})
                per_model[(layer.n, layer.k)] = per_model.get((layer.n, layer.k), 0) + layer.count
    return {model: [(n, k, c) for (n, k), c in sorted(v.items())] for model, v in uses.items()}


def forward_totals(cells: Cells, table: ThresholdTable, uses: dict[str, list[tuple[int, int, int]]],
                   capture_size: int, oracle: str = "all") -> pd.DataFrame:
    """The cell-sum model, per model, M and regime: count-weighted per-forward µs of aten, FlashInfer, the dispatcher
    and the best single path (one path for every linear it can run, F.linear elsewhere: the target's reference);
    beside it the per-cell oracle (the fastest path at every cell, biased low by taking a minimum over noisy
    estimates). `actual` marks the regime vLLM runs that M in (CUDA graph up to the capture size, eager above).
    Eager cost is max(host, GPU) per call, except from the M at which the table's fit found the model's measured eager
    forwards GPU-bound (source measured_forwards.gpu_bound_from): there a forward costs its GPU time, as the fit
    judged it. Each path's GPU time at a cell is F.linear's times the path's ratio to it over the rounds both ran
    (Cells.gpu_beside_aten), as the cell verdicts and the fit compare paths: a path whose replays ran on through a
    clock fall after F.linear's had stopped is not charged for the rounds F.linear never saw."""
    rows = []
    among = dispatch_candidates(cells, table)
    pool = oracle_pool(cells, table, oracle, among)
    all_ms = sorted({m for _, _, m, _ in cells.samples})
    bound_from = (table.source.get("measured_forwards") or {}).get("gpu_bound_from") or {}
    for model, layers in uses.items():
        for m in all_ms:
            if not all(cells.has(n, k, m, ATEN) for n, k, _ in layers):
                continue
            gpu_bound = bound_from.get(model) is not None and m >= bound_from[model]
            for regime in ("graph", "eager"):
                tot = {ATEN: 0.0, "flashinfer": 0.0, DISPATCH: 0.0, "per_cell_oracle": 0.0}
                single = {p: 0.0 for p in pool}
                how = "graph" if gpu_bound else regime
                for n, k, count in layers:
                    def cost(path: str) -> float:
                        return cells.cost(n, k, m, path, how, beside_aten=True)
                    tot[ATEN] += count * cost(ATEN)
                    tot["flashinfer"] += count * cost(flashinfer_path(table, cells, n, k, m))
                    tot[DISPATCH] += count * cost(chosen_path(table, cells, n, k, m, regime))
                    tot["per_cell_oracle"] += count * min(cost(p)
                                                          for p in candidates(table, cells, n, k, m, oracle, among))
                    for p in pool:  # a single path wherever it can run, F.linear elsewhere
                        single[p] += count * cost(p if cells.has(n, k, m, p) else ATEN)
                best_path = min(single, key=single.get)
                tot["best"] = single[best_path]
                # vLLM runs a step of M tokens in the graph regime only up to the capture size.
                actual = (regime == "graph") == (m <= capture_size)
                rows.append({"model": model, "m": m, "regime": regime, "actual": actual, "cost_model": how,
                             **{f"{k}_us": v for k, v in tot.items()}, "best_path": best_path,
                             "dispatch_over_best": tot[DISPATCH] / tot["best"]})
    return pd.DataFrame(rows)


FIT_MIN_GAIN = 0.01  # a cell leaves F.linear only for a gain above this share, besides the noise test


def _beats(cells: Cells, n: int, k: int, m: int, path: str, ref: str, regime: str, min_gain: float, noise: Any) -> bool:
    """Whether `path` is faster than `ref` at a cell beyond the noise, in a regime (the fit's hysteresis).
    graph: the GPU-time ratio's interval (bootstrap, widened by the run-to-run floor where measured) lies wholly below
    1 - min_gain. eager: the cost max(host, GPU) with the path's 80th percentiles, times the run-to-run floor, stays
    below 1 - min_gain of ref's with its 20th percentiles (host time has no replay samples, only its spread over
    rounds; the floor keeps a GPU-bound eager cell from switching on a gain the graph test calls noise)."""
    if regime == "graph":
        return calibrated_ratio(cells, n, k, m, path, ref, noise, m)[2] < 1 - min_gain
    floor = math.exp(noise.half_width(cells.gpu(n, k, m, ref))) if noise is not None else 1.0
    return cells.cost_bound(n, k, m, path, "p80") * floor < (1 - min_gain) * cells.cost_bound(n, k, m, ref, "p20")


def host_hidden(cells: Cells, n: int, k: int, m: int, path: str) -> bool:
    """Whether a call's host time hides behind its GPU time when eager (host p80 below GPU p20): such a cell's eager
    cost is its GPU time, and the graph regime's GPU-time evidence (and measured-forward pick) decides it."""
    if not cells.has(n, k, m, path):
        return False
    return cells.percentile(n, k, m, path, "host_us", "p80") < cells.percentile(n, k, m, path, "gpu_us", "p20")


def boundary(cells: Cells, n: int, k: int, lo: tuple[int, str], hi: tuple[int, str], regime: str) -> int:
    """The last M of [lo, hi) that keeps lo's path, where its path and hi's path change places between two measured
    M: where their regime costs, interpolated linearly in M between the two measured values, cross (a model of the
    unmeasured M, checked by validating on held-out M). lo's M where either cost is missing at either end, or where
    lo's path was chosen although it was not the cheaper one there (a measured forward's pick, a gain in the noise)."""
    (m0, p), (m1, q) = lo, hi
    if not all(cells.has(n, k, m, x) for m in (m0, m1) for x in (p, q)):
        return m0
    d0 = cells.cost(n, k, m0, p, regime) - cells.cost(n, k, m0, q, regime)
    d1 = cells.cost(n, k, m1, p, regime) - cells.cost(n, k, m1, q, regime)
    if d0 > 0:
        return m0
    if d1 <= 0:
        return m1 - 1
    return m0 + int((m1 - m0) * -d0 / (d1 - d0))


def with_boundaries(cells: Cells, n: int, k: int, choices: list[tuple[int, str]], regime: str
                    ) -> list[tuple[int, str]]:
    """Per-M choices with, where the choice changes between two measured M, the last M of the lower one's run moved
    to the boundary (see boundary)."""
    out: list[tuple[int, str]] = []
    for here, after in zip(choices, choices[1:] + [None]):
        out.append(here)
        if after is not None and after[1] != here[1]:
            end = boundary(cells, n, k, here, after, regime)
            if end > here[0]:
                out.append((end, here[1]))
    return out


def host_ratios(cells: Cells, paths: list[str]) -> dict[str, float]:
    """Per path, the median over the run's cells of its host time over F.linear's at the same cell (single cells'
    host times drift by tens of percent; a path's host cost relative to F.linear is a property of its call)."""
    out = {}
    for p in paths:
        r = [cells.host(n, k, m, p) / cells.host(n, k, m, ATEN) for n, k in cells.shapes() for m in cells.ms(n, k)
             if cells.has(n, k, m, p) and cells.has(n, k, m, ATEN)]
        r = [v for v in r if v == v]
        if r:
            out[p] = float(np.median(r))
    return out


def shapes_to_fit(cells: Cells, hold_out: set[int] | frozenset[int]):
    """(n, k, the M a fit may use) per shape: M not held out where F.linear was measured ok."""
    for n, k in cells.shapes():
        ms = [m for m in cells.ms(n, k) if m not in hold_out and cells.has(n, k, m, ATEN)]
        if ms:
            yield n, k, ms


def fit(cells: Cells, base: ThresholdTable, capture_size: int, min_gain: float = FIT_MIN_GAIN, noise: Any = None,
        hold_out: set[int] | frozenset[int] = frozenset(),
        forward_picks: dict[tuple[str, int, int, int], str] | None = None,
        gpu_bound_from: dict[tuple[int, int], float] | None = None,
        overrides: dict[tuple[str, int, int, int], str] | None = None,
        host_bound_until: dict[tuple[int, int], float] | None = None) -> tuple[ThresholdTable, pd.DataFrame]:
    """Per shape and regime, M ranges -> path. At each measured M (held-out values left out) the cheapest candidate
    (dispatch_candidates) in the regime's cost (graph: GPU time; eager: max(host, GPU) per call) replaces F.linear
    only where it beats F.linear beyond the noise (_beats); ties go to F.linear. Shapes not measured run F.linear
    (the default ranges are empty): a kernel is only chosen where it was measured. `forward_picks`
    (regime, n, k, m) -> path come from measured forwards (calibrate.forward_model.forward_picks): a path whose whole
    forward beat all-aten beyond the noise. Eager, it takes precedence at its cells: a host-bound forward costs its
    host time, which the per-cell max(host, GPU) misjudges. In the graph regime GPU time adds up cell by cell, so
    it only fills cells where the cell test left F.linear and its own cell costs no more than F.linear's (gains too
    small to show beyond the noise in one cell).

    Eager, below the picks, what decides a cell is whether the forward it runs in is host- or GPU-bound, which one
    cell cannot show. `gpu_bound_from` (n, k) -> M, from measured forwards (forward_model.gpu_bound_from): from that
    M on, every measured eager forward of the models with this shape kept its GPU busy longer than the host took to
    submit it, by a margin, so a call's host time hides in the backlog and the graph regime's choice (GPU time)
    decides. Below it the forward is host-bound: every µs of host time adds to it, so only a path whose host time is
    below F.linear's (host_ratios < 1) may replace F.linear there, by the cost test above. `host_bound_until`
    (n, k) -> M (forward_model.host_bound_until): up to that M the host took clearly longer than the GPU; above it
    and below gpu_bound_from the forward is balanced, host and GPU time both show in it, so a path must be cheaper
    in both: host time below F.linear's and GPU time beating it beyond the noise (the graph test) as well as the
    eager cost test. (Without the profiler the H200's 4B forward at M = 1 is balanced, and lean TinyGEMM on every
    linear, half F.linear's host time, measured 1.05x all-aten: its GPU time grew more than the host time fell.)
    A shape without measured forwards keeps the per-cell test: a cell whose host time hides behind its own GPU time
    (host_hidden) takes the graph regime's choice.

    `overrides` (regime, n, k, m) -> path (forward_model.overrides_over_the_table, and choices kept from a measured
    table, kept_choices): what measured forwards of a table showed; it takes precedence at its cells (and eager cells
    that take the graph choice follow it)."""
    forward_picks, overrides = forward_picks or {}, overrides or {}
    among = dispatch_candidates(cells, base)
    host_cheaper = {p for p, r in host_ratios(cells, among[1:]).items() if r < 1}
    if not any(cells.has(n, k, m, ATEN) and cells.has(n, k, m, p) for n, k in cells.shapes() for m in cells.ms(n, k)
               for p in among[1:]):
        raise HarnessError("nothing to fit: no cell has aten and a FlashInfer path the dispatcher can call ("
                           + ", ".join(among[1:]) + ") both measured ok; measure them with python -m bench run")
    shapes_out: dict[tuple[int, int], dict[str, tuple]] = {}
    report = []
    for n, k, ms in shapes_to_fit(cells, hold_out):
        own, graph_choice = {}, {}
        bound_from = (gpu_bound_from or {}).get((n, k))
        host_until = (host_bound_until or {}).get((n, k))
        for regime in ("graph", "eager"):
            choices = []
            for m in ms:
                host_bound = regime == "eager" and bound_from is not None and m < bound_from
                balanced = host_bound and host_until is not None and m > host_until
                cands = [p for p in among if p != ATEN and cells.has(n, k, m, p)
                         and (not host_bound or p in host_cheaper)]
                best = min(cands, key=lambda p: cells.cost(n, k, m, p, "graph" if balanced else regime),
                           default=None)
                choice = best if best is not None and _beats(cells, n, k, m, best, ATEN, regime, min_gain, noise) \
                    and (not balanced or _beats(cells, n, k, m, best, ATEN, "graph", min_gain, noise)) else ATEN
                if regime == "eager" and not host_bound and (bound_from is not None or all(
                        host_hidden(cells, n, k, m, p) for p in {ATEN, graph_choice[m]})):
                    choice = graph_choice[m]  # eagerly GPU-bound: GPU time decides, as in the graph regime
                picked = forward_picks.get((regime, n, k, m))
                if picked is not None and cells.has(n, k, m, picked) and (regime == "eager" or (
                        choice == ATEN and cells.cost(n, k, m, picked, regime) <= cells.cost(n, k, m, ATEN, regime))):
                    choice = picked
                over = overrides.get((regime, n, k, m))
                if over is not None and cells.has(n, k, m, over):
                    choice = over
                if regime == "graph":
                    graph_choice[m] = choice
                choices.append((m, choice))
            own[regime] = compress(with_boundaries(cells, n, k, choices, regime))
        shapes_out[(n, k)] = own
        report.append({"n": n, "k": k, "graph": describe_ranges(own["graph"]), "eager": describe_ranges(own["eager"]),
                       "crossover_m": crossover(cells, base, n, k)})
    table = ThresholdTable(base.profile, base.low_m_backend, {r: () for r in REGIMES}, shapes_out)
    return table, pd.DataFrame(report)


def low_m_measured(cells: Cells, table: ThresholdTable) -> str:
    """The low-M backend's path as this run measured it: its lean call where measured, else the public one."""
    lean = lean_path(table.low_m_backend)
    return lean if lean in cells.paths() else public_path(table.low_m_backend)


def crossover(cells: Cells, table: ThresholdTable, n: int, k: int, margin: float = 0.03) -> float:
    """Smallest M where the low-M kernel stops being FASTER than aten (NaN if it never is, or never stops)."""
    low = low_m_measured(cells, table)
    was_faster = False
    for m in cells.ms(n, k):
        if not (cells.has(n, k, m, low) and cells.has(n, k, m, ATEN)):
            continue
        _, lo, hi = cells.ratio_ci(n, k, m, low, ATEN, seed=m)
        v = verdict(lo, hi, margin)
        if v == "FASTER":
            was_faster = True
        elif was_faster:
            return float(m)
    return float("nan")
