"""Which k at which load (issue 19, items 2-4): a model of the speedup per k, the best k per batch
band decided like every verdict, and the deployment that runs it (a vLLM per-batch-size schedule,
SGLang's adaptive candidate steps).

The servers of one k sweep (specmatch.sweep: `eagle3@k=1`, `eagle3@k=2`, ...) and the baseline (k = 0)
were measured on the same prompts at the same concurrencies, in repeated server sessions.

**The model** (predict). A speculative step yields tau tokens and costs rho plain decode steps of the
baseline, so the TPOT speedup is tau / rho (specmatch.deciding.attribution). vLLM reports the acceptance rate
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

**The best k per concurrency** (best_k). Candidates: every measured k at c and k = 0 (the baseline).
The best is the one with the largest speedup against the baseline on `summary.recommend_metric`; it is
compared, paired, with every other candidate (comparison.compare with `against` the other server: the
same estimator and interval as every verdict, between any two measured servers) and decided. The best
k against off is taken at the level deploying speculation needs, alpha / K for the K speculative k
measured there (`KChoice.deploy_confidence`; Bonferroni: any of them could have come out best; the
sequential design's spending applies on top, comparison.look_level); against another k, at alpha:

- decisively better than every other (pays against each): that k;
- equivalent (within +/-min_effect) to some and decisively better than the rest: the SMALLEST of it and
  its equivalents (it costs less at higher load, and the difference is one no team would act on);
- otherwise, where some k pays against the baseline at alpha / K (`KChoice.paying`): whether to
  speculate is decided, which k is not (`how` "pays, k open"). The best estimate among the k that pay
  is deployed: it has the largest estimate, and the smaller k's lower cost at higher load is no reason
  at a concurrency that was measured (that tie-break is for equivalence only). Deploying off here
  would run the one option a k was shown to beat. Its verification calls a cost only where one shows
  against every candidate (references);
- otherwise undecided, with the candidates the data cannot tell from the best (`KChoice.candidates`;
  off among them where the best does not beat it at alpha / K) and what would decide it.

Asking the best to beat every candidate (not only the runner-up by point estimate) is an
intersection-union test: calling k best when it is not (by more than min_effect) has probability at
most alpha at each concurrency, with no multiplicity correction. **Every path that deploys
speculation at c needs some k to pay against off at c at alpha / K** (the "best" and "smallest
equivalent" paths through the best's comparison with off, "pays, k open" through `paying`), so where
every k is as fast as off (or slower), speculation is deployed at c with probability at most
K x alpha / (2K) = alpha / 2 (one-sided), whatever K: the bound holds at each measured concurrency,
and over a schedule of C measured concurrencies at most C x alpha / 2 (Bonferroni; the record's
`error_rates`, the recommendation's text). Measured (calibration.harness, K_SCENARIOS "null"): README.

**Bands** (bands). Batch sizes 1..max_batch. Every measured concurrency runs its OWN choice: a decided
one its k; an undecided one its best-supported candidate, which is off (no k pays there against off at
the level deploying speculation needs: the data do not support speculating there, so no k spreads over
it from a neighbour; `KBand.pinned_at`). Off never spreads over a concurrency whose data beat off either:
where some k pays at alpha / K, the choice there is "pays, k open", a decided k. Between two measured
concurrencies whose k differ, the switch sits where the two k's measured speedup curves cross (each
linear in log concurrency between measured points; for k = 0 the curve is 1): the generalisation of
the on/off switch at the crossing of 1. Where they do not cross inside the bracket (an equivalence
choice: the smaller k was chosen though its point estimate was lower; or an undecided concurrency run
off although its estimate favoured a k), the switch is the geometric mean of the two concurrencies
(the midpoint in log space). Below the smallest measured concurrency its k holds (`KBand.extrapolated`
"below", said in the text). Above the largest measured concurrency nothing was measured: where the
largest is decided, its k extends up to max_batch (`extrapolated` "above"; `beyond="off"` deploys k = 0
there instead); where the largest is undecided, speculation is off above it whatever `beyond` says
(`KRecommendation.undecided_top`): nothing measured shows that speculation pays at or above it, and
inheriting a k from a smaller concurrency would be speculation by extrapolation twice over (speculation
costs more per step as the batch grows, so the k of a lighter load is the wrong guess exactly where a
guess costs most). The text says so. A recommendation with no decided concurrency is undecided: no
bands (nothing to deploy is decided anywhere).

**The deployment** (deploy). vLLM: `num_speculative_tokens_per_batch_size` with one inclusive
[lo, hi, k] range per band (k = 0: off), covering 1..max_batch, the speculative config's own
`num_speculative_tokens` set to the largest k it uses (vLLM clamps every range's k by it). One k
everywhere ("keep") is a recommendation like any other: derived_config gives its config, which is the
sweep member of that k as configured, so that member IS its measurement (recommend.derived_k_servers
finds it as the deployment's twin) and its verification is against the references like a schedule's;
k = 0 everywhere ("off") is the baseline, likewise. SGLang
(where the release has `--speculative-adaptive`, engines/sglang.adaptive_support): an adaptive config
with one slot per band whose only candidate is the band's k (a slot with one candidate never moves),
num_steps the largest k, eagle_topk 1.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Optional

from .attribution import acceptance_run_to_run, decompose
from .comparison import compare, decide
from .deployment import Reference, ServerInfo, server_k, validate_schedule
from .measurements import Measurements, Settings
from .noise import RunToRun
from ..records import Decision, Interval, Record, Verdict, Verification
from ..sweep import members


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
    """The best k at one measured concurrency, decided like every verdict (module docstring)."""
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
                                                      # (off: no k pays there at the deploying level; bands)
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
    vllm_schedule: Optional[list] = None        # [[lo, hi, k], ...] inclusive, covering 1..max_batch
    speculative: Optional[dict] = None          # the speculative config to deploy (vLLM / SGLang)
    sglang: Optional[dict] = None               # SGLang's mechanism, or {"mechanism": None, "why": ...}
    extrapolated_above: Optional[int] = None    # the largest measured concurrency, when max_batch exceeds it
    extrapolated_below: Optional[int] = None    # the smallest measured concurrency, when it is above 1
    max_batch: Optional[int] = None
    undecided_top: Optional[int] = None         # the largest measured concurrency when it is undecided: above it
                                                # speculation is off (nothing extrapolated; bands)
    error_rates: dict = field(default_factory=dict)  # the bounds on a false "speculate" (module docstring):
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
def per_position_rates(m: Measurements, server: str, suite: str) -> list[float] | None:
    """vLLM's per-position acceptance rates of a server on a suite, pooled over its cells (every
    concurrency and repeat) weighted by each cell's drafts; None where no cell reported them."""
    num, den = [], 0.0
    for key, cell in m.cells.items():
        if key[0] != server or key[1] != suite:
            continue
        rates, drafts = cell.spec_decode_per_position_acceptance_rates, cell.spec_decode_num_drafts
        if not rates or not drafts or any(r is None for r in rates):
            continue
        if len(num) < len(rates):
            num += [0.0] * (len(rates) - len(num))
        for p, r in enumerate(rates):
            num[p] += float(r) * drafts
        den += drafts
    if not den:
        return None
    return [x / den for x in num]


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


# -- the best k per concurrency ------------------------------------------------------------------------
def best_k(m: Measurements, rr: RunToRun, parent: str, ks: dict[int, str], baseline: str, suite: str, c: int,
           s: Settings) -> tuple[KChoice, dict]:
    """The best k at concurrency c on `s.recommend_metric` (module docstring), and the comparisons
    against the baseline it rests on (k -> Comparison) for the bands' crossovers."""
    metric = s.recommend_metric
    choice = KChoice(parent, suite, c, metric, None, None, "none", None)
    if not m.repeats(baseline, suite, c):
        choice.note = f"the baseline was not measured at c={c}"
        return choice, {}
    servers = {0: baseline, **{k: n for k, n in ks.items() if m.repeats(n, suite, c)}}
    est, cmps, missing = {0: 0.0}, {}, []
    choice.speedups["0"] = {"speedup": 1.0, "lo": 1.0, "hi": 1.0, "verdict": None}
    for k, name in servers.items():
        if k == 0:
            continue
        cmp = compare(m, rr, name, baseline, suite, c, metric)
        cmps[k] = cmp
        if cmp.estimate is None:
            missing.append(f"k={k}: {cmp.note}")
            continue
        v = decide(cmp, s)
        est[k] = cmp.estimate
        choice.speedups[str(k)] = {"speedup": v.speedup, "lo": v.lo, "hi": v.hi, "verdict": v.verdict.value}
    if missing:
        choice.note = "; ".join(missing)
    if len(est) == 1:   # no k of the sweep has a figure here: nothing to choose between (not a decision)
        choice.note = "; ".join(filter(None, [choice.note, f"no member of the sweep has a figure at c={c}"]))
        return choice, cmps
    strict = deploying(s, len(est) - 1)
    choice.deploy_confidence = strict.confidence
    vs_off = {k: decide(cmps[k], strict) for k in est if k > 0}     # each k against off at alpha / K
    choice.paying = sorted(k for k, v in vs_off.items() if v.verdict == Decision.PAYS)
    best = max(est, key=lambda k: (est[k], -k))       # ties: the smaller k
    choice.best = best
    inconclusive, equivalent, loses = [], [], []
    for j in sorted(est):
        if j == best:
            continue
        # the best k against off at the level deploying speculation needs (its comparison with the
        # baseline, as above); any other pair at alpha
        v = vs_off[best] if j == 0 else decide(compare(m, rr, servers[best], servers[j], suite, c, metric), s)
        choice.pairwise.append(v)
        if v.verdict == Decision.EQUIVALENT:
            equivalent.append(j)
        elif v.verdict == Decision.INCONCLUSIVE:
            inconclusive.append(j)
        elif v.verdict == Decision.LOSES:   # the paired comparison disagrees with the estimates' order
            loses.append(j)
    choice.equivalent = sorted(equivalent)
    if inconclusive or loses:
        choice.candidates = sorted({best, *inconclusive, *loses, *equivalent})
        open_ = sorted(inconclusive + loses)
        why = next((v.decide for v in choice.pairwise if v.verdict == Decision.INCONCLUSIVE and v.decide), None)
        choice.decide = (f"k={best} against k={', '.join(map(str, open_))}: "
                         + (why or "the paired comparison contradicts the order of the estimates"))
        if choice.paying:   # speculating is decided (a k beats off at alpha / K); which k is not
            k = best if best in choice.paying else max(choice.paying, key=lambda j: (est[j], -j))
            choice.k, choice.server, choice.how = k, servers[k], "pays, k open"
        else:
            choice.how = "undecided"
        return choice, cmps
    k = min([best, *equivalent])
    choice.k, choice.server = k, servers[k]
    choice.how = "best" if k == best else "smallest equivalent"
    return choice, cmps


def deploying(s: Settings, k: int) -> Settings:
    """The settings a choice to speculate is decided at where `k` speculative k were measured: alpha / k
    (Bonferroni: the best of k could have been any of them; the sequential design's spending applies on
    top, comparison.look_level)."""
    return dataclasses.replace(s, confidence=1 - (1 - s.confidence) / max(k, 1))


# -- bands -----------------------------------------------------------------------------------------
def _curve(cmps_by_c: dict, k: int) -> dict[int, float]:
    """c -> the measured log speedup of k against the baseline (0 for k = 0)."""
    out = {}
    for c, cmps in cmps_by_c.items():
        if k == 0:
            out[c] = 0.0
        elif k in cmps and cmps[k].estimate is not None:
            out[c] = cmps[k].estimate
    return out


def _switch(cmps_by_c: dict, lo: int, hi: int, ka: int, kb: int) -> tuple[float, str]:
    """Where ka (chosen at lo) stops being better than kb (chosen at hi): the first crossing in
    [lo, hi] of their speedup curves, each linear in log c between measured points; else sqrt(lo hi)."""
    ya, yb = _curve(cmps_by_c, ka), _curve(cmps_by_c, kb)
    pts = sorted(c for c in ya if c in yb and lo <= c <= hi)
    if pts and pts[0] == lo and pts[-1] == hi:
        diff = [(c, ya[c] - yb[c]) for c in pts]
        if diff[0][1] > 0 >= diff[-1][1]:
            for (c0, d0), (c1, d1) in zip(diff, diff[1:]):
                if d0 > 0 >= d1 and d0 != d1:
                    x = math.log(c0) + d0 * (math.log(c1) - math.log(c0)) / (d0 - d1)
                    return math.exp(x), "crossover"
    return math.sqrt(lo * hi), "geometric mean"


def _per_batch(dec: dict[int, int], top: int, cmps_by_c: dict, max_batch: int, beyond: str
               ) -> tuple[list[int], dict]:
    """The k at every batch size 1..max_batch from decided concurrencies `dec` (c -> k), and the
    switches between neighbours whose k differ ((lo, hi) -> (where, how))."""
    known = sorted(dec)
    switches = {}
    for a, b in zip(known, known[1:]):
        if dec[a] != dec[b]:
            switches[(a, b)] = _switch(cmps_by_c, a, b, dec[a], dec[b])
    per_batch = []
    for b in range(1, max_batch + 1):
        if b > top:
            per_batch.append(dec[known[-1]] if beyond == "extend" else 0)
        elif b <= known[0]:
            per_batch.append(dec[known[0]])
        elif b >= known[-1]:
            per_batch.append(dec[known[-1]])
        else:
            lo = max(c for c in known if c <= b)
            hi = min(c for c in known if c >= b)
            if dec[lo] == dec[hi]:
                per_batch.append(dec[lo])
            else:
                x, _ = switches[(lo, hi)]
                per_batch.append(dec[lo] if b < x else dec[hi])
    return per_batch, switches


def runs(ch: KChoice) -> int | None:
    """The k a measured concurrency runs by its own data: its choice where decided; where undecided, its
    best-supported candidate: the k with the largest estimate among those that pay against off at the
    deploying level (`paying`; best_k decides such a concurrency "pays, k open", so this is for records
    built otherwise), else off (module docstring, "Bands"). None where it has no figure to decide from."""
    if ch.best is None and ch.k is None:
        return None
    if ch.k is not None:
        return ch.k
    if ch.paying:
        return max(ch.paying, key=lambda k: ((ch.speedups.get(str(k)) or {}).get("speedup") or 0.0, -k))
    return 0


def bands(choices: list[KChoice], cmps_by_c: dict, max_batch: int, beyond: str = "extend") -> list[KBand]:
    """Batch bands 1..max_batch with their k, each measured concurrency run by its own choice (runs; module
    docstring, "Bands"). `beyond`: "extend" (the largest measured concurrency's decided k holds above it,
    flagged) or "off" (k = 0 there); above an undecided largest concurrency it is off either way. Empty
    where no concurrency is decided."""
    if beyond not in ("extend", "off"):
        raise ValueError(f"beyond: 'extend' or 'off', not {beyond!r}")
    own = {ch.concurrency: runs(ch) for ch in choices}
    own = {c: k for c, k in own.items() if k is not None}
    decided = sorted(ch.concurrency for ch in choices if ch.k is not None)
    if not decided:
        return []
    pinned = sorted(c for c in own if c not in decided)
    top, bottom = max(own), min(own)
    per_batch, switches = _per_batch(own, top, cmps_by_c, max_batch, "off" if top in pinned else beyond)
    out: list[KBand] = []
    for b, k in enumerate(per_batch, 1):
        ext = "above" if b > top else "below" if b < bottom else None
        if out and out[-1].k == k and out[-1].extrapolated == ext:
            out[-1].hi = b
            continue
        if not out:
            why = "start"
        elif ext != out[-1].extrapolated:
            why = "measured range"
        else:
            pair = next(((a, z) for (a, z) in switches if a < b <= z), None)
            why = switches[pair][1] if pair else "measured range"
        out.append(KBand(b, b, k, boundary=why, extrapolated=ext))
    for band in out:
        band.decided_at = [c for c in decided if band.lo <= c <= band.hi]
        band.undecided_at = [c for c in pinned if band.lo <= c <= band.hi]
        band.pinned_at = list(band.undecided_at)
    return out


# -- the deployment ---------------------------------------------------------------------------------
def vllm_ranges(bands_: list[KBand]) -> list[list[int]]:
    """Inclusive [lo, hi, k] ranges of the bands, neighbours with the same k merged."""
    out: list[list[int]] = []
    for band in bands_:
        if out and out[-1][2] == band.k and out[-1][1] == band.lo - 1:
            out[-1][1] = band.hi
        else:
            out.append([band.lo, band.hi, band.k])
    return out


def vllm_deployment(spec: dict, bands_: list[KBand], max_batch: int) -> tuple[list[list[int]], dict]:
    """The schedule and the speculative config that runs it: the sweep's config with
    num_speculative_tokens the largest k the schedule uses and the schedule as
    num_speculative_tokens_per_batch_size. Checked against vLLM's rules (deployment.validate_schedule)
    and its carry-forward and clamping (deployment.server_k: every batch size gets its band's k)."""
    ranges = vllm_ranges(bands_)
    validate_schedule(ranges)
    if ranges[-1][1] != max_batch:
        raise ValueError(f"schedule {ranges}: must cover 1..{max_batch}")
    top = max(k for _, _, k in ranges)
    if top < 1:
        raise ValueError(f"schedule {ranges}: speculates nowhere (deploy the baseline)")
    out = copy.deepcopy(spec)
    out["num_speculative_tokens"] = top
    out["num_speculative_tokens_per_batch_size"] = ranges
    for band in bands_:
        for b in (band.lo, band.hi):
            if server_k(out, b) != band.k:
                raise ValueError(f"schedule {ranges}: batch {b} would run k={server_k(out, b)}, not {band.k}")
    return ranges, out


def sglang_deployment(info: ServerInfo, bands_: list[KBand]) -> dict:
    """SGLang's adaptive candidate steps: one slot per band (keyed by its first batch size) whose only
    candidate is the band's k, num_steps the largest k; or why the installed release cannot."""
    spec = info.speculative or {}
    if not info.sglang_adaptive:
        return {"mechanism": None,
                "why": f"SGLang {info.version or '(version unknown)'} has no --speculative-adaptive (it came with "
                       "0.5.18): run one member per batch band and route traffic by load instead"}
    if spec.get("method") not in ("eagle", "eagle3", "mtp"):
        return {"mechanism": None, "why": f"SGLang adapts EAGLE/EAGLE3 only, not {spec.get('method')}"}
    if spec.get("eagle_topk", 1) != 1:
        return {"mechanism": None, "why": "SGLang adapts only with eagle_topk 1"}
    ranges = vllm_ranges(bands_)
    top = max(k for _, _, k in ranges)
    config = {str(lo): {"candidate_steps": [k]} for lo, _, k in ranges}
    speculative = {**copy.deepcopy(spec), "num_steps": top, "eagle_topk": 1, "num_draft_tokens": top + 1,
                   "adaptive": True}
    return {"mechanism": "speculative-adaptive", **info.sglang_adaptive, "config": config,
            "speculative": speculative,
            "why": "--speculative-adaptive with --speculative-adaptive-config holding this config (write it to a "
                   "file): each batch band a slot with one candidate step count, so SGLang never moves off it; "
                   "SGLang routes a batch to the slot of the largest key <= its CUDA-graph-padded batch size, so a "
                   "band boundary between two captured batch sizes moves up to the next captured one"}


def sglang_adaptive_config(bands_: list[KBand]) -> dict:
    """The --speculative-adaptive-config a k schedule is (sglang_deployment's `config`)."""
    return {str(lo): {"candidate_steps": [k]} for lo, _, k in vllm_ranges(bands_)}


def recommend(m: Measurements, rr: RunToRun, info: ServerInfo, parent: str, ks: dict[int, str], baseline: str,
              suite: str, s: Settings, concurrencies: list[int] | None = None, beyond: str = "extend"
              ) -> KRecommendation:
    """The best k per band for a sweep on one suite and its deployment (module docstring). `info`:
    the sweep's server (any member's ServerInfo: engine, flavor, max_batch, speculative config,
    the SGLang release's adaptive support)."""
    cs = sorted(concurrencies or {k[2] for k in m.cells if k[1] == suite})
    choices, cmps_by_c = [], {}
    for c in cs:
        if not m.repeats(baseline, suite, c):
            continue
        ch, cmps = best_k(m, rr, parent, ks, baseline, suite, c, s)
        choices.append(ch)
        cmps_by_c[c] = cmps
    return recommendation(choices, cmps_by_c, info, parent, ks, baseline, suite, s, beyond)


def _ks(xs) -> str:
    return ", ".join(map(str, xs))


def _level(ch: KChoice) -> str:
    return f"{ch.deploy_confidence:.0%}" if ch.deploy_confidence else "the level deploying speculation needs"


def recommendation(choices: list[KChoice], cmps_by_c: dict, info: ServerInfo, parent: str, ks: dict[int, str],
                   baseline: str, suite: str, s: Settings, beyond: str = "extend") -> KRecommendation:
    """recommend's second half: the bands, the deployment and the text from each concurrency's choice
    (`cmps_by_c`: c -> k -> the Comparison against the baseline, for the switches). The batch range is
    the server's (`info.max_batch`), else, for a server whose largest batch is not known (an external
    endpoint), the measured concurrencies'."""
    own = {ch.concurrency: runs(ch) for ch in choices}
    measured = sorted(c for c, k in own.items() if k is not None)
    max_batch = info.max_batch or (max(measured) if measured else 0)
    rec = KRecommendation(parent, suite, s.recommend_metric, "undecided", choices, max_batch=max_batch)
    if not choices:
        rec.text = "no concurrency measured with the baseline"
        return rec
    if not measured:
        rec.text = "no recommendation: no member of the sweep has a figure at any concurrency measured with the baseline"
        return rec
    alpha = 1 - s.confidence
    rec.error_rates = {"false_speculate_per_concurrency": alpha / 2,
                       "false_speculate_over_schedule": min(1.0, len(measured) * alpha / 2)}
    bs = bands(choices, cmps_by_c, max_batch, beyond)
    rec.bands = bs
    top, bottom = measured[-1], measured[0]
    if max_batch > top:
        rec.extrapolated_above = top
    if bottom > 1:
        rec.extrapolated_below = bottom
    undecided = [ch for ch in choices if ch.k is None and own[ch.concurrency] is not None]
    if not bs:
        und = "; ".join(f"undecided at c={ch.concurrency}" + (f" between k={_ks(ch.candidates)}" if ch.candidates else "")
                        for ch in undecided)
        rec.text = "no recommendation: no concurrency is decided" + (f" ({und})" if und else "")
        return rec
    if top in {c for b in bs for c in b.pinned_at}:
        rec.undecided_top = top
    pin_text = "; ".join(
        f"at c={ch.concurrency} (undecided" + (f" between k={_ks(ch.candidates)}" if ch.candidates else "") + ") "
        + (f"no k pays against off at {_level(ch)} (the level speculating needs with {len(ch.speedups) - 1} k "
           "measured), so it runs off, not a neighbour's k" if own[ch.concurrency] == 0 else
           f"k={own[ch.concurrency]} pays against off there at {_level(ch)}, so it runs k={own[ch.concurrency]}")
        for ch in undecided)
    part_text = "; ".join(f"at c={ch.concurrency} speculation pays (at {_level(ch)}) but k is undecided between "
                          f"k={_ks(ch.candidates)}: k={ch.k}, the best estimate among the k that pay, is deployed"
                          for ch in choices if ch.how == "pays, k open" and ch.concurrency <= max_batch)
    used = sorted({b.k for b in bs})
    parts = [(f"{b.lo}-{b.hi}" if b.hi != b.lo else f"{b.lo}") + f": k={b.k}"
             + (f" (extrapolated {b.extrapolated} the measured concurrencies)" if b.extrapolated else "") for b in bs]
    spec = {k: v for k, v in (info.speculative or {}).items() if not isinstance(v, (list, tuple))
            or k == "num_speculative_tokens_per_batch_size"}
    if used == [0]:
        rec.action, rec.k, rec.server = "off", 0, baseline
        rec.text = ("turn speculation off: the baseline is best (or as good) at every decided concurrency, and no k "
                    "was shown to pay at any other")
        if info.flavor == "sglang":
            rec.sglang = {"mechanism": "baseline", "why": "serve without --speculative-algorithm"}
    elif len(used) == 1:
        rec.action, rec.k, rec.server = "keep", used[0], ks.get(used[0])
        rec.text = (f"run k={used[0]} at every batch size: it is the k chosen at every measured concurrency"
                    + (f"; that is `{rec.server}` as configured, so its cells are this recommendation's measurement"
                       if rec.server else ""))
        if info.flavor == "vllm":
            rec.speculative = {**spec, "num_speculative_tokens": used[0]}
            rec.speculative.pop("num_speculative_tokens_per_batch_size", None)
    else:
        rec.action = "schedule"
        rec.text = "k per batch band: " + ", ".join(parts)
        if info.flavor == "vllm":
            rec.vllm_schedule, rec.speculative = vllm_deployment(spec, bs, max_batch)
        elif info.flavor == "sglang":
            rec.sglang = sglang_deployment(info, bs)
            if rec.sglang.get("mechanism"):
                rec.speculative = rec.sglang["speculative"]
    if part_text:
        rec.text += f"; {part_text}"
    if pin_text:
        rec.text += f"; {pin_text}"
    if rec.action in ("keep", "schedule"):
        e = rec.error_rates
        rec.text += (f"; speculation is deployed only where a k beat off at the level that allows for the k measured "
                     f"(alpha / K): where every k is as fast as off, a false \"speculate\" has probability at most "
                     f"{e['false_speculate_per_concurrency']:.0%} at each measured concurrency (one-sided) and at most "
                     f"{e['false_speculate_over_schedule']:.0%} over the {len(measured)} measured")
    if rec.extrapolated_above is not None:
        last = next(b for b in bs if b.extrapolated == "above")
        head = f"; batch sizes {top + 1}-{max_batch} were not measured"
        if rec.undecided_top is not None:
            rec.text += (f"{head} and c={top}, the largest measured concurrency, is undecided: speculation is off there "
                         f"(nothing measured shows it pays at or above c={top}; no k is extrapolated to heavier load)")
        elif beyond == "off":
            rec.text += f"{head} (the largest measured concurrency is {top}): speculation is off there (not measured)"
        else:
            rec.text += (f"{head} (the largest measured concurrency is {top}): k={last.k} there extends the choice "
                         f"decided at c={top}, an extrapolation")
    if rec.extrapolated_below is not None:
        first = bs[0]
        rec.text += (f"; batch sizes 1-{bottom - 1} were not measured (the smallest measured concurrency is {bottom}): "
                     + (f"k={first.k} there extends the choice decided at c={bottom}, an extrapolation"
                        if first.k or bottom not in {c for b in bs for c in b.pinned_at} else
                        f"speculation is off there, as at c={bottom} (undecided)"))
    if not info.max_batch:
        rec.text += (f"; the server's largest batch is not known (an external endpoint: set `max_batch` on it), so the "
                     f"deployment covers the measured concurrencies, 1-{max_batch}")
    return rec


# -- verification ---------------------------------------------------------------------------------------
def references(rec: KRecommendation, ks: dict[int, str], baseline: str, concurrencies: list[int]
               ) -> dict:
    """What `<parent>__recommended` is checked against at each measured concurrency, fixed by the
    schedule before its cells are seen (deployment.Reference): the member that runs the band's k there
    as measured (the baseline for k = 0). Where the choice at c was not decided (undecided at c, so the
    band's k there follows the neighbouring decided concurrencies; or "pays, k open", where k was not
    decided), the other candidates the data could not tell apart are alternatives: a cost must show
    against each of them too before the verification calls it one."""
    choices = {ch.concurrency: ch for ch in rec.choices}
    out = {}
    for c in concurrencies:
        k = rec.k_at(c)
        if k is None:
            out[c] = Reference(None, f"the schedule does not cover batch size {c}")
            continue
        server = baseline if k == 0 else ks.get(k)
        if server is None:
            out[c] = Reference(None, f"k={k} was not measured")
            continue
        ch = choices.get(c)
        alts = ()
        if ch is not None and ch.candidates:
            alts = tuple(n for n in ((baseline if j == 0 else ks.get(j)) for j in ch.candidates) if n and n != server)
        out[c] = Reference(server, None, alts)
    return out


# -- the derived server and the report ------------------------------------------------------------------
def derived_config(member_config: dict, rec: KRecommendation, adaptive_config_path: str | None = None
                   ) -> dict | None:
    """The server config that deploys the recommendation: a member's config with the recommended
    speculative config. A schedule's is `<parent>__recommended` (any member's config); one k everywhere
    (`keep`, `member_config` the member of rec.k) is that member as configured, which
    recommend.derived_k_servers then finds as the deployment's twin, so the member's cells are its
    measurement. None where no server config deploys it: `off` is the baseline, `undecided` nothing.
    SGLang's adaptive config is a file: write rec.sglang["config"] to `adaptive_config_path` and pass
    the path here."""
    if rec.action == "keep":
        cfg = copy.deepcopy({k: v for k, v in member_config.items() if k != "suites"})
        if rec.speculative is not None:
            cfg["speculative"] = copy.deepcopy(rec.speculative)
        return cfg
    if rec.action != "schedule" or rec.speculative is None:
        return None
    cfg = copy.deepcopy({k: v for k, v in member_config.items() if k != "suites"})
    spec = copy.deepcopy(rec.speculative)
    if spec.get("adaptive") is True:
        if not adaptive_config_path:
            raise ValueError("an SGLang schedule needs adaptive_config_path (its --speculative-adaptive-config file)")
        spec["adaptive"] = adaptive_config_path
    cfg["speculative"] = spec
    return cfg


def sweep_report(an, parent: str, info: ServerInfo, suite: str, beyond: str = "extend"
                 ) -> tuple[KRecommendation, list[KPoint]]:
    """recommend and predict for one sweep on one suite of an analysis.Analysis (its measurements,
    run-to-run variance, baseline, settings and concurrencies)."""
    ks = members(parent, an.servers)
    rec = recommend(an.measurements, an.run_to_run, info, parent, ks, an.baseline, suite, an.settings,
                    an.concurrencies, beyond)
    pts = predict(an.measurements, an.run_to_run, parent, ks, an.baseline, suite, an.concurrencies)
    return rec, pts
