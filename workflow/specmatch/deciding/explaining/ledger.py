"""The session ledger: where a session's time goes on a server against another, turn by turn.

On agentic sessions speculation can gain in decoding what it loses in prefill: an engine that keeps
less of a session's history in the prefix cache (vLLM drops the last cached block of every request
when an EAGLE drafter is configured, `SpeculativeConfig.use_eagle_block_drop`) prefills more of every
turn. A session throughput ratio mixes the two; the ledger splits it.

Per turn of a session (paired with the other server's same session, turn and pass, in the same
repeat), from the request's own records:

- **prefill**: TTFT, the seconds before the first token: the uncached prompt's prefill (and, under
  load, the wait for a slot);
- **decode**: the seconds after it, taken at the other server's output length (its time per output
  token after the first, times the other's tokens after the first) so a different answer length is
  not counted as speed: (tokens per step) x (step cost), the decoding part;
- the prompt tokens and those the prefix cache served (`cached_tokens`).

A session's part is the sum over its turns. Per (server, against, suite, concurrency) the ledger
gives each part's mean difference per session (server - against, seconds: positive is time lost),
averaged over the repeats, with a Student t interval whose variance is the sessions' spread (s^2/n,
sessions - 1 dof: the sessions resampled whole, never their turns) plus the repeats' (the spread of
the repeat means over R, R - 1 dof: what server sessions move together), Satterthwaite's dof. The
cache's share of the prefill part is the extra uncached tokens per session times the server's own
prefill cost per uncached token (the least-squares slope of its TTFT on its turns' uncached tokens at
its lowest concurrency on the suite, where TTFT is prefill rather than the wait for a slot), with a
delta-method interval. Beside it, each session's throughput against the other's same session with its
verdict, as the sessions table defines it (stopping.session_speedup). By turn index the same differences, with the median context, show how
the split moves as the history grows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..verdicts.noise import VarianceSum
from ...records import Decision, Interval, Record
from ...stats import t_interval


@dataclass
class TurnLedger(Record):
    """One turn index: mean differences per paired turn (server - against, seconds), median context."""
    turn: int
    pairs: int
    context: Optional[float]
    hit_share: Optional[float]
    against_hit_share: Optional[float]
    prefill_s: float
    decode_s: float


@dataclass
class SessionLedger(Record):
    """A server's session time against another's (the baseline, or the arm's own parent), split into
    prefill and decoding (module docstring). Seconds per session, server - against: > 0 is time lost."""
    server: str
    against: str
    suite: str
    concurrency: int
    repeats: int
    sessions: int                                  # sessions paired whole in every repeat
    turns: int                                     # their turns (per repeat)
    hit_share: Optional[float] = None              # prompt tokens the prefix cache served, server
    against_hit_share: Optional[float] = None
    uncached_tokens: Optional[float] = None        # per session, server
    against_uncached_tokens: Optional[float] = None
    against_session_s: Optional[float] = None      # the other server's mean session time (prefill + decode)
    prefill: Optional[Interval] = None             # seconds per session, server - against
    decode: Optional[Interval] = None
    total: Optional[Interval] = None
    cache_part: Optional[Interval] = None          # of `prefill`: the extra uncached tokens at the server's rate
    prefill_ms_per_token: Optional[float] = None   # the server's TTFT slope on uncached tokens
    by_turn: list[TurnLedger] = field(default_factory=list)
    # each session's throughput against the other's same session, the sessions table's definition
    # (stopping.session_speedup: a bootstrap by session plus run to run), and its verdict
    speedup: Optional[Interval] = None
    verdict: Optional[Decision] = None
    prefill_cost_concurrency: Optional[int] = None  # where the prefill cost per token was fitted
    confidence: float = 0.9
    outputs_differ: int = 0                        # paired turns whose answers differ in length
    note: Optional[str] = None


def _say(led: SessionLedger, text: str) -> None:
    """Adds `text` to the ledger's note (a later finding never hides an earlier one)."""
    led.note = "; ".join(filter(None, [led.note, text]))


def _turns(rows: list[dict]) -> dict:
    """(session, pass, turn) -> the turn's figures, for the turns that succeeded."""
    out = {}
    for r in rows:
        if not r["ok"] or r["session_id"] is None or r["ttft_s"] is None or r["e2e_s"] is None:
            continue
        n = int(r["output_tokens"] or 0)
        out[(r["session_id"], r["pass_index"] or 0, r["turn"] or 0)] = {
            "ttft": float(r["ttft_s"]), "decode": max(float(r["e2e_s"]) - float(r["ttft_s"]), 0.0), "out": n,
            "prompt": r["prompt_tokens"], "cached": r["cached_tokens"]}
    return out


def _whole(turns: dict, first: dict) -> dict:
    """(session, pass) -> its turn numbers: the sessions whose turns succeeded from their first (`first`:
    (session, pass) -> the first turn the cell planned) on, without a gap."""
    per: dict = {}
    for s, p, t in turns:
        per.setdefault((s, p), set()).add(t)
    return {k: ts for k, ts in per.items() if min(ts) == first.get(k, 0) and ts == set(range(min(ts), min(ts) + len(ts)))}


def _firsts(rows: list[dict]) -> dict:
    """(session, pass) -> its first turn among every request the cell sent (failed ones too)."""
    out: dict = {}
    for r in rows:
        if r["session_id"] is not None:
            k = (r["session_id"], r["pass_index"] or 0)
            out[k] = min(out.get(k, r["turn"] or 0), r["turn"] or 0)
    return out


def _estimate(per_session: np.ndarray, run: VarianceSum | None = None) -> tuple[float, float, float] | None:
    """(estimate, se, dof) of the mean over repeats (rows) of the mean over sessions (columns): the
    sessions' spread plus the repeat means' (module docstring); with one repeat, `run` (run to run
    measured elsewhere) in place of the repeat means'."""
    R, n = per_session.shape
    if n < 2:
        return None
    means = per_session.mean(1)
    parts = VarianceSum().add(("sessions",), float(per_session.mean(0).var(ddof=1)) / n, n - 1)
    if R >= 2:
        parts.add(("repeats",), float(np.var(means, ddof=1)) / R, R - 1)
    else:
        parts.plus(run)
    return float(means.mean()), math.sqrt(parts.total), parts.dof if parts.total > 0 else float(n - 1)


def _interval(got: tuple[float, float, float] | None, confidence: float) -> Interval | None:
    if got is None:
        return None
    est, se, dof = got
    return Interval(est, *t_interval(est, se, dof, confidence))


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares slope of ys on xs and its variance; None without a spread of xs."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if x.size < 3 or np.ptp(x) <= 0:
        return None
    xc = x - x.mean()
    b = float((xc * (y - y.mean())).sum() / (xc * xc).sum())
    resid = y - y.mean() - b * xc
    return b, float((resid ** 2).sum() / (x.size - 2) / (xc * xc).sum())


def session_ledger(by: dict, server: str, against: str, suite: str, c: int, confidence: float = 0.9,
                   rr=None) -> SessionLedger | None:
    """The ledger of `server` against `against` on session suite `suite` at concurrency `c` (module
    docstring); `by`: cell key -> (cell, request rows); `rr` (noise.RunToRun): with one repeat, the
    run-to-run variation of each server's end-to-end latency, applied to its mean prefill and
    decoding time per session. None where neither measured it."""
    reps = sorted(k[3] for k in by if k[:3] == (server, suite, c) and (against, suite, c, k[3]) in by)
    if not reps:
        return None
    led = SessionLedger(server, against, suite, c, len(reps), 0, 0, confidence=confidence)
    mine = {r: _turns(by[(server, suite, c, r)][1]) for r in reps}
    theirs = {r: _turns(by[(against, suite, c, r)][1]) for r in reps}
    # sessions whole on both servers in every repeat, with the same turns
    common = None
    for r in reps:
        a = _whole(mine[r], _firsts(by[(server, suite, c, r)][1]))
        b = _whole(theirs[r], _firsts(by[(against, suite, c, r)][1]))
        here = {(k, frozenset(a[k])) for k in a.keys() & b.keys() if a[k] == b[k]}
        common = here if common is None else common & here
    turns_of = dict(common or [])
    sessions = sorted(turns_of)
    led.sessions = len(sessions)
    if len(sessions) < 2:
        led.note = f"{len(sessions)} session(s) whole on both servers in every repeat: no ledger"
        return led
    turn_keys = [(s, p, t) for s, p in sessions for t in sorted(turns_of[(s, p)])]
    led.turns = len(turn_keys)
    # per repeat and session: this server's prefill and decoding, the other's; the extra tokens it prefilled
    times = np.zeros((4, len(reps), len(sessions)))
    extra = np.zeros((len(reps), len(sessions)))
    at = {k: i for i, k in enumerate(sessions)}
    by_turn: dict = {}
    cached = {"mine": [0.0, 0.0], "theirs": [0.0, 0.0]}
    uncached = {"mine": 0.0, "theirs": 0.0}
    xs, ys = [], []
    one_token = 0
    for i, r in enumerate(reps):
        pooled = [f for f in (mine[r][k] for k in turn_keys) if f["out"] > 1]
        cell_tpot = sum(f["decode"] for f in pooled) / sum(f["out"] - 1 for f in pooled) if pooled else 0.0
        for key in turn_keys:
            m, o = mine[r][key], theirs[r][key]
            j = at[key[:2]]
            # a one-token answer has no time per token of its own: the server's, over its other turns here
            one_token += m["out"] <= 1 < o["out"]
            tpot_m = m["decode"] / (m["out"] - 1) if m["out"] > 1 else cell_tpot
            dec_m = tpot_m * max(o["out"] - 1, 0)     # at the other server's output length
            p_diff, d_diff = m["ttft"] - o["ttft"], dec_m - o["decode"]
            times[:, i, j] += (m["ttft"], dec_m, o["ttft"], o["decode"])
            led.outputs_differ += m["out"] != o["out"]
            row = by_turn.setdefault(key[2], {"pairs": 0, "p": 0.0, "d": 0.0, "ctx": [], "mc": [0.0, 0.0],
                                               "tc": [0.0, 0.0]})
            row["pairs"] += 1
            row["p"] += p_diff
            row["d"] += d_diff
            if m["prompt"] is not None:
                row["ctx"].append(m["prompt"])
            for who, f, acc in (("mine", m, row["mc"]), ("theirs", o, row["tc"])):
                if f["prompt"] and f["cached"] is not None:
                    cached[who][0] += f["cached"]
                    cached[who][1] += f["prompt"]
                    acc[0] += f["cached"]
                    acc[1] += f["prompt"]
                    uncached[who] += f["prompt"] - f["cached"]
            if m["prompt"] and m["cached"] is not None and o["prompt"] and o["cached"] is not None:
                extra[i, j] += (m["prompt"] - m["cached"]) - (o["prompt"] - o["cached"])
    n_sessions = len(reps) * len(sessions)
    if cached["mine"][1]:
        led.hit_share = cached["mine"][0] / cached["mine"][1]
        led.uncached_tokens = uncached["mine"] / n_sessions
    if cached["theirs"][1]:
        led.against_hit_share = cached["theirs"][0] / cached["theirs"][1]
        led.against_uncached_tokens = uncached["theirs"] / n_sessions
    prefill, decode = times[0] - times[2], times[1] - times[3]
    led.against_session_s = float((times[2] + times[3]).mean())
    if one_token:
        led.note = f"{one_token} turn(s) answered in one token here: decoding at this server's time per token"
    run: dict = {}
    if len(reps) == 1:
        ts, ta = (rr.at("e2el", x, c) if rr is not None else None for x in (server, against))
        if ts is None or ta is None:
            _say(led, "one repeat and no run-to-run measure: the intervals hold the sessions' spread only")
        else:   # a server's session time moves by its run-to-run factor; its parts with it
            mp, md, op, od = (float(x.mean()) for x in times)
            for part, (a, b) in (("prefill", (mp, op)), ("decode", (md, od)), ("total", (mp + md, op + od))):
                run[part] = VarianceSum().plus(ts, a * a).plus(ta, b * b)
    led.prefill = _interval(_estimate(prefill, run.get("prefill")), confidence)
    led.decode = _interval(_estimate(decode, run.get("decode")), confidence)
    led.total = _interval(_estimate(prefill + decode, run.get("total")), confidence)
    # the prefill cost per uncached token where TTFT is prefill and little else: the server's lowest
    # concurrency on this suite (under load TTFT is mostly the wait for a slot)
    low = min(k[2] for k in by if k[:2] == (server, suite))
    led.prefill_cost_concurrency = low
    for k in sorted(x for x in by if x[:3] == (server, suite, low)):
        for f in _turns(by[k][1]).values():
            if f["prompt"] and f["cached"] is not None:
                xs.append(f["prompt"] - f["cached"])
                ys.append(f["ttft"])
    fit = _slope(xs, ys)
    tokens = _estimate(extra)
    if fit is not None and fit[0] <= 0:
        fit = None   # TTFT did not grow with the uncached tokens there: no prefill cost per token to apply
        _say(led, f"no prefill cost per uncached token: TTFT did not grow with it at c={low}")
    if fit is not None and tokens is not None and led.hit_share is not None and led.against_hit_share is not None:
        (b, var_b), (tok, se_tok, dof) = fit, tokens
        led.prefill_ms_per_token = 1000 * b
        # delta method: the slope's variance and the extra tokens' are independent parts
        led.cache_part = _interval((b * tok, math.sqrt((b * se_tok) ** 2 + tok ** 2 * var_b), dof), confidence)
    for turn in sorted(by_turn):
        row = by_turn[turn]
        led.by_turn.append(TurnLedger(
            turn, row["pairs"], float(np.median(row["ctx"])) if row["ctx"] else None,
            row["mc"][0] / row["mc"][1] if row["mc"][1] else None, row["tc"][0] / row["tc"][1] if row["tc"][1] else None,
            row["p"] / row["pairs"], row["d"] / row["pairs"]))
    return led
