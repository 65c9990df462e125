"""The one fake HTTP server of the tests and benchmarks, its answers scripted route by route.

Routes map ``(method, path)`` to a :class:`Reply`, a list of replies (served in order, the
last one repeating), a callable taking the request's JSON body (run on a thread of its own,
so it may block), or an :class:`OnRequest` taking the whole :class:`Seen` request (run on the
server's event loop: it must not block). SSE replies stream ``data:`` events, each after its
delay, and can end without ``[DONE]`` (a truncated stream).

The server is one asyncio HTTP/1 Protocol, so that it plays every part the project needs:

- in-test endpoints (the default): HTTP/1.0, every answer ends by closing the connection;
- the fake SGLang / vLLM engine processes (:mod:`testkit.fake_engine`): the same, on the
  engine's host and port, run in the foreground with :meth:`ScriptedServer.serve_forever`;
- the timing stub of the fidelity benchmark (:mod:`testkit.timed_stream`): ``keep_alive``
  HTTP/1.1 with chunked streams, and events sent by timer callbacks at their due instants
  (measured from the request's receipt, so delays do not add up), each stamped on
  :class:`Seen` when handed to the kernel. Timers rather than threads keep the server's own
  lag small next to the clients' at hundreds of streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Event = tuple[float, Any]  # (delay before it in seconds, dict payload or raw string)


@dataclass
class Reply:
    status: int = 200
    json_body: Any = None
    text: str | None = None
    events: Sequence[Event] | None = None  # SSE
    done: bool = True  # SSE ends with data: [DONE]
    delay: float = 0.0  # before answering
    content_type: str | None = None
    # Run once the whole answer is with the kernel (an engine's crash after a request).
    then: Callable[[], None] | None = None
    # keep_alive SSE: each event's bytes in chunks of at most this many (one event, many
    # pieces of body, as a server writing a huge event as it goes sends it)
    chunk_bytes: int | None = None


@dataclass
class Seen:
    """One request as the server saw it, and (for SSE answers) when its events went out."""

    method: str
    path: str
    headers: dict[str, str]  # names as the client sent them
    body: Any  # JSON, else the text, else None
    t_recv: float = 0.0  # time.perf_counter() once the whole request was in
    t_write: list[float] = field(default_factory=list)  # per SSE event, once written
    t_end: float | None = None  # once the whole answer was written
    complete: bool = False  # False: not answered (yet), or the client went away mid-stream
    backlogged: int = 0  # events written while the socket's send buffer was full

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)


@dataclass(frozen=True)
class OnRequest:
    """A route answered from the whole request, on the event loop (it must not block)."""

    answer: Callable[[Seen], Reply]


Route = Reply | list[Reply] | Callable[[Any], Reply] | OnRequest
Routes = dict[tuple[str, str], Route]


@dataclass
class ScriptedServer:
    routes: Routes = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free one; the bound one once constructed
    keep_alive: bool = False  # HTTP/1.1 keep-alive and chunked streams, else HTTP/1.0
    log: Callable[[str], None] | None = None  # one line per answer, as http.server logs
    connections: int = field(default=0, init=False)  # accepted so far

    def __post_init__(self) -> None:
        # Bound at once, so that the URL is known before the server runs. A deep backlog: a
        # closed-loop client opens hundreds of connections at once, and a dropped SYN would
        # cost it a 1 s retransmit that no client could be blamed for.
        self._sock = socket.create_server((self.host, self.port), backlog=4096)
        self.port = int(self._sock.getsockname()[1])
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bodies(self, path: str) -> list[Any]:
        return [s.body for s in self.seen if s.path == path]

    def __enter__(self) -> ScriptedServer:
        """Serve on an event loop of its own, in a daemon thread."""
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(loop), loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()

    def serve_forever(self) -> None:
        """Serve in the foreground until the process ends (an engine stand-in's main)."""

        async def forever() -> None:
            await self._start(asyncio.get_running_loop())
            await asyncio.Event().wait()

        asyncio.run(forever())

    async def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._server = await loop.create_server(lambda: _Connection(self), sock=self._sock)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._conns):
                conn.close()
            await self._server.wait_closed()

    # ---------------------------------------------------------------- answering

    def _dispatch(self, conn: _Connection, seen: Seen) -> None:
        route = self.routes.get((seen.method, seen.path))
        if route is None:
            self._respond(conn, seen, Reply(404, {"error": f"no route {seen.method} {seen.path}"}))
        elif isinstance(route, Reply):
            self._respond(conn, seen, route)
        elif isinstance(route, list):
            self._respond(conn, seen, route.pop(0) if len(route) > 1 else route[0])
        elif isinstance(route, OnRequest):
            try:
                reply = route.answer(seen)
            except Exception:
                traceback.print_exc()
                conn.close()
                return
            self._respond(conn, seen, reply)
        else:
            threading.Thread(target=self._answer_on_thread, args=(conn, seen, route),
                             daemon=True).start()

    def _answer_on_thread(self, conn: _Connection, seen: Seen,
                          route: Callable[[Any], Reply]) -> None:
        loop = self._loop
        try:
            reply = route(seen.body)
        except Exception:
            traceback.print_exc()
            if loop is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(conn.close)
            return
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the server stopped meanwhile
                loop.call_soon_threadsafe(self._respond, conn, seen, reply)

    def _respond(self, conn: _Connection, seen: Seen, reply: Reply) -> None:
        if reply.delay > 0:
            assert self._loop is not None
            self._loop.call_later(reply.delay, self._send, conn, seen, reply)
        else:
            self._send(conn, seen, reply)

    def _send(self, conn: _Connection, seen: Seen, reply: Reply) -> None:
        if conn.transport is None:
            return  # the client went away
        if self.log is not None:
            self.log(f'http: "{seen.method} {seen.path} {conn.version}" {reply.status} -')
        status = f"{conn.reply_version} {reply.status} {_reason(reply.status)}\r\n"
        if reply.events is not None:
            head = status + "Content-Type: text/event-stream\r\n"
            if conn.keep:
                head += "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
            conn.write((head + "\r\n").encode())
            conn.stream = _Stream(self, conn, seen, reply)
            return
        if reply.text is not None:
            data = reply.text.encode()
            ctype = reply.content_type or "text/plain"
        else:
            data = json.dumps(reply.json_body if reply.json_body is not None else {}).encode()
            ctype = reply.content_type or "application/json"
        head = f"{status}Content-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n"
        conn.write(head.encode() + data)
        self._finish(conn, seen, reply)

    def _finish(self, conn: _Connection, seen: Seen, reply: Reply) -> None:
        seen.t_end = time.perf_counter()
        seen.complete = True
        conn.stream = None
        conn.busy = False
        if not conn.keep:
            conn.close()
        if reply.then is not None:
            conn.after_flush(reply.then)
        if conn.keep and conn.buf:
            conn.next_request(time.perf_counter())


class _Stream:
    """One SSE answer: each event written by a timer callback once due (due instants are
    offsets from the request's receipt); events due together go out in one callback."""

    def __init__(self, server: ScriptedServer, conn: _Connection, seen: Seen,
                 reply: Reply) -> None:
        self.server, self.conn, self.seen, self.reply = server, conn, seen, reply
        events = reply.events or ()
        self.payloads = [p if isinstance(p, str) else json.dumps(p)
                         for _, p in events]
        due, at = [], seen.t_recv + reply.delay
        for delay, _ in events:
            at += delay
            due.append(at)
        self.due = due
        self.i = 0
        self.timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.due[self.i] - time.perf_counter() if self.i < len(self.due) else 0.0
        self.timer = loop.call_later(max(0.0, wait), self._write)

    def _write(self) -> None:
        conn, seen = self.conn, self.seen
        if conn.transport is None:
            return
        while self.i < len(self.due) and self.due[self.i] <= time.perf_counter():
            data = conn.frame(f"data: {self.payloads[self.i]}\n\n".encode(),
                              self.reply.chunk_bytes)
            self.i += 1
            if self.i == len(self.due):
                data += self._end()  # the end goes out with the last event
            conn.write(data)
            seen.t_write.append(time.perf_counter())
            if conn.transport is not None and conn.transport.get_write_buffer_size():
                seen.backlogged += 1  # not all in the kernel yet: the stamp is early
        if self.i < len(self.due):
            self._arm()
            return
        if not self.due:
            conn.write(self._end())
        self.server._finish(conn, seen, self.reply)

    def _end(self) -> bytes:
        done = self.conn.frame(b"data: [DONE]\n\n") if self.reply.done else b""
        return done + (b"0\r\n\r\n" if self.conn.keep else b"")

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class _Connection(asyncio.Protocol):
    """One client connection: requests one after another, each answered in full before the
    next is read. The receipt is stamped in data_received, the earliest the server sees it."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.stream: _Stream | None = None
        self.keep = False
        self.closed = False
        self.version = "HTTP/1.0"

    @property
    def reply_version(self) -> str:
        return "HTTP/1.1" if self.keep else "HTTP/1.0"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        # asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP, which ours (from
        # socket.create_server) are not: without it, Nagle holds small chunks back for ms.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport
        self.server._conns.add(self)
        self.server.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        if self.stream is not None:
            self.stream.cancel()
        self.transport = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None and data:
            self.transport.write(data)

    def frame(self, data: bytes, most: int | None = None) -> bytes:
        if not self.keep:
            return data
        most = most or len(data) or 1
        return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + most]), data[i:i + most])
                        for i in range(0, len(data), most))

    def after_flush(self, fn: Callable[[], None]) -> None:
        """``fn`` once what was written has left the buffer (or the connection is gone)."""
        if self.transport is None or not self.transport.get_write_buffer_size():
            fn()
        else:
            asyncio.get_running_loop().call_later(0.001, self.after_flush, fn)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        if not self.busy:
            self.next_request(now)

    def next_request(self, now: float) -> None:
        while not self.busy and not self.closed and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            method, path, version, headers = _parse_head(self.buf[:end])
            size = int(_header(headers, "content-length") or 0)
            if len(self.buf) < end + 4 + size:
                return
            raw = self.buf[end + 4 : end + 4 + size]
            self.buf = self.buf[end + 4 + size :]
            self.version = version
            self.keep = (self.server.keep_alive and version == "HTTP/1.1"
                         and (_header(headers, "connection") or "").lower() != "close")
            self.busy = True
            seen = Seen(method, path, headers, _body(raw), t_recv=now)
            self.server.seen.append(seen)
            self.server._dispatch(self, seen)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, version = [*lines[0].split(" ", 2), "", ""][:3]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    return method, path, version or "HTTP/1.0", headers


def _header(headers: dict[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def _body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode(errors="replace")


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def sglang_routes(generate: Route) -> Routes:
    """A healthy SGLang server's routes, /generate answered by ``generate``."""
    return {("GET", "/health"): Reply(json_body={}), ("POST", "/flush_cache"): Reply(json_body={}),
            ("POST", "/generate"): generate}  # fmt: skip

