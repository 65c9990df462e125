"""Reading pilot.yaml: YAML with line numbers, validation errors that name the file, line and
field, and paths resolved against the pilot file's folder."""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .levels import FORMER_ORDERS, UNION_TAGS
from .schema import ConfigError, Pilot, cross_field_problems
from .yaml_text import Lines, parse, read_pilot_text


def embedded_installed() -> bool:
    """Whether the embedded extra (torch) can be imported here, without importing it."""
    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:  # a finder that refuses it (a machine without the extra, in tests)
        return False


def _model_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model whose fields live at ``path`` (for 'did you mean')."""
    ann: Any = Pilot
    for part in path:
        ann = _unwrap(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            ann = field.annotation
        elif get_origin(ann) in (dict, list):
            ann = get_args(ann)[-1]  # a user's key or a list index: step into the values
        else:
            return None
    ann = _unwrap(ann)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _unwrap(ann: Any) -> Any:
    """``X | None`` -> X, ``Annotated[X, ...]`` -> X, ``int | Model`` -> Model."""
    while True:
        origin = get_origin(ann)
        if origin is Annotated:
            ann = get_args(ann)[0]
        elif origin in (Union, UnionType):
            args = [a for a in get_args(ann) if a is not type(None)]
            if len(args) != 1:
                # A scalar-or-model union (a load level): keys can only be the model's.
                models = [m for a in args if isinstance(m := _unwrap(a), type)
                          and issubclass(m, BaseModel)]
                return models[0] if len(models) == 1 else ann
            ann = args[0]
        else:
            return ann


def _where(source: str, lines: Mapping[tuple[str, ...], int], loc: tuple[Any, ...]) -> str:
    """``file:line`` of the deepest part of ``loc`` the YAML has (or just ``file``)."""
    parts = tuple(str(p) for p in loc)
    for n in range(len(parts), -1, -1):
        if parts[:n] in lines:
            return f"{source}:{lines[parts[:n]]}"
    return source


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
}


def _yaml_kind(value: Any) -> str:
    """What YAML read, in words (strict fields take no look-alikes: ``'2'`` is no 2)."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}" + (" (remove the quotes)" if _numeric(value) else "")
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if value is None:
        return "null (no value)"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _format_errors(err: ValidationError, source: str, lines: Lines) -> str:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and (
            p.startswith("function-") or p in UNION_TAGS)))
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        where = _where(source, lines, loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden" and loc:
            model = _model_at(loc[:-1])
            known = list(model.model_fields) if model else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else "")
            if known:
                msg += f" (valid: {', '.join(known)})"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] in _EXPECTED:
            msg = f"expected {_EXPECTED[e['type']]}, got {_yaml_kind(e.get('input'))}"
        out.append(f"{where}: {dotted}: {msg}")
    return "\n".join(out)


def _resolve_paths(
    pilot: Pilot, base: Path, source: str, lines: Mapping[tuple[str, ...], int],
    absent_drafters: bool = False,
) -> Pilot:
    """Relative paths resolve against the pilot file's folder; missing paths are errors
    (a drafter's only where ``absent_drafters`` is false: the artifact check says it)."""

    def fail(loc: tuple[str | int, ...], msg: str) -> ConfigError:
        return ConfigError(f"{_where(source, lines, loc)}: {'.'.join(map(str, loc))}: {msg}")

    def local(p: str | Path) -> Path:
        path = Path(os.path.expanduser(str(p)))
        return path if path.is_absolute() else (base / path)

    files = []
    for i, f in enumerate(pilot.trace.files):
        path = local(f)
        if not os.path.isfile(path):
            raise fail(("trace", "files", i), f"no such file: {path}")
        files.append(path)
    target = pilot.target
    model = target.model
    if target.engine == "transformers" and not embedded_installed():
        raise fail(("target", "engine"), "transformers: the embedded engine runs the model in "
                   "this process and needs torch: pip install 'pytest-osprey[embedded]' (on a "
                   "CPU machine, torch==2.13.0 first)")
    if target.engine == "transformers" or model.startswith((".", "/", "~")):
        path = local(model)
        if not os.path.isdir(path):
            raise fail(("target", "model"), f"no such directory: {path}")
        model = str(path)
    python = target.python
    if python is not None:
        expanded = os.path.expandvars(os.path.expanduser(python))
        if "$" in expanded:
            raise fail(("target", "python"), f"unset environment variable in {python!r}")
        if os.sep in expanded:
            path = local(expanded)
            if not path.is_file():
                raise fail(("target", "python"), f"no such file: {path}")
            expanded = str(path)
        python = expanded
    conditions = {}
    for name, cond in pilot.conditions.items():
        drafter = cond.drafter
        if drafter is not None:
            drafter = local(drafter)
            if not os.path.isdir(drafter) and not absent_drafters:
                raise fail(("conditions", name, "drafter"), f"no such directory: {drafter}")
        if cond.endpoint is None and target.engine == "endpoint":
            raise fail(("conditions", name), "target.engine is endpoint: give endpoint.url")
        held_out = cond.held_out  # missing data is the held-out check's to report
        if held_out is not None:
            held_out = held_out.model_copy(
                update={"adaptation_data": local(held_out.adaptation_data)})
        conditions[name] = cond.model_copy(update={"drafter": drafter, "held_out": held_out})
    return pilot.model_copy(
        update={
            "trace": pilot.trace.model_copy(update={"files": files}),
            "target": target.model_copy(update={"model": model, "python": python}),
            "conditions": conditions,
        }
    )


def load_pilot_unchecked(path: str | os.PathLike[str]) -> Pilot:
    """A pilot whose limits are all that matter (re-judging a saved campaign): validated like
    :func:`load_pilot`, but its paths are neither resolved nor required to exist, and names
    it may have been saved with are read as they were meant (see :func:`_as_saved`)."""
    source = str(path)
    return _validate(read_pilot_text(Path(path), source), source, saved=True)[0]


def load_pilot(
    path: str | os.PathLike[str], *, check_paths: bool = True, absent_drafters: bool = False
) -> Pilot:
    """Read, validate and resolve a pilot file; every problem is a :class:`ConfigError`.

    ``absent_drafters``: a drafter folder missing here is not an error (a dry run on a
    machine without the checkpoints: the artifact check reports it)."""
    p = Path(path)
    source = str(path)
    text = read_pilot_text(p, source)
    pilot, lines = _validate(text, source)
    if not check_paths:
        return pilot
    return _resolve_paths(pilot, p.resolve().parent, source, lines, absent_drafters)


def load_pilot_text(text: str, source: str) -> Pilot:
    """A pilot from its saved text (campaign.json keeps the text a campaign ran with):
    validated, paths neither resolved nor required, names it may have been saved with read
    as they were meant (see :func:`_as_saved`); problems name ``source``."""
    return _validate(text, source, saved=True)[0]


def pilot_lines(path: str | os.PathLike[str]) -> Lines:
    """The line map of a pilot file already loaded (for errors found after validation)."""
    try:
        return parse(read_pilot_text(Path(path), str(path)), str(path))[1]
    except ConfigError:
        return {}


def where_in_pilot(path: str | os.PathLike[str], loc: tuple[str | int, ...]) -> str:
    """``file:line: dotted.loc`` of a field of a pilot file, for a later check's error."""
    return f"{_where(str(path), pilot_lines(path), loc)}: {'.'.join(map(str, loc))}"


def _as_saved(data: dict[str, Any]) -> dict[str, Any]:
    """A pilot a campaign was run with, in today's terms: an order by its former name is read
    as the order it names, and decision.primary_slice (never read by any judgement) is
    dropped, so that an old campaign re-judges as it was judged. A pilot file to run is held
    to today's names instead (its error names the new one)."""
    load = data.get("load")
    if isinstance(load, dict):
        order = load.get("order")
        if isinstance(order, str) and order in FORMER_ORDERS:
            data = {**data, "load": {**load, "order": FORMER_ORDERS[order]}}
    decision = data.get("decision")
    if isinstance(decision, dict) and "primary_slice" in decision:
        data = {**data, "decision": {k: v for k, v in decision.items() if k != "primary_slice"}}
    return data


def _validate(text: str, source: str, *, saved: bool = False) -> tuple[Pilot, Lines]:
    data, lines = parse(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the pilot file must be a mapping (key: value) at top level")
    if saved:
        data = _as_saved(data)
    try:
        pilot = Pilot.model_validate(data, context={"defer_cross_checks": True})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source, lines)) from None
    problems = cross_field_problems(pilot)
    if problems:
        raise ConfigError(
            "\n".join(
                f"{_where(source, lines, loc)}: {'.'.join(map(str, loc))}: {msg}"
                for loc, msg in problems
            )
        )
    return pilot, lines
