"""How faithfully a streaming client times a stream whose truth is known: one client's
measured outcomes against the timing stub's log (testkit/timed_stream.py), as the fidelity
benchmark (benchmarks/fidelity.py) reports them, and the stub run in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testkit.timed_stream import (
    Schedule,
    expected_ids,
    expected_text,
    request_number,
    schedule_argv,
)

ROOT = Path(__file__).resolve().parents[1]
# Targets of the fidelity issue.
TTFT_P50_MS, TTFT_P99_MS, TARGET_CONCURRENCY = 0.5, 2.0, 64
# "No worse than vLLM's client", within run-to-run noise.
SAME_MS, SAME_CPU = 0.05, 1.10


@dataclass
class Outcome:
    """One request as a client measured it (times in seconds)."""

    ok: bool
    error: str = ""
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    text: str = ""
    tokens: int | None = None
    ids: list[int] | None = None
    t_start: float | None = None  # perf_counter at submission


@dataclass
class ClientRun:
    client: str
    api: str  # the stub route it used: "sglang" | "openai"
    concurrency: int
    itl_per_token: bool  # True: ours (even split per token); False: one entry per chunk
    cpu_s: float
    wall_s: float
    outcomes: list[Outcome]


def read_vllm_output(path: Path) -> tuple[list[ClientRun], str | None]:
    """The driver's JSON as ClientRuns (and vLLM's version)."""
    data = json.loads(path.read_text())
    runs = []
    for level in data["levels"]:
        outcomes = [
            Outcome(
                ok=bool(r["success"]),
                error=str(r.get("error") or ""),
                ttft_s=float(r["ttft"]) if r.get("success") else None,
                itl_s=[float(x) for x in r.get("itl") or []],
                text=str(r.get("generated_text") or ""),
                tokens=r.get("output_tokens"),
                ids=None,  # vLLM's client does not ask for token ids
                t_start=r.get("start_time"),
            )
            for r in level["results"]
        ]
        runs.append(
            ClientRun(
                "vllm-bench",
                "openai",
                int(level["concurrency"]),
                False,
                float(level["cpu_s"]),
                float(level["wall_s"]),
                outcomes,
            )
        )
    version = data.get("vllm_version")
    return runs, str(version) if version is not None else None


# --------------------------------------------------------------------------- analysis


def _chunk_gaps(outcome: Outcome, sizes: Sequence[int], per_token: bool) -> list[float] | None:
    """The client's gap before each chunk after the first, or None if the shape is off."""
    if not per_token:
        return list(outcome.itl_s) if len(outcome.itl_s) == len(sizes) - 1 else None
    if len(outcome.itl_s) != sum(sizes) - 1:
        return None
    gaps = []
    pos = sizes[0] - 1  # the first chunk's extra tokens, at 0
    for size in sizes[1:]:
        gaps.append(sum(outcome.itl_s[pos : pos + size]))
        pos += size
    return gaps


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    a = np.abs(np.asarray(values)) * 1e3
    return {
        "p50": float(np.median(a)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def _signed_ms(values: Sequence[float]) -> float | None:
    return float(np.median(values) * 1e3) if values else None


def analyse(run: ClientRun, log: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Errors of one client run against the stub's log (entries keyed by request number)."""
    ttft_stub: list[float] = []
    ttft_script: list[float] = []
    itl_stub: list[float] = []
    itl_script: list[float] = []
    send_lag: list[float] = []
    chunk_lag: list[float] = []
    problems: dict[str, int] = {}
    chunks = 0

    def problem(kind: str) -> None:
        problems[kind] = problems.get(kind, 0) + 1

    for o in run.outcomes:
        if not o.ok:
            problem(f"failed: {o.error.strip().splitlines()[-1][:120] if o.error else '?'}")
            continue
        n = request_number(o.text)
        entry = log.get(n) if n is not None else None
        if n is None or entry is None or entry["api"] != run.api:
            problem("output matches no request")
            continue
        tokens = int(entry["tokens"])
        writes = [float(t) for t in entry["t_write"]]
        plan = [(float(at), int(size)) for at, size in entry["plan"]]
        sizes = [size for _, size in plan]
        chunks += len(writes)
        if not entry["complete"] or len(writes) != len(plan):
            problem("stream not completed by the stub")
            continue
        if o.text != expected_text(n, tokens):
            problem("wrong text")
        if o.tokens != tokens:
            problem("wrong token count")
        if o.ids is not None and o.ids != expected_ids(tokens):
            problem("wrong token ids")
        if o.ttft_s is None:
            problem("no TTFT")
            continue
        t_recv = float(entry["t_recv"])
        ttft_stub.append(o.ttft_s - (writes[0] - t_recv))
        ttft_script.append(o.ttft_s - plan[0][0])
        gaps = _chunk_gaps(o, sizes, run.itl_per_token)
        if gaps is None:
            problem("ITL list does not fit the chunks")
            continue
        for j, gap in enumerate(gaps, start=1):
            itl_stub.append(gap - (writes[j] - writes[j - 1]))
            itl_script.append(gap - (plan[j][0] - plan[j - 1][0]))
        if o.t_start is not None:
            # One clock across processes: where the TTFT error arises (request path vs
            # response path), and how late each chunk was stamped after it was written.
            send_lag.append(t_recv - o.t_start)
            arrival = o.t_start + o.ttft_s
            chunk_lag.append(arrival - writes[0])
            for j, gap in enumerate(gaps, start=1):
                arrival += gap
                chunk_lag.append(arrival - writes[j])
    return {
        "client": run.client,
        "api": run.api,
        "concurrency": run.concurrency,
        "requests": len(run.outcomes),
        "errors": sum(problems.values()),
        "problems": problems,
        "chunks": chunks,
        "cpu_ms_per_chunk": run.cpu_s * 1e3 / chunks if chunks else None,
        "cpu_s": run.cpu_s,
        "wall_s": run.wall_s,
        "ttft_err_vs_stub_ms": _ms(ttft_stub),
        "ttft_err_vs_stub_signed_p50_ms": _signed_ms(ttft_stub),
        "ttft_err_vs_script_ms": _ms(ttft_script),
        "itl_err_vs_stub_ms": _ms(itl_stub),
        "itl_err_vs_script_ms": _ms(itl_script),
        "send_lag_ms": _ms(send_lag),
        "chunk_lag_ms": _ms(chunk_lag),
    }


def _pair(stat: Mapping[str, float | None]) -> str:
    p50, p99 = stat["p50"], stat["p99"]
    return "-" if p50 is None or p99 is None else f"{p50:.3f} / {p99:.2f}"


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| client | conc | N | errors | TTFT err vs stub p50/p99 ms | TTFT err vs script "
        "p50/p99 ms | ITL err vs stub p50/p99 ms | ITL err vs script p50/p99 ms | chunk lag "
        "p50/p99 ms | CPU ms/chunk | wall s |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        cpu = r["cpu_ms_per_chunk"]
        lines.append(
            f"| {r['client']} | {r['concurrency']} | {r['requests']} | {r['errors']} "
            f"| {_pair(r['ttft_err_vs_stub_ms'])} | {_pair(r['ttft_err_vs_script_ms'])} "
            f"| {_pair(r['itl_err_vs_stub_ms'])} | {_pair(r['itl_err_vs_script_ms'])} "
            f"| {_pair(r['chunk_lag_ms'])} | {'-' if cpu is None else f'{cpu:.3f}'} "
            f"| {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def verdicts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The issue's targets, checked."""
    out = []
    by = {(r["client"], r["concurrency"]): r for r in rows}
    for r in rows:
        ours = r["client"].startswith("osprey")
        stub = r["ttft_err_vs_stub_ms"]
        if ours and r["concurrency"] == TARGET_CONCURRENCY and stub["p50"] is not None:
            ok = stub["p50"] <= TTFT_P50_MS and stub["p99"] <= TTFT_P99_MS
            out.append(
                f"{'PASS' if ok else 'FAIL'} {r['client']} c={r['concurrency']}: |TTFT err| "
                f"p50 {stub['p50']:.3f} ms (<= {TTFT_P50_MS}), p99 {stub['p99']:.2f} ms "
                f"(<= {TTFT_P99_MS})"
            )
        if ours and r["concurrency"] >= 256:
            out.append(
                f"{'PASS' if r['errors'] == 0 else 'FAIL'} {r['client']} "
                f"c={r['concurrency']}: {r['errors']} client errors"
            )
        ref = by.get(("vllm-bench", r["concurrency"]))
        if ours and ref is not None:
            worse = []
            for key in ("ttft_err_vs_stub_ms", "itl_err_vs_stub_ms"):
                mine, theirs = r[key]["p50"], ref[key]["p50"]
                if mine is not None and theirs is not None and mine > theirs + SAME_MS:
                    worse.append(f"{key[:-3]} p50 {mine:.3f} > {theirs:.3f} ms")
            mine_cpu, their_cpu = r["cpu_ms_per_chunk"], ref["cpu_ms_per_chunk"]
            if mine_cpu is not None and their_cpu is not None and mine_cpu > their_cpu * SAME_CPU:
                worse.append(f"CPU/chunk {mine_cpu:.3f} > {their_cpu:.3f} ms")
            out.append(
                f"{'PASS' if not worse else 'FAIL'} {r['client']} c={r['concurrency']} "
                f"vs vllm-bench (p50 errors +{SAME_MS} ms, CPU x{SAME_CPU}): "
                + ("; ".join(worse) if worse else "no worse")
            )
    return out


def merged(runs: Sequence[ClientRun]) -> list[ClientRun]:
    """One run per client and concurrency: rounds' outcomes pooled, CPU and wall summed."""
    out: dict[tuple[str, int], ClientRun] = {}
    for r in runs:
        key = (r.client, r.concurrency)
        if key not in out:
            out[key] = ClientRun(r.client, r.api, r.concurrency, r.itl_per_token, r.cpu_s,
                                 r.wall_s, list(r.outcomes))
        else:
            m = out[key]
            m.cpu_s += r.cpu_s
            m.wall_s += r.wall_s
            m.outcomes += r.outcomes
    return list(out.values())


class Stub:
    """The timing stub (testkit/timed_stream.py) in a child process."""

    def __init__(self, schedule: Schedule) -> None:
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "testkit.timed_stream", "--port", "0",
             *schedule_argv(schedule)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path},
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening "):
            self.proc.kill()
            raise RuntimeError(f"stub server did not start: {line!r}")
        self.url = line.split(" ", 1)[1]

    def log(self) -> dict[int, dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/log", timeout=60) as r:
            entries = json.loads(r.read())["requests"]
        return {int(e["n"]): e for e in entries}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
