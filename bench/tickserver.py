"""A streaming server for measuring the client at high concurrency (bench fixture, never a default).

It behaves like a batched engine: one ticker, every `itl` seconds, writes one token event to every
live stream (`ttft` after each request arrived), then a usage event and `[DONE]`. The final event
carries the server's own clock for the request (`server_timing`): when the request's first byte
reached the server's socket (the kernel's receive timestamp, so requests queued behind the server's
own work are not charged to the client) and when each event was handed to the kernel. Raw
non-blocking sockets and one write per event keep the server far below one core at 256 streams.

    python bench/tickserver.py --tokens 32 --ttft 0.05 --itl 0.01      # prints {"base_url": ...}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflow"))

from specmatch.measuring.transport import enable_kernel_stamps, realtime_offset_ns, recv_stamped  # noqa: E402


def event(obj: dict | bytes) -> bytes:
    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Conn:
    __slots__ = ("sock", "buf", "arrived")

    def __init__(self, sock: socket.socket):
        self.sock, self.buf, self.arrived = sock, b"", None


class TickServer:
    def __init__(self, tokens: int, ttft: float, itl: float, host: str = "127.0.0.1", port: int = 0):
        self.tokens, self.ttft, self.itl = tokens, ttft, itl
        self.host, self.port = host, port
        self.streams: list[dict] = []
        self.wake = asyncio.Event()
        self.offset = realtime_offset_ns() / 1e9
        self.token = {False: event({"id": "c", "object": "chunk", "choices": [{"index": 0, "text": "x"}], "usage": None}),
                      True: event({"id": "c", "object": "chunk", "choices": [{"index": 0, "delta": {"content": "x"}}],
                                   "usage": None})}

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((self.host, self.port))
        lsock.listen(1024)
        lsock.setblocking(False)
        print(json.dumps({"base_url": f"http://{self.host}:{lsock.getsockname()[1]}"}), flush=True)
        ticker = asyncio.ensure_future(self.tick())
        try:
            while True:
                sock, _ = await loop.sock_accept(lsock)
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                enable_kernel_stamps(sock)
                loop.add_reader(sock.fileno(), self.readable, Conn(sock))
        finally:
            ticker.cancel()

    def readable(self, c: Conn) -> None:
        try:
            data, stamp = recv_stamped(c.sock, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            asyncio.get_running_loop().remove_reader(c.sock.fileno())
            self.streams = [s for s in self.streams if s["conn"] is not c]
            c.sock.close()
            return
        if c.arrived is None:  # the first byte of a request: its arrival by the kernel's clock
            c.arrived = stamp - self.offset if stamp is not None else time.perf_counter()
        c.buf += data
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = c.buf[:end].decode("latin-1").split("\r\n")
        length = next((int(h.split(":", 1)[1]) for h in head[1:] if h.lower().startswith("content-length:")), 0)
        if len(c.buf) < end + 4 + length:
            return
        body, c.buf = c.buf[end + 4:end + 4 + length], c.buf[end + 4 + length:]
        path = head[0].split(" ")[1]
        req = json.loads(body)
        n = min(self.tokens, req.get("max_tokens", self.tokens))
        arrived, c.arrived = c.arrived, None
        self.send(c, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.streams.append({"conn": c, "left": n, "n": n, "chat": path.endswith("chat/completions"),
                             "arrived": arrived, "start": arrived + self.ttft, "writes": []})
        self.wake.set()

    @staticmethod
    def send(c: Conn, data: bytes) -> None:
        if c.sock.send(data) != len(data):  # never with a client that keeps up; say so if it does not
            raise RuntimeError("the client's receive buffer is full: it is not reading")

    async def tick(self) -> None:
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            now = time.perf_counter()
            keep = []
            for st in self.streams:
                if now < st["start"]:
                    keep.append(st)
                    continue
                st["writes"].append(time.perf_counter())  # handed to the kernel now
                self.send(st["conn"], self.token[st["chat"]])
                st["left"] -= 1
                if st["left"] > 0:
                    keep.append(st)
                    continue
                final = {"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": st["n"],
                                                             "total_tokens": st["n"] + 1},
                         "server_timing": {"received_abs": st["arrived"], "event_abs": st["writes"],
                                           "end_abs": time.perf_counter()}}
                self.send(st["conn"], event(final) + event(b"[DONE]") + b"0\r\n\r\n")
            self.streams = keep
            await asyncio.sleep(max(0.0, self.itl - (time.perf_counter() - now)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    asyncio.run(TickServer(a.tokens, a.ttft, a.itl, port=a.port).serve())


if __name__ == "__main__":
    main()
