"""Artifact check, before any boot: does this drafter checkpoint fit this target and engine?

Reads the checkpoint folders only (configs, tokenizer files, safetensors headers), plus the
engine's version from its own Python and, for a multi-layer or Osprey EAGLE-3 draft on SGLang,
whether that SGLang serves it as trained (engines/sglang/check.py), so a mismatch costs
seconds, not a GPU boot.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines.environment import engine_environ
from ..engines.kinds import EAGLE, EAGLE3, PLAIN, EngineKind, target_kind
from ..engines.sglang.drafts import DraftLayout
from ..pilot.schema import Pilot
from ..results.pins import sha256_file
from .check import Check
from .eagle3_weights import aux_layers, draft_body, token_maps

__all__ = ["DRAFT_LAYOUT", "EAGLE", "EAGLE3", "PLAIN", "ArtifactReport", "Check", "check_all",
           "check_condition", "draft_layout", "engine_version", "family", "safetensors_header",
           "sglang_draft", "target_weights_problem"]

# The check naming a draft stock SGLang serves wrong (multi-layer, Osprey): its detail is the
# draft's description.
DRAFT_LAYOUT = "draft layout"


@dataclass
class ArtifactReport:
    condition: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        bad = self.failures()
        if not bad:
            return f"{self.condition}: artifact fits ({len(self.checks)} checks)"
        return f"{self.condition}: " + "; ".join(f"{c.name}: {c.detail}" for c in bad)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable: {exc}") from None
    return data if isinstance(data, dict) else {}


def family(config: dict[str, Any]) -> str:
    names = config.get("architectures") or []
    archs = (names if isinstance(names, str) else " ".join(map(str, names))).lower()
    if "eagle3" in archs:
        return EAGLE3
    if "eagle" in archs:
        return EAGLE
    return PLAIN


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    sub = config.get("text_config")
    return sub if isinstance(sub, dict) else config


def safetensors_header(path: Path) -> dict[str, Any]:
    """Parse a safetensors header and check the data region matches the file's size."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError("file shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n <= 0 or n > min(size - 8, 100 * 2**20):
            raise ValueError(f"implausible header length {n}")
        header: dict[str, Any] = json.loads(fh.read(n))
    try:
        end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise ValueError("malformed safetensors header") from None
    if 8 + n + end != size:
        raise ValueError(f"truncated or padded: header says {8 + n + end} bytes, file has {size}")
    return header


def target_weights_problem(pilot: Pilot) -> str | None:
    """Why the target's local weights cannot be served (a truncated or padded safetensors
    file, a shard its index names that is missing), or None: headers and sizes only, so a
    70B checkpoint is checked in milliseconds. A model id a server resolves is not checked."""
    folder = Path(pilot.target.model)
    if not target_kind(pilot).launches or not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(_json(index).get("weight_map", {}).values())
        except (ValueError, AttributeError):
            return f"target weights: {index} is not a safetensors index"
        missing = sorted(str(n) for n in shards if not (folder / str(n)).is_file())
        if missing:
            return (f"target weights: {index.name} names {len(missing)} missing shard(s) "
                    f"({', '.join(missing[:3])}); the checkpoint is incomplete")
    for path in sorted(folder.glob("*.safetensors")):
        try:
            safetensors_header(path)
        except (OSError, ValueError) as exc:
            return f"target weights: {path}: {exc}; copy the checkpoint again"
    return None


def _vocab_digest(folder: Path) -> str | None:
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        return None
    data = _json(tok)  # may raise ValueError: the caller reports it as a failed check
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    blob = json.dumps(vocab if vocab is not None else data, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def engine_version(pilot: Pilot) -> str | None:
    """The engine's version as its own Python reports it (servers may live in another venv)."""
    dist = list(target_kind(pilot).distributions)
    if not dist:
        return None
    python = pilot.target.python or sys.executable
    code = (
        "import importlib.metadata as m, sys\n"
        f"for d in {dist!r}:\n"
        "    try: print(m.version(d)); sys.exit(0)\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=False,
            env=engine_environ(pilot.target.env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def draft_layout(dcfg: dict[str, Any]) -> DraftLayout | None:
    """The layout of an EAGLE-3 draft's config (None for another family)."""
    if family(dcfg) != EAGLE3:
        return None
    names = dcfg.get("architectures") or []
    names = [names] if isinstance(names, str) else [str(a) for a in names]
    arch = next((a for a in names if "eagle3" in a.lower()), names[0] if names else "")
    text = _text_config(dcfg)
    layers = text.get("num_hidden_layers")
    return DraftLayout(arch, layers if isinstance(layers, int) and layers > 0 else 1,
                       text.get("swap_h_and_emb") is True)


def sglang_draft(pilot: Pilot, name: str) -> DraftLayout | None:
    """The layout of ``name``'s drafter where SGLang serves it as EAGLE3 and stock SGLang
    cannot (see :attr:`DraftLayout.needs_patch`); None otherwise or where its config is not
    here to read."""
    cond = pilot.conditions[name]
    spec = cond.speculation
    patched = target_kind(pilot).patched_algorithm
    if patched is None or cond.drafter is None or spec is None or spec.algorithm != patched:
        return None
    try:
        layout = draft_layout(_json(Path(cond.drafter) / "config.json"))
    except (ValueError, OSError):
        return None
    return layout if layout is not None and layout.needs_patch else None


def check_condition(pilot: Pilot, name: str, version: str | None = None) -> ArtifactReport:
    """All checks for one condition; conditions without a drafter pass trivially."""
    cond = pilot.conditions[name]
    report = ArtifactReport(name)
    kind = target_kind(pilot)
    spec = cond.speculation
    algorithm = (spec.algorithm if spec else None) or kind.default_algorithm
    if cond.endpoint is not None or not cond.speculates:
        return report
    if algorithm in kind.no_drafter:
        report.checks.append(Check("algorithm", True, f"{algorithm} needs no drafter"))
        return report
    accepted = kind.accepts(algorithm)
    if accepted is None:
        valid = sorted(kind.algorithms)
        report.checks.append(Check(
            "algorithm", False,
            f"{kind.name} has no algorithm {algorithm!r}; valid: {', '.join(valid)}",
        ))
        return report
    drafter = cond.drafter
    if drafter is None:
        report.checks.append(Check("drafter", False, f"{algorithm} needs a drafter checkpoint"))
        return report
    if not drafter.is_dir():
        # Only a dry run gets this far (a run refuses the pilot): say what was not checked.
        report.checks.append(Check("drafter", False, (
            f"{drafter}: no such folder on this machine, so the checkpoint was not checked; "
            "run the check where the drafter is")))
        return report
    target_dir = Path(pilot.target.model)
    try:
        dcfg = _json(drafter / "config.json")
        tcfg = _json(target_dir / "config.json") if target_dir.is_dir() else {}
    except ValueError as exc:
        report.checks.append(Check("config", False, str(exc)))
        return report
    if not dcfg:
        report.checks.append(Check("config", False, f"{drafter}/config.json is missing"))
        return report

    fam = family(dcfg)
    if fam == PLAIN and algorithm in kind.renamed_heads:
        check, fam = _renamed_head(drafter, dcfg, algorithm, kind.renamed_heads[algorithm])
        report.checks.append(check)
    else:
        report.checks.append(_architecture(dcfg, fam, accepted, kind, algorithm))

    if tcfg:
        t_text, d_text = _text_config(tcfg), _text_config(dcfg)
        tv, dv = t_text.get("vocab_size"), d_text.get("vocab_size")
        token_map = "draft_vocab_size" in d_text or (drafter / "d2t.npy").exists()
        same_vocab = tv == dv
        report.checks.append(Check(
            "vocabulary",
            same_vocab or token_map,
            f"target vocab_size {tv}, drafter vocab_size {dv}"
            + ("" if same_vocab else (" (token map present)" if token_map else ", no token map")),
        ))
        try:
            t_tok, d_tok = _vocab_digest(target_dir), _vocab_digest(drafter)
        except ValueError as exc:
            t_tok = d_tok = None
            report.checks.append(Check("tokenizer", False, str(exc)))
        if t_tok and d_tok:
            report.checks.append(Check(
                "tokenizer", t_tok == d_tok or token_map,
                f"target tokenizer {t_tok}, drafter tokenizer {d_tok}",
            ))
        if fam in (EAGLE, EAGLE3):
            want = t_text.get("hidden_size")
            got = d_text.get("target_hidden_size", d_text.get("hidden_size"))
            what = "its fc reads 3 target layers of" if fam == EAGLE3 else "it reads"
            key = "target_hidden_size" if "target_hidden_size" in d_text else "hidden_size"
            report.checks.append(Check(
                "hidden size", want == got,
                f"drafter expects target hidden size {got} ({what} that width), "
                f"target has {want}" + ("" if want == got else (
                    f": its {key} is another target's; use a draft trained on this target's "
                    "hidden states")),
            ))
    else:
        report.checks.append(Check(
            "target config", True, f"{target_dir} is not a local folder: compatibility checked "
            "against the drafter alone",
        ))

    weights = sorted(drafter.glob("*.safetensors"))
    if not weights:
        report.checks.append(Check("weights", False, f"no *.safetensors in {drafter}"))
    headers: dict[Path, dict[str, Any]] = {}
    for w in weights:
        try:
            headers[w] = safetensors_header(w)
            tensors = sum(k != "__metadata__" for k in headers[w])
            report.checks.append(Check("weights", True, f"{w.name}: {tensors} tensors"))
        except (ValueError, OSError, json.JSONDecodeError) as exc:
            report.checks.append(Check("weights", False, f"{w.name}: {exc}"))
    if fam == EAGLE3 and fam in accepted and tcfg and len(headers) == len(weights):
        d_text, t_text = _text_config(dcfg), _text_config(tcfg)
        report.checks.append(aux_layers(d_text, t_text, headers))
        report.checks.extend(token_maps(d_text, t_text, headers))
        report.checks.extend(draft_body(d_text, t_text, headers))

    for rel, expected in cond.pins.sha256.items():
        path = drafter / rel
        got = sha256_file(path) if path.is_file() else "missing"
        report.checks.append(Check(
            f"sha256 {rel}", got == expected.lower(), f"expected {expected}, found {got}"
        ))
    if cond.pins.engine_version:
        want = cond.pins.engine_version
        found = version or "unknown (engine not importable)"
        # A prefix on a component boundary: pin 0.5.2 does not accept 0.5.23.
        fits = version is not None and version.startswith(want) and not (
            version[len(want):len(want) + 1].isdigit() and want[-1:].isdigit()
        )
        report.checks.append(Check("engine version", fits, f"pinned {want}, found {found}"))
    if cond.pins.require_license:
        lic = [p.name for p in drafter.iterdir()
               if p.name.upper().startswith(("LICENSE", "COPYING"))]
        report.checks.append(Check(
            "license", bool(lic), f"license file: {', '.join(lic) or 'none in ' + str(drafter)}"
        ))
    return report


def _fc_shape(drafter: Path) -> list[int] | None:
    """The shape of an EAGLE head's ``fc.weight`` (it reads the target's hidden states)."""
    for w in sorted(drafter.glob("*.safetensors")):
        try:
            header = safetensors_header(w)
        except (ValueError, OSError, json.JSONDecodeError):
            continue
        for key, entry in header.items():
            if (key == "fc.weight" or key.endswith(".fc.weight")) and isinstance(entry, dict):
                shape = entry.get("shape")
                return [int(v) for v in shape] if isinstance(shape, list) else []
    return None


def _renamed_head(drafter: Path, dcfg: dict[str, Any], algorithm: str,
                  head: str) -> tuple[Check, str]:
    """A LlamaForCausalLM config under vLLM's eagle/eagle3: an EAGLE head if its weights
    have the fc that reads the target's hidden states, else a plain LM given by mistake."""
    archs = dcfg.get("architectures")
    shape = _fc_shape(drafter)
    if shape is None:
        return Check("architecture", False, (
            f"drafter {archs} has no fc.weight: a plain causal LM, not an {algorithm} head; "
            "vLLM drafts with it as speculation.algorithm draft_model")), PLAIN
    return Check("architecture", True, (
        f"drafter {archs} is an EAGLE head (fc.weight {shape}); vLLM loads a "
        f"LlamaForCausalLM config as its {algorithm} draft model")), head


def _architecture(
    dcfg: dict[str, Any], fam: str, accepted: frozenset[str], kind: EngineKind, algorithm: str
) -> Check:
    archs = dcfg.get("architectures")
    detail = (f"drafter {archs} is a {fam} drafter; {kind.name} {algorithm} takes "
              f"{', '.join(sorted(accepted))}")
    classes = kind.eagle3_classes
    if EAGLE3 in accepted and fam == PLAIN:
        need = f"a {classes[0]} checkpoint" if classes else "an EAGLE-3 checkpoint"
        return Check("architecture", False, (
            f"{detail}: {need} (fc over the target's hidden states, one midlayer, d2t/t2d "
            f"vocabulary maps); a plain causal LM drafts with speculation.algorithm "
            f"{kind.plain_algorithm} instead"))
    if classes and fam == EAGLE3 and fam in accepted:
        # Only SGLang names its EAGLE-3 draft classes, so the wording is SGLang's.
        names = archs if isinstance(archs, list) else [archs]
        patched = [a for a in names if isinstance(a, str) and a in kind.patched_eagle3]
        if patched:
            return Check("architecture", True, (
                f"drafter {archs} is an eagle3 drafter stock SGLang has no class for: it is "
                f"served by an SGLang with the drafter's patch applied (module "
                f"{kind.patched_eagle3[patched[0]]}), checked in the condition's environment"))
        if not any(a in classes for a in names):
            return Check("architecture", False, (
                f"drafter {archs} is an eagle3 drafter SGLang has no class for; its EAGLE3 "
                f"drafts are {', '.join(classes)} (set architectures in config.json)"))
    return Check("architecture", fam in accepted, detail)


def check_all(pilot: Pilot, conditions: list[str]) -> dict[str, ArtifactReport]:
    needs_version = any(pilot.conditions[c].pins.engine_version for c in conditions)
    version = engine_version(pilot) if needs_version else None
    reports = {c: check_condition(pilot, c, version) for c in conditions}
    for c in conditions:
        layout = sglang_draft(pilot, c)
        if layout is not None:
            # Recorded as data: the diagnosis of an accept length near 1 reads it.
            reports[c].checks.append(Check(DRAFT_LAYOUT, True, layout.describe()))
            serving = target_kind(pilot).serving
            if pilot.conditions[c].endpoint is None and serving is not None:
                # Whether the engine it boots serves the draft as trained (for SGLang:
                # engines/sglang/check.py).
                said = serving(pilot, c, layout)
                reports[c].checks.append(Check("serving engine", said.ok, said.detail))
    return reports
