"""Reading a pilot file's YAML: bounded in size, with line numbers, and stricter than YAML.

YAML lets a repeated key silently replace the first (a second ``limits:`` block would decide
the run) and reads unquoted ``yes``/``no``/``on``/``off``/``~``/``1`` keys as booleans,
null or numbers: both are refused here, naming the lines, before any validation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .base import ConfigError

MAX_PILOT_BYTES = 1 << 20
"""A pilot file is a page of settings: anything over 1 MiB is refused before it is parsed."""

Lines = dict[tuple[str, ...], int]

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_KEY_KINDS = {
    "tag:yaml.org,2002:bool": "the boolean {value}",
    "tag:yaml.org,2002:null": "null (no value)",
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:timestamp": "a date",
}


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
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.tag} value {_short(node.value)!r}: {exc}",
                node.start_mark,
            ) from None


def _short(value: object, n: int = 40) -> str:
    text = str(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def read_pilot_text(path: Path, source: str) -> str:
    """The pilot file's text: at most :data:`MAX_PILOT_BYTES`, UTF-8 (a BOM is dropped)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            # Checked before reading: a 50 MB file is refused at once, not parsed for a minute.
            data = fh.read(MAX_PILOT_BYTES + 1) if size <= MAX_PILOT_BYTES else b""
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such pilot file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"{source}: cannot read: {_oserror(exc)}") from None
    if size > MAX_PILOT_BYTES:
        raise ConfigError(f"{source}: the file is {size:,} bytes; a pilot file may be at most "
                          f"{MAX_PILOT_BYTES // 2**20} MiB")
    if len(data) > MAX_PILOT_BYTES:  # a pipe or device reports no size
        raise ConfigError(f"{source}: more than {MAX_PILOT_BYTES // 2**20} MiB; a pilot file "
                          "may be at most that")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{source}:{line}: cannot read: not valid utf-8 (byte "
                          f"0x{data[exc.start]:02x}); save the file as UTF-8") from None


def _oserror(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def parse(text: str, source: str) -> tuple[Any, Lines]:
    """The YAML's data and its line map (dotted path -> 1-based line), from one parse; every
    problem is a :class:`ConfigError` naming ``source`` and the line."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PILOT_BYTES:
        raise ConfigError(f"{source}: more than {MAX_PILOT_BYTES // 2**20} MiB; a pilot file "
                          "may be at most that")
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks the characters at once
        root = loader.get_single_node()
        if root is not None:
            _check_keys(root, source)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
            where = f"{source}:{text.count(chr(10), 0, exc.position) + 1}"
            problem = f"character U+{exc.character:04X} is not allowed ({exc.reason})"
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, _line_map(root)


def _check_keys(root: yaml.Node, source: str) -> None:
    """Every mapping's keys: plain names, each once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:  # an alias: checked once (recursive and "billion laughs" safe)
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        if not isinstance(node, yaml.MappingNode):
            continue
        first: dict[str, int] = {}
        for key, value in node.value:
            stack.append(value)
            line = key.start_mark.line + 1
            if key.tag == _MERGE:
                continue
            if not isinstance(key, yaml.ScalarNode):
                raise ConfigError(f"{source}:{line}: a key must be a plain name, not a "
                                  "list or mapping")
            if key.tag != _STR:
                raise ConfigError(_key_kind_message(source, line, key))
            name = str(key.value)
            if name in first:
                raise ConfigError(
                    f"{source}:{line}: duplicate key {_short(name)!r} (first at line "
                    f"{first[name]}); YAML would silently keep only the last one: merge them")
            first[name] = line


def _key_kind_message(source: str, line: int, key: yaml.ScalarNode) -> str:
    value = str(key.value)
    kind = _KEY_KINDS.get(key.tag, f"a {key.tag.rsplit(':', 1)[-1]} value")
    if key.tag == "tag:yaml.org,2002:bool":
        kind = kind.format(value=str(yaml.safe_load(value)).lower() if value else value)
    shown = _short(value) or "(empty)"
    return (f"{source}:{line}: the key {shown} is read by YAML as {kind}, not a name; "
            f"quote it ('{_short(value)}':) to use it as a name")


def _line_map(root: yaml.Node | None) -> Lines:
    """Dotted path (parts as strings) -> 1-based line of its YAML node (keys and items)."""
    lines: Lines = {}
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
