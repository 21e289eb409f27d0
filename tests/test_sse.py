"""The incremental HTTP/1.1 + server-sent-events parser, fed the way sockets deliver bytes: in any split."""
import random
from pathlib import Path

import pytest

from specmatch.measuring.sse import ProtocolError, ResponseParser

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"


def chunked(*events: bytes, trailer: bytes = b"") -> bytes:
    body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + body + b"0\r\n" + trailer + b"\r\n")


def parse(stream: bytes, cuts: list[int]) -> tuple[ResponseParser, list[tuple[bytes, float]]]:
    """Feed `stream` split at `cuts`; piece k arrives at time k."""
    got = []
    p = ResponseParser(lambda data, t: got.append((data, t)))
    bounds = [0, *cuts, len(stream)]
    done = False
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        done = p.feed(stream[a:b], float(k))
    return p, got if done else pytest.fail("response not complete")


EVENTS = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"b\\n\\nc"}]}\n\n',
          b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n', b"data: [DONE]\n\n"]


def test_every_split_point_gives_the_same_events():
    stream = chunked(*EVENTS)
    whole, events = parse(stream, [])
    assert [e for e, _ in events] == [e[6:-2] for e in EVENTS[:3]] and whole.got_done and whole.keep_alive
    for cut in range(1, len(stream)):
        _p, got = parse(stream, [cut])
        assert [e for e, _ in got] == [e for e, _ in events], cut
    rng = random.Random(0)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(2, 30)))
        _p, got = parse(stream, cuts)
        assert [e for e, _ in got] == [e for e, _ in events]


def test_an_event_carries_the_time_of_the_read_that_completed_it():
    stream = chunked(*EVENTS)
    first_end = stream.index(b"a\"}]}\n\n") + 7   # inside the first chunk, before its CRLF
    _p, got = parse(stream, [first_end - 3, first_end + 2])
    assert got[0][1] == 1.0  # its last bytes came in the second piece (index 1)
    assert [t for _e, t in got[1:]] == [2.0, 2.0]  # the rest arrived together, in the third


def test_recorded_vllm_streams_parse_exactly():
    """The real vLLM CPU responses recorded for the engine tests, split at random."""
    rng = random.Random(1)
    files = sorted(FIXTURES.glob("*.sse"))
    assert files
    for f in files:
        lines = [ln for ln in f.read_text().split("\n\n") if ln.strip()]
        stream = chunked(*[(ln + "\n\n").encode() for ln in lines])
        cuts = sorted(rng.sample(range(1, len(stream)), 20))
        p, got = parse(stream, cuts)
        data = [ln[6:].encode() for ln in lines if ln.startswith("data: ") and ln != "data: [DONE]"]
        assert [e for e, _ in got] == data and p.got_done


def test_crlf_multiline_and_comment_fields():
    ev = (b": keep-alive comment\r\n\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
          b"data: [DONE]\r\n\r\n")
    stream = chunked(ev)
    for cut in range(1, len(stream)):
        _p, got = parse(stream, [cut])
        assert [e for e, _ in got] == [b'{"a":\n1}'], cut


def test_content_length_and_read_until_close_bodies():
    body = b"data: {\"x\":1}\n\ndata: [DONE]\n\n"
    fixed = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    p, got = parse(fixed, [20])
    assert got == [(b'{"x":1}', 1.0)] and p.got_done and p.keep_alive
    p = ResponseParser(lambda d, t: got.append(d))
    got.clear()
    assert not p.feed(b"HTTP/1.0 200 OK\r\n\r\ndata: 1\n\ndata: 2", 0.0)
    p.feed_eof(1.0)  # the last event had no blank line: the close ends it
    assert got == [b"1", b"2"] and p.complete and not p.keep_alive


def test_trailers_and_bytes_after_the_end():
    p, _ = parse(chunked(*EVENTS, trailer=b"x-done: 1\r\n"), [])
    assert p.complete and p.keep_alive
    p = ResponseParser(lambda d, t: None)
    assert p.feed(chunked(*EVENTS) + b"HTTP/1.1 200 OK", 0.0)
    assert not p.keep_alive  # we never pipeline: stray bytes mean the connection cannot be reused


def test_error_status_keeps_the_body_for_the_message():
    body = b'{"error": "model not found"}'
    p = ResponseParser(lambda d, t: pytest.fail("no events from an error body"))
    assert p.feed(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body, 0.0)
    assert p.status == 404 and bytes(p.body) == body and not p.keep_alive


@pytest.mark.parametrize("stream, message", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", "chunk not followed by CRLF"),
])
def test_malformed_responses_are_named(stream, message):
    p = ResponseParser(lambda d, t: None)
    with pytest.raises(ProtocolError, match=message):
        p.feed(stream, 0.0)


@pytest.mark.parametrize("stream, message", [
    (b"", "connection closed before a response"),
    (b"HTTP/1.1 200 OK\r\nTransfer", "inside the response head"),
    (chunked(*EVENTS)[:-20], "stream cut short"),
])
def test_a_close_before_the_end_is_a_cut_stream(stream, message):
    p = ResponseParser(lambda d, t: None)
    if stream:
        assert not p.feed(stream, 0.0)
    with pytest.raises(ProtocolError, match=message):
        p.feed_eof(1.0)
