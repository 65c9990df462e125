"""A serving twin: a real HTTP server whose timing is a GPU server's (testkit/twin_model.py),
spent in sleeps, so that two CPU cores serve thousands of tokens per second.

It speaks what the project's clients read from SGLang 0.5.23:

* ``POST /generate`` (native; streamed or not): incremental chunks by default (as booted
  servers run, ``--incremental-streaming-output``), cumulative with ``incremental=False``;
  the last chunk's ``meta_info`` carries SGLang's counters under 0.5.23's names
  (``spec_verify_ct``, ``spec_accept_length``, ``spec_accept_rate``,
  ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``,
  ``spec_correct_drafts_histogram``), the finish reason ``{"type": "length", ...}`` and
  ``completion_tokens`` / ``prompt_tokens``;
* ``GET /server_info`` (``max_running_requests``, the ``speculative_*`` arguments,
  ``internal_states[0].effective_max_running_requests_per_dp``), ``/get_model_info``,
  ``/v1/models``, ``/health``, ``/health_generate``, ``POST /flush_cache`` (400 while busy);
* OpenAI ``/v1/completions`` and ``/v1/chat/completions``, streamed (with a final usage chunk
  when ``stream_options.include_usage``) or not.

Tokens are cheap fake ids drawn from the prompt (the same prompt gets the same ids on every
twin, so greedy outputs agree) and text (one `` w`` per token); a prompt counts one token per 4
characters. Every request generates exactly ``max_new_tokens`` (finish reason ``length``). A
client that closes its connection mid-stream cancels its request (it leaves the batch at the
next step), as the runner's cancelled fillers do on a real server.

Steps are timed against absolute deadlines: the server's own CPU time (writing chunks) is
absorbed in the sleep, and a step that woke late is caught up by the next ones (up to
``MAX_LAG_S``), so the served rate is the model's as long as the machine keeps up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.twin_model import PROFILES, Profile, Request, Scheduler, profile

VERSION = "0.5.23"
MAX_LAG_S = 0.05
_HEAD_MOST = 64 << 10


@dataclass(eq=False)
class Served(Request):
    """A request and where its tokens go."""

    kind: str = "sglang"  # sglang | completions | chat
    stream: bool = True
    incremental: bool = True
    usage: bool = False  # OpenAI: a final usage chunk
    writer: asyncio.StreamWriter | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    t0: float = 0.0
    key: int = 0  # the prompt's: the same prompt gets the same ids on every twin (greedy)
    ids: list[int] = field(default_factory=list)

    def new_ids(self, n: int) -> list[int]:
        start = len(self.ids)
        fresh = [(self.key + 7919 * (start + i)) % 32000 for i in range(n)]
        self.ids += fresh
        return fresh


class Twin:
    """One served condition: its scheduler and the step loop that spends its time."""

    def __init__(self, prof: Profile, seed: int = 0) -> None:
        self.profile = prof
        self.sched = Scheduler(prof, seed)
        self.wake = asyncio.Event()
        self.counter = 0
        self.steps = 0
        self.tokens = 0
        self.spent_s = 0.0  # the model's time of the steps served (busy time)

    def submit(self, req: Served) -> None:
        req.t0 = time.time()
        self.sched.add(req)
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if self.sched.idle:
                self.wake.clear()
                await self.wake.wait()
                deadline = loop.time()
            cost, moved = self.sched.step()
            if not moved:
                continue
            deadline = max(deadline + cost, loop.time() - MAX_LAG_S)
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.steps += 1
            self.spent_s += cost
            for req, n in moved:
                assert isinstance(req, Served)
                self.tokens += n
                emit(req, n, self.profile)

    # ----------------------------------------------------------------------- facts

    def server_info(self) -> dict[str, Any]:
        p = self.profile
        spec: dict[str, Any] = {"speculative_algorithm": None}
        if p.steps:
            spec = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": p.steps,
                    "speculative_eagle_topk": 1, "speculative_num_draft_tokens": p.steps + 1,
                    "speculative_draft_model_path": f"twin/{p.name}-draft"}
        return {"version": VERSION, "model_path": f"twin/{p.name}", "device": "cuda",
                "dtype": "bfloat16", "quantization": None, "tp_size": 1, "dp_size": 1,
                "context_length": 8192, "max_running_requests": p.cap,
                "incremental_streaming_output": True, "enable_deterministic_inference": False,
                **spec,
                "internal_states": [{"effective_max_running_requests_per_dp": p.cap,
                                     "max_total_num_tokens": 1 << 20}],
                "twin": {"profile": p.name, "costs_s": vars(p.costs), "accept": p.accept,
                         "accept_length": p.accept_length}}


# --------------------------------------------------------------------------- wire


def _meta(req: Served, prof: Profile, final: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": req.rid, "prompt_tokens": req.prompt_tokens,
                            "completion_tokens": req.out, "cached_tokens": 0,
                            "finish_reason": None}
    if not final:
        return meta
    meta["finish_reason"] = ({"type": "abort", "message": "cancelled"} if req.cancelled
                             else {"type": "length", "length": req.out})
    meta["e2e_latency"] = time.time() - req.t0
    if prof.steps:
        correct = sum(i * c for i, c in enumerate(req.histogram))
        proposed = prof.steps * req.verify_ct
        meta.update(spec_verify_ct=req.verify_ct,
                    spec_accept_length=req.out / req.verify_ct if req.verify_ct else None,
                    spec_accept_rate=correct / proposed if proposed else None,
                    spec_num_correct_drafts=correct, spec_num_proposed_drafts=proposed,
                    spec_correct_drafts_histogram=list(req.histogram))
    return meta


def _event(payload: Any) -> bytes:
    data = b"data: " + (payload if isinstance(payload, bytes)
                        else json.dumps(payload, separators=(",", ":")).encode()) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _openai_chunk(req: Served, text: str, finish: str | None) -> dict[str, Any]:
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text},
                                  "finish_reason": finish}
        return {"id": req.rid, "object": "chat.completion.chunk", "choices": [choice]}
    return {"id": req.rid, "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _usage(req: Served) -> dict[str, int]:
    return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.out,
            "total_tokens": req.prompt_tokens + req.out}


def emit(req: Served, n: int, prof: Profile) -> None:
    """Hand ``n`` new tokens of ``req`` to its connection (and end it when done)."""
    ids = req.new_ids(n)
    final = req.done
    w = req.writer
    if req.stream and w is not None and not w.is_closing():
        text = " w" * n
        if req.kind == "sglang":
            shown = ids if req.incremental else list(req.ids)
            piece = text if req.incremental else " w" * len(req.ids)
            w.write(_event({"text": piece, "output_ids": shown,
                            "meta_info": _meta(req, prof, final)}))
        else:
            w.write(_event(_openai_chunk(req, text, "length" if final else None)))
            if final and req.usage:
                w.write(_event({"id": req.rid, "choices": [], "usage": _usage(req)}))
        if final:
            w.write(_event(b"[DONE]") + b"0\r\n\r\n")
    if final:
        req.finished.set()


def _whole(req: Served, prof: Profile) -> dict[str, Any]:
    """A non-streamed answer."""
    text = " w" * req.out
    if req.kind == "sglang":
        return {"text": text, "output_ids": req.ids, "meta_info": _meta(req, prof, True)}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if req.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": req.rid, "object": "chat.completion" if req.kind == "chat"
            else "text_completion", "choices": [choice], "usage": _usage(req)}


def _answer(status: int, body: Any) -> bytes:
    raw = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw


def _request(twin: Twin, path: str, body: dict[str, Any]) -> Served:
    """A Served request from a /generate or OpenAI body (KeyError/TypeError: bad body)."""
    twin.counter += 1
    rid = f"twin-{twin.counter}"
    if path == "/generate":
        params = body.get("sampling_params") or {}
        text = body.get("text") or ""
        return Served(rid, max(1, len(str(text)) // 4), int(params.get("max_new_tokens", 128)),
                      kind="sglang", stream=bool(body.get("stream")),
                      key=zlib.crc32(str(text).encode()))
    if path == "/v1/chat/completions":
        text = "".join(str(m.get("content", "")) for m in body["messages"])
        kind = "chat"
    else:
        text, kind = str(body.get("prompt", "")), "completions"
    most = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return Served(rid, max(1, len(text) // 4), int(most), kind=kind,
                  stream=bool(body.get("stream")), usage=usage, key=zlib.crc32(text.encode()))


class TwinServer:
    """The twin on 127.0.0.1 in a thread of its own (a context manager): ``url`` serves
    ``profile`` (a name of twin_model.PROFILES or a Profile)."""

    def __init__(self, prof: Profile | str, *, time_scale: float = 1.0, seed: int = 0,
                 port: int = 0, incremental: bool = True) -> None:
        self.profile = profile(prof, time_scale) if isinstance(prof, str) else prof
        self.seed, self.port, self.incremental = seed, port, incremental
        self.loop: asyncio.AbstractEventLoop | None = None
        self.twin: Twin | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, ready: threading.Event | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.twin = Twin(self.profile, self.seed)
        runner = asyncio.create_task(self.twin.run())
        server = await asyncio.start_server(self._connection, "127.0.0.1", self.port,
                                            limit=_HEAD_MOST)
        self.port = server.sockets[0].getsockname()[1]
        (ready or self._ready).set()
        async with server:
            await self._stop.wait()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    def __enter__(self) -> TwinServer:
        self._thread = threading.Thread(target=lambda: asyncio.run(self.serve()), daemon=True,
                                        name=f"twin-{self.profile.name}")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the serving twin did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        carry: bytes | None = b""
        try:
            while carry is not None:
                carry = await self._one(reader, writer, carry)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   carry: bytes) -> bytes | None:
        """Serve one request of a kept-alive connection (``carry``: its first bytes, already
        read); what the next one starts with, None once the client is gone."""
        head = carry + await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        size = int(headers.get("content-length", "0"))
        raw = await reader.readexactly(size) if size else b""
        assert self.twin is not None
        twin = self.twin
        gets: dict[str, Callable[[], Any]] = {
                "/server_info": twin.server_info, "/get_server_info": twin.server_info,
                "/get_model_info": lambda: {"model_path": f"twin/{twin.profile.name}",
                                            "is_generation": True},
                "/v1/models": lambda: {"object": "list", "data": [{
                    "id": f"twin/{twin.profile.name}", "object": "model",
                    "owned_by": "sglang", "max_model_len": 8192}]},
                "/health": lambda: {}, "/health_generate": lambda: {}}
        path = path.split("?")[0]
        if method == "GET" and path in gets:
            writer.write(_answer(200, gets[path]()))
        elif method == "POST" and path == "/flush_cache":
            writer.write(_answer(400 if twin.sched.running else 200, {}))
        elif method == "POST" and path in ("/generate", "/v1/completions",
                                           "/v1/chat/completions"):
            try:
                req = _request(twin, path, json.loads(raw or b"{}"))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                writer.write(_answer(400, {"error": f"bad request body: {exc}"}))
                return b""
            return await self._generate(req, reader, writer)
        else:
            writer.write(_answer(404, {"error": f"no route {method} {path}"}))
        await writer.drain()
        return b""

    async def _generate(self, req: Served, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> bytes | None:
        assert self.twin is not None
        req.incremental = self.incremental
        if req.stream:
            req.writer = writer
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
        self.twin.submit(req)
        # The client says nothing more until the answer ends: EOF meanwhile is a cancel.
        # A byte read here once the answer ended is the next request's first: carried over.
        gone = asyncio.ensure_future(_first_byte(reader))
        done = asyncio.ensure_future(req.finished.wait())
        await asyncio.wait({gone, done}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            req.cancelled = True
            done.cancel()
            return None
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone  # the reader is free for the connection's next request
        carry = b"" if gone.cancelled() else gone.result()
        if carry is None:
            return None
        if not req.stream:
            writer.write(_answer(200, _whole(req, self.profile)))
        await writer.drain()
        return carry


async def _first_byte(reader: asyncio.StreamReader) -> bytes | None:
    """The connection's next byte; None when the client closed it."""
    try:
        got = await reader.read(1)
    except ConnectionError:
        return None
    return got or None


def nominal_rates(prof: Profile, concurrencies: Iterator[int] | list[int]) -> dict[int, float]:
    """The model's steady decode rate (tokens/s) at each concurrency (up to the cap)."""
    return {c: prof.nominal_tokens_s(min(c, prof.cap)) for c in concurrencies}


class TwinProcess:
    """The twin in a process of its own (a context manager): no GIL shared with the client
    under test, whose own work would otherwise delay the twin's wake-ups. Ended by its pid."""

    def __init__(self, prof: str, *, time_scale: float = 1.0, seed: int = 0) -> None:
        self.argv = [sys.executable, "-m", "testkit.serving_twin", "--profile", prof,
                     "--time-scale", repr(time_scale), "--seed", str(seed)]
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> TwinProcess:
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=root)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            self.__exit__()
            raise RuntimeError(f"the serving twin did not start: {line!r}")
        self.url = line.split()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.serving_twin",
                                     description="Serve one twin profile until interrupted.")
    parser.add_argument("--profile", choices=PROFILES, default="plain")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    server = TwinServer(args.profile, time_scale=args.time_scale, seed=args.seed,
                        port=args.port)
    ready = threading.Event()

    async def announce() -> None:
        task = asyncio.create_task(server.serve(ready))
        while not ready.is_set():
            await asyncio.sleep(0.01)
        print(f"READY {server.url}", flush=True)
        await task

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(announce())
    return 0


if __name__ == "__main__":
    sys.exit(main())
