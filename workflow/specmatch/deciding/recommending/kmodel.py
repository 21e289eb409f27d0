"""Which k at which load, part one: the k-sweep records and the model of the speedup
per k. The best k per concurrency is decided in kchoice, the batch bands in kbands, and the deployment
that runs them (an engine-neutral schedule, rendered by the sweep's engine adapter) with its text and
verification references in krecommend; the records of all four live here, beside the model.

The servers of one k sweep (specmatch.sweep: `eagle3@k=1`, `eagle3@k=2`, ...) and the baseline (k = 0)
were measured on the same prompts at the same concurrencies, in repeated server sessions.

**The model** (predict). A speculative step yields tau tokens and costs rho plain decode steps of the
baseline, so the TPOT speedup is tau / rho (specmatch.deciding.explaining.attribution). vLLM reports the acceptance rate
at each draft position p = 0, 1, ... (`spec_decode_per_position_acceptance_rates`: accepted tokens at
position p over drafts; a token is accepted only if every one before it was, so r_p is already the
product of the conditional acceptances a_0 ... a_p). A drafter's proposal at position p does not
depend on how many positions follow it, so a server drafting k' <= K tokens yields

    tau(k') = 1 + sum_{p < k'} r_p          (r from the server of the largest measured k, K)

The step cost rho(k, c) comes from the measured cells (rho = tau x TPOT_server / TPOT_baseline, with
its interval, attribution.decompose); for a k that was not measured it is interpolated linearly in k
between the nearest measured k below and above at the same concurrency (never extrapolated outside
the measured k; the record says "interpolated" and between which). The predicted TPOT speedup is
tau(k) / rho(k, c) with an interval by the delta method on the log scale (below).

The model is checked, not trusted: for every k that was run, the prediction is made without that k's
own data where it can be (tau from the largest k's per-position rates; rho interpolated between the
neighbouring measured k when k lies between two of them, leaving its own out) and set beside the
measured TPOT speedup (`KPoint.within`: the measured figure lies in the predicted interval;
`KPoint.held_out` says which parts of the prediction did not use that k's data; with none held out
the comparison is no check and `within` is None).

Intervals. Each measured interval (attribution's: a paired bootstrap by prompt plus the measured
run-to-run variance) is read back as a log-scale standard error, half its log width over the normal
quantile (a t interval is wider than the normal one at its level, so this errs wide). tau(k) from the
per-position rates: the prompt sample moves the extra tokens (tau - 1) of every k together, so their
relative error is taken as the largest k's measured one: se(log tau(k)) = s (tau(k) - 1) / tau(k) with
s = se(log tau_K) tau_K / (tau_K - 1). An interpolated rho: se(rho) = (1 - w) rho_a se_a + w rho_b se_b
(its two ends share the baseline's cells, so their errors are taken as perfectly correlated: an upper
bound). The prediction: se^2 = se(log tau)^2 + se(log rho)^2 (the two are positively correlated through
the prompts, so this errs wide too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Optional

from ..explaining.attribution import acceptance_run_to_run, decompose
from ..verdicts.acceptance import per_position_rates
from ..reading.measurements import Measurements
from ..verdicts.noise import RunToRun
from ...records import Deployment, Interval, Record, Schedule, Verdict, Verification


# -- records ------------------------------------------------------------------------------------
@dataclass
class KPoint(Record):
    """One k of a sweep at one (suite, concurrency): the model's predicted TPOT speedup over the
    baseline and, for a k that was run, the measured one beside it."""
    parent: str
    suite: str
    concurrency: int
    k: int
    server: Optional[str]                       # the sweep member that ran this k (None: not run)
    tokens_per_step: Optional[Interval]         # tau(k) the model uses
    tau_from: Optional[str]                     # "per-position acceptance of <server> (k=K)" | "measured"
    step_cost: Optional[Interval]               # rho(k, c) the model uses
    step_cost_from: Optional[str]               # "measured" | "interpolated" | None (not available)
    interpolated_between: Optional[list]        # [k below, k above] for an interpolated rho
    predicted: Optional[Interval]               # TPOT speedup over the baseline, tau / rho
    held_out: list = field(default_factory=list)  # of this k's own data, what the prediction did not use
    measured: Optional[Interval] = None         # the measured TPOT speedup (attribution's), for a k that ran
    measured_tokens_per_step: Optional[Interval] = None
    measured_step_cost: Optional[Interval] = None
    within: Optional[bool] = None               # measured figure inside the predicted interval (None: no check)
    ratio: Optional[float] = None               # measured / predicted
    confidence: float = 0.9
    note: Optional[str] = None


@dataclass
class KChoice(Record):
    """The best k at one measured concurrency, decided like every verdict (kchoice)."""
    parent: str
    suite: str
    concurrency: int
    metric: str
    k: Optional[int]                            # the chosen k (0: off); None: undecided
    server: Optional[str]                       # the server that runs it (the baseline for 0)
    how: str                                    # best | smallest equivalent | pays, k open | undecided | none
    best: Optional[int]                         # the k with the largest estimated speedup
    candidates: list = field(default_factory=list)   # undecided / pays, k open: the k the data cannot tell from
                                                     # the best (the best among them; off where the best does
                                                     # not beat it at deploy_confidence)
    equivalent: list = field(default_factory=list)   # k within +/-min_effect of the best
    speedups: dict = field(default_factory=dict)     # str(k) -> {speedup, lo, hi, verdict} against the baseline
    pairwise: list[Verdict] = field(default_factory=list)  # the best against every other candidate
    decide: Optional[str] = None                # undecided: what would decide it
    note: Optional[str] = None
    paying: list = field(default_factory=list)  # the k that pay against the baseline at deploy_confidence
    deploy_confidence: Optional[float] = None   # 1 - alpha / K: the level speculating here needs (K k measured)


@dataclass
class KBand(Record):
    """Batch sizes lo..hi (inclusive) and the k deployed there."""
    lo: int
    hi: int
    k: int
    decided_at: list = field(default_factory=list)    # decided concurrencies inside the band
    undecided_at: list = field(default_factory=list)  # measured but undecided concurrencies inside it
    pinned_at: list = field(default_factory=list)     # undecided ones, each run by its own best-supported candidate
                                                      # (off: no k pays there at the deploying level; kbands.bands)
    boundary: str = "start"                     # how lo was placed: start | crossover | geometric mean | measured range
    extrapolated: Optional[str] = None          # "above" / "below": beyond the largest / under the smallest measured
                                                # concurrency (not measured there)


@dataclass
class KRecommendation(Record):
    """Which k at which load for one sweep on one suite, and the deployment that runs it."""
    parent: str
    suite: str
    metric: str
    action: str                                 # schedule | keep (one k everywhere) | off | undecided
    choices: list[KChoice] = field(default_factory=list)
    bands: list[KBand] = field(default_factory=list)
    k: Optional[int] = None                     # keep: the one k
    server: Optional[str] = None                # keep: the member that runs it as measured; off: the baseline
    schedule: Optional[Schedule] = None         # the bands, neighbours with the same k merged, covering 1..max_batch
    deploy: Optional[Deployment] = None         # the schedule as the sweep's engine runs it (its adapter's rendering)
    extrapolated_above: Optional[int] = None    # the largest measured concurrency, when max_batch exceeds it
    extrapolated_below: Optional[int] = None    # the smallest measured concurrency, when it is above 1
    max_batch: Optional[int] = None
    undecided_top: Optional[int] = None         # the largest measured concurrency when it is undecided: above it
                                                # speculation is off (nothing extrapolated; kbands.bands)
    error_rates: dict = field(default_factory=dict)  # the bounds on a false "speculate" (kchoice):
                                                     # per_concurrency, over_schedule (C measured concurrencies)
    boundary_rule: str = "crossover of the two k's speedup curves on log concurrency, else the geometric mean"
    text: str = ""
    derived_server: Optional[str] = None        # `<parent>__recommended`: the schedule, measured on the grid
    verified: Optional[Verification] = None     # its measured check against each band's member (references())

    def k_at(self, batch: int) -> Optional[int]:
        """The k the recommendation deploys at a batch size (None: no band holds it)."""
        return next((b.k for b in self.bands if b.lo <= batch <= b.hi), None)


@dataclass
class KSweeps(Record):
    """`results/summary/k_sweeps.json`: every k sweep's recommendation (with its verification) and every
    k's predicted against measured speedup."""
    recommendations: list[KRecommendation] = field(default_factory=list)
    points: list[KPoint] = field(default_factory=list)


# -- intervals ------------------------------------------------------------------------------------
def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _log_se(iv: Interval | None, confidence: float) -> float | None:
    """A log-scale standard error read back from an interval (errs wide for a t interval)."""
    if iv is None or iv.lo is None or iv.hi is None or iv.lo <= 0 or iv.hi <= 0:
        return None
    return (math.log(iv.hi) - math.log(iv.lo)) / (2 * _z(confidence))


def _iv(log_est: float, se: float, confidence: float) -> Interval:
    z = _z(confidence)
    return Interval(math.exp(log_est), math.exp(log_est - z * se), math.exp(log_est + z * se))


# -- per-position acceptance -> tokens per step -------------------------------------------------------
def tokens_per_step(rates: list[float], k: int) -> float:
    """tau(k) = 1 + sum_{p < k} r_p: expected tokens a step drafting k yields (k <= len(rates))."""
    if k > len(rates):
        raise ValueError(f"tau({k}): per-position rates reach only k={len(rates)}")
    return 1.0 + float(sum(rates[:k]))


# -- the model ---------------------------------------------------------------------------------------
@dataclass
class _Measured:
    tau: Interval | None
    rho: Interval | None
    tpot: Interval | None
    note: str | None


def _decompositions(m: Measurements, rr: RunToRun, ks: dict[int, str], baseline: str, suite: str,
                    concurrencies: list[int]) -> dict:
    acc_rr = acceptance_run_to_run(m, [baseline, *ks.values()])
    out = {}
    for k, server in ks.items():
        for c in concurrencies:
            if m.repeats(server, suite, c) and m.repeats(baseline, suite, c):
                d = decompose(m, rr, acc_rr, server, baseline, suite, c)
                out[(k, c)] = _Measured(d.tau, d.rho, d.tpot, d.note)
    return out


def _rho(meas: dict, k: int, c: int, measured_ks: list[int], leave_out: bool, conf: float
         ) -> tuple[Interval | None, float | None, str | None, list | None]:
    """rho(k, c) and its log se: measured (unless left out), else linear in k between the nearest
    measured k below and above at c (never outside them)."""
    own = meas.get((k, c))
    if not leave_out and own is not None and own.rho is not None:
        return own.rho, _log_se(own.rho, conf), "measured", None
    have = [j for j in measured_ks if j != k and meas.get((j, c)) is not None and meas[(j, c)].rho is not None]
    below, above = [j for j in have if j < k], [j for j in have if j > k]
    if not below or not above:
        return None, None, None, None
    a, b = max(below), min(above)
    ra, rb = meas[(a, c)].rho, meas[(b, c)].rho
    sa, sb = _log_se(ra, conf), _log_se(rb, conf)
    w = (k - a) / (b - a)
    rho = (1 - w) * ra.value + w * rb.value
    se = ((1 - w) * ra.value * sa + w * rb.value * sb) / rho if sa is not None and sb is not None else None
    iv = _iv(math.log(rho), se, conf) if se is not None else Interval(rho, None, None)
    return iv, se, "interpolated", [a, b]


def predict(m: Measurements, rr: RunToRun, parent: str, ks: dict[int, str], baseline: str, suite: str,
            concurrencies: list[int] | None = None, upto: int | None = None) -> list[KPoint]:
    """The model's TPOT speedup for every k = 1..K (K the largest measured k, or `upto` <= K) at every
    concurrency both the baseline and some member measured, each k that ran with its measured figure
    beside the prediction (module docstring). `ks`: k -> member server (members())."""
    conf = m.settings.confidence
    ks = dict(sorted(ks.items()))
    cs = sorted(concurrencies or {k[2] for k in m.cells if k[1] == suite})
    meas = _decompositions(m, rr, ks, baseline, suite, cs)
    measured_ks = sorted(ks)
    if not measured_ks:
        return []
    K = max(measured_ks)
    # the per-position rates of the largest k that reported them
    src, rates = None, None
    for k in sorted(ks, reverse=True):
        r = per_position_rates(m, ks[k], suite)
        if r is not None and len(r) >= k:
            src, rates = k, r[:k]
            break
    top = src if src is not None else K
    out = []
    for c in cs:
        if not m.repeats(baseline, suite, c) or not any((k, c) in meas for k in measured_ks):
            continue
        # the relative error of the extra tokens, from the measured tau of the rates' own server
        s_extra = None
        if src is not None and (src, c) in meas and meas[(src, c)].tau is not None:
            t_src = tokens_per_step(rates, src)
            se_src = _log_se(meas[(src, c)].tau, conf)
            if se_src is not None and t_src > 1:
                s_extra = se_src * t_src / (t_src - 1)
        for k in range(1, (upto or top) + 1):
            server = ks.get(k)
            own = meas.get((k, c))
            note = []
            # tau
            if rates is not None and k <= len(rates):
                t = tokens_per_step(rates, k)
                se_t = s_extra * (t - 1) / t if s_extra is not None else None
                tau = _iv(math.log(t), se_t, conf) if se_t is not None else Interval(t, None, None)
                tau_from = f"per-position acceptance of {ks[src]} (k={src})"
                tau_held = server is not None and k != src
            elif own is not None and own.tau is not None:
                tau, se_t, tau_from, tau_held = own.tau, _log_se(own.tau, conf), "measured", False
                note.append("no per-position acceptance: tau is this k's own")
            else:
                tau, se_t, tau_from, tau_held = None, None, None, False
                note.append("no per-position acceptance reaches this k (the engine reports none, or a smaller k)"
                            if server is None else "drafted nothing: no tau")
            # rho: for a k that ran, leave its own out where neighbours on both sides allow
            rho, se_r, rho_from, between = _rho(meas, k, c, measured_ks, leave_out=server is not None, conf=conf)
            rho_held = rho is not None and server is not None
            if rho is None:
                rho, se_r, rho_from, between = _rho(meas, k, c, measured_ks, leave_out=False, conf=conf)
            if rho is None:
                note.append(f"step cost not measured at k={k} and not between two measured k at c={c}: not "
                            "extrapolated")
            elif rho_from == "interpolated":
                note.append(f"step cost interpolated linearly in k between k={between[0]} and k={between[1]}"
                            + (" (this k's own left out)" if rho_held else ""))
            pred = None
            if tau is not None and rho is not None and rho.value and rho.value > 0:
                est = math.log(tau.value) - math.log(rho.value)
                if se_t is not None and se_r is not None:
                    pred = _iv(est, math.sqrt(se_t ** 2 + se_r ** 2), conf)
                else:
                    pred = Interval(math.exp(est), None, None)
                    note.append("no interval: a part was measured without one")
            held = (["tokens per step"] if tau_held else []) + (["step cost"] if rho_held else [])
            p = KPoint(parent, suite, c, k, server, tau, tau_from, rho, rho_from, between, pred, held,
                       confidence=conf)
            if own is not None:
                p.measured, p.measured_tokens_per_step, p.measured_step_cost = own.tpot, own.tau, own.rho
                if own.note:
                    note.append(own.note)
                if pred is not None and own.tpot is not None and own.tpot.value:
                    p.ratio = own.tpot.value / pred.value
                    if held and pred.lo is not None:
                        p.within = bool(pred.lo <= own.tpot.value <= pred.hi)
                    elif not held:
                        note.append("nothing of this k's own data was held out: not a check of the model")
            p.note = "; ".join(note) or None
            out.append(p)
    return out
