"""Per-token values read packed (results/packed.py): the same list to every reader, and the
same judgement as the plain lists a campaign holds while it runs."""

from __future__ import annotations

import copy
import json
import math
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.judgement import judge, plan_gates
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.report.summary import summary_dict
from pytest_osprey.results.folder import SavedCampaign, load_campaign
from pytest_osprey.results.packed import Packed, pack
from pytest_osprey.results.preflight_file import read_preflight
from pytest_osprey.results.records import RecordWriter, impossible_value, read_records
from testkit.factories import make_record
from testkit.recorded_campaign import record_campaign, write_project


@pytest.mark.parametrize("values", [[0.25, 1e-9, 3.0], [1, 2, 70000], [5]])
def test_a_packed_list_reads_as_the_list(values: list[Any]) -> None:
    p = pack(values)
    assert isinstance(p, Packed)
    assert p == values and values == p
    assert (p != values) is False  # __ne__ as a list's
    assert repr(p) == repr(values) and json.dumps(p.tolist()) == json.dumps(values)
    assert [(type(v), v) for v in p] == [(type(v), v) for v in values]
    assert p[-1] == values[-1] and p[1:] == values[1:] and isinstance(p[1:], list)
    assert len(p) == len(values) and bool(p) and values[0] in p
    assert p + [7] == [*values, 7] and [7] + p == [7, *values]  # noqa: RUF005
    assert np.array_equal(np.asarray(p), np.asarray(values))
    assert np.mean(p) == np.mean(values)
    assert copy.deepcopy(p) == values and pickle.loads(pickle.dumps(p)) == values
    assert p != (*values,)  # as a list, not equal to a tuple
    with pytest.raises(TypeError):
        hash(p)


@pytest.mark.parametrize("values", [[], [1, 2.5], [True, False], [2**70], None, "ab"])
def test_what_cannot_be_packed_exactly_stays_as_it_is(values: Any) -> None:
    assert pack(values) is values


@pytest.mark.parametrize(("field", "bad"), [
    ("itl_s", [0.1, -0.5, 0.2]), ("itl_s", [0.1, math.nan]), ("itl_s", [math.inf]),
    ("output_ids", [1, -3, 4]), ("output_ids", [1.0, 2.0]),
])
def test_an_impossible_value_is_named_alike_packed_or_not(field: str, bad: list[Any]) -> None:
    plain = make_record(**{field: bad})
    packed = replace(plain, **{field: pack(bad)})
    assert isinstance(getattr(packed, field), Packed)
    why = impossible_value(plain, None, 65)
    assert why is not None and why == impossible_value(packed, None, 65)
    sound = make_record(itl_s=[0.1, 0.0, 0.2], output_ids=[1, 2, 3])
    assert impossible_value(replace(sound, itl_s=pack(sound.itl_s),
                                    output_ids=pack(sound.output_ids)), None, 65) is None


def test_records_are_read_packed_and_written_back_byte_for_byte(tmp_path: Path) -> None:
    path, again = tmp_path / "records.jsonl", tmp_path / "again.jsonl"
    originals = [make_record("c", f"p{i}", itl_s=[0.1 * i, 0.2], output_ids=[i, 300, 70000])
                 for i in range(3)]
    with RecordWriter(path) as writer:
        for r in originals:
            writer.write(r)
    back = list(read_records(path))
    assert all(isinstance(r.itl_s, Packed) and isinstance(r.output_ids, Packed) for r in back)
    assert back == originals
    with RecordWriter(again) as writer:
        for r in back:
            writer.write(r)
    assert again.read_bytes() == path.read_bytes()


def _summary(project: Path, data: SavedCampaign) -> dict[str, Any]:
    pilot = load_pilot(project / "pilot.yaml")
    data.prompts = load_trace(pilot.trace.files).by_id()
    preflight = read_preflight(data.directory / "preflight.json")
    assert preflight is not None
    judgement = judge(pilot, plan_gates(pilot, list(pilot.conditions)), data, preflight)
    return summary_dict(judgement, data, pilot)


def _plain(data: SavedCampaign) -> SavedCampaign:
    """``data`` with every per-token value a plain list, as a running campaign holds it."""
    def unpacked(rs: list[Any]) -> list[Any]:
        return [replace(r, itl_s=list(r.itl_s), output_ids=list(r.output_ids)) for r in rs]
    return replace(data, records=unpacked(data.records), fillers=unpacked(data.fillers))


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_campaign_judged_packed_is_judged_as_from_plain_lists(tmp_path: Path) -> None:
    project = write_project(tmp_path)
    results = tmp_path / "results"
    record_campaign(project, results)
    data = load_campaign(results)
    assert any(isinstance(r.itl_s, Packed) for r in data.records)
    assert any(isinstance(r.output_ids, Packed) for r in data.records)
    plain = _plain(data)
    assert not any(isinstance(r.itl_s, Packed) for r in plain.records)
    packed_summary, plain_summary = _summary(project, data), _summary(project, plain)
    assert packed_summary == plain_summary
    # The comparison can fail: one output changed in the plain copy changes the judgement.
    first = next(i for i, r in enumerate(plain.records)
                 if r.ok and r.mode == "greedy" and r.condition == "cand" and r.output_ids)
    r = plain.records[first]
    plain.records[first] = replace(r, output_ids=[r.output_ids[0] + 1, *r.output_ids[1:]])
    plain = replace(plain, records=list(plain.records))
    assert _summary(project, plain) != packed_summary
