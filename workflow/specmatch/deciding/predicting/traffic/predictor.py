"""Predictions of any mix for one speculative server against the baseline at one concurrency: the
strata both measured, a post-stratified closed form at c = 1, simulated suites through the step model
at c > 1, with the prompt sample's variance (the post-stratified ratio linearised in each prompt's values).
The method: specmatch.deciding.predicting.traffic."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ....metrics import LATENCY, log_speedup

from .step_model import CellRequests, figures, simulate

SUITES = 300              # simulated suites at the measured data (c > 1): the point estimate


# -- one server against the baseline at one concurrency ------------------------------------------------
FIELDS = ("e2e", "ttft", "out", "ptok", "steps", "good", "m_dec", "m_adm", "tpot", "cached")


@dataclass
class Stratum:
    """One stratum's prompts as both servers answered them in every repeat: per server and repeat, the
    per-prompt means of FIELDS (over a prompt's passes), in the order of `prompts`."""
    name: str
    suite: str
    prompts: list
    data: dict = field(default_factory=dict)     # (server, repeat) -> {field: array over prompts}

    @property
    def n(self) -> int:
        return len(self.prompts)


def per_prompt(cr: CellRequests, prompts: list[str]) -> dict:
    pos = {p: i for i, p in enumerate(prompts)}
    idx = np.array([pos.get(p, -1) for p in cr.prompts])
    keep = idx >= 0
    cnt = np.bincount(idx[keep], minlength=len(prompts)).astype(float)
    tpot = cr.tpot if cr.tpot is not None else np.full(len(cr.out), np.nan)
    vals = {"e2e": cr.e2e, "ttft": cr.ttft, "out": cr.out, "ptok": cr.ptok,
            "steps": cr.steps if cr.steps is not None else np.full(len(cr.out), np.nan),
            "good": cr.good.astype(float), "m_dec": cr.m_dec if cr.m_dec is not None else np.ones(len(cr.out)),
            "m_adm": cr.m_adm if cr.m_adm is not None else np.ones(len(cr.out)), "tpot": tpot,
            "cached": cr.cached if cr.cached is not None else np.zeros(len(cr.out))}
    out = {}
    for k, v in vals.items():
        v = np.asarray(v, float)[keep]
        with np.errstate(invalid="ignore", divide="ignore"):
            out[k] = np.bincount(idx[keep], np.nan_to_num(v, nan=0.0), minlength=len(prompts)) / cnt
        if k in ("steps", "tpot") and np.isnan(v).any():
            bad = np.bincount(idx[keep], np.isnan(v).astype(float), minlength=len(prompts)) > 0
            out[k][bad] = np.nan
    return out


@dataclass
class Pair:
    """What one speculative server's predictions at one concurrency rest on: the strata both it and
    the baseline measured there in every common repeat, the repeats, the suite size a cell sends, the
    step models (c > 1) and the random numbers every prediction shares (paired, and smooth along a
    line)."""
    server: str
    baseline: str
    concurrency: int
    repeats: list
    strata: dict                     # name -> Stratum
    size: int
    theta: dict = field(default_factory=dict)   # server -> step model
    note: str | None = None

    def usable(self, mix: dict) -> str | None:
        """Why this mix cannot be predicted here (None: it can)."""
        missing = [s for s, w in mix.items() if w > 0 and s not in self.strata]
        if missing:
            return f"{', '.join(missing)} not measured by both servers at c={self.concurrency}"
        few = [s for s, w in mix.items() if w > 0 and self.strata[s].n < 2]
        if few:
            return f"{', '.join(few)}: fewer than 2 prompts (no estimate of the stratum's spread)"
        if self.concurrency > 1:
            if any(self.theta.get(x) is None for x in (self.server, self.baseline)):
                return "no step model (a server without per-request decode steps, or open loop)"
            if any(not np.isfinite(self.strata[s].data[(x, r)]["steps"]).all() for s, w in mix.items() if w > 0
                   for x in (self.server, self.baseline) for r in self.repeats):
                return "a stratum's requests without per-request decode steps"
        return None


@dataclass
class Estimate:
    """A predicted log speedup: the estimate, the prompt sample's variance (corrected for small strata)
    with its dof, and the per-repeat predictions."""
    value: float
    var_w: float
    dof_w: float
    per_repeat: list


class Predictor:
    """Predictions of any mix for one Pair, with the shared random numbers (module docstring)."""

    def __init__(self, pair: Pair, slo: dict, rng_of):
        self.p, self.slo = pair, slo
        self.metric = "output_throughput"
        self.names = sorted(pair.strata)
        self.rng_of = rng_of
        self._draws: dict = {}
        self._cache: dict = {}

    # the random numbers of the simulated suites (c > 1): each slot's stratum and prompt (a uniform for
    # each), shared by both servers, every repeat and every mix (paired, and smooth along a line)
    def draws(self) -> dict:
        if not self._draws:
            rng = self.rng_of("traffic", self.p.concurrency, tuple((s, self.p.strata[s].n) for s in self.names))
            n = self.p.size
            self._draws = {"u_suite": rng.random((SUITES, n)), "v_suite": rng.random((SUITES, n))}
        return self._draws

    def estimate(self, mix: dict, metric: str) -> Estimate:
        """The predicted log speedup of `mix` on `metric` (simulated suites are shared across metrics),
        with the prompt sample's variance (`prompt_variance`)."""
        self.metric = metric
        point = self._closed_form(mix) if self.p.concurrency == 1 else self._simulated(mix)
        var, dof = self.prompt_variance(mix)
        return Estimate(float(np.mean(point)), var, dof, [float(x) for x in point])

    # c = 1: exact, in closed form
    def _closed_form(self, mix: dict) -> np.ndarray:
        point = []
        for r in self.p.repeats:
            fig = {}
            for x in (self.p.server, self.p.baseline):
                num_p = den_p = 0.0
                for s, wt in mix.items():
                    if wt <= 0:
                        continue
                    num, den = self._num_den(self.p.strata[s].data[(x, r)])
                    num_p += wt * num.mean()
                    den_p += wt * (den.mean() if den is not None else 1.0)
                fig[x] = num_p / den_p
            point.append(float(log_speedup(self.metric, np.array(fig[self.p.server]), np.array(fig[self.p.baseline]))))
        return np.array(point)

    def _num_den(self, v: dict) -> tuple[np.ndarray, np.ndarray | None]:
        if self.metric == "tpot":
            return v["tpot"], None
        if self.metric == "e2el":
            return v["e2e"], None
        return (v["good"] if self.metric == "goodput" else v["out"]), v["e2e"]

    # c > 1: simulated suites
    def _slots(self, mix: dict, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each slot's stratum (by the mix's cumulative shares) and prompt."""
        names = [s for s in self.names if mix.get(s, 0) > 0]
        cum = np.cumsum([mix[s] for s in names])
        cum = cum / cum[-1]
        which = np.minimum(np.searchsorted(cum, u, side="right"), len(names) - 1)
        pick = np.zeros(u.shape, int)
        for j, s in enumerate(names):
            m = which == j
            pick[m] = np.floor(v * self.p.strata[s].n).astype(int)[m]
        return np.array(names)[which], pick

    def _gather(self, x: str, r: int, names: np.ndarray, pick: np.ndarray) -> dict:
        out = {k: np.zeros(names.shape) for k in ("ptok", "out", "steps", "m_dec", "m_adm", "cached")}
        for s in np.unique(names):
            m = names == s
            v = self.p.strata[str(s)].data[(x, r)]
            for k in out:
                out[k][m] = v[k][pick[m]]
        return out

    def _run(self, x: str, r: int, names: np.ndarray, pick: np.ndarray, cached: np.ndarray | None = None) -> tuple:
        """Each row of slots replayed through x's step model (`cached`: the prompt tokens the prefix cache
        served each request, instead of its prompt's measured share)."""
        g = self._gather(x, r, names, pick)
        e2e, ttft, _ = simulate(self.p.theta[x], self.p.concurrency, g["ptok"], g["out"], g["steps"],
                                g["m_dec"], g["m_adm"], g["cached"] if cached is None else cached)
        return g["out"], e2e, ttft

    def _simulated(self, mix: dict) -> np.ndarray:
        """Per repeat, the mean over simulated suites of the mix of the suite's log speedup."""
        d = self.draws()
        names, pick = self._slots(mix, d["u_suite"], d["v_suite"])
        key = tuple(sorted((s, round(w, 12)) for s, w in mix.items() if w > 0))
        point = []
        for r in self.p.repeats:
            figs = {}
            for x in (self.p.server, self.p.baseline):
                ck = (x, r, key)
                if ck not in self._cache:
                    self._cache[ck] = self._run(x, r, names, pick)
                figs[x] = figures(self.metric, self.p.concurrency, *self._cache[ck], self.slo)
            point.append(float(np.nanmean(log_speedup(self.metric, figs[self.p.server], figs[self.p.baseline]))))
        return np.array(point)

    def exact(self, sequences: dict, metric: str) -> Estimate | None:
        """The predicted log speedup of a suite of these very prompts (c > 1): per server and repeat, its
        requests in their sending order as (stratum, prompt index) with the prompt tokens the prefix cache
        served each (`sequences[(server, repeat)] = (slots, cached)`), replayed through the step model with
        each prompt's measured decode steps and speeds from the strata's cells. A verifying suite drawn
        from the estimation prompts (verify: same_prompts) is predicted so: the prompt sample is the same
        on both sides and has no variance here (var_w 0), and what differs is the mix's batches. The
        cached tokens are the verifying cell's own (its prompts may have been sent before in the session;
        which prompts the cache holds is the cell order's doing, not the step model's). None at c = 1 or
        without step models."""
        if self.p.concurrency == 1 or any(self.p.theta.get(x) is None for x in (self.p.server, self.p.baseline)):
            return None
        point = []
        for r in self.p.repeats:
            figs = {}
            for x in (self.p.server, self.p.baseline):
                slots, cached = sequences[(x, r)]
                names = np.array([st for st, _ in slots])[None, :]
                pick = np.array([i for _, i in slots])[None, :]
                figs[x] = figures(metric, self.p.concurrency,
                                  *self._run(x, r, names, pick, np.asarray(cached, float)[None, :]), self.slo)
            point.append(float(np.nanmean(log_speedup(metric, figs[self.p.server], figs[self.p.baseline]))))
        return Estimate(float(np.mean(point)), 0.0, float("inf"), point)

    def prompt_variance(self, mix: dict, metric: str | None = None) -> tuple[float, float]:
        """The prompt sample's variance of the predicted log speedup and its dof: the post-stratified
        ratio linearised in each prompt's values averaged over the repeats (its influence psi_i: its
        share of the mix's numerator less its share of the denominator, server minus baseline), per
        stratum s^2 / n with n - 1 dof, summed over the strata with Satterthwaite's dof. It is never 0
        by chance, as a difference of two noisy variances can be (the covariance of two repeats'
        bootstraps, or a bootstrap less the simulated suites' own spread): with two or three prompts a
        stratum gets its t quantile. Each prompt's mean over R repeats still holds 1/R of its own request
        noise, which run to run counts as well: the part errs wide by that. At c > 1 the influences are
        the prompts' values as measured at that concurrency: a prompt's weight in the mix's batches, to
        first order. `metric`: the one to read (default: the last estimate's)."""
        self.metric = metric or self.metric
        tot: dict = {}
        means: dict = {}
        for x in (self.p.server, self.p.baseline):
            for s, wt in mix.items():
                if wt <= 0:
                    continue
                v = [self.p.strata[s].data[(x, r)] for r in self.p.repeats]
                num = np.mean([self._num_den(a)[0] for a in v], 0)
                den = self._num_den(v[0])[1]
                den = np.mean([self._num_den(a)[1] for a in v], 0) if den is not None else None
                means[(x, s)] = (num, den)
                n_t, d_t = tot.get(x, (0.0, 0.0))
                tot[x] = (n_t + wt * float(np.nanmean(num)), d_t + wt * (float(den.mean()) if den is not None else 1.0))
        sign = -1.0 if self.metric in LATENCY else 1.0
        parts = []
        for s, wt in mix.items():
            if wt <= 0:
                continue
            psi = np.zeros(self.p.strata[s].n)
            for x, sg in ((self.p.server, 1.0), (self.p.baseline, -1.0)):
                num, den = means[(x, s)]
                N, D = tot[x]
                term = (num - np.nanmean(num)) / N
                if den is not None:
                    term = term - (den - den.mean()) / D
                psi = psi + sg * sign * wt * np.nan_to_num(term)
            n = len(psi)
            parts.append((float(((psi - psi.mean()) ** 2).sum()) / (n * (n - 1)), n - 1))
        var = sum(v for v, _ in parts)
        den = sum(v ** 2 / d for v, d in parts if v > 0)
        return var, (var ** 2 / den if den > 0 else float("inf"))
