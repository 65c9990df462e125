"""A merge trusts nothing in a shard's folder that it can check: each planted forgery, cut
copy, relabelling, version mix or malformed file below is caught, in one line (exit 4), or
judged partial, and a trace changed since the run is said; an output never lands on an input
and a failed merge leaves no folder."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.__main__ import main
from pytest_osprey.results import records as records_module
from testkit.factories import write_pilot
from testkit.pilot_run import MARK, fake_sglang, run_two_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards of a 4-pass, 5-prompt pilot on the fake SGLang server."""
    root = tmp_path_factory.mktemp("trust")
    sections = fake_sglang(root / "events", blocks=4, order="interleaved", levels={"low": 1})
    sections["load"].pop("block_prompts")
    sections["target"]["env"][MARK] = str(root)
    pilot = write_pilot(root, sections.pop("conditions"), prompts=5, **sections)
    run_two_shards(root, pilot)
    return root


def _meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "campaign.json").read_text())


def _edit(folder: Path, **changes: Any) -> None:
    (folder / "campaign.json").write_text(json.dumps({**_meta(folder), **changes}))


def _copy(shards: Path, k: int, dst: Path) -> Path:
    return Path(shutil.copytree(shards / f"s{k}", dst))


def _merge(out: Path, *folders: Path, flags: tuple[str, ...] = (),
           capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["merge", *flags, str(out), *map(str, folders)])
    return code, capsys.readouterr().err.strip()


def _refused(code: int, err: str, *expected: str) -> None:
    assert code == 4, err
    assert len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, err


def _no_folder_left(out: Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.merging-*"))


@pytest.mark.slow  # over a second on 2 busy cores
def test_each_run_writes_the_hash_of_its_records(shards: Path) -> None:
    import hashlib

    for k in (1, 2):
        meta = _meta(shards / f"s{k}")
        assert meta["records_sha256"] == hashlib.sha256(
            (shards / f"s{k}" / "records.jsonl").read_bytes()).hexdigest()


def test_a_pilot_edited_after_the_run_is_refused(shards: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    s2 = _copy(shards, 2, tmp_path / "s2")
    _edit(s2, pilot_text=_meta(s2)["pilot_text"] + "\nlimits:\n  speedup_min: 0.5\n")
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "pilot_text was changed", str(s2))
    _no_folder_left(tmp_path / "m")
    # Its hash rewritten too: the pilot no longer digests to the run's config_hash.
    _edit(s2, pilot_text_sha256=hashlib_text(_meta(s2)["pilot_text"]))
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "pilot_text is not the pilot the run digested")
    # And config_hash as well, on this shard: the shards no longer agree.
    from pytest_osprey.pilot.loading import load_pilot_text

    _edit(s2, config_hash=load_pilot_text(_meta(s2)["pilot_text"], "t").digest())
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "a shard of a different config")


def hashlib_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("cut", ["40% of its bytes", "a torn last line", "a deleted pass"])
def test_records_cut_short_are_refused_by_their_hash(shards: Path, tmp_path: Path, cut: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    s2 = _copy(shards, 2, tmp_path / "s2")
    _cut(s2 / "records.jsonl", cut)
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "records.jsonl: changed since its run")
    code, err = _merge(tmp_path / "m", shards / "s1", s2, flags=("--partial",), capsys=capsys)
    _refused(code, err, "changed since its run")  # a forged copy is not merely partial
    _no_folder_left(tmp_path / "m")


def _cut(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "40% of its bytes":
        path.write_bytes(data[:int(len(data) * 0.4)])
    elif how == "a torn last line":
        path.write_bytes(data[:-20])
    else:
        rows = [json.loads(line) for line in data.decode().splitlines()]
        last = max(r["repetition"] for r in rows)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["repetition"] != last))


@pytest.mark.parametrize("cut", ["40% of its bytes", "a torn last line", "a deleted pass"])
def test_an_older_folder_short_of_its_plan_is_partial_whatever_its_status(
        shards: Path, tmp_path: Path, cut: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No records hash (a folder from before it was kept): its records are counted against
    its plan, and a short shard is incomplete though campaign.json says complete."""
    s2 = _copy(shards, 2, tmp_path / "s2")
    _edit(s2, records_sha256=None)
    _cut(s2 / "records.jsonl", cut)
    assert _meta(s2)["status"] == "complete"
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "shard 2 incomplete", "of the 20 timed requests its plan gives it")
    code, err = _merge(tmp_path / "m", shards / "s1", s2, flags=("--partial",), capsys=capsys)
    assert code == 2, err  # partial: no verdict
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert "shard 2 of 2" in summary["partial"] and "timed requests" in summary["partial"]
    assert [s["status"] for s in summary["shards"]] == ["complete", "incomplete"]
    assert all(v["verdict"] == "INCONCLUSIVE" for v in summary["verdicts"])
    assert "shard 2 unverified: its records" in err  # said, not fatal
    # Judged in a temporary folder, reported as the folder it became.
    assert ".merging" not in err + (tmp_path / "m" / "report.md").read_text()
    assert not list(tmp_path.glob(".m.merging-*"))


def test_an_older_whole_folder_merges_with_its_records_unverified(
        shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s2 = _copy(shards, 2, tmp_path / "s2")
    _edit(s2, records_sha256=None)
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    assert code in (0, 1), err
    assert "warning: shard 2 unverified: its records (no records_sha256" in err
    assert "shard 2 unverified" in _meta(tmp_path / "m")["merge_note"]


def test_a_shard_relabelled_as_another_is_refused(shards: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # Its index changed: its declared passes are not that index's share.
    s2 = _copy(shards, 2, tmp_path / "s2")
    _edit(s2, shard={**_meta(s2)["shard"], "index": 1})
    code, err = _merge(tmp_path / "m", s2, shards / "s2", capsys=capsys)
    _refused(code, err, "declares passes [1, 3]", "its share of the plan's 4 is [0, 2]")
    # Index and passes changed alike: its records' passes are not the declared ones.
    _edit(s2, shard={**_meta(s2)["shard"], "index": 1, "passes": [0, 2]})
    code, err = _merge(tmp_path / "m", s2, shards / "s2", capsys=capsys)
    _refused(code, err, "records of pass 1, outside the shard's declared passes [0, 2]")
    _no_folder_left(tmp_path / "m")


def test_records_of_another_campaign_are_refused(shards: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    s2 = _copy(shards, 2, tmp_path / "s2")
    rows = (s2 / "records.jsonl").read_text().splitlines()
    rows[0] = json.dumps({**json.loads(rows[0]), "prompt_id": "elsewhere"})
    (s2 / "records.jsonl").write_text("\n".join(rows) + "\n")
    _edit(s2, records_sha256=None)
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "prompt_id 'elsewhere'")


def test_a_trace_changed_since_the_run_is_said(shards: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The trace lies outside the shards' folders: where the files campaign.json names no
    longer give its trace_hash, the merge says each shard's trace is unverified."""
    trace = tmp_path / "trace.jsonl"
    text = (shards / "trace.jsonl").read_text()
    trace.write_text(text.replace('"prompt": "', '"prompt": "Edited: ', 1))
    copies = [_copy(shards, k, tmp_path / f"s{k}") for k in (1, 2)]
    for s in copies:
        _edit(s, trace_files=[str(trace)])
    code, err = _merge(tmp_path / "m", *copies, capsys=capsys)
    assert code in (0, 1), err
    for k in (1, 2):
        assert f"shard {k} unverified: its trace (the trace files here differ" in err
        assert f"shard {k} unverified: its trace" in _meta(tmp_path / "m")["merge_note"]


def test_tool_versions_must_agree_unless_allowed(shards: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    s2 = _copy(shards, 2, tmp_path / "s2")
    _edit(s2, tool_version="9.9.9")
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, "tool.pytest-osprey 9.9.9", "--allow-heterogeneous")
    code, err = _merge(tmp_path / "m", shards / "s1", s2, flags=("--allow-heterogeneous",),
                       capsys=capsys)
    assert code in (0, 1), err
    assert "tool.pytest-osprey 9.9.9" in _meta(tmp_path / "m")["merge_note"]


_DEEP = "[" * 100_000 + "]" * 100_000

MALFORMED: dict[str, tuple[str, Any]] = {
    # name: (file, how) - how: bytes to write, or a function of the current text
    "campaign.json truncated": ("campaign.json", lambda t: t[: len(t) // 2]),
    "campaign.json of wrong types": ("campaign.json",
                                     lambda t: json.dumps({**json.loads(t), "blocks": "four"})),
    "campaign.json shard of wrong type": (
        "campaign.json", lambda t: json.dumps({**json.loads(t), "shard": {"index": "two"}})),
    "campaign.json nested too deeply": ("campaign.json", lambda t: t[:-2] + ', "x": '
                                        + _DEEP + "}"),
    "campaign.json a lone surrogate": ("campaign.json", lambda t: t[:-2] + ', "x": "\\ud800"}'),
    "campaign.json a list": ("campaign.json", lambda t: "[]"),
    "records line not JSON": ("records.jsonl", lambda t: "{not json\n" + t),
    "records of wrong types": ("records.jsonl", lambda t: _first(t, e2e_s="fast")),
    "records ids of wrong types": ("records.jsonl", lambda t: _first(t, output_ids=[1, "a"])),
    "records block a float": ("records.jsonl", lambda t: _first(t, block=1.5)),
    "records nested too deeply": ("records.jsonl", lambda t: _DEEP + "\n" + t),
    "records a lone surrogate": ("records.jsonl", lambda t: _first(t, output_text="\ud800")),
    "records not a record": ("records.jsonl", lambda t: "[1, 2]\n" + t),
    "preflight.json truncated": ("preflight.json", lambda t: t[: len(t) // 2]),
    "preflight.json nested too deeply": ("preflight.json", lambda t: _DEEP),
    "preflight.json of wrong types": ("preflight.json", lambda t: '{"artifacts": [1]}'),
}


def _first(text: str, **changes: Any) -> str:
    rows = text.splitlines()
    rows[0] = json.dumps({**json.loads(rows[0]), **changes})  # ensure_ascii: "\ud800" escaped
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_every_malformed_file_is_one_line_naming_it(shards: Path, tmp_path: Path, case: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    name, how = MALFORMED[case]
    s2 = _copy(shards, 2, tmp_path / "s2")
    path = s2 / name
    path.write_text(how(path.read_text()))
    code, err = _merge(tmp_path / "m", shards / "s1", s2, capsys=capsys)
    _refused(code, err, str(path))
    assert "internal error" not in err
    _no_folder_left(tmp_path / "m")


def test_a_full_disk_leaves_no_half_written_folder(shards: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[int] = []
    real = records_module.RecordWriter.write

    def write(self: Any, record: Any) -> None:
        if len(written) >= 7:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        written.append(1)
        real(self, record)

    monkeypatch.setattr(records_module.RecordWriter, "write", write)
    code, err = _merge(tmp_path / "m", shards / "s1", shards / "s2", capsys=capsys)
    _refused(code, err, "the disk is full")
    _no_folder_left(tmp_path / "m")


def test_an_output_never_replaces_an_input(shards: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    s1, s2 = _copy(shards, 1, tmp_path / "s1"), _copy(shards, 2, tmp_path / "s2")
    before = (s1 / "records.jsonl").read_bytes()
    for out in (s1, s1 / "merged", tmp_path, s2 / ".." / "s2"):
        code, err = _merge(out, s1, s2, capsys=capsys)
        _refused(code, err, "an output never replaces an input")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    code, err = _merge(taken, s1, s2, capsys=capsys)
    _refused(code, err, "not empty")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    code, err = _merge(afile, s1, s2, capsys=capsys)
    _refused(code, err, "a file")
    assert afile.read_text() == "mine" and (taken / "notes.txt").read_text() == "mine"
    assert (s1 / "records.jsonl").read_bytes() == before
    assert not (s1 / "merged").exists()
    # An empty folder is taken, as a new one is.
    (tmp_path / "empty").mkdir()
    code, err = _merge(tmp_path / "empty", s1, s2, capsys=capsys)
    assert code in (0, 1), err
    assert (tmp_path / "empty" / "summary.json").is_file()
