"""The step model (docs: specmatch.deciding.predicting.traffic): what it reads of a cell, T(b, C, P) fitted to a
server's cells from their timelines, the closed loop it simulates, each request's own speed against
the model's replay of its cell, and the model's own error from every measured suite's residual."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .... import metrics
from ....metrics import log_speedup
from ...reading.measurements import Arrays, Measurements


# -- what the model reads of a cell ----------------------------------------------------------------
@dataclass
class CellRequests:
    """One cell's successful requests in the order they were sent, each with its stratum and (for the
    step model) its timeline: start, time to first token, end-to-end latency, decode steps."""
    key: tuple
    prompts: list
    strata: list
    start: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    out: np.ndarray
    ptok: np.ndarray
    steps: np.ndarray | None        # decode steps per request (None: a speculative server without per-request counts)
    good: np.ndarray
    closed: bool
    m_dec: np.ndarray | None = None  # the request's speed against the step model's replay of its cell
    m_adm: np.ndarray | None = None
    tpot: np.ndarray | None = None   # metrics.tpot of the measured request
    cached: np.ndarray | None = None  # prompt tokens served from the prefix cache (not prefilled; None: none)

    @property
    def fresh(self) -> np.ndarray:
        """The prompt tokens each request's prefill computed: its prompt less what the prefix cache served."""
        return self.ptok if self.cached is None else np.maximum(self.ptok - self.cached, 0.0)

    @property
    def concurrency(self) -> int:
        return self.key[2]


def stratum_function(files: list[str]):
    """A request's stratum: its file suite (one stratum) or its source (a training or traffic suite)."""
    files = set(files)
    return lambda suite, source: suite if suite in files else source


def cell_requests(key: tuple, a: Arrays, stratum) -> CellRequests:
    """What the step model reads of one cell's successful requests (measurements.Arrays: the one reader
    of request records), each with its stratum."""
    n = len(a.out)
    start = np.zeros(n) if a.start is None else np.nan_to_num(a.start, nan=0.0)
    ptok = np.zeros(n) if a.prompt_tokens is None else np.nan_to_num(a.prompt_tokens, nan=0.0)
    sources = a.sources or [None] * n
    cached = None if a.cached_tokens is None else np.minimum(np.nan_to_num(a.cached_tokens, nan=0.0), ptok)
    return CellRequests(key, list(a.prompts), [stratum(key[1], x) for x in sources], start,
                        np.nan_to_num(a.ttft, nan=0.0), a.e2e, a.out, ptok, a.decode_steps, a.good, a.closed,
                        tpot=a.tpot, cached=cached)


# -- the step model ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scheduler:
    """What an engine's step schedules: at most `budget` tokens a step (vLLM's max_num_batched_tokens,
    SGLang's chunked prefill size; inf: every waiting prompt is prefilled in the step that admits it),
    the decoding sequences first, `per_sequence` tokens each (1, or 1 + k for a speculative step that
    verifies k drafted tokens), then the waiting prompts in the order they arrived, in chunks that fill
    what is left (chunked prefill). Under load a long prompt then takes several steps to its first token
    and the steps between carry its chunks, so the batch's first tokens and its decode steps desynchronise,
    as the engine's do."""
    budget: float = float("inf")
    per_sequence: int = 1

    def __post_init__(self):
        if not self.budget > 0 or self.per_sequence < 1:
            raise ValueError(f"Scheduler: a budget above 0 and at least one token a sequence, got {self.budget}, "
                             f"{self.per_sequence}")

    @property
    def chunked(self) -> bool:
        return bool(np.isfinite(self.budget))


UNCHUNKED = Scheduler()


def step_cost(theta: np.ndarray, b, C, P, Q=None):
    """T(b, C, P) in seconds: b decoding sequences holding C thousand tokens of context, P thousand prompt
    tokens prefilled in the step (those the prefix cache did not serve), and t4 b^2 for a theta of five
    (arrays broadcast); for a theta of six also t5 Q, Q the sum over the decoding sequences of their
    context squared (thousands of tokens; default C^2 / b, sequences of equal context): a context cost
    that grows faster than the context (fit_step_model's `quadratic`)."""
    curve = theta[4] * b * b if len(theta) > 4 else 0.0
    if len(theta) > 5 and theta[5]:
        if Q is None:
            with np.errstate(invalid="ignore", divide="ignore"):
                Q = np.where(np.asarray(b) > 0, np.asarray(C) ** 2 / np.maximum(b, 1e-12), 0.0)
        curve = curve + theta[5] * Q
    return theta[0] + theta[1] * b + theta[2] * C + theta[3] * P + curve


def timed(cr: CellRequests) -> np.ndarray:
    """Which requests' times are a step model's to read: not one whose tokens all arrived at once (the
    client or the server held the stream back: a busy machine), which has no decode time and a first
    token that holds it."""
    return ~((cr.out > 1) & (cr.e2e - cr.ttft <= 0))


def timeline(cr: CellRequests, theta: np.ndarray, points: int = 400, sched: Scheduler = UNCHUNKED
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per request: its steps' mean features [1, b, C, P] (and b^2 for a theta of five: a step cost
    that grows faster than the batch; and Q, the sum of the sequences' squared contexts, for a theta of
    six) over its decode (weighted by the steps T(theta) says were taken
    at each moment) and the features at its first-token step, with that step's time; the batch at every
    moment read from the cell's timeline (who was prefilling, who decoding, how much context). Under a
    chunked scheduler a step computes what is waiting up to what the decodes leave of the budget, and a
    first token alone took ceil(its prompt / budget) steps."""
    d0, d1 = cr.start + cr.ttft, cr.start + cr.e2e
    ts = np.linspace(0.0, float(d1.max()), points + 1)
    mid, dt = (ts[:-1] + ts[1:]) / 2, np.diff(ts)
    dec = (mid[None, :] >= d0[:, None]) & (mid[None, :] < d1[:, None])
    pre = (mid[None, :] >= cr.start[:, None]) & (mid[None, :] < d0[:, None])
    frac = np.clip((mid[None, :] - d0[:, None]) / np.maximum(d1 - d0, 1e-9)[:, None], 0.0, 1.0)
    ctx = (cr.ptok[:, None] + 1 + (cr.out[:, None] - 1) * frac) * dec
    b = dec.sum(0).astype(float)
    P = (cr.fresh[:, None] * pre).sum(0) / 1000
    waited = np.ones(len(cr.ptok))
    if sched.chunked:
        # a step computes what is waiting, up to what the decodes leave of the budget; a prompt alone (c = 1)
        # takes ceil(tokens / budget) steps to its first token
        P = np.minimum(P, np.maximum(sched.budget - sched.per_sequence * b, 0.0) / 1000)
        waited = np.maximum(np.ceil(cr.fresh / sched.budget), 1.0)
    F = np.stack([np.ones(points), b, ctx.sum(0) / 1000, P] + ([b ** 2] if len(theta) > 4 else [])
                 + ([(ctx ** 2).sum(0) / 1e6] if len(theta) > 5 else []), 1)
    rate = dt / np.maximum(F @ theta, 1e-9)
    w = dec * rate[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        dec_f = (w @ F) / w.sum(1, keepdims=True)
    adm = np.clip(np.searchsorted(ts, cr.start + cr.ttft / 2) - 1, 0, points - 1)
    adm_f = F[adm]
    if sched.chunked:   # its prompt's chunks, on average
        adm_f[:, 3] = np.minimum(adm_f[:, 3], cr.fresh / waited / 1000)
    return dec_f, (cr.e2e - cr.ttft) / np.maximum(cr.steps, 1), adm_f, cr.ttft / waited


def fit_step_model(cells: list[CellRequests], iterations: int = 3, curved: bool = False,
                   first_tokens_upto: int | None = None, support: np.ndarray | None = None,
                   start: np.ndarray | None = None, sched: Scheduler = UNCHUNKED,
                   quadratic: bool = False) -> np.ndarray | None:
    """theta of T(b, C, P) for one server from its cells (module docstring), or None without cells that
    count their decode steps. Relative least squares: every request's mean decode step and first-token
    step weigh alike whatever their length. `curved` adds t4 b^2 (non-negative: a step that grows
    faster than the batch, as a speculative step verifying k + 1 tokens a sequence does past the
    batch where the plain step is still cheap). `first_tokens_upto`: the first tokens fitted are those of
    cells up to this concurrency (None: all; at c = 1 a first token is its prefill, with no queue).
    `support` (with `start`, the fit it perturbs): the coefficients left free, the others held at 0, by
    plain least squares: the fit's local sensitivity to its data, which a bound that switches on or off
    would otherwise turn into a jump. `quadratic` adds t5 Q (non-negative; theta of six, t4 held at 0
    unless `curved`): a context cost that grows faster than the context, which a linear model fitted on
    suites of two context levels reads as a straight line between them (traffic.report: the model's form)."""
    from scipy.optimize import nnls

    use = [c for c in cells if c.steps is not None and c.closed and len(c.e2e) and np.isfinite(c.e2e).all()]
    if not use:
        return None
    per_step = np.concatenate([(c.e2e - c.ttft)[c.steps > 0] / c.steps[c.steps > 0] for c in use])
    theta = np.array([float(np.median(per_step)) if per_step.size else 0.01]
                     + [0.0] * (5 if quadratic else 4 if curved else 3))
    if start is not None:
        theta = np.array(start, float)
    free = np.ones(len(theta), bool)
    if quadratic and not curved:
        free[4] = False
    for _ in range(iterations):
        xs, ys = [], []
        for c in use:
            dec_f, dec_y, adm_f, adm_y = timeline(c, theta, sched=sched)
            ok = timed(c)
            keep = (c.steps > 0) & np.isfinite(dec_f).all(1) & (dec_y > 0) & ok
            xs += [dec_f[keep] / dec_y[keep, None]]
            ys += [np.ones(int(keep.sum()))]
            keep = (adm_y > 0) & ok & (first_tokens_upto is None or c.concurrency <= first_tokens_upto)
            xs += [adm_f[keep] / adm_y[keep, None]]
            ys += [np.ones(int(keep.sum()))]
        X, y = np.concatenate(xs), np.concatenate(ys)
        scale = np.maximum(np.abs(X).max(0), 1e-12)
        sol = np.zeros(X.shape[1])
        if support is None:
            sol[free] = nnls((X / scale)[:, free], y)[0]
        else:
            sol[support] = np.linalg.lstsq((X / scale)[:, support], y, rcond=None)[0]
        done = np.allclose(sol / scale, theta, rtol=1e-6, atol=1e-12)
        theta = sol / scale
        if theta[0] <= 0 and theta[1] <= 0:
            theta[0] = float(np.median(per_step))
        if done:   # the batch features T reads are its own fixed point
            break
    return theta


def simulate(theta: np.ndarray, c: int, ptok: np.ndarray, out: np.ndarray, steps: np.ndarray,
             m_dec: np.ndarray | None = None, m_adm: np.ndarray | None = None, cached: np.ndarray | None = None,
             sched: Scheduler = UNCHUNKED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed loop of c workers over suites (rows x requests, each row in sending order) stepped
    synchronously through T(b, C, P): a request is prefilled in the step that admits it (its first
    token), then takes its decode steps (a request of s steps is done after ceil(s)); each step costs T
    times the mean multiplier of the requests in it. Between two events (an admission, a completion)
    the batch is fixed and its context grows by the same tokens every step, so the steps up to the next
    completion are summed in closed form. `cached`: each request's prompt tokens the prefix cache serves,
    which its prefill step does not compute (its context holds them all). `sched`: the engine's token
    budget a step (Scheduler: a prompt beyond what the decodes leave is prefilled in chunks over several
    steps, the first token after the last; unchunked, every waiting prompt in one step). Returns every
    request's e2e and TTFT and each row's makespan."""
    ptok, out, steps = (np.atleast_2d(np.asarray(x, float)) for x in (ptok, out, steps))
    R, n = ptok.shape
    computed = ptok if cached is None else np.maximum(ptok - np.broadcast_to(np.asarray(cached, float), (R, n)), 0.0)
    m_dec = np.ones((R, n)) if m_dec is None else np.atleast_2d(m_dec)
    m_adm = np.ones((R, n)) if m_adm is None else np.atleast_2d(m_adm)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_step = np.where(steps > 0, (out - 1) / steps, 0.0)     # tokens a decode step adds to the context
    w = min(c, n)
    rows = np.arange(R)[:, None]
    rr = np.broadcast_to(rows, (R, w))
    slot = np.tile(np.arange(w), (R, 1))
    waiting = np.ones((R, w), bool)
    pre_left = computed[:, :w].copy()     # a waiting request's prompt tokens still to compute
    left = steps[:, :w].copy()
    gen = np.zeros((R, w))
    nxt = np.full(R, w)
    t = np.zeros(R)
    start, ttft, end = np.zeros((R, n)), np.zeros((R, n)), np.zeros((R, n))
    while True:
        active = slot >= 0
        live = active.any(1)
        if not live.any():
            break
        idx = np.where(active, slot, 0)
        dec, pre = active & ~waiting, active & waiting
        p = ptok[rows, idx]
        g = np.where(dec, per_step[rows, idx], 0.0)
        b = dec.sum(1)
        # the waiting prompts' chunks, first come first served, in what the decodes leave of the budget
        chunk = np.where(pre, pre_left, 0.0)
        if sched.chunked:
            avail = np.maximum(sched.budget - sched.per_sequence * b, 0.0)
            order = np.argsort(np.where(pre, idx, n), axis=1, kind="stable")
            ahead = np.take_along_axis(chunk, order, 1)
            got = np.clip(avail[:, None] - (np.cumsum(ahead, 1) - ahead), 0.0, ahead)
            chunk = np.zeros_like(chunk)
            np.put_along_axis(chunk, order, got, 1)
        fin = pre & (chunk >= pre_left - 1e-9)
        part = pre & ((chunk > 0) | fin)     # the waiting prompts this step computes (or completes)
        # a row with a prompt getting tokens takes one step; the others (and a row whose decodes leave the
        # waiting prompts nothing of the budget) every step up to the next completion
        k = np.where(part.any(1), 1.0, np.ceil(np.where(dec, left, np.inf).min(1) - 1e-9))
        k = np.where(live & np.isfinite(k), np.maximum(k, 1.0), 0.0)
        L0 = (p + 1 + gen) * dec / 1000
        C0 = L0.sum(1)
        P = chunk.sum(1) / 1000
        mult = (np.where(dec, m_dec[rows, idx], 0.0) + np.where(part, m_adm[rows, idx], 0.0)).sum(1) / np.maximum(
            (dec | part).sum(1), 1)
        grow = theta[2] * g.sum(1) / 1000 * k * (k - 1) / 2
        Q0 = None
        if len(theta) > 5 and theta[5]:
            # the squared contexts summed over the k steps, each sequence growing by g a step
            Q0 = (L0 ** 2).sum(1)
            grow = grow + theta[5] * ((L0 * g / 1000).sum(1) * k * (k - 1)
                                      + ((g / 1000) ** 2).sum(1) * (k - 1) * k * (2 * k - 1) / 6)
        cost = (k * step_cost(theta, b, C0, P, Q0) + grow) * mult
        t = t + cost
        ttft[rr[fin], idx[fin]] = (t[:, None] - start[rows, idx])[fin]
        kk = k[:, None]
        gen = np.where(dec, gen + kk * g, gen)
        left = np.where(dec, left - kk, left)
        pre_left = np.where(pre, pre_left - chunk, pre_left)
        waiting &= ~fin
        done = active & ~waiting & (left <= 1e-9)
        if done.any():
            end[rr[done], idx[done]] = np.broadcast_to(t[:, None], done.shape)[done]
            new = nxt[:, None] + np.cumsum(done, 1) - 1
            ok = done & (new < n)
            slot = np.where(done, np.where(ok, new, -1), slot)
            nidx = np.where(ok, new, 0)
            start[rr[ok], nidx[ok]] = np.broadcast_to(t[:, None], ok.shape)[ok]
            left = np.where(ok, steps[rows, nidx], left)
            gen = np.where(ok, 0.0, gen)
            pre_left = np.where(ok, computed[rows, nidx], pre_left)
            waiting = np.where(done, ok, waiting)
            nxt = np.minimum(nxt + done.sum(1), n)
    return end - start, ttft, end.max(1)


def calibrate(theta: np.ndarray, cr: CellRequests) -> None:
    """Each request's multipliers: its measured decode time and first-token time over the step model's
    replay of its own cell (its suite, in its order, at its concurrency)."""
    e2e, ttft, _ = simulate(theta, cr.concurrency, cr.ptok, cr.out, cr.steps, cached=cr.cached)
    with np.errstate(invalid="ignore", divide="ignore"):
        m_dec = (cr.e2e - cr.ttft) / (e2e[0] - ttft[0])
        m_adm = cr.ttft / ttft[0]
    cr.m_dec = np.where(np.isfinite(m_dec) & (m_dec > 0), m_dec, 1.0)
    cr.m_adm = np.where(np.isfinite(m_adm) & (m_adm > 0), m_adm, 1.0)


def figures(metric: str, c: int, out: np.ndarray, e2e: np.ndarray, ttft: np.ndarray, slo: dict) -> np.ndarray:
    """A simulated suite's figure per row, read as a measured closed-loop cell is (metrics.closed_loop:
    a rate at the load, C x sum / sum of latencies; a mean TPOT or latency), so a prediction and the
    measured check of it are the same quantity."""
    tp = metrics.tpot(e2e, ttft, out)
    return metrics.closed_loop(metric, metrics.workers(c, out.shape[-1]), out, metrics.good(e2e, ttft, tp, slo), e2e, tp)


# -- the model's own error --------------------------------------------------------------------------------
def model_residuals(reqs: dict, m: Measurements, thetas: dict, server: str, baseline: str, c: int, metric: str,
                    suites: list[str]) -> dict[str, float]:
    """Each suite's measured log speedup at c minus the step model's replay of its own requests (its
    prompts in its order, their measured decode steps and lengths, without their own speeds: the
    multipliers at 1), the mean over the repeats both servers measured. The prediction carries each
    request's own speed into the mix, so a misfit common to every suite cancels; what it cannot remove
    is how the misfit differs between batch conditions, which the spread of these residuals shows.
    The suite stays in the fit: left out, the residuals read several times the actual error (without
    all of a suite's cells the fit extrapolates to contexts it never saw, 3-4x; without its cells at c
    alone, the suite's level at c is extrapolated from other concurrencies, which a mix never needs,
    1.5-3x). tests/test_traffic.py measures the coverage this check gives."""
    out = {}
    if any(thetas.get(x) is None for x in (server, baseline)):
        return out
    for u in suites:
        reps = sorted({k[3] for k in reqs if k[:3] == (server, u, c)} & {k[3] for k in reqs if k[:3] == (baseline, u, c)})
        diffs = []
        for r in reps:
            got = {}
            for x in (server, baseline):
                cr = reqs[(x, u, c, r)]
                if cr.steps is None or not cr.closed:
                    break
                e2e, ttft, _ = simulate(thetas[x], c, cr.ptok, cr.out, cr.steps, cached=cr.cached)
                key = (x, u, c, r)
                got[x] = (float(figures(metric, c, cr.out[None, :], e2e, ttft, m.settings.slo)[0]),
                          m.arrays[key].point(metric, m.cells[key]))
            if len(got) < 2 or any(v[1] is None or not v[1] > 0 or not v[0] > 0 for v in got.values()):
                continue
            meas = float(log_speedup(metric, got[server][1], got[baseline][1]))
            model = float(log_speedup(metric, got[server][0], got[baseline][0]))
            diffs.append(meas - model)
        if diffs:
            out[u] = float(np.mean(diffs))
    return out


def model_error(residuals: dict[str, float], noise: float = 0.0) -> tuple[float, float] | None:
    """The model's error variance from the leave-one-suite-out residuals: their spread across suites
    (the prediction keeps each request's own measured speed, so a level every suite shares is not its
    error) less what the cells' own run-to-run noise spreads them by (`noise`: a residual's variance
    from it; the prompt sample cancels, a residual replays its own suite's requests), with suites - 1
    dof; None with fewer than two suites (unchecked)."""
    if len(residuals) < 2:
        return None
    v = np.array(list(residuals.values()))
    return max(float(v.var(ddof=1)) - noise, 0.0), float(len(v) - 1)
