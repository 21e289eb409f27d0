"""The load generator against a scripted streaming server with known delays and token counts."""
import asyncio
import json
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from builders import cell_result, load_requests, prompt
from specmatch.measuring import summary, transport
from specmatch.measuring.client import run_load
from specmatch.serving.engines import get_engine
from specmatch.measuring.protocols import PROTOCOLS, has_choices, protocol
from specmatch.records import RequestSettings


def reqs(n, text="hello world", protocol="openai-completions", source="s"):
    return load_requests(n, text, protocol, source, holdout=lambda i: i % 2 == 0)


# A kernel receive stamp is in real time; the client takes it to the monotonic clock by an offset read
# between two monotonic reads (transport.realtime_offset_ns): good to well under a millisecond.
EPS = 1e-3


def server_clock(r) -> list[float]:
    """The checks that a request's token arrivals are the server's own times (fakeserver `timing=True`):
    each arrival lies within the server's write of its chunk or, where the client read it together with a
    later chunk (coalesced: the client fell behind), within that later chunk's write. Returns the
    arrivals in the monotonic clock. Load cannot break this: a busy machine moves the writes, and the
    arrivals with them."""
    t = r.server_timing
    start = t["client_start_abs"]
    arrivals = [start + a for a in r.arrivals_s]
    w0, w1 = t["event_abs"], t["event_done_abs"]
    assert len(w0) == len(w1) == len(arrivals)
    assert start <= t["received_abs"] <= w0[0]  # the server read the request after the client began it
    for i, a in enumerate(arrivals):
        k = next((k for k in range(i, len(w0)) if w0[k] - EPS <= a <= w1[k] + EPS), None)
        assert k is not None, f"token {i} arrived at {a:.6f}, outside every write from its own on: {w0[i:]}"
        # read together with a later chunk: every event of that read carries its stamp
        assert k == i or arrivals[i + 1] == a
    return arrivals


@pytest.mark.slow
def test_timings_and_counts_are_exact(fake_server):
    """Counts from the stream, and every time the client records (TTFT, each token's arrival, end to end)
    is the server's own clock's; the cell's figures are those records'. The scripted delays are only lower
    bounds: a busy machine stretches the server's sleeps, never shortens them."""
    ttft, itl = 0.10, 0.02
    srv = fake_server(tokens=20, ttft=ttft, itl=itl, timing=True)
    recs = asyncio.run(run_load(srv.base_url, reqs(6), 2, "openai-completions"))
    assert len(recs) == 6 and all(r.ok for r in recs)
    for r in recs:
        assert r.output_tokens == 20 and len(r.arrivals_s) == 20
        arrivals = server_clock(r)
        assert r.ttft_s == pytest.approx(arrivals[0] - r.server_timing["client_start_abs"], abs=1e-9)
        assert r.e2e_s == pytest.approx(arrivals[-1] - r.server_timing["client_start_abs"], abs=1e-9)
        assert r.ttft_s >= ttft - EPS and r.e2e_s >= ttft + 19 * itl - EPS
        # a gap is either the server's (at least its sleep) or 0: two tokens read at once, counted as such
        gaps = [b - a for a, b in zip(r.arrivals_s, r.arrivals_s[1:])]
        assert all(g == 0 or g >= itl - 2 * EPS for g in gaps), gaps
        assert r.coalesced_events == sum(g == 0 for g in gaps)
    s = summary.summarize(recs)
    assert s["completed"] == 6 and s["failed"] == 0 and s["total_output_tokens"] == 120
    # closed loop, 2 workers: the server never had more than 2 requests at once, and had 2
    spans = [(r.server_timing["received_abs"], r.server_timing["end_abs"]) for r in recs]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    in_flight = [sum(d for _, d in edges[:i + 1]) for i in range(len(edges))]
    assert max(in_flight) == 2
    # 6 requests of at least 0.48 s, 3 or more in series on one of the 2 connections
    assert s["duration"] >= 3 * (ttft + 19 * itl) - EPS
    assert s["duration"] == pytest.approx(max(r.start_s + r.e2e_s for r in recs) - min(r.start_s for r in recs))
    assert s["output_throughput"] == pytest.approx(120 / s["duration"])
    assert s["median_tpot_ms"] == pytest.approx(float(np.median([summary.request_tpot_ms(r) for r in recs])))
    itls = [(b - a) * 1000 for r in recs for a, b in zip(r.arrivals_s, r.arrivals_s[1:])]
    assert s["median_itl_ms"] == pytest.approx(float(np.median(itls)))


def test_output_tokens_come_from_usage_not_events(fake_server):
    srv = fake_server(tokens=24, ttft=0.01, itl=0.005, tokens_per_event=3)  # EAGLE-like multi-token events
    r = asyncio.run(run_load(srv.base_url, reqs(2), 1, "openai-completions"))
    assert [x.output_tokens for x in r] == [24, 24]
    assert all(len(x.arrivals_s) == 8 for x in r)


@pytest.mark.slow
def test_an_endpoint_under_a_path_prefix_is_reached_there(fake_server):
    srv = fake_server(tokens=5, ttft=0.01, itl=0.001, prefix="/team/llm")
    assert srv.base_url.endswith(":%d/team/llm" % srv.port)
    for proto in ("openai-completions", "openai-chat"):
        r = asyncio.run(run_load(srv.base_url, reqs(2, protocol=proto), 2, proto))
        assert all(x.ok and x.output_tokens == 5 for x in r), [x.error for x in r]
    # the same server without its prefix answers 404: the prefix is what reached it
    bare = srv.base_url[:-len("/team/llm")]
    r = asyncio.run(run_load(bare, reqs(1), 1, "openai-completions"))
    assert not r[0].ok and "404" in (r[0].error or "")


def test_chat_endpoint(fake_server):
    srv = fake_server(tokens=5, ttft=0.01, itl=0.001)
    r = asyncio.run(run_load(srv.base_url, reqs(3, protocol="openai-chat"), 3, "openai-chat"))
    assert all(x.ok and x.output_tokens == 5 for x in r)


@pytest.mark.slow
def test_every_injected_failure_is_counted(fake_server):
    srv = fake_server(tokens=10, ttft=0.01, itl=0.002)
    rs = reqs(3) + reqs(1, "FAIL500") + reqs(1, "CUT here") + reqs(1, "SLOW")
    for i, r in enumerate(rs):
        r.index = i
    recs = asyncio.run(run_load(srv.base_url, rs, 2, "openai-completions", timeout=1.0))
    assert len(recs) == 6
    assert sum(r.ok for r in recs) == 3
    errors = sorted(r.error.split(":")[0] for r in recs if not r.ok)
    assert errors == ["connection", "http", "timeout"] or errors == ["http", "http", "timeout"]
    s = summary.summarize(recs)
    assert s["failed"] == 3 and sum(s["failure_reasons"].values()) == 3


def test_acceptance_equals_what_the_server_reported(fake_server):
    srv = fake_server(tokens=30, ttft=0.01, itl=0.001, spec={"k": 4, "accept": 2})
    eng = get_engine({"engine": "vllm", "model": "fake"})
    recs = asyncio.run(run_load(srv.base_url, reqs(4), 2, "openai-completions", eng.parse_request_acceptance))
    for r in recs:
        assert r.num_spec_steps == 10 and r.num_accepted_tokens == 20 and r.num_draft_tokens == 40
        assert r.acceptance_rate == pytest.approx(0.5)
    by = summary.acceptance_by_group(eng, recs, lambda r: r.source)
    assert by["s"]["acceptance_rate"] == pytest.approx(0.5) and by["s"]["acceptance_length"] == pytest.approx(3.0)


def test_open_loop_rate(fake_server):
    srv = fake_server(tokens=2, ttft=0.001, itl=0.001)
    recs = asyncio.run(run_load(srv.base_url, reqs(20), 8, "openai-completions", request_rate=50.0, seed=1))
    assert len(recs) == 20 and all(r.ok for r in recs)
    # the client's schedule (Poisson arrivals at 50 req/s, seed 1): no request starts before its time
    import random

    rng, at = random.Random(1), [0.0]
    for _ in range(19):
        at.append(at[-1] + rng.gammavariate(1.0, 1 / 50.0))
    assert at[-1] > 0.1   # 19 gaps at 50 req/s ~ 0.38 s
    assert all(r.start_s >= t for r, t in zip(sorted(recs, key=lambda r: r.index), at))
    # nor long after it (the bound leaves a busy machine seconds of delay)
    assert max(r.start_s for r in recs) < at[-1] + 3.0


def test_fast_event_check_agrees_with_a_full_parse_on_recorded_streams():
    """A token arrival is a chunk carrying choices, as vLLM bench serve counts it (its text may be
    empty); the hot path decides that without parsing JSON, and must agree with a full parse."""
    def slow(obj):
        return bool(obj.get("choices"))

    fixtures = Path(__file__).parent / "fixtures" / "vllm"
    n = 0
    for f in fixtures.glob("*.sse"):
        for line in f.read_text().splitlines():
            if line.startswith("data: {"):
                payload = line[6:].encode()
                assert has_choices(payload) == slow(json.loads(payload)), line
                n += 1
    extra = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
             {"choices": [{"delta": {"content": '"quoted"'}}]},
             {"choices": [{"text": ""}]},
             {"choices": [], "usage": {"completion_tokens": 3}},
             {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]}]
    for obj in extra:
        for sep in ((",", ":"), (", ", ": ")):  # compact (vLLM) and spaced (Python default) JSON
            assert has_choices(json.dumps(obj, separators=sep).encode()) == slow(obj), obj
    assert n > 30


async def _blocked_while_written(srv, n_requests, chunks, coro, extra=0.05):
    """Run `coro` with the client's event loop blocked while the server writes: once the server has seen
    `n_requests` requests, the loop blocks, lets the server's held tokens go (fakeserver `hold`), and stays
    blocked until the server has written `chunks` token chunks (and `extra` s more), so those tokens reach
    the socket while the client cannot read, however busy the machine. Returns (what `coro` returned, when
    the block ended)."""
    srv.hold = threading.Event()
    ended = []

    async def hog():
        while srv.requests_seen < n_requests:
            await asyncio.sleep(0.001)
        srv.hold.set()
        while srv.chunks_written < chunks:   # blocks the loop: the client reads nothing meanwhile
            time.sleep(0.001)
        time.sleep(extra)
        ended.append(time.perf_counter())

    h = asyncio.ensure_future(hog())
    out = await coro
    await h
    return out, ended[0]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [True, False])
def test_arrivals_do_not_depend_on_when_the_client_reads(fake_server, monkeypatch, kernel):
    """Four streams get their token while the client is blocked. Stamped by the kernel, each arrival is
    when the server wrote it (its own clock), before the client could read; stamped at read time (the
    fallback where a platform has no receive timestamps) it is when the client read, after the block."""
    if kernel and transport._SO_TIMESTAMPNS is None:
        pytest.skip("no kernel receive timestamps on this platform")
    if not kernel:
        monkeypatch.setattr(transport, "_SO_TIMESTAMPNS", None)
    srv = fake_server(tokens=1, ttft=0.1, itl=0.0, timing=True)
    recs, unblocked = asyncio.run(_blocked_while_written(
        srv, 4, 4, run_load(srv.base_url, reqs(4), 4, "openai-completions"), extra=0.2))
    assert all(r.ok and r.arrival_clock == ("kernel" if kernel else "read") for r in recs)
    for r in recs:
        arrival = r.server_timing["client_start_abs"] + r.ttft_s
        assert r.e2e_s == r.ttft_s
        if kernel:
            server_clock(r)
            assert arrival < unblocked - 0.2 + EPS
            # the client says how long the token waited for it: at least until the block ended
            assert r.read_lag_max_s >= unblocked - arrival - EPS
        else:
            assert arrival >= unblocked


@pytest.mark.slow
def test_a_client_that_fell_behind_is_reported(fake_server):
    """Tokens written 30 ms apart that reach the client in one read are counted, and the cell warns."""
    srv = fake_server(tokens=6, ttft=0.01, itl=0.03)
    recs, _ = asyncio.run(_blocked_while_written(srv, 1, 4, run_load(srv.base_url, reqs(1), 1, "openai-completions")))
    assert recs[0].ok and recs[0].coalesced_events >= 3   # four tokens waited for one read
    s = summary.summarize(recs)
    assert s["coalesced_token_events"] == recs[0].coalesced_events and s["coalesced_token_share"] > 0.3
    warnings = summary.measurement_warnings(cell_result(**s))
    assert len(warnings) == 1 and "fell behind" in warnings[0]
    # a client that keeps up reads each token on its own: gaps of 0.25 s leave room for a busy machine
    calm_srv = fake_server(tokens=3, ttft=0.01, itl=0.25)
    calm = asyncio.run(run_load(calm_srv.base_url, reqs(2), 1, "openai-completions"))
    assert sum(r.coalesced_events for r in calm) == 0
    assert summary.measurement_warnings(cell_result(**summary.summarize(calm))) == []


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 / localhost."""
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.mark.slow
def test_https_endpoints_are_verified_and_timed_like_plain_ones(fake_server, tls_cert, monkeypatch):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*map(str, tls_cert))
    srv = fake_server(tokens=12, ttft=0.05, itl=0.01, tls=ctx, timing=True)
    assert srv.base_url.startswith("https://")
    # an unknown CA is refused: the API key is never sent to an unverified server
    recs = asyncio.run(run_load(srv.base_url, reqs(2), 1, "openai-completions", api_key="sk-secret"))
    assert not any(r.ok for r in recs) and "certificate verify failed" in recs[0].error
    assert srv.requests_seen == 0
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    recs = asyncio.run(run_load(srv.base_url, reqs(4), 2, "openai-completions", api_key="sk-secret"))
    assert all(r.ok and r.output_tokens == 12 and len(r.arrivals_s) == 12 for r in recs)
    for r in recs:   # timed by the server's own clock, as over plain HTTP
        server_clock(r)
        assert r.ttft_s >= 0.05 - EPS
    if transport._SO_TIMESTAMPNS is not None:
        assert {r.arrival_clock for r in recs} == {"kernel"}
    with pytest.raises(ValueError, match=r"expected http\(s\)://host\[:port\]\[/path\]"):
        asyncio.run(run_load("ftp://x:1", reqs(1), 1, "openai-completions"))


def test_one_protocol_object_per_endpoint():
    """Each endpoint's path and body come from its protocol object, looked up by name; a prompt's own
    reference length caps max_tokens only when asked."""
    p = prompt(0, "hello", messages=[{"role": "user", "content": "hello"}], reference_completion_tokens=5)
    s = RequestSettings(max_tokens=64, temperature=0.0, ignore_eos=True)
    assert {n: protocol(n).path for n in PROTOCOLS} == {"openai-completions": "/v1/completions",
                                                         "openai-chat": "/v1/chat/completions",
                                                         "sglang-generate": "/generate"}
    assert protocol("openai-completions").body(p, "m", s, {"x": 1}) == {
        "model": "m", "max_tokens": 64, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
        "ignore_eos": True, "prompt": "hello", "x": 1}
    assert protocol("openai-chat").body(p, "m", s)["messages"] == [{"role": "user", "content": "hello"}]
    assert protocol("sglang-generate").body(p, "m", RequestSettings(max_tokens=64, use_reference_length=True)) == {
        "text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 5, "temperature": 0.0,
                                                             "ignore_eos": True}}
    with pytest.raises(ValueError, match="s-0: no messages to send to the chat endpoint"):
        protocol("openai-chat").body(prompt(0, "hello"), "m", s)
    with pytest.raises(ValueError, match="unknown protocol 'grpc'"):
        protocol("grpc")


def test_a_connection_the_server_closed_while_idle_is_reopened_not_failed(fake_server):
    """uvicorn (vLLM's and SGLang's HTTP server) closes a kept-alive connection idle for 5 s: a worker
    whose connection was opened before a long warm-up, or that waited, finds it closed with no byte of
    a response. The request never reached the engine: it is sent again on a new connection, once."""
    srv = fake_server(tokens=4, ttft=0.01, itl=0.002, keep_alive_s=0.2)

    async def two_with_a_pause():
        conn = transport.Connection("127.0.0.1", srv.port, {})
        events = []
        body = json.dumps({"prompt": "hello", "max_tokens": 4, "stream": True}).encode()
        await conn.stream("/v1/completions", body, lambda e, t: events.append(e))
        first = len(events)
        await asyncio.sleep(0.5)          # the server closes the idle connection meanwhile
        await conn.stream("/v1/completions", body, lambda e, t: events.append(e))
        await conn.close()
        return first, len(events) - first

    first, second = asyncio.run(two_with_a_pause())
    assert srv.idle_closed >= 1 and first > 0 and second == first


def test_a_fresh_connection_closed_before_a_response_is_still_a_failure(fake_server):
    """Only a kept-alive connection is retried: a server that closes a new connection without
    answering fails the request (nothing hides a server that drops requests)."""
    srv = fake_server(tokens=4, ttft=0.01, itl=0.002, keep_alive_s=0.0)

    async def one():
        conn = transport.Connection("127.0.0.1", srv.port, {})
        await asyncio.sleep(0.1)
        body = json.dumps({"prompt": "hello", "max_tokens": 4, "stream": True}).encode()
        try:
            await conn.stream("/v1/completions", body, lambda e, t: None)
        finally:
            await conn.close()

    with pytest.raises(transport.HTTPError):
        asyncio.run(one())
