"""Natural stopping and sessions: whether two servers did the same work, how much was decoded past the
model's own end, and what a session suite's sessions did.

- **Same tokens?** With greedy decoding a lossless speculative server writes exactly the baseline's
  tokens, so both do the same work and a throughput ratio compares like with like. Per (server,
  suite, concurrency), each request is paired with the baseline's request of the same prompt (a
  session suite: turn), pass and repeat, and their outputs compared: token ids where the engine
  returned them (the first position where they differ is the divergence), else a hash of the text.
  A session's turns after its first divergence are not compared (their histories differ). The
  baseline against itself across repeats is the floor: an engine that is not batch-invariant can
  change a greedy output between runs, and a server that diverges no more than that is not lossy.
  Where outputs diverge under natural stopping (`ignore_eos: false`), the two servers generated
  different amounts: their throughput verdicts compare different work, their TPOT (per token) does not.
- **Past the end.** With `ignore_eos: true` every output runs to max_tokens; the tokens after the
  model's first end-of-sequence/stop token (measured per request from its token ids:
  client.natural_stop) are text the model would not have written. Per (server, suite): their share
  of the output tokens measured, and a warning above measuring.summary.PAST_STOP_WARNING.
- **Sessions.** Per (server, session suite, concurrency): the sessions whole and cut short (by reason),
  the turns sent, failed and not sent, the share of prompt tokens served from the prefix cache, the
  median TTFT by turn (the prefix cache at work), and each session's own throughput (its output
  tokens over its wall time, first turn sent to last token) against the baseline's same session,
  over the sessions both completed: a ratio of sums, a bootstrap by session (the same draw in every
  repeat) plus the run-to-run variance of end-to-end latency over R repeats (noise.RunToRun), with a
  verdict in the usual wording.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .ledger import SessionLedger, session_ledger
from ..verdicts.comparison import decision
from ..reading.measurements import Measurements, Settings
from ..verdicts.noise import RunToRun, VarianceSum, repeat_mean_variance
from ...controls import is_cache_arm, parent
from ...measuring.summary import PAST_STOP_WARNING
from ...records import Decision, Interval, Record
from ...resample import draws
from ...stats import describe, t_interval

EXAMPLES = 5


@dataclass
class OutputAgreement(Record):
    """A server's outputs against the baseline's at one (suite, concurrency), request by request."""
    server: str
    suite: str
    concurrency: int
    against: str
    compared: int = 0                        # request pairs with both outputs recorded
    identical: int = 0
    differ: int = 0
    same_length: int = 0                     # of those that differ: as many tokens on both servers
    not_compared: int = 0                    # no output recorded, or a session turn after a divergence
    first_divergence: Optional[dict] = None  # describe() of the first differing token position
    examples: list = field(default_factory=list)
    baseline_floor: Optional[dict] = None    # {compared, identical}: the baseline against its own first repeat
    ignore_eos: Optional[bool] = None

    @property
    def same_work(self) -> bool:
        return self.compared > 0 and self.differ == 0


@dataclass
class PastStop(Record):
    """Output tokens generated after the model's natural stop, pooled over a (server, suite)'s cells."""
    server: str
    suite: str
    ignore_eos: Optional[bool]
    requests: int                            # requests whose natural stop was measured
    output_tokens: int
    past_stop_tokens: int
    share: Optional[float]
    requests_past: int                       # requests with tokens past their stop
    warn: bool = False


@dataclass
class SessionSummary(Record):
    """A session suite's sessions on one server at one concurrency, pooled over repeats."""
    server: str
    suite: str
    concurrency: int
    repeats: int
    sessions: int = 0
    completed: int = 0
    cut_short: dict = field(default_factory=dict)
    turns_sent: int = 0
    turns_failed: int = 0
    turns_not_sent: int = 0
    answers: Optional[str] = None
    prefix_cache_hit_share: Optional[float] = None
    ttft_ms_by_turn: dict = field(default_factory=dict)        # turn -> median TTFT (ms)
    context_by_turn: dict = field(default_factory=dict)        # turn -> median context (prompt tokens)
    session_throughput: Optional[Interval] = None              # against the baseline's same sessions
    verdict: Optional[Decision] = None
    paired_sessions: int = 0
    confidence: float = 0.9
    run_to_run: bool = False


@dataclass
class StoppingReport(Record):
    """`results/summary/stopping.json`."""
    agreement: list[OutputAgreement] = field(default_factory=list)
    past_stop: list[PastStop] = field(default_factory=list)
    sessions: list[SessionSummary] = field(default_factory=list)
    ledgers: list[SessionLedger] = field(default_factory=list)   # where session time goes (explaining.ledger)
    warning_share: float = PAST_STOP_WARNING


# -- reading the records ---------------------------------------------------------------------------
def first_difference(a: list, b: list) -> int | None:
    """The first position where two token sequences differ (the shorter one's length if one is a
    prefix of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def same_output(x: dict, y: dict) -> tuple[bool, int | None]:
    """(identical, first differing token position where token ids tell it)."""
    ia, ib = x.get("output_token_ids"), y.get("output_token_ids")
    if ia is not None and ib is not None and len(ia) and len(ib):
        pos = first_difference(list(ia), list(ib))
        return pos is None, pos
    return x["output_sha256"] == y["output_sha256"], None


def compare_outputs(mine: list[dict], theirs: list[dict]) -> tuple[int, int, int, int, list, list]:
    """(compared, identical, same length among differing, not compared, divergence positions, examples)
    of one repeat's pairs; a session's turns after its first divergence are not compared."""
    key = lambda r: (r["prompt_id"], r["pass_index"])  # noqa: E731
    other = {key(r): r for r in theirs if r["ok"]}
    compared = identical = same_len = skipped = 0
    positions, examples, diverged = [], [], set()
    for r in sorted(mine, key=lambda r: (r["session_id"] or "", r["pass_index"] or 0, r["turn"] or 0, r["prompt_id"])):
        o = other.get(key(r))
        sess = (r["session_id"], r["pass_index"]) if r["session_id"] else None
        if (not r["ok"] or o is None or r["output_sha256"] is None or o["output_sha256"] is None
                or (sess is not None and sess in diverged)):
            skipped += 1
            continue
        compared += 1
        same, pos = same_output(r, o)
        if same:
            identical += 1
            continue
        same_len += r["output_tokens"] == o["output_tokens"]
        if pos is not None:
            positions.append(pos)
        if sess is not None:
            diverged.add(sess)
        if len(examples) < EXAMPLES:
            examples.append({"prompt_id": r["prompt_id"], "position": pos,
                             "tokens": [r["output_tokens"], o["output_tokens"]]})
    return compared, identical, same_len, skipped, positions, examples


# -- the report -------------------------------------------------------------------------------------
def stopping_report(m: Measurements, baseline: str, rr: RunToRun | None = None) -> StoppingReport:
    """Output agreement with the baseline, tokens past the natural stop, and the session suites'
    sessions, from every cell's request records (module docstring)."""
    settings = m.settings
    by = {k: (cell, m.rows(k)) for k, cell in m.cells.items()}
    rep = StoppingReport()
    configs = sorted({k[:3] for k in by})
    for server, suite, c in configs:
        reps = sorted(k[3] for k in by if k[:3] == (server, suite, c))
        if server == baseline:
            continue
        base_reps = [r for r in reps if (baseline, suite, c, r) in by]
        if base_reps:
            rep.agreement.append(agreement(by, server, baseline, suite, c, base_reps))
    for server, suite in sorted({k[:2] for k in by}):
        keys = [k for k in by if k[:2] == (server, suite)]
        got = past_stop(by, keys, server, suite)
        if got is not None:
            rep.past_stop.append(got)
    for server, suite, c in configs:
        keys = sorted(k for k in by if k[:3] == (server, suite, c))
        if any(by[k][0].sessions is not None for k in keys):
            rep.sessions.append(session_summary(by, keys, baseline, settings, rr))
            # the ledger against the baseline, and a cache arm's against the server it is the arm of
            for against in dict.fromkeys([baseline] + ([parent(server)] if is_cache_arm(server) else [])):
                if against != server:
                    led = session_ledger(by, server, against, suite, c, settings.confidence, rr)
                    if led is not None:
                        rep.ledgers.append(with_session_speedup(led, by, keys, settings, rr))
    return rep


def agreement(by: dict, server: str, baseline: str, suite: str, c: int, reps: list[int]) -> OutputAgreement:
    a = OutputAgreement(server, suite, c, baseline, ignore_eos=by[(server, suite, c, reps[0])][0].ignore_eos)
    positions = []
    for r in reps:
        n, same, same_len, skipped, pos, ex = compare_outputs(by[(server, suite, c, r)][1], by[(baseline, suite, c, r)][1])
        a.compared += n
        a.identical += same
        a.differ += n - same
        a.same_length += same_len
        a.not_compared += skipped
        positions += pos
        a.examples += [{**e, "repeat": r} for e in ex][:EXAMPLES - len(a.examples)]
    a.first_divergence = describe(positions)
    floor_reps = sorted(k[3] for k in by if k[:3] == (baseline, suite, c))
    if len(floor_reps) >= 2:
        first = by[(baseline, suite, c, floor_reps[0])][1]
        n = same = 0
        for r in floor_reps[1:]:
            got = compare_outputs(by[(baseline, suite, c, r)][1], first)
            n, same = n + got[0], same + got[1]
        a.baseline_floor = {"compared": n, "identical": same}
    return a


def past_stop(by: dict, keys: list, server: str, suite: str) -> PastStop | None:
    rows = [r for k in keys for r in by[k][1] if r["ok"] and r["past_stop_tokens"] is not None and r["output_tokens"]]
    if not rows:
        return None
    eos = {by[k][0].ignore_eos for k in keys}
    out = sum(r["output_tokens"] for r in rows)
    past = sum(r["past_stop_tokens"] for r in rows)
    share = past / out if out else None
    return PastStop(server, suite, eos.pop() if len(eos) == 1 else None, len(rows), out, past, share,
                    sum(r["past_stop_tokens"] > 0 for r in rows), bool(share is not None and share > PAST_STOP_WARNING))


def session_summary(by: dict, keys: list, baseline: str, settings: Settings, rr: RunToRun | None) -> SessionSummary:
    server, suite, c = keys[0][:3]
    out = SessionSummary(server, suite, c, len(keys), confidence=settings.confidence)
    rows = []
    for k in keys:
        o = by[k][0].sessions
        if o is not None:
            out.sessions += o.sessions
            out.completed += o.completed
            out.turns_sent += o.turns_sent
            out.turns_failed += o.turns_failed
            out.turns_not_sent += o.turns_not_sent
            out.answers = o.answers
            for reason, n in o.cut_short.items():
                out.cut_short[reason] = out.cut_short.get(reason, 0) + n
        rows += [r for r in by[k][1] if r["ok"]]
    cached = [r for r in rows if r["cached_tokens"] is not None and r["prompt_tokens"]]
    if cached:
        out.prefix_cache_hit_share = sum(r["cached_tokens"] for r in cached) / sum(r["prompt_tokens"] for r in cached)
    for t in sorted({r["turn"] for r in rows if r["turn"] is not None}):
        here = [r for r in rows if r["turn"] == t]
        ttft = [r["ttft_s"] * 1000 for r in here if r["ttft_s"] is not None]
        ctx = [r["prompt_tokens"] for r in here if r["prompt_tokens"] is not None]
        if ttft:
            out.ttft_ms_by_turn[str(t)] = float(np.median(ttft))
        if ctx:
            out.context_by_turn[str(t)] = float(np.median(ctx))
    if server != baseline:
        session_speedup(out, by, keys, baseline, settings, rr)
    return out


def with_session_speedup(led: SessionLedger, by: dict, keys: list, s: Settings, rr: RunToRun | None) -> SessionLedger:
    """The ledger with its pair's session throughput and verdict, as the sessions table defines them."""
    got = SessionSummary(led.server, led.suite, led.concurrency, len(keys), confidence=s.confidence)
    session_speedup(got, by, keys, led.against, s, rr)
    led.speedup, led.verdict = got.session_throughput, got.verdict
    return led


def session_rates(rows: list[dict]) -> dict:
    """(session, pass) -> (output tokens, wall seconds, turns) of the sessions whose every sent turn succeeded."""
    per: dict = {}
    for r in rows:
        if r["session_id"] is None:
            continue
        per.setdefault((r["session_id"], r["pass_index"]), []).append(r)
    out = {}
    for k, turns in per.items():
        if not all(t["ok"] for t in turns) or any(t["e2e_s"] is None for t in turns):
            continue
        start = min(t["start_s"] for t in turns)
        end = max(t["start_s"] + t["e2e_s"] for t in turns)
        if end > start:
            out[k] = (float(sum(t["output_tokens"] or 0 for t in turns)), end - start, len(turns))
    return out


def session_speedup(out: SessionSummary, by: dict, keys: list, baseline: str, s: Settings, rr: RunToRun | None) -> None:
    """Each session's throughput against the baseline's same session (whole on both, the same turns),
    a ratio of sums per repeat, averaged in logs over the repeats (module docstring)."""
    server, suite, c = keys[0][:3]
    pairs = []
    for k in keys:
        b = (baseline, suite, c, k[3])
        if b in by:
            mine, theirs = session_rates(by[k][1]), session_rates(by[b][1])
            pairs.append({x: (mine[x], theirs[x]) for x in mine.keys() & theirs.keys() if mine[x][2] == theirs[x][2]})
    common = sorted(set.intersection(*(set(p) for p in pairs))) if pairs else []
    out.paired_sessions = len(common)
    if len(common) < 2:
        return
    draw = draws(s.rng("sessions", server, baseline, suite, c), len(common), s.bootstrap)
    logs, boots = [], []
    for p in pairs:
        tok_s = np.array([p[x][0][0] for x in common])
        dur_s = np.array([p[x][0][1] for x in common])
        tok_b = np.array([p[x][1][0] for x in common])
        dur_b = np.array([p[x][1][1] for x in common])
        logs.append(math.log(tok_s.sum() / dur_s.sum()) - math.log(tok_b.sum() / dur_b.sum()))
        with np.errstate(divide="ignore", invalid="ignore"):
            boots.append(np.log(tok_s[draw].sum(1) / dur_s[draw].sum(1)) - np.log(tok_b[draw].sum(1) / dur_b[draw].sum(1)))
    boots = np.array(boots)
    boots = boots[:, np.isfinite(boots).all(0)]
    R = len(logs)
    # a bootstrap's variance of a mean over n sessions is short by n / (n - 1) (as comparison.compare)
    parts = VarianceSum().add(("w", "sessions"), len(common) / (len(common) - 1) * repeat_mean_variance(boots),
                              len(common) - 1)
    ts = rr.at("e2el", server, c) if rr is not None else None
    tb = rr.at("e2el", baseline, c) if rr is not None else None
    run = R >= 2 and ts is not None and tb is not None
    if run:
        parts.plus(ts, 1 / R).plus(tb, 1 / R)
    est, se = float(np.mean(logs)), math.sqrt(parts.total)
    lo, hi = t_interval(est, se, parts.dof, s.confidence)
    out.session_throughput = Interval(math.exp(est), math.exp(lo), math.exp(hi))
    out.verdict = decision(lo, hi, math.log(1 + s.min_effect), run)
    out.run_to_run = run
