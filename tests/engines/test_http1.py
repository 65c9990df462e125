"""The lean HTTP/1.1 path of ``stream_json``, against a raw TCP server answering byte for byte.

Each test scripts the server's answers (the exact bytes, split into TCP writes, and whether the
connection is closed after them) and reads them through ``stream_json`` with an httpx client
whose base URL is that server, so that framing, SSE parsing, keep-alive and the retry of a
dropped idle connection are checked on the wire.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pytest

from pytest_osprey.engines.http import http1
from pytest_osprey.engines.http.stream import StreamError, stream_json

T = TypeVar("T")
URL = "/v1/completions"
BODY = {"prompt": "Hi", "stream": True}
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------- the server


@dataclass
class Answer:
    writes: tuple[bytes, ...]  # sent one by one, the loop turning between them
    close: bool = False  # close the connection afterwards, without saying so


DROP = Answer((), close=True)  # read the request, close without answering


@dataclass
class Seen:
    connection: int
    line: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class RawServer:
    answers: list[Answer]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        conn = self.connections
        self.connections += 1
        try:
            while self.answers:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed it
                line, *fields = raw.decode("latin-1").split("\r\n")[:-2]
                headers = [(k, v.strip()) for k, _, v in (f.partition(":") for f in fields)]
                length = [int(v) for k, v in headers if k.lower() == "content-length"]
                body = await reader.readexactly(length[0] if length else 0)
                self.seen.append(Seen(conn, line, headers, body))
                answer = self.answers.pop(0)
                for i, data in enumerate(answer.writes):
                    if i:
                        await asyncio.sleep(0.005)
                    writer.write(data)
                    await writer.drain()
                if answer.close:
                    return
        finally:
            writer.close()

    async def settle(self) -> None:
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=1.0)
            for task in pending:
                task.cancel()


def serve(
    answers: list[Answer],
    talk: Callable[[httpx.AsyncClient], Awaitable[T]],
    path: str = "",
    headers: dict[str, str] | None = None,
) -> tuple[T, RawServer]:
    """Run ``talk`` with a client of a server giving ``answers``; its result and the server."""
    server = RawServer(list(answers))

    async def main() -> T:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        server.port = listener.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{server.port}{path}"
        client = httpx.AsyncClient(base_url=url, headers=headers)
        try:
            assert http1.lean_origin(client) is not None  # the path under test
            return await talk(client)
        finally:
            http1.release(client)
            await client.aclose()
            listener.close()
            await server.settle()
            await listener.wait_closed()

    return asyncio.run(main()), server


async def chunks(
    client: httpx.AsyncClient, url: str = URL, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    return [chunk async for _, chunk in stream_json(client, url, BODY, headers)]


def times(n: int) -> Callable[[httpx.AsyncClient], Awaitable[list[list[dict[str, Any]]]]]:
    """``n`` requests, one after the other."""

    async def talk(client: httpx.AsyncClient) -> list[list[dict[str, Any]]]:
        return [await chunks(client) for _ in range(n)]

    return talk


async def error(client: httpx.AsyncClient) -> Exception:
    try:
        await chunks(client)
    except Exception as exc:
        return exc
    raise AssertionError("the stream did not fail")


# --------------------------------------------------------------------------- wire bytes


def head(*fields: str, status: str = "200 OK", version: str = "HTTP/1.1") -> bytes:
    return "".join(f"{line}\r\n" for line in (f"{version} {status}", *fields, "")).encode()


def sse(*payloads: Any, done: bool = True) -> bytes:
    events = [f"data: {json.dumps(p)}\n\n" for p in payloads] + (["data: [DONE]\n\n"] * done)
    return "".join(events).encode()


def chunk(data: bytes, ext: str = "") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), ext.encode(), data)


def sized(body: bytes, *fields: str, status: str = "200 OK") -> Answer:
    """A Content-Length answer in one write."""
    return Answer((head(f"Content-Length: {len(body)}", *fields, status=status) + body,))


def chunked(*pieces: bytes) -> Answer:
    """A chunked answer, one chunk per write, the last chunk with the end."""
    parts = [head("Transfer-Encoding: chunked") + chunk(pieces[0])]
    parts += [chunk(p) for p in pieces[1:]]
    parts[-1] += b"0\r\n\r\n"
    return Answer(tuple(parts))


A, B, C = {"i": 0}, {"i": 1}, {"i": 2}


# --------------------------------------------------------------------------- framing


def test_chunked_body_with_chunk_extensions_and_trailers() -> None:
    answer = Answer((
        head("Content-Type: text/event-stream", "Transfer-Encoding: chunked"),
        chunk(sse(A, done=False), ';name="v"') + chunk(sse(B, done=False), ";x"),
        chunk(sse(done=True)) + b"0;last\r\nX-Trailer: 1\r\nX-Other: 2\r\n\r\n",
    ))  # fmt: skip
    (got, after), server = serve([answer, sized(sse(C))], times(2))
    assert (got, after) == ([A, B], [C])
    # The trailers were read off: the next answer on that connection comes through intact.
    assert [s.connection for s in server.seen] == [0, 0]


def test_content_length_body() -> None:
    (got,), _ = serve([sized(sse(A, B, C))], times(1))
    assert got == [A, B, C]


def test_close_delimited_body() -> None:
    answer = Answer((head("Connection: close"), sse(A, done=False), sse(B)), close=True)
    (got, again), server = serve([answer, sized(sse(C))], times(2))
    assert (got, again) == ([A, B], [C])
    assert [s.connection for s in server.seen] == [0, 1]  # never reused


def test_interim_answers_before_the_final_one() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    answer = sized(sse(A, B))
    (got,), _ = serve([Answer((interim, *answer.writes))], times(1))
    assert got == [A, B]


def test_unasked_encoding_is_refused() -> None:
    exc, _ = serve([sized(sse(A), "Content-Encoding: gzip")], error)
    assert isinstance(exc, StreamError) and "gzip-encoded" in str(exc)


# --------------------------------------------------------------------------- events


def test_line_endings_multi_line_data_and_comments() -> None:
    body = (
        b": a comment\r\n\r\n"  # CRLF; a comment alone is no event
        b'data: {"i":\r\ndata: 0}\r\n\r\n'  # data over two lines, joined by a newline
        b"event: ping\rid: 7\r\r"  # CR only; no data field: no event
        b'data:{"i": 1}\r: note\r\r'  # no space after the colon; a comment inside
        b'data: {"i": 2}\n\n'  # LF
        b"data: [DONE]\r\n\r\n"
    )
    (got,), _ = serve([sized(body)], times(1))
    assert got == [A, B, C]


def test_event_split_across_writes() -> None:
    # Split inside the JSON, between the CR and LF of line ends (one inside a two-line data
    # field, one in the blank line), and across chunks.
    answer = chunked(
        b'data: {"i"', b":\r", b"\ndata: 0}\r", b"\n\r", b'\ndata: {"i": 1}\n', b"\ndata: [DO",
        b"NE]\n\n",
    )  # fmt: skip
    (got,), _ = serve([answer], times(1))
    assert got == [A, B]

    # The same over a Content-Length body, one write per piece.
    body = sse(A, B)
    cut = [0, 5, 11, 16, 17, len(body)]
    pieces = tuple(body[a:b] for a, b in itertools.pairwise(cut))
    answer = Answer((head(f"Content-Length: {len(body)}"), *pieces))
    (again,), _ = serve([answer], times(1))
    assert again == [A, B]


def test_final_event_without_its_blank_line() -> None:
    (got,), _ = serve([sized(sse(A, done=False) + b"data: [DONE]")], times(1))
    assert got == [A]

    # A last data event is still delivered; then the missing [DONE] is named.
    async def talk(client: httpx.AsyncClient) -> tuple[list[dict[str, Any]], Exception]:
        seen: list[dict[str, Any]] = []
        with pytest.raises(StreamError) as info:
            async for _, c in stream_json(client, URL, BODY):
                seen.append(c)
        return seen, info.value

    (seen, exc), _ = serve([sized(sse(A, done=False) + b'data: {"i": 1}')], talk)
    assert seen == [A, B] and "truncated" in str(exc)


# --------------------------------------------------------------------------- failures


def test_http_error_names_status_and_body_preview() -> None:
    body = json.dumps({"error": "x" * 2000}).encode()
    answers = [sized(body, status="500 Internal Server Error"), sized(sse(A))]

    async def talk(client: httpx.AsyncClient) -> tuple[Exception, list[dict[str, Any]]]:
        return await error(client), await chunks(client)

    (exc, after), server = serve(answers, talk)
    assert isinstance(exc, StreamError)
    assert str(exc).startswith(f'HTTP 500 from {URL}: {{"error": "xxx')
    assert len(str(exc)) < 600  # a preview, not the whole body
    assert after == [A]
    assert [s.connection for s in server.seen] == [0, 1]  # an error answer's connection goes


def test_http_error_with_empty_body() -> None:
    exc, _ = serve([sized(b"", status="503 Service Unavailable")], error)
    assert str(exc) == f"HTTP 503 from {URL}: (empty body)"


def test_no_content_answer_is_not_waited_on() -> None:
    # No framing and the connection left open: only the status says there is no body.
    exc, _ = serve([Answer((head(status="204 No Content"),)), sized(sse(A))], error)
    assert str(exc) == f"HTTP 204 from {URL}: (empty body)"


def test_stream_truncated_before_done() -> None:
    exc, _ = serve([chunked(sse(A, done=False))], error)
    assert isinstance(exc, StreamError) and "truncated" in str(exc)


def test_connection_lost_mid_body_is_a_transport_error() -> None:
    answer = Answer((head("Transfer-Encoding: chunked") + b"40\r\ndata: {",), close=True)
    exc, _ = serve([answer], error)
    assert isinstance(exc, httpx.RemoteProtocolError)


def test_malformed_json_and_error_events() -> None:
    exc, _ = serve([sized(b"data: {oops\n\n")], error)
    assert isinstance(exc, StreamError) and "malformed JSON" in str(exc)
    exc, _ = serve([sized(sse({"error": {"message": "overloaded"}}))], error)
    assert isinstance(exc, StreamError) and "overloaded" in str(exc)


# --------------------------------------------------------------------------- connections


def test_keep_alive_reuses_one_connection() -> None:
    got, server = serve([chunked(sse(A)), sized(sse(B))], times(2))
    assert got == [[A], [B]]
    assert server.connections == 1 and len(server.seen) == 2


def test_idle_connection_closed_by_the_server_is_replaced() -> None:
    first = chunked(sse(A))
    got, server = serve([Answer(first.writes, close=True), sized(sse(B))], times(2))
    assert got == [[A], [B]]
    assert server.connections == 2


def test_dropped_idle_connection_is_retried_once_on_a_new_one() -> None:
    # The server keeps the connection, then drops it on the next request without a word.
    got, server = serve([chunked(sse(A)), DROP, sized(sse(B))], times(2))
    assert got == [[A], [B]]
    assert [s.connection for s in server.seen] == [0, 0, 1]


def test_new_connection_dropped_is_not_retried() -> None:
    exc, server = serve([DROP, sized(sse(A))], error)
    assert isinstance(exc, httpx.RemoteProtocolError)
    assert "without sending a response" in str(exc)
    assert len(server.seen) == 1


def test_reused_connection_dropped_mid_head_is_not_retried() -> None:
    cut = Answer((b"HTTP/1.1 200 OK\r\nContent-",), close=True)

    async def talk(client: httpx.AsyncClient) -> Exception:
        assert await chunks(client) == [A]
        return await error(client)

    exc, server = serve([chunked(sse(A)), cut, sized(sse(B))], talk)
    assert isinstance(exc, httpx.RemoteProtocolError)
    assert "middle of the response head" in str(exc)
    assert len(server.seen) == 2


def test_http10_answer_is_not_kept_alive() -> None:
    http10 = Answer((head(f"Content-Length: {len(sse(A))}", version="HTTP/1.0") + sse(A),))
    got, server = serve([http10, sized(sse(B))], times(2))
    assert got == [[A], [B]]
    assert [s.connection for s in server.seen] == [0, 1]

    kept = head(f"Content-Length: {len(sse(A))}", "Connection: keep-alive", version="HTTP/1.0")
    got, server = serve([Answer((kept + sse(A),)), sized(sse(B))], times(2))
    assert got == [[A], [B]]
    assert [s.connection for s in server.seen] == [0, 0]


# --------------------------------------------------------------------------- requests


def test_headers_path_prefix_and_body() -> None:
    async def talk(client: httpx.AsyncClient) -> list[dict[str, Any]]:
        return await chunks(client, headers={"x-trace": "request", "X-Extra": "1"})

    client_headers = {"Authorization": "Bearer k-123", "X-Trace": "client"}
    got, server = serve([sized(sse(A))], talk, path="/prefix", headers=client_headers)
    assert got == [A]
    (seen,) = server.seen
    assert seen.line == f"POST /prefix{URL} HTTP/1.1"
    assert seen.header("x-trace") == ["request"]  # the request's own, once, whatever its case
    assert seen.header("authorization") == ["Bearer k-123"]
    assert seen.header("x-extra") == ["1"]
    assert seen.header("content-type") == ["application/json"]
    assert seen.header("host") == [f"127.0.0.1:{server.port}"]
    assert json.loads(seen.body) == BODY


def test_request_authorization_overrides_the_clients() -> None:
    async def talk(client: httpx.AsyncClient) -> list[dict[str, Any]]:
        return await chunks(client, headers={"authorization": "Bearer other"})

    _, server = serve([sized(sse(A))], talk, headers={"Authorization": "Bearer k-123"})
    assert server.seen[0].header("Authorization") == ["Bearer other"]


def test_proxy_in_the_environment_goes_through_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    assert http1.lean_origin(httpx.AsyncClient(base_url="http://127.0.0.1:8000")) is None
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert http1.lean_origin(httpx.AsyncClient(base_url="http://127.0.0.1:8000")) is not None


def test_https_goes_through_httpx() -> None:
    assert http1.lean_origin(httpx.AsyncClient(base_url="https://127.0.0.1:8000")) is None


# ------------------------------------------------------------------ kernel receive times


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")
def test_arrival_is_the_kernels_receive_time_not_when_the_loop_read_it() -> None:
    """The server (a thread) sends an event while the client's event loop is blocked; the
    event's arrival is when it reached the socket, not when the loop got to it 150 ms on."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent: list[float] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Connection: close\r\n\r\n")
            time.sleep(0.05)
            sent.append(time.perf_counter())
            conn.sendall(b'data: {"n": 1}\n\n')
            time.sleep(0.3)
            conn.sendall(b"data: [DONE]\n\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def client() -> list[tuple[float, str]]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            origin = http1.lean_origin(c)
            assert origin is not None
            async with http1.post_json(origin, c, URL, BODY, None) as response:
                time.sleep(0.2)  # the loop is busy elsewhere while the event arrives
                return [e async for e in response.events()]

    try:
        events = asyncio.run(client())
    finally:
        thread.join(5)
        listener.close()
    assert [d for _, d in events] == ['{"n": 1}']
    lag = events[0][0] - sent[0]
    assert -0.005 < lag < 0.02, f"stamped {lag * 1e3:.1f} ms after the server's send"
