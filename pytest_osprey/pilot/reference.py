"""Render references from pydantic models themselves (docs/pilot-reference.md from the pilot
schema, docs/summary-json.md from the summary.json models), so the documentation cannot drift
from the code."""

from __future__ import annotations

from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .schema import Pilot

INTRO = """# pilot.yaml reference

Generated from the schema (`python -m pytest_osprey reference`); a test keeps it current.
Unknown keys are errors. Relative paths resolve against the pilot file's folder.
`python -m pytest_osprey schema` prints the JSON Schema for editor completion.
"""


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if origin is None:
        return getattr(annotation, "__name__", str(annotation))
    name = getattr(origin, "__name__", str(origin))
    if name in ("Union", "UnionType"):
        return " or ".join(_type_name(a) for a in args)
    if name == "Literal":
        return " \\| ".join(repr(a) for a in args)
    if name == "Annotated":
        return _type_name(args[0])
    return f"{name}[{', '.join(_type_name(a) for a in args)}]"


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(built)"
        if isinstance(value, BaseModel):
            return "(defaults)"
        return f"`{value!r}`"
    if field.default is PydanticUndefined:
        return ""
    return f"`{field.default!r}`"


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for field in model.model_fields.values():
            for sub in _nested(field.annotation):
                walk(sub)

    walk(root)
    return seen


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _nested(a)]


def render_models(
    root: type[BaseModel], intro: str, *, defaults: bool = True, paragraph: bool = False
) -> str:
    """One section per model reachable from ``root``: the first line of its docstring (the
    first paragraph with ``paragraph``), then a table of each field's key (its alias where it
    has one), type, default (unless ``defaults`` is False) and description."""
    parts = [intro]
    for model in _models(root):
        parts.append(f"## {model.__name__}\n")
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith("!!!") and "BaseModel" not in doc:
            lead = " ".join(doc.split("\n\n")[0].split()) if paragraph else doc.splitlines()[0]
            parts.append(lead + "\n")
        parts.append("| key | type | default | meaning |\n|---|---|---|---|" if defaults
                     else "| key | type | meaning |\n|---|---|---|")
        for name, field in model.model_fields.items():
            desc = " ".join((field.description or "").split()).replace("|", "\\|")
            default = f" {_default(field)} |" if defaults else ""
            parts.append(f"| `{field.alias or name}` | {_type_name(field.annotation)} |"
                         f"{default} {desc} |")
        parts.append("")
    return "\n".join(parts)


def render() -> str:
    """docs/pilot-reference.md."""
    return render_models(Pilot, INTRO)
