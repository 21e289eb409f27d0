"""Predictions from the map and the measured acceptance at any concurrency, their check against the
cells, the break-even acceptance and every stratum's tau beside it (the method:
specmatch.deciding.predicting.stepcost)."""
from __future__ import annotations

import math

import numpy as np

from ...reading.measurements import Measurements, Settings
from ...verdicts.comparison import decision
from ...verdicts.noise import VarianceSum
from ..traffic.step_model import figures, simulate
from .map import StepMap, bounded_exp
from ....config import passes_for
from ....metrics import log_speedup
from ....records import Decision, Interval, StepCostPrediction, StratumTau
from ....resample import draws
from ....stats import t_half_width

REQUESTS_PER_WORKER = 2     # the default requests.min_requests_per_worker: a predicted cell sends whole passes
                            # of the suite, at least this many requests per worker, as a cell does
ROWS = 200                  # prompt resamples per prediction


def suite_prompts(reqs: dict, server: str, baseline: str, suite: str) -> dict | None:
    """Per prompt both servers answered in the suite: its prompt tokens, output tokens and, per server,
    decode steps, each the mean over every cell and pass (a greedy request's steps and lengths do not
    depend on the load). None without such prompts."""
    acc: dict = {}
    for k, cr in reqs.items():
        if k[1] != suite or k[0] not in (server, baseline) or cr.steps is None:
            continue
        seen: dict = {}
        for i, p in enumerate(cr.prompts):
            d = acc.setdefault(p, {"ptok": [], "out": [], server: [], baseline: [],
                                   **{(x, again): [] for x in (server, baseline) for again in (False, True)}})
            if np.isfinite(cr.steps[i]) and cr.steps[i] > 0:
                d[k[0]].append(float(cr.steps[i]))
            if k[0] == server:
                d["ptok"].append(float(cr.ptok[i]))
                d["out"].append(float(cr.out[i]))
            # a prompt's first request in a cell (its first pass) and its later ones, which may hit the cache
            again = seen.get(p, 0) > 0
            seen[p] = seen.get(p, 0) + 1
            d[(k[0], again)].append(float(cr.cached[i]) if cr.cached is not None else 0.0)
    names = sorted(p for p, d in acc.items() if d[server] and d[baseline] and d["out"])
    if len(names) < 2:
        return None
    return {"prompts": names,
            "ptok": np.array([np.mean(acc[p]["ptok"]) for p in names]),
            "out": np.array([np.mean(acc[p]["out"]) for p in names]),
            "steps": {x: np.array([np.mean(acc[p][x]) for p in names]) for x in (server, baseline)},
            # per server, each prompt's tokens served from the prefix cache on its first pass and on later
            # ones (the first pass's where no later pass was measured)
            "cached": {x: np.array([[_mean(acc[p][(x, False)]), _mean(acc[p][(x, True)] or acc[p][(x, False)])]
                                    for p in names]) for x in (server, baseline)}}


def _mean(v: list) -> float:
    return float(np.mean(v)) if v else 0.0


def resent(cached: np.ndarray, pick: np.ndarray, n: int) -> np.ndarray:
    """Each slot's prompt tokens the prefix cache serves, for slots of whole passes over n prompts (`pick`:
    the prompt of each slot, `cached`: per prompt, [first pass, later passes]): a later pass resends the
    first pass's prompts, which the cache may serve."""
    again = np.broadcast_to(np.arange(pick.shape[-1]) >= n, pick.shape).astype(int)
    return cached[pick, again]


def _draws(s: Settings, server: str, suite: str, n: int) -> np.ndarray:
    """Row 0 the prompts as measured, then resamples by prompt; the same for every concurrency and
    metric (a prediction's curve is smooth in c) and both servers (paired)."""
    rng = s.rng("stepcost", server, suite, n)
    return draws(rng, n, ROWS, keep_original=True)


def predict_suite(sm: StepMap, data: dict, suite: str, c: int, metric_names: list[str], s: Settings,
                  acceptance: tuple, draws: dict | None = None) -> dict[str, tuple[float, VarianceSum]]:
    """The predicted log speedup of `sm.server` over the baseline on `suite` at c for every metric,
    with its variance: the prompt sample, the map's error at c, the acceptance's run to run. `draws`:
    where given, each metric's log speedup of every row (the prompts as measured, then the resamples)
    is kept there (a paired comparison of two predictions on the same draws)."""
    n = len(data["prompts"])
    rows = _draws(s, sm.server, suite, n)
    size = n * passes_for(n, 1, REQUESTS_PER_WORKER, c)
    idx = rows[:, np.arange(size) % n]
    figs: dict = {}
    for x in (sm.server, sm.baseline):
        ptok, out, steps = data["ptok"][idx], data["out"][idx], data["steps"][x][idx]
        e2e, ttft, _ = simulate(sm.theta[x], c, ptok, out, steps, m_adm=np.full(ptok.shape, sm.models[x].admission_at(c)),
                                cached=resent(data["cached"][x], idx, n), sched=sm.models[x].sched)
        figs[x] = {mt: figures(mt, c, out, e2e, ttft, s.slo) for mt in metric_names}
    res = {}
    acc_var, acc_dof = acceptance
    map_error = sm.error(c, float(np.median(data["ptok"] + data["out"] / 2)))   # the same for every metric
    for mt in metric_names:
        ls = np.asarray(log_speedup(mt, figs[sm.server][mt], figs[sm.baseline][mt]), float)
        if draws is not None:
            draws[mt] = ls
        point = float(ls[0])
        boot = ls[1:][np.isfinite(ls[1:])]
        var = VarianceSum()
        if boot.size > 2:
            var.add(("prompts", suite, c), float(boot.var(ddof=1)) * n / (n - 1), n - 1)
        var.plus(map_error)
        if acc_var:
            var.add(("acceptance", sm.server), acc_var / max(sm.repeats, 1), acc_dof)
        res[mt] = (point, var)
    return res


def strata_prompts(reqs: dict, server: str, baseline: str, suites: dict, files: tuple = ()) -> dict[str, dict]:
    """Each stratum's prompts (a training source of the basis suite; a file suite, among `files`, is one
    stratum by its name whatever its prompts' sources, as traffic profiles name it) with their data, from
    `suites` (suite -> its suite_prompts)."""
    out: dict = {}
    for u, data in suites.items():
        if data is None:
            continue
        of: dict = {}
        for k, cr in reqs.items():
            if k[1] == u and k[0] == server:
                for p, st in zip(cr.prompts, cr.strata):
                    of.setdefault(p, u if u in files else st)
        for st in sorted({of.get(p, u) for p in data["prompts"]}):
            keep = np.array([of.get(p, u) == st for p in data["prompts"]])
            got = out.setdefault(st, {"prompts": [], "ptok": [], "out": [], "steps": {server: [], baseline: []},
                                      "cached": {server: [], baseline: []}})
            got["prompts"] += [p for p, k in zip(data["prompts"], keep) if k]
            for f in ("ptok", "out"):
                got[f].append(data[f][keep])
            for f in ("steps", "cached"):
                for x in (server, baseline):
                    got[f][x].append(data[f][x][keep])
    for got in out.values():
        for f in ("ptok", "out"):
            got[f] = np.concatenate(got[f])
        for f in ("steps", "cached"):
            got[f] = {x: np.concatenate(v) for x, v in got[f].items()}
    return out


PROFILE_ROWS = 64        # compositions of the mix from the measured prompts: the point estimate
PROFILE_RESAMPLES = 40   # resamples of every stratum's prompts (the prompt sample's part) ...
PROFILE_DRAWS = 4        # ... each read through this many compositions


def predict_profile(sm: StepMap, strata: dict, mix: dict, size_of: int, c: int, metric_names: list[str],
                    s: Settings, acceptance: tuple, name: str) -> dict[str, tuple[float, VarianceSum]] | None:
    """A traffic profile's predicted log speedup at c from the map, for every metric, with its variance;
    None where a stratum of the mix has fewer than two prompts measured by both servers. A predicted cell
    sends whole passes over a suite of `size_of` prompts (the basis suite's size) whose every slot's stratum
    is drawn with the mix's shares and its prompt from that stratum's measured prompts (the same draws at
    every concurrency); the point estimate is the mean over PROFILE_ROWS such suites. The prompt sample:
    every stratum's prompts resampled, each resample read through PROFILE_DRAWS suites, the variance of
    the resamples' means (the draws' own spread is left in: the part errs wide by it), times n / (n - 1)
    of the smallest stratum (a bootstrap's variance of a mean over n prompts is short by that: half at
    two prompts, which made a profile dominated by a two-prompt stratum cover 0.79), with its n - 1 dof;
    the map's error at c and the acceptance's run to run as for a suite."""
    names = [st for st, w in mix.items() if w > 0]
    if not names or any(st not in strata or len(strata[st]["prompts"]) < 2 for st in names):
        return None
    size = size_of * passes_for(size_of, 1, REQUESTS_PER_WORKER, c)
    rng = s.rng("stepcost-profile", sm.server, name)
    total = PROFILE_ROWS + PROFILE_RESAMPLES * PROFILE_DRAWS
    # one suite of size_of prompts per row, the same at every concurrency, sent in whole passes
    tile = np.arange(size) % size_of
    u, v = rng.random((total, size_of))[:, tile], rng.random((total, size_of))[:, tile]
    cum = np.cumsum([mix[st] for st in names])
    which = np.minimum(np.searchsorted(cum / cum[-1], u, side="right"), len(names) - 1)
    counts = [len(strata[st]["prompts"]) for st in names]
    # each slot's prompt within its stratum: rows 0 .. PROFILE_ROWS - 1 from the measured prompts, each later
    # block of PROFILE_DRAWS rows from one resample of every stratum's prompts
    rep = np.arange(total) >= PROFILE_ROWS
    r_of = np.where(rep, (np.arange(total) - PROFILE_ROWS) // PROFILE_DRAWS, 0)[:, None]
    picks = []
    for n in counts:
        pick = np.floor(v * n).astype(int)
        picks.append(np.where(rep[:, None], draws(rng, n, PROFILE_RESAMPLES)[r_of, pick], pick))
    rows = {}
    for x in (sm.server, sm.baseline):
        cols = {f: np.zeros((total, size)) for f in ("ptok", "out", "steps", "cached")}
        for j, st in enumerate(names):
            d, pick, m = strata[st], picks[j], which == j
            vals = {"ptok": d["ptok"][pick], "out": d["out"][pick], "steps": d["steps"][x][pick],
                    "cached": resent(d["cached"][x], pick, size_of)}
            for f in cols:
                cols[f][m] = vals[f][m]
        e2e, ttft, _ = simulate(sm.theta[x], c, cols["ptok"], cols["out"], cols["steps"],
                                m_adm=np.full((total, size), sm.models[x].admission_at(c)), cached=cols["cached"],
                                sched=sm.models[x].sched)
        rows[x] = {mt: figures(mt, c, cols["out"], e2e, ttft, s.slo) for mt in metric_names}
    acc_var, acc_dof = acceptance
    ctx = float(np.mean([np.median(strata[st]["ptok"] + strata[st]["out"] / 2) for st in names]))
    map_error = sm.error(c, ctx)
    out = {}
    for mt in metric_names:
        ls = np.asarray(log_speedup(mt, rows[sm.server][mt], rows[sm.baseline][mt]), float)
        point = float(np.nanmean(ls[:PROFILE_ROWS]))
        per = np.nanmean(ls[PROFILE_ROWS:].reshape(PROFILE_RESAMPLES, PROFILE_DRAWS), 1)
        var = VarianceSum()
        per = per[np.isfinite(per)]
        if per.size > 2:
            n_min = min(counts)
            var.add(("prompts", name, c), float(per.var(ddof=1)) * n_min / (n_min - 1), float(n_min - 1))
        var.plus(map_error)
        if acc_var:
            var.add(("acceptance", sm.server), acc_var / max(sm.repeats, 1), acc_dof)
        out[mt] = (point, var)
    return out


def as_prediction(suite: str, c: int, metric: str, est: float, var: VarianceSum, s: Settings, role: str,
                  extrapolated: bool, run_to_run: bool) -> StepCostPrediction:
    """A prediction's interval and verdict by the verdicts' rule (without a measure of run-to-run variation,
    one repeat, only an effect beyond the band is trusted, as comparison.decision does for the cells)."""
    h = t_half_width(math.sqrt(var.total), var.dof, s.confidence) if var.total > 0 else float("inf")
    d = (decision(est - h, est + h, math.log(1 + s.min_effect), run_to_run) if math.isfinite(h)
         else Decision.INCONCLUSIVE)
    iv = Interval(math.exp(est), bounded_exp(est - h) if math.isfinite(h) else None,
                  bounded_exp(est + h) if math.isfinite(h) else None)
    return StepCostPrediction(suite, c, metric, iv, d, float(var.dof), role, extrapolated)


def measured_log_speedup(m: Measurements, server: str, baseline: str, suite: str, c: int, metric: str
                         ) -> tuple[float, int] | None:
    """The cells' log speedup at c: the mean over the repeats both servers measured of each repeat's."""
    both = sorted(set(m.repeats(server, suite, c)) & set(m.repeats(baseline, suite, c)))
    vals = []
    for r in both:
        ks, kb = (server, suite, c, r), (baseline, suite, c, r)
        a, b = m.arrays[ks].point(metric, m.cells[ks]), m.arrays[kb].point(metric, m.cells[kb])
        if a and b and a > 0 and b > 0:
            vals.append(float(log_speedup(metric, a, b)))
    return (float(np.mean(vals)), len(vals)) if vals else None


def check_rows(sm: StepMap, m: Measurements, pred: StepCostPrediction, est: float, s: Settings,
               own: VarianceSum | None = None, rr=None) -> tuple[float, VarianceSum] | None:
    """Measured against predicted where the cells measured the concurrency: the difference of the logs
    with its interval (the measured cells' run to run over their repeats, and the map's error; the
    prompts are the same and cancel) and whether it contains 0, written on `pred`; returns the
    difference and its variance (for the family's test, build.map_holds), None where not measured.
    `own`: the prediction's own variance in the difference instead of the map's error; `rr`: the measured
    cells' run to run instead of the map's (the map in k's held-out members)."""
    got = measured_log_speedup(m, sm.server, sm.baseline, pred.suite, pred.concurrency, pred.metric)
    if got is None:
        return None
    value, R = got
    diff = VarianceSum().plus(sm.error(pred.concurrency) if own is None else own)
    for x in (sm.server, sm.baseline):
        diff.plus((rr or sm.rr).at(pred.metric, x, pred.concurrency), 1.0 / R)
    d = value - est
    pred.measured = math.exp(value)
    if diff.total > 0:
        h = t_half_width(math.sqrt(diff.total), diff.dof, s.confidence)
        pred.difference = Interval(math.exp(d), bounded_exp(d - h), bounded_exp(d + h))
        pred.agrees = bool(d - h <= 0 <= d + h)
    else:
        pred.difference = Interval(math.exp(d), None, None)
    return d, diff


def map_holds(diffs: list[tuple[float, VarianceSum]], confidence: float) -> bool | None:
    """Whether the map agrees with a family of measured comparisons: no difference's interval at the
    family's level (Bonferroni: 1 - (1 - confidence) / m) excludes 0."""
    usable = [(d, v) for d, v in diffs if v.total > 0]
    if not usable:
        return None
    level = 1 - (1 - confidence) / len(usable)
    return all(abs(d) <= t_half_width(math.sqrt(v.total), v.dof, level) for d, v in usable)


def stratum_taus(reqs: dict, server: str, suites: list[str], s: Settings) -> list[StratumTau]:
    """Each source's (a training suite's requests) or file suite's tokens per decode step on the
    speculative server, sum of decoded tokens over sum of steps over its prompts, with a bootstrap
    interval by prompt (t at n - 1 dof on the log scale)."""
    per: dict = {}
    for k, cr in reqs.items():
        if k[0] != server or k[1] not in suites or cr.steps is None:
            continue
        for i, p in enumerate(cr.prompts):
            if np.isfinite(cr.steps[i]) and cr.steps[i] > 0:   # a stratum: its source, else its suite (requests_of)
                d = per.setdefault(cr.strata[i], {}).setdefault(p, [0.0, 0.0])
                d[0] += max(float(cr.out[i]) - 1, 0.0)
                d[1] += float(cr.steps[i])
    out = []
    for st in sorted(per):
        v = np.array(list(per[st].values()))
        n = len(v)
        tau = float(v[:, 0].sum() / v[:, 1].sum())
        if n < 2:
            out.append(StratumTau(st, Interval(tau, None, None), n))
            continue
        idx = draws(s.rng("stepcost-tau", server, st), n, ROWS)
        with np.errstate(divide="ignore", invalid="ignore"):
            boot = np.log(v[idx, 0].sum(1) / v[idx, 1].sum(1))
        boot = boot[np.isfinite(boot)]
        se = float(boot.std(ddof=1)) * math.sqrt(n / (n - 1)) if boot.size > 2 else 0.0
        h = t_half_width(se, n - 1, s.confidence)
        out.append(StratumTau(st, Interval(tau, tau * math.exp(-h), tau * math.exp(h)), n))
    return out


def grid(fit: list[int], checks: list[int], measured: list[int], max_batch: int) -> list[int]:
    """The concurrencies predicted: powers of two up to the largest batch the server runs, and every
    concurrency a cell measured."""
    top = max([max_batch] + list(fit) + list(checks) + list(measured))
    out = {1}
    b = 2
    while b <= top:
        out.add(b)
        b *= 2
    return sorted(out | set(fit) | set(checks) | set(measured) | {top})

