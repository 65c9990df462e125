"""A scripted streaming server that speaks SGLang's /generate and OpenAI's /v1/completions.

Tokens come on a known schedule: the first chunk ``ttft`` after the request is received,
then one chunk per decoding step ``gap`` apart, chunk sizes cycling (1, 3, 2 by default) the
way speculative decoding accepts several tokens per step, each delay optionally scaled by a
seeded uniform jitter. The server logs, per request, the ``time.perf_counter`` instant it
had the whole request and the instant each chunk was handed to the kernel. On Linux
perf_counter is CLOCK_MONOTONIC, one clock for every process, so a client in another process
can be compared with this log. Request number ``n`` (in arrival order) is written into the
first token's text (``<n>``) so a client's output can be matched to its log entry.

    python -m testkit.timed_stream [--port 0] [--ttft-ms 40] [--gap-ms 20] [--chunks 1,3,2]
                                     [--jitter 0.2] [--seed 0]

prints ``listening http://127.0.0.1:PORT`` once bound. Routes: POST /generate (SGLang:
incremental chunks, as servers booted with ``--incremental-streaming-output``, or with
``--sglang-cumulative`` SGLang's default cumulative ones; top-2 logprob rows when asked),
POST /v1/completions (OpenAI/vLLM, deltas, ``token_ids`` when
``return_token_ids``, a usage chunk when ``stream_options.include_usage``), GET /log (every
request so far, JSON), POST /reset (clear the log, restart numbering), GET /health.

The server is :class:`~testkit.fake_server.ScriptedServer` keeping connections alive (HTTP/1.1,
chunked responses): the project depends on no ASGI server, and this one does little per chunk
(a timer callback, one ``write``; the payloads are made on receipt), so its own lag stays
small next to the clients' at hundreds of streams. ``backlogged`` in the log counts chunks
written while the socket's send buffer was full (their stamps are early); it stays 0 while
clients keep up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from testkit.fake_server import OnRequest, Reply, ScriptedServer, Seen

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
    """One generation request as the stub numbered and planned it; its stamps are the
    server's (:class:`~testkit.fake_server.Seen`)."""

    n: int
    api: str  # "sglang" | "openai"
    tokens: int
    plan: list[tuple[float, int]]
    seen: Seen

    def to_json(self) -> dict[str, Any]:
        seen = self.seen
        return {
            "n": self.n,
            "api": self.api,
            "t_recv": seen.t_recv,
            "tokens": self.tokens,
            "plan": [list(p) for p in self.plan],
            "t_write": seen.t_write[: len(self.plan)],  # the content chunks' (not the tail's)
            "t_end": seen.t_end,
            "complete": seen.complete,
            "backlogged": seen.backlogged,
        }


class TimedStub:
    """The stub's routes on a keep-alive :class:`~testkit.fake_server.ScriptedServer`."""

    def __init__(self, schedule: Schedule, cumulative: bool = False,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.schedule = schedule
        self.cumulative = cumulative  # SGLang's default streaming (else incremental)
        self.log: list[Served] = []
        self._next = 0
        self.server = ScriptedServer({
            ("POST", "/generate"): OnRequest(lambda seen: self._stream("sglang", seen)),
            ("POST", "/v1/completions"): OnRequest(lambda seen: self._stream("openai", seen)),
            ("GET", "/log"): OnRequest(lambda _: Reply(json_body={"requests": self.entries()})),
            ("POST", "/reset"): OnRequest(lambda _: self.reset()),
            ("GET", "/health"): Reply(json_body={"ok": True}),
        }, host=host, port=port, keep_alive=True)  # fmt: skip

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def connections(self) -> int:
        """Accepted so far: tells whether clients keep them alive."""
        return self.server.connections

    def entries(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in list(self.log)]

    def reset(self) -> Reply:
        self.log.clear()
        self._next = 0
        return Reply(json_body={"ok": True})

    def _stream(self, api: str, seen: Seen) -> Reply:
        body = seen.body
        if not isinstance(body, dict):
            return Reply(400, {"error": "body is not a JSON object"})
        if body.get("stream") is not True:
            return Reply(400, {"error": "this stub only streams"})
        if api == "sglang":
            params = body.get("sampling_params") or {}
            tokens = int(params.get("max_new_tokens") or DEFAULT_TOKENS)
            prompt = body.get("text")
        else:
            tokens = int(body.get("max_tokens") or DEFAULT_TOKENS)
            prompt = body.get("prompt")
        prompt_tokens = len(prompt.split()) if isinstance(prompt, str) else 0
        n = self._next
        self._next += 1
        plan = self.schedule.plan(n, tokens)
        self.log.append(Served(n, api, tokens, plan, seen))
        payloads = Payloads(api, n, tokens, prompt_tokens, body, incremental=not self.cumulative)
        events: list[tuple[float, Any]] = []
        done = 0
        before = 0.0
        for step, (at, size) in enumerate(plan):
            done += size
            events.append((at - before, payloads.chunk(step, done, at)))
            before = at
        # The tail (usage, [DONE]) goes out with the last chunk.
        events += [(0.0, tail) for tail in payloads.tail(len(plan))]
        return Reply(events=events, done=False)


class Payloads:
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


@contextlib.contextmanager
def serve_in_thread(schedule: Schedule, cumulative: bool = False) -> Iterator[TimedStub]:
    """The stub on its own event loop in a daemon thread (for tests; ``.log`` is live)."""
    stub = TimedStub(schedule, cumulative)
    with stub.server:
        yield stub


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


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--sglang-cumulative", action="store_true",
                    help="SGLang's default streaming: every chunk resends all so far")
    schedule_args(ap)
    args = ap.parse_args()
    stub = TimedStub(schedule_from(args), args.sglang_cumulative, args.host, args.port)
    print(f"listening http://{args.host}:{stub.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        stub.server.serve_forever()


if __name__ == "__main__":
    main()
