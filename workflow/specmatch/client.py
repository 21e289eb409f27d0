"""A streaming load generator that is never the bottleneck and never miscounts.

Plain asyncio over raw HTTP/1.1 keep-alive connections (one per worker): no framework between the
socket and the clock, so the client adds well under a millisecond to TTFT/ITL (bench/client_overhead.py
measures it against vLLM's own client). Closed loop by default (C workers, each sends its next request
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
import re
import random
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit


@dataclass
class Request:
    """One request to send. `payload` is the protocol-specific JSON body (built by build_payload)."""
    index: int
    prompt_id: str
    source: str
    holdout: bool
    payload: dict


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


class Connection:
    """One keep-alive HTTP/1.1 connection that streams server-sent events."""

    def __init__(self, host: str, port: int, headers: dict[str, str]):
        self.host, self.port = host, port
        self.headers = headers
        self.reader: asyncio.StreamReader | None = None
        self.sent_at: float | None = None  # when the last request was fully written
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 24)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except Exception:
                pass
            self.writer = None

    async def connect(self) -> None:
        if self.writer is None or self.writer.is_closing():
            await self._connect()

    async def stream(self, path: str, body: bytes, on_event: Callable[[bytes, float], None]) -> None:
        await self.connect()
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Content-Type: application/json",
                "Accept: text/event-stream", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await self.writer.drain()
        self.sent_at = time.perf_counter()
        reader = self.reader
        status_line = await reader.readline()
        if not status_line:
            await self.close()
            raise HTTPError("connection closed before a response")
        parts = status_line.split(b" ", 2)
        status = int(parts[1])
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = int(headers["content-length"]) if "content-length" in headers else None
        keep = headers.get("connection", "").lower() != "close"
        if status != 200:
            data = await self._read_body(chunked, length)
            if not keep:
                await self.close()
            raise HTTPError(f"HTTP {status}: {data[:300].decode('utf-8', 'replace')}")
        buf = b""
        got_done = False
        async for data, now in self._iter_body(chunked, length):
            buf += data
            while True:
                sep = buf.find(b"\n\n")
                if sep < 0:
                    break
                event, buf = buf[:sep], buf[sep + 2:]
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            got_done = True
                        else:
                            on_event(payload, now)
        if not keep:
            await self.close()
        if not got_done:
            raise HTTPError("stream ended without [DONE]")

    async def _read_body(self, chunked: bool, length: int | None) -> bytes:
        out = b""
        async for d, _t in self._iter_body(chunked, length):
            out += d
        return out

    async def _iter_body(self, chunked: bool, length: int | None):
        """Yield (body bytes, time they were read from the socket). Chunked framing is parsed from
        64 KB reads, not one readline per chunk; every event in one read carries that read's time,
        so events that arrived together are not stamped later for the parsing of their neighbours."""
        reader = self.reader
        if chunked:
            buf = b""
            t_read = time.perf_counter()
            while True:
                nl = buf.find(b"\r\n")
                if nl < 0:
                    data = await reader.read(1 << 16)
                    t_read = time.perf_counter()
                    if not data:
                        await self.close()
                        raise HTTPError("stream cut short (connection closed mid-body)")
                    buf += data
                    continue
                size = int(buf[:nl].split(b";")[0].strip() or b"0", 16)
                end = nl + 2 + size + 2
                while len(buf) < end:
                    data = await reader.read(max(1 << 16, end - len(buf)))
                    t_read = time.perf_counter()
                    if not data:
                        await self.close()
                        raise HTTPError("stream cut short (connection closed mid-body)")
                    buf += data
                if size == 0:
                    if buf[end:]:  # pipelining is never used; anything left means a protocol error
                        await self.close()
                    return
                yield buf[nl + 2:nl + 2 + size], t_read
                buf = buf[end:]
        elif length is not None:
            remaining = length
            while remaining > 0:
                data = await reader.read(min(remaining, 1 << 16))
                if not data:
                    await self.close()
                    raise HTTPError("stream cut short (connection closed mid-body)")
                remaining -= len(data)
                yield data, time.perf_counter()
        else:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    await self.close()
                    return
                yield data, time.perf_counter()


_CONTENT = re.compile(rb'"(?:text|content|reasoning_content|reasoning)"\s*:\s*"(?!")|"tool_calls"\s*:\s*\[\s*\{')
_NEEDS_PARSE = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:')


def has_content(payload: bytes) -> bool:
    """Whether an OpenAI-style stream event carries generated text (or a tool-call delta)."""
    return _CONTENT.search(payload) is not None


class RequestRun:
    """Collects one request's timings and counts while its events arrive."""

    def __init__(self, req: Request, protocol: str, parse_acceptance: Callable[[dict], dict | None]):
        self.req, self.protocol, self.parse_acceptance = req, protocol, parse_acceptance
        self.arrivals: list[float] = []
        self.usage: dict | None = None
        self.final: dict | None = None
        self.last_meta: dict | None = None
        self.error: str | None = None

    def on_event(self, payload: bytes, now: float) -> None:
        if self.protocol != "sglang-generate" and not _NEEDS_PARSE.search(payload):
            # an ordinary token event: only whether it carries content matters (the counts come
            # from the final usage event), so skip the JSON parse on the hot path
            if has_content(payload):
                self.arrivals.append(now)
            return
        obj = json.loads(payload)
        if self.protocol == "sglang-generate":
            # cumulative text each event; meta_info carries the counts
            self.last_meta = obj
            if obj.get("text") is not None and len(obj.get("text")) > getattr(self, "_seen", 0):
                self._seen = len(obj["text"])
                self.arrivals.append(now)
            return
        if "error" in obj and not obj.get("choices"):
            self.error = f"server error: {str(obj['error'])[:300]}"
            return
        choices = obj.get("choices") or []
        if choices:
            c = choices[0]
            piece = c.get("text")
            if piece is None:
                delta = c.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
            if piece:
                self.arrivals.append(now)
        if obj.get("usage"):
            self.usage = obj["usage"]
            self.final = obj

    def record(self, start: float, end: float, t_origin: float) -> dict:
        rec = {"index": self.req.index, "prompt_id": self.req.prompt_id, "source": self.req.source,
               "holdout": self.req.holdout, "start_s": start - t_origin, "e2e_s": end - start,
               "ttft_s": (self.arrivals[0] - start) if self.arrivals else None,
               "arrivals_s": [a - start for a in self.arrivals],
               "prompt_tokens": None, "output_tokens": None, "ok": False, "error": self.error,
               "num_draft_tokens": None, "num_accepted_tokens": None, "num_spec_steps": None,
               "acceptance_length": None, "acceptance_rate": None}
        acc = None
        if self.protocol == "sglang-generate" and self.last_meta is not None:
            meta = self.last_meta.get("meta_info") or {}
            rec["prompt_tokens"] = meta.get("prompt_tokens")
            rec["output_tokens"] = meta.get("completion_tokens")
            acc = self.parse_acceptance(self.last_meta)
        elif self.usage is not None:
            rec["prompt_tokens"] = self.usage.get("prompt_tokens")
            rec["output_tokens"] = self.usage.get("completion_tokens")
            acc = self.parse_acceptance(self.final)
        if self.final and "server_timing" in self.final:  # only test/bench servers send this
            rec["server_timing"] = {**self.final["server_timing"], "client_start_abs": start,
                                    "client_arrivals_abs": list(self.arrivals)}
        if acc:
            for k in ("num_draft_tokens", "num_accepted_tokens", "num_spec_steps", "acceptance_length",
                      "acceptance_rate"):
                rec[k] = acc.get(k)
        if rec["error"] is None:
            if rec["output_tokens"] is None:
                rec["error"] = "no usage: the stream carried no token counts (stream_options.include_usage?)"
            elif rec["output_tokens"] > 0 and not self.arrivals:
                rec["error"] = "no content events although usage reports output tokens"
            else:
                rec["ok"] = True
        return rec


async def _one(conn: Connection, req: Request, protocol: str, parse_acc, timeout: float, t_origin: float) -> dict:
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
        run.error = f"http: {exc}"
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
        run.error = f"connection: {type(exc).__name__}: {exc}"
        await conn.close()
    except (ValueError, json.JSONDecodeError) as exc:
        run.error = f"protocol: {exc}"
        await conn.close()
    end = time.perf_counter()
    rec = run.record(start, end, t_origin)
    if "server_timing" in rec:
        rec["server_timing"]["client_sent_abs"] = conn.sent_at
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
                   request_rate: float | None = None, burstiness: float = 1.0, seed: int = 0) -> list[dict]:
    """Send `requests` at `concurrency`; return one record per request, in request order."""
    u = urlsplit(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conns = [Connection(u.hostname, u.port or 80, headers) for _ in range(concurrency)]
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
                    results[i] = await _one(conn, requests[i], protocol, parse_acceptance, timeout, t_origin)

            await asyncio.gather(*(worker(c) for c in conns))
        else:
            rng = random.Random(seed)
            free: asyncio.Queue = asyncio.Queue()
            for c in conns:
                free.put_nowait(c)

            async def fire(i):
                conn = await free.get()
                try:
                    results[i] = await _one(conn, requests[i], protocol, parse_acceptance, timeout, t_origin)
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
