"""A scripted streaming server that speaks SGLang's /generate and OpenAI's /v1/completions.

Tokens come on a known schedule: the first chunk ``ttft`` after the request is received,
then one chunk per decoding step ``gap`` apart, chunk sizes cycling (1, 3, 2 by default) the
way speculative decoding accepts several tokens per step, each delay optionally scaled by a
seeded uniform jitter. The server logs, per request, the ``time.perf_counter`` instant it
had the whole request and the instant each chunk was handed to the kernel. On Linux
perf_counter is CLOCK_MONOTONIC, one clock for every process, so a client in another process
can be compared with this log. Request number ``n`` (in arrival order) is written into the
first token's text (``<n>``) so a client's output can be matched to its log entry.

    python benchmarks/stub_server.py [--port 0] [--ttft-ms 40] [--gap-ms 20] [--chunks 1,3,2]
                                     [--jitter 0.2] [--seed 0]

prints ``listening http://127.0.0.1:PORT`` once bound. Routes: POST /generate (SGLang:
incremental chunks, as servers booted with ``--incremental-streaming-output``, or with
``--sglang-cumulative`` SGLang's default cumulative ones; top-2 logprob rows when asked),
POST /v1/completions (OpenAI/vLLM, deltas, ``token_ids`` when
``return_token_ids``, a usage chunk when ``stream_options.include_usage``), GET /log (every
request so far, JSON), POST /reset (clear the log, restart numbering), GET /health.

The HTTP/1.1 server is a hand-rolled asyncio Protocol (keep-alive, chunked responses): the
project depends on no ASGI server, and this one does little per chunk (a timer callback, one
``json.dumps``, one ``write``), so its own lag stays small next to the clients' at hundreds of
streams. ``backlogged`` in the log counts chunks written while the socket's send buffer was
full (their stamps are early); it stays 0 while clients keep up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

ID_BASE = 1000  # token i has id ID_BASE + i, in every request
DEFAULT_TOKENS = 16


@dataclass(frozen=True)
class Schedule:
    """When the chunks of request ``n`` are written, as offsets from its receipt."""

    ttft_s: float = 0.040
    gap_s: float = 0.020  # one decoding step: the time between chunks, whatever their size
    chunks: tuple[int, ...] = (1, 3, 2)
    jitter: float = 0.0  # each delay is scaled by 1 + U(-jitter, +jitter)
    seed: int = 0

    def duration(self, tokens: int) -> float:
        """The unjittered time from receipt to the last chunk."""
        steps = len(Schedule(self.ttft_s, self.gap_s, self.chunks).plan(0, tokens))
        return self.ttft_s + max(steps - 1, 0) * self.gap_s

    def plan(self, n: int, tokens: int) -> list[tuple[float, int]]:
        """(offset in s, tokens in the chunk) per chunk; the last chunk is cut to fit."""
        rng = random.Random(self.seed * 1_000_003 + n)

        def delay(base: float) -> float:
            return base * (1.0 + self.jitter * rng.uniform(-1.0, 1.0)) if self.jitter else base

        out: list[tuple[float, int]] = []
        at = delay(self.ttft_s)
        left, i = tokens, 0
        while left > 0:
            size = min(self.chunks[i % len(self.chunks)], left)
            out.append((at, size))
            left -= size
            i += 1
            at += delay(self.gap_s)
        return out


def token_texts(n: int, tokens: int) -> list[str]:
    return [f"<{n}>" if i == 0 else f" t{i}" for i in range(tokens)]


def expected_text(n: int, tokens: int) -> str:
    return "".join(token_texts(n, tokens))


def expected_ids(tokens: int) -> list[int]:
    return [ID_BASE + i for i in range(tokens)]


def request_number(text: str) -> int | None:
    """The request number a client's output text carries, if it starts with one."""
    if not text.startswith("<"):
        return None
    head, sep, _ = text[1:].partition(">")
    return int(head) if sep and head.isdigit() else None


@dataclass
class Served:
    """One generation request as the server saw it."""

    n: int
    api: str  # "sglang" | "openai"
    t_recv: float
    tokens: int
    plan: list[tuple[float, int]]
    t_write: list[float] = field(default_factory=list)
    t_end: float | None = None  # after the last byte of the response was written
    complete: bool = False  # False: the client went away mid-stream
    backlogged: int = 0  # chunks written while the socket's send buffer was full

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "api": self.api,
            "t_recv": self.t_recv,
            "tokens": self.tokens,
            "plan": [list(p) for p in self.plan],
            "t_write": self.t_write,
            "t_end": self.t_end,
            "complete": self.complete,
            "backlogged": self.backlogged,
        }


class BadRequest(Exception):
    pass


class StubServer:
    def __init__(self, schedule: Schedule, cumulative: bool = False) -> None:
        self.schedule = schedule
        self.cumulative = cumulative  # SGLang's default streaming (else incremental)
        self.log: list[Served] = []
        self._next = 0
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        self.connections = 0  # accepted so far: tells whether clients keep them alive
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        # A deep backlog: a closed-loop client opens hundreds of connections at once, and a
        # dropped SYN would cost it a 1 s retransmit that no client could be blamed for.
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._conns):
                conn.close()
            await self._server.wait_closed()

    def entries(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in list(self.log)]

    def number(self) -> int:
        n = self._next
        self._next += 1
        return n

    def reset(self) -> None:
        self.log.clear()
        self._next = 0


class _Connection(asyncio.Protocol):
    """One client connection: requests one after another (keep-alive), each answered in
    full before the next is read. A Protocol, not streams: timer callbacks write the chunks
    and the receipt is stamped in data_received, the earliest the server can see it."""

    def __init__(self, stub: StubServer) -> None:
        self.stub = stub
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.stream: _Stream | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.stub._conns.add(self)
        self.stub.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.stub._conns.discard(self)
        if self.stream is not None:
            self.stream.cancel()
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        if self.stream is None:
            self._next_request(now)

    def _next_request(self, now: float) -> None:
        while self.stream is None and self.transport is not None and not self.closing:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            method, path, headers = _parse_head(self.buf[: end + 4])
            size = int(headers.get("content-length") or 0)
            if len(self.buf) < end + 4 + size:
                return
            raw = self.buf[end + 4 : end + 4 + size]
            self.buf = self.buf[end + 4 + size :]
            self.closing = headers.get("connection", "").lower() == "close"
            try:
                self._route(method, path.split("?", 1)[0], raw, now)
            except BadRequest as exc:
                self.write(_json_response(400, {"error": str(exc)}))
            if self.stream is None and self.closing:
                self.close()

    def done(self) -> None:
        """The current response is complete: serve what is waiting."""
        self.stream = None
        if self.closing:
            self.close()
        elif self.buf:
            self._next_request(time.perf_counter())

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _route(self, method: str, path: str, raw: bytes, t_recv: float) -> None:
        if (method, path) == ("POST", "/generate"):
            self.stream = _Stream(self, "sglang", _json_body(raw), t_recv)
        elif (method, path) == ("POST", "/v1/completions"):
            self.stream = _Stream(self, "openai", _json_body(raw), t_recv)
        elif (method, path) == ("GET", "/log"):
            self.write(_json_response(200, {"requests": self.stub.entries()}))
        elif (method, path) == ("POST", "/reset"):
            self.stub.reset()
            self.write(_json_response(200, {"ok": True}))
        elif (method, path) == ("GET", "/health"):
            self.write(_json_response(200, {"ok": True}))
        else:
            self.write(_json_response(404, {"error": f"no route {method} {path}"}))


class _Stream:
    """One streamed answer: each chunk is written by a timer callback at its planned time."""

    def __init__(self, conn: _Connection, api: str, body: dict[str, Any], t_recv: float) -> None:
        if body.get("stream") is not True:
            raise BadRequest("this stub only streams")
        if api == "sglang":
            params = body.get("sampling_params") or {}
            tokens = int(params.get("max_new_tokens") or DEFAULT_TOKENS)
            prompt = body.get("text")
        else:
            tokens = int(body.get("max_tokens") or DEFAULT_TOKENS)
            prompt = body.get("prompt")
        prompt_tokens = len(prompt.split()) if isinstance(prompt, str) else 0
        stub = conn.stub
        n = stub.number()
        self.conn = conn
        self.served = Served(n, api, t_recv, tokens, stub.schedule.plan(n, tokens))
        stub.log.append(self.served)
        self.events = _Events(api, n, tokens, prompt_tokens, body,
                              incremental=not stub.cumulative)
        self.step = 0
        self.done = 0
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = None
        # Headers go out at once, as a streaming ASGI response sends them before the body.
        conn.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        self._arm()

    def _arm(self) -> None:
        served = self.served
        if self.step < len(served.plan):
            due = served.t_recv + served.plan[self.step][0]
            self.timer = self.loop.call_later(max(0.0, due - time.perf_counter()), self._write)
        else:
            tail = self.events.tail(len(served.plan))
            self.conn.write(b"".join(_frame(e) for e in tail) + b"0\r\n\r\n")
            served.t_end = time.perf_counter()
            served.complete = True
            self.conn.done()

    def _write(self) -> None:
        served = self.served
        self.done += served.plan[self.step][1]
        event = self.events.chunk(self.step, self.done, time.perf_counter() - served.t_recv)
        self.conn.write(_frame(event))
        served.t_write.append(time.perf_counter())
        if self.conn.transport is not None and self.conn.transport.get_write_buffer_size():
            served.backlogged += 1  # not all in the kernel yet: the stamp is early
        self.step += 1
        self._arm()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class _Events:
    """The SSE payloads of one request, shaped as the real server shapes them."""

    def __init__(
        self, api: str, n: int, tokens: int, prompt_tokens: int, body: dict[str, Any],
        incremental: bool = True,
    ) -> None:
        self.api = api
        self.incremental = incremental
        top = int(body.get("top_logprobs_num") or 0) if body.get("return_logprob") else -1
        self.top = top  # -1: no logprobs; else rows of this many alternatives
        self.n = n
        self.tokens = tokens
        self.prompt_tokens = prompt_tokens
        self.texts = token_texts(n, tokens)
        self.ids = expected_ids(tokens)
        self.model = str(body.get("model") or "stub")
        self.want_ids = bool(body.get("return_token_ids"))
        options = body.get("stream_options") or {}
        self.want_usage = bool(options.get("include_usage"))
        self.created = int(time.time())
        self._sent = 0

    def chunk(self, step: int, done: int, elapsed: float) -> str:
        last = done >= self.tokens
        if self.api == "sglang":
            # Incremental chunks carry what is new, cumulative ones all so far (SGLang's
            # default); meta_info counts every token so far in both.
            lo = self._sent if self.incremental else 0
            meta: dict[str, Any] = {
                "id": f"stub-{self.n}",
                "finish_reason": {"type": "length", "length": self.tokens} if last else None,
                "prompt_tokens": self.prompt_tokens,
                "weight_version": "default",
                "completion_tokens": done,
                "cached_tokens": 0,
            }
            if self.top >= 0:
                ids = self.ids[lo:done]
                meta["output_token_logprobs"] = [[-0.5, i, None] for i in ids]
                if self.top:
                    meta["output_top_logprobs"] = [
                        [[-0.5, i, None], [-1.5, i + 1, None]][: self.top] for i in ids]
            if last:
                meta["e2e_latency"] = elapsed
                meta["spec_verify_ct"] = step + 1
            payload: dict[str, Any] = {
                "text": "".join(self.texts[lo:done]),
                "output_ids": self.ids[lo:done],
                "meta_info": meta,
            }
        else:
            choice: dict[str, Any] = {
                "index": 0,
                "text": "".join(self.texts[self._sent : done]),
                "logprobs": None,
                "finish_reason": "length" if last else None,
                "stop_reason": None,
            }
            if self.want_ids:
                choice["token_ids"] = self.ids[self._sent : done]
            payload = self._openai_head()
            payload["choices"] = [choice]
        self._sent = done
        return json.dumps(payload, separators=(",", ":"))

    def tail(self, steps: int) -> list[str]:
        out = []
        if self.api == "openai" and self.want_usage:
            payload = self._openai_head()
            payload["choices"] = []
            payload["usage"] = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.tokens,
                "total_tokens": self.prompt_tokens + self.tokens,
            }
            if steps:
                # vLLM's --per-request-spec-decode-metrics summary, in the usage chunk.
                payload["metrics"] = {
                    "speculative_decoding": {
                        "num_spec_steps": steps,
                        "mean_acceptance_length": self.tokens / steps,
                    }
                }
            out.append(json.dumps(payload, separators=(",", ":")))
        out.append("[DONE]")
        return out

    def _openai_head(self) -> dict[str, Any]:
        return {
            "id": f"cmpl-stub-{self.n}",
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
        }


def _frame(event: str) -> bytes:
    data = f"data: {event}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = [*lines[0].split(" ", 2), "", ""][:3]
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body is not a JSON object")
    return body


def _json_response(status: int, obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data


@contextlib.contextmanager
def serve_in_thread(schedule: Schedule, cumulative: bool = False) -> Iterator[StubServer]:
    """The stub on its own event loop in a daemon thread (for tests; ``.log`` is live)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stub = StubServer(schedule, cumulative)
    try:
        asyncio.run_coroutine_threadsafe(stub.start(), loop).result(10)
        yield stub
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stub.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def schedule_args(ap: argparse.ArgumentParser) -> None:
    """The schedule's command-line options (shared with fidelity.py)."""
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--gap-ms", type=float, default=20.0, help="time between chunks")
    ap.add_argument("--chunks", default="1,3,2", help="chunk sizes in tokens, cycled")
    ap.add_argument("--jitter", type=float, default=0.2, help="relative, uniform, per delay")
    ap.add_argument("--seed", type=int, default=0)


def schedule_from(args: argparse.Namespace) -> Schedule:
    return Schedule(
        ttft_s=args.ttft_ms / 1e3,
        gap_s=args.gap_ms / 1e3,
        chunks=tuple(int(c) for c in str(args.chunks).split(",")),
        jitter=args.jitter,
        seed=args.seed,
    )


def schedule_argv(schedule: Schedule) -> list[str]:
    return [
        "--ttft-ms", repr(schedule.ttft_s * 1e3),
        "--gap-ms", repr(schedule.gap_s * 1e3),
        "--chunks", ",".join(str(c) for c in schedule.chunks),
        "--jitter", repr(schedule.jitter),
        "--seed", str(schedule.seed),
    ]  # fmt: skip


async def _serve(schedule: Schedule, host: str, port: int, cumulative: bool) -> None:
    stub = StubServer(schedule, cumulative)
    await stub.start(host, port)
    print(f"listening http://{host}:{stub.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--sglang-cumulative", action="store_true",
                    help="SGLang's default streaming: every chunk resends all so far")
    schedule_args(ap)
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(schedule_from(args), args.host, args.port, args.sglang_cumulative))


if __name__ == "__main__":
    main()
