"""A fit that prefers few ranges: per shape and regime, the fewest contiguous M ranges (one path each) whose cost
stays within a tolerance of the per-M best, where every range that is not F.linear beats F.linear beyond the noise
over its span. Dynamic programming over the measured M, not a stack of rules.

Rule, in a sentence: at every measured M a range's path costs at most (1 + tolerance) x the cheapest there of F.linear
and the paths that beat F.linear beyond the noise at that M; a FlashInfer range's cost over its span (geometric mean
of its per-M ratios to F.linear, each judged at the upper end of its interval widened by the noise floor) lies below
(1 - min_gain), judged at the M where its GPU time can be told from F.linear's (where it ran F.linear's very kernels
in a time the noise cannot tell apart, in a cost that GPU time decides, it costs what F.linear costs); among the
segmentations with the fewest ranges (F.linear above the last one is not a range), F.linear keeps the M where no
FlashInfer path beats it beyond the noise, then the lowest total cost wins, then F.linear. An M between two measured
ones takes the larger one's choice; `refine_cells` names the gaps where the choice changes, for a sweep to measure
before the final fit.

From several machines (the same cells measured with the same tactics on other machines of one kind): a cell's
kernels run several per cent apart on some machines, beyond the run-to-run floor, so each cell is judged by the median
machine (median_machine), and a range covers as few as it can of the M that some machine speaks against
(machine_bars).
"""
from __future__ import annotations

import math
from statistics import median
from typing import Any, NamedTuple

import pandas as pd

from calibrate.analysis import Cells, Veto, calibrated_ratio, dispatch_candidates, shapes_to_fit, sum_exceeds
from dispatch.backends import ATEN
from dispatch.table import REGIMES, ThresholdTable, compress, describe_ranges
from harness.errors import HarnessError

DEFAULT_TOLERANCE = 0.02
# A range narrower than this share of its upper M is a decision the grid cannot resolve (M 1025..1031, say): the fit
# avoids such ranges before it counts ranges, and takes one only where every other segmentation breaks the tolerance.
MIN_WIDTH = 0.02
RULE = ("fewest M ranges per shape and regime such that at every measured M the range's path costs at most "
        "(1 + tolerance) x the cheapest there of F.linear and the paths that beat it beyond the noise, and every "
        "FlashInfer range's geometric-mean ratio to F.linear over its span (each M at the top of its noise-widened "
        "interval) lies below 1 - min_gain, judged at the M where its GPU time can be told from F.linear's (where "
        "it ran F.linear's very kernels and its GPU-time ratio's noise-widened interval spans 1, in a cost judged by "
        "GPU time or an eager one where both calls were GPU-bound (host's 80th percentile below GPU's 20th), it "
        "costs F.linear's cost); "
        "graph cost: GPU time; eager cost: max(host, GPU) per call, and with --forward GPU time from the M where "
        "the shape's models' measured eager forwards were GPU-bound (both between that and the host-bound M, and "
        "for a call that submits slower than F.linear's without its GPU time covering that), and "
        "at a (model, M) where a single path's whole eager forward beat all-aten beyond the noise in every run, "
        "that path as the best at the model's cells with the forward's ratio; at a (model, M) where a single "
        "path's whole forward (either regime) ran slower than all-aten beyond the noise in every run, not that "
        "path at the model's cells; no range narrower than "
        f"{MIN_WIDTH:.0%} of its upper M unless every other segmentation breaks the tolerance; among the fewest "
        "ranges (F.linear above the last one is not a range), F.linear keeps the M where no FlashInfer path beats it "
        "beyond the noise, then the lower total cost, then F.linear; where a single path's cost summed over a "
        "model's cells at one M (in the regime vLLM runs that M in) beats the choices' sum by more than 1%, that "
        "path at the model's cells where it costs less; an M between two measured ones takes the larger one's "
        "choice")


def _upper_ratio(cells: Cells, n: int, k: int, m: int, path: str, regime: str, noise: Any) -> float:
    """A conservative ratio of path over F.linear at one cell: the interval's top in the graph regime, the 80th
    percentile cost over F.linear's 20th (widened by the floor) eagerly."""
    if regime == "graph":
        return calibrated_ratio(cells, n, k, m, path, ATEN, noise, m)[2]
    floor = math.exp(noise.half_width(cells.gpu(n, k, m, ATEN))) if noise is not None else 1.0
    return cells.cost_bound(n, k, m, path, "p80") * floor / cells.cost_bound(n, k, m, ATEN, "p20")


def _gpu_bound(cells: Cells, n: int, k: int, m: int, path: str) -> bool:
    """Whether a call's eager cost max(host, GPU) is its GPU time beyond the spread: host's 80th percentile below
    GPU's 20th."""
    host = cells.percentile(n, k, m, path, "host_us", "p80")
    return not math.isnan(host) and host < cells.percentile(n, k, m, path, "gpu_us", "p20")


def _submits_slower(cells: Cells, n: int, k: int, m: int, path: str) -> bool:
    """Whether an eager call submits slower than F.linear's beyond the spread (host's 20th percentile above F.linear's
    80th) and its own GPU time does not cover that (not _gpu_bound). A forward found GPU-bound with F.linear's
    submissions need not stay so with such a call in every layer, so its cost there is not its GPU time alone."""
    if path == ATEN:
        return False
    host = cells.percentile(n, k, m, path, "host_us", "p20")
    aten = cells.percentile(n, k, m, ATEN, "host_us", "p80")
    return not math.isnan(host) and not math.isnan(aten) and host > aten and not _gpu_bound(cells, n, k, m, path)


def _alike(cells: Cells, n: int, k: int, m: int, path: str, how: tuple[str, ...], noise: Any) -> bool:
    """Whether a path's cost at a cell is F.linear's: it ran the same kernels (by name; their launch shapes may
    still differ, so that alone is not enough), its GPU-time ratio to F.linear's, widened by the noise floor, spans
    1, and GPU time decides the cost: judged by GPU time (`how` ('graph',)), or eagerly where both calls are
    GPU-bound (_gpu_bound)."""
    if not cells.same_kernels(n, k, m, path):
        return False
    if how != ("graph",) and not (_gpu_bound(cells, n, k, m, ATEN) and _gpu_bound(cells, n, k, m, path)):
        return False
    _, lo, hi = calibrated_ratio(cells, n, k, m, path, ATEN, noise, m)
    return lo <= 1.0 <= hi


def eager_model(m: int, gpu_bound_from: float | None, host_bound_until: float | None) -> tuple[str, ...]:
    """How an eager call at M is judged, from measured forwards of the shape's models: from the M where they were
    GPU-bound, by GPU time ('graph'); up to the M where they were host-bound, or without forwards, by max(host, GPU)
    of the cell ('eager'); between (balanced), by both."""
    if gpu_bound_from is not None and m >= gpu_bound_from:
        return ("graph",)
    if gpu_bound_from is not None and (host_bound_until is None or m > host_bound_until):
        return ("graph", "eager")
    return ("eager",)


def _cost(cells: Cells, n: int, k: int, m: int, path: str, how: tuple[str, ...]) -> float:
    parts = {"graph": lambda: cells.gpu_beside_aten(n, k, m, path), "eager": lambda: cells.cost(n, k, m, path, "eager")}
    return max(parts[h]() for h in how)


def segment(ms: list[int], cost: dict[tuple[int, str], float], upper: dict[tuple[int, str], float],
            paths: list[str], tolerance: float, min_gain: float, min_width: float = MIN_WIDTH,
            alike: frozenset[tuple[int, str]] | set[tuple[int, str]] = frozenset(),
            barred: frozenset[tuple[int, str]] | set[tuple[int, str]] = frozenset()) -> list[tuple[int, str]]:
    """Per-M choices [(m, path)] of the fewest-range segmentation (see the module's rule). `cost[(m, p)]`: the
    regime's cost, `upper[(m, p)]`: p's conservative ratio to F.linear at m; a path absent at an M cannot cover it.
    `alike`: the (m, p) where p costs what F.linear costs because it runs F.linear's kernels (FlashInfer's cuBLASLt
    where its tuned entry is unreachable: `_alike`); a range may cover them, but its span test is judged on its other M.
    `barred`: the (m, p) that a fitting machine rules out (machine_bars); the fewest of them are covered first.
    Ranges narrower than `min_width` of their upper M count first (fewest of them), then ranges as a table lists them
    (F.linear above the last one is not a range), then the M that a FlashInfer range covers without beating F.linear
    beyond the noise there (F.linear keeps what no path wins), then the total cost."""
    t = len(ms)
    # the per-M best among what may replace F.linear: F.linear, and paths that beat it beyond the noise
    best = [min(cost[(m, p)] for p in paths if (m, p) in cost and (p == ATEN or upper[(m, p)] < 1 - min_gain))
            for m in ms]
    # f[j]: (barred M, narrow ranges, listed ranges, unwon M, total cost) of the best segmentation of ms[:j]; back[j]:
    # its last range
    f: list[tuple[float, ...]] = [(0, 0, 0, 0, 0.0)] + [(math.inf,) * 5] * t
    back: list[tuple[int, str]] = [(0, ATEN)] * (t + 1)
    for j in range(1, t + 1):
        for p in paths:
            total, logs, unwon, judged, bars = 0.0, 0.0, 0, 0, 0
            for i in range(j, 0, -1):  # the range ms[i-1 .. j-1]
                m = ms[i - 1]
                if (m, p) not in cost or cost[(m, p)] > (1 + tolerance) * best[i - 1]:
                    break
                total += cost[(m, p)]
                bars += (m, p) in barred
                if p != ATEN and (m, p) in alike:
                    unwon += 1
                elif p != ATEN:
                    logs, judged = logs + math.log(upper[(m, p)]), judged + 1
                    unwon += upper[(m, p)] >= 1 - min_gain
                if p != ATEN and (not judged or math.exp(logs / judged) >= 1 - min_gain):
                    continue  # this span does not beat F.linear beyond the noise; a longer one still may
                lo = ms[i - 2] + 1 if i > 1 else 1
                narrow = 1 if (ms[j - 1] - lo + 1) < min_width * ms[j - 1] else 0
                listed = 0 if p == ATEN and j == t else 1
                cand = (f[i - 1][0] + bars, f[i - 1][1] + narrow, f[i - 1][2] + listed, f[i - 1][3] + unwon,
                        f[i - 1][4] + total)
                if cand < f[j] or (cand == f[j] and p == ATEN):
                    f[j], back[j] = cand, (i - 1, p)
    if math.isinf(f[t][2]):
        raise HarnessError("no segmentation meets the tolerance; raise --tolerance")
    out: list[tuple[int, str]] = []
    j = t
    while j > 0:
        i, p = back[j]
        out[:0] = [(m, p) for m in ms[i:j]]
        j = i
    return out


Costs = dict[tuple[int, str], float]


class Problem(NamedTuple):
    """One shape and regime to segment: its measured M, each path's cost and conservative ratio to F.linear per M,
    per M how the cost was judged ('graph': GPU time; 'eager': with host time), and the (m, path) judged by GPU time
    where the path ran F.linear's very kernels (its cost is then F.linear's: the two differ by noise alone)."""
    ms: list[int]
    cost: Costs
    upper: Costs
    judged: dict[int, str]
    alike: frozenset[tuple[int, str]] = frozenset()
    barred: frozenset[tuple[int, str]] = frozenset()


Uses = dict[str, list[tuple[int, int, int]]]
# With this many machines or more, a path whose point ratio to F.linear is below a bound on every one of them beats
# F.linear to that bound beyond the noise: each machine's error is its own, so all of them land below the true ratio
# by chance with probability 1 / 2**machines.
CONSISTENT_MACHINES = 3
MachineCosts = tuple[Costs, Costs, set[tuple[int, str]]]


def _machine_costs(cells: Cells, n: int, k: int, hows: dict[int, tuple[str, ...]], among: list[str], noise: Any,
                   regime: str = "graph") -> MachineCosts:
    """One machine's cost, conservative ratio to F.linear and alike cells of a shape, per M as `hows` judges it; an
    eager M judged by GPU time alone (a GPU-bound forward) judges a path that submits slower than F.linear
    (_submits_slower) by both GPU time and max(host, GPU)."""
    cost, upper, alike = {}, {}, set()
    for m, judged in hows.items():
        for p in among:
            how = judged
            if regime != "graph" and judged == ("graph",) and cells.has(n, k, m, p) and cells.has(n, k, m, ATEN) \
                    and _submits_slower(cells, n, k, m, p):
                how = ("graph", "eager")
            value = _cost(cells, n, k, m, p, how) if cells.has(n, k, m, p) else math.nan
            if math.isnan(value):
                continue  # unmeasured, or without the host time its regime is judged by: cannot cover M
            if p != ATEN and _alike(cells, n, k, m, p, how, noise):
                alike.add((m, p))
                cost[(m, p)], upper[(m, p)] = _cost(cells, n, k, m, ATEN, how), 1.0
                continue
            cost[(m, p)] = value
            upper[(m, p)] = 1.0 if p == ATEN else max(_upper_ratio(cells, n, k, m, p, h, noise) for h in how)
    return cost, upper, alike


def median_machine(own: MachineCosts, others: list[MachineCosts]) -> MachineCosts:
    """A shape's costs as the median machine measured them. Per (M, path) that the fitting run measured: its cost is
    the fitting run's F.linear cost times the median over machines of the path's ratio to F.linear there, its
    conservative ratio the median of the machines' ones, and it is alike (F.linear's kernels) where it is on at least
    half of them; with CONSISTENT_MACHINES or more, a path faster than F.linear on every machine has its conservative
    ratio at most the slowest machine's ratio. A machine that did not measure the path and F.linear at that M says
    nothing. Cells move between machines of one kind by more than the noise floor (one machine's kernel several per
    cent slower than on the others, docs/design.md): a median of three or more is not moved by one such machine."""
    cost, upper, alike = {}, {}, set()
    machines = [own, *others]
    for (m, p), value in own[0].items():
        if p == ATEN or (m, ATEN) not in own[0]:  # F.linear itself, or no F.linear here to take ratios to
            cost[(m, p)], upper[(m, p)] = value, own[1][(m, p)]
            if (m, p) in own[2]:
                alike.add((m, p))
            continue
        seen = [mc for mc in machines if (m, p) in mc[0] and (m, ATEN) in mc[0]]
        ratios = sorted(mc[0][(m, p)] / mc[0][(m, ATEN)] for mc in seen)
        cost[(m, p)] = own[0][(m, ATEN)] * median(ratios)
        upper[(m, p)] = median(mc[1][(m, p)] for mc in seen)
        if len(seen) >= CONSISTENT_MACHINES:  # below the slowest machine's ratio beyond the noise too
            upper[(m, p)] = min(upper[(m, p)], ratios[-1])
        if 2 * sum((m, p) in mc[2] for mc in seen) >= len(seen):
            alike.add((m, p))
            cost[(m, p)], upper[(m, p)] = own[0][(m, ATEN)], 1.0
    return cost, upper, alike


def machine_bars(ms: list[int], machines: list[MachineCosts], paths: list[str], tolerance: float, min_gain: float
                 ) -> frozenset[tuple[int, str]]:
    """The (m, p) that some fitting machine speaks against (a range covers the fewest of them):
    - p costs more than (1 + tolerance) x that machine's best at m (F.linear and the paths that beat it beyond the
      noise there), unless every path does on some machine (they disagree beyond the tolerance; the median decides);
    - p is FlashInfer, does not beat F.linear beyond the noise on the median machine, and some machine measured it
      slower than F.linear: a range may carry it over an M it does not win only where no machine lost time to it.
    A machine that did not measure p (and F.linear) at m says nothing of it."""
    out: set[tuple[int, str]] = set()
    for m in ms:
        worst: dict[str, float] = {}
        ratios: dict[str, list[float]] = {}
        uppers: dict[str, list[float]] = {}
        for cost, upper, _ in machines:
            if (m, ATEN) not in cost:
                continue
            best = min(cost[(m, p)] for p in paths
                       if (m, p) in cost and (p == ATEN or upper[(m, p)] < 1 - min_gain))
            for p in (q for q in paths if (m, q) in cost):
                worst[p] = max(worst.get(p, 0.0), cost[(m, p)] / best - 1)
                ratios.setdefault(p, []).append(cost[(m, p)] / cost[(m, ATEN)])
                uppers.setdefault(p, []).append(upper[(m, p)])
        allowed = {p for p, r in worst.items() if r <= tolerance}
        if allowed:
            out |= {(m, p) for p in worst if p not in allowed}
        out |= {(m, p) for p in ratios if p != ATEN and max(ratios[p]) > 1
                and median(uppers[p]) >= 1 - min_gain}
    return frozenset(out)


def fit_segments(cells: Cells, base: ThresholdTable, tolerance: float = DEFAULT_TOLERANCE, min_gain: float = 0.01,
                 noise: Any = None, hold_out: set[int] | frozenset[int] = frozenset(),
                 gpu_bound_from: dict[tuple[int, int], float] | None = None,
                 host_bound_until: dict[tuple[int, int], float] | None = None,
                 picks: dict[tuple[str, int, int, int], tuple[str, float, float]] | None = None,
                 uses: Uses | None = None, forward_floor: Any = None, capture_size: int = 0,
                 others: list[Cells] | None = None,
                 vetoes: dict[Veto, set[str]] | None = None) -> tuple[ThresholdTable, pd.DataFrame]:
    """The table of the fewest-range fit (RULE) from measured cells, and per shape what it chose. The boundness maps
    (n, k) -> M come from measured forwards (calibrate.forward_model) and say how eager cells are judged
    (eager_model). `picks` (regime, n, k, m) -> (path, its ratio to all-aten, the top of that ratio's interval): a
    single path whose whole measured forward beat all-aten beyond the noise there (forward_model.picks_in_every_run);
    a forward measures what a cell cannot (host and GPU overlap across layers), so at its cells the path costs
    F.linear's cost times the forward's ratio, and its span test uses the interval's top. `uses` (model -> its
    shapes and counts): where, in the regime vLLM runs that M in (graph up to `capture_size`, eager above), a single
    path's count-weighted sum over a model's cells at one M beats the fit's by more than the per-forward tolerance
    (analysis.sum_exceeds; with `forward_floor` as validate judges it, without it at the point estimate, which the
    table pipeline uses so that a sum that passes on the fitting machine keeps the floor's margin on another), that
    path counts as won at those cells and the shapes are fitted again; where the sum still exceeds, it alone covers
    them (sum_picks). `others`: the same cells measured on other machines with the same tactics; each cell is then
    judged by the median machine (median_machine). `vetoes` (regime, n, k, m) -> paths: where a single path's whole
    measured forward was slower than all-aten beyond the noise (forward_model.slower_in_every_run), it cannot cover
    that M of the model's shapes, whatever its cells say."""
    among = dispatch_candidates(cells, base)
    problems: dict[tuple[str, int, int], Problem] = {}
    for n, k, ms in shapes_to_fit(cells, hold_out):
        for regime in REGIMES:
            hows = {m: ("graph",) if regime == "graph" else eager_model(
                m, (gpu_bound_from or {}).get((n, k)), (host_bound_until or {}).get((n, k))) for m in ms}
            judged = {m: "graph" if how == ("graph",) else "eager" for m, how in hows.items()}
            own = _machine_costs(cells, n, k, hows, among, noise, regime)
            barred: frozenset[tuple[int, str]] = frozenset()
            if others:
                theirs = [_machine_costs(o, n, k, hows, among, noise, regime) for o in others]
                barred = machine_bars(ms, [own, *theirs], among, tolerance, min_gain)
                own = median_machine(own, theirs)
            problems[(regime, n, k)] = Problem(ms, own[0], own[1], judged, frozenset(own[2]), barred)
    if not problems:
        raise HarnessError("nothing to fit: no shape has F.linear measured ok")

    def solve(forced: dict[tuple[str, int, int, int], str], strict: bool = True
              ) -> dict[tuple[str, int, int], list[tuple[int, str]]]:
        out = {}
        for (regime, n, k), (ms, raw, upper, _, alike, barred) in problems.items():
            cost, up = dict(raw), dict(upper)
            for m in ms:
                for vetoed in (vetoes or {}).get((regime, n, k, m), ()):
                    if vetoed != ATEN and (m, ATEN) in cost:  # F.linear then covers that M
                        cost.pop((m, vetoed), None)
                picked = (picks or {}).get((regime, n, k, m))
                if picked is not None and (m, picked[0]) in cost and (m, ATEN) in cost and (m, picked[0]) not in alike:
                    path, ratio, hi = picked  # the forward's ratio to all-aten stands for the cell's
                    cost[(m, path)] = min(cost[(m, ATEN)] * ratio, *(cost[(m, q)] for q in among if (m, q) in cost))
                    up[(m, path)] = hi
                must = forced.get((regime, n, k, m))
                # the picked path counts as won here (a vetoed one is not); strict: it alone covers this M
                if must is not None and ((m, must) in cost or must == ATEN):
                    for q in among:
                        if q != must and strict:
                            cost.pop((m, q), None)
                    up[(m, must)] = min(up.get((m, must), 1.0), 1 - min_gain - 1e-9) if must != ATEN else 1.0
            out[(regime, n, k)] = segment(ms, cost, up, among, tolerance, min_gain, alike=alike, barred=barred)
        return out

    choices = solve({})
    won = sum_picks(choices, problems, among, uses or {}, forward_floor, capture_size)
    forced: dict[tuple[str, int, int, int], str] = {}
    if won:  # the sum's path counts as won at its cells; where the sum still fails, it alone covers them
        choices = solve(won, strict=False)
        forced = sum_picks(choices, problems, among, uses or {}, forward_floor, capture_size)
        forced = {**won, **forced} if forced else {}
        if forced:
            choices = solve(forced)
    shapes_out: dict[tuple[int, int], dict[str, tuple]] = {}
    for (regime, n, k), per_m in choices.items():
        shapes_out.setdefault((n, k), {})[regime] = compress(per_m)
    report = [{"n": n, "k": k, "graph": describe_ranges(own["graph"]), "eager": describe_ranges(own["eager"]),
               "sum_picks": sorted({f"{r} M={m}" for (r, a, b, m) in won if (a, b) == (n, k)})}
              for (n, k), own in sorted(shapes_out.items())]
    table = ThresholdTable(base.profile, base.low_m_backend, {r: () for r in REGIMES}, shapes_out)
    return table, pd.DataFrame(report)


def sum_picks(choices: dict[tuple[str, int, int], list[tuple[int, str]]],
              problems: dict[tuple[str, int, int], Problem], among: list[str],
              uses: Uses, forward_floor: Any = None, capture_size: int = 0) -> dict[tuple[str, int, int, int], str]:
    """(regime, n, k, m) -> path: at each model and M that all the model's fitted shapes measured, in the regime vLLM
    runs that M in (graph up to capture_size, eager above; as validate judges per-forward sums), where the
    single path (F.linear where it does not run) with the lowest count-weighted cost sum beats the fit's choices
    beyond what validate allows (analysis.sum_exceeds), that path at the cells where it costs less than the fit's
    choice (which stays at the others: the sum then lies at or below the single path's)."""
    forced: dict[tuple[str, int, int, int], str] = {}
    for regime in REGIMES:
        for layers in uses.values():
            layers = [(n, k, c) for n, k, c in layers if (regime, n, k) in problems]
            if not layers:
                continue
            common = set.intersection(*(set(problems[(regime, n, k)].ms) for n, k, _ in layers))
            for m in sorted(x for x in common if (regime == "graph") == (x <= capture_size)):
                cost = {(n, k): problems[(regime, n, k)].cost for n, k, _ in layers}
                chosen = {(n, k): dict(choices[(regime, n, k)])[m] for n, k, _ in layers}
                fit_total = sum(c * cost[(n, k)][(m, chosen[(n, k)])] for n, k, c in layers)
                totals = {p: sum(c * cost[(n, k)].get((m, p), cost[(n, k)][(m, ATEN)]) for n, k, c in layers)
                          for p in among}
                best = min(totals, key=totals.get)
                gpu_only = all(problems[(regime, n, k)].judged[m] == "graph" for n, k, _ in layers)
                summed = "graph" if gpu_only else "eager"
                if sum_exceeds(fit_total / totals[best], summed, forward_floor):
                    for n, k, _ in layers:
                        if (m, best) in cost[(n, k)] and cost[(n, k)][(m, best)] < cost[(n, k)][(m, chosen[(n, k)])]:
                            forced[(regime, n, k, m)] = best
    return forced


def forward_picks(picks: dict[tuple[str, str, int], tuple[str, float, float]],
                  uses: dict[str, list[tuple[int, int, int]]], cells: Cells, hold_out: set[int] | frozenset[int],
                  measured: dict[tuple[str, str], list[int]] | None = None
                  ) -> dict[tuple[str, int, int, int], tuple[str, float, float]]:
    """The forward picks (regime, model, M) -> (path, ratio, top of interval) as (regime, n, k, m) for the model's
    cells, and for the cells' M between two picked M of the same path that the forwards measured next to each other
    (`measured`: (regime, model) -> the M its forwards measured; a forward measured at M = 1 and 8 speaks for 2 and
    4 as ranges do for unmeasured M; the worse of the two ratios stands there). Eager picks only: an eager forward
    measures what cells cannot (host and GPU overlap across layers), while the captured regime's cost adds up cell
    by cell, so a graph pick would stand for shapes whose own cells it is slower at."""
    out: dict[tuple[str, int, int, int], tuple[str, float, float]] = {}
    by_key: dict[tuple[str, str], list[tuple[int, tuple[str, float, float]]]] = {}
    for (regime, model, m), pick in picks.items():
        if regime == "eager" and m not in hold_out:
            by_key.setdefault((regime, model), []).append((m, pick))
    for (regime, model), ms in by_key.items():
        ms.sort()
        seen = sorted((measured or {}).get((regime, model), [m for m, _ in ms]))
        for n, k, _ in uses.get(model, []):
            for i, (m, pick) in enumerate(ms):
                out[(regime, n, k, m)] = pick
                if i + 1 >= len(ms) or ms[i + 1][1][0] != pick[0]:
                    continue
                nxt_m, nxt = ms[i + 1]
                if any(m < x < nxt_m for x in seen):
                    continue  # a forward measured between them and picked nothing there
                worse = (pick[0], max(pick[1], nxt[1]), max(pick[2], nxt[2]))
                for between in cells.ms(n, k):
                    if m < between < nxt_m and between not in hold_out:
                        out[(regime, n, k, between)] = worse
    return out


def range_counts(table: ThresholdTable) -> dict[str, float]:
    """Mean number of ranges per shape and regime as the table lists them (F.linear above the last one is not a
    range), the most in one, and the narrowest range as a share of its upper M."""
    counts, narrow = [], math.inf
    for own in table.shapes.values():
        for regime in REGIMES:
            ranges = own.get(regime, ())
            lo = 1
            pieces = 0
            for up, _ in ranges:
                narrow = min(narrow, (up - lo + 1) / up)
                lo, pieces = up + 1, pieces + 1
            counts.append(pieces)
    return {"mean_ranges": sum(counts) / len(counts) if counts else 0.0, "max_ranges": max(counts, default=0),
            "narrowest_share": narrow}


def refine_cells(table: ThresholdTable, cells: Cells, names: dict[tuple[int, int], str]) -> dict[str, list[int]]:
    """The cells a sweep measures before the final fit: per shape, the midpoint of every gap between two measured M
    where the table's choice changes in either regime (an unmeasured M takes the larger one's choice, so the gap is
    where that guess can be wrong). `names`: (n, k) -> shape name."""
    out: dict[str, set[int]] = {}
    for (n, k) in table.shapes:
        ms = [m for m in cells.ms(n, k) if cells.has(n, k, m, ATEN)]
        for regime in REGIMES:
            for m0, m1 in zip(ms, ms[1:]):
                if m1 - m0 >= 2 and table.choose(n, k, m0, regime) != table.choose(n, k, m1, regime):
                    out.setdefault(names[(n, k)], set()).add((m0 + m1) // 2)
    return {name: sorted(v) for name, v in sorted(out.items())}


def cells_spec(cells: dict[str, list[int]]) -> str:
    """bench run --cells' form of refine_cells' answer."""
    return ";".join(f"{name}:{','.join(map(str, ms))}" for name, ms in cells.items())
