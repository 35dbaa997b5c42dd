"""A fast loopback webhook receiver for the HTTP-effect benchmarks: answers 200 `{}` to anything.

Run in its own process (`python -m tests.bench.target_server PORT`) so the benchmark's event
loop and the daemon's are not the receiver's bottleneck, and its CPU is measured apart.

It is a plain asyncio protocol on uvloop reading HTTP/1.1 requests framed by Content-Length
(what the daemon and the benchmark's readiness check send) on keep-alive connections. An
aiohttp web server did the same for about as much CPU per request as the daemon's whole HTTP
job once the daemon's client got lean (~175-230 µs per request on the loaded 2-core machine,
2026-12-01): it would have been the bottleneck of the drain it is meant to measure.
"""

from __future__ import annotations

import argparse
import asyncio

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
MAX_HEAD_BYTES = 65_536


class Hook(asyncio.Protocol):
    """One connection: answers each complete request in order (pipelining included)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.body_left = -1  # bytes of the current request's body still to come; -1: in a head
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buffer = self.buffer
        buffer += data
        answers = 0
        while True:
            if self.body_left < 0:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        self.transport.abort()
                    break
                head = bytes(buffer[:end]).lower()
                del buffer[: end + 4]
                self.body_left = _content_length(head)
                self.close_after = b"\r\nconnection: close" in head
                if self.body_left < 0:  # no Content-Length framing: not for this server
                    self.transport.abort()
                    return
            take = min(self.body_left, len(buffer))
            del buffer[:take]
            self.body_left -= take
            if self.body_left:
                break
            self.body_left = -1
            answers += 1
            if self.close_after:
                break
        if answers:
            self.transport.write(ANSWER * answers)
            if self.close_after:
                self.transport.close()


def _content_length(head: bytes) -> int:
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return -1 if b"\r\ntransfer-encoding:" in head else 0
    end = head.find(b"\r\n", at + 2)
    try:
        return int(head[at + 17 : end if end >= 0 else None])
    except ValueError:
        return -1


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Hook, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int, help="the loopback port to listen on")
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
