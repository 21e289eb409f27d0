"""The traffic report: every profile's predicted speedup for every speculative server and concurrency,
its interval (prompt sample, run to run, the model's error), the break-even lines and the check against
a verifying suite. The method: specmatch.deciding.predicting.traffic."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from ...verdicts.comparison import decision
from ...verdicts.noise import VarianceSum
from ....config import TRAFFIC_PREFIX, TRAINING_MIX
from ....controls import is_control
from ....records import (BreakEven, Decision, Direction, Interval, SuiteMatch, TrafficCheck, TrafficProfile,
                        TrafficProfiles, TrafficRow)
from ....stats import log_t_interval, t_critical, t_interval, t_ppf

from .predictor import Estimate, Pair, Predictor, Stratum, per_prompt
from .step_model import (calibrate, cell_requests, fit_step_model, model_error, model_residuals, stratum_function,
                         timed, timeline)

GRID = 11                 # points along a break-even line
MODEL_PARTS = ("model", "model-reach", "model-form")   # the interval's parts that are the step model's error
FORM_DOF = 30.0           # the model form's part: a shift between two fits of the same data (its dof is left out: _dof)
ON_LINE = 0.1             # a measured suite whose composition lies within this TVD of a line is drawn on it


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


def _dof(parts: VarianceSum) -> float:
    """Satterthwaite's dof of the parts but the model's form: that part is a shift between two fits of the
    same data, not an estimate with dof of its own, and counted as one (FORM_DOF) it raised the dof of a sum
    it joined by more than it added to the variance, which narrowed the interval (audit of 6 Dec)."""
    return VarianceSum({k: list(v) for k, v in parts.parts.items() if k[0] != "model-form"}).dof


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

    def __init__(self, an, profiles: TrafficProfiles, matches: list[SuiteMatch], quadratic: bool = False):
        self.an, self.s, self.m = an, an.settings, an.measurements
        self.profiles = profiles
        self.matches = {m.suite: m for m in matches}
        stratum = stratum_function(profiles.files)
        self.reqs = {k: cell_requests(k, a, stratum) for k, a in self.m.arrays.items()}
        self.measuring = [u for u in ([profiles.basis] if profiles.basis else []) + list(profiles.files)
                          if any(k[1] == u for k in self.reqs)]
        self.model_suites = [u for u in dict.fromkeys(k[1] for k in self.reqs) if not u.startswith(TRAFFIC_PREFIX)]
        self.sensitivities: dict = {}   # (server, c, suite) -> same_prompt_sensitivities
        self.theta = {}
        for x in dict.fromkeys(k[0] for k in self.reqs):
            mine = [cr for k, cr in self.reqs.items() if k[0] == x and k[1] in self.model_suites]
            self.theta[x] = (fit_step_model(mine, quadratic=quadratic) if any(k[2] > 1 for k in self.reqs if k[0] == x)
                             else None)
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
            by = common_strata(crs)
            if u == self.profiles.basis or not size:
                size = len(crs[0].prompts)
            for st, ps in by.items():
                if u != self.profiles.basis and st != u:
                    continue
                prompts = sorted(ps)
                data = {(x, r): per_prompt(self.reqs[(x, u, c, r)], prompts) for r in reps for x in (server, b)}
                strata[st] = Stratum(st, u, prompts, data)
        closed = all(self.reqs[k].closed for k in self.reqs if k[0] in (server, b) and k[2] == c)
        pair = Pair(server, b, c, reps, strata, size)
        if c > 1 and closed:
            pair.theta = {server: self.theta.get(server), b: self.theta.get(b)}
        if not closed:
            pair.note = "open loop: not predicted"
        return pair


def common_strata(crs: list) -> dict:
    """The prompts every one of these cells answered, by stratum."""
    common = set.intersection(*(set(cr.prompts) for cr in crs))
    by: dict = {}
    for p, st in zip(crs[0].prompts, crs[0].strata):
        if p in common:
            by.setdefault(st, set()).add(p)
    return by


def suite_pair(rep: Report, server: str, suite: str, c: int) -> Pair | None:
    """One measured suite's own prompts as strata (each request's stratum), in the repeats both servers
    measured it: what its measured speedup's prompt sample is, for a suite drawn stratified (a verifying
    suite's allocation is fixed, so only the prompts within each stratum vary)."""
    b = rep.an.baseline
    reps = sorted({k[3] for k in rep.reqs if k[:3] == (server, suite, c)} & {k[3] for k in rep.reqs
                                                                             if k[:3] == (b, suite, c)})
    if not reps:
        return None
    crs = [rep.reqs[(x, suite, c, r)] for r in reps for x in (server, b)]
    by = common_strata(crs)
    strata = {st: Stratum(st, suite, sorted(ps), {(x, r): per_prompt(rep.reqs[(x, suite, c, r)], sorted(ps))
                                                 for r in reps for x in (server, b)}) for st, ps in by.items()}
    return Pair(server, b, c, reps, strata, len(crs[0].prompts))


def traffic_report(an, profiles: TrafficProfiles | None, matches: list[SuiteMatch], lines: bool = True
                   ) -> list[TrafficRow]:
    """Every profile's predicted speedup (module docstring) for every speculative server and concurrency,
    on summary.recommend_metric and TPOT, with the measured speedup of its verifying suite and the
    break-even shares (`lines`: False skips them), from the analysis's measurements."""
    profiles = profiles if profiles is not None and profiles.profiles else profiles_from_matches(matches)
    if not profiles.profiles:
        return []
    rep = Report(an, profiles, matches)
    # the same fit with a context cost that may grow faster than the context: how far the prediction
    # moves with it is the model form's own uncertainty (MetricRows), which two context levels cannot settle
    curved = Report(an, profiles, matches, quadratic=True) if any(c > 1 for c in an.concurrencies) else None
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
            pred = Predictor(pair, s.slo, s.rng)
            # where the step model was measured in context, and its misfit's slope there: the same for
            # every metric (c > 1 only; at c = 1 there is no model)
            span = _span(rep, x, c) if c > 1 else {}
            misfit = _misfit(rep, pair, span) if c > 1 else None
            form = None
            if c > 1 and curved is not None:
                alt = curved.pair(x, c)
                form = Predictor(alt, s.slo, s.rng) if alt.theta and all(
                    t is not None for t in alt.theta.values()) else None
            for metric in metrics:
                rows += MetricRows.of(rep, pair, pred, metric, span, misfit, form).rows(lines)
    pooled_checks(rows, s.confidence)
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


@dataclass
class MetricRows:
    """The rows of one (server, concurrency, metric) and what they share: the prediction, both servers'
    run to run at c, the step model's error there, and how a mix is read (its variance parts, its
    interval, a break-even line). `form`: the same prediction under a step model whose context cost may
    grow faster than the context (Report's `quadratic`): where the data give that curvature, the two
    predictions differ, and the squared difference joins the model's part (the mix's batches move along
    a curve the linear model reads as straight between the measured suites); where they do not (a
    straight context cost), it is about 0."""
    rep: Report
    pair: Pair
    pred: Predictor
    metric: str
    span: dict
    misfit: Misfit | None
    form: Predictor | None
    ts: VarianceSum | None          # the server's run to run at c (None: not measured)
    tb: VarianceSum | None          # the baseline's
    merr: tuple | None              # the step model's error at c > 1: (variance, dof)
    note_model: str | None          # what every row of this concurrency says of the step model

    @classmethod
    def of(cls, rep: Report, pair: Pair, pred: Predictor, metric: str, span: dict | None = None,
           misfit: Misfit | None = None, form: Predictor | None = None) -> MetricRows:
        an = rep.an
        rr = an.run_to_run
        ts, tb = rr.at(metric, pair.server, pair.concurrency), rr.at(metric, an.baseline, pair.concurrency)
        merr, note_model = _step_model_error(rep, pair, metric, ts, tb)
        return cls(rep, pair, pred, metric, span or {}, misfit, form, ts, tb, merr, note_model)

    @property
    def run(self) -> bool:
        """Whether both servers' run to run at c was measured."""
        return self.ts is not None and self.tb is not None

    def rows(self, lines: bool = True) -> list[TrafficRow]:
        """Every declared mix's row (`lines`: False skips the break-even lines)."""
        toward_file = next((f for f in self.rep.profiles.files if f in self.pair.strata), None)
        lines_tm, strata_iv = self.training_mix_lines(lines)
        return [self.mix_row(prof, lines, lines_tm, strata_iv, toward_file) for prof in self.rep.profiles.profiles]

    # -- how a mix is read ------------------------------------------------------------------------------
    def parts(self, est: Estimate, key, mix: dict, form_part: bool = True) -> VarianceSum:
        """A mix's variance parts: its prompt sample, both servers' run to run, and the step model's
        error (its misfit across suites, its reach in context, its form: `form_part`)."""
        x, c, metric, R = self.pair.server, self.pair.concurrency, self.metric, len(self.pair.repeats)
        out = VarianceSum().add(("traffic-w", x, c, metric) + key, est.var_w, est.dof_w)
        if self.run:
            out.plus(self.ts, 1 / R).plus(self.tb, 1 / R)
        if self.merr is not None:
            out.add(("model", x, c, metric), self.merr[0], self.merr[1])
        if self.misfit is not None:
            v = self.misfit.variance(self.pair, mix)
            if v > 0:
                out.add(("model-reach", x, c, metric) + key, v, self.misfit.dof)
        if form_part and self.form is not None and self.pair.usable(mix) is None:
            d = self.form.estimate(mix, metric).value - self.pred.estimate(mix, metric).value
            if d:
                out.add(("model-form", x, c, metric) + key, d * d, FORM_DOF)
        return out

    def interval(self, mix: dict, key) -> tuple[Interval, VarianceSum, Estimate] | None:
        """A mix's predicted speedup with its interval and parts; None where it cannot be predicted."""
        if self.pair.usable(mix) is not None:
            return None
        est = self.pred.estimate(mix, self.metric)
        parts = self.parts(est, key, mix)
        iv = log_t_interval(est.value, math.sqrt(parts.total), _dof(parts), self.rep.an.settings.confidence)
        return Interval(math.exp(est.value), *iv), parts, est

    # -- break-even lines -------------------------------------------------------------------------------
    def line(self, start: dict, toward: str) -> BreakEven | None:
        """The break-even line from the mix `start` toward the stratum `toward` alone: the predicted
        speedup and its interval along it, where they cross 1, and whether a crossing is established."""
        pair = self.pair
        if pair.usable({toward: 1.0}) is not None or pair.usable(start) is not None:
            return None
        s0 = start.get(toward, 0.0)
        if s0 >= 1 - 1e-9:
            return None
        curve, lam = [], np.linspace(0, 1, GRID)
        for l in lam:
            mix = {k: (1 - l) * v for k, v in start.items()}
            mix[toward] = mix.get(toward, 0.0) + l
            got = self.interval(mix, ("line", toward, round(float(l), 6)))
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
        # a crossing is established only where the intervals at both ends lie on opposite sides of 1;
        # otherwise the true line may never cross, and a point share would be read as if it did
        side = [1 if logs[i, 1] > 0 else -1 if logs[i, 2] < 0 else 0 for i in (0, -1)]
        established = False
        if point is None:
            note = (f"{'pays' if logs[0, 0] > 0 else 'loses'} (point estimate) all the way to {toward} alone")
        elif side[0] == 0:   # the mix itself is undecided: there is no side to cross from
            note = (f"the point estimate crosses 1 at {point:.0%}, but the interval contains 1 at the mix "
                    "itself: it is not known to pay or lose there")
            point = direction = None
        elif side[1] != -side[0]:   # the other end undecided: the line may never cross (the point is kept,
            # unselected, with that said: suppressing it would leave only the points of lines that crossed early)
            note = f"the interval contains 1 at {toward} alone: the line may not cross at all"
        else:
            established = True
        be = BreakEven(toward, point, lo, hi, direction, s0, curve, [], note, established)
        be.measured += self.measured_on_line(start, toward, s0)
        return be

    def measured_on_line(self, start: dict, toward: str, s0: float) -> list[list]:
        """The measured suites whose composition lies on the line from `start` toward `toward` (within
        ON_LINE of it in total variation), each as [its share of `toward`, speedup, lo, hi, suite]."""
        rep, an, x, c = self.rep, self.rep.an, self.pair.server, self.pair.concurrency
        out = []
        for u in rep.measuring + [p.suite for p in rep.profiles.profiles if p.suite]:
            comp = _composition(rep, x, u, c)
            v = an.verdict(x, u, c, self.metric)
            if comp is None or v is None or v.speedup is None:
                continue
            l = (comp.get(toward, 0.0) - s0) / (1 - s0)
            if not -0.05 <= l <= 1.05:
                continue
            on = {k: (1 - l) * w for k, w in start.items()}
            on[toward] = on.get(toward, 0.0) + l
            tvd = 0.5 * sum(abs(comp.get(k, 0.0) - on.get(k, 0.0)) for k in set(comp) | set(on))
            if tvd <= ON_LINE:
                out.append([comp.get(toward, 0.0), v.speedup, v.lo, v.hi, u])
        return out

    def training_mix_lines(self, lines: bool) -> tuple[list[BreakEven], dict]:
        """The training mix's break-even lines, one toward each stratum, and each stratum alone's
        interval (the end of its line), which every row carries; none without `lines`."""
        strata_iv: dict = {}
        training = self.rep.profiles.profile(TRAINING_MIX)
        lines_tm: list = []
        if lines and training is not None and self.pair.usable(training.mix) is None:
            for st in sorted(self.pair.strata):
                be = self.line(training.mix, st)
                if be is not None:
                    lines_tm.append(be)
                    end = be.curve[-1]
                    strata_iv[st] = Interval(end[1], end[2], end[3])
        return lines_tm, strata_iv

    # -- a declared mix's row ---------------------------------------------------------------------------
    def mix_row(self, prof: TrafficProfile, lines: bool, lines_tm: list[BreakEven], strata_iv: dict,
                toward_file: str | None) -> TrafficRow:
        """One declared mix's row: its measured suite's speedup beside the prediction, the interval's
        parts, the break-even line (toward the first file suite; the training mix carries every line of
        its own), what it says of the model's reach, and the check against its verifying suite."""
        an, s, pair = self.rep.an, self.rep.an.settings, self.pair
        x, c, metric = pair.server, pair.concurrency, self.metric
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
            return row
        self.predict_into(row, mix)
        if prof.name == TRAINING_MIX:
            row.break_evens = lines_tm
            row.break_even = next((b for b in lines_tm if b.toward == toward_file), None)
        elif lines and toward_file is not None:
            row.break_even = self.line(mix, toward_file)
        notes = [n for n in (self.note_model,) if n]
        if row.extrapolated:
            notes.append(_extrapolation_note(row))
        notes += self.check_into(row, prof, mix)
        row.note = "; ".join(notes) or None
        return row

    def predict_into(self, row: TrafficRow, mix: dict) -> None:
        """A predictable mix's prediction on its row: the interval and its verdict, the parts (prompts,
        run to run, the model's error, dof), the mix's context against the measured suites' and how far
        the model's form moves it."""
        s, pair, c = self.rep.an.settings, self.pair, self.pair.concurrency
        iv, parts, est = self.interval(mix, ("profile", row.profile))
        row.predicted = iv
        lo_l, hi_l = math.log(iv.lo), math.log(iv.hi)
        row.verdict = decision(lo_l, hi_l, math.log(1 + s.min_effect), self.run)
        model = [v for k, (v, _) in parts.parts.items() if k[0] in MODEL_PARTS]
        row.parts = {"prompts": next(v for k, (v, _) in parts.parts.items() if k[0] == "traffic-w"),
                     "run_to_run": sum(v for k, (v, _) in parts.parts.items()
                                       if k[0] not in ("traffic-w",) + MODEL_PARTS),
                     "model": sum(model) if model else (0.0 if c == 1 else None),
                     "dof": _dof(parts), "repeats": len(pair.repeats), "run_to_run_measured": self.run}
        if self.span:
            lo, hi = min(self.span.values()), max(self.span.values())
            row.context, row.context_range = mix_context(pair, mix), [math.exp(lo), math.exp(hi)]
            x_mix = math.log(max(row.context, 1e-9))
            # flagged beyond 10% past the range (the context shift's variance grows from 0 continuously; the
            # flag says where the model's reach itself is in question, not a hair past a suite's mean)
            row.extrapolated = bool(x_mix < lo - REACH or x_mix > hi + REACH)
            if self.misfit is not None:
                row.parts["context_shift"] = self.misfit.delta(pair, mix)
        if self.form is not None:
            # how far a context cost that may grow faster than the context moves the prediction (log)
            row.parts["curvature"] = self.form.estimate(mix, self.metric).value - est.value

    # -- checks against a verifying suite ---------------------------------------------------------------
    def check_into(self, row: TrafficRow, prof: TrafficProfile, mix: dict) -> list[str]:
        """The check of a verified mix against its measured suite, on its row; returns what the row's note
        says of it. A suite of the estimation prompts is checked on exactly its requests
        (same_prompt_check), any other at its drawn composition (fresh_suite_check)."""
        notes = []
        measured = prof.suite and row.measured is not None
        seqs = same_prompt_sequences(self.rep, self.pair, prof.suite) if measured else None
        m_rec = self.rep.matches.get(prof.suite) if prof.suite else None
        if seqs is None and m_rec is not None and m_rec.same_prompts and row.measured is not None:
            notes.append("its suite holds the estimation prompts (verify: same_prompts), but not every request of "
                         "it has an estimation request of its prompt in every repeat (a failed request?): checked "
                         "as a fresh suite is, which counts the shared prompt sample on both sides and agrees too often")
        if seqs is not None:
            notes += self.same_prompt_check(row, prof, seqs)
        elif measured:
            notes += self.fresh_suite_check(row, prof, mix)
        return notes

    def same_prompt_check(self, row: TrafficRow, prof: TrafficProfile, seqs: dict) -> list[str]:
        """A verifying suite of the estimation prompts, predicted from exactly its requests (Predictor.exact):
        the prompt sample cancels, so the check (c > 1 only) tests how the step model carries these
        requests into the mix's batches. Returns the row's notes on it."""
        rep, pair, metric = self.rep, self.pair, self.metric
        x, c, s = pair.server, pair.concurrency, rep.an.settings
        slots = seqs[(x, pair.repeats[0])][0]
        comp = {st: n / len(slots) for st, n in Counter(st for st, _ in slots).items()}   # its requests'
        exact = self.pred.exact(seqs, metric) if pair.usable(comp) is None else None
        if exact is None:
            return ["its suite holds the estimation prompts (verify: same_prompts): checked at c > 1 only, "
                    "where the step model carries them into the mix's batches"]
        model = [(k, v) for k, v in self.parts(exact, ("check", prof.name), comp, form_part=False).parts.items()
                 if k[0] in MODEL_PARTS]
        if self.form is not None:
            shift = self.form.exact(seqs, metric).value - exact.value
            if shift:
                model.append((("model-form", x, c, metric, "check", prof.name), (shift * shift, FORM_DOF)))
        key = (x, c, prof.suite)
        if key not in rep.sensitivities:
            rep.sensitivities[key] = same_prompt_sensitivities(
                rep, pair, seqs, prof.suite, list(dict.fromkeys([s.recommend_metric, "tpot", metric])))
        row.check = _same_prompt_check(rep, pair, exact, rep.sensitivities[key][metric], model, metric, row.measured)
        return [f"checked on {len(slots)} requests of the estimation suites' own "
                "prompts (verify: same_prompts): the prompt sample cancels, so the check tests how the "
                "step model carries these requests into the mix's batches"]

    def fresh_suite_check(self, row: TrafficRow, prof: TrafficProfile, mix: dict) -> list[str]:
        """A verifying suite drawn apart from the estimation prompts, checked at its drawn composition:
        measured against predicted there, its own prompt sample counted on the measured side (_check).
        Returns the row's notes on it."""
        rep, an, pair, metric = self.rep, self.rep.an, self.pair, self.metric
        x, c, s = pair.server, pair.concurrency, an.settings
        comp = _composition(rep, x, prof.suite, c)
        at = self.interval(comp, ("check", prof.name)) if comp and pair.usable(comp) is None else None
        if at is None:
            return []
        vp = suite_pair(rep, x, prof.suite, c)
        own = (Predictor(vp, s.slo, s.rng).prompt_variance(comp, metric)
               if vp is not None and all(st.n >= 2 for st in vp.strata.values()) else None)
        row.check = _check(an, prof.suite, x, c, metric, at, row.measured,
                           same_sessions(rep, prof.suite, (x, an.baseline), c), own,
                           parts_run=[v for v in (self.ts, self.tb) if v is not None], repeats=len(pair.repeats))
        m = rep.matches.get(prof.suite)
        row.check.disjoint = (m.disjoint_from is not None) if m is not None else None
        if any(abs(comp.get(k, 0) - mix.get(k, 0)) > 1e-9 for k in set(comp) | set(mix)):
            return ["checked at the verifying suite's drawn composition: "
                    + ", ".join(f"{k} {v:.0%}" for k, v in sorted(comp.items()))]
        return []


def _step_model_error(rep: Report, pair: Pair, metric: str, ts: VarianceSum | None, tb: VarianceSum | None
                      ) -> tuple[tuple | None, str | None]:
    """The step model's error at c > 1 (model_error: its residuals' spread across the measured suites,
    less the cells' own noise), and what the rows say of it: unchecked with fewer than two suites,
    resting on the batched cells alone without c = 1 cells. (None, None) at c = 1: no model."""
    an, x, c = rep.an, pair.server, pair.concurrency
    if c <= 1:
        return None, None
    R = len(pair.repeats)
    rr = an.run_to_run
    run = ts is not None and tb is not None
    note_model = None
    res = model_residuals(rep.reqs, rep.m, rep.theta, x, an.baseline, c, metric, rep.model_suites)
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
    return merr, note_model


def _extrapolation_note(row: TrafficRow) -> str:
    """What a row says when its mix's context per sequence lies beyond the measured suites'."""
    lo_c, hi_c = row.context_range
    where = (f"the one measured suite's ({lo_c:.0f})" if round(lo_c) == round(hi_c)
             else f"the measured suites' ({lo_c:.0f}-{hi_c:.0f})")
    return (f"the mix's context per sequence ({row.context:.0f} tokens) lies outside {where} at c={row.concurrency}: "
            "the step model extrapolates, and its error there is the misfit's slope in context carried that far")


def mix_context(pair: Pair, mix: dict) -> float:
    """A mix's context per sequence: the share-weighted mean over its strata of their prompts' prompt
    tokens plus half their output (the speculative server's first repeat: the same prompts on both)."""
    tot = wsum = 0.0
    for s, w in mix.items():
        if w <= 0 or s not in pair.strata:
            continue
        v = pair.strata[s].data[(pair.server, pair.repeats[0])]
        tot += w * float(np.mean(v["ptok"] + v["out"] / 2))
        wsum += w
    return tot / wsum if wsum > 0 else float("nan")


REACH = 0.1   # log: how far past the measured suites' contexts a mix is still read as inside them


@dataclass
class Misfit:
    """How the step model's misfit moves with the context per sequence at one concurrency, and where it
    was measured. Each request's multiplier (its measured decode time over the model's replay of its
    own cell, which the prediction carries into the mix) is regressed on the log context per sequence
    of the batches it decoded in, per server (`gamma`: the speculative server's slope less the
    baseline's, a misfit in the speedup per unit of log context; `var_gamma` its variance, clustered by
    cell, with `dof`). A mix whose context per sequence differs from where its strata were measured
    (delta: log of the mix's, less the share-weighted log of its strata's suites') carries a misfit of
    about gamma x delta, which its interval takes as the variance (gamma^2 + var_gamma) delta^2: zero
    where the mix's batches are like the measured ones, growing with the distance, inside the measured
    range and beyond it (`suites`: the measured suites' log contexts, _span; beyond them by more than
    REACH the mix is flagged as extrapolated)."""
    gamma: float
    var_gamma: float
    dof: float
    suites: dict            # suite -> log context per sequence at c

    def delta(self, pair: Pair, mix: dict) -> float:
        w = {s: v for s, v in mix.items() if v > 0 and s in pair.strata and pair.strata[s].suite in self.suites}
        tot = sum(w.values())
        if tot <= 0:
            return 0.0
        return math.log(max(mix_context(pair, mix), 1e-9)) - sum(v * self.suites[pair.strata[s].suite]
                                                                   for s, v in w.items()) / tot

    def variance(self, pair: Pair, mix: dict) -> float:
        d = self.delta(pair, mix)
        return (self.gamma ** 2 + self.var_gamma) * d * d


def _slope(rep: Report, x: str, c: int) -> tuple[float, float, int] | None:
    """One server's slope of log multiplier on log batch context per sequence at c over the model
    suites' requests, its cell-clustered variance and the number of cells."""
    ys, zs, cells = [], [], []
    theta = rep.theta.get(x)
    if theta is None:
        return None
    for k, cr in rep.reqs.items():
        if k[0] != x or k[2] != c or k[1] not in rep.model_suites or cr.m_dec is None or cr.steps is None:
            continue
        dec_f, _, _, _ = timeline(cr, theta)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.log(dec_f[:, 2] * 1000 / dec_f[:, 1])
            y = np.log(cr.m_dec)
        ok = timed(cr) & (cr.steps > 0) & np.isfinite(z) & np.isfinite(y)
        ys.append(y[ok])
        zs.append(z[ok])
        cells += [k] * int(ok.sum())
    if not ys:
        return None
    y, z = np.concatenate(ys), np.concatenate(zs)
    zc = z - z.mean()
    sxx = float((zc ** 2).sum())
    names = {g: i for i, g in enumerate(dict.fromkeys(cells))}
    G = len(names)
    if sxx <= 0 or G < 3:
        return None
    slope = float((zc * (y - y.mean())).sum() / sxx)
    score = np.bincount([names[g] for g in cells], zc * (y - y.mean() - slope * zc), minlength=G)
    return slope, float((score ** 2).sum()) * G / (G - 1) / sxx ** 2, G


def _span(rep: Report, x: str, c: int) -> dict:
    """Each model suite's log context per sequence at c (the speculative server's requests): where the
    step model was measured."""
    suites = {}
    for u in rep.model_suites:
        crs = [cr for k, cr in rep.reqs.items() if k[:3] == (x, u, c)]
        if crs:
            suites[u] = math.log(max(float(np.mean(np.concatenate([cr.ptok + cr.out / 2 for cr in crs]))), 1e-9))
    return suites


def _misfit(rep: Report, pair: Pair, span: dict) -> Misfit | None:
    """The Misfit at the pair's concurrency from the suites' contexts there (`span`, _span); None without
    two measured contexts, or fewer than three cells a server (the range alone then flags a mix beyond
    it, _rows)."""
    if len(set(span.values())) < 2:
        return None
    got = [_slope(rep, srv, pair.concurrency) for srv in (pair.server, pair.baseline)]
    if any(g is None for g in got):
        return None
    (gs, vs, ns), (gb, vb, nb) = got
    return Misfit(gs - gb, vs + vb, float(min(ns, nb) - 1), span)


def same_sessions(rep: Report, suite: str, servers: tuple, c: int) -> bool:
    """Whether the verifying suite's cells at c ran in the same server processes as the estimation
    suites' cells of their repeat (each cell's `server_session`): a cell added by a later invocation
    runs in a new process under the same repeat label, and shares no session with the estimates."""
    mine = [(k, cell) for k, cell in rep.m.cells.items() if k[0] in servers and k[1] == suite and k[2] == c]
    if not mine:
        return False
    for k, cell in mine:
        others = [o for o in (rep.m.cells.get((k[0], u, c, k[3])) for u in rep.measuring) if o is not None]
        # a repeat the estimates never ran, or a session nobody recorded, shares nothing that is known
        if cell.server_session is None or not others or any(o.server_session != cell.server_session for o in others):
            return False
    return True


def same_prompt_sequences(rep: Report, pair: Pair, suite: str) -> dict | None:
    """A verifying suite drawn from the estimation prompts (verify: same_prompts), per (server, repeat):
    its cell's requests in sending order as (stratum, prompt index) of the pair's strata, with the prompt
    tokens the prefix cache served each; None where any request's prompt is not an estimation prompt
    both servers measured in every repeat (a fresh suite), or a repeat lacks the suite's cell."""
    where = {p: (st, i) for st, stratum in pair.strata.items() for i, p in enumerate(stratum.prompts)}
    out = {}
    for r in pair.repeats:
        for x in (pair.server, pair.baseline):
            cr = rep.reqs.get((x, suite, pair.concurrency, r))
            if cr is None or not len(cr.prompts):
                return None
            order = np.argsort(cr.start, kind="stable")
            ids = [cr.prompts[j] for j in order]
            if any(p not in where for p in ids):
                return None
            cached = np.zeros(len(ids)) if cr.cached is None else np.asarray(cr.cached, float)[order]
            out[(x, r)] = ([where[p] for p in ids], cached)
    return out


STEP = 0.02   # log: how far a cell or a session is moved to read the check's sensitivity to it


def _refitted_exact(rep: Report, pair: Pair, seqs: dict, scale: dict, metrics: list) -> dict:
    """Predictor.exact of the pair with some cells' times multiplied (`scale`: cell key -> factor), each
    moved server's step model fitted again and every one of its multipliers recalibrated, as a cell that
    ran that much slower would have made them: metric -> the predicted log speedup."""
    theta, data = dict(pair.theta), {}
    for x in {k[0] for k in scale}:
        copies = {}
        for k, cr in rep.reqs.items():
            if k[0] == x and k[1] in rep.model_suites:
                f = scale.get(k, 1.0)
                copies[k] = replace(cr, start=cr.start * f, ttft=cr.ttft * f, e2e=cr.e2e * f, m_dec=None, m_adm=None)
        th = fit_step_model(list(copies.values()), start=rep.theta[x])
        theta[x] = th
        for st, stratum in pair.strata.items():
            for r in pair.repeats:
                cr = copies[(x, stratum.suite, pair.concurrency, r)]
                if cr.m_dec is None and cr.steps is not None and cr.closed and cr.concurrency > 1:
                    calibrate(th, cr)   # only the cells the prediction reads: the fit needs no multipliers
                data[(st, x, r)] = per_prompt(cr, stratum.prompts)
    strata = {st: Stratum(st, stratum.suite, stratum.prompts,
                          {key: data.get((st,) + key, v) for key, v in stratum.data.items()})
              for st, stratum in pair.strata.items()}
    moved = Pair(pair.server, pair.baseline, pair.concurrency, pair.repeats, strata, pair.size, theta)
    pred = Predictor(moved, rep.an.settings.slo, rep.an.settings.rng)
    return {m: pred.exact(seqs, m).value for m in metrics}


def same_prompt_sensitivities(rep: Report, pair: Pair, seqs: dict, suite: str, metrics: list) -> dict:
    """How the same-prompt check's error (measured - predicted, log) moves per unit of log time of each
    cell and each server session, by moving it STEP and reading the prediction again (_refitted_exact):
    a cell of an estimation suite moves the prediction through its requests' speeds and through the step
    model fitted on it (at every concurrency: the c = 1 cells set the batch dependence too); a verifying
    cell moves the measured speedup by -1/R (the speculative server's) or +1/R (the baseline's) and not the
    prediction. A session moves every cell it ran; where the verifying cells ran in other server
    processes (a later invocation), they are sessions of their own. Returns metric -> {"cells": [(server,
    c, s)], "sessions": [(server, s)]}."""
    c, R = pair.concurrency, len(pair.repeats)
    base = _refitted_exact(rep, pair, seqs, {}, metrics)
    sign = {pair.server: -1.0, pair.baseline: 1.0}
    out = {m: {"cells": [], "sessions": []} for m in metrics}
    cell_sess = {k: cell.server_session for k, cell in rep.m.cells.items()}

    def moved(scale: dict) -> dict:
        got = _refitted_exact(rep, pair, seqs, scale, metrics)
        return {m: (got[m] - base[m]) / STEP for m in metrics}

    for x in (pair.server, pair.baseline):
        own = [k for k in rep.reqs if k[0] == x and k[1] in rep.model_suites and k[3] in pair.repeats]
        for k in own:
            d = moved({k: math.exp(STEP)})
            for m in metrics:
                out[m]["cells"].append((x, k[2], -d[m]))
        for r in pair.repeats:
            v = (x, suite, c, r)
            for m in metrics:
                out[m]["cells"].append((x, c, sign[x] / R))
            sess = [k for k in own if k[3] == r]
            shared = cell_sess.get(v) is not None and all(cell_sess.get(k) == cell_sess.get(v) for k in sess)
            d = moved({k: math.exp(STEP) for k in sess})
            for m in metrics:
                if shared:
                    out[m]["sessions"].append((x, sign[x] / R - d[m]))
                else:
                    out[m]["sessions"] += [(x, -d[m]), (x, sign[x] / R)]
    return out


def _same_prompt_check(rep: Report, pair: Pair, est: Estimate, sens: dict, model: list, metric: str,
                       measured: Interval) -> TrafficCheck:
    """A same-prompt verifying suite's measured speedup against the prediction of exactly its requests
    (Predictor.exact). Both sides hold the same prompts, so the prompt sample cancels; what is left is
    the cells and the server sessions, each moving the check by its sensitivity
    (same_prompt_sensitivities: through the requests' speeds and the refitted step model, which a
    cell's share of the mix's time alone understated by about a quarter in variance for an agentic mix,
    audit of 6 Dec). With run to run tau^2 at (server, c) and its session share pi: each cell adds
    s^2 (1 - pi) tau^2 at its concurrency, each session s^2 pi tau^2 at the check's (a session shared by
    both sides nearly cancels, one that is not counts on each), with the sessions' dof (one per session
    beyond the first of each server); plus the prediction's model parts (`model`), so a check agrees at
    its level when the model's error is what the prediction says."""
    an = rep.an
    rr = an.run_to_run
    pi = rr.session_share.get(metric, 0.0)
    var = VarianceSum()
    for x, c, s in sens["cells"]:
        t2 = rr.at(metric, x, c)
        if t2 is not None and s:
            var.add(("cell", x, c), s * s * (1 - pi) * t2.total, t2.dof)
    R = len(pair.repeats)
    for x, s in sens["sessions"]:
        t2 = rr.at(metric, x, pair.concurrency)
        if t2 is not None and s:
            var.add(("session", x), s * s * pi * t2.total, float(max(R - 1, 1)))
    for k, (v, d) in model:
        var.add(k, v, d)
    return _check_of(math.log(measured.value) - est.value, max(var.total, 1e-12), _dof(var), an.settings.confidence,
                     disjoint=False, same_prompts=True)


def _check_of(d: float, var: float, dof: float, confidence: float, **more) -> TrafficCheck:
    """The TrafficCheck of an error d (log) with its variance and dof: its interval, whether it contains 0,
    its equivalence bound and the smallest error it catches in 80% of runs (its two-sided level's t plus
    the 80th percentile)."""
    se = math.sqrt(var)
    lo, hi = t_interval(d, se, dof, confidence)
    detect = (t_critical(dof, confidence) + t_ppf(0.8, dof)) * se
    return TrafficCheck(math.exp(d) - 1, math.exp(lo) - 1, math.exp(hi) - 1, lo <= 0 <= hi,
                        bound=math.exp(max(abs(lo), abs(hi))) - 1, detectable=math.exp(detect) - 1,
                        se=se, dof=dof, **more)


def _check(an, suite: str, server: str, c: int, metric: str, predicted: tuple, measured: Interval,
           shared_sessions: bool = True, own: tuple | None = None, parts_run: list | None = None,
           repeats: int = 1) -> TrafficCheck:
    """Measured against predicted at the verifying suite's composition: log(measured / predicted) with
    the variance of both estimates less the server-session part they share (it cancels where both
    were measured in the same server processes, `shared_sessions`). The measured side's prompt sample is
    the suite's own as drawn (`own`: its strata's linearised variance at its composition, Predictor.
    prompt_variance; a verifying suite's allocation is fixed, so the verdict's plain bootstrap by prompt,
    which also counts which stratum a prompt came from, overstates it, by 2x in variance for a
    generic-heavy mix in simulation), plus both servers' run to run at c over the repeats
    (`parts_run`); without `own`, the verdict's own variance."""
    iv, parts, est = predicted
    s = an.settings
    cmp = next((k for k in an.comparisons.get((server, suite, metric), []) if k.concurrency == c), None)
    d = math.log(measured.value) - est.value
    shared = sum(cmp.session.values()) if cmp is not None and shared_sessions else 0.0
    if own is not None:
        meas = VarianceSum().add(("measured-w", server, suite, c, metric), own[0], own[1])
        for v in parts_run or []:
            meas.plus(v, 1 / max(repeats, 1))
        v_meas, dof = meas.total, _dof(VarianceSum().plus(parts).plus(meas))
    else:
        v_meas = cmp.se ** 2 if cmp is not None and cmp.se is not None else 0.0
        dof = min(_dof(parts), cmp.dof if cmp is not None else float("inf"))
    var = max(parts.total + v_meas - 2 * shared, parts.total - shared, 1e-12)
    return _check_of(d, var, dof, s.confidence)


def pooled_checks(rows: list[TrafficRow], confidence: float) -> list[dict]:
    """Every verified mix of one (server, concurrency, metric) as one family: the prediction holds when
    no mix's check misses at the family's level (Bonferroni, 1 - (1 - confidence) / m: valid whatever the
    checks share, the strata two mixes both weigh and the run to run of one server pair). Mixes that move
    the model's features differently (a generic-heavy mix, a long-context one) test it where one mix
    alone cannot. Each check of a family of two or more gets its `family` and `family_holds`; returns
    one dict per family: server, concurrency, metric, mixes, holds."""
    fams: dict = {}
    for r in rows:
        if r.check is not None and r.check.se:
            fams.setdefault((r.server, r.concurrency, r.metric), []).append(r)
    out = []
    for (x, c, metric), rs in sorted(fams.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if len(rs) < 2:
            continue
        level = 1 - (1 - confidence) / len(rs)
        z = {r.profile: math.log(1 + r.check.error) / r.check.se for r in rs}
        holds = all(abs(z[r.profile]) <= t_critical(r.check.dof if r.check.dof is not None else float("inf"), level)
                    for r in rs)
        for r in rs:
            r.check.family, r.check.family_holds = sorted(z), holds
        out.append({"server": x, "concurrency": c, "metric": metric, "mixes": sorted(z), "holds": holds})
    return out
