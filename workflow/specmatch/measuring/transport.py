"""The transport under the load generator: one keep-alive HTTP/1.1 connection that streams
server-sent events, with token arrivals stamped by the kernel.

Raw non-blocking sockets, parsed in the read callback itself (specmatch.measuring.sse): no framework between
the socket and the clock. Arrival times are the kernel's receive timestamps where Linux gives them
(SO_TIMESTAMPNS), so neither the client's parsing nor the order in which it reads many sockets after
one engine step enters TTFT, ITL or end-to-end latency. What a request's bytes mean is not this
module's business: the endpoint's protocol object (specmatch.measuring.protocols) reads the events.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import sys
import time
from typing import Callable
from .sse import ProtocolError, ResponseParser


class HTTPError(Exception):
    pass


class StaleConnection(HTTPError):
    """The server closed a kept-alive connection before a byte of the response to this request came
    back (an HTTP server closes idle connections: uvicorn, under vLLM and SGLang, after 5 s)."""


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

    def __init__(self, host: str, port: int, headers: dict[str, str], tls: ssl.SSLContext | None = None,
                 prefix: str = ""):
        self.host, self.port = host, port
        self.prefix = prefix.rstrip("/")   # an endpoint served under a path (https://host/team/llm): its root
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
        """Send one request and feed its events to `on_event`. A connection kept alive from an earlier
        request (or opened before the load began) that the server closed while idle fails at once with
        no byte of a response: the server never read the request, so it is sent again, once, on a new
        connection (as HTTP clients retry a pooled connection). The request's time counts from its
        first attempt (the failed one costs the round trip that found the connection closed)."""
        reused = self.sock is not None
        try:
            await self._stream(path, body, on_event)
        except StaleConnection:
            if not reused:
                raise
            await self._stream(path, body, on_event)

    async def _stream(self, path: str, body: bytes, on_event: Callable[[bytes, float], None]) -> None:
        self.read_lags = []  # this request's, even if connecting or sending fails
        self.completed_at = None
        await self.connect()
        loop = asyncio.get_running_loop()
        sock = self.sock
        head = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Content-Type: application/json",
                "Accept: text/event-stream", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        self._offset_s = realtime_offset_ns() / 1e9
        self._send_start = time.perf_counter()
        wire = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        if self._tls is not None:
            self._tls.write(wire)
            wire = self._tls_out.read()
        try:
            await loop.sock_sendall(sock, wire)
        except (BrokenPipeError, ConnectionResetError) as exc:
            await self.close()
            raise StaleConnection(f"connection closed before the request was sent: {exc}") from None
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
            if parser.empty:
                raise StaleConnection(str(exc)) from None
            raise HTTPError(str(exc)) from None
        except ConnectionResetError as exc:
            if not parser.empty:
                raise
            await self.close()
            raise StaleConnection(f"connection reset before a response: {exc}") from None
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
