"""Reading one HTTP/1.1 response as its bytes arrive: the status line, the header lines (checked,
and the framing ones found), then the body framed by Content-Length, chunked coding or the end
of the connection, of which only the first `excerpt_bytes + 1` bytes (decoded, when gzip or
deflate) are kept. Bounded: a head larger than `MAX_HEAD_BYTES` is a protocol error.

The connection that feeds it (dispatcher.effects.httpclient) decides what to do once it says
the response can be answered; `reusable` tells whether the connection may carry another.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, NamedTuple

from multidict import CIMultiDict, CIMultiDictProxy

MAX_HEAD_BYTES = 65_536
MAX_CHUNK_LINE_BYTES = 1024


class HttpClientError(Exception):
    """The exchange failed at the HTTP level (connection, framing); a transient failure."""


class ConnectError(HttpClientError):
    """No connection could be made to any address of the target."""


class ServerDisconnected(HttpClientError):
    """The target closed the connection before its response was complete."""


class ProtocolError(HttpClientError):
    """The target's response is not HTTP/1.x as this client reads it."""


class Response(NamedTuple):
    status: int
    headers: CIMultiDictProxy[str]
    excerpt: bytes  # at most excerpt_bytes + 1 bytes of the (decoded) body


_EMPTY_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
# Header lines as RFC 9110 has them: a token, a colon at once (no space before it), a value
# without CR or LF. Each line starts with the CRLF that ended the one before.
_FIELD_LINES = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n]*)*")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")  # up to 2**64 - 1 bytes per chunk
_FRAMING_FIELDS = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection|content-encoding):([^\r\n]*)",
    re.IGNORECASE,
)
_NO_BODY_STATUSES = frozenset({204, 304})


class ResponseReader:
    """The response to one request. `feed` takes bytes as they arrive and returns True once
    the response can be answered: its body ended, or the excerpt is full (the rest is never
    read). A framing fault raises ProtocolError; from `in_body` on, the status is decided."""

    def __init__(self, excerpt_limit: int) -> None:
        self.buffer = bytearray()  # received and not yet consumed
        self.excerpt_limit = excerpt_limit
        self.status = 0
        self.fields = b""  # the header lines of the head, each after its CRLF
        self.in_body = False
        self.reusable = True
        self._length: int | None = None  # bytes of body still expected (Content-Length)
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still expected, then its CRLF
        self._chunk_state = "size"  # size, data, data_crlf, trailers
        self._until_close = False
        self._body = bytearray()
        self._inflate: Any = None

    def feed(self, data: bytes) -> bool:
        self.buffer += data
        while not self.in_body:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                return False
            if end > MAX_HEAD_BYTES:
                raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
            head = bytes(self.buffer[:end])
            del self.buffer[: end + 4]
            if not self._head(head):
                continue  # an informational (1xx) response: the real one follows
        return self._read_body()

    def ended_cleanly(self) -> bool:
        """Whether the connection may carry the next request: the response ended exactly
        where its framing says, nothing after it."""
        return self.reusable and not self.buffer

    def response(self) -> Response:
        headers = _EMPTY_HEADERS
        if not 200 <= self.status < 300:  # classify reads Retry-After and Location
            pairs = (line.partition(b":") for line in self.fields.split(b"\r\n")[1:])
            headers = CIMultiDictProxy(
                CIMultiDict((n.decode("latin-1"), v.strip().decode("latin-1")) for n, _, v in pairs)
            )
        return Response(self.status, headers, bytes(self._body))

    def _head(self, head: bytes) -> bool:
        """Read a response head; False for a 1xx response (skipped). The header lines are
        checked and the framing headers found by two regular expressions over the whole
        block (a loop over the lines in Python cost 5 % of the daemon's CPU per HTTP job)."""
        end = head.find(b"\r\n")
        status_line, fields = (head, b"") if end < 0 else (head[:end], head[end:])
        if (
            len(status_line) < 12
            or not status_line.startswith(b"HTTP/1.")
            or status_line[8:9] != b" "
            or not status_line[9:12].isdigit()
            or (len(status_line) > 12 and status_line[12:13] != b" ")
        ):
            raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(status_line[9:12])
        if status < 100:
            raise ProtocolError(f"status {status} is not an HTTP status")
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("the target switched protocols (101), which was not asked")
            return False
        if not _FIELD_LINES.fullmatch(fields):
            bad = next(
                (
                    line
                    for line in fields.split(b"\r\n")[1:]
                    if not _FIELD_LINES.fullmatch(b"\r\n" + line)
                ),
                fields,
            )
            raise ProtocolError(f"malformed header line: {bad[:80]!r}")
        self.status = status
        self.fields = fields
        lengths: list[bytes] = []
        codings: list[bytes] = []
        close = status_line[7:8] != b"1"  # HTTP/1.0: the connection ends with the response
        content_coding = b""
        for name, value in _FRAMING_FIELDS.findall(fields):
            lowered = name.lower()
            if lowered == b"content-length":
                lengths.extend(v.strip() for v in value.split(b","))
            elif lowered == b"transfer-encoding":
                codings.extend(v.strip().lower() for v in value.split(b",") if v.strip())
            elif lowered == b"connection":
                close = close or b"close" in value.lower()
            else:
                content_coding = value.strip().lower()
        self.reusable = not close
        if content_coding in (b"gzip", b"x-gzip", b"deflate"):
            self._inflate = zlib.decompressobj(47)  # gzip or zlib, told by the header
        if status in _NO_BODY_STATUSES:
            self._length = 0
        elif codings:
            if codings[-1] == b"chunked":
                self._chunked = True
            else:
                self._until_close = True
                self.reusable = False
            if lengths:  # both framings: a smuggling attempt or a broken proxy; never reuse
                self.reusable = False
        elif lengths:
            if len(set(lengths)) != 1 or not lengths[0].isdigit():
                raise ProtocolError(f"invalid Content-Length {b', '.join(lengths)[:80]!r}")
            self._length = int(lengths[0])
        else:
            self._until_close = True
            self.reusable = False
        self.in_body = True  # the head is valid: from here on the status decides
        return True

    def _read_body(self) -> bool:
        if self._chunked:
            if self._read_chunked():
                return True
        elif self._length is not None:
            take = min(self._length, len(self.buffer))
            if take:
                self._keep(self.buffer[:take])
                del self.buffer[:take]
                self._length -= take
            if self._length == 0:
                return True
        else:  # until close
            if self.buffer:
                self._keep(self.buffer)
                self.buffer.clear()
        if len(self._body) > self.excerpt_limit:
            self.reusable = False  # the rest of the body is not read: the connection ends
            return True
        return False

    def _read_chunked(self) -> bool:
        """Read chunks; True once the last chunk and the trailers are in."""
        buffer = self.buffer
        while True:
            if self._chunk_state == "size":
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_CHUNK_LINE_BYTES:
                        raise ProtocolError("chunk size line too long")
                    return False
                size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
                del buffer[: end + 2]
                if not _HEX.fullmatch(size_text):  # int() would also take 0x, _ and signs
                    raise ProtocolError(f"invalid chunk size {size_text[:20]!r}")
                size = int(size_text, 16)
                if size == 0:
                    self._chunk_state = "trailers"
                else:
                    self._chunk_left, self._chunk_state = size, "data"
            elif self._chunk_state == "data":
                take = min(self._chunk_left, len(buffer))
                if take == 0:
                    return False
                self._keep(buffer[:take])
                del buffer[:take]
                self._chunk_left -= take
                if self._chunk_left:
                    return False
                self._chunk_state = "data_crlf"
            elif self._chunk_state == "data_crlf":
                if len(buffer) < 2:
                    return False
                if buffer[:2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                del buffer[:2]
                self._chunk_state = "size"
            else:  # trailers: header lines, then an empty line
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ProtocolError("trailer section too large")
                    return False
                del buffer[: end + 2]
                if end == 0:
                    return True

    def _keep(self, data: bytes | bytearray) -> None:
        room = self.excerpt_limit + 1 - len(self._body)
        if room <= 0:
            return
        if self._inflate is not None:
            try:
                data = self._inflate.decompress(bytes(data), room)
            except zlib.error:
                self._inflate = None  # not what the header said: keep the raw bytes
        self._body += data[:room]
