"""Reading pilot.yaml: YAML with line numbers, validation errors that name the file, line and
field, and paths resolved against the pilot file's folder."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from .schema import _UNION_TAGS, ConfigError, Pilot, _cross_field_problems


class _Loader(yaml.SafeLoader):
    """SafeLoader whose value errors (bad dates, over-long ints, bad tags, lone surrogates
    from escapes like "\\ud800") carry a line instead of escaping as raw exceptions."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            data = super().construct_object(node, deep)
            if isinstance(data, str):
                data.encode("utf-8")  # reports are written as UTF-8 later
            return data
        except yaml.YAMLError:
            raise
        except Exception as exc:  # PyYAML's own: ValueError, KeyError ("!!bool maybe"), ...
            value = str(node.value)
            short = value if len(value) <= 40 else value[:37] + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.tag} value {short!r}: {exc}", node.start_mark
            ) from None


def _parse(text: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The YAML's data and its line map, from one parse (pure-Python PyYAML is slow)."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return data, _line_map(root)


def _line_map(root: yaml.Node | None) -> dict[tuple[str, ...], int]:
    """Dotted path (parts as strings) -> 1-based line of its YAML node (keys and items)."""
    lines: dict[tuple[str, ...], int] = {}
    seen: set[int] = set()

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:  # an alias: walked once (recursive and "billion laughs" safe)
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, str(i)))

    if root is not None:
        walk(root, ())
    return lines


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


def _format_errors(err: ValidationError, source: str, lines: Mapping[tuple[str, ...], int]) -> str:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and (
            p.startswith("function-") or p in _UNION_TAGS)))
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
        out.append(f"{where}: {dotted}: {msg}")
    return "\n".join(out)


def _resolve_paths(
    pilot: Pilot, base: Path, source: str, lines: Mapping[tuple[str, ...], int]
) -> Pilot:
    """Relative paths resolve against the pilot file's folder; missing paths are errors."""

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
            if not os.path.isdir(drafter):
                raise fail(("conditions", name, "drafter"), f"no such directory: {drafter}")
        if cond.endpoint is None and target.engine == "endpoint":
            raise fail(("conditions", name), "target.engine is endpoint: give endpoint.url")
        conditions[name] = cond.model_copy(update={"drafter": drafter})
    return pilot.model_copy(
        update={
            "trace": pilot.trace.model_copy(update={"files": files}),
            "target": target.model_copy(update={"model": model, "python": python}),
            "conditions": conditions,
        }
    )


def load_pilot_unchecked(path: str | os.PathLike[str]) -> Pilot:
    """A pilot whose limits are all that matter (re-judging a saved campaign): validated like
    :func:`load_pilot`, but its paths are neither resolved nor required to exist."""
    return load_pilot(path, check_paths=False)


def load_pilot(path: str | os.PathLike[str], *, check_paths: bool = True) -> Pilot:
    """Read, validate and resolve a pilot file; every problem is a :class:`ConfigError`."""
    p = Path(path)
    source = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such pilot file") from None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a NUL in the path
        raise ConfigError(f"{source}: cannot read: {exc}") from None
    try:
        data, lines = _parse(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the pilot file must be a mapping (key: value) at top level")
    try:
        pilot = Pilot.model_validate(data, context={"defer_cross_checks": True})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source, lines)) from None
    problems = _cross_field_problems(pilot)
    if problems:
        raise ConfigError(
            "\n".join(
                f"{_where(source, lines, loc)}: {'.'.join(map(str, loc))}: {msg}"
                for loc, msg in problems
            )
        )
    if not check_paths:
        return pilot
    return _resolve_paths(pilot, p.resolve().parent, source, lines)
