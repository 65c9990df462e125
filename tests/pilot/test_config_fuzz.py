"""Hypothesis: whatever a pilot file holds, load_pilot returns a Pilot or raises a ConfigError
whose message starts with the file's name; never any other exception."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import ConfigError, Pilot
from testkit.factories import ROOT, pilot_layout

PILOT_TEXT = (ROOT / "pilot.yaml").read_text(encoding="utf-8")
BASE: dict[str, Any] = yaml.safe_load(PILOT_TEXT)
CAND = next(n for n, c in BASE["conditions"].items() if c["role"] == "candidate")
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's: the fuzz loop stays fast

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

# Field names from the whole schema: misspelling them is the commonest real mistake.
FIELD_NAMES = sorted(
    {
        name
        for model in (Pilot, *(f.annotation for f in Pilot.model_fields.values()))
        if isinstance(model, type) and hasattr(model, "model_fields")
        for name in model.model_fields
    }
    | {"role", "drafter", "speculation", "pins", "num_draft_tokens", "algorithm", "levels",
       "speedup_min", "latency", "metric", "percentile", "max_s", "setup", "pretraining"}
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo pilot's layout with fake models, so an unmutated pilot is valid."""
    return pilot_layout(tmp_path_factory.mktemp("fuzz"), BASE)


def check(path: Path) -> Pilot | None:
    """The property: a Pilot (usable) or a ConfigError that starts with the file name."""
    try:
        pilot = load_pilot(path)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"{path}:"), message
        assert message.strip(), "empty error message"
        return None
    # A valid pilot is usable: its views and digest work.
    assert pilot.baseline in pilot.conditions
    assert pilot.primary_load in pilot.load.levels
    assert len(pilot.digest()) == 64
    return pilot


# --------------------------------------------------------------------------- strategies

odd_text = st.text(
    st.characters(
        codec="utf-8",
        categories=("L", "M", "N", "P", "S", "Z", "Cc", "Cf"),
    ),
    max_size=16,
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 0.5, 1.1]),
    odd_text,
    st.sampled_from(["", "baseline", "candidate", "current", "low", "concurrent", "~", "null",
                     "yes", "2024-13-45", "0x1F", "fixtures/models/tiny-drafter", "../..", "/",
                     "x" * 300, "~nobody/x", "a\x00b"]),
)
keys = st.one_of(odd_text, st.sampled_from(FIELD_NAMES), st.integers(-3, 3), st.none(),
                 st.booleans())
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(keys, children, max_size=3),
    ),
    max_leaves=8,
)


def misspell(data: st.DataObject, word: str) -> str:
    how = data.draw(st.sampled_from(["drop", "double", "swap", "upper", "append", "dash"]))
    i = data.draw(st.integers(0, max(len(word) - 1, 0)))
    if how == "drop" and word:
        return word[:i] + word[i + 1 :]
    if how == "double" and word:
        return word[:i] + word[i] + word[i:]
    if how == "swap" and len(word) > 1:
        i = min(i, len(word) - 2)
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if how == "upper":
        return word.upper()
    if how == "dash":
        return word.replace("_", "-") if "_" in word else word + "-"
    return word + data.draw(st.sampled_from(["s", "é", "\u200b", "2", " "]))


def containers(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every dict and list in the tree, with its path."""
    if isinstance(node, dict | list):
        yield path, node
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            yield from containers(v, (*path, k))


def mutate(data: st.DataObject, pilot: dict[str, Any]) -> None:
    """One random edit somewhere in the tree."""
    spots = list(containers(pilot))
    _, node = data.draw(st.sampled_from(spots), label="container")
    op = data.draw(
        st.sampled_from(["delete", "replace", "add", "rename", "wrap", "number"]), label="op"
    )
    if isinstance(node, list):
        if not node or op == "add":
            node.append(data.draw(values))
            return
        i = data.draw(st.integers(0, len(node) - 1))
        if op == "delete":
            del node[i]
        elif op == "wrap":
            node[i] = [node[i]]
        else:
            node[i] = data.draw(values)
        return
    if not node or op == "add":
        node[data.draw(keys)] = data.draw(values)
        return
    key = data.draw(st.sampled_from(list(node)))
    if op == "delete":
        del node[key]
    elif op == "replace":
        node[key] = data.draw(values)
    elif op == "rename":
        node[misspell(data, str(key)) if data.draw(st.booleans()) else data.draw(keys)] = (
            node.pop(key)
        )
    elif op == "wrap":
        node[key] = data.draw(st.sampled_from([[node[key]], {"value": node[key]}]))
    else:
        node[key] = data.draw(
            st.sampled_from([-1, 0, -0.5, 10**9, 10**18, 1e300, float("inf"), float("nan")])
        )


def dump(data: st.DataObject, pilot: Any) -> str:
    return yaml.dump(
        pilot,
        Dumper=DUMPER,
        allow_unicode=data.draw(st.booleans()),
        sort_keys=False,
        default_flow_style=data.draw(st.sampled_from([False, None, True])),
    )


# --------------------------------------------------------------------------- properties


def test_the_unmutated_pilot_is_valid(workspace: Path) -> None:
    path = workspace / "pilot.yaml"
    path.write_text(PILOT_TEXT, encoding="utf-8")
    assert check(path) is not None


@pytest.mark.slow  # over a second on 2 busy cores
@settings(FUZZ, max_examples=250)
@given(data=st.data())
def test_structural_mutations(workspace: Path, data: st.DataObject) -> None:
    pilot = copy.deepcopy(BASE)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        mutate(data, pilot)
    path = workspace / "pilot.yaml"
    path.write_text(dump(data, pilot), encoding="utf-8")
    check(path)


TOKENS = ["&a ", "*a", "!!str ", "!!int ", "!!float ", "!!binary ", "!!timestamp ", "!!set ",
          "!!python/name:os.system ", "{", "}", "[", "]", ": ", "- ", "\t", "\n---\n",
          "%YAML 1.1\n",
          "? ", "|", ">", "'", '"', "#", "\\", "\\u0000", "\x00", "\ufeff", "\u2028", ",", "<<: ",
          "~", ".inf", "-.nan", "0o777", "1" + "0" * 4400, "2024-13-45", "\n  ", "\n"]


# Raw YAML for a value position: what a YAML parser builds, or fails to build, from it.
RAW_VALUES = [
    "2024-13-45", "2024-02-30 25:61:00", "!!float abc", "!!int 0x", "!!timestamp x",
    "!!binary '@@'", "!!set {a}", "!!omap [a]", "!!null x", "!!bool maybe",
    "1" + "0" * 5000, "-" + "9" * 400, "1e99999", ".nan", "-.inf", "0o8", "0b102",
    "&a [*a]", "&b {k: *b}", "*undefined", "[" * 400 + "]" * 400, "'" + "p" * 5000 + "'",
    r'"\ud800"', r'"\x00"', r'"\uFFFF"', r'"\U0010FFFF"', "!custom x", "!!python/tuple [1]",
    "~", "", "[]", "{}", "- a", "? a", "|\n  text", "{a: 1, a: 2}", "<<: {a: 1}", "@x", "`x",
]


@pytest.mark.slow  # over a second on 2 busy cores
@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_text_mutations(workspace: Path, data: st.DataObject) -> None:
    text = PILOT_TEXT
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        i = data.draw(st.integers(0, len(text)), label="at")
        how = data.draw(
            st.sampled_from(["value", "insert", "token", "delete", "line"]), label="how"
        )
        if how == "value":  # replace the value after some "key: " with raw YAML
            lines = text.splitlines(keepends=True)
            keyed = [n for n, line in enumerate(lines) if ": " in line]
            n = data.draw(st.sampled_from(keyed))
            key = lines[n][: lines[n].index(": ") + 2]
            lines[n] = key + data.draw(st.sampled_from(RAW_VALUES)) + "\n"
            text = "".join(lines)
        elif how == "insert":
            text = text[:i] + data.draw(odd_text) + text[i:]
        elif how == "token":
            text = text[:i] + data.draw(st.sampled_from(TOKENS)) + text[i:]
        elif how == "delete":
            text = text[:i] + text[i + data.draw(st.integers(1, 40)) :]
        else:
            lines = text.splitlines(keepends=True)
            n = data.draw(st.integers(0, len(lines) - 1))
            lines.insert(n, lines[n])  # a duplicated line: duplicate keys or list items
            text = "".join(lines)
    path = workspace / "pilot.yaml"
    raw = text.encode("utf-8")
    if data.draw(st.booleans(), label="corrupt bytes"):
        j = data.draw(st.integers(0, len(raw)))
        raw = raw[:j] + data.draw(st.binary(min_size=1, max_size=3)) + raw[j:]
    path.write_bytes(raw)
    check(path)


@settings(FUZZ, max_examples=50)
@given(doc=values, data=st.data())
def test_arbitrary_documents_are_refused_cleanly(
    workspace: Path, doc: Any, data: st.DataObject
) -> None:
    path = workspace / "pilot.yaml"
    path.write_text(dump(data, doc), encoding="utf-8")
    assert check(path) is None


def valid_name(name: str) -> bool:
    return (bool(name) and len(name) <= 64 and name not in (".", "..")
            and all(c.isalnum() or c in "-_." for c in name))


@settings(FUZZ, max_examples=80)
@given(
    name=st.one_of(odd_text, st.text("abc-_.XYZ019éß", min_size=1, max_size=8)),
    data=st.data(),
)
def test_condition_names(workspace: Path, name: str, data: st.DataObject) -> None:
    """Odd unicode in a condition name: accepted exactly when the documented rule says so."""
    assume(name not in BASE["conditions"])
    pilot = copy.deepcopy(BASE)
    pilot["conditions"][name] = pilot["conditions"].pop(CAND)
    setup = pilot.get("cost", {}).get("setup", {})
    if CAND in setup:
        setup[name] = setup.pop(CAND)
    path = workspace / "pilot.yaml"
    path.write_text(dump(data, pilot), encoding="utf-8")
    loaded = check(path)
    assert (loaded is not None) == valid_name(name), name
    if loaded is not None:
        assert loaded.candidates == [name]
