"""Bad pilot input, class by class: one line naming the file, the line and the field, never a
traceback and never a silent reading.

Classes: repeated keys, keys YAML reads as booleans/null/numbers, look-alike types (``true``
or ``'2'`` for a count), values beyond any sane bound, an oversized file, a ``name`` that is
not a safe folder name, an endpoint URL that is not an http(s) base URL, a trace selection
the trace cannot honour. Each class is generated (Hypothesis) over the whole schema, not
only the quoted example.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from pytest_osprey.__main__ import main
from pytest_osprey.pilot.base import check_slug
from pytest_osprey.pilot.endpoint_url import check_url
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import ConfigError, Pilot
from pytest_osprey.pilot.selection import selected_trace
from pytest_osprey.pilot.yaml_text import MAX_PILOT_BYTES
from pytest_osprey.run.folders import default_results
from testkit.factories import ROOT

BASE: dict[str, Any] = yaml.safe_load((ROOT / "pilot.yaml").read_text("utf-8"))
CAND = next(n for n, c in BASE["conditions"].items() if c["role"] == "candidate")
FUZZ = settings(deadline=None, database=None, max_examples=60,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def proj(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The repo pilot's layout with fake models and 3 prompts a trace file: BASE loads here."""
    folder = tmp_path_factory.mktemp("proj")
    drafters = [c["drafter"] for c in BASE["conditions"].values() if c.get("drafter")]
    for model in (BASE["target"]["model"], *drafters):
        (folder / model).mkdir(parents=True, exist_ok=True)
        (folder / model / "config.json").write_text("{}", "utf-8")
    for k, name in enumerate(BASE["trace"]["files"]):  # ids unique across the files
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("".join(
            json.dumps({"id": f"q{i}" if k == 0 else f"f{k}-q{i}", "domain": "chat",
                        "prompt": "hi", "slice": s}) + "\n"
            for i, s in enumerate(("core", "core", "unusual"))), "utf-8")
    yield folder


def write(proj: Path, text: str, name: str = "pilot.yaml") -> Path:
    path = proj / name
    path.write_text(text, "utf-8")
    return path


def error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_pilot(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), message
    return message


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --------------------------------------------------------------------------- repeated keys


def _mappings(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        yield path
        for k, v in node.items():
            yield from _mappings(v, (*path, str(k)))


MAPPINGS = sorted(p for p in _mappings(BASE) if p)  # every nested mapping of the pilot


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(where=st.sampled_from([(), *MAPPINGS]), data=st.data())
def test_a_repeated_key_anywhere_is_refused_naming_both_lines(
    proj: Path, where: tuple[str, ...], data: st.DataObject
) -> None:
    """Any key of any mapping, written twice (block style, the second time with another
    value): refused, naming the key, its second line and its first."""
    text = dump(BASE)
    node = yaml.compose(text)
    for part in where:
        node = next(v for k, v in node.value if k.value == part)
    key_node = data.draw(st.sampled_from([k for k, _ in node.value]), label="key")
    first = key_node.start_mark.line + 1
    indent = " " * key_node.start_mark.column
    lines = text.splitlines(keepends=True)
    end = node.end_mark.line  # a block mapping ends where the next token starts: its copy
    lines.insert(end, f"{indent}{key_node.value}: null\n")  # goes right after its last line
    message = error(write(proj, "".join(lines)))
    assert message == (f"{proj / 'pilot.yaml'}:{end + 1}: duplicate key {key_node.value!r} "
                       f"(first at line {first}); YAML would silently keep only the last one: "
                       "merge them")


def test_the_reported_example_a_second_limits_block(proj: Path) -> None:
    text = dump(BASE) + "limits: {speedup_min: 0.5}\n"
    assert "duplicate key 'limits' (first at line" in error(write(proj, text))


def test_a_duplicated_baseline_says_so_not_found_0_baselines(proj: Path) -> None:
    base = next(n for n, c in BASE["conditions"].items() if c["role"] == "baseline")
    text = dump(BASE).replace(f"  {base}:\n", f"  {base}:\n    role: baseline\n  {base}:\n", 1)
    message = error(write(proj, text))
    assert f"duplicate key {base!r}" in message and "found 0" not in message


# --------------------------------------------------------------------------- non-name keys

# What PyYAML (YAML 1.1) resolves to booleans, null, numbers and dates.
YAML_NON_NAMES = ["yes", "No", "on", "OFF", "true", "False", "~", "null", "1", "0x1f", "1.5",
                  "2024-01-01"]


@FUZZ
@given(key=st.sampled_from(YAML_NON_NAMES),
       where=st.sampled_from(["conditions", "load.levels", "target.env", "cost.setup"]))
def test_keys_yaml_reads_as_values_get_a_plain_message(proj: Path, key: str, where: str) -> None:
    data = json.loads(json.dumps(BASE))
    node = data
    for part in where.split("."):
        node = node.setdefault(part, {})
    node["QQKEY"] = "x"
    text = dump(data)
    line = text[: text.index("QQKEY:")].count("\n") + 1
    message = error(write(proj, text.replace("QQKEY:", f"{key}:")))
    assert message.startswith(f"{proj / 'pilot.yaml'}:{line}: the key {key} is read by YAML as ")
    assert message.endswith(f"not a name; quote it ('{key}':) to use it as a name")


def test_a_condition_named_yes(proj: Path) -> None:
    text = dump(BASE).replace("conditions:\n", "conditions:\n  yes: {role: candidate}\n", 1)
    assert "the key yes is read by YAML as the boolean true, not a name; quote it" in error(
        write(proj, text))


# --------------------------------------------------------------------------- types and bounds


def _unwrap(ann: Any) -> Any:
    while True:
        if get_origin(ann) is Annotated:
            ann = get_args(ann)[0]
        elif get_origin(ann) in (Union, UnionType):
            args = [a for a in get_args(ann) if a is not type(None)]
            if len(args) != 1:
                return ann
            ann = args[0]
        else:
            return ann


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    if model in seen:
        return
    seen.add(model)
    yield model
    for f in model.model_fields.values():
        nested = [x for a in get_args(f.annotation) for x in get_args(a)]
        for candidate in (f.annotation, *get_args(f.annotation), *nested):
            inner = _unwrap(candidate)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _models(inner, seen)


MODELS = list(_models(Pilot, set()))


def _leaf_fields(model: type[BaseModel], path: tuple[str, ...] = ()
                 ) -> Iterator[tuple[tuple[str, ...], type]]:
    """(path, int|float|bool) of every scalar field reachable through sub-models (not through
    user-named mappings: those are covered by the condition's own path below)."""
    for name, f in model.model_fields.items():
        ann = _unwrap(f.annotation)
        if ann in (int, float, bool):
            yield (*path, name), ann
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaf_fields(ann, (*path, name))


SPECULATION = next(m for m in MODELS if m.__name__ == "Speculation")
SCALARS = [*_leaf_fields(Pilot),
           *((("conditions", CAND, "speculation", *p), kind)
             for p, kind in _leaf_fields(SPECULATION))]
LOOK_ALIKES = {
    int: ["true", "false", "'2'", "'10'", "2.5", "1e3", "[2]", "'0x10'"],
    float: ["true", "'1.5'", "'2'", "[1.0]", "{a: 1}"],
    bool: ["1", "0", "'true'", "'yes'", "2.5", "[true]"],
}


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``data`` with ``value`` at ``path`` (missing mappings made on the way)."""
    out = json.loads(json.dumps(data))
    node = out
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value
    return out


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(field=st.sampled_from(SCALARS), data=st.data())
def test_no_look_alike_passes_for_a_number_or_a_flag(
    proj: Path, field: tuple[tuple[str, ...], type], data: st.DataObject
) -> None:
    """``blocks: true`` is no 1, ``blocks: '2'`` no 2, ``greedy: 1`` no true: every such
    field, every such value, refused naming the field and what YAML read."""
    path, kind = field
    raw = data.draw(st.sampled_from(LOOK_ALIKES[kind]), label="value")
    text = dump(_set(BASE, path, "@@"))
    text = text.replace("'@@'", raw).replace("@@", raw)
    message = error(write(proj, text))
    dotted = ".".join(path)
    ours = [row for row in message.splitlines() if f": {dotted}: " in row]
    assert ours and "expected " in ours[0], message


def _bounded(metadata: list[Any]) -> tuple[bool, bool]:
    """(has an upper bound, has a length bound) among pydantic constraints."""
    upper = length = False
    for m in metadata:
        for c in getattr(m, "metadata", None) or [m]:
            upper |= any(getattr(c, a, None) is not None for a in ("le", "lt"))
            length |= getattr(c, "max_length", None) is not None or getattr(
                c, "pattern", None) is not None
            length |= callable(getattr(c, "func", None))  # a validator (the name's slug)
    return upper, length


def _constraints(ann: Any, metadata: list[Any]) -> list[Any]:
    out = list(metadata)
    while True:
        if get_origin(ann) is Annotated:
            out += list(get_args(ann)[1:])
            ann = get_args(ann)[0]
        elif get_origin(ann) in (Union, UnionType):
            args = [a for a in get_args(ann) if a is not type(None)]
            if len(args) != 1:
                return out
            ann = args[0]
        else:
            return out


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_every_count_size_duration_and_text_is_bounded(model: type[BaseModel]) -> None:
    """Structural: no int or float field without an upper bound, no list or mapping or free
    text without a length bound (literal choices, flags, paths checked on disk, and the
    variable names, which have a pattern, are bounded by what they are)."""
    unbounded = []
    for name, f in model.model_fields.items():
        ann = _unwrap(f.annotation)
        upper, length = _bounded(_constraints(f.annotation, f.metadata))
        sized = ann is str or get_origin(ann) in (list, dict)
        if (ann in (int, float) and not upper) or (sized and not length):
            unbounded.append(name)
    assert unbounded == [], f"{model.__name__}: unbounded fields {unbounded}"


HUGE = {int: ["100000000000000000000", "-100000000000000000000"],
        float: ["1.0e+300", "-1.0e+300", ".inf", "-.inf", ".nan", "1.0e+18"]}


@FUZZ
@given(field=st.sampled_from([f for f in SCALARS if f[1] is not bool]), data=st.data())
def test_values_beyond_any_sane_bound_are_refused(
    proj: Path, field: tuple[tuple[str, ...], type], data: st.DataObject
) -> None:
    """Every number of the schema, at +-10**20 (integers) or +-1e300, 1e18, inf, nan."""
    path, kind = field
    value = data.draw(st.sampled_from(HUGE[kind]), label="value")
    text = dump(_set(BASE, path, "@@")).replace("'@@'", value)
    message = error(write(proj, text))
    assert f": {'.'.join(path)}: " in message, message


@pytest.mark.parametrize(("key", "value"), [("warmup_requests", 10**9),
                                            ("context_length", 10**14)])
def test_the_reported_examples_of_unbounded_numbers(proj: Path, key: str, value: int) -> None:
    section = "load" if key == "warmup_requests" else "target"
    message = error(write(proj, dump(_set(BASE, (section, key), value))))
    assert f"{section}.{key}: Input should be less than or equal to" in message


# --------------------------------------------------------------------------- file size


def test_a_pilot_over_1_mib_is_refused_before_it_is_parsed(proj: Path) -> None:
    path = write(proj, dump(BASE) + "# filler\n" * (50 * 2**20 // 9))  # 50 MB of comments
    t0 = time.perf_counter()
    message = error(path)
    took = time.perf_counter() - t0
    assert "a pilot file may be at most 1 MiB" in message
    assert took < 1.0, f"{took:.1f} s: the file was read or parsed"
    ok = dump(BASE)
    assert load_pilot(write(proj, ok + "#" * (MAX_PILOT_BYTES - len(ok.encode()) - 1) + "\n"))


# --------------------------------------------------------------------------- the name


@FUZZ
@given(name=st.one_of(st.text(max_size=80),
                      st.sampled_from(["..", ".", "../up", "a/b/c", "x\x00y", "é", "a" * 65,
                                       "/abs", "~", "con", "-a", ".hidden", "a b"])))
def test_the_name_is_a_safe_slug_and_results_stay_under_the_root(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    try:
        check_slug(name)
    except ValueError as exc:
        assert "is not a safe name" in str(exc)
        return
    root = tmp_path_factory.mktemp("cwd")
    folder = default_results(root, name)
    assert folder.parent == root / "osprey-results" and folder.name.startswith(name)


@pytest.mark.parametrize("name", ["../outside", "a/b/c", "x\x00y", "n" * 300, ".."])
def test_the_reported_names_are_refused_in_one_line(proj: Path, name: str) -> None:
    message = error(write(proj, dump({**BASE, "name": name})))
    assert message.count("\n") == 0 and ": name: " in message


def test_a_50_mb_name_is_refused_at_once(proj: Path) -> None:
    path = write(proj, dump(BASE).replace("name:", f"name: {'n' * (50 * 2**20)}\nname0:", 1))
    t0 = time.perf_counter()
    message = error(path)
    assert "at most 1 MiB" in message and time.perf_counter() - t0 < 1.0


# --------------------------------------------------------------------------- endpoint URLs


@FUZZ
@given(url=st.one_of(
    st.text(max_size=60),
    st.builds(lambda s, h, p, rest: f"{s}://{h}{p}{rest}",
              st.sampled_from(["http", "https", "file", "javascript", "ftp", "HTTP", ""]),
              st.sampled_from(["127.0.0.1", "[::1]", "[::1", "example.com", "", "u:p@h",
                               "a b", "h\x00"]),
              st.sampled_from(["", ":80", ":0", ":65535", ":65536", ":99999", ":-1", ":x"]),
              st.sampled_from(["", "/", "/v1", "?q=1", "#f"]))))
def test_an_endpoint_url_is_an_http_base_url_or_refused(url: str) -> None:
    """Accepted only when httpx can build a request to it, over http(s), with a host, a
    port in range and no credentials; everything else is a ValueError with a reason."""
    try:
        check_url(url)
    except ValueError as exc:
        assert str(exc)
        return
    parsed = httpx.URL(url)
    assert parsed.scheme in ("http", "https") and parsed.host and not parsed.userinfo
    assert parsed.port is None or 0 < parsed.port <= 65535
    httpx.Request("GET", url.rstrip("/") + "/health")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "javascript:alert(1)", "not a url",
                                 "http://127.0.0.1:99999", "http://[::1",
                                 "http://user:secret@127.0.0.1:8000"])
def test_the_reported_urls_fail_validation_and_the_dry_run(
    proj: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(json.dumps(BASE))
    data["conditions"]["ep"] = {"role": "candidate",
                                "endpoint": {"url": url, "protocol": "sglang"}}
    path = write(proj, dump(data))
    assert ": conditions.ep.endpoint.url: " in error(path)
    assert main(["run", str(path), "--dry-run", "--results", str(proj / "dry")]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert "secret" not in err  # the URL's password is not repeated


# --------------------------------------------------------------------------- trace selection


@pytest.mark.parametrize(("key", "value", "says"), [
    ("ids", ["q0", "q9"], "prompt id 'q9' is not in the trace"),
    ("slices", ["core", "unusul"], "slice 'unusul' is not in the trace"),
])
def test_an_unknown_id_or_slice_names_the_pilot_line(
    proj: Path, key: str, value: list[str], says: str
) -> None:
    data = json.loads(json.dumps(BASE))
    data["trace"] = {"files": BASE["trace"]["files"], key: value}
    path = write(proj, dump(data))
    with pytest.raises(ConfigError) as info:
        selected_trace(load_pilot(path), path)
    text = dump(data)
    lines = text.splitlines()
    line = next(i for i, row in enumerate(lines, 1) if row.strip() == f"- {value[1]}")
    assert str(info.value).startswith(f"{path}:{line}: trace.{key}.1: {says}"), info.value


def test_no_traceback_from_the_command_line_on_bad_input(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sample of each class through ``python -m pytest_osprey run``: exit 4, one line."""
    bad = [dump(BASE) + "limits: {}\n", dump({**BASE, "name": "../x"}),
           dump(_set(BASE, ("load", "blocks"), True)), "\x00", "- a\n", "a: [\n",
           dump(BASE).replace("conditions:\n", "conditions:\n  on: {role: candidate}\n", 1)]
    for i, text in enumerate(bad):
        path = write(proj, text, f"bad{i}.yaml")
        assert main(["run", str(path), "--dry-run", "--results", str(proj / f"r{i}")]) == 4
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}") and "Traceback" not in err, err


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1", True), ("::1", True), ("0.0.0.0", True), ("gpu-box.internal", True),
    ("--api-key", False), ("-x", False), ("a b", False), ("", False), ("h\n", False),
    ("h;rm", False), ("h" * 300, False),
])
def test_the_bind_host_is_an_address_or_a_name(proj: Path, host: str, ok: bool) -> None:
    """The host becomes a server's --host argument: never an option, a space or a newline."""
    path = write(proj, dump(_set(BASE, ("target", "host"), host)))
    if ok:
        assert load_pilot(path).target.host == host
    else:
        assert ": target.host: String should match pattern" in error(path)
