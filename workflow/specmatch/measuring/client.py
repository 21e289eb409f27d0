"""A streaming load generator that is never the bottleneck and never miscounts.

Plain asyncio over raw non-blocking HTTP/1.1 keep-alive sockets (one per worker, specmatch.measuring.transport),
parsed in the read callback itself (specmatch.measuring.sse): no framework between the socket and the clock.
What each endpoint sends and how its events are read is its protocol object (specmatch.measuring.protocols).
Token arrivals are
the kernel's receive timestamps where Linux gives them (SO_TIMESTAMPNS), so neither the client's
parsing nor the order in which it reads 256 sockets after one engine step enters TTFT, ITL or
end-to-end latency (bench/client_overhead.py measures the overhead against a server's own clock,
and the token rate against vLLM's own client). Closed loop by default (C workers, each sends its next request
when the previous one ends, as the original benchmark_parallel runs did); optionally open loop at a
request rate with gamma-distributed gaps (burstiness 1 = Poisson).

Per request we keep start, time to first token, the arrival time of every content event, end,
prompt/output tokens from the server's usage (or SGLang's meta_info), status and error text, and the
engine's per-request acceptance figures. Failures (HTTP errors, timeouts, streams cut short) are
records with `ok: false` and a reason, never dropped.
"""
from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import random
import ssl
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit
from .protocols import Protocol, protocol as protocol_of
from ..records import Acceptance, RequestRecord
from .transport import Connection, HTTPError


@dataclass
class Request:
    """One request to send. `payload` is the protocol's JSON body for its prompt (Protocol.body).
    `collect`: keep its output (text, token ids, finish reason: parses every event); `stop_ids`: the
    served model's end-of-sequence and stop token ids, where the natural stop is looked for."""
    index: int
    prompt_id: str
    source: str
    holdout: bool
    payload: dict
    pass_index: int = 0
    collect: bool = False
    stop_ids: frozenset | None = None
    session_id: str | None = None
    turn: int | None = None


def _timeout(seconds: float):
    if hasattr(asyncio, "timeout"):  # Python 3.11+
        return asyncio.timeout(seconds)

    class _Legacy:  # Python 3.10: cancel this task from a timer
        async def __aenter__(self):
            task = asyncio.current_task()
            self.handle = asyncio.get_running_loop().call_later(seconds, task.cancel)

        async def __aexit__(self, exc_type, exc, tb):
            self.handle.cancel()
            if exc_type is asyncio.CancelledError:
                raise asyncio.TimeoutError from exc
            return False

    return _Legacy()


# How the client's numbers are defined: written into every cell, so nobody has to guess.
DEFINITIONS = {
    "ttft": "arrival of the first stream chunk that carries choices (its text may be empty), as vLLM bench serve",
    "itl": "gaps between consecutive chunks that carry choices, as vLLM bench serve",
    "e2el": "arrival of the last chunk that carries choices (before the usage chunk and [DONE]), as vLLM bench "
            "serve; SGLang /generate: the last event that adds output tokens",
    "tpot": "(e2el - ttft) / (output tokens - 1), output tokens from the server's usage, as vLLM bench serve",
    "output_tokens": "usage.completion_tokens (SGLang: meta_info.completion_tokens), never counted from events",
    "arrival_clock": "kernel: the socket's receive timestamp of the bytes (SO_TIMESTAMPNS); read: when the client "
                     "read them",
    "duration": "from the first request's start to the last request's end (e2el)",
}


class RequestRun:
    """Collects one request's timings and counts while its events arrive (its protocol reads them)."""

    def __init__(self, req: Request, protocol: Protocol, parse_acceptance: Callable[[dict], Acceptance | None]):
        self.req, self.protocol, self.parse_acceptance = req, protocol, parse_acceptance
        self.arrivals: list[float] = []
        self.final: dict | None = None  # the event that carries the counts
        self.error: str | None = None
        self.tokens_seen = 0  # SGLang: the completion tokens reported so far (cumulative in every mode)
        self.collect = req.collect
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None

    def on_event(self, payload: bytes, now: float) -> None:
        self.protocol.on_event(self, payload, now)

    def record(self, start: float, end: float, t_origin: float, pass_index: int = 0) -> RequestRecord:
        rec = RequestRecord(
            index=self.req.index, prompt_id=self.req.prompt_id, source=self.req.source, holdout=self.req.holdout,
            pass_index=pass_index, start_s=start - t_origin,
            # e2e ends at the last token arrival (vLLM's definition), or at the response's end without one
            e2e_s=(self.arrivals[-1] if self.arrivals else end) - start,
            ttft_s=(self.arrivals[0] - start) if self.arrivals else None,
            arrivals_s=[a - start for a in self.arrivals],
            # token events that arrived in the same read as their stream's previous one: the server
            # wrote them separately, so the client (or the network) fell behind; their ITL reads as 0
            coalesced_events=sum(a == b for a, b in zip(self.arrivals, self.arrivals[1:])),
            error=self.error, session_id=self.req.session_id, turn=self.req.turn)
        counts = self.protocol.counts(self)
        if counts is not None:
            rec.prompt_tokens, rec.output_tokens = counts
            rec.cached_tokens = self.protocol.cached(self)
            acc = self.parse_acceptance(self.final)
            if acc is not None:
                rec.num_draft_tokens, rec.num_accepted_tokens = acc.num_draft_tokens, acc.num_accepted_tokens
                rec.num_spec_steps = acc.num_spec_steps
                rec.acceptance_length, rec.acceptance_rate = acc.acceptance_length, acc.acceptance_rate
        if self.collect:
            self.keep_output(rec)
        if rec.error is None:
            if rec.output_tokens is None:
                rec.error = "no usage: the stream carried no token counts (stream_options.include_usage?)"
            elif rec.output_tokens > 0 and not self.arrivals:
                rec.error = "no token events although usage reports output tokens"
            else:
                rec.ok = True
        return rec


    def keep_output(self, rec: RequestRecord) -> None:
        """The output as the server wrote it: its text (in memory only), a hash of the text, its token ids
        and the natural stop (output.natural_stop)."""
        text = "".join(self.text_parts)
        rec.output_text = text
        rec.output_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        rec.finish_reason = self.finish_reason
        rec.output_token_ids = list(self.token_ids)
        rec.natural_stop, rec.past_stop_tokens = natural_stop(self.token_ids, self.req.stop_ids, rec.output_tokens)


def natural_stop(ids: list[int], stop_ids: frozenset | None, output_tokens: int | None
                 ) -> tuple[int | None, int | None]:
    """(tokens up to and including the first end-of-sequence/stop token, tokens generated after it).

    Measured from the output's own token ids: the point a server that honours its end-of-sequence
    token (requests.ignore_eos: false) would have stopped at under the same greedy decoding. No stop
    token in the output: (None, 0). Not measurable (no token ids from the engine, or the served
    model's stop tokens unknown): (None, None)."""
    if not ids or not stop_ids:
        return None, None
    total = output_tokens if output_tokens is not None else len(ids)
    for i, t in enumerate(ids):
        if t in stop_ids:
            return i + 1, max(total - (i + 1), 0)
    return None, 0


async def send_request(conn: Connection, req: Request, protocol: Protocol, parse_acc, timeout: float,
                       t_origin: float, pass_index: int = 0) -> RequestRecord:
    """Send one request on an open keep-alive connection and read its stream to the end: its record, with
    times relative to `t_origin`. A timeout, an HTTP error, a broken connection or an unreadable stream is
    the record's `error`, not an exception: one failed request does not end a load run or a session
    replay (sessions.py)."""
    run = RequestRun(req, protocol, parse_acc)
    body = json.dumps(req.payload).encode()
    start = time.perf_counter()
    try:
        # asyncio.timeout runs the stream in this task; wait_for would schedule a new task, so at a
        # burst of C requests the last one would be written only after C-1 loop turns.
        async with _timeout(timeout):
            await conn.stream(protocol.path, body, run.on_event)
    except (asyncio.TimeoutError, TimeoutError):
        run.error = f"timeout: no complete response within {timeout:g} s"
        await conn.close()
    except HTTPError as exc:
        run.error = run.error or f"http: {exc}"
    except OSError as exc:
        run.error = f"connection: {type(exc).__name__}: {exc}"
        await conn.close()
    except (ValueError, json.JSONDecodeError) as exc:
        run.error = f"protocol: {exc}"
        await conn.close()
    # the end is when the response's last bytes arrived, not when this coroutine resumed: at high
    # concurrency many responses end in one engine step and are resumed one after another
    end = conn.completed_at if conn.completed_at is not None else time.perf_counter()
    rec = run.record(start, end, t_origin, pass_index)
    # which clock stamped the token arrivals, and the longest a read of this request waited for the client
    rec.arrival_clock = "kernel" if conn.kernel_stamps else "read"
    rec.read_lag_max_s = max(conn.read_lags) if conn.read_lags else None
    if run.final and "server_timing" in run.final:  # only the bench's own servers send this
        rec.server_timing = {**run.final["server_timing"], "client_start_abs": start,
                             "client_arrivals_abs": list(run.arrivals), "client_sent_abs": conn.sent_at,
                             "client_read_lags": list(conn.read_lags)}
    return rec


def run(coro):
    """Run a coroutine on uvloop when it is installed (it comes with vLLM): lower per-event
    overhead at high concurrency; the plain asyncio loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def run_load(base_url: str, requests: list[Request], concurrency: int, protocol: str,
                   parse_acceptance: Callable[[dict], Acceptance | None] = lambda f: None,
                   timeout: float = 600.0, api_key: str | None = None, warmup: list[Request] | None = None,
                   request_rate: float | None = None, burstiness: float = 1.0, seed: int = 0) -> list[RequestRecord]:
    """Send `requests` at `concurrency` over the endpoint `protocol` (a name in protocols.PROTOCOLS);
    return one record per request, in request order."""
    protocol = protocol_of(protocol)
    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"base_url {base_url!r}: expected http(s)://host[:port][/path]")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # https: certificates are verified against the system store (SSL_CERT_FILE adds a private CA)
    tls = ssl.create_default_context() if u.scheme == "https" else None
    default_port = 443 if tls else 80
    conns = [Connection(u.hostname, u.port or default_port, headers, tls, u.path) for _ in range(concurrency)]
    gc_was_enabled = gc.isenabled()
    try:
        # Open every connection before the clock starts: measured requests never pay TCP set-up.
        await asyncio.gather(*(c.connect() for c in conns), return_exceptions=True)
        if warmup:
            wq = list(warmup)

            async def warm(conn):
                while wq:
                    r = wq.pop()
                    await send_request(conn, r, protocol, parse_acceptance, timeout, 0.0)

            await asyncio.gather(*(warm(c) for c in conns[:max(1, min(len(warmup), concurrency))]))
        # No garbage-collector pauses inside the measured phase (they land on random tokens' ITL).
        gc.collect()
        gc.disable()
        t_origin = time.perf_counter()
        results: list[RequestRecord | None] = [None] * len(requests)
        if request_rate is None:
            next_i = 0

            async def worker(conn):
                nonlocal next_i
                while next_i < len(requests):
                    i = next_i
                    next_i += 1
                    results[i] = await send_request(conn, requests[i], protocol, parse_acceptance, timeout, t_origin,
                                            requests[i].pass_index)

            await asyncio.gather(*(worker(c) for c in conns))
        else:
            rng = random.Random(seed)
            free: asyncio.Queue = asyncio.Queue()
            for c in conns:
                free.put_nowait(c)

            async def fire(i):
                conn = await free.get()
                try:
                    results[i] = await send_request(conn, requests[i], protocol, parse_acceptance, timeout, t_origin,
                                            requests[i].pass_index)
                finally:
                    free.put_nowait(conn)

            tasks, t = [], 0.0
            theta = 1.0 / (request_rate * burstiness)
            for i in range(len(requests)):
                delay = t - (time.perf_counter() - t_origin)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(fire(i)))
                t += rng.gammavariate(burstiness, theta)
            await asyncio.gather(*tasks)
        return [r for r in results if r is not None]
    finally:
        if gc_was_enabled:
            gc.enable()
        for c in conns:
            await c.close()
