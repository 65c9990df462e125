"""A small HTTP/1.1 client on asyncio streams: POSTs JSON, reads server-sent events back.

``httpstream.stream_json`` uses it when its httpx client's base URL is ``http://`` and no
proxy in the environment applies. It handles:

- plain HTTP (no TLS) to the client's base URL, its path prefix kept, with the client's
  headers, the request's own overriding them case-insensitively;
- keep-alive: a connection whose body was read to its end after ``[DONE]`` is reused, the
  most recent first (HTTP/1.1, or HTTP/1.0 that says ``Connection: keep-alive``);
- bodies framed by ``Transfer-Encoding: chunked`` (chunk extensions and trailers skipped),
  by ``Content-Length``, or by the server closing the connection;
- 1xx interim answers (``100 Continue``...) before the final one;
- an idle kept-alive connection the server dropped unseen: when it answers nothing at all,
  the request is sent once more, on a new connection;
- arrival times from the kernel: on Linux each connection asks for receive timestamps
  (SO_TIMESTAMPNS) and its bytes carry the time the kernel received their packet, not the
  time the event loop got round to reading them; elsewhere, the time the protocol is fed
  the bytes (not when their reader next runs).

Why not httpx here: httpcore's connection pool does work on every request that grows with
the number of connections it holds (encode/httpcore#1035), and httpx spends several times
the CPU per streamed chunk. Under 64 to 256 concurrent streams a client short of CPU stamps
chunks late, and that lag would count as the engine's TTFT and inter-token latency.

HTTPS, a proxy set in the environment and absolute URLs go through httpx. Failures are raised
as httpx errors (ConnectError, RemoteProtocolError), as on that path; events are not decoded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import struct
import sys
import time
import urllib.request
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from typing import Any, SupportsIndex

import httpx

DONE = "[DONE]"
CONNECT_TIMEOUT_S = 30.0
DRAIN_S = 0.1  # how long the end of a body may lag its [DONE] before the connection is dropped
_READ_LIMIT = 1 << 20
EVENT_MOST = 64 << 20  # bytes of one server-sent event
_OWN_HEADERS = frozenset(
    ("host", "content-length", "content-type", "transfer-encoding", "connection",
     "accept-encoding", "expect", "keep-alive", "te", "upgrade")
)  # fmt: skip


# Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS); the socket module does not name it.
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")


class _KernelStampedSocket(socket.socket):
    """A socket whose ``recv`` (what asyncio's transport calls) also keeps the kernel's
    receive time of the data, converted to ``time.perf_counter``'s clock.

    For TCP the kernel reports the newest packet read by the call; when the client keeps up
    that is the only one, and when it lags the time is still no later than the read.
    """

    stamp: float | None = None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(bufsize, 64, flags)
        now_ns, perf_ns = time.time_ns(), time.perf_counter_ns()
        self.stamp = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(payload)
                # Realtime -> perf_counter: both clocks read together just above.
                self.stamp = (sec * 1_000_000_000 + nsec - now_ns + perf_ns) / 1e9
        return data


async def _kernel_stamped_socket(host: str, port: int) -> _KernelStampedSocket | None:
    """A connected non-blocking socket asking for receive timestamps; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    for family, kind, proto, _, address in await loop.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        sock = _KernelStampedSocket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:  # cancelled (the connect timeout): no socket left open
            sock.close()
            raise
    raise error or OSError(f"cannot resolve {host}")


class _StampedReader(asyncio.StreamReader):
    """A StreamReader that notes when its bytes arrived.

    The protocol feeds it from the selector's callback; the coroutine reading it wakes on a
    later turn of the loop, after every other callback ready by then, which with hundreds of
    streams busy is measurably later. The feed is the truer arrival time of a token.
    """

    def __init__(self) -> None:
        super().__init__(limit=_READ_LIMIT)
        self.fed = 0  # bytes fed so far
        self.used = 0  # bytes taken by the reading side so far
        self._stamps: collections.deque[tuple[int, float]] = collections.deque()
        self.sock: _KernelStampedSocket | None = None  # where kernel times come from

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        self.fed += len(data) if isinstance(data, bytes | bytearray) else len(bytes(data))
        stamp = self.sock.stamp if self.sock is not None else None
        self._stamps.append((self.fed, stamp if stamp is not None else time.perf_counter()))
        super().feed_data(data)

    def arrival(self, offset: int) -> float:
        """When the byte at ``offset`` (counted from 1, over the connection) arrived."""
        stamps = self._stamps
        while len(stamps) > 1 and stamps[0][0] < offset:
            stamps.popleft()
        return stamps[0][1] if stamps else time.perf_counter()


_Conn = tuple[_StampedReader, asyncio.StreamWriter]


class Origin:
    """Kept-alive plain-HTTP connections to one server, for one event loop's client."""

    def __init__(self, host: str, port: int, netloc: str) -> None:
        self.host = host
        self.port = port
        self.netloc = netloc
        self.idle: list[_Conn] = []  # last in, first out: the warmest first
        self.heads: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
        self.closer: AsyncGenerator[None, None] | None = None

    async def connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        reader = _StampedReader()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                sock = await _kernel_stamped_socket(self.host, self.port)
                if sock is None:
                    transport, protocol = await loop.create_connection(
                        lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                        self.host, self.port)
                else:
                    reader.sock = sock
                    transport, protocol = await loop.create_connection(
                        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), sock=sock)
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    def reusable(self) -> _Conn | None:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()  # the server closed it while it was idle
        return None

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _closer(origin_idle: list[_Conn]) -> AsyncGenerator[None, None]:
    """Parked at its ``yield`` for as long as the loop runs. The loop finalizes it when it
    shuts down (asyncio.run does) or once its origin is dropped, and the idle connections
    are closed then, while the loop can still close them: left to the garbage collector,
    they would go with a ResourceWarning, an error under ``-W error``."""
    try:
        yield
    finally:
        for _, writer in origin_idle:
            writer.close()
        origin_idle.clear()


_ORIGINS: weakref.WeakKeyDictionary[httpx.AsyncClient, Origin | None]
_ORIGINS = weakref.WeakKeyDictionary()


def lean_origin(client: httpx.AsyncClient) -> Origin | None:
    """The lean path to this client's server; None where httpx must go (HTTPS, a proxy)."""
    if client in _ORIGINS:
        return _ORIGINS[client]
    url = client.base_url
    origin = None
    if url.scheme == "http" and url.host and not _proxied(url):
        origin = Origin(url.host, url.port or 80, url.netloc.decode("ascii"))
    _ORIGINS[client] = origin
    return origin


def release(client: httpx.AsyncClient) -> None:
    """Forget the client's origin and close its idle connections."""
    origin = _ORIGINS.pop(client, None)
    if origin is not None:
        origin.close()


def _proxied(url: httpx.URL) -> bool:
    """Whether the environment sends this URL through a proxy (httpx honours those)."""
    proxies = urllib.request.getproxies()
    if not (proxies.get("http") or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(url.host)


class Response:
    """The final answer to a request, its head read; its body is read through ``events``."""

    def __init__(self, reader: _StampedReader, status: int, head: dict[str, str]) -> None:
        self.status = status
        self.head = head  # lower-case names; the HTTP version under ""
        self.done = False  # the [DONE] event came
        self.kept = False  # the connection may carry another request
        self._reader = reader
        self._framing = 0 if status in (204, 304) else _framing(head)  # bodiless by definition

    async def preview(self, most: int) -> bytes:
        """Up to about ``most`` bytes of an error answer's body (what arrives within 5 s)."""
        out = b""
        with contextlib.suppress(httpx.HTTPError, TimeoutError):
            async with asyncio.timeout(5.0):
                async for piece, _ in _body(self._reader, self._framing):
                    out += piece
                    if len(out) >= most:
                        break
        return out

    async def events(self) -> AsyncIterator[tuple[float, str]]:
        """(arrival, data) of each event with data, up to the ``[DONE]`` one (then ``done``);
        the events in one piece of the body share its arrival.

        Linear in the body's size however its events are cut into pieces: each piece is
        normalised and searched once (a 100 MB event costs what its bytes cost, not their
        square); one event over EVENT_MOST bytes fails the request."""
        buf = bytearray()
        start = 0  # where the next event begins in buf
        scan = 0  # no event ends before this offset
        held = b""  # a CR that ended the last piece (an LF may follow it)
        pieces = _body(self._reader, self._framing)
        async for piece, now in pieces:
            piece = held + piece if held else piece
            if b"\r" in piece:
                piece = _lf(piece)
            held = b"\r" if piece.endswith(b"\r") else b""
            buf += piece[:-1] if held else piece
            while (end := buf.find(b"\n\n", scan)) >= 0:
                data = _event_data(bytes(buf[start:end]))
                start = scan = end + 2
                if data is None:
                    continue
                if data.strip() == DONE:
                    self.done = True
                    self.kept = _keep_alive(self.head, self._framing) and await _drain(pieces)
                    return
                yield now, data
            if len(buf) - start > EVENT_MOST:
                raise httpx.RemoteProtocolError(
                    f"a stream event over {EVENT_MOST >> 20} MiB (the most one event may hold)")
            del buf[:start]  # what is left is one unfinished event, never rescanned
            scan = max(0, len(buf) - 1)
            start = 0
        data = _event_data(bytes(buf) + held)  # a last event without its blank line
        if data is not None and data.strip() == DONE:
            self.done = True
        elif data is not None:
            yield time.perf_counter(), data


@contextlib.asynccontextmanager
async def post_json(
    origin: Origin,
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
) -> AsyncIterator[Response]:
    """POST ``body`` to ``url`` (relative to the client's base URL) and give the answer; on
    leaving, its connection is kept for the next request if ``kept``, else closed."""
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    key = (url, tuple(headers.items()) if headers else ())
    start = origin.heads.get(key)
    if start is None:
        start = origin.heads[key] = _request_head(client, url, headers, origin.netloc)
    request = b"%s%d\r\n\r\n%s" % (start, len(payload), payload)
    if origin.closer is None:
        origin.closer = _closer(origin.idle)
        await origin.closer.asend(None)
    reader, writer, status, head = await _send(origin, request)
    response = Response(reader, status, head)
    try:
        yield response
    finally:
        if response.kept:
            origin.idle.append((reader, writer))
        else:
            writer.close()


def _request_head(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None, netloc: str
) -> bytes:
    """The request's head up to the Content-Length value (the same for every request)."""
    # Names as given (httpx keeps their case on the wire too); the request's own win.
    merged = {k.decode("latin-1"): v.decode("latin-1") for k, v in client.headers.raw}
    for name, value in (headers or {}).items():
        merged = {k: v for k, v in merged.items() if k.lower() != name.lower()}
        merged[name] = value
    lines = [
        # Appended to the base URL's path, as httpx merges a relative URL.
        f"POST {client.base_url.raw_path.decode('ascii')}{url.lstrip('/')} HTTP/1.1",
        f"Host: {netloc}",
        "Content-Type: application/json",
        "Accept-Encoding: identity",
        *(f"{k}: {v}" for k, v in merged.items() if k.lower() not in _OWN_HEADERS),
        "Content-Length: ",
    ]
    return "\r\n".join(lines).encode("latin-1")


async def _send(
    origin: Origin, request: bytes
) -> tuple[_StampedReader, asyncio.StreamWriter, int, dict[str, str]]:
    """Write the request and read the response head, on an idle kept-alive connection if
    there is one (then once more on a new one if the server had dropped it unseen)."""
    conn = origin.reusable()
    reused = conn is not None
    while True:
        reader, writer = conn if conn is not None else await origin.connect()
        try:
            writer.write(request)
            status, head = await _read_head(reader)
            return reader, writer, status, head
        except (OSError, asyncio.IncompleteReadError) as exc:
            writer.close()
            silent = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
            if reused and silent:
                conn, reused = None, False
                continue
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response."
                if silent
                else "Server disconnected in the middle of the response head."
            ) from None
        except BaseException:
            writer.close()
            raise


async def _read_head(reader: _StampedReader) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names; the HTTP version under "")."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("response head too large") from None
        reader.used += len(raw)
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"bad status line {lines[0][:100]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            continue  # an interim answer; the final one follows
        head = {"": parts[0]}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                head[name.strip().lower()] = value.strip()
        return status, head


def _framing(head: Mapping[str, str]) -> int | None:
    """-1: chunked; n >= 0: Content-Length n; None: the body ends when the server closes."""
    if "chunked" in head.get("transfer-encoding", "").lower():
        return -1
    length = head.get("content-length", "")
    return int(length) if length.isdigit() else None


def _keep_alive(head: Mapping[str, str], framing: int | None) -> bool:
    connection = head.get("connection", "").lower()
    if framing is None or "close" in connection:
        return False
    return head[""] != "HTTP/1.0" or "keep-alive" in connection


async def _body(reader: _StampedReader, framing: int | None) -> AsyncIterator[tuple[bytes, float]]:
    """The body's bytes as they come, with the arrival of their last byte, to the body's end
    as framed."""
    try:
        if framing == -1:
            while True:
                line = await reader.readuntil(b"\r\n")
                reader.used += len(line)
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                        reader.used += len(line)  # trailer fields
                    reader.used += len(line)
                    return
                data = await reader.readexactly(size + 2)
                reader.used += size + 2
                yield data[:-2], reader.arrival(reader.used - 2)
        elif framing is not None:
            left = framing
            while left > 0:
                data = await reader.read(min(left, _READ_LIMIT))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                reader.used += len(data)
                yield data, reader.arrival(reader.used)
        else:
            while data := await reader.read(_READ_LIMIT):
                reader.used += len(data)
                yield data, reader.arrival(reader.used)
    except (OSError, asyncio.IncompleteReadError):
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        ) from None
    except asyncio.LimitOverrunError:
        raise httpx.RemoteProtocolError("chunk size line too long") from None


async def _drain(pieces: AsyncIterator[tuple[bytes, float]]) -> bool:
    """Read on to the end of the body after [DONE] (normally already here) so that the
    connection can be reused; False when it does not come within DRAIN_S."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in pieces:
                pass
    except (TimeoutError, httpx.HTTPError):
        return False
    return True


def _lf(buf: bytes) -> bytes:
    """CRLF and CR line ends as LF; a CR at the very end waits (an LF may follow it)."""
    tail = buf.endswith(b"\r")
    if tail:
        buf = buf[:-1]
    buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return buf + b"\r" if tail else buf


def _event_data(block: bytes) -> str | None:
    """The data of one event block (LF-separated lines); None if it has no data field."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:].decode("utf-8", "replace")  # the usual one-line event
    data: list[str] | None = None
    for line in block.decode("utf-8", "replace").split("\n"):
        if not line or line.startswith(":"):
            continue  # comment / keep-alive
        field, _, value = line.partition(":")
        if field == "data":
            data = data if data is not None else []
            data.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(data) if data is not None else None
