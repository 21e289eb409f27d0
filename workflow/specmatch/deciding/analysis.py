"""The analysis: every question of the deciding stage asked once of one set of measurements.

The experiment (docs/methods/verdicts.md): every server measures the same prompts at every
concurrency, and every cell is repeated in fresh server sessions (repeats), interleaved across
servers. The questions live in folders, each importing only the ones below it:

- reading/: the measurements (every cell read once) and the design of repeats;
- verdicts/: run to run, one comparison and its typed verdict (pays, loses, equivalent,
  inconclusive), crossovers, acceptance per suite;
- explaining/: tokens per step x step cost, the context axis, natural stopping and sessions, claims
  resting on flagged cells;
- predicting/: the step model, traffic mixes predicted from per-source measurements, the step-cost map;
- recommending/: what to deploy (on/off and k schedules) and its verification.

This module joins them into an Analysis (the primary grid's verdicts and recommendations, the
recommended servers' cells joined and verified, the attribution) for the steps on top (recommend,
rounds, decide). Verdicts' error rates are checked by simulation (specmatch.calibration,
tests/test_calibration.py).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import polars as pl

from .verdicts.acceptance import acceptance_summary
from .explaining.attribution import (acceptance_run_to_run, both, decompose, length_model, median_prompt_tokens,
                          mixed_servers, session_variance)
from .verdicts.comparison import Comparison, compare, crossovers, decide
from .verdicts.designs import rounds_shares, with_design
from ..controls import OFF, is_control
from .recommending.deployment import (RECOMMENDED, MapBeyond, ServerInfo, engine_of, own_k, recommend, verification,
                                      verify_against)
from .reading.measurements import Measurements, Settings, drafted_nothing
from .verdicts.noise import RunToRun, VarianceSum, run_to_run
from .recommending.krecommend import references, sweep_report
from ..records import (AdjustedSpeedup, Attribution, CellResult, Contrast, Decision, DerivedServer, Effect, Interval,
                       Outcome, Recommendation, RoundPlan, StepCosts, Verdict, Verification)
from ..stats import log_t_interval
from ..sweep import members as sweep_members, parents as sweep_parents, sweep_of

__all__ = ["Analysis", "analyse", "attribute", "crossover", "frozen_verdicts", "join_derived", "primary_analysis",
           "server_verdicts", "verified_analysis", "verify", "verify_k", "verify_k_recommendations",
           "verify_recommendations"]


def crossover(verdicts: list[Verdict], cmps: list[Comparison], s: Settings):
    """The first crossover (comparison.crossovers), or None where verdicts never change sign."""
    got = crossovers(verdicts, cmps, s)
    return got[0] if got else None


# -- everything at once -----------------------------------------------------------------------
@dataclass
class Analysis:
    """The typed result of the analysis, which the decide step writes as records (deciding.decide) for
    the summary to render."""
    settings: Settings
    baseline: str
    servers: list
    suites: list
    concurrencies: list
    run_to_run: RunToRun
    verdicts: list
    comparisons: dict                  # (server, suite, metric) -> [Comparison by concurrency]
    off_cost: list                     # throughput verdicts of cells where a speculative server drafted nothing
    acceptance: list                   # AcceptanceSummary per (speculative server, suite)
    recommendations: list
    measurements: Measurements
    infos: dict = field(default_factory=dict)   # name -> ServerInfo
    # (server, suite, metric) -> [Crossover]: only where verdicts change sign (throughput and recommend_metric)
    crossovers: dict = field(default_factory=dict)
    k_recommendations: list = field(default_factory=list)  # kmodel.KRecommendation per (k sweep, recommend suite)
    k_points: list = field(default_factory=list)           # kmodel.KPoint: each k's predicted vs measured speedup

    def verdict(self, server, suite, c, metric="output_throughput") -> Verdict | None:
        return next((v for v in self.verdicts if (v.server, v.suite, v.concurrency, v.metric) ==
                     (server, suite, c, metric)), None)


def server_verdicts(m: Measurements, rr: RunToRun, server: str, baseline: str, suites: list, concurrencies: list
                    ) -> tuple[list, dict, list]:
    """One server against the baseline wherever both were measured: its verdicts (every suite, metric
    and concurrency), the comparisons they rest on by (server, suite, metric) in concurrency order,
    and the throughput verdicts of cells where it drafted nothing (configured but off). A server the
    rounds do not run (one measured later) gets no round shares: its statements assume its own cells."""
    return _decided(m, server, suites, server_comparisons(m, rr, server, baseline, suites, concurrencies))


def server_comparisons(m: Measurements, rr: RunToRun, server: str, baseline: str, suites: list, concurrencies: list
                       ) -> dict:
    """One server's comparisons against the baseline by (server, suite, metric), in concurrency order."""
    comparisons = {}
    for suite in suites:
        for metric in m.settings.metrics:
            row = [compare(m, rr, server, baseline, suite, c, metric) for c in concurrencies
                   if m.repeats(server, suite, c) and m.repeats(baseline, suite, c)]
            if row:
                comparisons[(server, suite, metric)] = row
    return comparisons


def with_round_shares(m: Measurements, comparisons: dict) -> None:
    """Comparison.round_shares for the comparisons of every server the rounds run together (what they would
    measure again: comparison.rounds_shares, on the metric they decide by), the other metrics' comparisons
    taking those of their configuration."""
    if not m.settings.designs:
        return
    rm = m.settings.recommend_metric
    cmps = [c for (_sv, _su, mt), row in comparisons.items() if mt == rm for c in row]
    rounds_shares(cmps, m.settings, m.repeats_by_cell())
    by = {(c.server, c.suite, c.concurrency): c.round_shares for c in cmps}
    for (_sv, _su, mt), row in comparisons.items():
        if mt != rm:
            for c in row:
                c.round_shares = dict(by.get((c.server, c.suite, c.concurrency), {}))


def _decided(m: Measurements, server: str, suites: list, comparisons: dict) -> tuple[list, dict, list]:
    """server_verdicts' verdicts from its comparisons."""
    verdicts, off = [], []
    for suite in suites:
        for metric in m.settings.metrics:
            for cmp in comparisons.get((server, suite, metric), []):
                v = with_design(decide(cmp, m.settings), cmp, m.settings)
                verdicts.append(v)
                if metric == "output_throughput" and drafted_nothing(m, server, suite, cmp.concurrency):
                    off.append(v)
    return verdicts, {k: v for k, v in comparisons.items() if k[0] == server}, off


def frozen_verdicts(plans: list[RoundPlan], baseline: str) -> dict[tuple, Verdict]:
    """The verdicts the sequential design kept: each configuration at the look where it stopped
    (RoundDecision.final: decided, at max, or unlikely to be decided by the remaining repeats), keyed
    (server, against, suite, concurrency, metric), the k sweeps' pairs included (`against` a member or
    the baseline). Passed to analyse(frozen=...), every comparison of the same data keeps this verdict,
    level and interval (comparison.freeze; a pair asked the other way round gets it inverted), however
    other configurations' later repeats move the run-to-run estimate; the k model, which decides its
    pairs with compare/decide on the analysis's measurements, gets them the same way. The earliest stop
    counts (a later plan that looks at a stopped pair again does not move it)."""
    out: dict = {}
    for p in sorted(plans, key=lambda p: p.round):
        for d in p.decisions:
            if not d.final:
                continue
            against = d.against or baseline
            key = (d.server, against, d.suite, d.concurrency, p.metric)
            if key in out or (against, d.server, d.suite, d.concurrency, p.metric) in out:
                continue
            out[key] = Verdict(d.server, d.suite, d.concurrency, p.metric, d.verdict, d.speedup, d.lo, d.hi,
                               d.confidence, d.repeats, against=against, run_to_run=d.run_to_run, decide=d.decide,
                               dof=d.dof, design=d.design)
    return out


def analyse(cells: "Measurements | list[tuple[CellResult, pl.DataFrame]]", baseline: str, settings: Settings,
            infos: dict[str, ServerInfo] | None = None, recommend_suites: list[str] | None = None,
            primary: list[str] | None = None, frozen: dict | None = None, stepcost: StepCosts | None = None
            ) -> Analysis:
    """Verdicts for every server against the baseline, the run-to-run variance, the configured-but-off
    findings, acceptance per suite and the recommendations. `primary` names the servers of the grid
    the recommendation comes from (run-to-run variance is estimated from them only, so adding the
    recommended server's cells later leaves the recommendation unchanged). `frozen`: the verdicts the
    sequential design kept where it stopped a configuration (frozen_verdicts of the round plans).
    `cells`: the measurements (measurements.Measurements), or the cells and request records to read."""
    m = Measurements.read(cells, settings)
    m = m.only(m.servers())
    m.settings = settings
    m.frozen = dict(frozen or {})
    servers = m.servers()
    if baseline not in servers:
        from ..files import SpecmatchError

        raise SpecmatchError(f"baseline: no cells of server '{baseline}'")
    suites = list(dict.fromkeys(k[1] for k in m.cells))
    concurrencies = sorted({k[2] for k in m.cells})
    rr = run_to_run(m, primary)
    verdicts, comparisons, off = [], {}, []
    others = [s_ for s_ in servers if s_ != baseline]
    for server in others:
        comparisons.update(server_comparisons(m, rr, server, baseline, suites, concurrencies))
    # the rounds run the grid's servers together: what they would measure again, over all of them
    with_round_shares(m, {k: v for k, v in comparisons.items() if primary is None or k[0] in primary})
    for server in others:
        vs, _cmps, offs = _decided(m, server, suites, comparisons)
        verdicts += vs
        off += offs
    cross = _crossovers(verdicts, comparisons, settings)
    acc = [acceptance_summary(m, s_, u) for s_ in servers if s_ != baseline for u in suites]
    acc = [a for a in acc if a.length is not None]
    infos = endpoint_k(m, infos or {})
    recs = []
    for server, info in infos.items():
        drafted = any((k[0] == server and (x.spec_decode_num_drafts or 0) > 0) for k, x in m.cells.items())
        if (server == baseline or not (info.speculative or drafted) or is_control(server)
                or (primary is not None and server not in primary) or sweep_of(server) is not None):
            continue  # a configured-off control explains a speedup; it is never a deployment to recommend.
            # A k sweep's member is one k of a question about every k (k_reports), not a deployment alone
        for suite in recommend_suites or []:
            key = (server, suite, settings.recommend_metric)
            if key in comparisons:
                vs = [v for v in verdicts if (v.server, v.suite, v.metric) == key]
                recs.append(recommend(info, suite, vs, comparisons[key], settings,
                                      *map_predictions(stepcost, server, suite, settings.recommend_metric),
                                      beyond=map_beyond(stepcost, server, suite, settings.recommend_metric)))
    an = Analysis(settings, baseline, servers, suites, concurrencies, rr, verdicts, comparisons, off, acc, recs, m,
                  infos or {}, cross)
    an.k_recommendations, an.k_points = k_reports(an, recommend_suites or [], primary)
    verify_recommendations(an, [r for r in recs if r.server + RECOMMENDED in servers], {})
    verify_k_recommendations(an, [r for r in an.k_recommendations if r.parent + RECOMMENDED in servers
                                  or r.action in ("keep", "off")], {})
    return an


def endpoint_k(m: Measurements, infos: dict[str, ServerInfo]) -> dict[str, ServerInfo]:
    """`infos` with each external endpoint that drafts but names no k in its config given the k it drafts:
    its draft tokens per speculative step over its cells (vLLM's counters), so its recommendation can
    be written as a schedule (ServerInfo.k_source says where the k came from). Others as they are."""
    out = dict(infos)
    for name, info in infos.items():
        engine = engine_of(info)
        if engine.launches or own_k(info.speculative or {}):
            continue
        tokens = sum(x.spec_decode_num_draft_tokens or 0 for key, x in m.cells.items() if key[0] == name)
        drafts = sum(x.spec_decode_num_drafts or 0 for key, x in m.cells.items() if key[0] == name)
        spec = engine.naming_k(info.speculative or {}, max(1, round(tokens / drafts))) if drafts and tokens else None
        if spec is not None:
            out[name] = dataclasses.replace(info, speculative=spec,
                                            k_source="the endpoint's draft counters: draft tokens per speculative step")
    return out


def k_reports(an: Analysis, suites: list[str], primary: list[str] | None = None) -> tuple[list, list]:
    """Which k at which load for every k sweep of the grid (krecommend.sweep_report) on each suite the
    recommendations stand on where the sweep was measured: its KRecommendation and each k's KPoint."""
    names = [x for x in an.servers if primary is None or x in primary]
    recs, points = [], []
    for parent in sweep_parents(names):
        ks = sweep_members(parent, names)
        info = an.infos.get(ks[max(ks)])
        if info is None:   # no launch record (the recommendation needs the server's engine and max batch)
            continue
        for suite in suites:
            if not any(an.measurements.repeats(n, suite, c) for n in ks.values() for c in an.concurrencies):
                continue
            rec, pts = sweep_report(an, parent, info, suite)
            recs.append(rec)
            points += pts
    return recs, points


def _crossovers(verdicts: list, comparisons: dict, s: Settings, servers: list | None = None) -> dict:
    out = {}
    for (server, suite, metric), cmps in comparisons.items():
        if metric in ("output_throughput", s.recommend_metric) and (servers is None or server in servers):
            vs = [v for v in verdicts if (v.server, v.suite, v.metric) == (server, suite, metric)]
            out[(server, suite, metric)] = crossovers(vs, cmps, s)
    return out


def join_derived(an: Analysis, m: "Measurements | list", derived: list[str]) -> Analysis:
    """The analysis with the cells of the recommended servers (`derived`) joined from every measurement
    `m`: their verdicts against the baseline join the tables, while every decision (run-to-run variance,
    verdicts of the configured servers, recommendations) stays the primary grid's."""
    if not derived:
        return an
    m = Measurements.read(m, an.settings)
    full = m.only(m.servers())
    full.settings, full.frozen = an.settings, an.measurements.frozen
    an.measurements = full
    an.servers = full.servers()
    for name in derived:
        if name not in an.servers:
            continue
        vs, cmps, offs = server_verdicts(full, an.run_to_run, name, an.baseline, an.suites, an.concurrencies)
        an.verdicts += vs
        an.comparisons.update(cmps)
        an.off_cost += offs
        an.crossovers.update(_crossovers(vs, cmps, an.settings, [name]))
    return an


def verify_recommendations(an: Analysis, recs: list[Recommendation], derived: dict[str, DerivedServer]
                           ) -> list[Recommendation]:
    """Each recommendation's measured check (deployment.verification) as its `verified` record: the
    server that deploys it (derived `<server>__recommended`, or a configured twin that already does),
    against the reference its schedule fixes. `derived`: name -> records.DerivedServer."""
    for r in recs:
        name = r.derived_server or r.measured_by or next(
            (n for n, d in derived.items() if d.parent == r.server and d.suite == r.suite), None) or (
            r.server + RECOMMENDED if measured_on(an, r.server + RECOMMENDED, r.suite) else None)
        if name and name in an.servers:
            r.verified = verify(an, r, name)
        elif name and r.verified is None:
            r.verified = Verification(name, Outcome.NOT_MEASURED, an.settings.recommend_metric, an.settings.confidence,
                                      min_effect=an.settings.min_effect, reason=f"no cell of `{name}` was measured")
        elif name is None and r.action in ("schedule", "keep") and not r.as_configured:
            r.verified = deployed_elsewhere(an, r.server, r.suite, derived) or r.verified
    return recs


def deployed_elsewhere(an: Analysis, parent: str, suite: str, derived: dict[str, DerivedServer]) -> Verification | None:
    """NOT_MEASURED, saying why, for a new deployment decided on `suite` whose `<parent>__recommended`
    deploys another suite's (one recommended server per server); None where that is not the case."""
    other = derived.get(parent + RECOMMENDED)
    if other is None or other.suite == suite:
        return None
    return Verification(parent + RECOMMENDED, Outcome.NOT_MEASURED, an.settings.recommend_metric, an.settings.confidence,
                        min_effect=an.settings.min_effect,
                        reason=f"one recommended server per server: `{parent + RECOMMENDED}` deploys what was decided "
                               f"on `{other.suite}`")


def measured_on(an: Analysis, server: str, suite: str) -> bool:
    """Whether `server` has a cell on `suite` (a derived server is measured on its recommendation's suite only)."""
    return server in an.servers and any(an.measurements.repeats(server, suite, c) for c in an.concurrencies)


def verify_k_recommendations(an: Analysis, recs: list, derived: dict[str, DerivedServer]) -> list:
    """Each k recommendation's measured check (verify_k) as its `verified` record, by the server that deploys
    it: a schedule by `<parent>__recommended` (only by one that deploys this suite's schedule: with several
    recommendation suites, `<parent>__recommended` deploys one of them); one k everywhere by that member
    as configured and off everywhere by the baseline (each its own measurement, checked against the
    references like a schedule: krecommend.derived_config). An undecided recommendation deploys nothing."""
    for r in recs:
        if r.action in ("keep", "off") and (r.derived_server or r.server) in an.servers:
            r.derived_server = r.derived_server or r.server
            r.verified = verify_k(an, r, r.derived_server)
            continue
        if r.action != "schedule":
            continue
        name = r.derived_server or next((n for n, d in derived.items() if d.parent == r.parent and d.suite == r.suite),
                                        None) or (r.parent + RECOMMENDED if measured_on(an, r.parent + RECOMMENDED, r.suite)
                                                  else None)
        if name is None:
            r.verified = deployed_elsewhere(an, r.parent, r.suite, derived) or r.verified
            continue
        r.derived_server = name
        if name in an.servers:
            r.verified = verify_k(an, r, name)
        else:
            r.verified = Verification(name, Outcome.NOT_MEASURED, an.settings.recommend_metric, an.settings.confidence,
                                      min_effect=an.settings.min_effect, reason=f"no cell of `{name}` was measured")
    return recs


def verify_k(an: Analysis, rec, derived: str) -> Verification:
    """A k schedule's deployment `derived`, measured, against the member each band runs (krecommend.references),
    with the same test as every verification (deployment.verify_against)."""
    primary = [x for x in an.servers if x == derived or not x.endswith(RECOMMENDED)]
    refs = references(rec, sweep_members(rec.parent, an.servers), an.baseline, an.concurrencies)
    itself = all(ref.server in (None, derived) for ref in refs.values())   # keep / off: nothing to compare
    rr = None if itself else run_to_run(an.measurements, primary)
    return verify_against(an.measurements, rr, rec.suite, derived, refs, an.settings)


def verify(an: Analysis, rec: Recommendation, derived: str) -> Verification:
    """The typed verification of one recommendation by the server `derived` that deploys it
    (deployment.verification), with a run-to-run estimate that includes the deployment's own repeats
    (the recommendation's own stays the primary grid's)."""
    s = an.settings
    undecided = {v.concurrency for v in an.verdicts if (v.server, v.suite, v.metric) == (rec.server, rec.suite,
                 s.recommend_metric) and v.verdict in (Decision.INCONCLUSIVE, Decision.EQUIVALENT)}
    primary = [x for x in an.servers if x == derived or not x.endswith(RECOMMENDED)]
    rr = run_to_run(an.measurements, primary)
    return verification(an.measurements, rr, rec, an.infos.get(rec.server), an.baseline, derived,
                        an.concurrencies, s, undecided)


# -- why: every speedup split into tokens per step x step cost (specmatch.deciding.explaining.attribution) -----
def attribute(an: Analysis, reference_suite: str | None = None) -> list[Attribution]:
    """The decomposition for every speculative server (controls and recommended servers included)
    at every (suite, concurrency) it shares with the baseline."""
    m, s, rr = an.measurements, an.settings, an.run_to_run
    mixed = mixed_servers(an.infos)
    # the session-to-session spread of acceptance, from servers whose every step speculates
    acc_rr = acceptance_run_to_run(m, [x for x in m.servers() if x not in mixed])
    ref = reference_suite if reference_suite in an.suites else (an.suites[0] if an.suites else None)
    ref_tokens = median_prompt_tokens(m, an.baseline, ref) if ref else None
    out = []
    for server in an.servers:
        if server == an.baseline:
            continue
        for c in an.concurrencies:
            suites = [u for u in an.suites if m.repeats(server, u, c) and m.repeats(an.baseline, u, c)]
            lm = length_model(m, server, an.baseline, c, suites, ref_tokens) if ref_tokens else None
            for u in suites:
                d = decompose(m, rr, acc_rr, server, an.baseline, u, c, server in mixed)
                a = Attribution(server, u, c, d.tau, d.rho, d.tpot, d.explained, confidence=s.confidence,
                                repeats=d.repeats, run_to_run=d.run_to_run, acceptance_source=d.source, note=d.note)
                off = server + OFF
                if not is_control(server) and m.repeats(off, u, c):
                    v = an.verdict(off, u, c, s.recommend_metric)
                    if v is not None:
                        a.configured_off = Effect(off, an.baseline, v.metric, v.speedup, v.lo, v.hi, v.verdict)
                    dv = decide(compare(m, rr, server, off, u, c, s.recommend_metric), s)
                    a.drafting_effect = Effect(server, off, dv.metric, dv.speedup, dv.lo, dv.hi, dv.verdict)
                    d_off = decompose(m, rr, acc_rr, server, off, u, c, server in mixed)
                    a.step_cost_vs_configured_off = d_off.rho
                    a.explained_by_drafting = both(a.explained_by_drafting, d_off.explained)
                if lm is not None and u in lm.adjusted:
                    R = lm.repeats[u]
                    sessions = session_variance(rr, server, an.baseline, c, R)
                    parts = VarianceSum().add(("w",), lm.var_adj[u], float("inf")).plus(sessions)
                    lo, hi = log_t_interval(lm.adjusted[u], math.sqrt(parts.total), parts.dof, s.confidence)
                    a.length_adjusted_speedup = AdjustedSpeedup(
                        math.exp(lm.adjusted[u]), lo, hi, math.exp(lm.raw[u]), ref, lm.reference_tokens, lm.slope,
                        list(lm.ranges[u]), not (lm.ranges[u][0] <= lm.reference_tokens <= lm.ranges[u][1]))
                    if ref in lm.adjusted and u != ref:
                        def contrast(est: dict, boot: dict) -> Interval:
                            diff = boot[u] - boot[ref]
                            w = float(diff.var(ddof=1)) if diff.size > 2 else 0.0
                            # two suites' cells, each with its sessions' variation
                            p2 = VarianceSum().add(("w",), w, float("inf")).plus(sessions, 2.0)
                            d = est[u] - est[ref]
                            return Interval(math.exp(d), *log_t_interval(d, math.sqrt(p2.total), p2.dof, s.confidence))

                        a.contrast = Contrast(ref, contrast(lm.raw, lm.boot_raw), contrast(lm.adjusted, lm.boot_adj))
                out.append(a)
    return out


# -- the steps' analyses ---------------------------------------------------------------------------
def primary_analysis(m: Measurements, baseline: str, settings: Settings, configs: dict, infos: dict,
                     suites: list[str], frozen: dict | None = None, stepcost: StepCosts | None = None) -> Analysis:
    """The analysis of the configured servers only: a recommendation must not depend on the
    derived servers that exist to verify it. `frozen`: the verdicts the sequential design kept
    (analysis.frozen_verdicts of the round plans); `stepcost`: the step-cost maps whose predictions
    decide the concurrencies the verdict grid lacks."""
    primary = [s for s in configs if not s.endswith(RECOMMENDED)]
    return analyse(m.only(primary), baseline, settings, infos, suites, primary, frozen, stepcost)


def map_predictions(stepcost: StepCosts | None, server: str, suite: str, metric: str
                    ) -> tuple[dict[int, Decision], str | None]:
    """The step-cost map's predicted verdicts for `server` on `suite` at the concurrencies within its fitted
    batches, and what the map says of itself; nothing where there is no map, where no concurrency was
    measured only to check it, or where the check disagrees (StepCostMap.holds not True: the
    recommendation then follows the measured cells). Beyond the fitted batches a prediction is an
    extrapolation the map cannot check, so it decides nothing there."""
    mp = next((x for x in (stepcost.maps if stepcost else []) if x.server == server), None)
    if mp is None or mp.holds is not True:
        return {}, None
    rows = [p for p in mp.predictions if p.suite == suite and p.metric == metric and not p.extrapolated]
    checks = sorted({p.concurrency for p in mp.predictions if p.role == "check"})
    return ({p.concurrency: p.decision for p in rows},
            f"the map agrees with the cells at c={','.join(map(str, checks))}, measured only to check it")


def map_beyond(stepcost: StepCosts | None, server: str, suite: str, metric: str) -> MapBeyond | None:
    """The step-cost map's predictions above its fitted batches for `server` on `suite`: an extrapolation
    of the map's form, with an interval wider than inside the fit (it decides up to records.REACH
    times the largest fitted batch), used where the map holds at its checks, as map_predictions is; a
    concurrency measured only to check the map is not a prediction. None where the map does not hold."""
    mp = next((x for x in (stepcost.maps if stepcost else []) if x.server == server), None)
    if mp is None or mp.holds is not True:
        return None
    rows = {p.concurrency: p for p in mp.predictions
            if p.suite == suite and p.metric == metric and p.role == "predicted" and p.concurrency > max(mp.fit)}
    return MapBeyond(rows, list(mp.fit), list(mp.checks)) if rows else None


def verified_analysis(cells: "Measurements | list", baseline: str, settings: Settings, configs: dict, infos: dict,
                      suites: list[str],
                      derived: dict[str, DerivedServer], recs: list[Recommendation] | None = None,
                      frozen: dict | None = None) -> Analysis:
    """Everything the summary renders, decided here: the primary grid's analysis, the recommended
    servers' cells joined (their verdicts; no decision of the primary grid changes), and each
    recommendation (the recommend step's, which name the servers that deploy them; else the
    analysis's own) with its measured verification against the reference its schedule fixes."""
    m = Measurements.read(cells, settings)
    an = primary_analysis(m, baseline, settings, configs, infos, suites, frozen)
    an = join_derived(an, m, list(derived))
    an.recommendations = verify_recommendations(an, recs or an.recommendations, derived)
    an.k_recommendations = verify_k_recommendations(an, an.k_recommendations, derived)
    return an
