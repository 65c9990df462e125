"""Correctness: apply each prompt's ``expect`` check (prompts/README.md) and gate on it.

The checks are defined in prompts/README.md, section "expect"; this module implements exactly
those semantics. The gate counts the answers a candidate newly gets wrong on the prompts the
reference got right (paired, same prompts) and judges them by the exact binomial loss rule of
:mod:`..stats.losses`: gains never offset losses, and a set on which the reference got nothing
right is not evaluable.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...pilot.trace import Prompt
from ...results.records import RequestRecord
from ..gates.result import Outcome
from ..stats.losses import LossTest, loss_test
from .identity import first_ok_greedy, rerun_greedy

# A number: optional sign (not when glued to a word, as in "3-4"), digits with or without
# thousands separators, an optional fraction and exponent. "\u2212" is the Unicode minus.
_NUMBER = re.compile(
    r"(?:(?<![\w.])[-+\u2212])?"
    r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|(?:(?<![\w.])[-+\u2212])?(?<![\w.])\.\d+(?:[eE][-+]?\d+)?"
)
_FENCE = re.compile(r"\A```[^\n`]*\n(.*?)\n?```\Z", re.DOTALL)


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    detail: str


def last_number(text: str) -> float | None:
    """The last number in ``text`` (thousands separators removed), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    raw = found[-1].replace(",", "").replace("\u2212", "-")
    try:
        return float(raw)
    except ValueError:  # pragma: no cover - the pattern only matches numbers
        return None


def strip_fence(text: str) -> str:
    """The text inside one surrounding Markdown code fence (```json ... ```), else the text."""
    stripped = text.strip()
    m = _FENCE.match(stripped)
    return m.group(1) if m else stripped


def _short(text: str, width: int = 80) -> str:
    text = text.strip()
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def _exact(expect: Mapping[str, Any], output: str, _: Prompt | None) -> CheckResult:
    value = expect["value"]
    ok = output.strip() == value
    return CheckResult(ok, f"output {'equals' if ok else 'is ' + _short(output) + ', not'} "
                           f"{value!r}")


def _contains(expect: Mapping[str, Any], output: str, _: Prompt | None) -> CheckResult:
    value: str = expect["value"]
    sensitive = expect.get("case_sensitive")
    sensitive = True if sensitive is None else bool(sensitive)
    ok = value in output if sensitive else value.casefold() in output.casefold()
    how = "" if sensitive else " (ignoring case)"
    return CheckResult(ok, f"{value!r} {'found' if ok else 'not found'} in output{how}")


def _regex(expect: Mapping[str, Any], output: str, _: Prompt | None) -> CheckResult:
    pattern: str = expect["pattern"]
    try:
        m = re.search(pattern, output)
    except re.error as exc:
        return CheckResult(False, f"pattern {pattern!r} does not compile: {exc}")
    if m:
        return CheckResult(True, f"/{pattern}/ matches {_short(m.group(0), 40)}")
    return CheckResult(False, f"/{pattern}/ does not match {_short(output)}")


def _number(expect: Mapping[str, Any], output: str, _: Prompt | None) -> CheckResult:
    value = float(expect["value"])
    tolerance = float(expect.get("tolerance") or 0.0)
    got = last_number(output)
    if got is None:
        return CheckResult(False, f"no number in output {_short(output)} (expected {value:g})")
    # rel_tol absorbs float representation only (0.1 + 0.2); the declared tolerance is absolute.
    ok = math.isclose(got, value, rel_tol=1e-9, abs_tol=tolerance)
    within = f" +/- {tolerance:g}" if tolerance else ""
    return CheckResult(ok, f"last number {got:g} {'is' if ok else 'is not'} {value:g}{within}")


def _json_schema(expect: Mapping[str, Any], output: str, _: Prompt | None) -> CheckResult:
    try:
        import jsonschema
    except ImportError:
        return CheckResult(False, "jsonschema not installed: `pip install jsonschema` to run "
                                  "json_schema checks")
    text = strip_fence(output)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return CheckResult(False, f"output is not JSON ({exc.msg} at line {exc.lineno} "
                                  f"column {exc.colno}): {_short(text)}")
    schema = expect["schema"]
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        errors = sorted(cls(schema).iter_errors(data), key=lambda e: list(e.absolute_path))
    except jsonschema.SchemaError as exc:
        return CheckResult(False, f"the expect schema itself is invalid: {exc.message}")
    if not errors:
        return CheckResult(True, "output is JSON valid against the schema")
    where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return CheckResult(False, f"JSON does not match the schema at {where}: "
                              f"{errors[0].message}{more}")


def load_function(path: str) -> Callable[..., Any]:
    """Import ``package.module:function`` (the function part may be dotted, e.g. Class.meth)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not of the form 'package.module:function'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def _python(expect: Mapping[str, Any], output: str, prompt: Prompt | None) -> CheckResult:
    path: str = expect["function"]
    try:
        fn = load_function(path)
    except Exception as exc:  # any import-time failure is the check's failure, with its cause
        return CheckResult(False, f"cannot load {path}: {type(exc).__name__}: {exc}")
    try:
        result = fn(prompt, output)
    except Exception as exc:
        return CheckResult(False, f"{path} raised {type(exc).__name__}: {exc}")
    return CheckResult(bool(result), f"{path} returned {result!r}")


_CHECKS: dict[str, Callable[[Mapping[str, Any], str, Prompt | None], CheckResult]] = {
    "exact": _exact,
    "contains": _contains,
    "regex": _regex,
    "number": _number,
    "json_schema": _json_schema,
    "python": _python,
}


def check(expect: Mapping[str, Any], output: str, prompt: Prompt | None = None) -> CheckResult:
    """Apply one ``expect`` to an output text. ``python`` functions get ``(prompt, output)``."""
    kind = expect.get("type")
    fn = _CHECKS.get(kind) if isinstance(kind, str) else None
    if fn is None:
        return CheckResult(False, f"unknown expect type {kind!r}; valid: {', '.join(_CHECKS)}")
    try:
        return fn(expect, output, prompt)
    except (KeyError, TypeError, ValueError) as exc:  # a malformed expect the loader missed
        return CheckResult(False, f"malformed expect {dict(expect)!r}: {exc}")


def correctness_by_prompt(
    records: Sequence[RequestRecord], prompts_by_id: Mapping[str, Prompt]
) -> dict[str, bool]:
    """Prompt id -> passed, for prompts with an ``expect`` (first ok greedy record each)."""
    return {pid: r.passed for pid, r in _checked(records, prompts_by_id).items()}


def _checked(
    records: Sequence[RequestRecord], prompts_by_id: Mapping[str, Prompt]
) -> dict[str, CheckResult]:
    out: dict[str, CheckResult] = {}
    for pid, rec in first_ok_greedy(records).items():
        prompt = prompts_by_id.get(pid)
        if prompt is not None and prompt.expect is not None:
            out[pid] = check(prompt.expect, rec.output_text, prompt)
    return out


@dataclass(frozen=True)
class SliceRates:
    n: int
    reference_rate: float
    candidate_rate: float


@dataclass(frozen=True)
class CorrectnessResult:
    """Losses of the candidate on the prompts the reference answered right (module doc)."""

    outcome: Outcome
    n_pairs: int  # checked prompts completed on both sides
    reference_rate: float | None
    candidate_rate: float | None
    test: LossTest | None
    per_slice: dict[str, SliceRates] = field(default_factory=dict)
    losses: dict[str, str] = field(default_factory=dict)  # ref passed, candidate failed: why
    gains: list[str] = field(default_factory=list)
    control_losses: int | None = None  # the reference against its own rerun (None: no rerun)
    control_at_risk: int | None = None
    summary: str = ""


def correctness_gate(
    reference_records: Sequence[RequestRecord],
    candidate_records: Sequence[RequestRecord],
    prompts_by_id: Mapping[str, Prompt],
    max_loss_rate: float,
    alpha: float,
) -> CorrectnessResult:
    """Does the candidate newly get answers wrong that the reference got right?

    Pairs are the prompts with an ``expect`` that completed (ok, greedy) on both sides. "skip"
    when no prompt has an ``expect`` or the reference passed none of the paired checks (not
    evaluable: nothing could be lost); "fail" when some have one but none completed on both
    sides; otherwise the loss rule (:func:`losses.loss_test`) at ``alpha``. The reference's
    own rerun (another block or load level), where recorded, is judged the same way as an
    identical-condition control: losses there are numerics, not the drafter.
    """
    with_expect = [pid for pid, p in prompts_by_id.items() if p.expect is not None]
    if not with_expect:
        return CorrectnessResult("skip", 0, None, None, None,
                                 summary="not evaluable: no prompt has an expect check")
    ref = _checked(reference_records, prompts_by_id)
    cand = _checked(candidate_records, prompts_by_id)
    ids = [pid for pid in with_expect if pid in ref and pid in cand]
    if not ids:
        return CorrectnessResult(
            "fail", 0, None, None, None,
            summary=f"none of the {len(with_expect)} prompts with an expect completed on both "
                    "sides: nothing to compare")
    r_pass = [ref[p].passed for p in ids]
    c_pass = [cand[p].passed for p in ids]
    slices: dict[str, list[tuple[bool, bool]]] = {}
    for pid, a, b in zip(ids, r_pass, c_pass, strict=True):
        slices.setdefault(prompts_by_id[pid].slice, []).append((a, b))
    per_slice = {
        name: SliceRates(len(v), sum(a for a, _ in v) / len(v), sum(b for _, b in v) / len(v))
        for name, v in slices.items()
    }
    losses = {p: cand[p].detail for p in ids if ref[p].passed and not cand[p].passed}
    gains = [p for p in ids if cand[p].passed and not ref[p].passed]
    at_risk = sum(r_pass)
    test = loss_test(at_risk, len(losses), max_loss_rate, alpha)
    r_rate, c_rate = at_risk / len(ids), sum(c_pass) / len(ids)
    rerun = _checked(list(rerun_greedy(reference_records).values()), prompts_by_id)
    shared = [p for p in ids if p in rerun and ref[p].passed]
    control = sum(not rerun[p].passed for p in shared) if shared else None
    rates = (f"pass rate {c_rate:.0%} vs reference {r_rate:.0%} on {len(ids)} checked prompts; "
             f"{len(gains)} newly right (never offsets a loss)")
    if test.outcome == "skip":
        summary = (f"not evaluable: the reference passed none of the {len(ids)} checked prompts, "
                   f"so no answer could be lost; {rates}")
    else:
        power = ", ".join(f"{q:.0%}: {v:.0%}" for q, v in test.power.items())
        verdict = (f"{len(losses)} of {test.at_risk} answers the reference got right are now "
                   f"wrong (fail above {test.critical}"
                   + (f", tolerated loss rate {max_loss_rate:.1%}" if max_loss_rate else "")
                   + f"); loss rate <= {test.upper:.0%} with {1 - alpha:.1%} confidence; power "
                   f"to catch a drafter breaking {power}")
        summary = f"{verdict}; {rates}"
        if control is not None:
            summary += (f"; identical-condition control (reference rerun): {control} of "
                        f"{len(shared)} lost")
    if len(per_slice) > 1:
        summary += "; " + ", ".join(
            f"{k}: {s.candidate_rate:.0%} vs {s.reference_rate:.0%} (n={s.n})"
            for k, s in per_slice.items()
        )
    for pid, why in list(losses.items())[:3]:
        summary += f"\n  {pid}: {why}"
    return CorrectnessResult(
        test.outcome, len(ids), r_rate, c_rate, test, per_slice, losses, gains, control,
        len(shared) if control is not None else None, summary,
    )
