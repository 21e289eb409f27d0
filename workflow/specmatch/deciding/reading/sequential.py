"""Repeats spent where they decide: a group-sequential design over repeats.

`repeats: {min: 2, max: N}` measures every cell `min` times; then, round by round, only the
configurations whose verdict is still inconclusive, and that another repeat can narrow, get one
more repeat (a Snakemake checkpoint per round, specmatch.deciding.rounds), until every verdict is decided or
`max` is reached. Looking at the data after every round and stopping when a verdict is decided is
optional stopping: tested at the fixed design's level every time, identical servers would be called
different more often than the confidence says, because each look is another chance to cross.

The error rate is kept by alpha spending (Lan & DeMets 1983). A comparison's log speedup at look j
(R_j repeats) is Z_j = estimate_j / se_j, with information I_j = 1 / se_j^2. The repeats are nested
(repeat R+1 adds to the data of R), so Cov(estimate_i, estimate_j) = Var(estimate_j) for i < j and
corr(Z_i, Z_j) = sqrt(I_i / I_j): the canonical joint distribution of group-sequential tests, which
holds here although the prompt sample's variance w is shared by every look (it only makes the
later looks more alike, which the correlation carries). The total two-sided error alpha =
1 - confidence is spent over the information fraction t = I_j / I_max with the Pocock-type function
alpha(t) = alpha * ln(1 + (e - 1) t) (spends early, so a large effect stops at `min`), and look j's
boundary c_j solves P(no crossing before j, |Z_j| > c_j) = alpha(t_j) - alpha(t_{j-1}) under that
joint normal. The verdict at look j is then the ordinary interval at the nominal level
1 - 2 (1 - Phi(c_j)) (with the comparison's own Student-t degrees of freedom), so every rule of
specmatch.deciding.verdicts.comparison applies unchanged. A fixed design (min = max) has one look at the full level.

Why this and not Bonferroni over looks: when w dominates, later looks barely add information and
their statistics are nearly the first one's; Bonferroni would spend alpha on them as if
independent and lose power for nothing. The boundaries use the information each look really has.

Which configurations continue (`continues`) does not affect the error rate (any stopping rule is
covered by the spending); it only decides where repeats are spent: an inconclusive verdict that the
remaining `max - R` repeats decide with probability at least `min_probability` (default MIN_DECIDE;
the preposterior of nested
designs: `chance_decided`). An interval that straddles both 1 and the edge of the band, or one
limited by the prompt sample, stops; `what would decide it` then names what would. Where the
design has a budget of cells per round (`max_cells`), the configurations likeliest to be decided are
measured first and the rest stop (specmatch.deciding.rounds): another stopping rule, covered alike.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy.special import ndtr

from ...stats import t_ppf_many

MIN_DECIDE = 0.25    # default: continue only where the remaining repeats decide a verdict with this probability
_DRAWS = 200_000     # Monte-Carlo draws for the boundaries (MC error of a level ~0.0005)
_GRID = 50           # information fractions rounded to 1/50 (cache key; a 2% change moves a level little)


@dataclass(frozen=True)
class Design:
    """Repeats per cell: `min` always, up to `max` where verdicts stay inconclusive and the remaining
    repeats decide them with probability at least `min_probability`."""
    min: int
    max: int
    min_probability: float = MIN_DECIDE
    max_cells: int | None = None     # cells a round may add at most (None: every continuing configuration's)

    @classmethod
    def of(cls, repeats) -> "Design":
        """`repeats` as the config writes it: an integer (a fixed design) or {min, max}."""
        if repeats is None:
            return cls(2, 2)
        p, cap = MIN_DECIDE, None
        if isinstance(repeats, dict):
            lo, hi = int(repeats["min"]), int(repeats.get("max", repeats["min"]))
            p = float(repeats.get("min_probability", MIN_DECIDE))
            cap = None if repeats.get("max_cells") is None else int(repeats["max_cells"])
        else:
            lo = hi = int(repeats)
        if lo < 1 or hi < lo:
            raise ValueError(f"repeats: need 1 <= min <= max, got min {lo}, max {hi}")
        if cap is not None and cap < 2:
            raise ValueError(f"repeats.max_cells: a round measures a configuration and its baseline (2 cells), got {cap}")
        if hi > lo and lo < 2:
            raise ValueError("repeats: a sequential design needs min >= 2 (one repeat cannot measure run-to-run "
                             "variation, so no verdict at the first look could be trusted)")
        return cls(lo, hi, p, cap)

    @property
    def sequential(self) -> bool:
        return self.max > self.min

    @property
    def looks(self) -> list[int]:
        return list(range(self.min, self.max + 1))

    def to_json(self) -> dict:
        out = {"min": self.min, "max": self.max, "min_probability": self.min_probability}
        return out if self.max_cells is None else out | {"max_cells": self.max_cells}


def spend(t: float, alpha: float) -> float:
    """Alpha spent by information fraction t (Lan-DeMets, Pocock type)."""
    t = min(max(t, 0.0), 1.0)
    return alpha * math.log(1 + (math.e - 1) * t)


@functools.lru_cache(maxsize=4096)
def _levels(fractions: tuple[float, ...], alpha: float, draws: int = _DRAWS) -> tuple[float, ...]:
    """Nominal two-sided levels of the looks at these information fractions (increasing, last 1)."""
    k = len(fractions)
    if k == 1:
        return (spend(fractions[0], alpha),)
    rng = np.random.default_rng(20261201)
    # Z_j = S_j / sqrt(I_j), S a sum of independent increments of variance I_j - I_{j-1}
    inc = np.diff(np.concatenate([[0.0], fractions]))
    s = np.cumsum(rng.standard_normal((draws, k)) * np.sqrt(np.maximum(inc, 1e-12)), axis=1)
    z = np.abs(s / np.sqrt(fractions))
    alive = np.ones(draws, bool)
    nd, out, spent = NormalDist(), [], 0.0
    for j in range(k):
        target = spend(fractions[j], alpha) - spent
        spent += target
        zj = z[alive, j]
        m = int(round(target * draws))         # crossings allowed at this look among those still alive
        if m <= 0 or zj.size == 0:
            c = float("inf")
        elif m >= zj.size:
            c = 0.0
        else:
            c = float(np.partition(zj, zj.size - m)[zj.size - m])
        out.append(2 * (1 - nd.cdf(c)) if math.isfinite(c) else 0.0)
        alive &= ~(z[:, j] >= c)
    return tuple(out)


_PREDICT_DRAWS = 20_000   # levels for predictions (comparison.decides_probability): MC error of a level ~0.002


@functools.lru_cache(maxsize=1024)
def design_levels(lo: int, hi: int, q: float, alpha: float) -> tuple[float, ...]:
    """Nominal two-sided levels (alpha spent) of the looks lo..hi of the design {min: lo, max: hi}, for a
    comparison whose last look's variance is a share q run to run (falling as 1/R) and 1 - q the prompt
    sample (w: every look's): what a design named in 'what would decide it' would test at each look.
    The caller rounds q (the levels barely move with it), so a process computes few of these."""
    var = [(1 - q) + q * hi / r for r in range(lo, hi + 1)]
    return _levels(fractions(var), alpha, _PREDICT_DRAWS)


def fractions(variances: list[float]) -> tuple[float, ...]:
    """Information fractions I_j / I_max of looks whose estimate has these variances (the last is the
    design's largest look), on a grid of 1/_GRID for the cache, strictly increasing by at least one
    grid step and ending at 1 (a look that adds almost no information still gets a sliver of alpha,
    and its boundary, next to the previous look's nearly identical statistic, stays finite)."""
    k, last = len(variances), variances[-1]
    raw = [round((last / v if v > 0 else 1.0) * _GRID) / _GRID for v in variances]
    out = []
    for j, f in enumerate(raw):
        f = min(f, 1.0 - (k - 1 - j) / _GRID)
        f = max(f, (out[-1] if out else 0.0) + 1.0 / _GRID)
        out.append(f)
    out[-1] = 1.0
    return tuple(out)


def look_confidence(design: Design, confidence: float, repeats: int, w: float, run_to_run: float) -> float:
    """The confidence of the verdict at the look with `repeats` repeats, for a comparison whose
    variance is w + run_to_run at those repeats (run_to_run: the run-to-run part of the repeat
    average, which falls as 1/R). A fixed design, a comparison outside the design's looks or one
    without run-to-run variation gets `confidence` unchanged."""
    if not design.sequential or repeats < design.min or run_to_run <= 0:
        return confidence
    R = min(repeats, design.max)
    b1 = run_to_run * repeats
    looks = list(range(design.min, R + 1))
    var = [w + b1 / r for r in looks] + ([w + b1 / design.max] if R < design.max else [])
    lv = _levels(fractions(var), 1 - confidence)
    return 1 - lv[len(looks) - 1]


def final_dof(w, w_dof, run_to_run_end, b_dof, repeats, rmax, share=1.0) -> np.ndarray:
    """Satterthwaite's degrees of freedom of the final look's variance w + run_to_run_end (the repeat mean's
    run-to-run part after rmax repeats): the prompt sample's part with its own dof, run to run with the dof
    it will have then. Today's b_dof comes from `repeats` repeats of the cells the pooled estimate reads,
    (repeats - 1) dof each; the remaining repeats add (rmax - repeats) to the `share` of those cells that
    are measured again, so it grows by 1 + share (rmax - repeats) / (repeats - 1): (rmax - 1) /
    (repeats - 1) where every cell is (share 1), less where a round re-measures only the configurations
    that continue (deciding.rounds). Taking today's dof made the final interval wider than it will be
    (the rounds stopped configurations the remaining repeats would decide); taking every cell's growth
    where few are re-measured made it narrower (the chance ran high: 0.55 stated, 0.44 realised).
    Arrays broadcast."""
    w, w_dof, b, b_dof = (np.asarray(x, float) for x in (w, w_dof, run_to_run_end, b_dof))
    r = np.asarray(repeats, float)
    grow = 1 + np.asarray(share, float) * (np.asarray(rmax, float) - r) / np.maximum(r - 1, 1.0)
    d_end = np.where(np.isfinite(b_dof), b_dof * grow, np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        den = (np.where(np.isfinite(w_dof) & (w_dof > 0), w * w / np.where(w_dof > 0, w_dof, 1.0), 0.0)
               + np.where(np.isfinite(d_end) & (d_end > 0), b * b / np.where(d_end > 0, d_end, 1.0), 0.0))
        return np.where(den > 0, (w + b) ** 2 / np.where(den > 0, den, 1.0), np.inf)


def settled_share(step) -> tuple[float, object]:
    """The share of the run-to-run dof a round measures again, as a round finds it: `step(share)` decides
    the round assuming that share and returns (what it decided, the share that measures); start from
    every cell (1) and assume what was measured until it measures no less than assumed (the share only
    falls, so this ends). Returns (the share assumed, what it decided there). deciding.rounds.plan's, and
    what 'what would decide it' assumes the rounds measure (comparison.rounds_shares)."""
    share = 1.0
    while True:
        got, measured = step(share)
        if measured >= share - 1e-12:
            return share, got
        share = measured


def dof_share(repeats_by_cell: dict, again: set, repeats: int) -> float:
    """final_dof's `share` from the cells themselves: what one more repeat of the cells `again` adds to a
    pooled run-to-run estimate that reads every cell with two repeats or more ((its repeats - 1) dof each),
    over what measuring every cell again would add: |again read| (repeats - 1) / sum of (R_k - 1).
    `repeats_by_cell`: cell -> its repeats so far."""
    now = sum(r - 1 for r in repeats_by_cell.values() if r >= 2)
    if now <= 0:
        return 1.0
    read = sum(1 for key in again if repeats_by_cell.get(key, 0) >= 2)
    return min(1.0, read * max(repeats - 1, 1) / now)


def chance_decided_many(estimate, w, run_to_run, repeats: int, design: Design, confidence: float, band: float,
                        w_dof, b_dof, share=1.0, quantile=t_ppf_many) -> np.ndarray:
    """chance_decided for many comparisons at once (arrays broadcast; `repeats` one number): what the
    rounds compute for each configuration, and what 'what would decide it' simulates at every look a
    design makes (comparison.decides_probability), so the statement and the workflow's futility stops
    are one rule. `share`: of the cells the run-to-run estimate reads, the share the remaining repeats
    measure again (final_dof). `quantile(p, dof)`: the t quantiles (a table's, where a simulation asks for
    millions: verdicts.designs)."""
    est, w, rr = (np.asarray(x, float) for x in (estimate, w, run_to_run))
    shape = np.broadcast_shapes(est.shape, w.shape, rr.shape, np.shape(w_dof), np.shape(b_dof))
    if repeats >= design.max:
        return np.zeros(shape)
    b1 = rr * repeats
    v_now, v_end = w + b1 / repeats, w + b1 / design.max
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(v_end > 0, (b1 / design.max) / np.where(v_end > 0, v_end, 1.0), 1.0)
    qr = np.round(np.broadcast_to(q, shape) * 20) / 20
    level = np.empty(shape)
    for u in np.unique(qr):
        level[qr == u] = 1 - design_levels(design.min, design.max, float(u), 1 - confidence)[-1]
    dof = np.broadcast_to(final_dof(w, w_dof, b1 / design.max, b_dof, repeats, design.max, share), shape)
    h = quantile(0.5 + level / 2, dof) * np.sqrt(np.maximum(v_end, 0.0))
    sd = np.sqrt(np.maximum(v_now - v_end, 1e-300))
    prob = ndtr((est - h) / sd) + ndtr((-h - est) / sd)
    inner = np.minimum(np.maximum(band - h, 0.0), h)   # where band > 2h every estimate decides: the union is 1
    prob = prob + np.where(band > h, ndtr((inner - est) / sd) - ndtr((-inner - est) / sd), 0.0)
    return np.where(rr > 0, np.minimum(prob, 1.0), 0.0)


def chance_decided(estimate: float, w: float, run_to_run: float, repeats: int, design: Design,
                   confidence: float, band: float, w_dof: float, b_dof: float, share: float = 1.0) -> float:
    """The probability that the comparison, measured up to the design's max repeats, ends decided
    (its final interval excludes 0, or lies within +/-band), given today's data: the preposterior of
    nested designs. Today's estimate has variance V = w + b1/R, the final one V' = w + b1/max; given
    today's data the final estimate is normal around today's with variance V - V' (flat prior on the
    effect), and its interval's half-width is the final look's quantile (at the dof it will have:
    final_dof, with `share` of the pooled cells measured again) times sqrt(V'). A closed form, cheap enough for every round and for every simulated look
    of 'what would decide it' (comparison.decides_probability), which simulates these futility stops so
    that what it states is what the rounds carry out; checked against simulated truth
    (tests/test_sequential.py)."""
    if repeats >= design.max or run_to_run <= 0:
        return 0.0
    return float(chance_decided_many(estimate, w, run_to_run, repeats, design, confidence, band, w_dof, b_dof,
                                     share))


def continues(estimate: float, w: float, run_to_run: float, repeats: int, design: Design, confidence: float,
              band: float, w_dof: float, b_dof: float, share: float = 1.0) -> bool:
    """Whether more repeats are worth spending on an inconclusive comparison: the design's remaining
    repeats decide it with probability at least the design's min_probability (chance_decided). Where
    the prompt sample's variance w dominates, more repeats barely narrow the interval and the
    probability is small: 'what would decide it' names a larger suite instead."""
    return chance_and_continues(estimate, w, run_to_run, repeats, design, confidence, band, w_dof, b_dof, share)[1]


def chance_and_continues(estimate: float, w: float, run_to_run: float, repeats: int, design: Design,
                         confidence: float, band: float, w_dof: float, b_dof: float,
                         share: float = 1.0) -> tuple[float, bool]:
    """(chance_decided, continues) computed once: what a round records and what it does."""
    if repeats >= design.max or run_to_run <= 0:
        return 0.0, False
    p = chance_decided(estimate, w, run_to_run, repeats, design, confidence, band, w_dof, b_dof, share)
    return p, p >= design.min_probability
