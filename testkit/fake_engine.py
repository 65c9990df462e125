"""The fake SGLang / vLLM engine process of the process and engine tests (stdlib only): the
routes of :class:`~testkit.fake_server.ScriptedServer`, played on the engine's host and port.

Speaks just enough of SGLang's native API and vLLM's OpenAI API, and can be told to
misbehave: be slow to become healthy, crash during boot, ignore SIGTERM, spawn children
(also outside its process group). Run as a script, or through the fake ``sglang`` / ``vllm``
packages under ``fakepkgs/`` which forward the engines' real command lines here.

Whole-campaign tests cannot add flags (the command line is the engine's, checked by the
fake SGLang parser), so further behaviour comes from the environment, all off by default:

- ``OSPREY_FAKE_EVENTS``: a file this server appends one line per event to: ``start PID HOST
  PORT``, ``child PID``, ``request PID N`` (the N-th /generate arrived), ``answered PID N``
  (its stream ended with [DONE]), ``crash PID``; a test learns pids and counts from it.
- ``OSPREY_FAKE_READY_AFTER`` (seconds) / ``OSPREY_FAKE_NEVER_READY=1``: as the flags.
- ``OSPREY_FAKE_SPAWN_CHILD=1``: as ``--spawn-child``.
- ``OSPREY_FAKE_DELAY_S``: seconds before answering each /generate.
- ``OSPREY_FAKE_CRASH_AFTER=N``: exit (code 9) right after answering the N-th /generate.
- ``OSPREY_FAKE_FAULTS="2=500,3=malformed,4=truncate,5=hang"``: what the N-th /generate
  gets instead of a good stream (HTTP 500, a chunk that is not JSON, no [DONE], no answer).
- ``OSPREY_FAKE_TEXT``: the text every /generate streams back (instead of ``t0 t1 ...``).
- ``OSPREY_FAKE_LM=1``: /generate answers with a tiny deterministic greedy "model" that
  honours the sampling parameters (penalties, stop, min/max tokens, logit bias, JSON schema,
  regex; see :func:`fake_lm`), and reports per-position acceptance when speculating.
- ``OSPREY_FAKE_IGNORE_PENALTIES_WHEN_SPECULATING=1``: with the fake LM, a speculating server
  drops frequency/presence/repetition penalties (the bug users of speculative decoding meet).
- ``OSPREY_FAKE_FLUSH_FAILS=N``: vLLM's /reset_prefix_cache answers ``success: false`` N
  times first (blocks still held); it exists only with ``VLLM_SERVER_DEV_MODE=1``, as in vLLM.

Events also carry ``prompt PID JSON``: the text a /generate or /v1/completions was sent.

SGLang's /generate streams as SGLang 0.5.23 does (tests/fixtures/sglang-0.5.23-cpu): chunks
cumulative by default, deltas with ``--incremental-streaming-output``; top-2 logprob rows
(``[logprob, id, null]``) when asked; the speculation counters, acceptance histogram
included, on the last chunk; an abort ends with ``finish_reason`` ``{"type": "abort"}``.
Fault ``abort`` aborts the N-th /generate after its first chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script (tests start it by path): the checkout, for testkit
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.fake_server import OnRequest, Reply, Routes, ScriptedServer, Seen

# A child that sleeps; given an argument, it also ignores SIGTERM.
CHILD = (
    "import signal, sys, time\n"
    "if sys.argv[1:]: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "time.sleep(3600)\n"
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--crash-after", type=float, default=None)
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--spawn-child", action="store_true")
    p.add_argument("--child-setsid", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--config", default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--model-path", "--model", dest="model", default="fake-model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--incremental-streaming-output", dest="incremental", action="store_true")
    p.add_argument("--enable-deterministic-inference", dest="deterministic",
                   action="store_true")
    args, _unknown = p.parse_known_args(argv)
    return args


def _event(line: str) -> None:
    """Append one line to $OSPREY_FAKE_EVENTS (a single O_APPEND write: lines never mix)."""
    path = os.environ.get("OSPREY_FAKE_EVENTS")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def sglang_events(body: dict[str, Any], n: int, *, incremental: bool, speculates: bool,
                  text: str | None = None, abort_after: int | None = None
                  ) -> list[dict[str, Any]]:
    """The /generate chunks of an ``n``-token answer, shaped as SGLang 0.5.23 shapes them:
    the first token alone, then two per chunk; the chunk after ``abort_after`` ones aborts."""
    ids = [100 + i for i in range(n)]
    pieces = [f"t{i} " for i in range(n)]
    logprobs = bool(body.get("return_logprob"))
    k = int(body.get("top_logprobs_num") or 0)
    rows: list[list[Any]] = [[-0.1 * (i % 3) - 0.05, ids[i], None] for i in range(n)]
    tops = [[rows[i], [rows[i][0] - 0.5 - 0.1 * (i % 4), ids[i] + 1, None]][:k]
            for i in range(n)]
    events: list[dict[str, Any]] = []
    done = sent = 0
    while done < n:
        done = min(n, done + (1 if done == 0 else 2))
        last = done == n
        lo = sent if incremental else 0
        meta: dict[str, Any] = {"id": "fake", "finish_reason": None, "prompt_tokens": 5,
                                "weight_version": "default", "completion_tokens": done,
                                "cached_tokens": 0}  # fmt: skip
        if logprobs:
            meta["output_token_logprobs"] = rows[lo:done]
            if k:
                meta["output_top_logprobs"] = tops[lo:done]
        if abort_after is not None and len(events) == abort_after:
            # An abort while decoding (/abort_request): the chunk as any other, its finish
            # reason the abort (recorded: incremental_plain/generate_stream_aborted.txt).
            meta["finish_reason"] = {"type": "abort", "message": "Aborted", "status_code": None,
                                     "err_type": None}
            last = True
        elif last:
            meta["finish_reason"] = {"type": "length", "length": n}
            meta["e2e_latency"] = 0.01
            if speculates:
                verify = (n + 1) // 2
                correct = n - verify
                meta.update(spec_verify_ct=verify, spec_accept_length=n / verify,
                            spec_accept_rate=correct / (3 * verify),
                            spec_num_correct_drafts=correct,
                            spec_num_proposed_drafts=3 * verify,
                            spec_correct_drafts_histogram=[verify - correct, correct])
        if text is None:
            chunk_text = "".join(pieces[lo:done])
        else:  # the whole fixed text: in the first chunk only where chunks are deltas
            chunk_text = text if not (incremental and events) else ""
        events.append({"text": chunk_text, "output_ids": ids[lo:done], "meta_info": meta})
        sent = done
        if last:
            break
    return events


def _faults(spec: str) -> dict[int, str]:
    """``"2=500,5=hang"`` -> {2: "500", 5: "hang"}."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        n, _, kind = part.partition("=")
        out[int(n)] = kind.strip()
    return out


EOS = 99


def fake_lm(params: dict[str, Any], ignore_penalties: bool) -> tuple[list[int], str, str]:
    """(ids, text, finish reason) of a tiny greedy model over ids 100..119 (text ``t<k> ``) and
    EOS 99: it alternates t0 t1 (repetitive, so penalties change it), and ends after 8 tokens.
    """
    if params.get("json_schema") is not None:
        return [120, 121, 120], '"yes"', "stop"
    if params.get("regex") is not None:
        return [121], "yes", "stop"
    n = int(params["max_new_tokens"])
    freq = 0.0 if ignore_penalties else float(params.get("frequency_penalty") or 0.0)
    pres = 0.0 if ignore_penalties else float(params.get("presence_penalty") or 0.0)
    rep = 1.0 if ignore_penalties else float(params.get("repetition_penalty") or 1.0)
    bias = {int(k): float(v) for k, v in (params.get("logit_bias") or {}).items()}
    min_new = int(params.get("min_new_tokens") or 0)
    stops = params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    ids: list[int] = []
    text = ""
    for t in range(n):
        logits = {v: 1.0 - 0.01 * (v - 100) for v in range(100, 120)}
        logits[100 + t % 2] = 3.0
        logits[102 + t % 5] = max(logits[102 + t % 5], 2.5)
        logits[EOS] = 3.5 if t >= 8 and t >= min_new else float("-inf")
        for v in logits:
            count = ids.count(v)
            if count:
                x = logits[v]
                logits[v] = (x / rep if x > 0 else x * rep) - freq * count - pres
            logits[v] += bias.get(v, 0.0)
        best = max(logits, key=lambda v: (logits[v], -v))
        if best == EOS:
            return ids, text, "stop"
        ids.append(best)
        text += f"t{best - 100} "
        cut = [text.find(s) for s in stops if s and s in text]
        if cut:
            return ids, text[: min(cut)], "stop"
    return ids, text, "length"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    env = os.environ
    args.ready_after = float(env.get("OSPREY_FAKE_READY_AFTER") or args.ready_after)
    args.never_ready = args.never_ready or env.get("OSPREY_FAKE_NEVER_READY") == "1"
    args.spawn_child = args.spawn_child or env.get("OSPREY_FAKE_SPAWN_CHILD") == "1"
    delay_s = float(env.get("OSPREY_FAKE_DELAY_S") or 0)
    crash_after = int(env.get("OSPREY_FAKE_CRASH_AFTER") or 0)
    faults = _faults(env.get("OSPREY_FAKE_FAULTS", ""))
    fixed_text = env.get("OSPREY_FAKE_TEXT")
    use_lm = env.get("OSPREY_FAKE_LM") == "1"
    ignore_penalties = env.get("OSPREY_FAKE_IGNORE_PENALTIES_WHEN_SPECULATING") == "1"
    _event(f"start {os.getpid()} {args.host} {args.port}")
    print("fake server argv:", " ".join(argv), flush=True)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, *(["ignore"] if args.ignore_sigterm else [])],
            start_new_session=args.child_setsid,
        )
        print(f"child pid {child.pid}", flush=True)
        _event(f"child {child.pid}")
    if args.crash_after is not None:
        time.sleep(args.crash_after)
        print("fatal: boot failed on purpose", flush=True)
        sys.exit(args.exit_code)
    if args.config:  # SGLang's --config: flags in a YAML file (here JSON, a subset)
        with open(args.config, encoding="utf-8") as fh:
            args.api_key = json.load(fh).get("api-key") or args.api_key
    key = args.api_key or os.environ.get("VLLM_API_KEY")
    print(f"server_args: api_key={key!r}", flush=True)  # as SGLang logs its arguments
    engine = _Engine(args, key, delay_s=delay_s, crash_after=crash_after, faults=faults,
                     fixed_text=fixed_text, use_lm=use_lm, ignore_penalties=ignore_penalties,
                     flush_fails=int(env.get("OSPREY_FAKE_FLUSH_FAILS") or 0),
                     dev_mode=env.get("VLLM_SERVER_DEV_MODE") == "1")
    server = ScriptedServer(engine.routes(), host=args.host, port=args.port,
                            log=lambda line: print(line, flush=True))
    print(f"listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


def _json(status: int, obj: Any) -> Reply:
    return Reply(status, json_body=obj)


def _sse(events: list[dict[str, Any]], then: Callable[[], None] | None = None) -> Reply:
    """A stream as the engines send it: 10 ms between events, then [DONE]."""
    timed: list[tuple[float, Any]] = [(0.01 if i else 0.0, ev) for i, ev in enumerate(events)]
    return Reply(events=[*timed, (0.01, "[DONE]")], done=False, then=then)


class _Engine:
    """What the fake SGLang / vLLM server answers, route by route (one instance a process)."""

    def __init__(self, args: argparse.Namespace, key: str | None, *, delay_s: float,
                 crash_after: int, faults: dict[int, str], fixed_text: str | None,
                 use_lm: bool, ignore_penalties: bool, flush_fails: int, dev_mode: bool
                 ) -> None:
        self.args, self.key = args, key
        self.delay_s, self.crash_after, self.faults = delay_s, crash_after, faults
        self.fixed_text, self.use_lm = fixed_text, use_lm
        self.speculates = bool(args.speculative_algorithm or args.speculative_config)
        self.ignore_penalties = ignore_penalties and self.speculates
        self.flush_fails, self.dev_mode = flush_fails, dev_mode
        self.generated = 0
        self.counters = [0.0, 0.0, 0.0]  # drafts, draft tokens, accepted
        self.t_start = time.monotonic()

    def routes(self) -> Routes:
        open_routes = {("GET", "/health"): self.health, ("GET", "/health_generate"): self.health}
        keyed = {("GET", "/server_info"): self.server_info, ("GET", "/version"): self.version,
                 ("GET", "/v1/models"): self.models, ("GET", "/metrics"): self.metrics,
                 ("POST", "/flush_cache"): self.flush_cache, ("POST", "/generate"): self.generate,
                 ("POST", "/v1/completions"): self.completions}  # fmt: skip
        if self.dev_mode:  # vLLM has it only in its dev mode
            keyed[("POST", "/reset_prefix_cache")] = self.reset_prefix_cache
        routes: Routes = {r: OnRequest(fn) for r, fn in open_routes.items()}
        routes.update({r: OnRequest(self._keyed(fn)) for r, fn in keyed.items()})
        return routes

    def _keyed(self, fn: Callable[[Seen], Reply]) -> Callable[[Seen], Reply]:
        def answer(seen: Seen) -> Reply:
            if self.key and seen.header("Authorization") != f"Bearer {self.key}":
                return _json(401, {"error": "bad key"})
            body = seen.body if seen.body is not None else {}
            prompt = body.get("text", body.get("prompt")) if isinstance(body, dict) else None
            if seen.path in ("/generate", "/v1/completions") and isinstance(prompt, str):
                _event(f"prompt {os.getpid()} {json.dumps(prompt)}")
            return fn(seen)

        return answer

    def health(self, seen: Seen) -> Reply:
        args = self.args
        ready = not args.never_ready and time.monotonic() - self.t_start >= args.ready_after
        return _json(200 if ready else 503, {})

    def server_info(self, seen: Seen) -> Reply:
        # As SGLang 0.5.23: context_length null unless given (the served one is on
        # /v1/models); speculative servers capped at 48 running requests.
        args, spec = self.args, self.speculates
        return _json(200, {
            "version": "0.0.fake", "model_path": args.model, "dtype": args.dtype,
            "device": "cpu", "api_key": self.key,
            "speculative_algorithm": args.speculative_algorithm,
            "max_total_num_tokens": 4096, "context_length": None,
            "max_running_requests": 48 if spec else None,
            "incremental_streaming_output": args.incremental,
            "enable_deterministic_inference": args.deterministic,
            "internal_states": [{"effective_max_running_requests_per_dp": 48 if spec else 4096}],
        })  # fmt: skip

    def version(self, seen: Seen) -> Reply:
        return _json(200, {"version": "0.0.fake"})

    def models(self, seen: Seen) -> Reply:
        return _json(200, {"data": [{"id": "osprey-target", "max_model_len": 512}]})

    def metrics(self, seen: Seen) -> Reply:
        d, t, a = self.counters
        return Reply(text=(
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {d}\n'
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {t}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {a}\n'
        ), content_type="text/plain; version=0.0.4")

    def flush_cache(self, seen: Seen) -> Reply:
        return _json(200, {})

    def reset_prefix_cache(self, seen: Seen) -> Reply:
        self.flush_fails -= 1
        return _json(200, {"success": self.flush_fails < 0})

    def generate(self, seen: Seen) -> Reply:
        self.generated += 1
        nth = self.generated
        pid = os.getpid()
        _event(f"request {pid} {nth}")
        reply = self._generate(seen.body, nth)
        reply.delay += self.delay_s
        return reply

    def _generate(self, body: dict[str, Any], nth: int) -> Reply:
        pid = os.getpid()
        kind = self.faults.get(nth)
        if kind is not None and kind != "abort":
            return _fault(kind)

        def answered() -> None:
            _event(f"answered {pid} {nth}")
            if not self.use_lm and self.crash_after and nth >= self.crash_after:
                _event(f"crash {pid}")
                os._exit(9)

        if self.use_lm:
            ids, text, finish = fake_lm(body["sampling_params"], self.ignore_penalties)
            meta: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": len(ids),
                                    "finish_reason": {"type": finish}}
            if self.speculates:
                steps = max(1, (len(ids) + 2) // 3)  # 3 drafts per step, 2 accepted
                meta.update(spec_verify_ct=steps, spec_correct_drafts_histogram=[0, 0, steps, 0])
            return _sse([{"text": text, "output_ids": ids, "meta_info": meta}], answered)
        n = int(body["sampling_params"]["max_new_tokens"])
        events = sglang_events(body, n, incremental=self.args.incremental,
                               speculates=self.speculates, text=self.fixed_text,
                               abort_after=1 if kind == "abort" else None)
        return _sse(events, answered)

    def completions(self, seen: Seen) -> Reply:
        n = int(seen.body["max_tokens"])
        events: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "text": f"t{i} ", "token_ids": [100 + i],
                          "finish_reason": "length" if i == n - 1 else None}]}
            for i in range(n)]  # fmt: skip
        if self.speculates:
            c = self.counters
            c[0] += n // 2
            c[1] += 2 * (n // 2)
            c[2] += n // 2
        events.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}})
        return _sse(events)


def _fault(kind: str) -> Reply:
    """What a request planted with fault ``kind`` gets instead of a good stream."""
    if kind == "500":
        return _json(500, {"error": "injected failure"})
    if kind == "hang":
        return Reply(delay=3600)
    if kind == "malformed":
        return Reply(events=[(0.0, "{not json")])
    if kind == "truncate":
        first = {"text": "t0 ", "output_ids": [100],
                 "meta_info": {"prompt_tokens": 5, "completion_tokens": 1}}
        return Reply(events=[(0.0, first)], done=False)
    raise ValueError(f"OSPREY_FAKE_FAULTS: unknown fault {kind!r}")


if __name__ == "__main__":
    main()
