"""A streaming load generator that is never the bottleneck and never miscounts.

Plain asyncio over raw non-blocking HTTP/1.1 keep-alive sockets (one per worker), parsed in the read
callback itself (specmatch.sse): no framework between the socket and the clock. Token arrivals are
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
import json
import random
import re
import socket
import ssl
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from .records import RequestRecord
from .sse import ProtocolError, ResponseParser


@dataclass
class Request:
    """One request to send. `payload` is the protocol-specific JSON body (built by build_payload)."""
    index: int
    prompt_id: str
    source: str
    holdout: bool
    payload: dict
    pass_index: int = 0


def build_payload(protocol: str, prompt: dict, model: str, settings: dict, extras: dict | None = None) -> dict:
    """The request body for a prompt: sampling settings explicit, streaming with usage."""
    max_tokens = settings["max_tokens"]
    if settings.get("use_reference_length") and prompt.get("reference_completion_tokens"):
        # the training completion's own length, as the real traffic would produce (capped)
        max_tokens = min(max_tokens, prompt["reference_completion_tokens"])
    if protocol == "sglang-generate":
        body = {"text": prompt["text"], "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": settings["temperature"],
                                    "ignore_eos": settings["ignore_eos"]}}
    else:
        body = {"model": model, "max_tokens": max_tokens, "temperature": settings["temperature"],
                "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": settings["ignore_eos"]}
        if protocol == "openai-chat":
            if not prompt.get("messages"):
                raise ValueError(f"prompt {prompt.get('id')}: no messages to send to the chat endpoint (the data's "
                                 "chat template could not be split; use requests.endpoint: completions)")
            body["messages"] = prompt["messages"]
        else:
            body["prompt"] = prompt["text"]
    body.update(extras or {})
    return body


PATHS = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions",
         "sglang-generate": "/generate"}


class HTTPError(Exception):
    pass


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


# Kernel receive timestamps (Linux SO_TIMESTAMPNS; Python's socket module does not name it).
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
_TIMESPEC = struct.Struct("@ll")  # struct timespec: time_t and long seconds/nanoseconds
_ANCBUF = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_READ = 1 << 16


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to timestamp every segment this socket receives; False where it cannot."""
    if _SO_TIMESTAMPNS is None or not _ANCBUF:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def recv_stamped(sock: socket.socket, size: int) -> tuple[bytes, float | None]:
    """One read, and the kernel's receive time of its last segment (CLOCK_REALTIME seconds; None
    when the kernel attached none)."""
    data, anc, _flags, _addr = sock.recvmsg(size, _ANCBUF)
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(raw)
            return data, sec + nsec * 1e-9
    return data, None


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC (perf_counter's clock), from the tightest of three brackets.
    Kernel receive stamps are in real time; the client's other times are monotonic."""
    best = None
    for _ in range(3):
        a = time.perf_counter_ns()
        r = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


class Connection:
    """One keep-alive HTTP/1.1 connection that streams server-sent events.

    Token arrival times are the kernel's receive timestamps (SO_TIMESTAMPNS) where the platform
    gives them: when a batched engine step sends a token to 256 streams at once, the client reads the
    256 sockets one after another, and a user-space clock read would stamp the last stream's token
    later by the time spent parsing the other 255. The kernel stamps each segment as it arrives, so
    read order cannot bias TTFT or ITL; `read_lags` keeps how long each read waited for the client
    (a measure of whether the client keeps up, reported per cell). Elsewhere the read time is used.

    HTTPS goes through an in-memory TLS object (ssl.MemoryBIO) rather than an SSL socket, so the
    ciphertext is still read with recvmsg and keeps its kernel timestamp.
    """

    def __init__(self, host: str, port: int, headers: dict[str, str], tls: ssl.SSLContext | None = None):
        self.host, self.port = host, port
        self.headers = headers
        self.tls_context = tls
        self._tls: ssl.SSLObject | None = None
        self._tls_in = self._tls_out = None
        self.sock: socket.socket | None = None
        self.kernel_stamps = False
        self.sent_at: float | None = None  # when the last request was fully written
        self.read_lags: list[float] = []  # read time minus arrival time, per read of the last request
        self.completed_at: float | None = None  # arrival of the bytes that completed the last response
        self._offset_s = 0.0
        self._send_start = 0.0

    async def connect(self) -> None:
        if self.sock is not None:
            return
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        error: Exception | None = None
        for family, type_, proto, _name, addr in infos:
            sock = socket.socket(family, type_, proto)
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, addr)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            if self.tls_context is not None:
                try:
                    await self._handshake(loop, sock)
                except (OSError, ssl.SSLError) as exc:
                    sock.close()
                    raise ConnectionError(f"TLS handshake with {self.host}:{self.port}: {exc}") from None
            self.kernel_stamps = enable_kernel_stamps(sock)
            self.sock = sock
            return
        raise error or OSError(f"cannot resolve {self.host}:{self.port}")

    async def _handshake(self, loop, sock: socket.socket) -> None:
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = self.tls_context.wrap_bio(self._tls_in, self._tls_out, server_hostname=self.host)
        while True:
            try:
                self._tls.do_handshake()
                finished = True
            except ssl.SSLWantReadError:
                finished = False
            out = self._tls_out.read()
            if out:
                await loop.sock_sendall(sock, out)
            if finished:
                return
            data = await loop.sock_recv(sock, _READ)
            if not data:
                raise ConnectionError("connection closed during the handshake")
            self._tls_in.write(data)

    def _decrypt(self, data: bytes) -> tuple[bytes, bool]:
        """Plaintext from ciphertext just read, and whether the peer has closed."""
        if data:
            self._tls_in.write(data)
        else:
            self._tls_in.write_eof()
        parts, eof = [], not data
        while True:
            try:
                chunk = self._tls.read(_READ)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):  # close_notify, or a close without one
                eof = True
                break
            if not chunk:
                eof = True
                break
            parts.append(chunk)
        pending = self._tls_out.read()  # e.g. a key update's answer
        if pending and self.sock is not None:
            self.sock.sendall(pending)
        return b"".join(parts), eof

    async def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._tls = self._tls_in = self._tls_out = None

    async def stream(self, path: str, body: bytes, on_event: Callable[[bytes, float], None]) -> None:
        self.read_lags = []  # this request's, even if connecting or sending fails
        self.completed_at = None
        await self.connect()
        loop = asyncio.get_running_loop()
        sock = self.sock
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Content-Type: application/json",
                "Accept: text/event-stream", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        self._offset_s = realtime_offset_ns() / 1e9
        self._send_start = time.perf_counter()
        wire = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        if self._tls is not None:
            self._tls.write(wire)
            wire = self._tls_out.read()
        await loop.sock_sendall(sock, wire)
        self.sent_at = time.perf_counter()
        parser = ResponseParser(on_event)
        done = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, self._readable, sock, parser, done)
        try:
            try:
                await done
            finally:
                loop.remove_reader(fd)  # before any close: a closed fd left registered breaks the selector
        except ProtocolError as exc:
            await self.close()
            raise HTTPError(str(exc)) from None
        if not parser.keep_alive:
            await self.close()
        if parser.status != 200:
            raise HTTPError(f"HTTP {parser.status}: {bytes(parser.body[:300]).decode('utf-8', 'replace')}")
        if not parser.got_done:
            raise HTTPError("stream ended without [DONE]")

    def _readable(self, sock: socket.socket, parser: ResponseParser, done: asyncio.Future) -> None:
        """Read callback: drain the socket, stamping each read, and parse events on the spot."""
        if done.done():
            return
        kernel, lags = self.kernel_stamps, self.read_lags
        try:
            while True:
                try:
                    data, stamp = recv_stamped(sock, _READ) if kernel else (sock.recv(_READ), None)
                except (BlockingIOError, InterruptedError):
                    return
                now = t = time.perf_counter()
                if stamp is not None:
                    # never before the request was sent nor after we read it (a clock step
                    # between offset and stamp cannot move a token outside its true bounds)
                    t = min(max(stamp - self._offset_s, self._send_start), now)
                    lags.append(now - t)
                if self._tls is not None:
                    plain, eof = self._decrypt(data)
                else:
                    plain, eof = data, not data
                complete = bool(plain) and parser.feed(plain, t)
                if eof:
                    parser.feed_eof(t)  # a no-op after a complete response; a cut stream raises
                if complete or eof:
                    self.completed_at = t
                    done.set_result(None)
                    return
                if len(data) < _READ:
                    return
        except Exception as exc:  # a reset connection, a protocol error, the callback's own errors
            done.set_exception(exc)


# vLLM's `bench serve` counts a stream chunk as a token arrival when it carries `choices` (its text
# may be empty, e.g. a special token); the usage chunk carries `"choices": []`. We do the same.
_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\{')
_NEEDS_PARSE = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:')

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


def has_choices(payload: bytes) -> bool:
    """Whether an OpenAI-style stream event carries choices (a token arrival, as vLLM counts them)."""
    return _CHOICES.search(payload) is not None


def _error_text(err) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


class RequestRun:
    """Collects one request's timings and counts while its events arrive."""

    def __init__(self, req: Request, protocol: str, parse_acceptance: Callable[[dict], dict | None]):
        self.req, self.protocol, self.parse_acceptance = req, protocol, parse_acceptance
        self.arrivals: list[float] = []
        self.usage: dict | None = None
        self.final: dict | None = None
        self.last_meta: dict | None = None
        self.error: str | None = None
        self.tokens_seen = 0  # SGLang: the completion tokens reported so far (cumulative in every mode)

    def on_event(self, payload: bytes, now: float) -> None:
        if self.protocol != "sglang-generate" and not _NEEDS_PARSE.search(payload):
            # an ordinary token event: only whether it carries choices matters (the counts come from
            # the final usage event), so skip the JSON parse on the hot path
            if has_choices(payload):
                self.arrivals.append(now)
            return
        obj = json.loads(payload)
        if "error" in obj and not obj.get("choices"):
            self.error = f"server error: {_error_text(obj['error'])}"
            return
        if self.protocol == "sglang-generate":
            # meta_info.completion_tokens is cumulative whether the text is cumulative or (with
            # --incremental-streaming-output) a delta: an event that raises it brought tokens
            self.last_meta = obj
            meta = obj.get("meta_info") or {}
            done = meta.get("completion_tokens")
            if done is not None:
                if done > self.tokens_seen:
                    self.tokens_seen = done
                    self.arrivals.append(now)
            elif obj.get("text") or obj.get("output_ids"):
                self.arrivals.append(now)
            return
        if obj.get("choices"):
            self.arrivals.append(now)
        if obj.get("usage"):
            self.usage = obj["usage"]
            self.final = obj

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
            error=self.error)
        acc = None
        if self.protocol == "sglang-generate" and self.last_meta is not None and not self.error:
            meta = self.last_meta.get("meta_info") or {}
            rec.prompt_tokens = meta.get("prompt_tokens")
            rec.output_tokens = meta.get("completion_tokens")
            acc = self.parse_acceptance(self.last_meta)
        elif self.usage is not None:
            rec.prompt_tokens = self.usage.get("prompt_tokens")
            rec.output_tokens = self.usage.get("completion_tokens")
            acc = self.parse_acceptance(self.final)
        if acc:
            for k in ("num_draft_tokens", "num_accepted_tokens", "num_spec_steps", "acceptance_length",
                      "acceptance_rate"):
                setattr(rec, k, acc.get(k))
        if rec.error is None:
            if rec.output_tokens is None:
                rec.error = "no usage: the stream carried no token counts (stream_options.include_usage?)"
            elif rec.output_tokens > 0 and not self.arrivals:
                rec.error = "no token events although usage reports output tokens"
            else:
                rec.ok = True
        return rec


async def _one(conn: Connection, req: Request, protocol: str, parse_acc, timeout: float, t_origin: float,
               pass_index: int = 0) -> RequestRecord:
    run = RequestRun(req, protocol, parse_acc)
    body = json.dumps(req.payload).encode()
    start = time.perf_counter()
    try:
        # asyncio.timeout runs the stream in this task; wait_for would schedule a new task, so at a
        # burst of C requests the last one would be written only after C-1 loop turns.
        async with _timeout(timeout):
            await conn.stream(PATHS[protocol], body, run.on_event)
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
                   parse_acceptance: Callable[[dict], dict | None] = lambda f: None,
                   timeout: float = 600.0, api_key: str | None = None, warmup: list[Request] | None = None,
                   request_rate: float | None = None, burstiness: float = 1.0, seed: int = 0) -> list[RequestRecord]:
    """Send `requests` at `concurrency`; return one record per request, in request order."""
    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"base_url {base_url!r}: expected http://host:port or https://host:port")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # https: certificates are verified against the system store (SSL_CERT_FILE adds a private CA)
    tls = ssl.create_default_context() if u.scheme == "https" else None
    default_port = 443 if tls else 80
    conns = [Connection(u.hostname, u.port or default_port, headers, tls) for _ in range(concurrency)]
    gc_was_enabled = gc.isenabled()
    try:
        # Open every connection before the clock starts: measured requests never pay TCP set-up.
        await asyncio.gather(*(c.connect() for c in conns), return_exceptions=True)
        if warmup:
            wq = list(warmup)

            async def warm(conn):
                while wq:
                    r = wq.pop()
                    await _one(conn, r, protocol, parse_acceptance, timeout, 0.0)

            await asyncio.gather(*(warm(c) for c in conns[:max(1, min(len(warmup), concurrency))]))
        # No garbage-collector pauses inside the measured phase (they land on random tokens' ITL).
        gc.collect()
        gc.disable()
        t_origin = time.perf_counter()
        results: list[dict | None] = [None] * len(requests)
        if request_rate is None:
            next_i = 0

            async def worker(conn):
                nonlocal next_i
                while next_i < len(requests):
                    i = next_i
                    next_i += 1
                    results[i] = await _one(conn, requests[i], protocol, parse_acceptance, timeout, t_origin,
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
                    results[i] = await _one(conn, requests[i], protocol, parse_acceptance, timeout, t_origin,
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
