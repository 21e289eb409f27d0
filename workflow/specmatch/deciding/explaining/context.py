"""The context-length axis: acceptance (tau), step cost (rho) and the TPOT speedup by context length.

Acceptance falls as the context grows (an EAGLE-3 head trained on short sequences sees features it
never learnt), and a plain decode step costs more over a longer context, so a speedup measured on
short prompts answers for traffic a team may not have. Per (server, suite, concurrency), the requests
are binned by their context length (the baseline's prompt tokens from usage, so both servers' requests
of one prompt or turn fall in the same bin) and each bin gets what attribution gives a cell
(specmatch.deciding.explaining.attribution: tau from the per-request spec-decode metrics, the TPOT speedup paired
by prompt, rho = tau / speedup) with its interval and its verdict in the usual wording (pays / loses /
equivalent / inconclusive on the TPOT speedup). Then, per (server, suite, concurrency):

- **where acceptance falls**: the slope of log tau on log context over the prompts (weighted by their
  speculative steps), as tau's ratio per doubling of the context, with a bootstrap interval; "falls"
  where the whole interval lies below 1;
- **where speculation stops paying**: comparison.crossovers on the bins (context in place of
  concurrency): only between a bin that pays and a later one that loses, its interval from joint
  draws (the server sessions shared by every bin move them together).

Intervals follow the verdicts' design with one difference. A paired bootstrap by resampling unit (a
prompt; a session for a session suite, whose turns go together), the same draw in every repeat, gives
the bin's prompt-sample and request-noise variance (a bin holds a fraction of the cell's requests, so
its own request noise is counted here, not only in the cell-level run-to-run variance); the measured
run-to-run variance of the servers' TPOT at this concurrency (noise.RunToRun) and of acceptance
(attribution.acceptance_run_to_run), each over R repeats, are added, as compare() adds them. The cell
part of that run-to-run variance already holds some request noise, so a bin's interval is slightly
conservative. Each bin's verdict is taken at the configured confidence, not adjusted for the number of
bins (a secondary analysis: the suite-level verdicts are the decisions); the trend states how many bins
were called and at most how often chance alone calls some bin (family_chance).

A session suite's bins compare the servers' TPOT at c = 1 only. At c > 1 turn t of every session runs at
the same stage of the waves of sessions, and each server's batch around a turn (how many sessions, at
which turns, what they prefill) follows its own sessions' pace: with flat acceptance and servers equal on
average (the discrete-event server, tests/test_context.py), 33% of such bins were called pays or loses at
c = 16 with 16 sessions and 27% with 32 (nominal 10%), and as many (34%, 23%) when only the turns decoded
at the full batch were compared. Acceptance by context (tau, its trend) does not depend on the batch and is kept (WAVES).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .attribution import (PerPrompt, acceptance_length, acceptance_run_to_run, common_prompts, mixed_servers,
                          tokens_per_decode_step)
from ..verdicts.comparison import Comparison, crossovers, decision
from ..reading.measurements import Measurements, Settings
from ..verdicts.noise import RunToRun, VarianceSum, repeat_mean_variance
from ...records import Crossover, Decision, Interval, Record, Verdict
from ...resample import Clusters, draws
from ...stats import log_t_interval, t_interval

WAVES = ("a session suite at c > 1: its bins' TPOT and step cost are not compared (each server's batch around "
         "a turn follows its own sessions' pace, not the context); acceptance by context is kept, the TPOT "
         "speedup by context is read at c = 1")
MIN_BIN = 8          # paired prompts (turns) a bin needs: sparser bins are merged with their neighbour
FIRST_EDGE = 64      # bins are powers of two from here (tokens), merged until each has MIN_BIN prompts


@dataclass
class ContextBin(Record):
    """Context lengths [lo, hi) in prompt tokens (the server's usage)."""
    lo: int
    hi: int


@dataclass
class ContextRow(Record):
    """One context-length bin of one (server, suite, concurrency): `results/summary/context.json`.

    `requests`: the prompts (a session suite: turns) both servers answered in every repeat whose
    context falls in the bin; `units`: the resampling units among them (prompts, or sessions);
    `tokens_per_step` tau, `step_cost_ratio` rho (in plain decode steps of the baseline) and
    `tpot_speedup` tau / rho, each {value, lo, hi}; `verdict` on the TPOT speedup."""
    server: str
    suite: str
    concurrency: int
    bin: ContextBin
    requests: int
    tokens_per_step: Optional[Interval]
    step_cost_ratio: Optional[Interval]
    tpot_speedup: Optional[Interval]
    verdict: Decision
    units: int = 0
    median_context: Optional[float] = None
    confidence: float = 0.9
    repeats: int = 0
    run_to_run: bool = False
    acceptance_source: Optional[str] = None
    note: Optional[str] = None


@dataclass
class ContextTrend(Record):
    """Per (server, suite, concurrency): how acceptance moves with context (tau's ratio per doubling of
    the context, `acceptance`: falls / rises / no detectable trend) and where the TPOT speedup crosses 1
    between two decided bins (`crossover`, a records.Crossover whose point is a context length)."""
    server: str
    suite: str
    concurrency: int
    contexts: list                                # [shortest, longest] context measured
    bins: int
    acceptance_per_doubling: Optional[Interval] = None
    acceptance: str = "not measured"              # falls | rises | no detectable trend | not measured
    crossover: Optional[Crossover] = None
    crossovers: list[Crossover] = field(default_factory=list)
    confidence: float = 0.9
    note: Optional[str] = None
    called: int = 0                               # bins called pays or loses
    chance_any: Optional[float] = None            # at most the chance some bin is called where nothing moves


@dataclass
class ContextAxis:
    rows: list[ContextRow]
    trends: list[ContextTrend]


# -- bins --------------------------------------------------------------------------------------------
def bin_edges(contexts: np.ndarray, min_bin: int = MIN_BIN) -> list[int]:
    """Edges of context bins: powers of two from FIRST_EDGE, merged left to right until each bin holds
    `min_bin` contexts (a short last bin joins the one before). [lo, hi) each; at least one bin."""
    x = np.sort(np.asarray(contexts, float)[np.isfinite(contexts)])
    if x.size == 0:
        return []
    top = int(2 ** math.ceil(math.log2(max(x[-1] + 1, FIRST_EDGE * 2))))
    raw = [0] + [FIRST_EDGE * 2 ** k for k in range(64) if FIRST_EDGE * 2 ** k < top] + [top]
    edges, count = [0], 0
    for lo, hi in zip(raw, raw[1:]):
        count += int(((x >= lo) & (x < hi)).sum())
        if count >= min_bin:
            edges.append(hi)
            count = 0
    if count or len(edges) == 1:
        if len(edges) > 1:
            edges[-1] = top       # too few left for a bin of their own: the last bin takes them
        else:
            edges.append(top)
    return edges


# -- one bin -----------------------------------------------------------------------------------------
@dataclass
class BinFigures:
    tau: Interval | None
    rho: Interval | None
    tpot: Interval | None
    verdict: Decision
    estimate: float | None        # log TPOT speedup (for the crossover)
    se: float | None
    dof: float
    session: dict                 # the variance each server's sessions add (shared by every bin)
    run_to_run: bool
    source: str | None
    units: int


def group_sums(values: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(group, np.asarray(values, float), minlength=n)


def bin_figures(m: Measurements, rr: RunToRun, acc_rr: tuple, server: str, baseline: str, suite: str, c: int,
                reps: list[int], prompts: list[str], unit_of: dict, mixed: bool) -> BinFigures:
    """tau, rho and the TPOT speedup of `server` against `baseline` over the requests of `prompts` (one
    bin), resampling units (`unit_of`: prompt -> its unit) with one draw for every repeat."""
    s: Settings = m.settings
    clusters = Clusters.of([unit_of[p] for p in prompts])
    g, G = clusters.index, len(clusters)
    draw = draws(s.rng("context", server, baseline, suite, c, tuple(prompts[:3]), len(prompts)), G, s.bootstrap)
    flavor = m.arrays[(server, suite, c, reps[0])].flavor
    log_tpot, boot_tpot, log_tau, boot_tau, per_request = [], [], [], [], True
    for r in reps:
        ps = PerPrompt.of(m.arrays[(server, suite, c, r)], prompts)
        pb = PerPrompt.of(m.arrays[(baseline, suite, c, r)], prompts)
        sums = {k: group_sums(v, g, G) for k, v in (("ts", ps.tpot_sum), ("tn", ps.tpot_n), ("bs", pb.tpot_sum),
                                                      ("bn", pb.tpot_n), ("st", ps.steps), ("dr", ps.drafted),
                                                      ("ac", ps.accepted), ("out", ps.out), ("dec", ps.decoded),
                                                      ("ds", ps.decode_steps))}
        with np.errstate(invalid="ignore", divide="ignore"):
            log_tpot.append(math.log(sums["bs"].sum() / sums["bn"].sum()) - math.log(sums["ts"].sum() / sums["tn"].sum())
                            if sums["bn"].sum() > 0 and sums["tn"].sum() > 0 and sums["ts"].sum() > 0 else float("nan"))
            boot_tpot.append(np.log(sums["bs"][draw].sum(1) / sums["bn"][draw].sum(1))
                             - np.log(sums["ts"][draw].sum(1) / sums["tn"][draw].sum(1)))
        per_request &= ps.per_request
        if mixed:
            t = tokens_per_decode_step(sums["dec"].sum(), sums["ds"].sum())[0]
            bt = tokens_per_decode_step(sums["dec"][draw].sum(1), sums["ds"][draw].sum(1))
        else:
            t = acceptance_length(flavor, sums["st"].sum(), sums["dr"].sum(), sums["ac"].sum(), sums["out"].sum())[0]
            bt = acceptance_length(flavor, sums["st"][draw].sum(1), sums["dr"][draw].sum(1), sums["ac"][draw].sum(1),
                      sums["out"][draw].sum(1))
        log_tau.append(math.log(t) if t and math.isfinite(t) and t > 0 else float("nan"))
        with np.errstate(invalid="ignore", divide="ignore"):
            boot_tau.append(np.log(bt))
    R = len(reps)
    boot_tpot = np.array(boot_tpot)
    if not all(math.isfinite(x) for x in log_tpot):
        return BinFigures(None, None, None, Decision.INCONCLUSIVE, None, None, float("inf"), {}, False, None, G)
    ok = np.isfinite(boot_tpot).all(0)
    est = float(np.mean(log_tpot))
    tpot_parts = VarianceSum().add(("w", "tpot"), repeat_mean_variance(boot_tpot[:, ok]), max(G - 1, 1))
    ts, tb = rr.at("tpot", server, c), rr.at("tpot", baseline, c)
    run = R >= 2 and ts is not None and tb is not None
    session = {}
    if run:
        tpot_parts.plus(ts, 1 / R).plus(tb, 1 / R)
        share = rr.session_share.get("tpot", 0.0)
        session = {server: share * ts.total / R, baseline: share * tb.total / R}
    tpot_iv = Interval(math.exp(est), *log_t_interval(est, math.sqrt(tpot_parts.total), tpot_parts.dof, s.confidence))
    verdict = decision(math.log(tpot_iv.lo), math.log(tpot_iv.hi), math.log(1 + s.min_effect), run)
    tau = rho = None
    source = None
    if per_request and all(math.isfinite(x) for x in log_tau):
        source = "per-request metrics" + (", tokens per decode step" if mixed else "")
        boot_tau = np.array(boot_tau)
        ok2 = ok & np.isfinite(boot_tau).all(0)
        tau_parts = VarianceSum().add(("w", "tau"), repeat_mean_variance(boot_tau[:, ok2]), max(G - 1, 1))
        rho_parts = VarianceSum().add(("w", "rho"), repeat_mean_variance((boot_tau - boot_tpot)[:, ok2]), max(G - 1, 1))
        if run:
            rho_parts.plus(ts, 1 / R).plus(tb, 1 / R)
            t2_acc, dof_acc = acc_rr
            if t2_acc is not None:
                tau_parts.add(("acceptance",), t2_acc / R, dof_acc)
                rho_parts.add(("acceptance",), t2_acc / R, dof_acc)
        est_tau = float(np.mean(log_tau))
        tau = Interval(math.exp(est_tau), *log_t_interval(est_tau, math.sqrt(tau_parts.total), tau_parts.dof,
                                                          s.confidence))
        est_rho = est_tau - est
        rho = Interval(math.exp(est_rho), *log_t_interval(est_rho, math.sqrt(rho_parts.total), rho_parts.dof,
                                                          s.confidence))
    return BinFigures(tau, rho, tpot_iv, verdict, est, math.sqrt(tpot_parts.total), tpot_parts.dof, session, run,
                      source, G)


# -- acceptance against context ------------------------------------------------------------------------
def acceptance_slope(m: Measurements, server: str, suite: str, c: int, reps: list[int], prompts: list[str],
                     unit_of: dict, context: np.ndarray, mixed: bool) -> Interval | None:
    """tau's ratio per doubling of the context: exp(b log 2), b the slope of a prompt's log tau (its counts
    summed over the repeats) on its log context, weighted by its speculative steps; the interval a Student
    t one with a bootstrap-by-unit standard error. None without per-request metrics or without a spread
    of context."""
    s = m.settings
    flavor = m.arrays[(server, suite, c, reps[0])].flavor
    tot = None
    for r in reps:
        ps = PerPrompt.of(m.arrays[(server, suite, c, r)], prompts)
        if not ps.per_request:
            return None
        part = np.stack([ps.steps, ps.drafted, ps.accepted, ps.out, ps.decoded, ps.decode_steps])
        tot = part if tot is None else tot + part
    steps, drafted, accepted, out, decoded, dsteps = tot
    tau = tokens_per_decode_step(decoded, dsteps) if mixed else acceptance_length(flavor, steps, drafted, accepted, out)
    weight = dsteps if mixed else steps
    keep = np.isfinite(tau) & (tau > 0) & (weight > 0) & np.isfinite(context) & (context > 0)
    if keep.sum() < 3:
        return None
    y, x, w = np.log(tau[keep]), np.log2(context[keep]), weight[keep]
    if np.ptp(x) < 0.5:      # less than a factor 1.4 of context: no slope to speak of
        return None
    kept = [p for p, k in zip(prompts, keep) if k]
    clusters = Clusters.of([unit_of[p] for p in kept])

    def fit(idx_rows: np.ndarray) -> float:
        ww = w[idx_rows]
        xm = np.average(x[idx_rows], weights=ww)
        ym = np.average(y[idx_rows], weights=ww)
        sxx = float((ww * (x[idx_rows] - xm) ** 2).sum())
        return float((ww * (x[idx_rows] - xm) * (y[idx_rows] - ym)).sum() / sxx) if sxx > 0 else float("nan")

    b = fit(np.arange(len(y)))
    rng = s.rng("context-slope", server, suite, c)
    boots = []
    for _ in range(s.bootstrap):   # one resample at a time: each is fitted before the next is drawn
        boots.append(fit(clusters.items(draws(rng, len(clusters)))))
    boots = np.array(boots)
    boots = boots[np.isfinite(boots)]
    if boots.size < 10 or not math.isfinite(b):
        return None
    # Student t with the bootstrap's standard error and units - 2 dof: the percentile interval of a
    # slope over a few dozen prompts called a flat truth falling or rising in 12.5% +- 2.3% at 90%
    lo, hi = t_interval(b, float(boots.std(ddof=1)), max(len(clusters) - 2, 1), s.confidence)
    ln2 = math.log(2)
    return Interval(math.exp(b * ln2), math.exp(lo * ln2), math.exp(hi * ln2))


def trend_word(iv: Interval | None) -> str:
    if iv is None:
        return "not measured"
    if iv.hi < 1:
        return "falls"
    if iv.lo > 1:
        return "rises"
    return "no detectable trend"


def prompt_contexts(m: Measurements, baseline: str, suite: str) -> np.ndarray:
    """Each prompt's (turn's) context on the baseline, its mean over every cell that sent it: what the
    bins are cut from (one count per prompt, whatever the repeats and concurrencies)."""
    tot: dict = {}
    for k, a in m.arrays.items():
        if k[0] != baseline or k[1] != suite or a.prompt_tokens is None:
            continue
        for p, x in zip(a.prompts, a.prompt_tokens):
            if math.isfinite(x):
                t = tot.setdefault(p, [0.0, 0])
                t[0] += x
                t[1] += 1
    return np.array([v / n for v, n in tot.values()])


# -- multiplicity ------------------------------------------------------------------------------------
def family_chance(confidence: float, bins: int) -> float:
    """The chance that some bin of `bins` is called pays or loses where the speedup does not move with
    context, at most 1 - confidence^bins where each bin holds its level (Sidak's inequality: two-sided
    tests of jointly normal statistics, whatever their correlation, accept together at least as often as
    independent ones would; an audit found it holding for t statistics with shared or separate
    denominators too). A bin a little above its level moves it: at 12.4% per bin, 41% for 4 bins."""
    return 1 - confidence ** max(bins, 1)


# -- everything --------------------------------------------------------------------------------------
def units_of(prompt_ids: list[str], sessions: dict[str, str]) -> dict:
    """The resampling unit of each prompt id: its session (a session suite's turns go together), else itself."""
    return {p: sessions.get(p, p) for p in prompt_ids}


def context_axis(m: Measurements, rr: RunToRun, baseline: str, servers: list[str], suites: list[str],
                 concurrencies: list[int], sessions: dict[str, str] | None = None, mixed: set | None = None,
                 min_bin: int = MIN_BIN) -> ContextAxis:
    """Every (server, suite, concurrency)'s bins and trend. `sessions`: prompt id -> session id for the
    turns of session suites; `mixed`: servers whose schedule runs plain steps at some batch sizes (tau
    is then tokens per decode step, as attribution reads it)."""
    s = m.settings
    sessions, mixed = sessions or {}, mixed or set()
    acc_rr = acceptance_run_to_run(m, [x for x in m.servers() if x not in mixed])
    rows, trends = [], []
    for suite in suites:
        edges = bin_edges(prompt_contexts(m, baseline, suite), min_bin)
        if len(edges) < 2:
            continue
        for server in servers:
            if server == baseline:
                continue
            for c in concurrencies:
                reps = sorted(set(m.repeats(server, suite, c)) & set(m.repeats(baseline, suite, c)))
                if not reps:
                    continue
                prompts = common_prompts(m, server, baseline, suite, c, reps)
                if len(prompts) < 2:
                    continue
                waves = c > 1 and any(p in sessions for p in prompts)
                ctx = np.nanmean(np.stack([PerPrompt.of(m.arrays[(baseline, suite, c, r)], prompts).prompt_tokens
                                           for r in reps]), axis=0)
                unit_of = units_of(prompts, sessions)
                bins, cmps, verdicts = [], [], []
                for lo, hi in zip(edges, edges[1:]):
                    inside = [p for p, x in zip(prompts, ctx) if lo <= x < hi]
                    if len(inside) < 2 or len({unit_of[p] for p in inside}) < 2:
                        continue
                    f = bin_figures(m, rr, acc_rr, server, baseline, suite, c, reps, inside, unit_of,
                                    server in mixed)
                    here = ctx[[i for i, p in enumerate(prompts) if lo <= ctx[i] < hi]]
                    note = None if f.tpot is not None else "no TPOT in this bin (one-token outputs)"
                    if waves:
                        f.rho = f.tpot = f.estimate = None
                        f.verdict, note = Decision.INCONCLUSIVE, WAVES
                    row = ContextRow(server, suite, c, ContextBin(int(lo), int(hi)), len(inside), f.tau, f.rho, f.tpot,
                                     f.verdict, units=f.units, median_context=float(np.median(here)),
                                     confidence=s.confidence, repeats=len(reps), run_to_run=f.run_to_run,
                                     acceptance_source=f.source, note=note)
                    rows.append(row)
                    bins.append(row)
                    if f.estimate is not None:
                        x = int(round(math.exp(np.mean(np.log(np.maximum(here, 1))))))
                        x = max(x, (cmps[-1].concurrency + 1) if cmps else 1)   # strictly increasing
                        cmp = Comparison(server, baseline, suite, x, "tpot", [f.estimate], [], f.estimate, f.se,
                                         f.dof, f.run_to_run, session=f.session)
                        cmps.append(cmp)
                        verdicts.append(Verdict(server, suite, x, "tpot", f.verdict, f.tpot.value, f.tpot.lo,
                                                f.tpot.hi, s.confidence, len(reps), against=baseline))
                slope = acceptance_slope(m, server, suite, c, reps, prompts, unit_of, ctx, server in mixed)
                cross = crossovers(verdicts, cmps, s) if len(cmps) >= 2 else []
                finite = ctx[np.isfinite(ctx)]
                notes = [] if len(bins) > 1 else [f"one bin: the suite's contexts do not spread over {min_bin}+ "
                                                  "prompts per bin"]
                if waves:
                    notes.append(WAVES)
                called = sum(b.verdict in (Decision.PAYS, Decision.LOSES) for b in bins)
                trends.append(ContextTrend(server, suite, c, [float(finite.min()), float(finite.max())]
                                           if finite.size else [], len(bins), slope, trend_word(slope),
                                           cross[0] if cross else None, cross, s.confidence,
                                           "; ".join(notes) or None, called=called,
                                           chance_any=None if waves else family_chance(s.confidence, len(bins))))
    return ContextAxis(rows, trends)


def context_report(an, sessions: dict[str, str] | None = None, suites: list[str] | None = None) -> ContextAxis:
    """The context-length axis of an analysis (deciding.analysis.Analysis): every speculative server,
    the given suites (default all), every concurrency."""
    return context_axis(an.measurements, an.run_to_run, an.baseline, an.servers, suites or an.suites,
                        an.concurrencies, sessions, mixed_servers(an.infos))


__all__ = ["ContextAxis", "ContextBin", "ContextRow", "ContextTrend", "bin_edges", "context_axis", "context_report"]
