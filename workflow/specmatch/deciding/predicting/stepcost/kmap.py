"""The map in k: what a speculative step costs at a k no server ran, and every k's speedup at every load,
from the maps of a k sweep's members and the per-position acceptance of its largest k (the method:
specmatch.deciding.predicting.stepcost).

**rho in k.** A speculative step drafts k tokens (k passes of the drafter over the batch) and verifies
k + 1 tokens a sequence in one pass of the target, so its cost at a given batch and context is linear in
k where the target's cost is linear in the tokens it computes: T_k(b, C, P) = (1 - w) T_a + w T_b with
w = (k - a) / (b - a) for the nearest mapped k on each side, a < k < b, every coefficient of the map's
step model and the first token's multiplier (in log) taken so. A k outside the mapped ones is not
predicted: the coefficients of two fits are each loosely determined (only their T is), and a line drawn
beyond them multiplies their errors. Its error: every mapped member's own part (StepMap.part: its
sessions and its cells through the fit's Jacobian) weighted by its share of T_k, w_j T_j / T_k (the
members ran in their own server sessions: independent), plus the baseline's part. Linear in k is
checked, not assumed, where three k or more were mapped: each inner k's own map against the line
through its neighbours at the fitted batches (their difference's interval holds only the speculative
members' parts: the baseline's cancels), Bonferroni over the batches.

**Tokens per step in k.** vLLM reports the acceptance rate at each draft position, r_p (accepted at p
over drafts; a token is accepted only if every one before it was), so a server drafting k <= K yields
tau(k) = 1 + sum_{p<k} r_p (specmatch.deciding.recommending.kmodel). A prompt's own tau at k: its
conditional acceptance at each position is its own multiple of a shape the suite's prompts share, the
multiple set by its measured tau at K, the shape by the suite's per-position rates (steps_at); its
decode steps at k are (out_i - 1) / tau_i(k). A k above K has no rates and is not predicted.

**Predictions** (predict.predict_suite, unchanged): each k's suite replayed through the k's map and the
baseline's on the grid. A member the sweep ran is predicted twice: with everything (its own map, its own
steps: the schedule's) and held out (rho from the other mapped k, tau from the largest k's rates: the
check), the held-out prediction set beside its measured cells: their difference with an interval that
holds the map's error at c, the measured cells' run to run and the tau transfer's own error, paired: the
same replay with the member's own measured steps on the same prompt resamples, the spread of the
difference (the suite's prompt sample is the same on both sides and cancels; counting it whole, as
before, made the check about three times too wide to fail).

**The schedule.** At each concurrency of the grid, of the k whose predicted speedup pays at the level
that allows for the k compared (1 - alpha / K, as the measured sweep deploys), the one with the largest
point (off where every k loses or is equivalent to off, undecided otherwise), neighbours with the same
answer merged into batch bands: a k schedule from the largest k and the mapped ones, against a sweep that
measures every k on every suite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...reading.measurements import Measurements, Settings
from ...verdicts.acceptance import per_position_rates
from ...verdicts.comparison import decision
from ...verdicts.noise import VarianceSum
from ...explaining.attribution import acceptance_run_to_run
from ..traffic.step_model import Scheduler
from .map import Model, StepMap, bounded_exp
from .predict import as_prediction, check_rows, predict_suite, suite_prompts
from ....records import (Decision, Interval, StepCostKBand, StepCostKCheck, StepCostKMap, StepCostKPoint,
                         StepCostKPrediction)
from ....stats import t_critical, t_half_width


@dataclass
class KStepMap(StepMap):
    """A map at a k from the mapped members' maps (module docstring): `weights` (mapped k -> its weight in
    T_k, summing to 1), `members` (mapped k -> its StepMap), `how`: map (a member's own) or interpolated."""
    k: int = 0
    weights: dict = field(default_factory=dict)
    members: dict = field(default_factory=dict)
    how: str = "map"

    def part(self, x: str, b: float, L: float) -> VarianceSum:
        """Inside the fitted batches the members' parts are independent (their own sessions and cells);
        beyond them the error is mostly the fitted form's, which every member's fit shares, so there they
        add as perfectly correlated (never narrower than the wider neighbour's)."""
        if x != self.server:
            first = self.members[min(self.members)]
            return first.part(first.baseline, b, L)
        T = max(self.models[x].step(b, L), 1e-12)
        parts = []
        for j, w in self.weights.items():
            mj = self.members[j]
            parts.append((w * mj.models[mj.server].step(b, L) / T, mj.part(mj.server, b, L)))
        out = VarianceSum()
        if not self.extrapolated(b) or len(parts) < 2:
            for g, v in parts:
                out.plus(v, g * g)
            return out
        together = sum(abs(g) * math.sqrt(v.total) for g, v in parts)
        for g, v in parts:
            if v.total > 0:
                out.plus(v, abs(g) * together / math.sqrt(v.total))
        return out


def at_k(maps: dict[int, StepMap], k: int, name: str, leave_out: bool = False) -> KStepMap | None:
    """The map at k (named `name`) from the mapped members' maps (k -> StepMap, one baseline); with
    `leave_out`, k's own map is not used. None where k is not mapped and no mapped k lies on each side."""
    have = sorted(j for j in maps if not (leave_out and j == k))
    if k in have:
        weights, how = {k: 1.0}, "map"
    else:
        below, above = [j for j in have if j < k], [j for j in have if j > k]
        if not (below and above):
            return None
        a, b, how = below[-1], above[0], "interpolated"
        w = (k - a) / (b - a)
        weights = {a: 1.0 - w, b: w}
    used = {j: maps[j] for j in weights}
    first = used[min(used)]
    spec = {j: mj.models[mj.server] for j, mj in used.items()}
    theta = sum(w * spec[j].theta for j, w in weights.items())
    cs = sorted(set().union(*(md.admission for md in spec.values())))
    admission = {c: float(math.exp(sum(w * math.log(spec[j].admission_at(c)) for j, w in weights.items())))
                 for c in cs}
    sched = Scheduler(first.models[first.server].sched.budget, 1 + k)
    models = {name: Model(theta, admission, sched), first.baseline: first.models[first.baseline]}
    fit = sorted(set.intersection(*(set(mj.fit) for mj in used.values())))
    return KStepMap(name, first.baseline, models, first.suite, fit or first.fit, min(mj.repeats for mj in used.values()),
                    maps[max(maps)].rr, first.context, {}, k, weights, used, how)


def _reach(shape: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Per prompt, the chance a step's draft at each position is accepted (every one before it too), for
    conditional acceptances `scale` times shape[p], capped at 1: their running products."""
    return np.cumprod(np.minimum(np.asarray(scale, float)[..., None] * shape, 1.0), axis=-1)


def _successive(x: np.ndarray, empty: float = 0.0) -> np.ndarray:
    """x[p] / x[p - 1] (x[0] / 1; `empty` where the one before is 0)."""
    before = np.concatenate([[1.0], x[:-1]])
    return np.divide(x, before, out=np.full_like(x, empty), where=before > 0)


def extra_tokens(shape: np.ndarray, scale: np.ndarray, k: int) -> np.ndarray:
    """Expected accepted drafts of a step at k: the sum over p < k of _reach."""
    return _reach(shape, scale)[..., :k].sum(-1)


def _scales(shape: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Each prompt's multiple of the shape whose K-step yields its measured extra tokens (bisection:
    extra_tokens rises with the multiple)."""
    K = len(shape)
    lo, hi = np.zeros_like(target), np.full_like(target, 1.0 / max(float(shape[shape > 0].min()), 1e-9))
    for _ in range(60):
        mid = (lo + hi) / 2
        low = extra_tokens(shape, mid, K) < target
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return np.where(target <= 0, 0.0, (lo + hi) / 2)


def steps_at(data: dict, server: str, rates: list[float], k: int, iterations: int = 30) -> np.ndarray:
    """Each prompt's decode steps at k from its measured steps at K = len(rates) on `server`. A prompt's
    conditional acceptance at position p is its own multiple of one shape shared by the suite's prompts,
    the multiple set so that drafting K yields its measured tau at K, the shape so that the prompts
    together give the suite's per-position rates as vLLM pools them (over drafts: each prompt weighs by
    its steps). The rates' own conditional acceptances r_p / r_{p-1} are not that shape: the prompts that
    reach position p are the ones that accept more, so they rise with p even where every prompt's are
    flat, and one ratio for every prompt makes the prompts that accept little too slow at a smaller k."""
    K = len(rates)
    decoded = np.maximum(data["out"] - 1, 0.0)
    steps = np.asarray(data["steps"][server], float)
    with np.errstate(divide="ignore", invalid="ignore"):
        target = np.clip(np.where(steps > 0, decoded / steps, 1.0) - 1.0, 0.0, float(K))
    r = np.asarray(rates, float)
    if not r[0] > 0 or not (target > 0).any():
        return np.maximum(decoded, 1.0)
    w = np.maximum(steps, 0.0) / max(float(np.maximum(steps, 0.0).sum()), 1e-12)
    shape = _successive(r)
    for _ in range(iterations):
        pooled = (w[:, None] * _reach(shape, _scales(shape, target))).sum(0)
        ratio = np.divide(r, pooled, out=np.ones_like(r), where=pooled > 0)
        step = _successive(ratio, empty=1.0)   # a position no prompt reaches: left as it is
        if np.max(np.abs(step - 1)) < 1e-9 or not np.isfinite(shape * step).all():
            break   # matched, or prompts (all or nothing) that no shape moves
        shape = shape * step
        shape = np.clip(shape / shape[0], 1e-3, 1e3)   # the scale carries the level: the shape only its form
    tau_k = 1.0 + extra_tokens(shape, _scales(shape, target), k)
    # a whole number of steps: the replay finishes a request after ceil(s) of them, which on an expected
    # (fractional) count adds half a step a request (4% at 12 steps)
    return np.maximum(np.round(decoded / tau_k), 1.0)


def _data_at(data: dict, source: str, name: str, steps: np.ndarray) -> dict:
    """`data` (suite_prompts of the rates' server) with a k's steps under `name`; its prefix cache as the
    rates' server's."""
    return {**data, "steps": {**data["steps"], name: steps}, "cached": {**data["cached"], name: data["cached"][source]}}


def _ratio_check(own: StepMap, line: KStepMap, b: int, L: float, s: Settings, level: float) -> StepCostKCheck:
    """k's own map against the line through its neighbours at batch b: the difference of log rho, with
    the speculative members' parts (the baseline's is the same fit in both and cancels)."""
    mine = own.log_step(own.server, b, L)
    theirs = line.log_step(line.server, b, L)
    var = VarianceSum().plus(own.part(own.server, b, L)).plus(line.part(line.server, b, L))
    d = mine - theirs
    if var.total > 0:
        h = t_half_width(math.sqrt(var.total), var.dof, level)
        diff = Interval(math.exp(d), bounded_exp(d - h), bounded_exp(d + h))
        agrees = bool(d - h <= 0 <= d + h)
    else:
        diff, agrees = Interval(math.exp(d), None, None), None
    return StepCostKCheck(line.k, b, own.rho(b, L, s.confidence), line.rho(b, L, s.confidence), diff, agrees,
                          sorted(line.weights))


def build_kmap(m: Measurements, reqs: dict, parent: str, members: dict[int, str], maps: dict[int, StepMap],
               suites: list[str], cs: list[int], s: Settings, metric: str, holds: dict | None = None
               ) -> StepCostKMap | None:
    """The map in k of one sweep (members: k -> server; maps: k -> its StepMap, at least two), every k from 1
    to the largest with per-position acceptance predicted on `cs` for every suite, the inner mapped k
    checked against the line, the members held out against their cells, the schedule on `metric`.
    `holds` (k -> StepCostMap.holds): the mapped k whose own map missed at its check are named."""
    if len(maps) < 2:
        return None
    first = maps[min(maps)]
    L = first.context
    rec = StepCostKMap(parent, first.baseline, first.suite, sorted(maps), {str(k): x for k, x in members.items()},
                       context=int(round(L)), misses=sorted(k for k in maps if (holds or {}).get(k) is False))
    # rho at the median context for every k between 1 and the largest mapped one
    kmax = max(maps)
    for k in range(1, kmax + 1):
        km = at_k(maps, k, f"{parent}@k={k}")
        if km is None:
            continue
        for b in cs:
            rec.rho.append(StepCostKPoint(k, b, km.rho(b, L, s.confidence), km.how,
                                          sorted(km.weights) if km.how != "map" else [], km.extrapolated(b)))
    # linear in k: each inner mapped k against its neighbours' line, Bonferroni over the fitted batches
    for k in sorted(maps)[1:-1]:
        line = at_k(maps, k, f"{parent}@k={k}", leave_out=True)
        level = 1 - (1 - s.confidence) / max(len(maps[k].fit), 1)
        rec.rho_checks += [_ratio_check(maps[k], line, b, L, s, level) for b in maps[k].fit]
    if rec.rho_checks:
        rec.linear = all(c.agrees is not False for c in rec.rho_checks)
    # the largest member with per-position rates reaching its k: tau for every k up to it
    for K in sorted(members, reverse=True):
        rates = {u: per_position_rates(m, members[K], u) for u in suites}
        rates = {u: r[:K] for u, r in rates.items() if r is not None and len(r) >= K}
        if rates:
            break
    else:
        rec.note = "no member reported per-position acceptance (vLLM's spec_decode_per_position_acceptance_rates)"
        return rec
    src = members[K]
    rec.tau_from = src
    rec.rates = {u: [float(x) for x in r] for u, r in rates.items()}
    acc = acceptance_run_to_run(m, [src, first.baseline])
    acc = (acc[0] or 0.0, acc[1])
    checks: list = []
    for u in suites:
        data = suite_prompts(reqs, src, first.baseline, u) if u in rates else None
        if data is None:
            continue
        for k in range(1, K + 1):
            name = members.get(k, f"{parent}@k={k}")
            runs = [(False, at_k(maps, k, name))]
            if k in members and k != K:
                runs.append((True, at_k(maps, k, name, leave_out=True)))
            own = _own(reqs, name, first.baseline, u, data["prompts"]) if k in members else None
            for held, km in runs:
                if km is None:
                    continue
                dk = _data_at(data, src, name, steps_at(data, src, rates[u], k)) if held or own is None else own
                tau_from = "measured" if dk is own else f"per-position acceptance of {src} (k={K})"
                names = list(dict.fromkeys([metric, "tpot"]))
                for c in cs:
                    rows: dict = {}
                    got = predict_suite(km, dk, u, c, names, s, acc, rows)
                    mine: dict = {}
                    if held and own is not None:   # the same replay with the member's own steps, on the same draws
                        predict_suite(km, own, u, c, names, s, acc, mine)
                    for mt, (est, var) in got.items():
                        p = as_prediction(u, c, mt, est, var, s, "predicted", km.extrapolated(c), km.measured_noise)
                        kp = StepCostKPrediction(**p.__dict__, k=k, rho_from=km.how, tau_from=tau_from,
                                                 between=sorted(km.weights) if km.how != "map" else [])
                        if not held:
                            rec.predictions.append(kp)
                            continue
                        n = len(dk["prompts"])
                        paired = (rows[mt] - mine[mt])[1:] if mt in mine else np.array([])
                        paired = paired[np.isfinite(paired)]
                        own_var = VarianceSum().plus(km.error(c, float(np.median(dk["ptok"] + dk["out"] / 2))))
                        if paired.size > 2:
                            own_var.add(("tau at k", u, c), float(paired.var(ddof=1)) * n / (n - 1), n - 1)
                        if acc[0]:
                            own_var.add(("acceptance", src), acc[0] / max(km.repeats, 1), acc[1])
                        kp.role = "check"
                        got_d = check_rows(km, m, kp, est, s, own_var, maps[k].rr if k in maps else km.rr)
                        if got_d is not None:
                            checks.append(got_d)
                            rec.checks.append(kp)
    if checks:
        level = 1 - (1 - s.confidence) / len(checks)
        rec.holds = all(abs(d) <= t_half_width(math.sqrt(v.total), v.dof, level) for d, v in checks if v.total > 0)
    lo, hi = min(maps), max(maps)
    outside = [k for k in range(1, max(K, hi) + 1) if not lo <= k <= hi or k > K]
    if outside:
        rec.note = (f"k = {', '.join(map(str, outside))} not predicted: outside the mapped k ({lo} to {hi}) or above the "
                    f"largest k with per-position acceptance ({K})")
    rec.cells = _cells(m, first.baseline, members, K, sorted(maps), first.suite, first.fit)
    noise = all(mp.measured_noise for mp in maps.values())
    for u in dict.fromkeys(p.suite for p in rec.predictions):
        rec.schedule += schedule([p for p in rec.predictions if p.suite == u and p.metric == metric], u, metric, s,
                                 noise)
    return rec


def _own(reqs: dict, server: str, baseline: str, suite: str, prompts: list) -> dict | None:
    """A member's own measured prompts of the suite in the order of `prompts` (the rates' server's), None
    where it did not answer every one of them."""
    d = suite_prompts(reqs, server, baseline, suite)
    if d is None:
        return None
    at = {p: i for i, p in enumerate(d["prompts"])}
    if any(p not in at for p in prompts):
        return None
    i = np.array([at[p] for p in prompts])
    return {"prompts": list(prompts), "ptok": d["ptok"][i], "out": d["out"][i],
            "steps": {x: v[i] for x, v in d["steps"].items()}, "cached": {x: v[i] for x, v in d["cached"].items()}}


def _cells(m: Measurements, baseline: str, members: dict, K: int, mapped: list[int], suite: str, fit: list) -> dict:
    """Cells the sweep measured (the baseline and every member, every suite) against the cells the map's
    k schedule needs: the baseline's and the largest k's on every suite, and each other mapped k's on the
    map suite at the fitted concurrencies."""
    def count(x, keep=lambda k: True):
        return sum(1 for key in m.cells if key[0] == x and keep(key))
    sweep = count(baseline) + sum(count(x) for x in members.values())
    need = count(baseline) + count(members[K]) + sum(
        count(members[j], lambda key: key[1] == suite and key[2] in fit) for j in mapped if j != K and j in members)
    return {"sweep": sweep, "map": need, "members": len(members), "mapped": len(mapped)}


def schedule(preds: list[StepCostKPrediction], suite: str, metric: str, s: Settings, noise: bool
             ) -> list[StepCostKBand]:
    """The k deployed at every concurrency of the grid: of the k whose predicted speedup pays at the level
    that allows for the k compared (1 - (1 - confidence) / K, as the measured sweep's kchoice deploys: where
    every k is as fast as off, a false "speculate" at most (1 - confidence) / 2 at a concurrency, however
    many k), the largest point; 0 (off) where every k loses or is equivalent to off; None (undecided)
    otherwise; beside it the k with the largest predicted speedup. Neighbours with the same answer merged.
    `noise`: whether run to run was measured (comparison.decision's rule)."""
    by_c: dict = {}
    for p in preds:
        by_c.setdefault(p.concurrency, []).append(p)
    band = math.log(1 + s.min_effect)
    rows = []
    for c in sorted(by_c):
        ps = by_c[c]
        best = max(ps, key=lambda p: p.predicted.value)
        level = 1 - (1 - s.confidence) / len(ps)
        paying = [p for p in ps if _at_level(p, s.confidence, level, band, noise) == Decision.PAYS]
        if paying:
            k = max(paying, key=lambda p: p.predicted.value).k
        elif all(p.decision in (Decision.LOSES, Decision.EQUIVALENT) for p in ps):
            k = 0
        else:
            k = None
        rows.append((c, k, best.k, best.extrapolated))
    out: list[StepCostKBand] = []
    for c, k, best, ext in rows:
        if out and out[-1].k == k and out[-1].best == best:
            out[-1].hi = c
            out[-1].extrapolated = out[-1].extrapolated or ext
        else:
            out.append(StepCostKBand(suite, metric, c, c, k, best, ext))
    return out


def _at_level(p: StepCostKPrediction, confidence: float, level: float, band: float, noise: bool) -> Decision:
    """A prediction's verdict at another level: its log half-width rescaled by the t quantiles at its dof."""
    iv = p.predicted
    if iv.lo is None or iv.hi is None or not iv.value:
        return Decision.INCONCLUSIVE
    est = math.log(iv.value)
    h = (math.log(iv.hi) - math.log(iv.lo)) / 2 * t_critical(p.dof, level) / t_critical(p.dof, confidence)
    return decision(est - h, est + h, band, noise)
