"""Hypothesis: whatever a trace file holds, load_trace returns a Trace or raises a TraceError
that names the file (and, for a bad line, its number); never any other exception."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_osprey.pilot.trace import TraceError, load_trace
from testkit.factories import ROOT

SHIPPED = [json.loads(line) for line in (ROOT / "prompts" / "pilot.jsonl").read_text().splitlines()
           if line.strip()]
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
KEYS = ["id", "domain", "slice", "prompt", "messages", "max_new_tokens", "expect", "role",
        "content", "type", "value", "pattern", "tolerance", "schema", "function", "idd", "promt"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner,
                                            max_size=4)),
    max_leaves=12,
)


def _check(tmp: Path, text: str) -> None:
    path = tmp / "trace.jsonl"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        trace = load_trace([path])
    except TraceError as exc:
        message = str(exc)
        assert message.startswith(str(path)), message
        assert re.match(re.escape(str(path)) + r"(:\d+)?: ", message), message
        return
    assert trace.prompts and len(trace.sha256) == 64


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(KEYS), values, max_size=7), max_size=4),
       st.data())
def test_random_lines(tmp_path_factory: Any, objects: list[dict[str, Any]], data: Any) -> None:
    tmp = tmp_path_factory.mktemp("t")
    _check(tmp, "\n".join(json.dumps(o) for o in objects))


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(st.integers(min_value=0, max_value=len(SHIPPED) - 1), st.sampled_from(KEYS), values)
def test_mutated_shipped_prompt(tmp_path_factory: Any, index: int, key: str, value: Any) -> None:
    tmp = tmp_path_factory.mktemp("t")
    objects = [dict(o) for o in SHIPPED[:3]]
    target = dict(SHIPPED[index])
    target[key] = value
    objects.append(target)
    _check(tmp, "\n".join(json.dumps(o) for o in objects))


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300))
def test_raw_text(tmp_path_factory: Any, text: str) -> None:
    tmp = tmp_path_factory.mktemp("t")
    _check(tmp, text)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400) | st.text(max_size=300).map(lambda t: t.encode("utf-8",
                                                                                "surrogatepass")))
def test_held_out_scan_on_any_bytes(tmp_path_factory: Any, data: bytes) -> None:
    """Whatever the adaptation data holds, the scan returns or raises an InputError that
    names the file; never another exception."""
    from pytest_osprey.preflight.held_out import InputError, scan

    path = tmp_path_factory.mktemp("h") / "adapt.json"
    path.write_bytes(data)
    try:
        found = scan([("q", "alpha bravo charlie delta echo foxtrot")], path)
    except InputError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc), str(exc)
        return
    assert found.files == 1


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(values, st.integers(min_value=1, max_value=9), st.booleans())
def test_streamed_json_matches_json_loads(value: Any, size: int, pretty: bool) -> None:
    """The streamed JSON reader, cut into chunks of any size, gives what json.loads gives:
    an array's elements, or the one value."""
    from pytest_osprey.trace_build.inputs import json_values

    text = json.dumps(value, indent=2 if pretty else None)
    chunks = iter([text[i:i + size] for i in range(0, len(text), size)])
    got = [v for _, v in json_values(chunks, Path("x.json"))]
    assert got == (value if isinstance(value, list) else [value])
