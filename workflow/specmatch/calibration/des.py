"""A discrete-event model of a batched LLM server under a closed-loop client (for calibration).

Not the analysis's model: specmatch.deciding.analysis bootstraps a cell's duration as the makespan of C
workers serving independent request latencies. Here latencies are not independent and have no
fixed size: a request's time is the engine steps it shares with whatever else is running.

- **Continuous batching.** The engine runs steps back to back; each step serves every running
  request. A step costs `step_s` + `seq_s` per decoding sequence + `ctx_s` per token of context in
  the batch, plus `prefill_s` per prompt token of the requests admitted at that step (prefill on
  admission: the step yields their first token); `ctx2_s` per sequence per (thousand tokens of its
  context)^2 makes the context cost super-linear. A step's time has a lognormal jitter shared by
  the batch, and now and then a stall (`hiccup_p`, exponential of mean `hiccup_s`): heavy-tailed,
  correlated request noise.
- **Closed loop.** C workers; each sends the next request of the suite's order as soon as its
  previous one finishes, and the engine admits it at the next step.
- **Speculation.** A speculative decode step drafts `k` tokens; each is accepted with the prompt's
  probability alpha until the first rejection, so a sequence advances 1 + min(k, Geometric) tokens
  (never past its output length). Under greedy decoding which drafts are right is a property of
  the prompt, not of the run: `match` fixes it per prompt and output position, so every cell and
  repeat of a prompt accepts the same drafts (only the batch's timing differs). The step costs
  `rho(b)` plain decode steps at batch size b (with `spec_ctx`, its context terms cost `spec_ctx` times
  a plain step's instead: rho then grows with the context, as verifying k + 1 tokens does). A per-batch-size schedule (`on(b)`) switches
  drafting off at some batch sizes (vLLM's num_speculative_tokens_per_batch_size: decided per
  step, by the running batch); a switched-off step costs `off_cost` plain steps (the price of the
  switch itself).
- **Chunked prefill.** With a `budget` (tokens a step, vLLM's max_num_batched_tokens), a step serves
  the decoding sequences first (1 token each, 1 + k while drafting), then the waiting prompts in the
  order they were sent, each taking what is left of the budget; a prompt longer than that is prefilled
  over several steps and yields its first token at the last (vLLM's V1 scheduler); the step's
  speculative cost `rho(b)` and its schedule `on(b)` then read b as its decoding sequences (a prompt
  waiting for its chunks is verified by no step). Without one, every waiting prompt is prefilled in the
  step that admits it, and b counts it in that step.
- **Prefix cache.** `cached` (per request) prompt tokens are served from the cache: its prefill
  computes only the rest (a cell's later passes resend its prompts).

Every replication (one cell) is simulated at once with the others of the same concurrency and
suite size (numpy over a (cells, C) array); a server session's run-to-run speed multiplies every
step of its cells, and a closed loop with no think time is invariant to that scale, so speed is
applied to the result (`Served.scaled`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Engine:
    """A server's cost model (seconds). The defaults resemble a small model on one GPU: about 12 ms a
    step at batch 1, about 25 ms at batch 16 over 200-token prompts."""
    step_s: float = 0.010
    seq_s: float = 0.0004
    ctx_s: float = 2e-6
    prefill_s: float = 2e-5
    jitter: float = 0.05
    hiccup_p: float = 0.003
    hiccup_s: float = 0.03
    speed: float = 1.0                      # every cost (stalls too) divided by it: a uniformly faster server
    k: int = 0                              # drafted tokens per speculative step (0: plain decoding)
    rho: float | Callable[[int], float] = 1.0  # a speculative step, in plain decode steps, at batch size b
    on: Callable[[int], bool] | None = None    # batch size -> drafts (None: always, when k > 0)
    off_cost: float = 1.0                   # a plain step's cost where a schedule switched drafting off
    ctx2_s: float = 0.0                     # per decoding sequence per (thousand tokens of its context)^2
    spec_ctx: float = 0.0                   # >0: a drafting step's context terms cost this many times a plain
                                            # step's (verifying k + 1 tokens attends k + 1 times), not rho
    budget: float = float("inf")            # tokens a step schedules (chunked prefill; inf: a prompt in one step)

    def faster(self, factor: float) -> "Engine":
        return replace(self, speed=self.speed * factor)


@dataclass
class Served:
    """Per request (cells x requests, in the suite's order): when it was sent, its TTFT and end-to-end
    latency, and its speculative steps and accepted tokens (vLLM's per-request counters); per cell,
    its duration (first send to last completion)."""
    start: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    steps: np.ndarray
    accepted: np.ndarray
    drafted: np.ndarray
    duration: np.ndarray
    positions: np.ndarray | None = None     # per cell, the drafting steps that accepted draft position p
                                            # (vLLM's num_accepted_tokens_per_pos)

    def scaled(self, factor: np.ndarray) -> "Served":
        """Every time multiplied by a per-cell factor (a session's or cell's run-to-run speed)."""
        f = np.asarray(factor, float).reshape(-1, 1)
        return replace(self, start=self.start * f, ttft=self.ttft * f, e2e=self.e2e * f, duration=self.duration * f[:, 0])

    def row(self, i: int) -> "Served":
        return Served(self.start[i], self.ttft[i], self.e2e[i], self.steps[i], self.accepted[i], self.drafted[i],
                      self.duration[i:i + 1], None if self.positions is None else self.positions[i])


def _table(engines: list[Engine], c: int, what: str) -> np.ndarray:
    """Per cell and batch size 0..c: whether drafting is on (`on`) or a speculative step's cost (`rho`)."""
    out = np.zeros((len(engines), c + 1))
    cache: dict = {}
    for i, e in enumerate(engines):
        key = (e.on, e.rho, e.k)
        if key not in cache:
            if what == "on":
                cache[key] = [float(e.k > 0 and (e.on is None or bool(e.on(b)))) for b in range(c + 1)]
            else:
                cache[key] = [float(e.rho(b) if callable(e.rho) else e.rho) for b in range(c + 1)]
        out[i] = cache[key]
    return out


SERIAL_SPLIT = 32   # one worker serving more requests than this is simulated request by request (serve)


def _one_by_one(engines: list, pt: np.ndarray, ot: np.ndarray, rng: np.random.Generator, alpha, match, pace,
                cached) -> Served:
    """serve at c=1 of M cells of n requests as M x n cells of one request each, laid end to end."""
    M, n = pt.shape

    def flat(x, tail=()):
        return None if x is None else np.broadcast_to(np.asarray(x), (M, n) + tail).reshape((M * n, 1) + tail)

    one = serve([e for e in engines for _ in range(n)], 1, pt.reshape(-1, 1), ot.reshape(-1, 1), rng,
                flat(alpha, ()), None if match is None else flat(match, np.shape(match)[-1:]), flat(pace, ()),
                None, flat(cached, ()))
    e2e = one.e2e.reshape(M, n)
    end = np.cumsum(e2e, axis=1)
    return Served(end - e2e, one.ttft.reshape(M, n), e2e, one.steps.reshape(M, n), one.accepted.reshape(M, n),
                  one.drafted.reshape(M, n), end[:, -1], one.positions.reshape(M, n, -1).sum(1))


def serve(engines: Engine | list[Engine], c: int, prompt_tokens: np.ndarray, out_tokens: np.ndarray,
          rng: np.random.Generator, alpha: np.ndarray | None = None, match: np.ndarray | None = None,
          pace: np.ndarray | None = None, session: np.ndarray | None = None,
          cached: np.ndarray | None = None) -> Served:
    """Simulate cells: `engines` (one per cell, or one for all) serve `prompt_tokens`/`out_tokens`
    (cells x requests, each row in the order the workers send them) with `c` closed-loop workers.

    Speculative engines: `alpha` is each request's per-token acceptance probability, drawn afresh at
    every step; or `match` (cells x requests x positions, bool) says whether a draft of the output
    token at each position is right, fixed per prompt as greedy decoding makes it (the same prompt
    accepts the same drafts in every cell and repeat): a step at position p accepts the leading run
    of right drafts among positions p .. p+k-1.

    Plain engines: `pace` (cells x requests) is how many tokens of its output one decode step
    advances each request (default 1), fixed per prompt: how a server's speed varies by prompt
    (what acceptance does to a speculative server, abstracted from drafts). A request finishes at the
    first step its progress reaches its output length; its token counts are unchanged.

    Sessions: `session` (one label per request, the same for every cell) groups requests into
    sessions whose turns are consecutive in the order; a worker runs a session turn after turn (the
    next turn is sent when the previous one ends) and only then takes the next session, so a suite of
    as many sessions as workers is one wave whose batch shrinks as sessions end.

    `cached` (cells x requests): prompt tokens the prefix cache serves (not prefilled).

    One worker and no sessions: a cell's requests run one after another and nothing of one reaches the
    next, so a cell of many requests is served as that many cells of one request each and laid end to
    end (the same distribution; the loop runs a request's steps, not a suite's: a 512-prompt suite's c=1
    cells took minutes)."""
    pt = np.atleast_2d(np.asarray(prompt_tokens, float))
    ot = np.atleast_2d(np.asarray(out_tokens, np.int64))
    M, n = pt.shape
    if isinstance(engines, Engine):
        engines = [engines] * M
    if c == 1 and session is None and n > SERIAL_SPLIT and len(engines) == M and ot.shape == (M, n):
        return _one_by_one(engines, pt, ot, rng, alpha, match, pace, cached)
    if len(engines) != M or ot.shape != (M, n) or (ot < 1).any():
        raise ValueError("serve: one engine per cell and output lengths of at least one token")
    if any(not e.budget > 0 for e in engines):
        raise ValueError("serve: a step's token budget must be positive")
    al = np.zeros((M, n)) if alpha is None else np.broadcast_to(np.asarray(alpha, float), (M, n))
    par = {f: np.array([getattr(e, f) for e in engines], float)
           for f in ("step_s", "seq_s", "ctx_s", "prefill_s", "jitter", "hiccup_p", "hiccup_s", "speed", "k",
                     "off_cost", "ctx2_s", "spec_ctx", "budget")}
    on_t, rho_t = _table(engines, c, "on"), _table(engines, c, "rho")
    configured = par["k"] > 0
    kmax = int(max(par["k"].max(), 1))
    if match is not None:
        match = np.broadcast_to(np.asarray(match, bool), (M, n, match.shape[-1]))
    if pace is not None:
        if configured.any():
            raise ValueError("serve: a per-prompt pace is for plain engines (a speculative one has its drafts)")
        pace = np.broadcast_to(np.asarray(pace, float), (M, n))
        if (pace <= 0).any():
            raise ValueError("serve: a pace must be positive")
    # the queue of work: request indices a free worker takes next (a session's first turn); a turn's
    # successor (its session's next turn, -1: none) goes to the worker that ran it
    succ = np.full(n, -1)
    heads = np.arange(n)
    if session is not None:
        lab = np.asarray(session)
        if lab.shape != (n,) or any((lab[i + 1:] == lab[i]).any() and lab[i + 1] != lab[i] for i in range(n - 1)):
            raise ValueError("serve: a session's turns must be consecutive in the order")
        same = lab[1:] == lab[:-1]
        succ[:-1] = np.where(same, np.arange(1, n), -1)
        heads = np.flatnonzero(np.concatenate([[True], ~same]))
    H = len(heads)
    w = min(c, H)
    rows = np.arange(M)[:, None]
    slot = np.tile(heads[:w], (M, 1))                 # request index per worker slot (-1: idle)
    todo = pt if cached is None else np.maximum(pt - np.broadcast_to(np.asarray(cached, float), (M, n)), 0.0)
    fresh = np.ones((M, w), bool)                     # waiting for its first token: prefill
    pending = todo[:, heads[:w]].copy()               # its prompt tokens still to compute
    left = ot[:, heads[:w]].astype(float) if pace is not None else ot[:, heads[:w]].copy()
    ctx = pt[:, heads[:w]].copy()
    nxt = np.full(M, w)                               # the next head each cell's free workers take
    t = np.zeros(M)
    start, ttft, end = np.zeros((M, n)), np.zeros((M, n)), np.zeros((M, n))
    steps, acc = np.zeros((M, n)), np.zeros((M, n))
    positions = np.zeros((M, kmax))
    while True:
        active = slot >= 0
        live = active.any(1)
        if not live.any():
            break
        idx = np.where(active, slot, 0)
        dec = active & ~fresh
        pre = active & fresh
        # the batch a step's speculative cost and schedule read: its sequences, and under a budget only the
        # decoding ones (a prompt waiting for its chunks is not verified, and may wait many steps)
        b = np.where(np.isfinite(par["budget"]), dec.sum(1), active.sum(1))
        drafting = on_t[rows[:, 0], b] > 0
        # the budget: decodes first, then the waiting prompts' chunks in the order they were sent
        room = par["budget"] - np.where(drafting, 1 + par["k"], 1.0) * dec.sum(1)
        want = np.where(pre, pending, 0.0)
        order = np.argsort(np.where(pre, idx, n + 1), axis=1, kind="stable")
        queue = np.take_along_axis(want, order, 1)
        given = np.minimum(np.maximum(room[:, None] - (np.cumsum(queue, 1) - queue), 0.0), queue)
        chunk = np.zeros_like(want)
        np.put_along_axis(chunk, order, given, 1)
        first = pre & (chunk >= pending - 1e-9)
        context = par["ctx_s"] * (ctx * dec).sum(1) + par["ctx2_s"] * ((ctx / 1000) ** 2 * dec).sum(1)
        decode = par["step_s"] + par["seq_s"] * dec.sum(1)
        mult = np.where(drafting, rho_t[rows[:, 0], b], np.where(configured, par["off_cost"], 1.0))
        cmult = np.where(drafting & (par["spec_ctx"] > 0), par["spec_ctx"], mult)
        cost = (par["prefill_s"] * chunk.sum(1) + decode * mult + context * cmult) / par["speed"]
        cost *= np.exp(par["jitter"] * rng.standard_normal(M))
        stall = rng.random(M) < par["hiccup_p"]
        cost += np.where(stall, rng.exponential(1.0, M) * par["hiccup_s"] / par["speed"], 0.0)
        t = np.where(live, t + cost, t)
        # tokens this step: one from a finished prefill; 1 + accepted drafts from a decode
        gain = first.astype(np.int64)
        if configured.any():
            kk = par["k"][:, None]
            if match is None:
                a = al[rows, idx]
                with np.errstate(divide="ignore", invalid="ignore"):
                    geo = np.floor(np.log(rng.random((M, w))) / np.log(np.clip(a, 1e-12, 1 - 1e-12)))
            else:
                pos = (ot[rows, idx] - left)[:, :, None] + np.arange(kmax)            # output positions drafted
                right = match[rows[:, :, None], idx[:, :, None], np.minimum(pos, match.shape[2] - 1)]
                geo = np.cumprod(right & (np.arange(kmax) < kk[:, :, None]), axis=2).sum(2)
            extra = np.where(drafting[:, None] & dec, np.minimum(geo, kk), 0).astype(np.int64)
            g = np.minimum(1 + extra, left)
            gain = np.where(dec, g, gain)
            s_here = drafting[:, None] & dec
            np.add.at(steps, (np.broadcast_to(rows, idx.shape)[s_here], idx[s_here]), 1)
            np.add.at(acc, (np.broadcast_to(rows, idx.shape)[s_here], idx[s_here]), (g - 1)[s_here])
            positions += ((np.arange(kmax) < (g - 1)[:, :, None]) & s_here[:, :, None]).sum(1)
        elif pace is not None:
            gain = np.where(dec, pace[rows, idx], gain)
        else:
            gain = np.where(dec, 1, gain)
        gain = np.where(active, gain, 0)
        ttft[rows.repeat(w, 1)[first], idx[first]] = (t[:, None] - start[rows, idx])[first]
        left -= gain
        ctx += gain
        pending = np.where(pre, pending - chunk, pending)
        fresh &= ~first
        done = active & ~fresh & (left <= 1e-9)
        if done.any():
            end[rows.repeat(w, 1)[done], idx[done]] = np.broadcast_to(t[:, None], done.shape)[done]
            follow = succ[idx]                                   # the session's next turn, same worker
            cont = done & (follow >= 0)
            free = done & ~cont
            rank = np.cumsum(free, 1) - 1
            head = nxt[:, None] + rank
            took = free & (head < H)
            new = np.where(cont, follow, np.where(took, heads[np.minimum(head, H - 1)], -1))
            ok = cont | took
            slot = np.where(done, np.where(ok, new, -1), slot)
            nidx = np.where(ok, new, 0)
            start[rows.repeat(w, 1)[ok], nidx[ok]] = np.broadcast_to(t[:, None], ok.shape)[ok]
            left = np.where(ok, ot[rows, nidx], left)
            ctx = np.where(ok, pt[rows, nidx], ctx)
            pending = np.where(ok, todo[rows, nidx], pending)
            fresh = np.where(done, ok, fresh)
            nxt = np.minimum(nxt + free.sum(1), H)
    e2e = end - start
    drafted = steps * par["k"][:, None]
    return Served(start, ttft, e2e, steps, acc, drafted, end.max(1), positions)
