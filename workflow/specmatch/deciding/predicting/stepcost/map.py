"""The map itself: both servers' step cost T(b, C, P) fitted on the map's cells, rho(b, L) with its
error, and whether rho moves with tau (the method: specmatch.deciding.predicting.stepcost)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ...reading.measurements import Measurements
from ...verdicts.noise import RunToRun, VarianceSum, run_to_run
from ..traffic.step_model import (UNCHUNKED, CellRequests, Scheduler, fit_step_model, simulate, step_cost, timed,
                                  timeline)
from ....records import Interval, StepCostPoint
from ....stats import t_half_width, t_interval

H = 0.02   # the finite difference a cell's times are moved by (log scale)
ITERATIONS = 30   # the fit's iterations at most (it stops at its fixed point: the Jacobian's refits start there)


@dataclass
class Model:
    """One server's side of the map: T's coefficients, fitted on decode steps, and how much longer a
    first token takes than the replay's one admission step (the measured over the replayed TTFT of the
    fitted cells: a queue, a prefill spread over steps), which the replay applies to every admission."""
    theta: np.ndarray
    admission: dict = field(default_factory=dict)   # fitted concurrency -> measured over replayed first token
    sched: Scheduler = UNCHUNKED   # the engine's tokens per step (chunked prefill), in the fit and the replay

    def admission_at(self, c: float) -> float:
        """The first token's multiplier at concurrency c: the fitted concurrencies' own, linear in log c
        between them, the nearest one's beyond them (one number for every load made the replay's first
        tokens at c = 1 as slow as under load)."""
        if not self.admission:
            return 1.0
        cs = sorted(self.admission)
        x = math.log(min(max(c, cs[0]), cs[-1]))
        return float(np.exp(np.interp(x, [math.log(v) for v in cs], [math.log(self.admission[v]) for v in cs])))

    def step(self, b: float, L: float) -> float:
        """T for b decoding sequences of L tokens of context each, no prefill (seconds)."""
        return float(step_cost(self.theta, b, b * L / 1000, 0.0))


@dataclass
class StepMap:
    """One speculative server's map against the baseline: both servers' models, the concurrencies they
    were fitted on, the sessions (repeats) they average, the run-to-run noise their error comes from,
    and the same maps with one concurrency's cells moved (the error's Jacobian)."""
    server: str
    baseline: str
    models: dict                # server -> Model
    suite: str                  # the map suite
    fit: list                   # fitted concurrencies
    repeats: int
    rr: RunToRun
    context: float = 0.0        # the map suite's median context per sequence (tokens)
    moved: dict = field(default_factory=dict)   # (server, c) -> that server's Model, its cells at c H slower

    @property
    def theta(self) -> dict:
        return {x: md.theta for x, md in self.models.items()}

    def log_step(self, x: str, b: float, L: float, model: Model | None = None) -> float:
        """log of server x's decode step at batch b, context L."""
        return math.log((model or self.models[x]).step(b, L))

    def log_rho(self, b: float, L: float) -> float:
        return self.log_step(self.server, b, L) - self.log_step(self.baseline, b, L)

    def nearest(self, c: float) -> int:
        """The fitted concurrency nearest to c on the log scale: where the map's error at c is read."""
        return min(self.fit, key=lambda f: (abs(math.log(f) - math.log(max(c, 1))), -f))

    def extrapolated(self, b: float) -> bool:
        return b > max(self.fit) or b < min(self.fit)

    @property
    def measured_noise(self) -> bool:
        """Whether run to run was measured for both servers (two repeats or more): the map's error."""
        return all(self.rr.at("tpot", x, c) is not None for x in (self.server, self.baseline) for c in self.fit)

    def error(self, b: float, L: float | None = None) -> VarianceSum:
        """The variance of log rho(b, L) (L: the map suite's median context when None). Each server's
        step time moves with its sessions and its cells (noise.run_to_run of log TPOT, which
        a greedy request's steps do not move: its step time's): a session's share pi moves every cell
        of the session alike, so it moves the map at every batch alike (pi tau^2 / R at the fitted
        concurrency nearest b); each cell's own part (1 - pi) tau^2_c / R moves it by its Jacobian
        J_c(b) (the fit redone with that concurrency's cells H slower): small where fitted cells surround
        b, growing with the fit's curvature beyond the fitted batches."""
        L = self.context if L is None else L
        out = VarianceSum()
        for x in (self.server, self.baseline):
            out.plus(self.part(x, b, L))
        return out

    def part(self, x: str, b: float, L: float) -> VarianceSum:
        """The variance of log T of one server's side of the map at (b, L) (error's terms for x)."""
        near = self.nearest(b)
        out = VarianceSum()
        R = max(self.repeats, 1)
        pi = self.rr.session_share.get("tpot", 0.0)
        out.plus(self.rr.at("tpot", x, near), pi / R)
        base = max(self.models[x].step(b, L), 1e-12)   # the fit's own T: non-negative, positive at b >= 1
        for c in self.fit:
            md = self.moved.get((x, c))
            if md is None:
                continue
            # d log T as dT / T: a refit that extrapolates below zero (its coefficients are free in
            # sign) has no log, and its relative move is what makes the error grow there
            j = (md.step(b, L) / base - 1.0) / H
            out.plus(self.rr.at("tpot", x, c), j * j * (1 - pi) / R)
        return out

    def rho(self, b: float, L: float, confidence: float) -> Interval:
        est = self.log_rho(b, L)
        var = self.error(b, L)
        if not var.total > 0:
            return Interval(math.exp(est), None, None)
        h = t_half_width(math.sqrt(var.total), var.dof, confidence)
        return Interval(math.exp(est), bounded_exp(est - h), bounded_exp(est + h))


def bounded_exp(x: float) -> float | None:
    """exp of a log-scale bound, None (unbounded) where it would overflow: an error so large that the
    map says nothing there."""
    return math.exp(x) if x < 700 else None


def _slower(cr: CellRequests, h: float) -> CellRequests:
    f = math.exp(h)
    return replace(cr, start=cr.start * f, ttft=cr.ttft * f, e2e=cr.e2e * f)


def map_cells(reqs: dict, server: str, suites: list[str], fit: list[int]) -> list[CellRequests]:
    """The cells a server's step model is fitted on: closed loops with per-request decode steps."""
    return [cr for k, cr in sorted(reqs.items(), key=lambda kv: tuple(map(str, kv[0])))
            if k[0] == server and k[1] in suites and k[2] in fit and cr.steps is not None and cr.closed
            and len(cr.e2e) and np.isfinite(cr.e2e).all()]


def fit_model(cells: list[CellRequests], curved: bool, near: Model | None = None, sched: Scheduler = UNCHUNKED
              ) -> Model | None:
    """T fitted on the cells' decode steps and the first tokens at c = 1 (a prefill with no queue: what
    a prompt token costs), with a b^2 term (a speculative step verifies k + 1 tokens a sequence, so it
    can grow faster than the plain one), and a first token's cost against the replay's (a queue):
    every cell replayed through T (its prompts in its order: traffic.step_model.simulate), the
    geometric mean of measured over replayed TTFT. `near`: the fit this one perturbs (the Jacobian's
    refits: its coefficients at their bounds stay there, its admission multiplier is kept)."""
    if near is not None:
        theta = fit_step_model(cells, ITERATIONS, curved=curved, first_tokens_upto=1, support=near.theta > 0,
                               start=near.theta, sched=near.sched)
        return None if theta is None else Model(theta, near.admission, near.sched)
    theta = fit_step_model(cells, ITERATIONS, curved=curved, first_tokens_upto=1, sched=sched)
    if theta is None:
        return None
    logs: dict = {}
    for cr in cells:
        _, ttft, _ = simulate(theta, cr.concurrency, cr.ptok, cr.out, cr.steps, cached=cr.cached, sched=sched)
        ok = timed(cr)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.log(cr.ttft[ok] / ttft[0][ok])
        logs.setdefault(cr.concurrency, []).append(r[np.isfinite(r)])
    got = {c: np.concatenate(v) for c, v in logs.items()}
    return Model(theta, {c: float(np.exp(v.mean())) for c, v in got.items() if v.size}, sched)


def fit_map(reqs: dict, m: Measurements, server: str, baseline: str, suite: str, suites: list[str],
            fit: list[int], context: float = 0.0, scheds: dict | None = None) -> StepMap | None:
    """Both servers' models from their cells at the fitted concurrencies (every suite given: the step
    cost is the batch's, not the content's), and each refitted with one concurrency's cells moved
    (StepMap.error); None where either server has no cell to fit."""
    models, reps, moved = {}, {}, {}
    got = sorted({k[2] for k in reqs if k[0] == server and k[1] in suites and k[2] in fit})
    for x in (server, baseline):
        cells = map_cells(reqs, x, suites, fit)
        md = fit_model(cells, x == server, sched=(scheds or {}).get(x, UNCHUNKED)) if cells else None
        if md is None:
            return None
        models[x] = md
        # the repeats every fitted concurrency has (a third-round cell adds a repeat to one configuration only)
        reps[x] = min(len({cr.key[3] for cr in cells if cr.concurrency == c}) for c in {cr.concurrency for cr in cells})
        for c in got:
            moved[(x, c)] = fit_model([_slower(cr, H) if cr.concurrency == c else cr for cr in cells], x == server, md)
    return StepMap(server, baseline, models, suite, got, min(reps.values()), run_to_run(m, [server, baseline]),
                   context, moved)


def rho_points(sm: StepMap, batches: list[int], contexts: list[int], confidence: float) -> list[StepCostPoint]:
    return [StepCostPoint(b, L, sm.rho(b, L, confidence), sm.extrapolated(b)) for L in contexts for b in batches]


def tau_slope(sm: StepMap, reqs: dict, suites: list[str], confidence: float) -> Interval | None:
    """Whether rho moves with tau: over the drafter's own requests in the fitted cells, each request's
    mean step time over the map's T at its batch, regressed on its own log tau within its cell (a
    cell's session and conditions cancel). Its interval is clustered two ways (Cameron, Gelbach and
    Miller 2011, "Robust inference with multiway clustering", JBES 29(2)): by prompt (a prompt's
    requests share its content in every cell) and by cell (the requests of one cell share its batches'
    stalls and jitter), with t at the fewer clusters' dof. 0: rho is the batch's alone."""
    ys, zs, prompts, cells = [], [], [], []
    theta = sm.models[sm.server].theta
    for i, cr in enumerate(map_cells(reqs, sm.server, suites, sm.fit)):
        dec_f, dec_y, _, _ = timeline(cr, theta, sched=sm.models[sm.server].sched)
        model = dec_f @ theta
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.log(dec_y / model)
            z = np.log(np.maximum(cr.out - 1, 0) / cr.steps)
        ok = np.isfinite(y) & np.isfinite(z) & (cr.steps > 0)
        if ok.sum() < 3:
            continue
        ys.append(y[ok] - y[ok].mean())
        zs.append(z[ok] - z[ok].mean())
        prompts += [p for p, keep in zip(cr.prompts, ok) if keep]
        cells += [i] * int(ok.sum())
    if not ys:
        return None
    y, z = np.concatenate(ys), np.concatenate(zs)
    sxx = float((z ** 2).sum())
    if sxx <= 0:
        return None
    slope = float((y * z).sum() / sxx)
    score = z * (y - slope * z)

    def clustered(labels: list) -> tuple[float, int]:
        names = {g: j for j, g in enumerate(dict.fromkeys(labels))}
        G = len(names)
        per = np.bincount([names[g] for g in labels], score, minlength=G)
        return float((per ** 2).sum()) * G / max(G - 1, 1), G

    vp, gp = clustered(prompts)
    vc, gc = clustered(cells)
    vb, _ = clustered(list(zip(prompts, cells)))
    G = min(gp, gc)
    if G < 3:
        return None
    var = max(vp + vc - vb, vp, vc) / sxx ** 2
    return Interval(slope, *t_interval(slope, math.sqrt(var), G - 1, confidence))
