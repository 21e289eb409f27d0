"""Session suites replayed as agents send them: turn after turn of one conversation, each turn the
whole history so far (records.Session, written by the prompts step for `kind: session`).

A worker runs one session at a time, turn after turn on its own connection, so the concurrency is
the number of sessions in flight; the sessions are taken in a seeded order that is the same for
every server and concurrency (cell.plan_requests), so two servers answer the same sessions in the
same order. Turn t sends the rendered history (completions endpoint: the data's template text; chat:
its messages) with the served model's own answers to the earlier turns (`answers: live`: turn t
waits for answer t-1 and depends on it) or the recorded ones (`answers: recorded`: exactly the
training cut's prompt), and the user and tool turns as the data has them. The prefix cache is reset
once before the cell (cell.reset_cache), never between a session's turns, so a turn's history is
served from the cache as an agent's would be; every record says how much was (`cached_tokens`).

Every session is counted, whole or cut short, never dropped (records.SessionsOutcome): a failed turn
ends its session (a live session has no answer to go on with), and a session stops before a turn
whose context would exceed the suite's `max_prompt_tokens` or the served context (the server's
max_model_len less the turn's max_tokens), its reason recorded. A live turn's context is predicted
from the server's own usage: the previous turn's prompt and output tokens plus what the data adds
between them (SessionTurn.added_tokens).
"""
from __future__ import annotations

import asyncio
import gc
import ssl
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import requests as http

from ..config import keeps_busy, passes_for
from ..files import SpecmatchError
from ..records import Acceptance, Prompt, RequestRecord, RequestSettings, Session, SessionsOutcome
from .client import Request, send_request
from .protocols import max_tokens, protocol as protocol_of
from .transport import Connection

EXAMPLES = 5


def pass_salt(k: int, base: str | None = None) -> str:
    """The cache salt of a session suite's pass k (the same on every server: a pass is a pass); a salt the
    request extras already set is kept as its prefix."""
    return f"{base}-specmatch-pass-{k}" if base else f"specmatch-pass-{k}"


def session_passes(n_sessions: int, passes: int, min_per_worker: int | None, concurrency: int,
                   salt: str | None) -> int:
    """A session suite's passes: like a prompt suite's (config.passes_for), raised until every worker
    replays at least `min_per_worker` sessions (requests.min_requests_per_worker counts sessions here),
    where the engine has a cache salt (`salt`, Engine.cache_salt_field): each pass then replays its
    sessions under its own salt, so a second replay of a session cannot hit the blocks its first left
    and costs what the first did. Without one the configured passes stand (check_sessions says why the
    cell is one wave): a replay that hit its own cache would measure a cache nobody's traffic has."""
    if salt is None:
        return passes
    return passes_for(n_sessions, passes, min_per_worker, concurrency)


def check_sessions(n_sessions: int, passes: int, concurrency: int, suite: str, min_per_worker: int | None = 2,
                   no_salt: str | None = None) -> list[str]:
    """A session suite must keep `concurrency` sessions in flight (the same rule as a prompt suite's,
    config.keeps_busy, with sessions for prompts); fewer sessions per worker than `min_per_worker`
    (at least two) is a warning: the cell measures one wave, whose batch shrinks from the moment the
    first worker runs out of sessions (the verdicts' drain starts where the last session started:
    deciding.reading.measurements.Arrays.drain_from), not a steady state. `no_salt`: why the passes
    could not be raised."""
    n = n_sessions * passes
    if not keeps_busy(n_sessions, passes, concurrency):
        raise SpecmatchError(f"suite {suite}: {n_sessions} sessions x requests.passes {passes} = {n} cannot keep "
                             f"{concurrency} sessions in flight; raise suites.{suite}.size or drop that concurrency")
    want = max(2, min_per_worker or 0)
    if n < want * concurrency:
        return [f"{n} sessions at concurrency {concurrency}: each worker replays fewer than {want} sessions, so the "
                f"cell measures one wave of sessions rather than a steady state"
                + (f" (more passes would replay sessions on their own cache: {no_salt}; raise suites.{suite}.size)"
                   if no_salt else f" (raise suites.{suite}.size or requests.min_requests_per_worker)")]
    return []


def served_context(base_url: str, api_key: str | None = None) -> int | None:
    """The server's context length: `max_model_len` of its /v1/models card (vLLM 0.32:
    vllm/entrypoints/openai/models/serving.py:64-77); None where the server does not say."""
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = http.get(base_url + "/v1/models", timeout=30, headers=headers)
        data = r.json().get("data") if r.status_code == 200 else None
        v = data[0].get("max_model_len") if data else None
        return int(v) if isinstance(v, (int, float)) and v > 0 else None
    except (http.RequestException, ValueError, AttributeError, TypeError, IndexError):
        return None


def turn_prompt(session: Session, t: int, answers: list[str]) -> Prompt:
    """What turn t sends: the history with `answers` (one per earlier turn) in place of the recorded
    ones, as text (the template's rendering: text_0 + answer_0 + ... + text_t) and, where the suite
    has them, as messages (each turn's own messages, then the answer as the assistant's)."""
    turns = session.turns
    text = "".join(turns[k].text + answers[k] for k in range(t)) + turns[t].text
    messages = None
    if all(x.messages is not None for x in turns[:t + 1]):
        messages = []
        for k in range(t):
            messages += list(turns[k].messages) + [{"role": "assistant", "content": answers[k]}]
        messages += list(turns[t].messages)
    turn = turns[t]
    return Prompt(id=session.turn_id(t), suite=session.suite, source=session.source, file=session.file,
                  line=session.line, row=session.row, row_id=session.row_id, turn=turn.turn,
                  turns=session.turns_in_row or len(turns), text=text, messages=messages,
                  prompt_tokens=turn.prompt_tokens, reference_completion_tokens=turn.answer_tokens,
                  holdout=session.holdout)


def context_limit(session: Session, served: int | None, out_tokens: int) -> tuple[int | None, str]:
    """The longest context turn may have, and what sets it: the suite's max_prompt_tokens or the served
    context less the turn's output budget (a prompt plus its output must fit)."""
    limits = []
    if session.max_prompt_tokens:
        limits.append((session.max_prompt_tokens, f"max_prompt_tokens {session.max_prompt_tokens}"))
    if served:
        limits.append((served - out_tokens, f"served context {served} less max_tokens {out_tokens}"))
    if not limits:
        return None, ""
    return min(limits)


def next_context(session: Session, t: int, previous: RequestRecord | None) -> int:
    """Turn t's context in tokens: recorded answers (or turn 0) give the data's own count; a live turn
    adds what the data adds between the turns to the server's own count of the previous turn's prompt
    and output (its end-of-sequence token included, which the history re-adds as the template's
    end-of-turn marker: the prediction errs up by a token or so, never down)."""
    turn = session.turns[t]
    if t == 0 or session.answers == "recorded" or previous is None or previous.prompt_tokens is None \
            or previous.output_tokens is None:
        return turn.prompt_tokens
    return previous.prompt_tokens + previous.output_tokens + turn.added_tokens


@dataclass
class SessionRun:
    """One session of the plan (a session once per pass), and where its turns' records are indexed."""
    session: Session
    pass_index: int
    first_index: int


def plan_runs(runs: list[tuple[Session, int]]) -> list[SessionRun]:
    out, i = [], 0
    for s, k in runs:
        out.append(SessionRun(s, k, i))
        i += len(s.turns)
    return out


class Tally:
    """The sessions' outcome as they end (records.SessionsOutcome)."""

    def __init__(self, runs: list[SessionRun], answers: str):
        self.out = SessionsOutcome(sessions=len(runs), turns_planned=sum(len(r.session.turns) for r in runs),
                                   answers=answers)

    def cut(self, run: SessionRun, t: int, reason: str, why: str) -> None:
        o = self.out
        o.cut_short[reason] = o.cut_short.get(reason, 0) + 1
        o.turns_not_sent += len(run.session.turns) - t - (1 if reason == "failed" else 0)
        if len(o.examples) < EXAMPLES:
            o.examples.append({"session": run.session.id, "pass": run.pass_index, "turn": t, "reason": reason,
                               "why": why})


async def run_sessions(base_url: str, runs: list[tuple[Session, int]], concurrency: int, protocol: str, model: str,
                       settings: RequestSettings, extras: dict,
                       parse_acceptance: Callable[[dict], Acceptance | None] = lambda f: None,
                       api_key: str | None = None, served: int | None = None, stop_ids: frozenset | None = None,
                       record_outputs: bool = True, salt_field: str | None = None
                       ) -> tuple[list[RequestRecord], SessionsOutcome]:
    """Replay `runs` (session, pass) with `concurrency` sessions in flight; one record per turn sent, in
    plan order, and the sessions' outcome. `salt_field`: the engine's cache-salt request field
    (Engine.cache_salt_field), set to one value per pass where the plan has more than one, so a pass
    shares blocks among its own sessions (a common system prompt, a session's earlier turns) and never
    with another pass's replay of the same session."""
    proto = protocol_of(protocol)
    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"base_url {base_url!r}: expected http(s)://host[:port][/path]")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    tls = ssl.create_default_context() if u.scheme == "https" else None
    plan = plan_runs(runs)
    salted = salt_field is not None and len({r.pass_index for r in plan}) > 1
    answers_mode = plan[0].session.answers if plan else "live"
    tally = Tally(plan, answers_mode)
    conns = [Connection(u.hostname, u.port or (443 if tls else 80), headers, tls, u.path)
             for _ in range(min(concurrency, max(len(plan), 1)))]
    results: list[RequestRecord] = []
    gc_was_enabled = gc.isenabled()
    try:
        await asyncio.gather(*(c.connect() for c in conns), return_exceptions=True)
        gc.collect()
        gc.disable()   # no collector pauses inside the measured phase (client.run_load)
        t_origin = time.perf_counter()
        queue = list(reversed(plan))

        async def session(conn: Connection, run: SessionRun) -> None:
            s = run.session
            fields = {**extras, salt_field: pass_salt(run.pass_index, extras.get(salt_field))} if salted else extras
            live = s.answers == "live"
            answers: list[str] = []
            previous = None
            for t, turn in enumerate(s.turns):
                prompt = turn_prompt(s, t, answers)
                budget = max_tokens(prompt, settings)
                limit, what = context_limit(s, served, budget)
                need = next_context(s, t, previous)
                if limit is not None and need > limit:
                    tally.cut(run, t, "context", f"turn {t} needs about {need} tokens of context, over the {what}")
                    return
                req = Request(run.first_index + t, prompt.id, s.source, s.holdout,
                              proto.body(prompt, model, settings, fields), run.pass_index,
                              collect=record_outputs or live, stop_ids=stop_ids, session_id=s.id, turn=turn.turn)
                rec = await send_request(conn, req, proto, parse_acceptance, settings.timeout_s, t_origin,
                                         run.pass_index)
                results.append(rec)
                tally.out.turns_sent += 1
                if not rec.ok:
                    tally.out.turns_failed += 1
                    tally.cut(run, t, "failed", f"turn {t}: {rec.error}")
                    return
                answers.append(rec.output_text if live else turn.answer)
                if not record_outputs:
                    rec.output_token_ids, rec.output_sha256, rec.natural_stop, rec.past_stop_tokens = [], None, None, None
                previous = rec
            tally.out.completed += 1

        async def worker(conn: Connection) -> None:
            while queue:
                await session(conn, queue.pop())

        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        if gc_was_enabled:
            gc.enable()
        for c in conns:
            await c.close()
    return sorted(results, key=lambda r: r.index), tally.out


def read_suite(items: list[dict]) -> tuple[list[Prompt], list[Session] | None]:
    """A prompts/<suite>.jsonl file's lines: Prompts, or (a session suite) Sessions."""
    from ..records import is_session_line

    if items and is_session_line(items[0]):
        return [], [Session.from_json(x) for x in items]
    return [Prompt.from_json(x) for x in items], None


def describe_outcome(o: SessionsOutcome) -> str:
    """One line for the cell's log."""
    cut = ", ".join(f"{n} {k}" for k, n in sorted(o.cut_short.items())) or "none"
    return (f"{o.sessions} sessions ({o.answers} answers): {o.completed} whole, cut short: {cut}; turns {o.turns_sent} "
            f"sent of {o.turns_planned} ({o.turns_failed} failed, {o.turns_not_sent} not sent)")
