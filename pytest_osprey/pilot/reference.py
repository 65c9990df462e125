"""Render references from pydantic models themselves (docs/pilot-reference.md from the pilot
schema, docs/summary-json.md from the summary.json models), so the documentation cannot drift
from the code."""

from __future__ import annotations

from typing import Any, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .schema import Pilot

INTRO = """# pilot.yaml reference

Generated from the schema (`python -m pytest_osprey reference`); a test keeps it current.
Unknown keys are errors, and so are repeated keys and keys YAML reads as something other
than a name (`yes:`, `on:`, `~:`, `1:`: quote them). Types are strict: a count is an integer
written as one (`2`, not `'2'` or `true`), a flag is `true`/`false`. Every number, list and
text has the bounds shown. A pilot file may be at most 1 MiB. Relative paths resolve against
the pilot file's folder. `python -m pytest_osprey schema` prints the JSON Schema for editor
completion.

**A pilot file is code.** `target.python`, `target.env` (`PYTHONPATH` above all),
`engine_args` and the model and drafter folders choose what runs, in the dry run too (SGLang's
argument parser, package versions): treat a pilot like a CI workflow and review changes to it
as such. Every interpreter the pilot names starts from this process's environment less
anything that could be a credential: only an allow-list passes (`PATH`, `HOME`, locale, temp
folders, certificate bundles, `LD_LIBRARY_PATH`, and the prefixes `CUDA_` `NVIDIA_` `ROCM_`
`HIP_` `HSA_` `OMP_` `MKL_` `KMP_` `OPENBLAS_` `TORCH` `TRITON_` `SGLANG_` `SGL_` `VLLM_`
`FLASHINFER_` `OSPREY_` `LC_` `XDG_`), and never a name with TOKEN, SECRET, PASSW, CREDENTIAL,
API_KEY, ACCESS_KEY, PRIVATE, AUTH, SESSION or COOKIE in it. What the pilot's `env` sets
passes as written (e.g. `HF_TOKEN: ...` for a gated model): that is the pilot's choice. The
dry run prints each command line and which variables were withheld. `--host`, `--port`,
`--uds` and `--unix-socket` in `engine_args` are refused: the bind is `target.host`'s, and one
beyond loopback draws a warning.
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


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _bounds(metadata: list[Any], what: str = "") -> str:
    """``1 to 1,000,000``, ``> 0, ≤ 604,800``, ``≤ 64 long`` from pydantic's constraints;
    ``what`` names what a length counts (entries of a list or mapping)."""
    low: tuple[str, Any] | None = None
    high: tuple[str, Any] | None = None
    length = None
    for m in metadata:
        for c in getattr(m, "metadata", None) or [m]:  # a FieldInfo inside Annotated
            if isinstance(c, at.Ge):
                low = ("≥", c.ge)
            elif isinstance(c, at.Gt):
                low = (">", c.gt)
            elif isinstance(c, at.Le):
                high = ("≤", c.le)
            elif isinstance(c, at.Lt):
                high = ("<", c.lt)
            elif isinstance(c, at.MaxLen) or getattr(c, "max_length", None) is not None:
                length = c.max_length
    parts = []
    if low and high and low[0] == "≥" and high[0] == "≤":
        parts.append(f"{_num(low[1])} to {_num(high[1])}")
    else:
        parts += [f"{bound[0]} {_num(bound[1])}" for bound in (low, high) if bound]
    if length is not None:
        parts.append(f"≤ {length:,} {what or 'long'}")
    return ", ".join(parts)


def _bounded_type(field: Any) -> str:
    """The type with its bounds: the field's own, then its keys', values' or items'."""
    ann = field.annotation
    if get_origin(ann) not in (list, dict):  # X | None: the bounds of X
        ann = next((a for a in get_args(ann) if get_origin(a) in (list, dict)), ann)
    kind = get_origin(ann)
    container = kind in (list, dict)
    parts = [_bounds(field.metadata, "entries" if container else "")]
    names = ("keys", "values") if kind is dict else ("items", "items")
    for i, a in enumerate(get_args(ann)):
        inner = _bounds(list(getattr(a, "__metadata__", ())))
        if inner:
            parts.append(f"{names[min(i, 1)]} {inner}" if container else inner)
    shown = "; ".join(p for p in parts if p)
    return _type_name(field.annotation) + (f" ({shown})" if shown else "")


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
    root: type[BaseModel], intro: str, *, defaults: bool = True, paragraph: bool = False,
    bounds: bool = False,
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
            kind = _bounded_type(field) if bounds else _type_name(field.annotation)
            parts.append(f"| `{field.alias or name}` | {kind} |{default} {desc} |")
        parts.append("")
    return "\n".join(parts)


def render() -> str:
    """docs/pilot-reference.md."""
    return render_models(Pilot, INTRO, bounds=True)
