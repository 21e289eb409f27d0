"""Run-to-run noise: how much a configuration's figure moves between fresh server sessions, and where.

Model. A configuration k = (server, suite, concurrency) measured in repeats r = 1..R_k (each in a
fresh server session) has log figure y_kr = mu_k + s_{server,r} + e_kr: s is the session's own
speed, shared by every cell of that session; e is the cell's own conditions and its requests' noise
(a repeat sends the same prompts, as new requests). tau^2 = Var(s + e) may differ by server and by
concurrency (a c=16 cell of a 16-prompt suite is one burst; one engine may be noisier than another).

Estimate, per metric (run_to_run):

1. Q_k = sum_r (y_kr - mean_k)^2, d_k = R_k - 1 degrees of freedom.
2. Groups g = (server, concurrency), pooled over suites: s_g^2 = sum Q / sum d. The suites of one
   session share its s, so a group's effective dof is nu_g = D_g / (1 + (S_g - 1) pi^2) for S_g suites
   and D_g = sum d, pi the share of tau^2 a session holds (exact for equal R: Var(sum_k Q_k) =
   2 (R-1) tau^4 (S + S (S-1) pi^2)). The pooled level s_G^2 (every configuration) and each
   concurrency's level s_c^2 (its groups pooled) likewise.
3. Empirical Bayes, twice (Smyth 2004, "Linear models and empirical Bayes methods for assessing
   differential expression in microarray experiments", Stat. Appl. Genet. Mol. Biol. 3(1):3,
   section 6.2: the prior dof d0 from how much more the log variances scatter than their sampling
   error psi'(nu/2) explains): each concurrency's level is shrunk toward the pooled one (prior dof
   d0c, from the scatter of the concurrencies' levels), each group toward its concurrency's shrunk
   level (d0, from the scatter of the groups around their concurrency's mean). The scatter enters
   as an upper 90% bound (it is about chi-square with G - p dof): with three concurrencies the plain
   moment often reads a real difference as none and pools it away (c=16 at 8% among 2% cells was
   then called different in 14-16% instead of 10%):

       tau^2_g = (1 - l_g) s_g^2 + l_g [(1 - l_c) s_c^2 + l_c s_G^2],  l_g = d0/(d0 + nu_g), l_c = d0c/(d0c + nu_c)

   Where groups scatter no more than sampling explains, they are pooled; where a concurrency's (or a
   server's) noise differs, it keeps its own, with the dof its own data give; where a group's data
   are thin, its own estimate weighs little.
4. Every tau^2_g is linear in independent chi-square estimates (the groups' s_g^2 and the pooled
   s_G^2), so a comparison's variance, a sum of such parts and of the prompt sample's, gets
   Satterthwaite's dof from its parts (VarianceSum), a part two servers share counted once.

Simulated (analysis.analyse on 200 experiments of 2 servers x 3 suites x c = 1, 4, 16, R=2, 90%
confidence): identical servers called different in 9.7 / 9.3 / 9.2% of throughput verdicts with 3%
per session and 4% per cell everywhere; with 2% at c=1 and 4 and 8% at c=16, 6.2 / 7.5 / 8.8%
(one pooled variance: about 23% at c=16).

The headline `tau2`/`dof` is the robust median fit over configurations (fit_tau2: one outlying
configuration cannot set it) with the dof its efficiency gives (stats.median_fit_dof).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..reading.measurements import Measurements, cell_log_stat, resampled_log_stat, unit_draw, units
from ...stats import chi2_cdf, chi2_ppf, digamma, median_fit_dof, trigamma, trigamma_inverse


# -- a variance made of estimated parts ---------------------------------------------------------
@dataclass
class VarianceSum:
    """A variance as a sum of independently estimated parts, {key: [variance, dof]}. Parts with the
    same key are one estimate (two servers' run-to-run variances that share a pooled level): they
    add before Satterthwaite's rule, never as independent evidence."""
    parts: dict = field(default_factory=dict)

    def add(self, key, var: float, dof: float) -> "VarianceSum":
        if var > 0 or key not in self.parts:
            if key in self.parts:
                self.parts[key][0] += var
            else:
                self.parts[key] = [max(0.0, var), dof]
        return self

    def plus(self, other: "VarianceSum | None", scale: float = 1.0) -> "VarianceSum":
        for k, (v, d) in (other.parts.items() if other else ()):
            self.add(k, v * scale, d)
        return self

    @property
    def total(self) -> float:
        return float(sum(v for v, _ in self.parts.values()))

    @property
    def dof(self) -> float:
        """Satterthwaite (1946): (sum v)^2 / sum v^2 / dof."""
        t = self.total
        den = sum(v * v / d for v, d in self.parts.values() if v > 0 and math.isfinite(d) and d > 0)
        return t * t / den if den > 0 else float("inf")


# -- a bootstrap's variance, split by what the repeats share --------------------------------------
def repeat_mean_variance(boot: np.ndarray) -> float:
    """Variance over the resamples (columns) of the repeats' (rows') mean."""
    return float(boot.mean(0).var(ddof=1)) if boot.shape[1] > 2 else 0.0


def shared_variance(boot: np.ndarray) -> float:
    """The part of `repeat_mean_variance` the repeats share (their covariance across resamples), in
    [0, the whole]: the prompt sample, the same in every repeat, which does not average out. Each
    repeat's own request noise is the rest; the repeats' spread (run to run) already holds it."""
    R = boot.shape[0]
    if R < 2 or boot.shape[1] <= 2:
        return repeat_mean_variance(boot) if R < 2 else 0.0
    cov = np.cov(boot)
    return min(max(float((cov.sum() - np.trace(cov)) / (R * (R - 1))), 0.0), repeat_mean_variance(boot))


def request_variance(boot: np.ndarray) -> float:
    """The part of one repeat's bootstrap variance that the repeats do not share: each repeat's requests'
    own noise (its prompts' figures are new requests; the prompt sample is the shared part). Run to run
    holds it too; unlike a session's or a cell's conditions it averages over a larger suite's requests.
    0 with fewer than two repeats."""
    R = boot.shape[0]
    if R < 2 or boot.shape[1] <= 2:
        return 0.0
    cov = np.cov(boot)
    return max(float(np.trace(cov)) / R - float((cov.sum() - np.trace(cov)) / (R * (R - 1))), 0.0)


# -- the result ---------------------------------------------------------------------------------
@dataclass
class RunToRun:
    """tau^2 per metric: the session-to-session variance of a configuration's log figure.

    `tau2`/`dof`: the pooled robust headline. `groups[metric][(server, c)]`: that configuration
    group's shrunk estimate as a VarianceSum of its independent parts; `levels[metric][c]`: a
    concurrency's, for a server outside the fit (a recommended deployment measured later)."""
    tau2: dict
    dof: dict             # effective degrees of freedom of each headline estimate
    configurations: int
    repeats: int          # the largest number of repeats of a configuration
    groups: dict = field(default_factory=dict)
    levels: dict = field(default_factory=dict)
    prior_dof: dict = field(default_factory=dict)       # metric -> {"groups": d0, "concurrencies": d0c}
    dominant: dict = field(default_factory=dict)        # metric -> dominant_suite (None: no suite dominates)
    left_out: list = field(default_factory=list)        # flagged cells, not in tau^2
    session_fits: dict = field(default_factory=dict)    # metric -> SessionFit: what session_share reads
    # metric -> {(server, suite, c): (the group's mean request part, this suite's)} where the group's suites
    # differ in cell size (cell_size_scales; applied by size_scaled)
    scales: dict = field(default_factory=dict)

    @property
    def session_share(self) -> dict:
        """metric -> pi, the share of tau^2 a session holds (its fit's estimate)."""
        return {metric: fit.share() for metric, fit in self.session_fits.items()}

    def sd(self, metric: str) -> float | None:
        t = self.tau2.get(metric)
        return math.sqrt(t) if t is not None else None

    def at(self, metric: str, server: str, c: int, suite: str | None = None) -> VarianceSum | None:
        """tau^2 of `server` at concurrency c: its group's, else its concurrency's, else the pooled one; with
        `suite`, scaled to that suite's cells where its group's suites differ in size (cell_size_scales)."""
        g = self.groups.get(metric, {})
        if (server, c) in g:
            v, parts = g[(server, c)], self.scales.get(metric, {}).get((server, suite, c))
            if parts is None or v.total <= 0:
                return v
            return VarianceSum().plus(v, size_scaled(v.total, *parts) / v.total)
        lv = self.levels.get(metric, {})
        if c in lv:
            return lv[c]
        if metric in self.tau2:
            return VarianceSum({("pooled", metric): [self.tau2[metric], self.dof.get(metric, float("inf"))]})
        return None

    def sd_at(self, metric: str, server: str, c: int) -> float | None:
        v = self.at(metric, server, c)
        return math.sqrt(v.total) if v is not None else None


# -- the headline fit ---------------------------------------------------------------------------
def fit_tau2(stats: list[tuple[float, int]]) -> float:
    """The robust fit of run_to_run: the tau^2 at which the median over configurations of
    P(chi2_d <= Q / tau^2) is one half (`stats`: per configuration, Q and its degrees of freedom)."""
    def median_cdf(t2):
        return float(np.median([chi2_cdf(q / t2, d) for q, d in stats]))

    if max(q for q, _ in stats) == 0:
        return 0.0
    lo, hi = 0.0, max(q for q, _ in stats)
    while median_cdf(hi) > 0.5:
        hi *= 4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if median_cdf(mid) > 0.5 else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class SessionFit:
    """What session_share reads: the variance of a session's mean residual `v` (cells per session `k`,
    tau^2 `t2` over `total_dof` dof), with `dof` degrees of freedom (each server's sessions less one:
    their residuals sum to zero). With two repeats of two servers that is 2 dof, so pi is known only
    roughly: its estimate ranges from 0 to about twice the truth."""
    v: float
    dof: float
    t2: float
    k: float
    total_dof: float = math.inf

    def share(self) -> float:
        """pi's estimate."""
        if self.t2 <= 0:
            return 0.0
        if self.k <= 1:
            return 1.0
        return min(self.t2, max(0.0, (self.v - self.t2 / self.k) / (1 - 1 / self.k))) / self.t2


def session_fit(t2: float, resid: list) -> SessionFit:
    """SessionFit of the residuals (y_kr - mean_k) of the sessions, `resid`: (server, repeat, residual,
    R_k)."""
    if t2 <= 0 or not resid:
        return SessionFit(0.0, math.inf, 0.0, 1.0)
    by_session: dict = {}
    for server, r, e, n in resid:
        by_session.setdefault((server, r), []).append(e)
    k_bar = len(resid) / len(by_session)  # cells per session
    shrink = float(np.mean([n / (n - 1) for _, _, _, n in resid]))
    v = float(np.mean([np.mean(x) ** 2 for x in by_session.values()])) * shrink
    dof = float(len(by_session) - len({server for server, _ in by_session}))
    total = float(sum((n - 1) / n for _, _, _, n in resid))   # each configuration's R_k residuals: R_k - 1 dof
    return SessionFit(v, dof if dof > 0 else math.inf, t2, k_bar, total)


def session_share(t2: float, resid: list) -> float:
    """pi: the share of tau^2 shared by every cell of a server session, from how much the residuals
    (y_kr - mean_k) of one session move together. `resid`: (server, repeat, residual, R_k)."""
    return session_fit(t2, resid).share()


def _pooled_dof(resid: list, pi: float) -> float:
    """Effective dof of sum_k Q_k / sum_k d_k over configurations whose cells share sessions: per
    server, D_s / (1 + (k_s - 1) pi^2) (k_s its cells per session), summed over servers."""
    per: dict = {}
    for server, r, _e, _n in resid:
        per.setdefault(server, [0, set()])
        per[server][0] += 1
        per[server][1].add(r)
    out = 0.0
    for server, (cells, sessions) in per.items():
        configs = cells / len(sessions)
        d = cells - configs
        out += d / (1 + (configs - 1) * pi * pi)
    return out


def tau2_dof(t2: float, stats: list, resid: list) -> float:
    """Degrees of freedom of the median fit: what the mean of the Q's would have, given that the
    cells of one session share its part of the variance (_pooled_dof), times the median's
    efficiency against the mean (stats.median_fit_dof: 0.37 for two repeats, not the 2/pi of a
    median of normals, which overstated the dof 1.7x)."""
    ds = [d for _, d in stats]
    if not ds:
        return 1.0
    eff = median_fit_dof(ds) / sum(ds)
    if t2 <= 0 or not resid:
        return max(1.0, sum(ds) * eff)
    return max(1.0, _pooled_dof(resid, session_share(t2, resid)) * eff)


# -- empirical Bayes ------------------------------------------------------------------------------
def prior_dof(values: list[tuple[float, float, object]]) -> float:
    """Smyth (2004) 6.2: the prior degrees of freedom d0 from how much the log variances scatter
    around their centres beyond their sampling error. `values`: (s^2, dof, centre) (values with the
    same centre scatter around their mean). inf when they scatter no more than sampling explains
    (or nothing scatters), small when they differ."""
    by: dict = {}
    for s2, d, key in values:
        if s2 > 0 and d > 0 and math.isfinite(d):
            by.setdefault(key, []).append((math.log(s2) - digamma(d / 2) + math.log(d / 2), trigamma(d / 2)))
    ss, tri, n, p = 0.0, [], 0, 0
    for xs in by.values():
        if len(xs) < 2:
            continue
        es = np.array([e for e, _ in xs])
        ss += float(((es - es.mean()) ** 2).sum())
        tri += [t for _, t in xs]
        n += len(xs)
        p += 1
    if n - p < 1:
        return float("inf")
    # an upper 90% bound on the scatter (ss is about chi-square with n - p dof): with few groups (three
    # concurrencies) the plain moment often reads a real difference as none and pools it away
    excess = ss / chi2_ppf(0.1, n - p) - float(np.mean(tri))
    return 2 * trigamma_inverse(excess) if excess > 0 else float("inf")


def _prior_part_dof(d0: float, nu: float) -> float:
    """Degrees of freedom of a shrinkage prior's part as an estimate of one group's variance: its
    relative variance is the scatter of the groups' true variances around it (2 / d0, Smyth 2004) plus
    its own estimation error (2 / nu)."""
    inv = (1 / d0 if math.isfinite(d0) and d0 > 0 else 0.0) + (1 / nu if math.isfinite(nu) and nu > 0 else 0.0)
    return 1 / inv if inv > 0 else float("inf")


def _shrunk(metric: str, cfgs: list, pi: float, resid: list) -> tuple[dict, dict, dict]:
    """Per (server, c) and per c: tau^2 as VarianceSums (module docstring, steps 2-4)."""
    groups: dict = {}
    for (server, _suite, c), q, d in cfgs:
        g = groups.setdefault((server, c), [0.0, 0, 0])
        g[0] += q
        g[1] += d
        g[2] += 1
    D = sum(d for _, _, d in cfgs)
    s_all = sum(q for _, q, _ in cfgs) / D
    nu_all = max(1.0, _pooled_dof(resid, pi))
    own = {g: (q / d, d / (1 + (n - 1) * pi * pi)) for g, (q, d, n) in groups.items()}
    cs = sorted({c for _, c in groups})
    level = {}
    for c in cs:
        mine = [(own[g][0], groups[g][1], own[g][1]) for g in groups if g[1] == c]
        level[c] = (sum(s * d for s, d, _ in mine) / sum(d for _, d, _ in mine), sum(nu for _, _, nu in mine))
    d0c = min(prior_dof([(s, nu, "all") for s, nu in level.values()]), nu_all)
    d0 = prior_dof([(own[g][0], own[g][1], g[1]) for g in groups])
    out_levels, out_groups = {}, {}
    for c in cs:
        s_c, nu_c = level[c]
        lc = d0c / (d0c + nu_c) if len(cs) > 1 else 0.0
        # the prior is known only as well as the levels' scatter says (d0c) and as its own estimate is (nu_all)
        parts = VarianceSum().add(("G", metric), lc * s_all, _prior_part_dof(d0c, nu_all))
        for g in groups:
            if g[1] == c:
                parts.add(("g", metric) + g, (1 - lc) * groups[g][1] / sum(groups[h][1] for h in groups if h[1] == c)
                          * own[g][0], own[g][1])
        out_levels[c] = parts
        for g in groups:
            if g[1] != c:
                continue
            d0g = min(d0, nu_all)
            lg = d0g / (d0g + own[g][1]) if sum(1 for h in groups if h[1] == c) > 1 else 0.0
            # Smyth's posterior has d0 + nu_g dof: the prior part is worth d0 dof as an estimate of this
            # group's variance (however precisely the level itself is estimated), one part per level
            prior = VarianceSum().plus(parts, lg)
            mine = (VarianceSum().add(("prior", metric, c), prior.total, _prior_part_dof(d0g, prior.dof))
                    .add(("g", metric) + g, (1 - lg) * own[g][0], own[g][1]))
            out_groups[g] = mine
    return out_groups, out_levels, {"groups": d0, "concurrencies": d0c}


def run_to_run(m: Measurements, servers: list[str] | None = None) -> RunToRun:
    """tau^2 of every configuration group (module docstring) from every configuration measured in
    two repeats or more, and the robust pooled headline; estimated once per set of servers."""
    return m.estimated("run_to_run", servers, lambda: _run_to_run(m, servers))


def _run_to_run(m: Measurements, servers: list[str] | None) -> RunToRun:
    configs: dict = {}
    for key in m.cells:
        if servers is None or key[0] in servers:
            configs.setdefault(key[:3], []).append(key)
    tau2, dofs, nconf, rmax = {}, {}, 0, 1
    groups, levels, priors, dominant, fits, scales = {}, {}, {}, {}, {}, {}
    # a cell measured beside another job (interference.flagged) says how busy the machine was, not how much
    # a configuration moves between sessions: it stays in its verdict (flagged there), and out of tau^2
    # where its configuration keeps two quiet repeats (else all its cells count: a busy machine's run to
    # run is still the best measure there is of it, and intervals without one would be too narrow)
    use = {}
    for cfg, keys in configs.items():
        quiet = [k for k in keys if not m.cells[k].flagged]
        use[cfg] = quiet if len(quiet) >= 2 else keys
    left_out = sorted(k for cfg, keys in configs.items() for k in keys if k not in use[cfg])
    for metric in m.settings.metrics:
        stats, resid, cfgs = [], [], []
        for cfg, keys in configs.items():
            got = [(k[3], y) for k, y in ((k, cell_log_stat(m, k, metric)) for k in use[cfg]) if y is not None]
            if len(got) >= 2:
                ys = np.array([y for _, y in got])
                q = float(((ys - ys.mean()) ** 2).sum())
                stats.append((q, len(ys) - 1))
                cfgs.append((cfg, q, len(ys) - 1))
                resid += [(cfg[0], r, y - ys.mean(), len(ys)) for r, y in got]
                rmax = max(rmax, len(ys))
        if not stats:
            continue
        nconf = max(nconf, len(stats))
        tau2[metric] = fit_tau2(stats)
        dofs[metric] = tau2_dof(tau2[metric], stats, resid)
        s_all = sum(q for q, _ in stats) / sum(d for _, d in stats)
        fits[metric] = session_fit(s_all, resid)
        groups[metric], levels[metric], priors[metric] = _shrunk(metric, cfgs, fits[metric].share(), resid)
        scales[metric] = cell_size_scales(m, metric, cfgs, {cfg: use[cfg] for cfg, _q, _d in cfgs})
        dominant[metric] = dominant_suite(cfgs)
    return RunToRun(tau2, dofs, nconf, rmax, groups, levels, priors, dominant, left_out, fits, scales)


# a group's suites are pooled as they are where their cells' sizes differ by less than this ratio: the
# request-noise parts then differ by less than the estimate's own error at a few dof
SIZE_RATIO = 1.5


def size_scaled(tau2: float, mean: float, own: float) -> float:
    """A suite's tau^2 from its group's: the requests' part the group holds (`mean`, the suites' dof-weighted
    mean of nu / n) swapped for the suite's own (`own`, nu / n_k), at least `own`. Additive on the group's
    (shrunk) tau^2: a factor (s^2 - mean + own) / s^2 read off the raw s^2 and multiplied into the shrunk
    tau^2 grew without bound where s^2 ran low by chance (a 99th percentile of 12x in an audit's
    simulation, 16/16/96-request suites)."""
    return max(tau2 - mean + own, own)


def cell_size_scales(m: Measurements, metric: str, cfgs: list, keys: dict) -> dict:
    """{(server, suite, c): (mean, own)} for the configurations of every group (server, c) whose suites'
    cells differ in size by SIZE_RATIO or more (a 96-turn session suite beside 16-prompt suites): a
    configuration's tau^2 is its group's with the requests' own noise taken at its own cell's size
    (size_scaled). tau^2 = conditions (a session's, a cell's) + the requests' noise of a cell, nu / n for n
    requests; the group's tau^2 holds the second at the suites' dof-weighted mean of nu / n. nu, a request's own noise,
    is pooled over the group's suites from each configuration's bootstrap (the part of its repeats'
    resampled variance they do not share: request_variance, times n). Pooled as they were, a 96-request
    cell's intervals came out too wide and the 16-prompt suites' beside it too narrow."""
    groups: dict = {}
    for cfg, q, d in cfgs:
        groups.setdefault((cfg[0], cfg[2]), []).append((cfg, q, d))
    out = {}
    for (server, c), members in groups.items():
        sizes = {cfg: float(np.mean([len(m.arrays[k].out) for k in keys[cfg]])) for cfg, _q, _d in members}
        if len(members) < 2 or min(sizes.values()) <= 1 or max(sizes.values()) < SIZE_RATIO * min(sizes.values()):
            continue
        nus = {cfg: _request_noise(m, keys[cfg], metric) * sizes[cfg] for cfg, _q, _d in members}
        D = sum(d for _c, _q, d in members)
        s2 = sum(q for _c, q, _d in members) / D
        nu = sum(d * nus[cfg] for cfg, _q, d in members) / D
        mean = sum(d * nu / sizes[cfg] for cfg, _q, d in members) / D
        if s2 <= 0 or nu <= 0:
            continue
        for cfg, _q, _d in members:
            out[cfg] = (mean, nu / sizes[cfg])
    return out


def _request_noise(m: Measurements, keys: list, metric: str) -> float:
    """A cell's requests' own noise in its log figure: the part of its repeats' bootstrap variance they do
    not share (request_variance), unbiased for the n units resampled."""
    common = set.intersection(*(set(m.arrays[k].keys) for k in keys))
    prompts = sorted({k.split("#", 1)[0] for k in common})
    sessions = m.session_ids()
    n = units(prompts, sessions)
    if n < 2:
        return 0.0
    draw = unit_draw(m.settings.rng("request-noise", *keys[0][:3], metric), prompts, sessions, m.settings.bootstrap)
    boot = np.array([resampled_log_stat(m, k, metric, prompts, sorted(common), draw) for k in keys])
    boot = boot[:, np.isfinite(boot).all(0)]
    return n / (n - 1) * request_variance(boot)


def dominant_suite(cfgs: list) -> tuple[str, float, float] | None:
    """The suite whose configurations hold most of the spread between sessions: (suite, its share of the
    sum of squares, its share of the dof), when that share is at least half and at least twice its share
    of the dof (one noisy suite, say measured beside another job, raises every verdict's tau^2 through
    the pooled level and the shrinkage); None otherwise."""
    q_tot = sum(q for _, q, _ in cfgs)
    d_tot = sum(d for _, _, d in cfgs)
    if q_tot <= 0 or d_tot <= 0:
        return None
    by: dict = {}
    for (_server, suite, _c), q, d in cfgs:
        a = by.setdefault(suite, [0.0, 0])
        a[0] += q
        a[1] += d
    suite, (q, d) = max(by.items(), key=lambda kv: kv[1][0])
    share_q, share_d = q / q_tot, d / d_tot
    return (suite, share_q, share_d) if len(by) > 1 and share_q >= 0.5 and share_q >= 2 * share_d else None
