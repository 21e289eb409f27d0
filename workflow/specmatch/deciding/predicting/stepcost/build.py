"""One speculative server's map record: the map, its points, the break-even acceptance, the strata's
tau, the predictions on the concurrency grid and their check (the method:
specmatch.deciding.predicting.stepcost)."""
from __future__ import annotations

import numpy as np

from ...reading.measurements import Measurements, Settings
from ...explaining.attribution import acceptance_run_to_run
from ..traffic.step_model import cell_requests
from .map import fit_map, rho_points, tau_slope
from .predict import (as_prediction, check_rows, grid, map_holds, measured_log_speedup, predict_profile, predict_suite,
                      strata_prompts, stratum_taus, suite_prompts)
from ....records import StepCostMap

METRICS = ("output_throughput", "tpot")


def requests_of(m: Measurements) -> dict:
    """Every cell's requests as the step model reads them, each with its stratum: its source, or its
    suite where it has none (a file suite)."""
    return {k: cell_requests(k, a, lambda suite, source: source or suite) for k, a in m.arrays.items()}


def contexts(reqs: dict, server: str, suite: str) -> tuple[int, list[int]]:
    """The map suite's context per sequence (prompt plus half the output) on the speculative server: its
    median, and the quartiles with it (short, median, long)."""
    v = np.concatenate([cr.ptok + cr.out / 2 for k, cr in reqs.items() if k[0] == server and k[1] == suite]
                       or [np.zeros(1)])
    q = [int(round(float(np.quantile(v, p)))) for p in (0.25, 0.5, 0.75)]
    return q[1], sorted(set(q))


def build_map(m: Measurements, reqs: dict, server: str, baseline: str, suite: str, suites: list[str],
              fit: list[int], checks: list[int], max_batch: int, forced: str, s: Settings,
              scheds: dict | None = None, sources: dict | None = None, profiles=None, fitted: dict | None = None
              ) -> StepCostMap | None:
    """The map of `server` against the baseline (None where either has no cell to fit it on): fitted on
    every given suite's cells at the `fit` concurrencies, checked at `checks`, predicted for every
    measured suite on the grid up to `max_batch`. `scheds`: each server's Scheduler (its tokens per step);
    `sources`: where each budget comes from; `profiles` (records.TrafficProfiles): every profile predicted
    from the map on the grid too, from its strata's prompts in the basis suite and the file suites.
    `fitted`: where given, the StepMap itself is kept there under the server's name (the map in k reads it)."""
    L, Ls = contexts(reqs, server, suite)
    sm = fit_map(reqs, m, server, baseline, suite, suites, [c for c in fit if c not in checks], L, scheds)
    if sm is None:
        return None
    if fitted is not None:
        fitted[server] = sm
    measured = sorted({k[2] for k in m.cells if k[0] == server})
    cs = grid(sm.fit, checks, measured, max_batch)
    rec = StepCostMap(server, baseline, suite, sm.fit, sorted(checks), sm.repeats,
                      {x: [float(t) for t in sm.theta[x]] for x in (server, baseline)}, L, Ls,
                      forced=forced, max_batch=max(cs))
    rec.steps = {x: {"budget": int(md.sched.budget) if md.sched.chunked else None,
                     "per_sequence": md.sched.per_sequence, "source": (sources or {}).get(x, ""),
                     "cache_served": _cache_served(reqs, x, suites, sm.fit)}
                 for x, md in sm.models.items()}
    rec.points = rho_points(sm, cs, Ls, s.confidence)
    # the tokens per step a drafter must reach at each batch size for TPOT to gain: rho at the median context
    rec.break_even = rho_points(sm, cs, [L], s.confidence)
    rec.strata = stratum_taus(reqs, server, suites, s)
    rec.tau_slope = tau_slope(sm, reqs, suites, s.confidence)
    if rec.tau_slope is not None and rec.tau_slope.lo is not None:
        rec.tau_moves = not (rec.tau_slope.lo <= 0 <= rec.tau_slope.hi)
    acc = acceptance_run_to_run(m, [server, baseline])
    acc = (acc[0] or 0.0, acc[1])
    checks_: list = []
    fitted: list = []
    for u in suites:
        data = suite_prompts(reqs, server, baseline, u)
        if data is None:
            continue
        on = sorted({k[2] for k in m.cells if k[0] == server and k[1] == u})
        for c in cs:
            got = predict_suite(sm, data, u, c, list(METRICS), s, acc)
            role = "check" if c in checks and c in on else "fit" if c in on else "predicted"
            for mt, (est, var) in got.items():
                p = as_prediction(u, c, mt, est, var, s, role, sm.extrapolated(c), sm.measured_noise)
                if role != "predicted":
                    got_diff = check_rows(sm, m, p, est, s)
                    if got_diff is not None:
                        (checks_ if role == "check" else fitted).append(got_diff)
                rec.predictions.append(p)
    if profiles is not None and profiles.profiles:
        _profiles(rec, sm, m, reqs, profiles, cs, acc, s)
    # the map is judged where a concurrency was measured only to check it (a test it was not fitted to,
    # its own family) and, so that a map that cannot follow its own cells is no better, at every measured
    # concurrency together (a second family: each alone errs in at most 1 - confidence of runs)
    if checks_:
        rec.holds = bool(map_holds(checks_, s.confidence) and map_holds(checks_ + fitted, s.confidence) is not False)
        rec.comparisons = len(checks_)
    return rec


def _cache_served(reqs: dict, server: str, suites: list[str], fit: list[int]) -> float | None:
    """The share of the prompt tokens of a server's fitted cells that its prefix cache served (the replay
    does not prefill them); None where its requests did not report it (replayed as all computed)."""
    crs = [cr for k, cr in reqs.items() if k[0] == server and k[1] in suites and k[2] in fit]
    got = [(float(cr.cached.sum()), float(cr.ptok.sum())) for cr in crs if cr.cached is not None]
    if not got or not sum(p for _, p in got):
        return None
    return sum(c for c, _ in got) / sum(p for _, p in got)


def _profiles(rec: StepCostMap, sm, m: Measurements, reqs: dict, profiles, cs: list[int], acc: tuple,
              s: Settings) -> None:
    """Every traffic profile on the grid from the map (predict.predict_profile): its strata's prompts from
    the basis suite and the file suites (never a verifying suite's), with its verifying suite's measured
    speedup beside it where the cells measured the concurrency."""
    sources = {u: suite_prompts(reqs, sm.server, sm.baseline, u)
               for u in ([profiles.basis] if profiles.basis else []) + list(profiles.files)}
    strata = strata_prompts(reqs, sm.server, sm.baseline, sources, tuple(profiles.files))
    basis = sources.get(profiles.basis)
    size = len(basis["prompts"]) if basis else max((len(d["prompts"]) for d in strata.values()), default=0)
    for prof in profiles.profiles:
        missing = [st for st, w in prof.mix.items() if w > 0 and (st not in strata or len(strata[st]["prompts"]) < 2)]
        if missing:
            rec.profiles_skipped[prof.name] = (f"{', '.join(missing)}: fewer than 2 prompts measured by both servers "
                                               "in the basis suite and the file suites")
            continue
        for c in cs:
            got = predict_profile(sm, strata, prof.mix, size, c, list(METRICS), s, acc, prof.name)
            if got is None:
                continue
            for mt, (est, var) in got.items():
                p = as_prediction(prof.name, c, mt, est, var, s, "predicted", sm.extrapolated(c), sm.measured_noise)
                if prof.suite:
                    meas = measured_log_speedup(m, sm.server, sm.baseline, prof.suite, c, mt)
                    if meas is not None:
                        p.measured = float(np.exp(meas[0]))
                rec.profiles.append(p)
