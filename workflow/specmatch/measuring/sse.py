"""One HTTP/1.1 response carrying server-sent events, parsed incrementally from socket reads.

The client feeds every read to `ResponseParser.feed` together with the time the bytes arrived, and
the parser hands each complete `data:` event to a callback with that time, synchronously, from the
read callback: no coroutine switch or loop turn per event, so a read of 256 sockets after one
batched engine step costs one pass over the data, not 256 wake-ups. An event's time is the arrival
of the read that completed it (its last byte), and events that arrived together share it.

Chunked, Content-Length and read-until-close bodies are handled; a non-200 body is collected for the
error message. Anything malformed raises `ProtocolError` (the request is then a failure record).
"""
from __future__ import annotations

from typing import Callable


class ProtocolError(Exception):
    """The server's bytes are not a well-formed HTTP/1.1 response."""


class ResponseParser:
    __slots__ = ("on_event", "buf", "status", "headers", "mode", "remaining", "sse", "body", "complete",
                 "got_done", "keep_alive", "head_done", "received")

    def __init__(self, on_event: Callable[[bytes, float], None]):
        self.on_event = on_event
        self.buf = b""
        self.head_done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.mode = ""          # "chunked" | "length" | "close"
        self.remaining = 0      # body bytes still expected in "length" mode
        self.sse = b""          # an event not yet terminated by a blank line
        self.body = bytearray()  # the body of a non-200 response
        self.complete = False
        self.got_done = False   # saw `data: [DONE]`
        self.keep_alive = True
        self.received = 0       # bytes of the response read so far

    # -- input ---------------------------------------------------------------------------------
    def feed(self, data: bytes, t: float) -> bool:
        """Consume one read that arrived at time `t`; True once the response is complete."""
        self.received += len(data)
        if self.complete:
            if data:  # bytes after the end of a response we never pipelined for: do not reuse the connection
                self.keep_alive = False
            return True
        buf = self.buf + data if self.buf else data
        if not self.head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 1 << 16:
                    raise ProtocolError("response head longer than 64 KB")
                self.buf = buf
                return False
            self._head(buf[:end])
            buf = buf[end + 4:]
        mode = self.mode
        if mode == "chunked":
            self.buf = self._chunked(buf, t)
        elif mode == "length":
            piece = buf[:self.remaining]
            self.remaining -= len(piece)
            if len(buf) > len(piece):
                self.keep_alive = False
            self.buf = b""
            if piece:
                self._body(piece, t)
            if self.remaining == 0:
                self.complete = True
        else:
            self.buf = b""
            if buf:
                self._body(buf, t)
        return self.complete

    @property
    def empty(self) -> bool:
        """Nothing of a response came back (the connection was closed before the server answered)."""
        return self.received == 0 and not self.head_done and not self.buf

    def feed_eof(self, t: float) -> None:
        """The server closed the connection. Fine for a read-until-close body; a cut stream otherwise."""
        if self.complete:
            return
        self.keep_alive = False
        if not self.head_done:
            raise ProtocolError("connection closed before a response" if not self.buf
                                else "connection closed inside the response head")
        if self.mode == "close":
            if self.sse:
                self._body(b"\n\n", t)  # a final event without its blank line
            self.complete = True
            return
        raise ProtocolError("stream cut short (connection closed mid-body)")

    # -- pieces --------------------------------------------------------------------------------
    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            k, sep, v = line.decode("latin-1").partition(":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:100]!r}")
            self.headers[k.strip().lower()] = v.strip()
        h = self.headers
        if h.get("connection", "").lower() == "close" or parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        if "chunked" in h.get("transfer-encoding", "").lower():
            self.mode = "chunked"
        elif "content-length" in h:
            try:
                self.remaining = int(h["content-length"])
            except ValueError:
                raise ProtocolError(f"bad Content-Length: {h['content-length']!r}") from None
            self.mode = "length"
            if self.remaining == 0:
                self.complete = True
        else:
            self.mode = "close"
            self.keep_alive = False
        self.head_done = True

    def _chunked(self, buf: bytes, t: float) -> bytes:
        """Emit every complete chunk in `buf`; return what is left for the next read."""
        pos, n = 0, len(buf)
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                if n - pos > 1024:
                    raise ProtocolError("chunk-size line longer than 1 KB")
                break
            try:
                size = int(buf[pos:nl].split(b";", 1)[0], 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size: {buf[pos:nl][:40]!r}") from None
            if size == 0:
                if buf.startswith(b"\r\n", nl + 2):  # no trailers
                    end = nl + 4
                else:
                    tr = buf.find(b"\r\n\r\n", nl + 2)
                    if tr < 0:
                        break
                    end = tr + 4
                self.complete = True
                if end < n:
                    self.keep_alive = False
                return b""
            end = nl + 2 + size
            if end + 2 > n:
                break
            if buf[end:end + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._body(buf[nl + 2:end], t)
            pos = end + 2
        return buf[pos:] if pos else buf

    def _body(self, piece: bytes, t: float) -> None:
        if self.status != 200:
            if len(self.body) < 1 << 16:
                self.body += piece
            return
        sse = self.sse + piece if self.sse else piece
        if b"\r" in sse:  # CRLF line endings are legal in SSE (a \r whose \n is still to come stays in the rest)
            sse = sse.replace(b"\r\n", b"\n")
        self.sse = self._events(sse, t)

    def _events(self, sse: bytes, t: float) -> bytes:
        """Dispatch every complete event in `sse`; return the unterminated rest."""
        start = 0
        on_event = self.on_event
        while True:
            sep = sse.find(b"\n\n", start)
            if sep < 0:
                break
            event = sse[start:sep]
            start = sep + 2
            if event.startswith(b"data:") and b"\n" not in event:  # the usual one-line event
                data = event[5:].strip()
            else:  # several fields: data lines are joined with newlines, others (id, event, retry, comments) ignored
                lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
                if not lines:
                    continue
                data = b"\n".join(lines)
            if data == b"[DONE]":
                self.got_done = True
            else:
                on_event(data, t)
        return sse[start:]
