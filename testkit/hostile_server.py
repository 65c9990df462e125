"""A server that misbehaves on purpose: an SGLang-speaking :class:`ScriptedServer` whose
answers play one misbehaviour, by name, for the tests of what the client does with them.

Every misbehaviour but one is in its answers; the server itself stays a real HTTP server on
a free port of 127.0.0.1, serving in a thread of its own and gone when its ``with`` ends:

- ``impossible``: /generate reports the meta_info values given (an accept length of 1e9, a
  verify count of 0, a negative count...), or more output ids than asked for;
- ``nan``: /generate reports NaN as its accept length (JSON's non-standard ``NaN``);
- ``huge_string``: /server_info's version is ``size`` characters long;
- ``html``: /server_info answers an HTML page with status 200;
- ``hang``: /generate never answers (the server holds the connection open);
- ``huge_event``: /generate streams one event of ``size`` bytes of text, in 64 KiB pieces.

:func:`run_campaign` runs a whole campaign of a baseline and a candidate served by two such
servers; :func:`strict_json` reads what it wrote as a strict JSON parser would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testkit.endpoint_pilot import run_cli
from testkit.factories import dump_pilot, pilot_data
from testkit.fake_server import Reply, ScriptedServer

MISBEHAVIOURS = ("impossible", "nan", "huge_string", "html", "hang", "huge_event")
HANG_S = 3600.0  # longer than any test: the connection is closed when the server stops
HTML = "<html><head><title>Sign in</title></head><body>Please sign in</body></html>"


def stream(ids: list[int], meta: Mapping[str, Any] | None = None, text: str = "ab") -> Reply:
    """A /generate stream of one chunk carrying ``ids``, its meta_info ``meta`` on top of a
    sound one."""
    sound = {"prompt_tokens": 2, "completion_tokens": len(ids), "finish_reason": "length"}
    return Reply(events=[(0, {"text": text, "output_ids": ids,
                              "meta_info": {**sound, **(meta or {})}})])


def hostile_server(misbehaviour: str, *, ids: list[int] | None = None,
                   meta: Mapping[str, Any] | None = None, size: int = 1 << 20,
                   info: Mapping[str, Any] | None = None) -> ScriptedServer:
    """A server playing ``misbehaviour`` (one of MISBEHAVIOURS); the routes it does not
    misplay answer soundly (health, flush, a small /server_info, a 4-token stream)."""
    if misbehaviour not in MISBEHAVIOURS:
        raise ValueError(f"no misbehaviour {misbehaviour!r}: one of {', '.join(MISBEHAVIOURS)}")
    ids = ids if ids is not None else [5, 6, 7, 8]
    generate = stream(ids)
    server_info = Reply(json_body={"version": "0.0.hostile", **(info or {})})
    if misbehaviour == "impossible":
        generate = stream(ids, meta)
    elif misbehaviour == "nan":
        generate = stream(ids, {"spec_accept_length": float("nan"), **(meta or {})})
    elif misbehaviour == "huge_string":
        server_info = Reply(json_body={"version": "9" * size, **(info or {})})
    elif misbehaviour == "html":
        server_info = Reply(text=HTML, content_type="text/html")
    elif misbehaviour == "hang":
        generate = Reply(delay=HANG_S, events=[])
    elif misbehaviour == "huge_event":
        # Sent as it would be written, in 64 KiB pieces of a chunked body.
        generate = stream(ids, text="x" * size)
        generate.chunk_bytes = 64 << 10
    return ScriptedServer(keep_alive=misbehaviour == "huge_event", routes={
        ("GET", "/health"): Reply(json_body={}),
        ("GET", "/server_info"): server_info,
        ("POST", "/flush_cache"): Reply(json_body={}),
        ("POST", "/generate"): generate,
    })


def run_campaign(tmp: Path, cand_url: str, base_url: str, prompts: int = 6,
                 **load: Any) -> tuple[int, Path]:
    """`osprey run` of a baseline at ``base_url`` and a candidate at ``cand_url`` (one
    level of 1, ``prompts`` 4-token prompts, no warm-up; ``load`` on top): exit code and
    results folder."""
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(json.dumps({"id": f"p{i}", "domain": "chat", "prompt": f"Hi {i}",
                                         "max_new_tokens": 4}) + "\n" for i in range(prompts)))
    data = pilot_data(
        {"base": {"role": "baseline", "endpoint": {"url": base_url, "protocol": "sglang"}},
         "cand": {"role": "candidate", "endpoint": {"url": cand_url, "protocol": "sglang"}}},
        target={"engine": "endpoint", "model": "m"}, trace={"files": ["trace.jsonl"]},
        load={"levels": {"low": 1}, "warmup_requests": 0, "passes": 1, **load},
        report={"html": False})
    pilot = dump_pilot(tmp / "pilot.yaml", data)
    return run_cli(["run", str(pilot), "--results", str(tmp / "res")]), tmp / "res"


def strict_json(path: Path) -> list[Any]:
    """Every JSON document of ``path`` read by a parser that refuses NaN and infinities."""
    def refuse(name: str) -> None:
        raise ValueError(f"{path.name}: {name}")

    text = path.read_text()
    lines = text.splitlines() if path.suffix == ".jsonl" else [text]
    return [json.loads(line, parse_constant=refuse) for line in lines if line.strip()]
