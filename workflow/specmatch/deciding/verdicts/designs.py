"""What would decide an inconclusive verdict: designs, and the effects they decide.

An inconclusive verdict names two designs, each with a power statement at a named effect:

- **an effect**: the cheapest design (more repeats, a larger suite) that decides the comparison, pays or
  loses as the truth is, with probability TARGET if the speedup lies outside [lo, hi]; it aims at
  effects of DETECT x min_effect and says how close to no difference it reaches;
- **no difference**: the cheapest design that confirms it (equivalent within +/-min_effect) with
  probability TARGET if the speedup is exactly 1.00.

A power statement holds for any truth at its effect: it needs no prior on the effect, and it can be
checked on identical servers (the equivalence design) and on any spread of effects (the effect design at
the truth). A predictive probability over the effect cannot: no prior serves identical servers and
spread effects at once (docs/methods/calibration.md).

Each probability is conditional on today's data and the named effect theta, by simulation
(`power`), the design carried out as the workflow would:

1. today's error e = estimate - theta, split into the prompt sample's part (variance w, shared by every
   repeat of today's suite) and the repeats' mean (variance b = b1 / R, b1 one repeat's run to run) as
   their normal conditional given e;
2. the data the design adds: more repeats of today's suite (g = 1) keep today's data (at R'' repeats the
   estimate is theta + prompt part + (R x today's repeat mean + R'' - R new sessions) / R''); a larger
   suite (g > 1) reruns every cell (a fresh prompt part of variance w / g, fresh sessions whose requests'
   own noise averages over g times the requests: `larger_suite`);
3. the variances the analysis will then estimate: run to run with the dof the new repeats add (all cells in
   a fixed design; under the sequential design the share of cells the rounds measure again:
   Comparison.round_shares), the prompt sample's w as today or re-estimated from the new suite;
4. the verdict at each look the design makes (one at R' in a fixed design; every look of repeats {min,
   max: R'} at its alpha-spending level under the sequential design, stopping at the first decided), and
   the rounds' futility stops (sequential.chance_decided_many below min_probability) at every look.

The true run-to-run variance is not today's estimate taken at face value: each draw takes it from its
posterior given today's estimate and its dof (a scaled inverse chi-square; the estimate is already shrunk
toward the pooled level, noise.run_to_run). With R = 2 it rests on about 5 dof, and where it ran low the
search names a short design that then decides less often than stated: that is measured and stated in
docs/methods/calibration.md, and the statement says what it rests on.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..reading import sequential
from ..reading.measurements import Settings
from ...records import Decision, Verdict
from ...stats import t_ppf, t_ppf_many
from .comparison import Comparison, look_level, log_interval, decision, variance_split
from .noise import VarianceSum

SUITE_SCALES = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32)
MAX_REPEATS = 64
MAX_SEQUENTIAL = 32     # a sequential design's looks are each simulated: repeats beyond this are not named
TARGET = 0.8
DETECT = 2.0            # the effect design aims at speedups beyond +/- DETECT x min_effect
DESIGN_DRAWS = 400      # per design while searching (the same draws for every design: common random numbers)
CONFIRM_DRAWS = 2000    # fresh draws for a design the search found: the probability stated (MC se <= 1.1%)
CONFIRMS = 8            # designs confirmed at most before naming the likeliest
DESIGN_BATCH = 64
BISECTIONS = 7          # the effect bounds: each side to 1/128 of DETECT x min_effect
# what a design carried out ends in: decided equivalent, pays or loses, stopped by the rounds as unlikely to be
# decided, or undecided at its last look
OUTCOMES = ("equivalent", "pays", "loses", "futile", "open")


# -- the rounds' chance ------------------------------------------------------------------------------
def _b_dof(rr_parts: list) -> float:
    return VarianceSum({i: [v, d] for i, (v, d) in enumerate(rr_parts)}).dof if rr_parts else float("inf")


def _design_question(cmp: Comparison, design: sequential.Design, s: Settings, share: float) -> tuple:
    """The arguments of sequential.chance_decided and sequential.continues for this comparison."""
    w, w_dof, b, rr_parts = variance_split(cmp)
    return (cmp.estimate, w, b, cmp.repeats, design, s.confidence, math.log(1 + s.min_effect), w_dof, _b_dof(rr_parts),
            share)


def chance(cmp: Comparison, design: sequential.Design, s: Settings, share: float = 1.0) -> float:
    """sequential.chance_decided for this comparison under `design`: the chance, under a flat prior on the
    effect given today's estimate, that the design's remaining repeats decide it. The rounds rank and stop
    configurations by it (a futility bar); it is not a forecast at any one effect (an inconclusive
    estimate sits near a boundary: where the truth is 0 it falls back, where it is well beyond the band
    it moves on). `share`: of the cells the run-to-run estimate reads, the share measured again."""
    return sequential.chance_decided(*_design_question(cmp, design, s, share))


def continues(cmp: Comparison, design: sequential.Design, s: Settings, share: float = 1.0) -> bool:
    """sequential.continues for this comparison under `design`: the rule by which the rounds continue a
    configuration (deciding.rounds) and by which `power` stops a simulated one."""
    return sequential.continues(*_design_question(cmp, design, s, share))


def chance_and_continues(cmp: Comparison, design: sequential.Design, s: Settings,
                         share: float = 1.0) -> tuple[float, bool]:
    """chance and continues for this comparison, computed once (what a round records and does)."""
    return sequential.chance_and_continues(*_design_question(cmp, design, s, share))


def undecided(cmp: Comparison, s: Settings) -> bool:
    """Whether the comparison is inconclusive today on data that could still move (not frozen by the
    sequential design, run to run measured)."""
    if cmp.frozen is not None or not cmp.run_to_run or cmp.estimate is None or cmp.se is None:
        return False
    return decision(*log_interval(cmp, look_level(cmp, s)), math.log(1 + s.min_effect), True) == Decision.INCONCLUSIVE


def rounds_shares(cmps: list[Comparison], s: Settings, repeats_by_cell: dict) -> None:
    """Comparison.round_shares for every comparison in `cmps` (of the servers the rounds run together,
    on the metric they decide by) under the sequential design: for each design max a statement may
    name, the share of the run-to-run dof that a round measures again, as deciding.rounds.plan finds it
    (every undecided configuration the rounds would continue, until the share assumed is no more than the
    share they measure), with the comparison's own cells added (the statement simulates it continued).
    Held at today's set for every look: configurations decided on the way stop, so later looks get
    somewhat less. Not modelled: the k sweeps' member-against-member pairs, and a round budget."""
    if not s.design.sequential:
        return
    open_ = [c for c in cmps if undecided(c, s)]
    if not open_:
        return
    R = max(c.repeats for c in open_)
    maxes = sorted({Rn for c in open_ for Rn, _g in candidate_designs(c, s)} | {s.design.max})
    for mx in maxes:
        design = sequential.Design(s.design.min, int(mx), s.design.min_probability)

        def step(share, design=design):
            again = {cell for c in open_ if c.repeats < design.max and continues(c, design, s, share)
                     for cell in ((c.server, c.suite, c.concurrency), (c.against, c.suite, c.concurrency))}
            return again, sequential.dof_share(repeats_by_cell, again, R)

        _share, again = sequential.settled_share(step)
        for c in open_:
            mine = {(c.server, c.suite, c.concurrency), (c.against, c.suite, c.concurrency)}
            c.round_shares[int(mx)] = max(c.own_share, sequential.dof_share(repeats_by_cell, again | mine, c.repeats))


# -- the candidates ----------------------------------------------------------------------------------
def candidate_designs(cmp: Comparison, s: Settings) -> list[tuple[int, float]]:
    """(repeats R', suite scale g) that could decide the comparison, cheapest first (cost R' x g: each
    repeat runs every cell again, a larger suite makes each cell longer): every R' up to MAX_REPEATS
    under a fixed design; under a sequential one, whose every look is simulated, R + 1 .. R + 4 and a
    few more up to MAX_SEQUENTIAL. Designs whose data could not narrow the interval are left out."""
    R = cmp.repeats
    w, _, b, _ = variance_split(cmp)
    V = w + b
    if s.design.sequential:
        reps = sorted({r for r in [*range(R + 1, R + 5), 8, 12, 16, 24, 32] if R < r <= MAX_SEQUENTIAL}
                      | {max(R, s.design.min)})
    else:
        reps = list(range(R, MAX_REPEATS + 1))
    return [(Rn, g) for _, Rn, g in sorted((Rn * g, Rn, g) for Rn in reps for g in SUITE_SCALES
                                           if (Rn, g) != (R, 1) and Rn >= 1
                                           and w / g + larger_suite(b * R, cmp.request_noise, g) / Rn < V)]


def larger_suite(b1, request_noise: float, g):
    """One repeat's run-to-run variance b1 (arrays broadcast) in a suite g times larger: its requests' own
    noise (Comparison.request_noise) averages over g times the requests; the sessions' and cells' own
    conditions do not. At least b1 / g (all of it request noise)."""
    g = np.asarray(g, float)
    b1 = np.asarray(b1, float)
    out = np.where(g > 1, np.maximum(b1 - request_noise * (1 - 1 / np.maximum(g, 1.0)), b1 / np.maximum(g, 1.0)), b1)
    return float(out) if out.ndim == 0 else out


def _looks(s: Settings, R: int, Rn: int, g: float) -> tuple[list[int], int]:
    """The looks at which a design (R' repeats, suite scale g) is decided as the workflow would carry it
    out, and the smallest repeats of its design: a fixed design has one look, at R'; a sequential one
    (repeats {min, max: R'}) looks at every repeat from min on and stops at the first decided, of which
    the looks up to today's R (more repeats of today's suite) were today's, inconclusive."""
    lo = s.design.min
    if not s.design.sequential or Rn <= lo:
        return [Rn], Rn
    first = R + 1 if g == 1 else lo
    return list(range(max(first, lo), Rn + 1)), lo


# -- the simulation ----------------------------------------------------------------------------------
@dataclass
class _Today:
    """One comparison's data today, and per draw what the simulation assumes of the truth."""
    R: int
    w: float
    w_dof: float
    b1: float
    b_dof: float
    theta: np.ndarray       # the named effect, per draw
    p_now: np.ndarray       # today's prompt-sample error, per draw
    r_now: np.ndarray       # today's repeat-mean error, per draw
    b1_true: np.ndarray     # one repeat's true run-to-run variance, per draw
    requests: float         # Comparison.request_noise


def power(cmp: Comparison, s: Settings, designs: list, theta: float, rng: np.random.Generator,
          draws: int = DESIGN_DRAWS) -> dict[str, np.ndarray]:
    """For each design (repeats R', suite scale g): how carrying it out ends, given today's data and a true
    log speedup `theta` (the module's docstring): {outcome: share of draws per design} over OUTCOMES."""
    R = cmp.repeats
    w, w_dof, b, rr_parts = variance_split(cmp)
    b_dof = _b_dof(rr_parts)
    b1 = b * R
    n = draws
    b1_true = (b1 / np.maximum(_chi2_over_dof(rng, b_dof, (n,)), 1e-3) if math.isfinite(b_dof) else np.full(n, b1))
    b_true = b1_true / R
    V_true = w + b_true
    e = cmp.estimate - theta
    with np.errstate(divide="ignore", invalid="ignore"):
        p_now = np.where(V_true > 0, e * w / V_true + np.sqrt(np.maximum(w * b_true / V_true, 0.0))
                         * rng.standard_normal(n), 0.0)
    today = _Today(R, w, w_dof, b1, b_dof, np.full(n, theta), p_now, e - p_now, b1_true, cmp.request_noise)
    out = np.zeros((len(OUTCOMES), len(designs)))
    plan = [(i, *_looks(s, R, int(Rn), float(g))) for i, (Rn, g) in enumerate(designs)]
    one = [i for i, looks, lo in plan if len(looks) == 1 and looks[0] == lo]   # fixed: one look, at s.confidence
    if one:
        out[:, one] = _ends(s, today, [designs[i] for i in one], [[designs[i][0]] for i in one],
                            np.full((1, len(one), 1), s.confidence), rng)
    for i, looks, lo in plan:
        if i in one:
            continue
        Rn, g = designs[i]
        stops = sequential.Design(lo, int(Rn), s.design.min_probability)
        share = cmp.round_shares.get(int(Rn), cmp.own_share)
        if g == 1 and lo <= R < Rn and not continues(cmp, stops, s, share):
            out[OUTCOMES.index("futile"), i] = 1.0   # the rounds would stop it at today's look (deciding.rounds)
            continue
        bg = larger_suite(b1, cmp.request_noise, g)
        q = (bg / Rn) / (w / g + bg / Rn) if (w / g + bg / Rn) > 0 else 1.0
        lv = sequential.design_levels(lo, int(Rn), round(q * 20) / 20, 1 - s.confidence)
        level = np.array([1 - lv[j - lo] for j in looks])[None, None, :]
        out[:, i] = _ends(s, today, [designs[i]], [looks], level, rng, stops, share)[:, 0]
    return dict(zip(OUTCOMES, out))


def _ends(s: Settings, t: _Today, designs: list, looks: list, level: np.ndarray, rng: np.random.Generator,
          stops: sequential.Design | None = None, share: float = 1.0) -> np.ndarray:
    """power's steps 2-4 for designs that make the same number of looks (draws x designs x looks at once):
    the share of draws in each of OUTCOMES (outcomes x designs). With `stops` (a sequential design), a
    draw undecided at a look before the last stops there undecided where the rounds would stop it
    (sequential.chance_decided_many below stops.min_probability, on the look's own estimate and
    variances). `share`: of the run-to-run dof, the share each look under `stops` measures again."""
    R, w, w_dof, b1, b_dof = t.R, t.w, t.w_dof, t.b1, t.b_dof
    share = share if stops is not None else 1.0   # a fixed design measures every cell R' times
    n, m, k = len(t.theta), len(designs), len(looks[0])
    band = math.log(1 + s.min_effect)
    g = np.array([float(d[1]) for d in designs])[None, :, None]
    L = np.array(looks, float)[None, :, :]
    nested = g == 1
    bt = larger_suite(t.b1_true[:, None, None], t.requests, g)
    start = np.where(nested[0, :, 0], R, 0)[:, None]
    steps = np.diff(np.concatenate([start, L[0]], axis=1), axis=1)[None]          # new sessions per look
    sessions = np.cumsum(rng.standard_normal((n, m, k)) * np.sqrt(bt * steps), axis=2)
    fresh_prompts = np.sqrt(w / g) * rng.standard_normal((n, m, 1))
    x = t.theta[:, None, None] + np.where(nested, t.p_now[:, None, None] + (R * t.r_now[:, None, None] + sessions) / L,
                                          fresh_prompts + sessions / L)
    if math.isfinite(b_dof):
        # under the sequential design more repeats of today's suite measure again only the configurations
        # the rounds continue (at least this one's cells: `share`); a fixed design and a larger suite
        # measure every cell
        d_L = np.maximum(np.where(nested, b_dof * (1 + share * (L - R) / max(R - 1, 1)),
                                  b_dof * (L - 1) / max(R - 1, 1)), 1e-9)
        d_prev = np.concatenate([np.where(nested, b_dof, 0.0), d_L[:, :, :-1]], axis=2)
        inc = np.maximum(d_L - d_prev, 0.0)
        ss = np.where(nested, b_dof * b1, 0.0) + np.cumsum(bt * inc * _chi2_over_dof(rng, inc, (n, m, k)), axis=2)
        b1_hat = ss / d_L
    else:
        d_L, b1_hat = np.full((1, m, k), np.inf), np.broadcast_to(bt, (n, m, k))
    if math.isfinite(w_dof):
        dw = np.where(nested, w_dof, np.maximum(1.0, (w_dof + 1) * g - 1))
        w_hat = np.where(nested, w, (w / g) * _chi2_over_dof(rng, dw, (n, m, 1)))
    else:
        dw, w_hat = np.full((1, m, 1), np.inf), np.broadcast_to(w / g, (n, m, 1))
    v_hat = w_hat + b1_hat / L
    with np.errstate(divide="ignore", invalid="ignore"):
        den = np.where(np.isfinite(dw), w_hat ** 2 / dw, 0.0) + (b1_hat / L) ** 2 / d_L
        dof = np.where(den > 0, v_hat ** 2 / den, np.inf)
    h = _quantiles(0.5 + level / 2, np.broadcast_to(dof, (n, m, k))) * np.sqrt(v_hat)
    ax = np.abs(x)
    eq = ax < band - h
    hit = (ax > h) | eq
    if stops is None or k == 1:
        got = hit.any(2)
        first = np.argmax(hit, axis=2)[..., None]
        equiv = np.take_along_axis(eq, first, axis=2)[..., 0] & got
        up = (np.take_along_axis(x, first, axis=2)[..., 0] > 0) & got & ~equiv
        return np.stack([equiv.mean(0), up.mean(0), (got & ~equiv & ~up).mean(0), np.zeros(m), (~got).mean(0)])
    alive = np.ones((n, m), bool)
    equiv, up, down, futile = (np.zeros((n, m), bool) for _ in range(4))
    b_hat, b_dofs = np.broadcast_to(b1_hat, (n, m, k)), np.broadcast_to(d_L, (1, m, k))
    w_now, w_dofs = np.broadcast_to(w_hat, (n, m, 1))[:, :, 0], np.broadcast_to(dw, (1, m, 1))[:, :, 0]
    for j in range(k):
        now = alive & hit[:, :, j]
        equiv |= now & eq[:, :, j]
        up |= now & ~eq[:, :, j] & (x[:, :, j] > 0)
        down |= now & ~eq[:, :, j] & (x[:, :, j] < 0)
        alive &= ~hit[:, :, j]
        Lj = int(looks[0][j])
        if j == k - 1 or not alive.any():
            break
        go = sequential.chance_decided_many(x[:, :, j], w_now, b_hat[:, :, j] / Lj, Lj, stops, s.confidence, band,
                                            w_dofs, b_dofs[:, :, j], share, quantile=_tabled)
        futile |= alive & (go < stops.min_probability)
        alive &= go >= stops.min_probability
    return np.stack([equiv.mean(0), up.mean(0), down.mean(0), futile.mean(0), alive.mean(0)])


_DOFS = np.concatenate([np.arange(1.0, 30.01, 0.25), [32, 36, 40, 50, 60, 80, 100, 150, 200, 400, 1000]])


@functools.lru_cache(maxsize=512)
def _t_table(p: float) -> tuple[np.ndarray, np.ndarray]:
    """t quantiles at p over 1/dof (0: the normal's), for interpolating many dofs at once."""
    inv = np.concatenate([[0.0], 1 / _DOFS[::-1]])
    return inv, np.concatenate([[t_ppf(p, float("inf"))], t_ppf_many(np.full(len(_DOFS), p), _DOFS[::-1])])


def _tabled(p, dof) -> np.ndarray:
    """t quantiles at p (arrays broadcast) for many dofs, interpolated in 1/dof from a table per level."""
    p, dof = np.broadcast_arrays(np.asarray(p, float), np.asarray(dof, float))
    out = np.empty(dof.shape)
    for u in np.unique(p):
        at = p == u
        inv, q = _t_table(float(u))
        out[at] = np.interp(1 / np.maximum(dof[at], 1.0), inv, q)
    return out


def _quantiles(p: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """t quantiles at p (1 x designs x looks) for dof (draws x designs x looks)."""
    return _tabled(np.broadcast_to(p, dof.shape), dof)


def _chi2_over_dof(rng: np.random.Generator, dof, shape) -> np.ndarray:
    """chi-square(dof) / dof draws (1 where dof is infinite; 0 where it is 0: no new data): exact for
    one dof, Wilson-Hilferty's cube of a normal for a dof per element (many at once, cheaply)."""
    dof = np.broadcast_to(np.asarray(dof, float), shape)
    ok = np.isfinite(dof) & (dof > 0)
    out = np.where(np.isfinite(dof), 0.0, 1.0)
    if not ok.any():
        return out
    d = np.where(ok, dof, 1.0)
    if d.size and np.all(d == d.flat[0]):
        x = rng.chisquare(float(d.flat[0]), shape) / d
    else:
        kk = 2 / (9 * d)
        x = np.maximum(1 - kk + np.sqrt(kk) * rng.standard_normal(shape), 0.0) ** 3
    return np.where(ok, x, out)


# -- the statements ----------------------------------------------------------------------------------
def detect_effect(s: Settings) -> float:
    """The log speedup the effect design aims at: DETECT x min_effect either way."""
    return math.log(1 + DETECT * s.min_effect)


def decided_as_true(ends: dict, theta: float) -> np.ndarray:
    """The share decided as the truth `theta` is: equivalent at 0, pays above, loses below."""
    return ends["equivalent"] if theta == 0 else ends["pays"] if theta > 0 else ends["loses"]


def _seeded(s: Settings, what: str, cmp: Comparison) -> int:
    """A seed per comparison and statement: every named effect of one search draws the same numbers
    (common random numbers), so the probabilities of nearby effects differ by the effect, not the draws."""
    key = (cmp.server, cmp.against, cmp.suite, cmp.concurrency, cmp.metric)
    return int(s.rng(what, *key).integers(2 ** 62))


def _powers(cmp: Comparison, s: Settings, designs: list, thetas: list, seed: int, draws: int) -> np.ndarray:
    """min over `thetas` of the share decided as each truth is (one row per design): the same draws for
    every theta."""
    got = [decided_as_true(power(cmp, s, designs, th, np.random.default_rng(seed), draws), th) for th in thetas]
    return np.min(np.array(got), axis=0)


def _cheapest(cmp: Comparison, s: Settings, todo: list, thetas: list, what: str) -> tuple[tuple, float, bool, int]:
    """The cheapest design of `todo` that decides every truth in `thetas` with probability >= TARGET, its
    probability (CONFIRM_DRAWS fresh draws: a design the search's draws found would otherwise be stated
    high, chosen because its draws were lucky), True, and the fresh draws' seed; where none is confirmed,
    the likeliest and False. The search's draws are the same for every design (common random numbers)."""
    seed, fresh = _seeded(s, what, cmp), _seeded(s, what + "-confirm", cmp)
    best, confirmed = None, []
    batch = DESIGN_BATCH if not s.design.sequential else max(1, DESIGN_BATCH // 8)
    for i in range(0, len(todo), batch):
        chunk = todo[i:i + batch]
        ps = _powers(cmp, s, chunk, thetas, seed, DESIGN_DRAWS)
        for d, p in zip(chunk, ps):
            if best is None or p > best[0] + 1e-9:
                best = (float(p), d)
            if p >= TARGET and len(confirmed) < CONFIRMS:
                pc = float(_powers(cmp, s, [d], thetas, fresh, CONFIRM_DRAWS)[0])
                if pc >= TARGET:
                    return d, pc, True, fresh
                confirmed.append((pc, d))
    if not confirmed:
        confirmed.append((float(_powers(cmp, s, [best[1]], thetas, fresh, CONFIRM_DRAWS)[0]), best[1]))
    pc, d = max(confirmed, key=lambda x: x[0])
    return d, pc, False, fresh


def _bound(cmp: Comparison, s: Settings, d: tuple, sign: int, far: float, seed: int) -> float | None:
    """The effect nearest no difference on one side (sign) at which design d decides, as the truth is,
    with probability >= TARGET, by bisection between 0 and `far` (where it does), on the same draws for
    every effect; None where it does not at `far`."""
    def ok(th):
        return float(_powers(cmp, s, [d], [sign * th], seed, CONFIRM_DRAWS)[0]) >= TARGET

    if not ok(far):
        return None
    lo, hi = 0.0, far
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _design(cmp: Comparison, d: tuple, p: float, reachable: bool, **more) -> dict:
    repeats, g = d
    return {"repeats": int(repeats), "suite_scale": float(g),
            "prompts": int(math.ceil(cmp.prompts * g)) if cmp.prompts else None,
            "probability": round(p, 3), "reachable": bool(reachable), **more}


def effect_design(cmp: Comparison, s: Settings, todo: list) -> dict:
    """The effect statement: the cheapest design that decides speedups beyond +/- DETECT x min_effect (pays
    or loses, as the truth is) with probability >= TARGET, and the effects it decides so, [lo, hi] on the
    speedup scale (the bounds of the 'outside' it states; probability: at the nearer-to-TARGET end of the
    aimed-at effects). Where no candidate reaches it, the likeliest, its bounds as far as a speedup of 2x
    or 0.5x (None beyond)."""
    far = detect_effect(s)
    d, p, reached, seed = _cheapest(cmp, s, todo, [far, -far], "design-effect")
    reach = far if reached else math.log(2.0)   # reached: both sides decide there on these very draws
    hi, lo = _bound(cmp, s, d, 1, reach, seed), _bound(cmp, s, d, -1, reach, seed)
    return _design(cmp, d, p, reached, lo=None if lo is None else round(math.exp(-lo), 4),
                   hi=None if hi is None else round(math.exp(hi), 4))


def equivalence_design(cmp: Comparison, s: Settings, todo: list) -> dict:
    """The no-difference statement: the cheapest design that confirms no difference (equivalent within
    +/-min_effect) with probability >= TARGET if the speedup is exactly 1, or the likeliest."""
    d, p, reached, _seed = _cheapest(cmp, s, todo, [0.0], "design-equivalence")
    return _design(cmp, d, p, reached)


def deciding_designs(cmp: Comparison, s: Settings) -> dict | None:
    """{"effect": effect_design, "equivalence": equivalence_design} for an inconclusive comparison with run
    to run measured; None where no candidate design could narrow its interval."""
    if not cmp.run_to_run or cmp.estimate is None or cmp.se is None:
        return None
    todo = candidate_designs(cmp, s)
    if not todo:
        return None
    return {"effect": effect_design(cmp, s, todo), "equivalence": equivalence_design(cmp, s, todo)}


def _what(d: dict, cmp: Comparison, s: Settings) -> str:
    """A design in the config's words."""
    seq = s.design.sequential and d["repeats"] > s.design.min
    # the simulation measures every configuration the rounds continue: a round budget, which may stop this one
    # over budget for others likelier to be decided, is not part of the design it names
    budget = ", max_cells: null" if s.design.max_cells is not None else ""
    parts = [(f"up to {d['repeats']} repeats (repeats: {{min: {s.design.min}, max: {d['repeats']}{budget}}})" if seq
              else f"{d['repeats']} repeats") if d["repeats"] != cmp.repeats or d["suite_scale"] != 1 else "",
             (f"a suite {d['suite_scale']:g}x larger" + (f" ({d['prompts']} prompts)" if d["prompts"] else "")
              + " measured afresh") if d["suite_scale"] != 1 else ""]
    return " and ".join(x for x in parts if x)


def what_would_decide(cmp: Comparison, s: Settings) -> tuple[str, dict | None]:
    """The text and the designs (deciding_designs) of an inconclusive verdict."""
    if not cmp.run_to_run:
        return ("repeats: 2 or more would measure run-to-run variation (with one repeat a verdict needs an effect "
                f"beyond ±{s.min_effect:.0%})"), None
    ds = deciding_designs(cmp, s)
    if ds is None:
        return "nothing measured here would narrow it", None
    eff, eq = ds["effect"], ds["equivalence"]
    if eff["lo"] is None and eff["hi"] is None:
        first = (f"no design tried decides even a speedup of 2x or 0.5x with probability {TARGET:.0%}, the likeliest "
                 f"being {_what(eff, cmp, s)}")
    else:
        lo = f"{eff['lo']:.2f}" if eff["lo"] is not None else "0.50"
        hi = f"{eff['hi']:.2f}" if eff["hi"] is not None else "2.00"
        outside = f"decides it (pays or loses) with probability {TARGET:.0%} if the speedup is outside [{lo}, {hi}]"
        first = (f"{_what(eff, cmp, s)} {outside}" if eff["reachable"] else
                 f"no design tried decides speedups beyond ±{DETECT * s.min_effect:.0%} with probability "
                 f"{TARGET:.0%}; the likeliest, {_what(eff, cmp, s)}, {outside}")
    if eq["reachable"]:
        second = (f"confirming no difference (within ±{s.min_effect:.0%}) needs {_what(eq, cmp, s)}, if the speedup "
                  f"is 1.00 (probability {eq['probability']:.0%})")
    else:
        second = (f"no design confirms no difference (within ±{s.min_effect:.0%}) with probability {TARGET:.0%}: "
                  f"the likeliest, {_what(eq, cmp, s)}, does so with {eq['probability']:.0%} if the speedup is 1.00")
    return (f"{first}; {second} (carried out in simulation at each named effect, as the rounds would; run to run "
            f"drawn from its estimate's {_dof_text(cmp)}; {cmp.repeats} repeats measured)"), ds


def _dof_text(cmp: Comparison) -> str:
    _w, _wd, _b, parts = variance_split(cmp)
    dof = _b_dof(parts)
    return f"{dof:.0f} dof" if math.isfinite(dof) else "exact value"


def with_design(v: Verdict, cmp: Comparison, s: Settings) -> Verdict:
    """The verdict decide() gave, with what would decide it where it is inconclusive and the settings ask for
    designs; a verdict the sequential design kept (decide() returned it as kept) keeps its own."""
    kept = cmp.frozen is not None and cmp.frozen_rule == (s.confidence, s.min_effect)
    if v.verdict == Decision.INCONCLUSIVE and s.designs and not kept and cmp.estimate is not None:
        v.decide, v.design = what_would_decide(cmp, s)
    return v
