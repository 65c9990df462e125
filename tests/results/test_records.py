"""records.jsonl (the public results format) and the atomic JSON/text writers."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.results.files import write_json_atomic, write_text_atomic
from pytest_osprey.results.packed import Packed
from pytest_osprey.results.records import (
    SCHEMA,
    RecordsError,
    RecordWriter,
    RequestRecord,
    read_records,
)
from testkit.factories import make_record

# The fields DESIGN.md promises in every record.
PUBLIC_FIELDS = {
    "schema", "run_id", "condition", "block", "repetition", "load", "concurrency", "prompt_id",
    "slice", "domain", "mode", "sample_index", "ok", "error", "ttft_s", "e2e_s", "itl_s",
    "prompt_tokens", "output_tokens", "output_ids", "output_text", "top2_margin",
    "spec_verify_ct", "accept_length", "finish_reason",
}


def record(i: int = 0, **kw: Any) -> RequestRecord:
    """A record with every field set to a non-default value, make_record's defaults included
    (a round trip that dropped a field back to a default would go unseen otherwise)."""
    base = make_record(
        "tiny-drafter",
        f"chat-{i:02d}",
        run_id="20260101T000000Z-abc123",
        block=1,
        repetition=2,
        load="concurrent",
        concurrency=4,
        slice="core",
        domain="chat",
        mode="sampled",
        sample_index=3,
        ok=True,
        error="none really",
        ttft_s=0.125,
        e2e_s=1.5,
        itl_s=[0.25, 0.5, 0.625],
        prompt_tokens=17,
        output_tokens=11,
        output_ids=[5, 6, 7, 0, 2**40],
        output_text="Hello, world.",
        top2_margin=[0.5, 0.0, 3.25],
        spec_verify_ct=4,
        accept_length=2.75,
        finish_reason="length",
        started_at=1767225600.25,
        correct=False,
    )
    return replace(base, **kw)


def raw_lines(*items: Any) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items)


# --------------------------------------------------------------------------- writing


def test_each_record_is_readable_while_the_writer_is_open(tmp_path: Path) -> None:
    path = tmp_path / "run" / "nested" / "records.jsonl"  # parents are created
    with RecordWriter(path) as writer:
        writer.write(record(0))
        assert list(read_records(path)) == [record(0)]
        writer.write(record(1))
        writer.sync()
        assert [r.prompt_id for r in read_records(path)] == ["chat-00", "chat-01"]
        assert writer.count == 2
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n") and text.count("\n") == 2
    with pytest.raises(RuntimeError, match="writer is closed"):
        writer.write(record(2))
    writer.close()  # closing twice is harmless


def test_a_second_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write(record(0))
    with RecordWriter(path) as writer:
        writer.write(record(1))
        assert writer.count == 1
    assert [r.prompt_id for r in read_records(path)] == ["chat-00", "chat-01"]


def test_one_compact_json_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write(record(0, output_text="line one\nline two\r\n"))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert set(data) >= PUBLIC_FIELDS
    assert data["schema"] == SCHEMA
    assert ", " not in lines[0] and ": " not in lines[0].replace("Hello, world", "")


# --------------------------------------------------------------------------- round trip


def test_every_field_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    originals = [
        record(0),
        record(1, ok=False, error="HTTP 500: boom", ttft_s=None, e2e_s=None, itl_s=[],
               output_tokens=None, top2_margin=None, spec_verify_ct=None, accept_length=None,
               finish_reason=None, started_at=None, correct=None, mode="greedy"),
    ]
    with RecordWriter(path) as writer:
        for r in originals:
            writer.write(r)
    back = list(read_records(path))
    assert back == originals
    for a, b in zip(back, originals, strict=True):
        assert asdict(a) == asdict(b)
        for f in fields(RequestRecord):
            got, want = getattr(a, f.name), getattr(b, f.name)
            if isinstance(got, Packed):  # per-token values, read packed: the list they were
                assert [(type(v), v) for v in got] == [(type(v), v) for v in want], f.name
            else:
                assert type(got) is type(want), f.name


def test_unicode_text_round_trips_and_is_stored_as_utf8(tmp_path: Path) -> None:
    text = "héllo — 日本語 🚀 Ωμέγα\u2028sep\u0085nel\x00nul\ttab\r\nend \U0010fffd"
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write(record(0, output_text=text, prompt_id="prompt-ß-✓", condition="dräfter"))
        writer.write(record(1))
    back = list(read_records(path))
    assert [r.output_text for r in back] == [text, "Hello, world."]
    assert back[0].prompt_id == "prompt-ß-✓" and back[0].condition == "dräfter"
    raw = path.read_bytes()
    assert "日本語 🚀".encode() in raw  # not \u-escaped: readable with any UTF-8 tool
    assert raw.count(b"\n") == 2  # newlines inside the text stay escaped


def test_unknown_fields_from_a_later_minor_version_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    data = asdict(record(0)) | {"new_metric": [1, 2], "engine_extra": {"a": 1}}
    path.write_text(raw_lines(data), encoding="utf-8")
    assert list(read_records(path)) == [record(0)]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(raw_lines(asdict(record(0)), "", "   ", asdict(record(1))), encoding="utf-8")
    assert len(list(read_records(path))) == 2


def test_empty_file_has_no_records(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text("", encoding="utf-8")
    assert list(read_records(path)) == []


# --------------------------------------------------------------------------- damage


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write(record(0))
        writer.write(record(1))
    with path.open("a", encoding="utf-8") as fh:
        fh.write(record(2).to_json()[:37])  # the crash came mid-write
    assert [r.prompt_id for r in read_records(path)] == ["chat-00", "chat-01"]


def test_torn_multibyte_character_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    whole = record(0).to_json() + "\n"
    torn = record(1, output_text="日本").to_json().encode("utf-8")
    cut = torn.index("日".encode()) + 1  # inside a UTF-8 sequence
    path.write_bytes(whole.encode("utf-8") + torn[:cut])
    assert [r.prompt_id for r in read_records(path)] == ["chat-00"]
    with RecordWriter(path) as writer:  # and a resumed writer drops it
        writer.write(record(2))
    assert [r.prompt_id for r in read_records(path)] == ["chat-00", "chat-02"]


def test_invalid_utf8_in_a_middle_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    line = record(0).to_json().encode("utf-8")
    path.write_bytes(line + b"\n" + line.replace(b"Hello", b"H\xffllo") + b"\n" + line + b"\n")
    with pytest.raises(RecordsError, match=rf"^{re.escape(str(path))}:2: not valid UTF-8"):
        list(read_records(path))


def test_writer_resumes_cleanly_after_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.write(record(0))
    with path.open("a", encoding="utf-8") as fh:
        fh.write(record(1).to_json()[:50])
    with RecordWriter(path) as writer:  # a resumed campaign appends to the same file
        writer.write(record(2))
    assert [r.prompt_id for r in read_records(path)] == ["chat-00", "chat-02"]


def test_writer_keeps_a_whole_record_missing_only_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(record(0).to_json(), encoding="utf-8")
    with RecordWriter(path) as writer:
        writer.write(record(1))
    assert [r.prompt_id for r in read_records(path)] == ["chat-00", "chat-01"]


def test_corrupt_middle_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    good = asdict(record(0))
    path.write_text(raw_lines(good, '{"condition": "x", oops', good), encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"^{re.escape(str(path))}:2: not valid JSON"):
        list(read_records(path))


def test_corrupt_last_line_with_newline_is_not_torn(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(raw_lines(asdict(record(0)), "{broken"), encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"^{re.escape(str(path))}:2: not valid JSON"):
        list(read_records(path))


@pytest.mark.parametrize(
    "line",
    [
        [1, 2, 3],
        '"just a string"',
        {"run_id": "x"},  # no condition
        {"condition": "baseline"},  # required fields missing
    ],
)
def test_non_records_are_refused(tmp_path: Path, line: Any) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(raw_lines(asdict(record(0)), line), encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"^{re.escape(str(path))}:2: not a request record"):
        list(read_records(path))


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(
        raw_lines(asdict(record(0)), asdict(record(1)) | {"schema": SCHEMA + 1}), encoding="utf-8"
    )
    newer = rf"^{re.escape(str(path))}:2: records schema {SCHEMA + 1} is newer"
    with pytest.raises(RecordsError, match=newer):
        list(read_records(path))


@pytest.mark.parametrize("schema", ["2", None, 1.5, True])
def test_non_integer_schema_is_refused(tmp_path: Path, schema: Any) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(raw_lines(asdict(record(0)) | {"schema": schema}), encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"^{re.escape(str(path))}:1: records schema"):
        list(read_records(path))


def test_missing_schema_means_the_current_one(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    data = asdict(record(0))
    del data["schema"]
    path.write_text(raw_lines(data), encoding="utf-8")
    assert list(read_records(path)) == [record(0)]


# --------------------------------------------------------------------------- derived metrics


def test_tpot_and_tokens_per_s() -> None:
    r = record(0, ttft_s=0.5, e2e_s=2.0, output_tokens=11)
    assert r.tpot_s == pytest.approx(0.15)  # (2.0 - 0.5) / (11 - 1)
    assert r.tokens_per_s == pytest.approx(5.5)


@pytest.mark.parametrize(
    "kw",
    [
        {"ok": False},
        {"e2e_s": None},
        {"e2e_s": 0.0},
        {"output_tokens": None},
        {"output_tokens": 0},
    ],
)
def test_tokens_per_s_is_none_without_a_measurement(kw: dict[str, Any]) -> None:
    assert record(0, **kw).tokens_per_s is None


@pytest.mark.parametrize(
    "kw",
    [
        {"ttft_s": None},
        {"e2e_s": None},
        {"output_tokens": None},
        {"output_tokens": 0},
        {"output_tokens": 1},  # one token: no time *per output token* after the first
    ],
)
def test_tpot_is_none_without_two_tokens(kw: dict[str, Any]) -> None:
    assert record(0, **kw).tpot_s is None


def test_tpot_with_two_tokens() -> None:
    assert record(0, ttft_s=0.25, e2e_s=0.75, output_tokens=2).tpot_s == pytest.approx(0.5)


# --------------------------------------------------------------------------- atomic writers


def test_write_json_atomic_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "campaign.json"
    write_json_atomic(target, {"b": [1, 2], "a": "ünïcode", "path": Path("/x/y")})
    assert sorted(os.listdir(tmp_path)) == ["campaign.json"]
    data = json.loads(target.read_text(encoding="utf-8"))
    assert data == {"b": [1, 2], "a": "ünïcode", "path": "/x/y"}  # default=str for odd types
    assert "ünïcode" in target.read_text(encoding="utf-8")


def test_write_json_atomic_replaces_rather_than_rewrites(tmp_path: Path) -> None:
    target = tmp_path / "campaign.json"
    write_json_atomic(target, {"version": 1})
    with target.open(encoding="utf-8") as reader:  # a reader holding the old file
        write_json_atomic(target, {"version": 2})
        assert json.loads(reader.read()) == {"version": 1}  # never a mix of old and new
    assert json.loads(target.read_text(encoding="utf-8")) == {"version": 2}
    assert sorted(os.listdir(tmp_path)) == ["campaign.json"]


def test_write_json_atomic_failure_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "campaign.json"
    write_json_atomic(target, {"version": 1})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        write_json_atomic(target, loop)
    assert json.loads(target.read_text(encoding="utf-8")) == {"version": 1}
    assert sorted(os.listdir(tmp_path)) == ["campaign.json"]


def test_write_text_atomic(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    target.write_text("old", encoding="utf-8")
    old_inode = target.stat().st_ino
    write_text_atomic(target, "# Report ✓\n")
    assert target.read_text(encoding="utf-8") == "# Report ✓\n"
    assert sorted(os.listdir(tmp_path)) == ["report.md"]
    assert target.stat().st_ino != old_inode  # a new file renamed over, not rewritten in place


def test_no_nan_or_inf_reaches_a_json_file(tmp_path: Path) -> None:
    """A server's NaN / inf (Python's json reads them) is written as null: strict parsers
    (JavaScript, jq) reject NaN, and a NaN read back is no measurement to judge."""
    import math

    from testkit.factories import make_record

    def strict(text: str) -> Any:
        def refuse(name: str) -> None:
            raise ValueError(f"non-standard JSON constant {name}")
        return json.loads(text, parse_constant=refuse)

    rec = make_record("cand", "p1", e2e_s=math.nan, ttft_s=math.inf, itl_s=[0.1, -math.inf],
                      accept_length=math.nan)
    line = strict(rec.to_json())
    assert line["e2e_s"] is None and line["ttft_s"] is None and line["accept_length"] is None
    assert line["itl_s"] == [0.1, None]
    write_json_atomic(tmp_path / "s.json", {"speedup": math.nan, "ci": [1.0, math.inf]})
    assert strict((tmp_path / "s.json").read_text()) == {"speedup": None, "ci": [1.0, None]}
