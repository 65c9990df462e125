"""Small whole runs against an in-test SGLang-speaking server (no engine to boot): a pilot
whose conditions are endpoints of a :class:`ScriptedServer`, for results-folder, partial-run
and secret tests that need a real results folder in seconds."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from testkit.factories import dump_pilot, pilot_data
from testkit.fake_server import Reply, ScriptedServer


def generate_reply(text: str = "ab", delay: float = 0.0) -> Callable[[Any], Reply]:
    """A /generate answer streaming ``text`` as two tokens."""

    def answer(body: Any) -> Reply:
        meta = {"prompt_tokens": 2, "completion_tokens": 2, "finish_reason": "length"}
        return Reply(events=[(0, {"text": text, "output_ids": [5, 6], "meta_info": meta})],
                     delay=delay)

    return answer


def sglang_routes(generate: Callable[[Any], Reply] | Reply | None = None
                  ) -> dict[tuple[str, str], Any]:
    return {("GET", "/health"): Reply(json_body={}),
            ("GET", "/server_info"): Reply(json_body={"version": "0.0.scripted"}),
            ("POST", "/flush_cache"): Reply(json_body={}),
            ("POST", "/generate"): generate or generate_reply()}


def write_endpoint_pilot(folder: Path, url: str, prompts: int = 3, *,
                         key_env: str | None = None, title: str | None = None,
                         html: bool = False, name: str = "ep",
                         candidates: tuple[str, ...] = ("cand",),
                         extra: Mapping[str, Any] | None = None) -> Path:
    """pilot.yaml + trace.jsonl in ``folder``: a baseline and a candidate, both served by
    ``url`` (one block, one load level, no warm-up)."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "trace.jsonl"
    trace.write_text("".join(json.dumps({"id": f"p{i}", "domain": "chat", "prompt": f"Hi {i}",
                                         "max_new_tokens": 2}) + "\n" for i in range(prompts)))
    endpoint: dict[str, Any] = {"url": url, "protocol": "sglang"}
    if key_env:
        endpoint["api_key_env"] = key_env
    data = pilot_data(
        {"base": {"role": "baseline", "endpoint": endpoint},
         **{c: {"role": "candidate", "endpoint": endpoint} for c in candidates}},
        name=name,
        target={"engine": "endpoint", "model": "m"},
        trace={"files": ["trace.jsonl"]},
        load={"levels": {"low": 1}, "warmup_requests": 0, "blocks": 1},
        report={"html": html, **({"title": title} if title else {})},
    )
    data.update(extra or {})  # replaced whole, as given
    return dump_pilot(folder / "pilot.yaml", data)


def run_cli(argv: list[str]) -> int:
    from pytest_osprey.__main__ import main

    return main(argv)


def saved_results(folder: Path, prompts: int = 3, candidates: tuple[str, ...] = ("cand",)
                  ) -> Path:
    """A complete results folder (``folder/res``) of a small endpoint campaign."""
    with ScriptedServer(routes=sglang_routes()) as srv:
        pilot = write_endpoint_pilot(folder, srv.url, prompts, candidates=candidates)
        code = run_cli(["run", str(pilot), "--results", str(folder / "res")])
    assert code in (0, 1), code
    return folder / "res"


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: relative path -> content."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}
