"""Streaming HTTP pieces shared by server engines: SSE parsing, token timing, failure capture.

Times are ``time.perf_counter`` seconds from submission. TTFT is the arrival of the first
chunk that carries content. A chunk carrying several tokens (speculative decoding accepts
several at once) spreads the gap since the previous chunk evenly over its tokens, so the
inter-token list has exactly one entry per token after the first.

Streams to a plain-HTTP server (a booted engine, a local endpoint) go through the lean
HTTP/1.1 client in ``http1``; others (HTTPS, a proxy set in the environment) through httpx.
Both yield the same chunks and raise the same kinds of error.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx

from pytest_osprey.results.records import impossible

from ..base import EngineError, GenerationResult
from . import http1
from .http1 import DONE

__all__ = [
    "DONE",
    "ClientPool",
    "StreamError",
    "TokenClock",
    "bearer",
    "guarded",
    "sse_data",
    "stream_error",
    "stream_json",
]

_BODY_PREVIEW = 500
_ERROR_MOST = 1000  # characters of a failed request's error


STRING_MOST = 4096  # characters of one string a server sent (a version, a path, an error)
JSON_MOST = 64 << 10  # characters of one server answer kept (its strings capped first)
BODY_MOST = 64 << 20  # bytes of a control answer (/server_info...) read at all


class StreamError(Exception):
    """A request failed in a way the record should state (HTTP error, bad stream...)."""


def cap_text(text: str, most: int = STRING_MOST) -> str:
    """``text``, cut to ``most`` characters with a marker saying how long it was."""
    if len(text) <= most:
        return text
    return f"{text[:most]}... [cut: {len(text)} characters]"


def bounded(value: Any, per_string: int = STRING_MOST, total: int = JSON_MOST) -> Any:
    """A server's JSON answer as kept: each string capped (:func:`cap_text`), and items past
    ``total`` characters in all dropped, a marker saying how many. A 50 MB version string
    or a million keys cannot reach campaign.json or the terminal."""
    left = [total]

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            v = cap_text(v, per_string)
            left[0] -= len(v)
            return v
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            for n, (k, item) in enumerate(v.items()):
                if left[0] <= 0:
                    out["..."] = f"[cut: {len(v) - n} more keys]"
                    break
                out[cap_text(str(k), per_string)] = walk(item)
            return out
        if isinstance(v, list):
            items: list[Any] = []
            for n, item in enumerate(v):
                if left[0] <= 0:
                    items.append(f"[cut: {len(v) - n} more items]")
                    break
                items.append(walk(item))
            return items
        left[0] -= 8  # a number, a bool, null
        return v

    return walk(value)


def read_most(r: httpx.Response) -> bytearray | None:
    """A streamed answer's body, None once it passes BODY_MOST bytes (read no further)."""
    raw = bytearray()
    for part in r.iter_bytes():
        raw += part
        if len(raw) > BODY_MOST:
            return None
    return raw


def read_json(client: httpx.Client, path: str, condition: str) -> Any:
    """The JSON a control route answers (bounded), None on an answer other than 200; an
    answer that is not JSON raises an EngineError naming the condition and the URL."""
    url = f"{client.base_url}".rstrip("/") + path
    with client.stream("GET", path) as r:
        if r.status_code != 200:
            return None
        raw = read_most(r)
        if raw is None:
            raise EngineError(f"{condition}: {url} answered over {BODY_MOST >> 20} MiB")
        kind = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    try:
        return bounded(json.loads(raw))
    except (ValueError, RecursionError):
        first = bytes(raw[:40]).decode("utf-8", "replace")
        raise EngineError(f"{condition}: {url} answered {kind}, not JSON (first bytes: "
                          f"{first!r})") from None


class TokenClock:
    """Arrival times of streamed tokens, measured from submission; more tokens than
    ``most`` (the request's max_new_tokens) is a server reporting what cannot be."""

    def __init__(self, most: int | None = None) -> None:
        self.most = most
        self.t0 = time.perf_counter()
        self.ttft_s: float | None = None
        self.itl_s: list[float] = []
        self.tokens = 0
        self._last: float | None = None

    def add(self, n: int, now: float | None = None) -> None:
        """``n`` new tokens arrived together (at ``now``)."""
        if n <= 0:
            return
        if self.most is not None and self.tokens + n > self.most:
            # Before the per-token lists grow: a count of 10**9 must not allocate them.
            raise StreamError(impossible("output_tokens", self.tokens + n,
                                         f"more than max_new_tokens {self.most}"))
        now = time.perf_counter() if now is None else now
        if self._last is None:
            self.ttft_s = now - self.t0
            # Tokens riding with the first one arrived with it: no decode gap to share.
            self.itl_s.extend([0.0] * (n - 1))
        else:
            gap = (now - self._last) / n
            self.itl_s.extend([gap] * n)
        self._last = now
        self.tokens += n

    def first_content(self, now: float | None = None) -> None:
        """Content (text) arrived before any token count was known."""
        if self.ttft_s is None:
            now = time.perf_counter() if now is None else now
            self.ttft_s = now - self.t0

    def elapsed(self, now: float | None = None) -> float:
        return (time.perf_counter() if now is None else now) - self.t0


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data`` payload of each server-sent event (multi-line data joined by newlines);
    one event over http1.EVENT_MOST characters fails the request, as on the lean path."""
    buf: list[str] = []
    size = 0
    async for line in response.aiter_lines():
        if line == "":
            if buf:
                yield "\n".join(buf)
                buf, size = [], 0
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        field, _, value = line.partition(":")
        if field == "data":
            buf.append(value[1:] if value.startswith(" ") else value)
            size += len(line)
            if size > http1.EVENT_MOST:
                raise StreamError(f"a stream event over {http1.EVENT_MOST >> 20} MiB (the most "
                                  "one event may hold)")
    if buf:
        yield "\n".join(buf)


def stream_json(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """POST ``body`` and yield (arrival time, chunk) per SSE event until ``data: [DONE]``.

    Raises StreamError on a non-200 answer, a chunk that is not a JSON object, an error
    object in the stream, or a stream that ends before [DONE].
    """
    origin = http1.lean_origin(client)
    if origin is None or not url.startswith("/"):
        return _stream_httpx(client, url, body, headers)
    return _stream_lean(origin, client, url, body, headers)


def _chunk(data: str, url: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise StreamError(
            f"malformed JSON in stream from {url}: {exc.msg}: {data[:200]!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise StreamError(f"stream chunk is not a JSON object: {data[:200]!r}")
    error = stream_error(chunk)
    if error is not None:
        raise StreamError(f"server error in stream from {url}: {cap_text(error, 500)}")
    return chunk


def _truncated(url: str) -> StreamError:
    return StreamError(f"stream from {url} ended before 'data: [DONE]' (truncated)")


def _http_error(status: int, raw: bytes, url: str) -> StreamError:
    text = raw[:_BODY_PREVIEW].decode("utf-8", "replace").strip()
    return StreamError(f"HTTP {status} from {url}: {text or '(empty body)'}")


async def _stream_httpx(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise _http_error(response.status_code, await response.aread(), url)
        async for data in sse_data(response):
            now = time.perf_counter()
            if data.strip() == DONE:
                return
            yield now, _chunk(data, url)
    raise _truncated(url)


async def _stream_lean(
    origin: http1.Origin,
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    async with http1.post_json(origin, client, url, body, headers) as response:
        if response.status != 200:
            raise _http_error(response.status, await response.preview(_BODY_PREVIEW), url)
        encoding = response.head.get("content-encoding", "identity")
        if encoding.lower() != "identity":
            raise StreamError(f"stream from {url} is {encoding}-encoded")
        async for now, data in response.events():
            yield now, _chunk(data, url)
        if response.done:
            return
    raise _truncated(url)


def stream_error(chunk: Mapping[str, Any]) -> str | None:
    """The error a chunk reports, if any (SGLang: {"error": ...}; OpenAI/vLLM alike)."""
    if chunk.get("object") == "error":
        return str(chunk.get("message") or chunk)
    err = chunk.get("error")
    if err is None:
        return None
    if isinstance(err, Mapping):
        return str(err.get("message") or err)
    return str(err)


async def guarded(
    run: Callable[[TokenClock], Awaitable[GenerationResult]], timeout_s: float,
    most_tokens: int | None = None,
) -> GenerationResult:
    """Run one request under a total timeout; every failure becomes a failed result."""
    clock = TokenClock(most_tokens)
    try:
        async with asyncio.timeout(timeout_s):
            return await run(clock)
    except TimeoutError:
        error = f"timed out after {timeout_s:g} s (request timeout)"
    except StreamError as exc:
        error = str(exc)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc or 'HTTP transport error'}"
    except Exception as exc:  # never let one request take the campaign down
        error = f"unexpected {type(exc).__name__}: {exc}"
    # One line, of bounded size: an exception may quote whatever the server sent.
    error = cap_text(" ".join(error.split()), _ERROR_MOST)
    return GenerationResult.failure(
        error, ttft_s=clock.ttft_s, e2e_s=clock.elapsed(), itl_s=list(clock.itl_s)
    )


class ClientPool:
    """One httpx.AsyncClient per event loop: connections are bound to the loop that made them."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        # Made here, once: loading the CA bundle takes tens of ms, and get() runs on the first
        # request of each event loop, inside its TTFT.
        self._ssl = httpx.create_ssl_context()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self.headers,
                # The request's own deadline (guarded) bounds the total; these bound stalls.
                timeout=httpx.Timeout(None, connect=30.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                verify=self._ssl,
            )
            self._clients[loop] = client
        return client

    def sync(self, timeout_s: float = 30.0) -> httpx.Client:
        """A short-lived blocking client for control calls (health, info, flush, metrics)."""
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout_s)

    async def aclose(self) -> None:
        """Close the current loop's client (others close with their loops)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            http1.release(client)
            await client.aclose()


def bearer(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
