"""Secrets and untrusted text: the values of the secrets the pilot names never reach a file or
the terminal, report.md carries no HTML, SGLang's key is never on a command line, the key
variables are checked before anything runs, and a server bound beyond loopback is said.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.sglang.engine import SGLangEngine
from pytest_osprey.judgement import judge, plan_gates
from pytest_osprey.pilot.loading import load_pilot_text
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.report.markdown import markdown
from pytest_osprey.report.summary import summary_dict
from pytest_osprey.results import load_campaign
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.redact import MASK, register, reset, scrub, scrub_obj
from pytest_osprey.run.inputs import bind_warning
from testkit.endpoint_pilot import run_cli, saved_results, sglang_routes, tree, write_endpoint_pilot
from testkit.factories import dump_pilot, make_pilot, pilot_data, write_trace
from testkit.fake_server import Reply, ScriptedServer
from testkit.pilot_run import FAKEPKGS, MARK, kill_marked

FUZZ = settings(deadline=None, database=None, max_examples=50,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


# --------------------------------------------------------------------------- scrubbing


@FUZZ
@given(secret=st.text(min_size=4, max_size=40).filter(lambda s: "*" not in s and s.strip()),
       before=st.text(max_size=30), after=st.text(max_size=30),
       form=st.sampled_from(["raw", "json", "json-ascii", "html"]))
def test_a_registered_secret_leaves_no_trace_in_any_written_form(
    secret: str, before: str, after: str, form: str
) -> None:
    reset()
    register(secret)
    written = {"raw": secret, "json": json.dumps(secret, ensure_ascii=False)[1:-1],
               "json-ascii": json.dumps(secret)[1:-1], "html": html.escape(secret)}[form]
    out = scrub(before + written + after)
    assert MASK in out and written not in out
    doc = {"error": f"HTTP 401: {secret}", "n": 1, "xs": [secret, {"k": secret}]}
    clean = scrub_obj(doc)
    assert secret not in json.dumps(clean, ensure_ascii=False)
    assert clean["n"] == 1 and len(clean["xs"]) == 2 and isinstance(clean["xs"][1], dict)


KEY_ENV = "OSPREY_RELIABILITY_KEY"


@pytest.fixture(autouse=True)
def _no_secrets_left() -> Iterator[None]:
    """The registry is process-wide: what a test registers must not mask another's text."""
    yield
    reset()


@pytest.fixture
def echoing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """An endpoint that answers every /generate with 401 and the Authorization header it got
    (as misconfigured proxies do), and a run against it. Yields (results, key)."""
    key = f'osk-{secrets.token_hex(12)}<&"\''  # characters JSON and HTML write differently
    monkeypatch.setenv(KEY_ENV, key)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step.md"))
    routes = sglang_routes()
    with ScriptedServer(routes=routes) as srv:
        routes[("POST", "/generate")] = lambda body: Reply(
            401, text=f"denied: {srv.seen[-1].headers.get('Authorization')}")
        srv.routes = routes
        pilot = write_endpoint_pilot(tmp_path / "p", srv.url, key_env=KEY_ENV, html=True)
        run_cli(["run", str(pilot), "--results", str(tmp_path / "res")])
        yield tmp_path / "res", key


@pytest.mark.slow  # over a second on 2 busy cores
def test_an_echoed_key_reaches_no_file_and_no_output(
    echoing: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    results, key = echoing
    out = capsys.readouterr()
    forms = {key, json.dumps(key)[1:-1], html.escape(key), html.escape(key, quote=False)}
    files = tree(results) | {"step.md": (results.parent / "step.md").read_bytes()}
    assert {"records.jsonl", "summary.json", "report.md", "report.html", "campaign.json",
            "step.md"} <= set(files)
    for name, data in files.items():
        for form in forms:
            assert form.encode() not in data, f"the key is in {name}"
    for form in forms:
        assert form not in out.out and form not in out.err
    errors = [json.loads(line)["error"] for line in
              (results / "records.jsonl").read_text().splitlines()]
    assert errors and all(e.endswith("denied: Bearer ***") for e in errors), errors[:2]
    assert "Bearer ***" in files["summary.json"].decode()


# --------------------------------------------------------------------------- report.md


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Pilot]:
    res = saved_results(tmp_path_factory.mktemp("md"))
    data = load_campaign(res)
    pilot = load_pilot_text(data.meta.pilot_text or "", "saved")
    return judge(pilot, plan_gates(pilot, list(pilot.conditions)), data, Preflight()), data, pilot


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(title=st.text(max_size=60), said=st.text(max_size=80),
       partial=st.none() | st.text(max_size=40))
def test_report_md_carries_no_html_whatever_the_text(
    judged: tuple[Any, Any, Pilot], title: str, said: str, partial: str | None
) -> None:
    """Title, gate summaries (server error bodies end up there), verdict reasons and the
    partial note: whatever they hold, report.md (a GitHub step summary) has no tag in it."""
    judgement, data, pilot = judged
    judgement = replace(
        judgement, results={k: replace(g, summary=said) for k, g in judgement.results.items()},
        verdicts=[replace(v, reasons=[said]) for v in judgement.verdicts])
    summary = summary_dict(judgement, data, pilot, partial=partial)
    md = markdown(summary, data.meta, title + "<img src=x onerror=alert(1)>", "res")
    # The page's own structure (collapsed sections) is the only markup in it.
    bare = re.sub(r"</?(details|summary|b|sub)>", "", md)
    assert "<" not in bare
    assert "&lt;img src=x onerror=alert(1)&gt;" in md.splitlines()[0]


# --------------------------------------------------------------------------- SGLang's key


def _sglang_pilot(mark: str, **target: Any) -> Pilot:
    return make_pilot(
        target={"engine": "sglang", "model": "fake-model", "python": sys.executable,
                "env": {"PYTHONPATH": str(FAKEPKGS), "PYTHONDONTWRITEBYTECODE": "1",
                        MARK: mark}, "boot_timeout_s": 60, "api_key_env": KEY_ENV,
                **target},
        conditions={"base": {"role": "baseline"}},
        trace={"files": ["t"]},
    )  # fmt: skip


def test_sglang_gets_its_key_from_a_file_never_from_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"osk-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, key)
    mark = str(tmp_path)
    engine = SGLangEngine(_sglang_pilot(mark), "base", BootSpec("base", log_dir=tmp_path))
    try:
        engine.start()
        assert engine.server is not None and engine.key_file is None  # removed once healthy
        for pid in engine.server.pids():
            assert key not in " ".join(psutil.Process(pid).cmdline())  # what `ps` shows
        config = engine.argv[engine.argv.index("--config") + 1]
        assert not os.path.exists(config) and not os.path.exists(os.path.dirname(config))
        res = asyncio.run(engine.generate(GenerationRequest("p", "Hi", 2, want_margins=False)))
        assert res.ok, res.error  # the server did get the key: it answers 401 without it
    finally:
        engine.stop()
        kill_marked(mark)
    log = (tmp_path / "base.log").read_text()
    assert "api_key='***'" in log and key not in log


# --------------------------------------------------------------------------- checked up front


@pytest.mark.parametrize(("value", "state"), [(None, "is not set"), ("", "is empty")])
def test_an_unset_or_empty_key_variable_fails_the_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    value: str | None, state: str,
) -> None:
    if value is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, value)
    pilot = write_endpoint_pilot(tmp_path / "p", "http://127.0.0.1:9", key_env=KEY_ENV)
    assert run_cli(["run", str(pilot), "--dry-run", "--results", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert (f"conditions.base.endpoint.api_key_env: environment variable {KEY_ENV} {state}; "
            "it must hold the API key") in out
    monkeypatch.setenv(KEY_ENV, "k" * 8)
    assert run_cli(["run", str(pilot), "--dry-run", "--results", str(tmp_path / "r2")]) == 0


@pytest.mark.parametrize(("host", "warned"), [
    ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
    ("0.0.0.0", True), ("::", True), ("10.1.2.3", True), ("gpu-box.internal", True),
])
def test_a_bind_address_beyond_loopback_draws_a_warning(host: str, warned: bool) -> None:
    warning = bind_warning(_sglang_pilot("", host=host))
    assert (warning is not None) == warned
    if warning:
        assert warning.startswith(f"target.host is {host}: the engine servers will accept "
                                  "connections from the network")


def test_the_warning_is_said_first_in_the_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(KEY_ENV, "k" * 8)
    data = pilot_data({"base": {"role": "baseline"}},
                      target={"engine": "sglang", "model": "fake-model", "python": sys.executable,
                              "host": "0.0.0.0", "env": {"PYTHONPATH": str(FAKEPKGS)}},
                      trace={"files": [str(write_trace(tmp_path / "t.jsonl", 2))]})
    path = dump_pilot(tmp_path / "pilot.yaml", data)
    assert run_cli(["run", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: target.host is 0.0.0.0: the engine servers will accept "
                          "connections from the network, with no API key")
