"""Your traffic, not the training set: any mix's speedup predicted from per-source measurements, the
break-even mix, and the check against a measured mix (docs/guides/your-traffic.md).

**Strata.** A traffic mix gives each stratum a share of requests: a training source (its prompts in
the basis suite, a stratified training suite: `min_per_source`) or a file suite (one stratum). Every
cell's requests carry their stratum, so a stratum's requests at concurrency c in repeat r are
measured by each server exactly as the verdicts see them; a mix is predicted by reweighting them
(post-stratification), never by re-measuring.

**What mixing does.** Acceptance is a property of the sequence (under greedy decoding, of the
prompt): a request needs the same number of decode steps n_r whatever runs beside it. The cost of
a step is a property of the batch: its size, its context and the prefills it carries, not which
source each sequence came from. Throughput is a ratio of sums over the cell (tokens over the time C
workers take), not a mean of per-source ratios. So:

- **c = 1** (one request at a time; nothing is shared): a request takes in the mix exactly the time it
  took alone. The mix's mean TPOT is the request-weighted mean of the strata's, sum_s w_s TPOT_s
  (with equal outputs per request this is the step time over the mix's tokens per step, the
  harmonic mean of the strata's tau weighted by their tokens: tau_mix / rho), and its closed-loop
  throughput sum_s w_s out_s / sum_s w_s e2e_s, a post-stratified ratio estimator (the workers
  serve one request after another, so the makespan is the sum of latencies). No model: exact.
- **c > 1**: a batch holds several sources, and a stratum's request took its time beside its own
  suite's requests (contexts, prefills, a tail in which the batch drained as they finished). Each
  server's step is modelled as T(b, C, P) = t0 + t1 b + t2 C + t3 P seconds for b decoding sequences
  holding C thousand tokens of context with P thousand prompt tokens prefilled in the step (a
  speculative step: draft plus verify, whatever its acceptance), fitted to every cell of the server
  from the cells' own timelines (start, first token and end of every request; non-negative least
  squares on relative error, each request's mean step time over its decode and its first-token
  step). The mix is then a closed loop of C workers over a suite of the basis suite's size whose
  requests are drawn stratum by stratum (each slot's stratum with the mix's probabilities), each
  with its measured decode steps and prompt length, stepped synchronously through T. Each request
  keeps its own measured speed: its multiplier (measured time over the model's replay of its own
  cell) scales the steps it takes part in, so the model only carries a request from its own batch
  into the mix's, and at c = 1 it returns the measured times.

Assumptions (docs/guides/your-traffic.md lists them): a request's decode steps do not depend on the mix (greedy
acceptance; a batch-size schedule that switches drafting by batch size breaks this in the tail); the
step cost depends on the batch (size, context, prefills), linearly, not on the sources in it (a
drafter whose cost depends on what it drafts breaks this); the mix's prompts are like the strata's
measured prompts (lengths, acceptance: post-stratification assumes the strata are the population);
closed loop (open loop is not predicted); no prefix-cache effects between requests.

**Intervals.** log speedup = mean over repeats of each repeat's predicted log speedup, with three
independent parts:
- the prompt sample, per stratum: a stratified bootstrap by prompt (resampled within each stratum,
  the same draw for both servers and every repeat: paired), its part shared by the repeats
  (comparison.shared_variance, as the verdicts count it); at c > 1 each resample is one simulated
  suite, and the variance of simulated suites at the measured data (the suite's own draw, not the
  estimate's error) is subtracted. The bootstrap's n_s/(n_s - 1) shortfall is corrected per stratum
  (the linearised variance of the post-stratified ratio, unbiased against plug-in) and the part gets
  Satterthwaite's dof over the strata (n_s - 1 each), so a stratum of 2-3 prompts widens the
  interval by its t quantile, and a weighted stratum of one prompt has no interval;
- run to run: tau^2 of both servers at c over R repeats (noise.RunToRun, as comparison.compare);
- the model's own error (c > 1): every measured suite's speedup predicted by the step model from its
  own requests (their steps and lengths, not their own speeds); the spread of these residuals across
  suites, less what the cells' own run-to-run noise spreads them by, with suites - 1 dof, is how much
  the model's misfit differs between batch conditions: the error the per-request calibration cannot
  remove when a mix puts requests of several suites in one batch. At c = 1 the prediction is exact
  and this part is zero.
Their sum gives a Student t interval at Satterthwaite's dof (noise.VarianceSum), and its verdict
follows the verdicts' rule (comparison.decision). Coverage is checked by simulation against a
discrete-event server that serves mixed batches (tests/test_traffic.py).

**Break-even.** Along the line from a mix toward one stratum (that stratum's share of requests growing
to 1, the rest in the mix's proportions), `share` is where the predicted speedup crosses 1, and
`lo`/`hi` where the pointwise interval's bounds cross 1: the shares whose interval contains 1, a
confidence set for the crossing (test inversion), i.e. where the interval's verdict changes.

**Check.** A verified profile's suite (`traffic_<name>`, never used by the prediction) is predicted at
its drawn composition; `check` gives measured / predicted - 1 with its interval (the server sessions
both share cancel in it) and whether it contains 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from .attribution import plain_steps
from .comparison import decision, repeat_mean_variance, shared_variance
from .measurements import LATENCY, _rng
from .noise import VarianceSum
from ..config import TRAFFIC_PREFIX, TRAINING_MIX
from ..records import (BreakEven, CellResult, Decision, Direction, Interval, SuiteMatch, TrafficCheck, TrafficProfile,
                       TrafficProfiles, TrafficRow)
from ..serving.controls import is_control
from ..stats import t_ppf

GRID = 11                 # points along a break-even line
LINE_BOOTSTRAP = 300      # resamples per point of a line (a profile's own prediction uses summary.bootstrap)
SUITES = 300              # simulated suites at the measured data (c > 1): the point estimate
ON_LINE = 0.1             # a measured suite whose composition lies within this TVD of a line is drawn on it


# -- what the model reads of a cell ----------------------------------------------------------------
@dataclass
class CellRequests:
    """One cell's successful requests in the order they were sent, each with its stratum and (for the
    step model) its timeline: start, time to first token, end-to-end latency, decode steps."""
    key: tuple
    prompts: list
    strata: list
    start: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    out: np.ndarray
    ptok: np.ndarray
    steps: np.ndarray | None        # decode steps per request (None: a speculative server without per-request counts)
    good: np.ndarray
    closed: bool
    m_dec: np.ndarray | None = None  # the request's speed against the step model's replay of its cell
    m_adm: np.ndarray | None = None

    @property
    def concurrency(self) -> int:
        return self.key[2]


def stratum_function(files: list[str]):
    """A request's stratum: its file suite (one stratum) or its source (a training or traffic suite)."""
    files = set(files)
    return lambda suite, source: suite if suite in files else source


def cell_requests(cell: CellResult, frame: pl.DataFrame, slo: dict, stratum) -> CellRequests:
    ok = frame.filter(pl.col("ok"))

    def col(name, fill=np.nan):
        return (ok[name].cast(pl.Float64).fill_null(fill).to_numpy() if name in ok.columns
                else np.full(ok.height, fill))

    out, e2e, ttft = col("output_tokens"), col("e2e_s"), col("ttft_s")
    start = col("start_s", 0.0)
    ptok = col("prompt_tokens", 0.0)
    decoded = np.maximum(out - 1, 0.0)
    spec, acc = col("num_spec_steps"), col("num_accepted_tokens", 0.0)
    if np.isfinite(spec).all() and ok.height:
        steps = spec + plain_steps(decoded, spec, acc)
    elif not (cell.spec_decode_num_drafts or 0):   # drafted nothing: one token per decode step
        steps = decoded
    else:
        steps = None
    good = np.ones(ok.height, bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    if slo.get("ttft_ms") is not None:
        good &= ttft * 1000 <= slo["ttft_ms"]
    if slo.get("tpot_ms") is not None:
        good &= np.nan_to_num(tpot, nan=0.0) * 1000 <= slo["tpot_ms"]
    if slo.get("e2el_ms") is not None:
        good &= e2e * 1000 <= slo["e2el_ms"]
    sources = ok["source"].to_list() if "source" in ok.columns else [None] * ok.height
    return CellRequests((cell.server, cell.suite, cell.concurrency, cell.repeat), ok["prompt_id"].to_list(),
                        [stratum(cell.suite, s) for s in sources], start, np.nan_to_num(ttft, nan=0.0), e2e, out,
                        np.nan_to_num(ptok, nan=0.0), steps, good, cell.request_rate in ("inf", None))


# -- the step model ---------------------------------------------------------------------------------
def _timeline(cr: CellRequests, theta: np.ndarray, points: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                               np.ndarray]:
    """Per request: its steps' mean features [1, b, C, P] over its decode (weighted by the steps T(theta)
    says were taken at each moment) and the features at its first-token step; the batch at every
    moment read from the cell's timeline (who was prefilling, who decoding, how much context)."""
    d0, d1 = cr.start + cr.ttft, cr.start + cr.e2e
    ts = np.linspace(0.0, float(d1.max()), points + 1)
    mid, dt = (ts[:-1] + ts[1:]) / 2, np.diff(ts)
    dec = (mid[None, :] >= d0[:, None]) & (mid[None, :] < d1[:, None])
    pre = (mid[None, :] >= cr.start[:, None]) & (mid[None, :] < d0[:, None])
    frac = np.clip((mid[None, :] - d0[:, None]) / np.maximum(d1 - d0, 1e-9)[:, None], 0.0, 1.0)
    ctx = (cr.ptok[:, None] + 1 + (cr.out[:, None] - 1) * frac) * dec
    F = np.stack([np.ones(points), dec.sum(0), ctx.sum(0) / 1000, (cr.ptok[:, None] * pre).sum(0) / 1000], 1)
    rate = dt / np.maximum(F @ theta, 1e-9)
    w = dec * rate[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        dec_f = (w @ F) / w.sum(1, keepdims=True)
    adm = np.clip(np.searchsorted(ts, cr.start + cr.ttft / 2) - 1, 0, points - 1)
    return dec_f, (cr.e2e - cr.ttft) / np.maximum(cr.steps, 1), F[adm], cr.ttft


def fit_step_model(cells: list[CellRequests], iterations: int = 3) -> np.ndarray | None:
    """theta of T(b, C, P) for one server from its cells (module docstring), or None without cells that
    count their decode steps. Relative least squares: every request's mean decode step and first-token
    step weigh alike whatever their length."""
    from scipy.optimize import nnls

    use = [c for c in cells if c.steps is not None and c.closed and len(c.e2e) and np.isfinite(c.e2e).all()]
    if not use:
        return None
    per_step = np.concatenate([(c.e2e - c.ttft)[c.steps > 0] / c.steps[c.steps > 0] for c in use])
    theta = np.array([float(np.median(per_step)) if per_step.size else 0.01, 0.0, 0.0, 0.0])
    for _ in range(iterations):
        xs, ys = [], []
        for c in use:
            dec_f, dec_y, adm_f, adm_y = _timeline(c, theta)
            keep = (c.steps > 0) & np.isfinite(dec_f).all(1) & (dec_y > 0)
            xs += [dec_f[keep] / dec_y[keep, None]]
            ys += [np.ones(int(keep.sum()))]
            keep = adm_y > 0
            xs += [adm_f[keep] / adm_y[keep, None]]
            ys += [np.ones(int(keep.sum()))]
        X, y = np.concatenate(xs), np.concatenate(ys)
        scale = np.maximum(np.abs(X).max(0), 1e-12)
        sol, _ = nnls(X / scale, y)
        theta = sol / scale
        if theta[0] <= 0 and theta[1] <= 0:
            theta[0] = float(np.median(per_step))
    return theta


def simulate(theta: np.ndarray, c: int, ptok: np.ndarray, out: np.ndarray, steps: np.ndarray,
             m_dec: np.ndarray | None = None, m_adm: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed loop of c workers over suites (rows x requests, each row in sending order) stepped
    synchronously through T(b, C, P): a request is prefilled in the step that admits it (its first
    token), then takes its decode steps (a request of s steps is done after ceil(s)); each step costs T
    times the mean multiplier of the requests in it. Between two events (an admission, a completion)
    the batch is fixed and its context grows by the same tokens every step, so the steps up to the next
    completion are summed in closed form. Returns every request's e2e and TTFT and each row's makespan."""
    ptok, out, steps = (np.atleast_2d(np.asarray(x, float)) for x in (ptok, out, steps))
    R, n = ptok.shape
    m_dec = np.ones((R, n)) if m_dec is None else np.atleast_2d(m_dec)
    m_adm = np.ones((R, n)) if m_adm is None else np.atleast_2d(m_adm)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_step = np.where(steps > 0, (out - 1) / steps, 0.0)     # tokens a decode step adds to the context
    w = min(c, n)
    rows = np.arange(R)[:, None]
    rr = np.broadcast_to(rows, (R, w))
    slot = np.tile(np.arange(w), (R, 1))
    fresh = np.ones((R, w), bool)
    left = steps[:, :w].copy()
    gen = np.zeros((R, w))
    nxt = np.full(R, w)
    t = np.zeros(R)
    start, ttft, end = np.zeros((R, n)), np.zeros((R, n)), np.zeros((R, n))
    while True:
        active = slot >= 0
        live = active.any(1)
        if not live.any():
            break
        idx = np.where(active, slot, 0)
        dec, pre = active & ~fresh, active & fresh
        p = ptok[rows, idx]
        g = np.where(dec, per_step[rows, idx], 0.0)
        # a row admitting requests takes one (prefill) step; the others every step up to the next completion
        k = np.where(pre.any(1), 1.0, np.ceil(np.where(dec, left, np.inf).min(1) - 1e-9))
        k = np.where(live & np.isfinite(k), np.maximum(k, 1.0), 0.0)
        b = dec.sum(1)
        C0 = ((p + 1 + gen) * dec).sum(1) / 1000
        P = (p * pre).sum(1) / 1000
        mult = (np.where(dec, m_dec[rows, idx], 0.0) + np.where(pre, m_adm[rows, idx], 0.0)).sum(1) / np.maximum(
            active.sum(1), 1)
        cost = (k * (theta[0] + theta[1] * b + theta[2] * C0 + theta[3] * P)
                + theta[2] * g.sum(1) / 1000 * k * (k - 1) / 2) * mult
        t = t + cost
        ttft[rr[pre], idx[pre]] = (t[:, None] - start[rows, idx])[pre]
        kk = k[:, None]
        gen = np.where(dec, gen + kk * g, gen)
        left = np.where(dec, left - kk, left)
        fresh[:] = False
        done = active & (left <= 1e-9)
        if done.any():
            end[rr[done], idx[done]] = np.broadcast_to(t[:, None], done.shape)[done]
            new = nxt[:, None] + np.cumsum(done, 1) - 1
            ok = done & (new < n)
            slot = np.where(done, np.where(ok, new, -1), slot)
            nidx = np.where(ok, new, 0)
            start[rr[ok], nidx[ok]] = np.broadcast_to(t[:, None], ok.shape)[ok]
            left = np.where(ok, steps[rows, nidx], left)
            gen = np.where(ok, 0.0, gen)
            fresh = ok.copy()
            nxt = np.minimum(nxt + done.sum(1), n)
    return end - start, ttft, end.max(1)


def calibrate(theta: np.ndarray, cr: CellRequests) -> None:
    """Each request's multipliers: its measured decode time and first-token time over the step model's
    replay of its own cell (its suite, in its order, at its concurrency)."""
    e2e, ttft, _ = simulate(theta, cr.concurrency, cr.ptok, cr.out, cr.steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        m_dec = (cr.e2e - cr.ttft) / (e2e[0] - ttft[0])
        m_adm = cr.ttft / ttft[0]
    cr.m_dec = np.where(np.isfinite(m_dec) & (m_dec > 0), m_dec, 1.0)
    cr.m_adm = np.where(np.isfinite(m_adm) & (m_adm > 0), m_adm, 1.0)


def figures(metric: str, out: np.ndarray, e2e: np.ndarray, ttft: np.ndarray, makespan: np.ndarray,
            slo: dict) -> np.ndarray:
    """A simulated suite's figure per row, as a cell defines it (measurements.Arrays.point)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    if metric == "tpot":
        return np.nanmean(tpot, axis=-1)
    if metric == "e2el":
        return e2e.mean(-1)
    if metric == "goodput":
        good = np.ones(out.shape, bool)
        if slo.get("ttft_ms") is not None:
            good &= ttft * 1000 <= slo["ttft_ms"]
        if slo.get("tpot_ms") is not None:
            good &= np.nan_to_num(tpot, nan=0.0) * 1000 <= slo["tpot_ms"]
        if slo.get("e2el_ms") is not None:
            good &= e2e * 1000 <= slo["e2el_ms"]
        return good.sum(-1) / makespan
    return out.sum(-1) / makespan


def log_speedup(metric: str, fx: np.ndarray, fb: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.log(fb) - np.log(fx) if metric in LATENCY else np.log(fx) - np.log(fb)
    return ratio


# -- one server against the baseline at one concurrency ------------------------------------------------
FIELDS = ("e2e", "ttft", "out", "ptok", "steps", "good", "m_dec", "m_adm", "tpot")


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


def _per_prompt(cr: CellRequests, prompts: list[str]) -> dict:
    pos = {p: i for i, p in enumerate(prompts)}
    idx = np.array([pos.get(p, -1) for p in cr.prompts])
    keep = idx >= 0
    cnt = np.bincount(idx[keep], minlength=len(prompts)).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(cr.out > 1, (cr.e2e - cr.ttft) / np.maximum(cr.out - 1, 1), np.nan)
    vals = {"e2e": cr.e2e, "ttft": cr.ttft, "out": cr.out, "ptok": cr.ptok,
            "steps": cr.steps if cr.steps is not None else np.full(len(cr.out), np.nan),
            "good": cr.good.astype(float), "m_dec": cr.m_dec if cr.m_dec is not None else np.ones(len(cr.out)),
            "m_adm": cr.m_adm if cr.m_adm is not None else np.ones(len(cr.out)), "tpot": tpot}
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

    def __init__(self, pair: Pair, slo: dict, rng_of, bootstrap: int):
        self.p, self.slo = pair, slo
        self.metric = "output_throughput"
        self.names = sorted(pair.strata)
        self.rng_of = rng_of
        self.bootstrap = bootstrap
        self._draws: dict = {}
        self._cache: dict = {}

    # the random numbers: stratified resamples of each stratum's prompts, and (c > 1) the simulated
    # suites' slots (a uniform for the stratum, one for the prompt), shared by both servers, every
    # repeat and every mix
    def draws(self, rows: int) -> dict:
        if rows not in self._draws:
            rng = self.rng_of("traffic", self.p.concurrency, rows, tuple((s, self.p.strata[s].n) for s in self.names))
            d = {"res": {s: rng.integers(0, self.p.strata[s].n, (rows, self.p.strata[s].n)) for s in self.names}}
            n = self.p.size
            d["u_boot"], d["v_boot"] = rng.random((rows, n)), rng.random((rows, n))
            d["u_suite"], d["v_suite"] = rng.random((SUITES, n)), rng.random((SUITES, n))
            self._draws[rows] = d
        return self._draws[rows]

    def estimate(self, mix: dict, metric: str, rows: int | None = None) -> Estimate:
        """The predicted log speedup of `mix` on `metric` (simulated suites are shared across metrics)."""
        self.metric = metric
        rows = rows or self.bootstrap
        if self.p.concurrency == 1:
            boot, point = self._closed_form(mix, rows)
            S = None
        else:
            boot, point, S = self._simulated(mix, rows)
        R = len(self.p.repeats)
        ok = np.isfinite(boot).all(0)
        boot = boot[:, ok]
        w = shared_variance(boot) if R >= 2 else repeat_mean_variance(boot)
        if S is not None:   # one simulated suite per resample: its own draw is not the estimate's error
            w = max(w - repeat_mean_variance(S[:, np.isfinite(S).all(0)]), 0.0)
        kappa, dof = self._small_strata(mix)
        return Estimate(float(np.mean(point)), w * kappa, dof, [float(x) for x in point])

    # c = 1: exact, in closed form
    def _closed_form(self, mix: dict, rows: int) -> tuple[np.ndarray, np.ndarray]:
        d = self.draws(rows)
        boot, point = [], []
        for r in self.p.repeats:
            fig_b, fig_p = {}, {}
            for x in (self.p.server, self.p.baseline):
                num_b = den_b = 0.0
                num_p = den_p = 0.0
                for s, wt in mix.items():
                    if wt <= 0:
                        continue
                    v = self.p.strata[s].data[(x, r)]
                    num, den = self._num_den(v)
                    res = d["res"][s]
                    num_b = num_b + wt * num[res].mean(1)
                    den_b = den_b + wt * (den[res].mean(1) if den is not None else 1.0)
                    num_p += wt * num.mean()
                    den_p += wt * (den.mean() if den is not None else 1.0)
                fig_b[x], fig_p[x] = num_b / den_b, num_p / den_p
            boot.append(log_speedup(self.metric, fig_b[self.p.server], fig_b[self.p.baseline]))
            point.append(float(log_speedup(self.metric, np.array(fig_p[self.p.server]),
                                           np.array(fig_p[self.p.baseline]))))
        return np.array(boot), np.array(point)

    def _num_den(self, v: dict) -> tuple[np.ndarray, np.ndarray | None]:
        if self.metric == "tpot":
            return v["tpot"], None
        if self.metric == "e2el":
            return v["e2e"], None
        return (v["good"] if self.metric == "goodput" else v["out"]), v["e2e"]

    # c > 1: simulated suites
    def _slots(self, mix: dict, u: np.ndarray, v: np.ndarray, res: dict | None) -> tuple[np.ndarray, np.ndarray]:
        """Each slot's stratum (by the mix's cumulative shares) and prompt (resampled where `res`)."""
        names = [s for s in self.names if mix.get(s, 0) > 0]
        cum = np.cumsum([mix[s] for s in names])
        cum = cum / cum[-1]
        which = np.minimum(np.searchsorted(cum, u, side="right"), len(names) - 1)
        pick = np.zeros(u.shape, int)
        for j, s in enumerate(names):
            m = which == j
            k = np.floor(v * self.p.strata[s].n).astype(int)
            if res is not None:
                k = np.take_along_axis(res[s], k, 1)
            pick[m] = k[m]
        return np.array(names)[which], pick

    def _gather(self, x: str, r: int, names: np.ndarray, pick: np.ndarray) -> dict:
        out = {k: np.zeros(names.shape) for k in ("ptok", "out", "steps", "m_dec", "m_adm")}
        for s in np.unique(names):
            m = names == s
            v = self.p.strata[str(s)].data[(x, r)]
            for k in out:
                out[k][m] = v[k][pick[m]]
        return out

    def _run(self, x: str, r: int, names: np.ndarray, pick: np.ndarray) -> tuple:
        g = self._gather(x, r, names, pick)
        e2e, ttft, span = simulate(self.p.theta[x], self.p.concurrency, g["ptok"], g["out"], g["steps"],
                                   g["m_dec"], g["m_adm"])
        return g["out"], e2e, ttft, span

    def _simulated(self, mix: dict, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = self.draws(rows)
        nb, pb = self._slots(mix, d["u_boot"], d["v_boot"], d["res"])
        ns, ps = self._slots(mix, d["u_suite"], d["v_suite"], None)
        boot, suites = [], []
        key = tuple(sorted((s, round(w, 12)) for s, w in mix.items() if w > 0))
        for r in self.p.repeats:
            figs = {}
            for x in (self.p.server, self.p.baseline):
                ck = (x, r, key, rows)
                if ck not in self._cache:
                    self._cache[ck] = (self._run(x, r, nb, pb), self._run(x, r, ns, ps))
                figs[x] = [figures(self.metric, *raw, self.slo) for raw in self._cache[ck]]
            boot.append(log_speedup(self.metric, figs[self.p.server][0], figs[self.p.baseline][0]))
            suites.append(log_speedup(self.metric, figs[self.p.server][1], figs[self.p.baseline][1]))
        suites = np.array(suites)
        point = np.array([float(np.nanmean(s)) for s in suites])
        return np.array(boot), point, suites

    # the prompt sample's small-stratum correction and dof, from the linearised post-stratified ratio
    def _small_strata(self, mix: dict) -> tuple[float, float]:
        parts = []
        tot = {}
        means = {}
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
            ss = float((psi ** 2).sum())
            parts.append((ss / n ** 2, ss / (n * (n - 1)), n - 1))
        plug = sum(p[0] for p in parts)
        unb = sum(p[1] for p in parts)
        den = sum(p[1] ** 2 / p[2] for p in parts if p[1] > 0)
        kappa = unb / plug if plug > 0 else 1.0
        dof = unb ** 2 / den if den > 0 else float("inf")
        return kappa, dof


# -- the model's own error --------------------------------------------------------------------------------
def cell_figure(cr: CellRequests, cell: CellResult, metric: str, slo: dict) -> float | None:
    """A cell's own figure, as the verdicts read it (measurements.Arrays.point)."""
    if metric == "output_throughput":
        return cell.output_throughput
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(cr.out > 1, (cr.e2e - cr.ttft) / np.maximum(cr.out - 1, 1), np.nan)
    if metric == "tpot":
        v = tpot[np.isfinite(tpot)]
        return float(v.mean()) if v.size else None
    if metric == "e2el":
        return float(cr.e2e.mean()) if cr.e2e.size else None
    return float(cr.good.sum()) / cell.duration if cell.duration else None


def model_residuals(reqs: dict, cells: dict, thetas: dict, server: str, baseline: str, c: int, metric: str,
                    slo: dict, suites: list[str]) -> dict[str, float]:
    """Each suite's measured log speedup at c minus the step model's replay of its own requests (its
    prompts in its order, their measured decode steps and lengths, without their own speeds: the
    multipliers at 1), the mean over the repeats both servers measured. The prediction carries each
    request's own speed into the mix, so a misfit common to every suite cancels; what it cannot remove
    is how the misfit differs between batch conditions, which the spread of these residuals shows.
    (Leaving the suite out of the fit was tried, and read several times the actual error: without all
    of a suite's cells the fit extrapolates to contexts it never saw, 3-4x; without its cells at c
    alone, the suite's level at c is extrapolated from other concurrencies, which a mix never needs,
    1.5-3x. tests/test_traffic.py measures the coverage this check gives.)"""
    out = {}
    if any(thetas.get(x) is None for x in (server, baseline)):
        return out
    for u in suites:
        reps = sorted({k[3] for k in reqs if k[:3] == (server, u, c)} & {k[3] for k in reqs if k[:3] == (baseline, u, c)})
        diffs = []
        for r in reps:
            got = {}
            for x in (server, baseline):
                cr = reqs[(x, u, c, r)]
                if cr.steps is None or not cr.closed:
                    break
                e2e, ttft, span = simulate(thetas[x], c, cr.ptok, cr.out, cr.steps)
                got[x] = (float(figures(metric, cr.out[None, :], e2e, ttft, span, slo)[0]),
                          cell_figure(cr, cells[(x, u, c, r)], metric, slo))
            if len(got) < 2 or any(v[1] is None or not v[1] > 0 or not v[0] > 0 for v in got.values()):
                continue
            meas = float(log_speedup(metric, np.array(got[server][1]), np.array(got[baseline][1])))
            model = float(log_speedup(metric, np.array(got[server][0]), np.array(got[baseline][0])))
            diffs.append(meas - model)
        if diffs:
            out[u] = float(np.mean(diffs))
    return out


def model_error(residuals: dict[str, float], noise: float = 0.0) -> tuple[float, float] | None:
    """The model's error variance from the leave-one-suite-out residuals: their spread across suites
    (the prediction keeps each request's own measured speed, so a level every suite shares is not its
    error) less what the cells' own run-to-run noise spreads them by (`noise`: a residual's variance
    from it; the prompt sample cancels, a residual replays its own suite's requests), with suites - 1
    dof; None with fewer than two suites (unchecked)."""
    if len(residuals) < 2:
        return None
    v = np.array(list(residuals.values()))
    return max(float(v.var(ddof=1)) - noise, 0.0), float(len(v) - 1)


# -- the report -----------------------------------------------------------------------------------------
def profiles_from_matches(matches: list[SuiteMatch]) -> TrafficProfiles:
    """Without a traffic.json (a run before traffic profiles): the training mix of the first training
    suite whose match record names its sources' training shares, and the file suites."""
    basis = next((m for m in matches if m.kind == "training" and (m.strata or m.training_sources)), None)
    files = [m.suite for m in matches if m.kind == "file"]
    if basis is None:
        return TrafficProfiles(None, {}, files)
    if basis.strata:
        shares = {s: v["training_share"] for s, v in basis.strata.items()}
    else:
        total = sum(basis.training_sources.values()) or 1
        shares = {s: n / total for s, n in basis.training_sources.items()}
    return TrafficProfiles(basis.suite, shares, files, [TrafficProfile(TRAINING_MIX, dict(shares), {TRAINING_MIX: 1.0})])


def _interval(est: float, parts: VarianceSum, confidence: float) -> Interval:
    se = math.sqrt(parts.total)
    t = t_ppf(0.5 + confidence / 2, parts.dof)
    return Interval(math.exp(est), math.exp(est - t * se), math.exp(est + t * se))


def _crossing(xs: np.ndarray, ys: np.ndarray) -> float | None:
    """The first x where ys (linear between points) changes sign from its start; None if it never does."""
    s0 = np.sign(ys[0])
    if s0 == 0:
        return float(xs[0])
    for i in range(1, len(xs)):
        if np.sign(ys[i]) != s0:
            f = ys[i - 1] / (ys[i - 1] - ys[i]) if ys[i - 1] != ys[i] else 0.0
            return float(xs[i - 1] + f * (xs[i] - xs[i - 1]))
    return None


class Report:
    """Everything traffic_report computes, by (server, concurrency)."""

    def __init__(self, an, profiles: TrafficProfiles, matches: list[SuiteMatch], cells: list):
        self.an, self.s = an, an.settings
        self.profiles = profiles
        self.matches = {m.suite: m for m in matches}
        stratum = stratum_function(profiles.files)
        self.reqs = {}
        self.cells = {}
        for cell, frame in cells:
            k = (cell.server, cell.suite, cell.concurrency, cell.repeat)
            self.cells[k] = cell
            self.reqs[k] = cell_requests(cell, frame, self.s.slo, stratum)
        self.measuring = [u for u in ([profiles.basis] if profiles.basis else []) + list(profiles.files)
                          if any(k[1] == u for k in self.reqs)]
        self.model_suites = [u for u in dict.fromkeys(k[1] for k in self.reqs) if not u.startswith(TRAFFIC_PREFIX)]
        self.theta = {}
        for x in dict.fromkeys(k[0] for k in self.reqs):
            mine = [cr for k, cr in self.reqs.items() if k[0] == x and k[1] in self.model_suites]
            self.theta[x] = fit_step_model(mine) if any(k[2] > 1 for k in self.reqs if k[0] == x) else None
            if self.theta[x] is not None:
                for cr in mine + [cr for k, cr in self.reqs.items() if k[0] == x and k[1] not in self.model_suites]:
                    if cr.steps is not None and cr.closed and cr.concurrency > 1:
                        calibrate(self.theta[x], cr)

    def pair(self, server: str, c: int) -> Pair:
        b = self.an.baseline
        strata: dict = {}
        reps = None
        for u in self.measuring:
            r = sorted({k[3] for k in self.reqs if k[:3] == (server, u, c)} & {k[3] for k in self.reqs
                                                                             if k[:3] == (b, u, c)})
            if r:
                reps = set(r) if reps is None else reps & set(r)
        reps = sorted(reps or [])
        size = 0
        for u in self.measuring:
            if not reps or (server, u, c, reps[0]) not in self.reqs:
                continue
            crs = [self.reqs[(x, u, c, r)] for r in reps for x in (server, b)]
            common = set.intersection(*(set(cr.prompts) for cr in crs))
            by: dict = {}
            for p, st in zip(crs[0].prompts, crs[0].strata):
                if p in common:
                    by.setdefault(st, set()).add(p)
            if u == self.profiles.basis or not size:
                size = len(crs[0].prompts)
            for st, ps in by.items():
                if u != self.profiles.basis and st != u:
                    continue
                prompts = sorted(ps)
                data = {(x, r): _per_prompt(self.reqs[(x, u, c, r)], prompts) for r in reps for x in (server, b)}
                strata[st] = Stratum(st, u, prompts, data)
        closed = all(self.reqs[k].closed for k in self.reqs if k[0] in (server, b) and k[2] == c)
        pair = Pair(server, b, c, reps, strata, size)
        if c > 1 and closed:
            pair.theta = {server: self.theta.get(server), b: self.theta.get(b)}
        if not closed:
            pair.note = "open loop: not predicted"
        return pair


def traffic_report(an, profiles: TrafficProfiles | None, matches: list[SuiteMatch], cells: list,
                   lines: bool = True) -> list[TrafficRow]:
    """Every profile's predicted speedup (module docstring) for every speculative server and concurrency,
    on summary.recommend_metric and TPOT, with the measured speedup of its verifying suite and the
    break-even shares (`lines`: False skips them). `cells`: the (CellResult, requests frame) pairs the
    analysis read."""
    profiles = profiles if profiles is not None and profiles.profiles else profiles_from_matches(matches)
    if not profiles.profiles:
        return []
    rep = Report(an, profiles, matches, cells)
    s = an.settings
    metrics = list(dict.fromkeys([s.recommend_metric, "tpot"]))
    servers = [x for x in an.servers if x != an.baseline and not is_control(x)
               and any(k[0] == x and k[1] in rep.measuring for k in rep.reqs)]
    rows: list[TrafficRow] = []
    for x in servers:
        for c in an.concurrencies:
            pair = rep.pair(x, c)
            if not pair.repeats:
                continue
            pred = Predictor(pair, s.slo, lambda *key: _rng(s, *key), s.bootstrap)
            for metric in metrics:
                rows += _rows(rep, pair, pred, metric, lines)
    return rows


def _composition(rep: Report, server: str, suite: str, c: int) -> dict | None:
    """A measured suite's strata shares (its prompts, from its requests at c)."""
    got = [cr for k, cr in rep.reqs.items() if k[:3] == (server, suite, c)]
    if not got:
        return None
    first: dict = {}
    for p, st in zip(got[0].prompts, got[0].strata):
        first.setdefault(p, st)
    counts: dict = {}
    for st in first.values():
        counts[st] = counts.get(st, 0) + 1
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def _rows(rep: Report, pair: Pair, pred: Predictor, metric: str, lines: bool = True) -> list[TrafficRow]:
    an, s = rep.an, rep.an.settings
    x, c = pair.server, pair.concurrency
    R = len(pair.repeats)
    rr = an.run_to_run
    ts, tb = rr.at(metric, x, c), rr.at(metric, an.baseline, c)
    run = ts is not None and tb is not None
    merr = None
    note_model = None
    if c > 1:
        res = model_residuals(rep.reqs, rep.cells, rep.theta, x, an.baseline, c, metric, s.slo, rep.model_suites)
        # a residual's own noise: each suite's cells move by their own conditions (the session's part of
        # run to run is shared by every suite of a session, and cancels in the spread)
        cell_part = (1 - rr.session_share.get(metric, 0.0)) * (ts.total + tb.total) / R if run else 0.0
        merr = model_error(res, cell_part)
        if merr is None:
            note_model = "the model's error at c > 1 is unchecked (fewer than two measured suites)"
        if not any(k[2] == 1 and k[0] in (x, an.baseline) for k in rep.reqs):
            note_model = "; ".join(n for n in (note_model, (
                "no c=1 cells: the step model's batch dependence rests on the batched cells alone (a mix unlike "
                "the measured suites may be mispredicted beyond its interval)")) if n)

    def parts_for(est: Estimate, key) -> VarianceSum:
        out = VarianceSum().add(("traffic-w", x, c, metric) + key, est.var_w, est.dof_w)
        if run:
            out.plus(ts, 1 / R).plus(tb, 1 / R)
        if merr is not None:
            out.add(("model", x, c, metric), merr[0], merr[1])
        return out

    def interval(mix: dict, key, rows: int | None = None) -> tuple[Interval, VarianceSum, Estimate] | None:
        if pair.usable(mix) is not None:
            return None
        est = pred.estimate(mix, metric, rows)
        parts = parts_for(est, key)
        return _interval(est.value, parts, s.confidence), parts, est

    def line(start: dict, toward: str) -> BreakEven | None:
        if pair.usable({toward: 1.0}) is not None or pair.usable(start) is not None:
            return None
        s0 = start.get(toward, 0.0)
        if s0 >= 1 - 1e-9:
            return None
        curve, lam = [], np.linspace(0, 1, GRID)
        for l in lam:
            mix = {k: (1 - l) * v for k, v in start.items()}
            mix[toward] = mix.get(toward, 0.0) + l
            got = interval(mix, ("line", toward, round(float(l), 6)), min(LINE_BOOTSTRAP, s.bootstrap))
            iv = got[0]
            curve.append([s0 + l * (1 - s0), iv.value, iv.lo, iv.hi])
        shares = np.array([p[0] for p in curve])
        logs = np.log(np.array([[p[1], p[2], p[3]] for p in curve]))
        point = _crossing(shares, logs[:, 0])
        first, second = _crossing(shares, logs[:, 1]), _crossing(shares, logs[:, 2])
        falls = logs[-1, 0] < logs[0, 0]
        lo, hi = (first, second) if falls else (second, first)
        direction = (Direction.STOPS_PAYING if falls else Direction.STARTS_PAYING) if point is not None else None
        note = None
        if point is None:
            note = (f"{'pays' if logs[0, 0] > 0 else 'loses'} (point estimate) all the way to {toward} alone")
        be = BreakEven(toward, point, lo, hi, direction, s0, curve, [], note)
        for u in rep.measuring + [p.suite for p in rep.profiles.profiles if p.suite]:
            comp = _composition(rep, x, u, c)
            v = an.verdict(x, u, c, metric)
            if comp is None or v is None or v.speedup is None:
                continue
            l = (comp.get(toward, 0.0) - s0) / (1 - s0)
            if not -0.05 <= l <= 1.05:
                continue
            on = {k: (1 - l) * w for k, w in start.items()}
            on[toward] = on.get(toward, 0.0) + l
            tvd = 0.5 * sum(abs(comp.get(k, 0.0) - on.get(k, 0.0)) for k in set(comp) | set(on))
            if tvd <= ON_LINE:
                be.measured.append([comp.get(toward, 0.0), v.speedup, v.lo, v.hi, u])
        return be

    toward_file = next((f for f in rep.profiles.files if f in pair.strata), None)
    strata_iv: dict = {}
    training = rep.profiles.profile(TRAINING_MIX)
    lines_tm: list = []
    if lines and training is not None and pair.usable(training.mix) is None:
        for st in sorted(pair.strata):
            be = line(training.mix, st)
            if be is not None:
                lines_tm.append(be)
                end = be.curve[-1]
                strata_iv[st] = Interval(end[1], end[2], end[3])
    out = []
    for prof in rep.profiles.profiles:
        mix = prof.mix
        why = pair.note or pair.usable(mix)
        row = TrafficRow(prof.name, dict(mix), x, c, metric, None, None, Decision.INCONCLUSIVE,
                         suite=prof.suite, strata=dict(strata_iv), confidence=s.confidence)
        if prof.suite:
            v = an.verdict(x, prof.suite, c, metric)
            if v is not None and v.speedup is not None:
                row.measured = Interval(v.speedup, v.lo, v.hi)
        if why is not None:
            row.note = f"not predicted: {why}"
            out.append(row)
            continue
        got = interval(mix, ("profile", prof.name))
        iv, parts, est = got
        row.predicted = iv
        lo_l, hi_l = math.log(iv.lo), math.log(iv.hi)
        row.verdict = decision(lo_l, hi_l, math.log(1 + s.min_effect), run)
        row.parts = {"prompts": next(v for k, (v, _) in parts.parts.items() if k[0] == "traffic-w"),
                     "run_to_run": sum(v for k, (v, _) in parts.parts.items() if k[0] not in ("traffic-w", "model")),
                     "model": merr[0] if merr is not None else (0.0 if c == 1 else None),
                     "dof": parts.dof, "repeats": R, "run_to_run_measured": run}
        if prof.name == TRAINING_MIX:
            row.break_evens = lines_tm
            row.break_even = next((b for b in lines_tm if b.toward == toward_file), None)
        elif lines and toward_file is not None:
            row.break_even = line(mix, toward_file)
        notes = [n for n in (note_model,) if n]
        if prof.suite and row.measured is not None:
            comp = _composition(rep, x, prof.suite, c)
            at = interval(comp, ("check", prof.name)) if comp and pair.usable(comp) is None else None
            if at is not None:
                row.check = _check(an, prof.suite, x, c, metric, at, row.measured)
                if any(abs(comp.get(k, 0) - mix.get(k, 0)) > 1e-9 for k in set(comp) | set(mix)):
                    notes.append("checked at the verifying suite's drawn composition: "
                                 + ", ".join(f"{k} {v:.0%}" for k, v in sorted(comp.items())))
        row.note = "; ".join(notes) or None
        out.append(row)
    return out


def _check(an, suite: str, server: str, c: int, metric: str, predicted: tuple, measured: Interval) -> TrafficCheck:
    """Measured against predicted at the verifying suite's composition: log(measured / predicted) with
    the variance of both estimates less the server-session part they share (it cancels)."""
    iv, parts, est = predicted
    s = an.settings
    cmp = next((k for k in an.comparisons.get((server, suite, metric), []) if k.concurrency == c), None)
    d = math.log(measured.value) - est.value
    v_meas = cmp.se ** 2 if cmp is not None and cmp.se is not None else 0.0
    shared = sum(cmp.session.values()) if cmp is not None else 0.0
    var = max(parts.total + v_meas - 2 * shared, parts.total - shared, 1e-12)
    dof = min(parts.dof, cmp.dof if cmp is not None else float("inf"))
    t = t_ppf(0.5 + s.confidence / 2, dof)
    lo, hi = d - t * math.sqrt(var), d + t * math.sqrt(var)
    return TrafficCheck(math.exp(d) - 1, math.exp(lo) - 1, math.exp(hi) - 1, lo <= 0 <= hi)
