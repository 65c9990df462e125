"""Unit tests for pytest_osprey.trace: the shipped trace, validation, hashing, subsets."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.pilot.trace import (
    Prompt,
    Trace,
    TraceError,
    load_trace,
    render_prompt,
    trace_hash,
)
from testkit.factories import ROOT

PILOT = ROOT / "prompts" / "pilot.jsonl"
README = ROOT / "prompts" / "README.md"
CORE_DOMAINS = ("chat", "code", "commonsense", "finance", "math")


def write(tmp_path: Path, lines: list[Any], name: str = "t.jsonl") -> str:
    """Write lines (dicts are JSON-encoded, strings written as is) and return the path."""
    path = tmp_path / name
    path.write_text(
        "".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines),
        encoding="utf-8",
    )
    return str(path)


def p(pid: str = "a-01", **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"id": pid, "domain": "chat", "prompt": "Hello there."}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not ...}


def load_error(tmp_path: Path, lines: list[Any]) -> str:
    path = write(tmp_path, lines)
    with pytest.raises(TraceError) as info:
        load_trace([path])
    return str(info.value)


# ----------------------------------------------------------------------- shipped trace


@pytest.fixture(scope="module")
def pilot() -> Trace:
    return load_trace([PILOT])


def test_shipped_trace_shape(pilot: Trace) -> None:
    assert len(pilot.prompts) == 50
    ids = [q.id for q in pilot.prompts]
    assert len(set(ids)) == 50
    assert all(re.fullmatch(r"[a-z]+-\d\d", i) for i in ids), ids
    slices = pilot.slices()
    assert set(slices) == {"core", "unusual"}
    assert len(slices["unusual"]) >= 10
    core = Counter(q.domain for q in pilot.prompts if q.slice == "core")
    assert core == {d: 8 for d in CORE_DOMAINS}
    unusual_domains = {q.domain for q in pilot.prompts if q.slice == "unusual"}
    assert unusual_domains.isdisjoint(CORE_DOMAINS)
    assert sum(q.expect is not None for q in pilot.prompts) >= 15
    assert all(q.messages for q in pilot.prompts if q.domain == "chat")
    assert all(q.max_new_tokens is not None and 64 <= q.max_new_tokens <= 512 for q in pilot)
    assert pilot.files == (str(PILOT),)
    assert re.fullmatch(r"[0-9a-f]{64}", pilot.sha256)


def test_shipped_trace_matches_readme_table(pilot: Trace) -> None:
    text = README.read_text(encoding="utf-8")
    for domain in {q.domain for q in pilot.prompts}:
        n = sum(q.domain == domain for q in pilot.prompts)
        n_expect = sum(q.domain == domain and q.expect is not None for q in pilot.prompts)
        row = re.search(rf"^\| \w+ \| {domain}\b[^|]*\| (\d+) \| (\d+) \|", text, re.M)
        assert row, domain
        assert (int(row.group(1)), int(row.group(2))) == (n, n_expect), domain


def test_readme_example_lines_load(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"### Example lines\s+```json\n(.*?)```", text, re.S)
    assert block
    path = tmp_path / "example.jsonl"
    path.write_text(block.group(1), encoding="utf-8")
    assert len(load_trace([path]).prompts) == 3


def test_shipped_regex_and_number_expectations_accept_a_good_answer(pilot: Trace) -> None:
    good = {
        "commonsense-05": "10 days from Wednesday is Saturday.",
        "code-07": "```\n4 True\n```",
        "code-08": "git reset --soft HEAD~1",
        "commonsense-04": "**No.** Sarah is the tallest.",
        "chat-03": "1. A\n2. B\n3. C\n4. D\n5. E",
    }
    by_id = pilot.by_id()
    for pid, answer in good.items():
        e = by_id[pid].expect
        assert e is not None
        if e["type"] == "regex":
            assert re.search(e["pattern"], answer), pid
        else:
            assert str(e["value"]).lower() in answer.lower(), pid


# ----------------------------------------------------------------------- loading


def test_load_basics_defaults_and_blank_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            p("a-01"),
            "",
            "   ",
            p("a-02", messages=[{"role": "user", "content": "Hi"}], prompt=..., slice="odd"),
        ],
    )
    trace = load_trace([Path(path)])
    a, b = trace.prompts
    assert (a.slice, a.line, a.file, a.max_new_tokens, a.expect) == ("core", 1, path, None, None)
    assert b.line == 4 and b.prompt is None and b.messages == ({"role": "user", "content": "Hi"},)
    assert trace.by_id()["a-02"] is b
    assert trace.slices() == {"core": ["a-01"], "odd": ["a-02"]}


def test_load_several_files_in_order(tmp_path: Path) -> None:
    one = write(tmp_path, [p("x-01"), p("x-02")], "one.jsonl")
    two = write(tmp_path, [p("y-01")], "two.jsonl")
    trace = load_trace([two, one])
    assert [q.id for q in trace.prompts] == ["y-01", "x-01", "x-02"]
    assert trace.files == (two, one)


def test_crlf_and_bom_accepted(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(p()).encode() + b"\r\n\r\n")
    assert load_trace([path]).prompts[0].id == "a-01"


# ----------------------------------------------------------------------- hashing


def test_hash_ignores_files_whitespace_key_order_and_default_slice(tmp_path: Path) -> None:
    rows = [
        p("a-01", max_new_tokens=64, expect={"type": "number", "value": 3, "tolerance": 0.5}),
        p(
            "a-02",
            prompt=...,
            messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        ),
    ]
    first = load_trace([write(tmp_path, rows, "first.jsonl")])
    other = tmp_path / "sub" / "second.jsonl"
    other.parent.mkdir()
    lines = []
    for row in rows:
        row = dict(reversed(list(row.items())))
        row["slice"] = "core"
        if "expect" in row:
            row["expect"] = dict(reversed(list(row["expect"].items())))
        if "messages" in row:
            row["messages"] = [dict(reversed(list(m.items()))) for m in row["messages"]]
        lines.append(json.dumps(row, indent=None, separators=(" , ", " :  ")))
    other.write_text("\n\n  \n" + "\n\n".join(lines) + "\n\n", encoding="utf-8")
    second = load_trace([other])
    assert second.sha256 == first.sha256
    assert second.prompts[0].line != first.prompts[0].line


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "Hello there!"},
        {"max_new_tokens": 65},
        {"domain": "code"},
        {"slice": "unusual"},
        {"expect": {"type": "number", "value": 3, "tolerance": 0.25}},
        {"id": "a-09"},
    ],
)
def test_hash_changes_with_content(tmp_path: Path, change: dict[str, Any]) -> None:
    row = p("a-01", max_new_tokens=64, expect={"type": "number", "value": 3, "tolerance": 0.5})
    base = load_trace([write(tmp_path, [row, p("a-02")], "a.jsonl")])
    changed = load_trace([write(tmp_path, [{**row, **change}, p("a-02")], "b.jsonl")])
    assert changed.sha256 != base.sha256


def test_hash_depends_on_order_and_is_documented_construction(tmp_path: Path) -> None:
    import hashlib

    rows = [p("a-01"), p("a-02", prompt="Ünïcødé ✓")]
    fwd = load_trace([write(tmp_path, rows, "f.jsonl")])
    rev = load_trace([write(tmp_path, rows[::-1], "r.jsonl")])
    assert fwd.sha256 != rev.sha256
    canonical = "".join(
        json.dumps(
            {**r, "slice": "core"}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        + "\n"
        for r in rows
    )
    assert fwd.sha256 == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert fwd.sha256 == trace_hash(fwd.prompts)


# ----------------------------------------------------------------------- errors

MSG = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ('{"id": "a-02", "domain": "chat", "prompt": "x",}', r"invalid JSON: .* \(column \d+\)"),
        ("[1, 2]", r"must be a JSON object, got array"),
        ('"just a string"', r"must be a JSON object, got string"),
        ('{"id": "a", "id": "b", "domain": "d", "prompt": "x"}', r"duplicate key 'id'"),
        ('{"id": "a-02", "domain": "d", "prompt": "x", "max_new_tokens": NaN}', r"NaN"),
        (p(id=...), r"missing 'id'"),
        (p(id=""), r"'id' must not be empty"),
        (p(id="   "), r"'id' must not be empty"),
        (p(id=" a-02"), r"surrounding whitespace"),
        (p(id=7), r"'id' must be a string, got number"),
        (p("a-02", domain=...), r"missing 'domain'"),
        (p("a-02", domain=""), r"'domain' must not be empty"),
        (p("a-02", slice=""), r"'slice' must not be empty"),
        (p("a-02", slice=3), r"'slice' must be a string"),
        (p("a-02", prompt=""), r"'prompt' must not be empty"),
        (p("a-02", prompt=["x"]), r"'prompt' must be a string, got array"),
        (p("a-02", max_new_tokens=0), r"max_new_tokens' must be a positive integer, got 0"),
        (p("a-02", max_new_tokens=-5), r"positive integer"),
        (p("a-02", max_new_tokens=12.5), r"positive integer, got 12.5"),
        (p("a-02", max_new_tokens=256.0), r"positive integer, got 256.0"),
        (p("a-02", max_new_tokens="256"), r"positive integer, got '256'"),
        (p("a-02", max_new_tokens=True), r"positive integer, got True"),
        (p("a-02", max_new_tokens=2_000_000), r"absurdly large"),
        (p("a-02", messages=MSG), r"both 'prompt' and 'messages'"),
        (p("a-02", prompt=...), r"neither 'prompt' nor 'messages'"),
        (p("a-02", prompt=..., messages=[]), r"'messages' must not be empty"),
        (p("a-02", prompt=..., messages="hi"), r"'messages' must be an array"),
        (p("a-02", prompt=..., messages=["hi"]), r"messages\[0\] must be an object"),
        (p("a-02", prompt=..., messages=[{"content": "x"}]), r"messages\[0\] has no 'role'"),
        (p("a-02", prompt=..., messages=[{"role": "user"}]), r"messages\[0\] has no 'content'"),
        (
            p("a-02", prompt=..., messages=[*MSG, {"role": "users", "content": "x"}]),
            r"messages\[1\]\.role 'users' is not one of system, user, assistant "
            r"\(did you mean 'user'\?\)",
        ),
        (p("a-02", prompt=..., messages=[{"role": "user", "content": 5}]), r"content must be"),
        (p("a-02", prompt=..., messages=[{"role": "user", "content": " "}]), r"must not be empty"),
        (
            p("a-02", prompt=..., messages=[{"role": "user", "content": "x", "nmae": "bob"}]),
            r"unknown key 'nmae' in messages\[0\]",
        ),
        (p("a-02", max_tokens=5), r"unknown key 'max_tokens' .*did you mean 'max_new_tokens'"),
        (p("a-02", expected={"type": "exact", "value": "x"}), r"did you mean 'expect'"),
        (p("a-02", zzz=1), r"unknown key 'zzz' in prompt; allowed: id, domain"),
    ],
)
def test_line_errors_name_file_and_line(tmp_path: Path, line: Any, pattern: str) -> None:
    msg = load_error(tmp_path, [p("a-01"), "", line])
    path = str(tmp_path / "t.jsonl")
    assert msg.startswith(f"{path}:3: "), msg
    assert re.search(pattern, msg), msg


def test_json_error_reports_column(tmp_path: Path) -> None:
    msg = load_error(tmp_path, ['{"id": "a-01" "domain": "x"}'])
    assert msg == f"{tmp_path / 't.jsonl'}:1: invalid JSON: Expecting ',' delimiter (column 15)"


@pytest.mark.parametrize(
    ("expect", "pattern"),
    [
        ("exact", r"'expect' must be an object, got string"),
        ({"value": "x"}, r"'expect' has no 'type'"),
        ({"type": "regexp", "pattern": "x"}, r"'regexp' is not one of .*did you mean 'regex'"),
        ({"type": "exact"}, r"expect of type 'exact' needs 'value'"),
        ({"type": "exact", "value": 3}, r"expect.value must be a string"),
        ({"type": "contains", "value": ""}, r"must not be empty"),
        ({"type": "contains", "value": "x", "case_sensitive": "no"}, r"case_sensitive"),
        ({"type": "contains", "value": "x", "casesensitive": False}, r"did you mean 'case_s"),
        ({"type": "regex"}, r"needs 'pattern'"),
        ({"type": "regex", "pattern": "(unclosed"}, r"expect.pattern does not compile"),
        ({"type": "number", "tolerance": 1}, r"needs 'value'"),
        ({"type": "number", "value": "42"}, r"expect.value must be a finite number"),
        ({"type": "number", "value": True}, r"finite number"),
        ({"type": "number", "value": 42, "tolerance": -0.1}, r"tolerance must be a number >= 0"),
        ({"type": "number", "value": 42, "tol": 1}, r"unknown key 'tol'.*'tolerance'"),
        ({"type": "json_schema"}, r"needs 'schema'"),
        ({"type": "json_schema", "schema": [1]}, r"expect.schema must be an object"),
        ({"type": "python", "function": "mod.func"}, r"package.module:function"),
        ({"type": "python", "function": "mod:"}, r"package.module:function"),
        ({"type": "python"}, r"needs 'function'"),
    ],
)
def test_bad_expect(tmp_path: Path, expect: Any, pattern: str) -> None:
    msg = load_error(tmp_path, [p("a-01"), p("a-02", expect=expect)])
    assert msg.startswith(f"{tmp_path / 't.jsonl'}:2: "), msg
    assert re.search(pattern, msg), msg


def test_valid_expect_forms(tmp_path: Path) -> None:
    forms: list[dict[str, Any]] = [
        {"type": "exact", "value": "yes"},
        {"type": "contains", "value": "Paris", "case_sensitive": False},
        {"type": "regex", "pattern": r"(?i)^\W*no\b"},
        {"type": "number", "value": 42.0, "tolerance": 0.01},
        {"type": "number", "value": -3},
        {"type": "json_schema", "schema": {"type": "object"}},
        {"type": "python", "function": "my_checks.math:is_prime"},
    ]
    trace = load_trace([write(tmp_path, [p(f"e-{i}", expect=e) for i, e in enumerate(forms)])])
    assert [q.expect for q in trace.prompts] == forms


def test_duplicate_id_same_file(tmp_path: Path) -> None:
    msg = load_error(tmp_path, [p("code-03"), p("x-01"), "", p("code-03")])
    assert msg == f"{tmp_path / 't.jsonl'}:4: duplicate id 'code-03' (first at line 1)"


def test_duplicate_id_across_files_names_both(tmp_path: Path) -> None:
    one = write(tmp_path, [p("x-01"), p("dup-01")], "one.jsonl")
    two = write(tmp_path, [p("y-01"), p("y-02"), p("dup-01")], "two.jsonl")
    with pytest.raises(TraceError) as info:
        load_trace([one, two])
    assert str(info.value) == f"{two}:3: duplicate id 'dup-01' (first at {one}:2)"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=re.escape(f"{path}: trace file not found")):
        load_trace([path])


def test_directory_and_no_paths(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="is a directory"):
        load_trace([tmp_path])
    with pytest.raises(TraceError, match="no trace files given"):
        load_trace([])


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TraceError, match=re.escape(f"{path}: no prompts in file")):
        load_trace([path])


def test_bad_encoding_names_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    good = json.dumps(p("a-01")).encode()
    bad = json.dumps(p("a-02", prompt="caf\u00e9"), ensure_ascii=False).encode("latin-1")
    path.write_bytes(good + b"\n\n" + bad + b"\n")
    with pytest.raises(TraceError) as info:
        load_trace([path])
    assert str(info.value).startswith(f"{path}:3: not valid UTF-8 (byte 0xe9")


def test_errors_are_value_errors() -> None:
    assert issubclass(TraceError, ValueError)


# ----------------------------------------------------------------------- subset


@pytest.fixture
def small(tmp_path: Path) -> Trace:
    rows = [
        p("c-01"),
        p("u-01", slice="unusual"),
        p("c-02"),
        p("c-03"),
        p("u-02", slice="unusual"),
        p("u-03", slice="unusual"),
    ]
    return load_trace([write(tmp_path, rows)])


def ids(trace: Trace) -> list[str]:
    return [q.id for q in trace.prompts]


def test_subset_no_arguments_is_identity(small: Trace) -> None:
    assert small.subset() == small


def test_subset_ids_keeps_trace_order_and_rehashes(small: Trace) -> None:
    sub = small.subset(ids=["u-02", "c-01", "u-02"])
    assert ids(sub) == ["c-01", "u-02"]
    assert sub.sha256 == trace_hash(sub.prompts) != small.sha256
    assert sub.files == small.files


def test_subset_slices_and_limits(small: Trace) -> None:
    assert ids(small.subset(slices=["unusual"])) == ["u-01", "u-02", "u-03"]
    assert ids(small.subset(limit_per_slice=2)) == ["c-01", "u-01", "c-02", "u-02"]
    assert ids(small.subset(limit=3)) == ["c-01", "u-01", "c-02"]
    assert ids(small.subset(slices=["core"], limit=2)) == ["c-01", "c-02"]
    assert ids(small.subset(ids=["c-03", "u-03"], slices=["unusual"])) == ["u-03"]
    assert ids(small.subset(limit_per_slice=1, limit=1)) == ["c-01"]
    assert small.subset(limit=2) == small.subset(limit=2)


def test_subset_errors(small: Trace) -> None:
    with pytest.raises(TraceError, match=r"unknown prompt ids: 'nope-1', 'nope-2'"):
        small.subset(ids=["c-01", "nope-1", "nope-2"])
    with pytest.raises(TraceError, match=r"unknown slices: 'odd' \(the trace has 'core'"):
        small.subset(slices=["odd"])
    with pytest.raises(TraceError, match=r"limit must be a positive integer, got 0"):
        small.subset(limit=0)
    with pytest.raises(TraceError, match=r"limit_per_slice must be a positive integer"):
        small.subset(limit_per_slice=-1)
    with pytest.raises(TraceError, match=r"selects no prompts"):
        small.subset(ids=["c-01"], slices=["unusual"])
    with pytest.raises(TraceError, match=r"not a string"):
        small.subset(ids="c-01")
    with pytest.raises(TraceError, match=re.escape(small.files[0])):
        small.subset(ids=["nope"])


def test_subset_of_shipped_trace(pilot: Trace) -> None:
    sub = pilot.subset(limit_per_slice=2)
    assert [q.slice for q in sub.prompts] == ["core", "core", "unusual", "unusual"]
    assert pilot.subset(slices=["unusual"]).slices() == {"unusual": pilot.slices()["unusual"]}


# ----------------------------------------------------------------------- rendering


def make_prompt(**kw: Any) -> Prompt:
    base: dict[str, Any] = dict(
        id="a-01",
        domain="chat",
        slice="core",
        prompt=None,
        messages=None,
        max_new_tokens=None,
        expect=None,
        file="x.jsonl",
        line=1,
    )
    base.update(kw)
    return Prompt(**base)


CHAT = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi?"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye?"},
)


class FakeTokenizer:
    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> str:
        self.calls.append((messages, kw))
        body = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return body + ("<|assistant|>" if kw.get("add_generation_prompt") else "")


def test_render_plain_prompt_is_unchanged() -> None:
    text = "  Keep   my spacing\n"
    tok = FakeTokenizer("{{ template }}")
    assert render_prompt(make_prompt(prompt=text)) == text
    assert render_prompt(make_prompt(prompt=text), tok) == text
    assert tok.calls == []


def test_render_messages_without_template() -> None:
    expected = "System: Be brief.\nUser: Hi?\nAssistant: Hello.\nUser: Bye?\nAssistant:"
    prompt = make_prompt(messages=CHAT)
    assert render_prompt(prompt) == expected
    assert render_prompt(prompt, FakeTokenizer(None)) == expected
    assert render_prompt(prompt, object()) == expected


def test_render_messages_with_template() -> None:
    tok = FakeTokenizer("{{ template }}")
    out = render_prompt(make_prompt(messages=CHAT), tok)
    assert out == (
        "<|system|>Be brief.<|end|><|user|>Hi?<|end|><|assistant|>Hello.<|end|>"
        "<|user|>Bye?<|end|><|assistant|>"
    )
    ((messages, kw),) = tok.calls
    assert messages == [dict(m) for m in CHAT]
    assert kw == {"tokenize": False, "add_generation_prompt": True}


def test_render_shipped_chat_prompts(pilot: Trace) -> None:
    for q in pilot.prompts:
        text = render_prompt(q)
        assert text.strip()
        if q.messages is not None:
            assert text.endswith("\nAssistant:")


def test_a_trace_file_over_the_cap_is_one_line_not_memory(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_osprey.pilot import trace as trace_module

    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", 1000)
    big = tmp_path / "big.jsonl"
    line = json.dumps({"id": "p", "domain": "chat", "prompt": "x" * 80, "max_new_tokens": 4})
    big.write_text("\n".join(line.replace('"p"', f'"p{i}"') for i in range(20)))
    with pytest.raises(TraceError, match=r"big\.jsonl: trace file over [0-9.e-]+ MiB"):
        load_trace([big])
    small = tmp_path / "small.jsonl"
    small.write_text(line)
    assert len(load_trace([small]).prompts) == 1
