"""Comparison and verdict: one server against another at one (suite, concurrency), one metric.

A comparison has two levels of noise, and its interval includes both, each once:

- the **prompt sample**: a paired bootstrap by prompt (the two servers served the same prompts; a
  resample draws prompts, both servers' requests for them together, the same draw in every repeat).
  Closed loop, throughput is the rate at the load, each request's latency and TPOT carrying its
  influence on the others' in the drain (deciding.reading.measurements); open loop, sum(output tokens) /
  duration. A bootstrap's variance of a mean over n prompts is short by (n - 1) / n: w is scaled back.
  The part of the bootstrap variance that every repeat shares (the covariance of the repeats'
  resampled log ratios) is the prompt sample's, which more repeats do not average out: `w`, with
  prompts - 1 degrees of freedom. The rest is each repeat's own request noise, which is part of
  the repeats' spread and so of tau^2: counted there, not twice.
- **run to run**: tau^2 of each server at this concurrency (specmatch.deciding.verdicts.noise), divided by R.

The log speedup averaged over R repeats has variance w + (tau^2_server + tau^2_against) / R and a
Student t interval with Satterthwaite's dof over its independent parts (noise.VarianceSum).

With one repeat there is no measure of run-to-run variance: intervals are the bootstrap's alone,
the summary says so, and a verdict then needs an effect beyond `min_effect`. Where run to run is
measured (other repeats of these servers at this concurrency) it applies to every comparison, even
one left with a single paired repeat (goodput where one repeat had no request within the SLO).

Verdicts are typed (records.Decision): pays (interval above 1, not equivalent), loses (below),
equivalent (inside +/-min_effect: a decisive "no difference"), inconclusive. What would decide an
inconclusive one is a question of its own (specmatch.deciding.verdicts.designs), which verdicts do not need.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..reading.measurements import LATENCY, Measurements, Settings, resampled_log_stat, unit_draw, units
from .noise import RunToRun, VarianceSum, repeat_mean_variance, request_variance, shared_variance
from ...records import Crossover, Decision, Direction, Verdict
from ..reading import sequential
from ...stats import t_critical, t_interval


@dataclass
class Comparison:
    """A server against another (the baseline, unless stated) at one (suite, concurrency), one metric."""
    server: str
    against: str
    suite: str
    concurrency: int
    metric: str
    logs: list            # per repeat: log speedup
    within: list          # per repeat: the prompt sample's variance of the mean log speedup (w)
    estimate: float | None = None
    se: float | None = None
    dof: float = float("inf")
    run_to_run: bool = False
    note: str | None = None
    parts: VarianceSum | None = None   # se^2 by independent part: ("w", ...) the prompt sample, the rest run to run
    prompts: int = 0                   # prompts both servers answered in every repeat
    units: int = 0                     # their resampling units: the prompts, or a session suite's sessions
    session: dict = field(default_factory=dict)  # server -> the variance its server sessions add (shared across c)
    frozen: Verdict | None = None      # the verdict the sequential design kept at the look it stopped (freeze)
    frozen_rule: tuple | None = None   # (confidence, min_effect) it was decided with
    # of what measuring every cell again adds to the run-to-run estimate's dof, what a repeat of this
    # configuration's own two cells adds (sequential.dof_share): the least a round that continues it
    # measures, which 'what would decide it' assumes (verdicts.designs)
    own_share: float = 1.0
    # {design max: share}: what a round under repeats {min, max} measures again of that dof (designs.rounds_shares):
    # the share 'what would decide it' assumes for a sequential design of that max (own_share where absent)
    round_shares: dict = field(default_factory=dict)
    # the variance one repeat's requests' own noise adds to its log speedup (request_variance), a part of run
    # to run that a suite g times larger averages over g times the requests (designs.larger_suite)
    request_noise: float = 0.0

    @property
    def repeats(self) -> int:
        return len(self.logs)


def _bootstrap(m: Measurements, pairs: list, prompts: list, common: set, metric: str, sign: float,
               draw: np.ndarray) -> np.ndarray:
    """Per repeat, the resampled log speedup (rows: repeats, columns: resamples)."""
    ordered = sorted(common)
    with np.errstate(invalid="ignore"):   # a resample without a figure on both sides: nan, dropped by the caller
        return np.array([sign * (resampled_log_stat(m, ks, metric, prompts, ordered, draw)
                                 - resampled_log_stat(m, kb, metric, prompts, ordered, draw)) for ks, kb in pairs])


def compare(m: Measurements, rr: RunToRun, server: str, against: str, suite: str, c: int,
            metric: str) -> Comparison:
    """The log speedup averaged over the repeats, and its variance w + (tau^2_s + tau^2_a) / R
    (module docstring)."""
    cmp = Comparison(server, against, suite, c, metric, [], [])
    sign = -1.0 if metric in LATENCY else 1.0
    pairs, notes = [], []
    for r in sorted(set(m.repeats(server, suite, c)) & set(m.repeats(against, suite, c))):
        ks, kb = (server, suite, c, r), (against, suite, c, r)
        ps, pb = m.arrays[ks].point(metric, m.cells[ks]), m.arrays[kb].point(metric, m.cells[kb])
        if not ps or not pb:
            who = [n for n, p in ((server, ps), (against, pb)) if not p]
            notes.append(f"{' and '.join(who)}: " + ("no request met the SLO" if metric == "goodput" else "no figure")
                         + f" at c={c} (repeat {r})")
            continue
        pairs.append((ks, kb))
        cmp.logs.append(sign * (math.log(ps) - math.log(pb)))
    if not cmp.logs:
        cmp.note = "; ".join(dict.fromkeys(notes)) or "not measured"
        return cmp
    common = set.intersection(*(set(m.arrays[k].keys) for pair in pairs for k in pair))
    prompts = sorted({k.split("#", 1)[0] for k in common})
    if len(prompts) < 2:
        cmp.note = "fewer than two prompts answered by both servers in every repeat"
        cmp.logs = []
        return cmp
    sessions = m.session_ids()
    n = units(prompts, sessions)   # prompts, or a session suite's sessions: the resampling units
    if n < 2:
        cmp.note = "fewer than two sessions answered by both servers in every repeat"
        cmp.logs = []
        return cmp
    draw = unit_draw(m.settings.rng("pair", server, against, suite, c, metric), prompts, sessions,
                     m.settings.bootstrap)
    boot = _bootstrap(m, pairs, prompts, common, metric, sign, draw)
    boot = boot[:, np.isfinite(boot).all(0)]
    R = len(cmp.logs)
    # a bootstrap's variance of a mean over n units is the plug-in s^2 (n - 1) / n / n: short by n / (n - 1)
    # (6% at the default's 16-18 prompts), which the unbiased s^2 / n, the jackknife's, puts back
    unbias = n / (n - 1)
    w_full = unbias * repeat_mean_variance(boot)
    cmp.estimate = float(np.mean(cmp.logs))
    cmp.prompts, cmp.units = len(prompts), n
    key = ("w", server, against, suite, c, metric)
    ts, ta = rr.at(metric, server, c, suite), rr.at(metric, against, c, suite)
    if ts is not None and ta is not None:
        # run to run is measured for these servers at c (their other repeats and configurations), so it
        # applies to however many repeats are paired here: a repeat dropped for want of a figure (goodput
        # where no request met the SLO, all or nothing in one burst) must not fall back to the prompt
        # sample alone, which called identical servers different in ~40% of such verdicts
        w = unbias * shared_variance(boot) if R >= 2 else w_full
        cmp.parts = VarianceSum().add(key, w, n - 1).plus(ts, 1 / R).plus(ta, 1 / R)
        cmp.run_to_run = True
        share = rr.session_share.get(metric, 0.0)
        cmp.session = {server: share * ts.total / R, against: share * ta.total / R}
        cmp.request_noise = unbias * request_variance(boot)
    else:
        w = w_full
        cmp.parts = VarianceSum().add(key, w, n - 1)
    cmp.within = [w] * R
    cmp.se = math.sqrt(cmp.parts.total)
    cmp.dof = cmp.parts.dof
    cmp.own_share = sequential.dof_share(m.repeats_by_cell(), {(server, suite, c), (against, suite, c)}, R)
    return freeze(cmp, frozen_for(m, server, against, suite, c, metric, R), m.settings)


# -- verdicts the sequential design stopped --------------------------------------------------------
def frozen_for(m: Measurements, server: str, against: str, suite: str, c: int, metric: str,
               repeats: int | None = None) -> Verdict | None:
    """The verdict the sequential design kept for this comparison at the look where it stopped
    (Measurements.frozen, from the round plans: analysis.frozen_verdicts), seen from `server` (a pair
    kept the other way round, as a k sweep's may be, inverted); None where there is none, or where
    the comparison now has other data than it stopped with (`repeats` paired repeats)."""
    v = m.frozen.get((server, against, suite, c, metric))
    if v is None and (against, server, suite, c, metric) in m.frozen:
        v = inverted(m.frozen[(against, server, suite, c, metric)])
    if v is None or (repeats is not None and v.repeats != repeats):
        return None
    return v


def inverted(v: Verdict) -> Verdict:
    """The verdict of `against` over `server`: the same interval, upside down."""
    flip = {Decision.PAYS: Decision.LOSES, Decision.LOSES: Decision.PAYS}
    inv = lambda x: 1 / x if x else x  # noqa: E731
    return dataclasses.replace(v, server=v.against, against=v.server, verdict=flip.get(v.verdict, v.verdict),
                               speedup=inv(v.speedup), lo=inv(v.hi), hi=inv(v.lo))


def freeze(cmp: Comparison, v: Verdict | None, s: Settings) -> Comparison:
    """The comparison with the estimate, standard error and dof of the frozen verdict `v` (recovered
    from its interval and level), so that decide() gives `v` itself under the rule it was decided with
    and any other rule (a stricter level) works on the data as they stood when it stopped."""
    if v is None or v.speedup is None or not v.lo or not v.hi:
        return cmp
    dof = v.dof if v.dof is not None else float("inf")
    t = t_critical(dof, v.confidence)
    cmp.estimate = math.log(v.speedup)
    cmp.se = (math.log(v.hi) - math.log(v.lo)) / (2 * t) if t > 0 else cmp.se
    cmp.dof = dof
    cmp.frozen, cmp.frozen_rule = v, (s.confidence, s.min_effect)
    return cmp


def decide(cmp: Comparison, s: Settings) -> Verdict:
    """The verdict on one comparison (the rules in this module's docstring); a verdict the sequential
    design kept at the look where it stopped (Comparison.frozen) as it was kept."""
    if cmp.frozen is not None and cmp.frozen_rule == (s.confidence, s.min_effect):
        return dataclasses.replace(cmp.frozen, design=copy.deepcopy(cmp.frozen.design))
    level = look_level(cmp, s)
    base = dict(server=cmp.server, suite=cmp.suite, concurrency=cmp.concurrency, metric=cmp.metric,
                confidence=level, repeats=cmp.repeats, against=cmp.against, run_to_run=cmp.run_to_run)
    if cmp.estimate is None:
        return Verdict(verdict=Decision.INCONCLUSIVE, speedup=None, lo=None, hi=None, decide=cmp.note, **base)
    lo_l, hi_l = log_interval(cmp, level)
    d = decision(lo_l, hi_l, math.log(1 + s.min_effect), cmp.run_to_run)
    v = Verdict(verdict=d, speedup=math.exp(cmp.estimate), lo=math.exp(lo_l), hi=math.exp(hi_l),
                dof=cmp.dof if math.isfinite(cmp.dof) else None, **base)
    return v


def log_interval(cmp: Comparison, level: float) -> tuple[float, float]:
    """The interval of the log speedup at `level` (Student t at the comparison's dof)."""
    return t_interval(cmp.estimate, cmp.se, cmp.dof, level)


def look_level(cmp: Comparison, s: Settings) -> float:
    """The confidence of this comparison's verdict: `s.confidence` in a fixed design; under the
    sequential design (`repeats: {min, max}`) the level of the look its repeats make, so that
    stopping when a verdict is decided keeps the error rate (specmatch.deciding.reading.sequential)."""
    d = s.design
    if not d.sequential or not cmp.run_to_run or cmp.estimate is None or cmp.se is None:
        return s.confidence
    w, _, b, _ = variance_split(cmp)
    return sequential.look_confidence(d, s.confidence, cmp.repeats, w, b)


def decision(lo: float, hi: float, band: float, run_to_run: bool) -> Decision:
    """An interval of the log speedup as a verdict; without a measure of run-to-run variation only an
    effect beyond the band is trusted, and equivalence is never called."""
    if run_to_run:
        if -band <= lo and hi <= band:
            return Decision.EQUIVALENT
        if lo > 0:
            return Decision.PAYS
        if hi < 0:
            return Decision.LOSES
        return Decision.INCONCLUSIVE
    return Decision.PAYS if lo > band else Decision.LOSES if hi < -band else Decision.INCONCLUSIVE


def variance_split(cmp: Comparison) -> tuple[float, float, float, list]:
    """(w, its dof, run-to-run variance per repeat-average, [(variance, dof)] of the run-to-run parts)."""
    if cmp.parts is not None:
        w_parts = [(v, d) for k, (v, d) in cmp.parts.parts.items() if k and k[0] == "w"]
        rr_parts = [(v, d) for k, (v, d) in cmp.parts.parts.items() if not (k and k[0] == "w")]
        w = sum(v for v, _ in w_parts)
        return w, (w_parts[0][1] if w_parts else float("inf")), sum(v for v, _ in rr_parts), rr_parts
    w = float(np.mean(cmp.within)) if cmp.within else 0.0   # a Comparison built by hand: one run-to-run part
    b = max(0.0, cmp.se ** 2 - w)
    return w, float(max(cmp.prompts - 1, 1)) if cmp.prompts else float("inf"), b, [(b, cmp.dof)]


# -- shapes over concurrency ------------------------------------------------------------------
def regions(verdicts: list[Verdict]):
    """Consecutive concurrencies with the same verdict, so a non-monotone shape (loses low, pays
    higher up, as with MoE targets) is described as it is instead of by a single crossover."""
    from ...records import Region

    out: list = []
    for v in sorted(verdicts, key=lambda v: v.concurrency):
        if out and out[-1].verdict == v.verdict:
            out[-1].last = v.concurrency
        else:
            out.append(Region(v.verdict, v.concurrency, v.concurrency))
    return out


def crossovers(verdicts: list[Verdict], cmps: list[Comparison], s: Settings, draws: int | None = None
               ) -> list[Crossover]:
    """Where the speedup crosses 1: only between two measured concurrencies whose verdicts have
    opposite signs (pays at one, loses at the next decided one; undecided ones between them count
    for the curve, not for the bracket), so a server that pays nowhere gets none.

    The point is where the log speedup, linear in log concurrency between measured points, crosses
    0 inside the bracket. Its interval comes from joint draws of every concurrency's log speedup:
    each comparison's variance split into the part its server sessions add (`Comparison.session`,
    one normal draw per server shared by all its concurrencies: a session moves every cell of it)
    and the rest (independent), scaled by one chi-square draw at the smallest dof (multivariate t).
    Between two measured points the curve is unknown: each draw bends it by up to the curvature the
    neighbouring points show (|second divided difference|), either way (uniform), which is the
    interpolation's own error. Draws that do not cross inside the bracket lie at its end where the
    sign disagrees; the interval never leaves the bracket."""
    order = sorted((c for c in cmps if c.estimate is not None), key=lambda c: c.concurrency)
    by_c = {v.concurrency: v.verdict for v in verdicts}
    signs = [(c.concurrency, 1 if by_c.get(c.concurrency) == Decision.PAYS else -1)
             for c in order if by_c.get(c.concurrency) in (Decision.PAYS, Decision.LOSES)]
    brackets = [(a, b, sa) for (a, sa), (b, sb) in zip(signs, signs[1:]) if sa != sb]
    if not brackets or len(order) < 2:
        return []
    xs = np.log([c.concurrency for c in order])
    mu = np.array([c.estimate for c in order])
    n = draws or max(1000, s.bootstrap)
    rng = s.rng("crossover", order[0].server, order[0].against, order[0].suite, order[0].metric)
    servers = sorted({k for c in order for k in c.session})
    shared = rng.standard_normal((n, len(servers)))
    y = np.tile(mu, (n, 1))
    for j, c in enumerate(order):
        own = max(0.0, c.se ** 2 - sum(c.session.values()))
        y[:, j] += math.sqrt(own) * rng.standard_normal(n)
        for i, sv in enumerate(servers):
            if sv in c.session:
                y[:, j] += (1 if sv == c.server else -1) * math.sqrt(c.session[sv]) * shared[:, i]
    dof = min(c.dof for c in order)
    if math.isfinite(dof):
        y = mu + (y - mu) * np.sqrt(dof / rng.chisquare(dof, n))[:, None]
    curv = _curvature(xs, mu)
    bend = rng.uniform(-1, 1, (n, len(order) - 1))
    out = []
    for a, b, sa in brackets:
        ia, ib = next(i for i, c in enumerate(order) if c.concurrency == a), \
            next(i for i, c in enumerate(order) if c.concurrency == b)
        direction = Direction.STOPS_PAYING if sa > 0 else Direction.STARTS_PAYING
        point = _first_cross(xs, mu[None, :], np.zeros((1, len(order) - 1)), curv, ia, ib, sa)[0]
        got = _first_cross(xs, y, bend, curv, ia, ib, sa)
        q = (1 - s.confidence) / 2
        lo, hi = np.quantile(got, q), np.quantile(got, 1 - q)
        out.append(Crossover(float(math.exp(point)), float(math.exp(lo)), float(math.exp(hi)), direction, a, b,
                             order[0].metric))
    return out


def _curvature(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Per segment between measured points: |f''| as the neighbouring points' second divided
    differences show it (their mean; 0 with two points: nothing says how the curve bends)."""
    if len(xs) < 3:
        return np.zeros(len(xs) - 1)
    d2 = [abs(2 * ((ys[i + 2] - ys[i + 1]) / (xs[i + 2] - xs[i + 1]) - (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]))
              / (xs[i + 2] - xs[i])) for i in range(len(xs) - 2)]
    seg = []
    for i in range(len(xs) - 1):
        near = [d2[j] for j in (i - 1, i) if 0 <= j < len(d2)]
        seg.append(float(np.mean(near)))
    return np.array(seg)


def _first_cross(xs, y, bend, curv, ia: int, ib: int, sign: int, grid: int = 64) -> np.ndarray:
    """Per row of y: the first x in [xs[ia], xs[ib]] where the curve (linear between points, bent by
    bend * |f''| (x - x0)(x1 - x) / 2) leaves the sign `sign`; the bracket's far end if it never does,
    its near end if it starts on the other side."""
    rows = y.shape[0]
    res = np.full(rows, np.nan)
    for i in range(ia, ib):
        x0, x1 = xs[i], xs[i + 1]
        u = np.linspace(0, 1, grid)
        xx = x0 + u * (x1 - x0)
        f = y[:, i:i + 1] * (1 - u) + y[:, i + 1:i + 2] * u
        f = f + bend[:, i:i + 1] * curv[i] * (xx - x0) * (x1 - xx) / 2
        off = (f * sign) <= 0
        if i == ia:
            start_off = off[:, 0]
            res[np.isnan(res) & start_off] = x0
        hit = off.any(1) & np.isnan(res)
        j = off.argmax(1)
        # linear between the grid points on either side of the change
        jj = np.maximum(j, 1)
        fa, fb = f[np.arange(rows), jj - 1], f[np.arange(rows), jj]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(fb != fa, fa / (fa - fb), 0.0)
        xa, xb = xx[jj - 1], xx[jj]
        res[hit] = (xa + np.clip(frac, 0, 1) * (xb - xa))[hit]
    res[np.isnan(res)] = xs[ib]
    return res
