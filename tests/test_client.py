"""The load generator against a scripted streaming server with known delays and token counts."""
import asyncio
import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from builders import cell_result, load_requests, prompt
from specmatch.measuring import summary, transport
from specmatch.measuring.client import run_load
from specmatch.serving.engines import get_engine
from specmatch.measuring.protocols import PROTOCOLS, has_choices, protocol
from specmatch.records import RequestSettings


def reqs(n, text="hello world", protocol="openai-completions", source="s"):
    return load_requests(n, text, protocol, source, holdout=lambda i: i % 2 == 0)


def test_timings_and_counts_are_exact(fake_server):
    srv = fake_server(tokens=20, ttft=0.10, itl=0.02)
    recs = asyncio.run(run_load(srv.base_url, reqs(6), 2, "openai-completions"))
    assert len(recs) == 6 and all(r.ok for r in recs)
    for r in recs:
        assert r.output_tokens == 20 and len(r.arrivals_s) == 20
        assert r.ttft_s == pytest.approx(0.10, abs=0.02)
        gaps = [b - a for a, b in zip(r.arrivals_s, r.arrivals_s[1:])]
        assert sum(gaps) / len(gaps) == pytest.approx(0.02, abs=0.004)
        assert r.e2e_s == pytest.approx(0.10 + 19 * 0.02, abs=0.05)
    s = summary.summarize(recs)
    assert s["completed"] == 6 and s["failed"] == 0 and s["total_output_tokens"] == 120
    # closed loop, 2 workers, 3 requests each of ~0.48 s => ~1.44 s, 120 tokens
    assert s["duration"] == pytest.approx(3 * 0.48, rel=0.1)
    assert s["output_throughput"] == pytest.approx(120 / s["duration"])
    assert s["median_tpot_ms"] == pytest.approx(20, abs=3)
    assert s["median_itl_ms"] == pytest.approx(20, abs=3)


def test_output_tokens_come_from_usage_not_events(fake_server):
    srv = fake_server(tokens=24, ttft=0.01, itl=0.005, tokens_per_event=3)  # EAGLE-like multi-token events
    r = asyncio.run(run_load(srv.base_url, reqs(2), 1, "openai-completions"))
    assert [x.output_tokens for x in r] == [24, 24]
    assert all(len(x.arrivals_s) == 8 for x in r)


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
    span = max(r.start_s for r in recs)
    assert 0.1 < span < 1.5  # 19 gaps at 50 req/s ~ 0.38 s


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


async def _hog_after(srv, n_requests, delay, block, coro):
    """Run `coro` while blocking the client's event loop for `block` s, `delay` s after the server has
    seen `n_requests` requests: tokens reach the socket while the client cannot read."""
    async def hog():
        while srv.requests_seen < n_requests:
            await asyncio.sleep(0.001)
        await asyncio.sleep(delay)
        time.sleep(block)

    h = asyncio.ensure_future(hog())
    out = await coro
    await h
    return out


@pytest.mark.parametrize("kernel", [True, False])
def test_arrivals_do_not_depend_on_when_the_client_reads(fake_server, monkeypatch, kernel):
    """Four streams get their token at 0.1 s while the client is blocked until ~0.3 s. Stamped by the
    kernel, TTFT and end-to-end latency are the server's 0.1 s; stamped at read time (the fallback
    where a platform has no receive timestamps) they are the client's 0.3 s."""
    if kernel and transport._SO_TIMESTAMPNS is None:
        pytest.skip("no kernel receive timestamps on this platform")
    if not kernel:
        monkeypatch.setattr(transport, "_SO_TIMESTAMPNS", None)
    srv = fake_server(tokens=1, ttft=0.1, itl=0.0)
    recs = asyncio.run(_hog_after(srv, 4, 0.0, 0.3, run_load(srv.base_url, reqs(4), 4, "openai-completions")))
    assert all(r.ok and r.arrival_clock == ("kernel" if kernel else "read") for r in recs)
    expect = 0.1 if kernel else 0.3
    for r in recs:
        assert r.ttft_s == pytest.approx(expect, abs=0.03)
        assert r.e2e_s == pytest.approx(expect, abs=0.03)
    if kernel:  # the client says how long the tokens waited for it
        assert max(r.read_lag_max_s for r in recs) == pytest.approx(0.2, abs=0.05)


def test_a_client_that_fell_behind_is_reported(fake_server):
    """Tokens written 30 ms apart that reach the client in one read are counted, and the cell warns."""
    srv = fake_server(tokens=6, ttft=0.01, itl=0.03)
    recs = asyncio.run(_hog_after(srv, 1, 0.02, 0.15, run_load(srv.base_url, reqs(1), 1, "openai-completions")))
    assert recs[0].ok and recs[0].coalesced_events >= 2
    s = summary.summarize(recs)
    assert s["coalesced_token_events"] == recs[0].coalesced_events and s["coalesced_token_share"] > 0.3
    warnings = summary.measurement_warnings(cell_result(**s))
    assert len(warnings) == 1 and "fell behind" in warnings[0]
    calm = asyncio.run(run_load(srv.base_url, reqs(2), 1, "openai-completions"))
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


def test_https_endpoints_are_verified_and_timed_like_plain_ones(fake_server, tls_cert, monkeypatch):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*map(str, tls_cert))
    srv = fake_server(tokens=12, ttft=0.05, itl=0.01, tls=ctx)
    assert srv.base_url.startswith("https://")
    # an unknown CA is refused: the API key is never sent to an unverified server
    recs = asyncio.run(run_load(srv.base_url, reqs(2), 1, "openai-completions", api_key="sk-secret"))
    assert not any(r.ok for r in recs) and "certificate verify failed" in recs[0].error
    assert srv.requests_seen == 0
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_cert[0]))
    recs = asyncio.run(run_load(srv.base_url, reqs(4), 2, "openai-completions", api_key="sk-secret"))
    assert all(r.ok and r.output_tokens == 12 and len(r.arrivals_s) == 12 for r in recs)
    assert all(r.ttft_s == pytest.approx(0.05, abs=0.02) for r in recs)
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
