"""A scripted OpenAI-compatible streaming server (test fixture and bench load target; never a default).

It streams `tokens` content events per request with `ttft` seconds before the first and `itl` between
the next, as chunked server-sent events like vLLM's, ends with a usage chunk (plus vLLM-style
per-request speculative metrics when `spec` is set) and `[DONE]`. Failure modes, chosen per request
by the prompt text: "FAIL500" answers HTTP 500, "CUT" closes the stream half-way, "SLOW" never
finishes (for timeouts), "DIE" kills the server process half-way (when run as a process). It also
serves SGLang's native /generate (cumulative or, with `incremental`, delta text; "ERRORSG" sends
SGLang's error event). It also serves /health, /metrics (spec-decode counters), /v1/models and
/reset_prefix_cache, and counts what it saw.

Scripted outputs (`words=True`), for the natural-stopping and session tests: a request's output is a
deterministic function of its prompt, as greedy decoding is (token k: id 100 + a hash of the prompt and
k, text " w<id>"); `eos_at(prompt)` puts the end-of-sequence token (id 2, empty text) at that output
position, where the stream stops unless the request says `ignore_eos` (then decoding goes on to
max_tokens); `diverge(prompt)` makes this server's tokens differ from that position on (a lossy
"speculative" server); `return_token_ids` is honoured; `cache=True` simulates a prefix cache (a
prompt's cached tokens are its longest common word prefix with the prompts seen since the last
reset, reported as vLLM's usage.prompt_tokens_details.cached_tokens and SGLang's
meta_info.cached_tokens); `max_model_len` is announced on /v1/models. Every request is logged with its
prompt and the times it began and ended (`log`).

The server's own clock (`timing=True`, completions and chat): the final usage chunk carries
`server_timing` as bench/tickserver.py sends it (the client keeps it with the request's record):
`received_abs` (the request read), `event_abs` and `event_done_abs` (just before each chunk with
choices, the client's token events, was written and once it was handed to the kernel) and `end_abs`, in perf_counter's clock (CLOCK_MONOTONIC:
the client's, on one machine). Tests compare the client's stamps with these, not with the scripted
delays, which a busy machine stretches. `chunks_written` counts token chunks written, over all requests.

    python tests/fakeserver.py --port 0 --tokens 16 --ttft 0.05 --itl 0.01
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import threading
import time

EOS = 2


class FakeServer:
    def __init__(self, tokens=16, ttft=0.02, itl=0.005, spec=None, tokens_per_event=1, host="127.0.0.1", port=0,
                 tls=None, usage_delay=0.0, empty_first=False, incremental=False, words=False, eos_at=None,
                 diverge=None, cache=False, max_model_len=None, prefix="", api_key=None, keep_alive_s=None,
                 timing=False):
        self.timing = timing              # send the server's own clock in the final chunk (module docstring)
        self.hold: threading.Event | None = None  # set: a stream's first token waits until it is set
        self.chunks_written = 0           # token chunks written, all requests
        self.keep_alive_s = keep_alive_s  # close a connection idle this long between requests (uvicorn's
                                          # timeout_keep_alive, 5 s in vLLM's server); None: never
        self.idle_closed = 0              # connections closed so
        self.prefix = prefix            # serve under a path (a gateway's /team/llm): other paths are 404
        self.api_key = api_key          # every route but /health answers 401 without `Bearer <api_key>`
        self.unauthorized: list[str] = []  # the paths called without the key
        self.tokens, self.ttft, self.itl = tokens, ttft, itl
        self.spec = spec  # e.g. {"k": 4, "accept": 2}: per step, 4 drafted, 2 accepted
        self.tokens_per_event = tokens_per_event
        self.host = host
        self.port = port
        self.tls = tls  # an ssl.SSLContext to serve HTTPS
        self.usage_delay = usage_delay  # seconds between the last token chunk and the usage chunk
        self.empty_first = empty_first  # the first chunk carries choices with empty text (as vLLM's role chunk)
        self.incremental = incremental  # SGLang /generate: delta text per event (--incremental-streaming-output)
        self.words = words              # scripted outputs: a function of the prompt (module docstring)
        self.eos_at = eos_at            # prompt -> output position of the end-of-sequence token (or None)
        self.diverge = diverge          # prompt -> output position from which this server's tokens differ
        self.cache = cache              # simulate a prefix cache and report its hits
        self.max_model_len = max_model_len
        self._cached_prompts: list[list[str]] = []
        self.log: list[dict] = []       # every completion request: {prompt, start, end, cached}
        self.in_flight = 0
        self.max_in_flight = 0
        self.events: list[str] = []     # what happened, in order: "warmup", "request", "reset"
        self._bodies: dict = {}
        self.requests_seen = 0
        self.resets = 0
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.server_ttfts: list[float] = []
        self._loop = None
        self._server = None
        self._thread = None

    # -- scripted outputs ------------------------------------------------------------------------
    def script(self, prompt: str, n: int, ignore_eos: bool) -> tuple[list[int], list[str], str]:
        """(token ids, their texts, finish reason) of a scripted greedy output of at most n tokens."""
        eos = self.eos_at(prompt) if callable(self.eos_at) else self.eos_at
        off = self.diverge(prompt) if callable(self.diverge) else self.diverge
        ids, texts = [], []
        for k in range(n):
            if eos is not None and k == eos:
                ids.append(EOS)
                texts.append("")
                if not ignore_eos:
                    return ids, texts, "stop"
                continue
            h = int(hashlib.md5(f"{prompt}\0{k}".encode()).hexdigest()[:8], 16) % 900
            if off is not None and k >= off:
                h = (h + 1) % 900
            ids.append(100 + h)
            texts.append(f" w{100 + h}")
        return ids, texts, "length"

    def cached_tokens(self, prompt: str, salt: str | None = None) -> int:
        """The longest word prefix this prompt shares with one seen since the last reset under the same
        cache salt (a prefix cache; vLLM and SGLang key their blocks by the request's cache_salt)."""
        words = [f"{salt}\x00"] + prompt.split() if salt else prompt.split()
        best = 0
        for seen in self._cached_prompts:
            k = 0
            for a, b in zip(seen, words):
                if a != b:
                    break
                k += 1
            best = max(best, k)
        self._cached_prompts.append(words)
        return max(best - 1, 0) if salt else best

    # -- HTTP ----------------------------------------------------------------------------------
    async def _handle(self, reader, writer):
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), self.keep_alive_s)
                except asyncio.TimeoutError:
                    self.idle_closed += 1
                    break
                if not line:
                    break
                method, path, _ = line.decode().split(" ", 2)
                headers = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b""):
                        break
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0))) if "content-length" in headers else b""
                if self.prefix and not path.startswith(self.prefix + "/"):
                    self._plain(writer, "404 Not Found", f"no route {path}")
                    continue
                path = path[len(self.prefix):]
                if (self.api_key and path != "/health"
                        and headers.get("authorization") != f"Bearer {self.api_key}"):
                    self.unauthorized.append(path)
                    self._plain(writer, "401 Unauthorized", "a key is needed")
                    continue
                if not await self._route(method, path, body, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _plain(self, writer, status, text, ctype="text/plain"):
        data = text.encode()
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)

    async def _route(self, method, path, body, writer) -> bool:
        if path == "/health":
            self._plain(writer, "200 OK", "")
        elif path == "/v1/models":
            card = {"id": "fake", "object": "model", **({"max_model_len": self.max_model_len} if self.max_model_len else {})}
            self._plain(writer, "200 OK", json.dumps({"object": "list", "data": [card]}), "application/json")
        elif path in ("/reset_prefix_cache", "/flush_cache"):
            self.resets += 1
            self._cached_prompts = []
            self.events.append("reset")
            self._plain(writer, "200 OK", "")
        elif path == "/metrics":
            c = self.counters
            text = (f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="fake"}} {c["drafts"]}.0\n'
                    f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="fake"}} {c["draft_tokens"]}.0\n'
                    f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="fake"}} {c["accepted"]}.0\n')
            self._plain(writer, "200 OK", text)
        elif path in ("/v1/completions", "/v1/chat/completions"):
            return await self._stream(json.loads(body), writer, chat=path.endswith("chat/completions"))
        elif path == "/generate":
            return await self._generate(json.loads(body), writer)
        else:
            self._plain(writer, "404 Not Found", "")
        await writer.drain()
        return True

    async def _generate(self, req, writer) -> bool:
        """SGLang's native streaming /generate: cumulative text (or deltas when incremental) and
        meta_info with cumulative completion_tokens and, with `spec`, verify steps and correct drafts."""
        self.requests_seen += 1
        text = req.get("text", "")
        self.events.append("warmup" if "Warm-up" in text else "request")
        n = min(self.tokens, (req.get("sampling_params") or {}).get("max_new_tokens", self.tokens))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        if "ERRORSG" in text:
            chunk({"error": {"message": "scripted SGLang failure", "type": "invalid_request_error", "code": 400}})
            chunk(b"[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        k = self.tokens_per_event
        sent, out = 0, ""
        cached = self.cached_tokens(text, req.get("cache_salt")) if self.cache else None
        if self.words:
            ids, texts, reason = self.script(text, n, bool((req.get("sampling_params") or {}).get("ignore_eos")))
            n = len(ids)
        while sent < n:
            await asyncio.sleep(self.ttft if sent == 0 else self.itl)
            step = min(k, n - sent)
            sent += step
            piece = "".join(texts[sent - step:sent]) if self.words else "x" * step
            out += piece
            meta = {"prompt_tokens": len(text.split()), "completion_tokens": sent}
            if cached is not None:
                meta["cached_tokens"] = cached
            if self.words:
                meta["finish_reason"] = {"type": reason} if sent == n else None
            if self.spec:
                steps = max(1, sent // (1 + self.spec["accept"]))
                meta.update({"spec_verify_ct": steps, "spec_num_correct_drafts": steps * self.spec["accept"],
                             "spec_num_proposed_drafts": steps * self.spec["k"]})
            event = {"text": piece if self.incremental else out, "meta_info": meta}
            if self.words:
                event["output_ids"] = ids[sent - step:sent] if self.incremental else ids[:sent]
            chunk(event)
            await writer.drain()
        chunk(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _stream(self, req, writer, chat) -> bool:
        self.requests_seen += 1
        text = req.get("prompt") or json.dumps(req.get("messages"))
        self.events.append("warmup" if "Warm-up" in text else "request")
        n = min(self.tokens, req.get("max_tokens", self.tokens))
        if "FAIL500" in text:
            self._plain(writer, "500 Internal Server Error", json.dumps({"error": "scripted failure"}))
            await writer.drain()
            return True
        if self.words:
            return await self._scripted(req, text, n, writer, chat)
        t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable with the client's clock on one machine
        before, done = [], []     # per token chunk: just before its write, and once handed to the kernel
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        sent = 0
        first = True
        if self.hold is not None:   # a test blocks its client first, then lets the tokens go
            await asyncio.get_running_loop().run_in_executor(None, self.hold.wait)
        if self.empty_first:
            await asyncio.sleep(self.ttft)
            self.server_ttfts.append(time.perf_counter() - t0)
            empty = {"index": 0, "delta": {"role": "assistant", "content": ""}} if chat else {"index": 0, "text": ""}
            before.append(time.perf_counter())
            chunk({"id": "c", "object": "chunk", "choices": [empty], "usage": None})
            await writer.drain()
            done.append(time.perf_counter())
            first = False
        if not (self.ttft or self.itl or self.spec or self.empty_first or "CUT" in text or "SLOW" in text):
            # as fast as possible: the whole stream prebuilt and written at once, so the client is the bottleneck
            key = (n, chat)
            if key not in self._bodies:
                k, parts = self.tokens_per_event, []
                for i in range(0, n, k):
                    piece = "x" * min(k, n - i)
                    choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                    data = b"data: " + json.dumps({"id": "c", "object": "chunk", "choices": [choice],
                                                   "usage": None}).encode() + b"\n\n"
                    parts.append(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self._bodies[key] = b"".join(parts)
            writer.write(self._bodies[key])
            sent = n
        while sent < n:
            if self.ttft or self.itl:
                await asyncio.sleep(self.ttft if first else self.itl)
            if first:
                self.server_ttfts.append(time.perf_counter() - t0)
            first = False
            k = min(self.tokens_per_event, n - sent)
            piece = "x" * k
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            before.append(time.perf_counter())
            chunk({"id": "c", "object": "chunk", "choices": [choice], "usage": None})
            await writer.drain()
            done.append(time.perf_counter())
            self.chunks_written += 1
            sent += k
            if "CUT" in text and sent >= n // 2:
                writer.close()
                return False
            if "DIE" in text and sent >= n // 2 and __name__ == "__main__":  # only as its own process
                import os

                os._exit(7)
            if "SLOW" in text:
                await asyncio.sleep(3600)
        if self.usage_delay:
            await asyncio.sleep(self.usage_delay)
        final = {"id": "c", "choices": [], "usage": {"prompt_tokens": len(text.split()), "completion_tokens": n,
                                                     "total_tokens": n + len(text.split())}}
        if self.spec:
            steps = max(1, n // (1 + self.spec["accept"]))
            drafted, accepted = steps * self.spec["k"], steps * self.spec["accept"]
            self.counters["drafts"] += steps
            self.counters["draft_tokens"] += drafted
            self.counters["accepted"] += accepted
            final["metrics"] = {"speculative_decoding": {
                "mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate": accepted / drafted,
                "num_spec_steps": steps, "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
                "num_spec_tokens": self.spec["k"]}}
        if self.timing:
            final["server_timing"] = {"received_abs": t0, "event_abs": before, "event_done_abs": done,
                                      "end_abs": time.perf_counter()}
        chunk(final)
        chunk(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _scripted(self, req, text, n, writer, chat) -> bool:
        """A scripted greedy output (`words`), streamed one token per chunk, with vLLM's token ids,
        finish reason and usage (cached tokens included when the cache is simulated)."""
        entry = {"prompt": text, "start": time.perf_counter(), "end": None, "cached": None,
                 "cache_salt": req.get("cache_salt")}
        self.log.append(entry)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        cached = self.cached_tokens(text, req.get("cache_salt")) if self.cache else None
        entry["cached"] = cached
        ids, texts, reason = self.script(text, n, bool(req.get("ignore_eos")))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        try:
            for k, (tid, piece) in enumerate(zip(ids, texts)):
                await asyncio.sleep(self.ttft if k == 0 else self.itl)
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                if req.get("return_token_ids"):
                    choice["token_ids"] = [tid]
                choice["finish_reason"] = reason if k == len(ids) - 1 else None
                chunk({"id": "c", "object": "chunk", "choices": [choice], "usage": None})
                await writer.drain()
            m = len(text.split())
            usage = {"prompt_tokens": m, "completion_tokens": len(ids), "total_tokens": m + len(ids)}
            if cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            final = {"id": "c", "choices": [], "usage": usage}
            if self.spec:
                steps = max(1, len(ids) // (1 + self.spec["accept"]))
                drafted, accepted = steps * self.spec["k"], steps * self.spec["accept"]
                final["metrics"] = {"speculative_decoding": {
                    "mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate": accepted / drafted,
                    "num_spec_steps": steps, "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
                    "num_spec_tokens": self.spec["k"]}}
            chunk(final)
            chunk(b"[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self.in_flight -= 1
            entry["end"] = time.perf_counter()
        return True

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "FakeServer":
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)

            async def main():
                self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=1 << 24,
                                                          ssl=self.tls)
                self.port = self._server.sockets[0].getsockname()[1]
                ready.set()
                async with self._server:
                    await self._server.serve_forever()

            try:
                self._loop.run_until_complete(main())
            except asyncio.CancelledError:
                pass
            finally:
                pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}{self.prefix}"

    def stop(self) -> None:
        if not (self._loop and self._server) or self._loop.is_closed():
            return

        async def shutdown():
            self._server.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        except Exception:
            pass
        self._thread.join(5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--ttft", type=float, default=0.02)
    p.add_argument("--itl", type=float, default=0.005)
    p.add_argument("--spec", default=None, help='JSON, e.g. {"k":4,"accept":2}')
    p.add_argument("--tokens-per-event", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3600)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--words", action="store_true", help="scripted greedy outputs (a function of the prompt)")
    p.add_argument("--eos-at", type=int, default=None, help="with --words: the end-of-sequence token's position")
    p.add_argument("--diverge-at", type=int, default=None, help="with --words: this server's tokens differ from here on")
    p.add_argument("--cache", action="store_true", help="simulate a prefix cache and report its hits")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--prefix", default="", help="serve under this path only (a gateway's /team/llm)")
    p.add_argument("--api-key-env", default=None, help="require the key this environment variable holds")
    a, _unknown = p.parse_known_args()  # tolerate engine flags when standing in for a server
    s = FakeServer(a.tokens, a.ttft, a.itl, json.loads(a.spec) if a.spec else None, a.tokens_per_event,
                   port=a.port, words=a.words, eos_at=a.eos_at, diverge=a.diverge_at, cache=a.cache,
                   max_model_len=a.max_model_len, prefix=a.prefix,
                   api_key=os.environ[a.api_key_env] if a.api_key_env else None)
    s.start()
    print(json.dumps({"base_url": s.base_url}), flush=True)
    time.sleep(a.seconds)


if __name__ == "__main__":
    main()
