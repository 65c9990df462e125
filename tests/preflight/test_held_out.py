"""The held-out check: trace prompts planted in a drafter's adaptation data are found (exact
and edited copies, in JSON lines, folders and gzip), the artifact gate fails naming them,
and the per-domain rows carry them."""

from __future__ import annotations

import csv
import gzip
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.judgement import all_domain_rows, held_out_overlaps, judge, plan_gates
from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.preflight import judge_artifact
from pytest_osprey.judgement.gates.spec import GateSpec
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.preflight import run_preflight
from pytest_osprey.preflight.held_out import held_out_check, scan, words
from pytest_osprey.report.summary import summary_dict
from pytest_osprey.results.preflight_file import ArtifactEntry, CheckEntry, Preflight
from testkit.factories import dump_pilot, make_pilot, make_record, pilot_data, saved_campaign
from testkit.report_campaign import make_data, report_pilot

# 36 words: random text over them shares the odd 5-gram with a prompt, never half of one.
WORDS = words("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
              "november oscar papa quebec romeo sierra tango uniform victor whiskey xray "
              "yankee zulu amber basil cedar dune ember fjord grove heath inlet jade")


def sentence(rng: random.Random, n: int = 24) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def write_trace(path: Path, prompts: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts), encoding="utf-8")
    return path


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, Any]:
    """A 20-prompt trace over two domains and 2,000 lines of adaptation data holding an
    exact copy of p03, an edited copy of p07 (2 words of 24 changed) and p12 inside a chat."""
    rng = random.Random(7)
    prompts = [{"id": f"p{i:02d}", "domain": "code" if i % 2 else "chat",
                "prompt": sentence(rng)} for i in range(20)]
    trace = write_trace(tmp_path / "trace.jsonl", prompts)
    edited = prompts[7]["prompt"].split()
    for k in (2, 21):
        edited[k] = "zzz"
    lines = [json.dumps({"text": sentence(rng, 40)}) for _ in range(2000)]
    lines[500] = json.dumps({"text": "Sure. " + prompts[3]["prompt"] + " Thanks!"})
    lines[1200] = json.dumps({"text": " ".join(edited)})
    lines[1700] = json.dumps({"messages": [
        {"role": "user", "content": prompts[12]["prompt"].replace(" ", "\n", 3)},
        {"role": "assistant", "content": "Here is what I think — ünïcode kept."}]})
    data = tmp_path / "adapt.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"trace": trace, "data": data, "prompts": prompts}


def test_scan_finds_exact_edited_and_chat_copies(planted: dict[str, Any]) -> None:
    found = scan(((p["id"], p["prompt"]) for p in planted["prompts"]), planted["data"])
    hits = {m.id: m for m in found.overlapping(0.5)}
    assert set(hits) == {"p03", "p07", "p12"}
    assert hits["p03"].containment == 1.0 and hits["p03"].line == 501
    assert hits["p12"].containment == 1.0 and hits["p12"].line == 1701
    # The two changed words break 6 of its 20 5-grams.
    assert hits["p07"].containment == 0.7 and hits["p07"].line == 1201
    assert found.lines == 2000 and found.files == 1
    # Random text over the same 36 words shares the odd shingle, never half a prompt.
    assert all(m.containment < 0.5 for m in found.best.values() if m.id not in hits)


def test_scan_reads_folders_and_gzip(tmp_path: Path) -> None:
    folder = tmp_path / "adapt"
    (folder / "part").mkdir(parents=True)
    (folder / "a.txt").write_text("nothing to see here at all today\n", encoding="utf-8")
    with gzip.open(folder / "part" / "b.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("filler line one\n" + json.dumps({"t": "Please sort this list of numbers "
                                                    "in place, descending"}) + "\n")
    found = scan([("q", "Please sort this list of numbers in place, descending.")], folder)
    assert found.files == 2 and found.lines == 3
    match = found.best["q"]
    assert match.containment == 1.0 and match.line == 2 and match.file.endswith("b.jsonl.gz")


def test_short_prompt_matched_whole(tmp_path: Path) -> None:
    data = tmp_path / "d.txt"
    data.write_text("is it raining\nwhat is it\n", encoding="utf-8")
    found = scan([("short", "What is it?"), ("other", "Is it sunny?")], data)
    assert found.best["short"].containment == 1.0 and found.best["short"].line == 2
    assert "other" not in found.best


def pilot_for(planted: dict[str, Any], **held_out: Any) -> Any:
    cand = {"role": "candidate", "drafter": "/m/d",
            "held_out": {"adaptation_data": str(planted["data"]), **held_out}}
    return make_pilot({"base": {"role": "baseline"}, "cand": cand},
                      trace={"files": [str(planted["trace"])]})


def test_gate_fails_naming_the_prompts(planted: dict[str, Any]) -> None:
    check = held_out_check(pilot_for(planted), "cand")
    assert check is not None and not check.ok
    assert check.detail.startswith(
        "3 of 20 prompts appear in cand's adaptation data (ids p03, p07, p12; 2,000 lines")
    assert check.overlapping == ["p03", "p07", "p12"]
    assert [m["line"] for m in check.matches] == [501, 1201, 1701]
    assert held_out_check(pilot_for(planted), "base") is None  # names no data


def test_limits_are_configurable(planted: dict[str, Any]) -> None:
    allowed = held_out_check(pilot_for(planted, max_overlap=3), "cand")
    assert allowed is not None and allowed.ok and allowed.overlapping == ["p03", "p07", "p12"]
    strict = held_out_check(pilot_for(planted, containment=1.0), "cand")
    assert strict is not None and strict.overlapping == ["p03", "p12"]


def test_selection_and_system_turns(tmp_path: Path, planted: dict[str, Any]) -> None:
    system = planted["prompts"][3]["prompt"]  # in the data, but as a shared system prompt
    trace = write_trace(tmp_path / "chat.jsonl", [
        {"id": "c1", "domain": "chat", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]},
        *planted["prompts"]])
    pilot = make_pilot({"base": {"role": "baseline"},
                        "cand": {"role": "candidate", "drafter": "/m/d",
                                 "held_out": {"adaptation_data": str(planted["data"])}}},
                       trace={"files": [str(trace)], "ids": ["c1", "p07", "p08"]})
    check = held_out_check(pilot, "cand")
    assert check is not None and check.overlapping == ["p07"] and check.prompts == 3


def test_missing_data_fails_saying_so(planted: dict[str, Any], tmp_path: Path) -> None:
    planted = {**planted, "data": tmp_path / "gone.jsonl"}
    check = held_out_check(pilot_for(planted), "cand")
    assert check is not None and not check.ok and "not found on this machine" in check.detail


def test_preflight_and_artifact_gate(planted: dict[str, Any]) -> None:
    pilot = pilot_for(planted)
    preflight = run_preflight(pilot, ["base", "cand"])
    assert not preflight.artifacts["cand"].ok and preflight.artifacts["base"].ok
    assert preflight.failed() == {"cand": "artifact check failed"}  # never booted
    saved = preflight.model_dump(mode="json")["artifacts"]["cand"]["checks"][0]
    assert saved["name"] == "held out" and saved["prompts"] == 20
    assert saved["overlapping"] == ["p03", "p07", "p12"]
    result = judge_artifact(GateSpec(GateKind.ARTIFACT, "cand"), preflight)
    assert result.outcome == "fail"
    assert "held out: 3 of 20 prompts appear in cand's adaptation data" in result.summary
    assert held_out_overlaps([result]) == {"cand": ["p03", "p07", "p12"]}


def test_domain_rows_mark_overlapping_prompts() -> None:
    records = [make_record(cond, pid, domain=dom)
               for cond in ("base", "cand") for pid, dom in
               (("p03", "code"), ("p07", "code"), ("p12", "chat"), ("p14", "chat"))]
    data = saved_campaign(records, baseline="base", candidates=["cand"])
    rows = {r.domain: r for r in all_domain_rows(data, "low", {"cand": ["p03", "p12"]})}
    assert rows["code"].held_out_overlap == ["p03"] and rows["chat"].held_out_overlap == ["p12"]
    assert all(r.held_out_overlap == [] for r in all_domain_rows(data, "low"))


def test_pilot_resolves_the_path(tmp_path: Path, planted: dict[str, Any]) -> None:
    (tmp_path / "m").mkdir()
    data = pilot_data({"base": {"role": "baseline"},
                       "cand": {"role": "candidate", "held_out": {"adaptation_data": "adapt.jsonl"},
                                "speculation": {"algorithm": "ngram"}}},
                      target={"model": str(tmp_path / "m")},
                      trace={"files": [str(planted["trace"])]})
    pilot = load_pilot(dump_pilot(tmp_path / "pilot.yaml", data))
    held_out = pilot.conditions["cand"].held_out
    assert held_out is not None and held_out.adaptation_data == tmp_path / "adapt.jsonl"
    check = held_out_check(pilot, "cand")
    assert check is not None and check.overlapping == ["p03", "p07", "p12"]


@pytest.mark.slow  # over a second on 2 busy cores
def test_summary_rows_carry_the_saved_check() -> None:
    """From preflight.json's check to summary.json's per-domain rows, as a judge writes them."""
    data, pilot = make_data(), report_pilot()
    check = CheckEntry.model_validate({"name": "held out", "ok": False, "detail": "1 of 3",
                                       "overlapping": ["p3"]})
    preflight = Preflight(artifacts={"cand": ArtifactEntry(ok=False, checks=[check])})
    judgement = judge(pilot, plan_gates(pilot, list(pilot.conditions)), data, preflight)
    rows = summary_dict(judgement, data, pilot)["domains"]
    marked = {r["candidate"]: r["held_out_overlap"] for r in rows}
    assert marked == {"cand": ["p3"], "broken": []}


def test_the_per_domain_reports_mark_prompts_in_the_adaptation_data() -> None:
    """report.md and report.html name, per domain, the prompts the held-out check found."""
    from pytest_osprey.report.html import domain_section as html_domains
    from pytest_osprey.report.markdown import domain_section as md_domains

    rows = [{"candidate": "cand", "domain": "code", "slice": "core", "prompts": 5,
             "speedup": 1.2, "ci_low": 1.1, "ci_high": 1.3, "accept_length": 2.5,
             "load": "busy", "held_out_overlap": ["code-02", "code-04"]},
            {"candidate": "cand", "domain": "chat", "slice": "core", "prompts": 4,
             "speedup": 1.1, "ci_low": 1.0, "ci_high": 1.2, "accept_length": 2.1,
             "load": "busy", "held_out_overlap": []}]
    md = md_domains({"domains": rows})
    assert md is not None
    text = "\n".join(md[1])
    assert "5 (2 in adaptation data*: code-02, code-04)" in text
    assert "| chat | core | 4 |" in text and "may be inflated" in text
    html = html_domains({"domains": rows}, {})
    assert "(2 in adaptation data: code-02, code-04)" in html and html.count("adaptation") == 2


# ----------------------------------------------------------------------- every format


def _prompt(rng: random.Random, k: int) -> str:
    """A multi-line prompt, code-like, with accented words (escaped in JSON with
    ensure_ascii)."""
    lines = [f"def step_{k}(x):", "    # " + sentence(rng, 10),
             "Explique ce code, s'il te plaît, été " + sentence(rng, 12)]
    return "\n".join(lines)


def _copies(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, str], set[str]]:
    """20 prompts planted (5 each verbatim, whitespace/case, one word changed, embedded in
    more text) and 20 unrelated ones: the prompts, the planted texts by id, the planted ids."""
    prompts = [{"id": f"p{i:02d}", "domain": "code", "prompt": _prompt(rng, i)}
               for i in range(40)]
    planted: dict[str, str] = {}
    for i, p in enumerate(prompts[:20]):
        text = p["prompt"]
        kind = i % 4
        if kind == 1:
            text = "  ".join(text.upper().split(" ")).replace("\n", "\n\n  ")
        elif kind == 2:
            words_ = text.split(" ")
            words_[len(words_) // 2] = "zzz"
            text = " ".join(words_)
        elif kind == 3:
            text = sentence(rng, 30) + "\n" + text + "\n" + sentence(rng, 30)
        planted[p["id"]] = text
    return prompts, planted, set(planted)


def _fill(rng: random.Random, n: int) -> list[str]:
    return [sentence(rng, 30) + "\n" + sentence(rng, 20) for _ in range(n)]


def _write_format(path: Path, fmt: str, texts: list[str]) -> Path:
    if fmt == "txt":
        path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    elif fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "text", "answer"])
            w.writerows([i, t, "ok"] for i, t in enumerate(texts))
    elif fmt in ("json-pretty", "json-compact"):
        rows = [{"text": t, "meta": {"n": i}} for i, t in enumerate(texts)]
        path.write_text(json.dumps(rows, indent=2 if fmt == "json-pretty" else None),
                        encoding="utf-8")
    elif fmt == "sharegpt":
        rows = [{"conversations": [{"from": "human", "value": t},
                                   {"from": "gpt", "value": "Voilà."}]} for t in texts]
        path.write_text(json.dumps(rows, indent=2), encoding="utf-8")  # \u00e9 escapes
    elif fmt == "openai":
        path.write_text("".join(json.dumps({
            "request": {"messages": [{"role": "system", "content": "Be kind."},
                                     {"role": "user", "content": t}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "Sure"}}]}})
            + "\n" for t in texts), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts),
                        encoding="utf-8")
    return path


FORMATS = ("txt", "csv", "json-pretty", "json-compact", "sharegpt", "openai", "jsonl")
SUFFIX = {"txt": ".txt", "csv": ".csv", "json-pretty": ".json", "json-compact": ".json",
          "sharegpt": ".json", "openai": ".jsonl", "jsonl": ".jsonl"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_finds_every_planted_copy(tmp_path: Path, fmt: str) -> None:
    """Multi-line prompts copied verbatim, with whitespace and case changed, with one word
    changed and embedded in more text: 5 of 5 of each found in every format, and none of
    20 unrelated prompts over the same words."""
    rng = random.Random(f"held-out:{fmt}")  # str's hash() is salted per process
    prompts, planted, ids = _copies(rng)
    texts = _fill(rng, 200)
    for k, text in enumerate(planted.values()):
        texts.insert(7 + 9 * k, text)
    data = _write_format(tmp_path / f"adapt{SUFFIX[fmt]}", fmt, texts)
    found = scan(((p["id"], p["prompt"]) for p in prompts), data)
    hits = {m.id for m in found.overlapping(0.5)}
    assert hits == ids, (sorted(ids - hits), sorted(hits - ids))
    verbatim = [f"p{i:02d}" for i in range(0, 20, 4)]
    assert all(found.best[i].containment == 1.0 for i in verbatim)
    assert all(m.containment < 0.5 for m in found.best.values() if m.id not in ids)


def _jsonl_bytes(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


@pytest.mark.parametrize("kind", ["gz", "gzip-named", "no-suffix-gz", "xz", "bz2", "zip",
                                  "utf16-bom"])
def test_compressed_and_utf16_data_read_by_content(tmp_path: Path, kind: str) -> None:
    import bz2
    import lzma
    import zipfile

    rng = random.Random(3)
    prompts, planted, ids = _copies(rng)
    raw = _jsonl_bytes([*_fill(rng, 50), *planted.values()])
    name, data = {
        "gz": ("a.jsonl.gz", gzip.compress(raw)), "gzip-named": ("a.gzip", gzip.compress(raw)),
        "no-suffix-gz": ("a.jsonl", gzip.compress(raw)), "xz": ("a.xz", lzma.compress(raw)),
        "bz2": ("a.bz2", bz2.compress(raw)), "zip": ("a.zip", b""),
        "utf16-bom": ("a.jsonl", raw.decode().encode("utf-16"))}[kind]
    path = tmp_path / name
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("inner.jsonl", raw)
    else:
        path.write_bytes(data)
    found = scan(((p["id"], p["prompt"]) for p in prompts), path)
    assert {m.id for m in found.overlapping(0.5)} == ids


def _unreadable(tmp_path: Path, kind: str) -> Path:
    rng = random.Random(4)
    raw = _jsonl_bytes(_fill(rng, 30))
    path = tmp_path / f"adapt-{kind}"
    if kind == "truncated-gz":
        path.write_bytes(gzip.compress(raw)[:-40])
    elif kind == "zstd":
        path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(64)))
    elif kind == "utf16-no-bom":
        path.write_bytes(raw.decode().encode("utf-16-le"))
    elif kind == "latin1":
        path.write_bytes("Voil\xe0 un texte en latin-1, pas en UTF-8.\n".encode("latin-1"))
    elif kind == "binary":
        path.write_bytes(random.Random(5).randbytes(20_000))
    elif kind == "token-ids":
        path.write_text("".join(json.dumps({"input_ids": [rng.randrange(32000)
                                                          for _ in range(60)]}) + "\n"
                                for _ in range(50)), encoding="utf-8")
    elif kind == "token-id-lines":
        path.write_text("".join(" ".join(str(rng.randrange(32000)) for _ in range(60)) + "\n"
                                for _ in range(50)), encoding="utf-8")
    elif kind == "fifo":
        path = tmp_path / "adapt.fifo"
        os.mkfifo(path)
    elif kind in ("dev-zero", "dev-urandom"):
        path = Path("/dev/zero" if kind == "dev-zero" else "/dev/urandom")
    elif kind == "folder-with-fifo":
        path = tmp_path / "folder"
        path.mkdir()
        (path / "ok.jsonl").write_bytes(raw)
        os.mkfifo(path / "pipe")
    return path


UNREADABLE = {"truncated-gz": "cannot decompress", "zstd": "zstd-compressed",
              "utf16-no-bom": "binary data", "latin1": "not valid UTF-8",
              "binary": "", "token-ids": "token ids", "token-id-lines": "token ids",
              "fifo": "a FIFO, not a regular file", "dev-zero": "a device",
              "dev-urandom": "a device", "folder-with-fifo": "pipe: a FIFO"}


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_unreadable_data_fails_the_check_naming_it(tmp_path: Path, kind: str) -> None:
    """Data the check cannot read as text fails it, in one line naming the file: never
    "none of N prompts appears"; a FIFO or a device is refused without being read."""
    import threading

    path = _unreadable(tmp_path, kind)
    planted = {"trace": write_trace(tmp_path / "trace.jsonl", [
        {"id": "p00", "domain": "chat", "prompt": sentence(random.Random(1))}]), "data": path}
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(
        held_out_check(pilot_for(planted), "cand")), daemon=True)
    worker.start()
    worker.join(30)
    assert result, f"the check did not return on {kind}"
    check = result[0]
    assert check is not None and not check.ok
    assert check.detail.startswith("adaptation data ") and "\n" not in check.detail
    assert UNREADABLE[kind] in check.detail and "the trace was not checked" in check.detail


def test_lookalike_copies_are_found(tmp_path: Path) -> None:
    """Full-width letters, soft hyphens, zero-width characters and Cyrillic homoglyphs do not
    hide a copy: both sides are normalised alike (NFKC, invisibles removed, lookalikes
    read as Latin)."""
    rng = random.Random(6)
    prompts = [{"id": f"p{i}", "domain": "chat", "prompt": sentence(rng, 30)} for i in range(8)]
    full = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in prompts[0]["prompt"])
    soft = prompts[1]["prompt"].replace("a", "a\u00ad")
    zero = prompts[2]["prompt"].replace("e", "e\u200b").replace(" ", " \u2060")
    homo = prompts[3]["prompt"].translate(str.maketrans("aeopcx", "\u0430\u0435\u043e"
                                                                  "\u0440\u0441\u0445"))
    assert homo != prompts[3]["prompt"]
    data = tmp_path / "adapt.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n"
                            for t in [*_fill(rng, 40), full, soft, zero, homo]),
                    encoding="utf-8")
    found = scan(((p["id"], p["prompt"]) for p in prompts), data)
    assert {m.id for m in found.overlapping(0.5)} == {"p0", "p1", "p2", "p3"}
    assert all(found.best[p].containment == 1.0 for p in ("p0", "p1", "p2", "p3"))


def test_json_stream_across_chunk_boundaries() -> None:
    """The streamed JSON reader gives the records and their lines exactly, however the text
    is cut into chunks: a pretty-printed array, a one-line array, and values one after
    another."""
    from pytest_osprey.trace_build.inputs import InputError, json_values

    rows = [{"text": f"r\u00e9cord {i} \"quoted\" \\ back", "n": [i, 1.5e3, None, True]}
            for i in range(30)]
    pretty = json.dumps(rows, indent=2)
    starts = [n + 1 for n, line in enumerate(pretty.split("\n")) if line == "  {"]
    for size in (1, 3, 7, 64, 10_000):
        for text, lines_ in ((pretty, starts), (json.dumps(rows), [1] * 30),
                             ("\n".join(json.dumps(r) for r in rows), list(range(1, 31))),
                             ("  12 \n\n-3.5e2 [1] \"x\"", [1, 3, 3, 3])):
            chunks = iter([text[i:i + size] for i in range(0, len(text), size)])
            got = list(json_values(chunks, Path("d.json")))
            if text.startswith("  12"):
                assert [v for _, v in got] == [12, -350.0, [1], "x"]
            else:
                assert [v for _, v in got] == rows
            assert [n for n, _ in got] == lines_
    for bad, msg in (('[{"a": 1}\n {"b": 2}]', "d.json:2: invalid JSON: expected ','"),
                     ('[{"a": 1},', "d.json:1: invalid JSON: the array is not closed"),
                     ("[1] 2", "d.json:1: invalid JSON: extra data after the array"),
                     ('{"a": tru}', "d.json:1: invalid JSON")):
        with pytest.raises(InputError, match=re.escape(msg)):
            list(json_values(iter([bad]), Path("d.json")))
    with pytest.raises(InputError, match="a record over"):
        big = "[" + json.dumps("x" * 5000) + "]"
        list(json_values(iter([big[i:i + 64] for i in range(0, len(big), 64)]),
                         Path("d.json"), limit=100))
