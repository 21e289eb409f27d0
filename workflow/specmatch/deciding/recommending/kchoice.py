"""Which k at which load, part two: the best k at each measured concurrency (best_k), decided like every
verdict, and the level a choice to speculate is decided at (deploying). The record is kmodel.KChoice.

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
  against every candidate (krecommend.references);
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
`error_rates`, the recommendation's text). Measured (calibration.harness, K_SCENARIOS "null"): docs/methods/calibration.md.
"""
from __future__ import annotations

import dataclasses

from ..verdicts.comparison import compare, decide
from ..verdicts.designs import with_design
from .kmodel import KChoice
from ..reading.measurements import Measurements, Settings
from ..verdicts.noise import RunToRun
from ...records import Decision


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
        if j == 0:
            v = with_design(vs_off[best], cmps[best], strict)
        else:
            pair = compare(m, rr, servers[best], servers[j], suite, c, metric)
            v = with_design(decide(pair, s), pair, s)
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
