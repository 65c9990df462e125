"""Whether an EAGLE-3 draft's weights fit its target: the target layers its fc reads, the
draft-vocabulary maps (``d2t``/``t2d``), the decoder layers its config declares, and the
embedding an Osprey draft carries of its own. Read from safetensors headers (and the small
integer maps), never the weights themselves."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

from .check import Check


def _layer_ids(d_text: dict[str, Any]) -> Any:
    eagle = d_text.get("eagle_config")
    if isinstance(eagle, dict) and "eagle_aux_hidden_state_layer_ids" in eagle:
        return eagle["eagle_aux_hidden_state_layer_ids"]
    return d_text.get("eagle_aux_hidden_state_layer_ids")


def aux_layers(
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
    code = {"I64": "q", "I32": "i", "BOOL": "B", "U8": "B"}.get(entry.get("dtype"))
    if code is None:
        return None
    start, end = (int(x) for x in entry["data_offsets"])
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + n + start)
        raw = fh.read(end - start)
    count = len(raw) // struct.calcsize(code)
    return list(struct.unpack(f"<{count}{code}", raw))


def token_maps(
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
    if d2t is not None and t2d is not None and not problems:
        problems += _maps_agree(headers, d2t, t2d)
    detail = "; ".join(problems) or (
        f"draft vocabulary {draft} of {vocab}" + (" (d2t, t2d)" if d2t and t2d else ""))
    return [Check("vocabulary maps", not problems, detail)]


def _maps_agree(
    headers: dict[Path, dict[str, Any]], d2t: tuple[Path, str], t2d: tuple[Path, str]
) -> list[str]:
    """d2t and t2d describe one draft vocabulary: distinct target ids, and t2d flags exactly
    the target ids d2t maps to (maps exported from different vocabularies disagree)."""
    offsets = _int_tensor(d2t[0], headers[d2t[0]], d2t[1])
    flags = _int_tensor(t2d[0], headers[t2d[0]], t2d[1])
    if offsets is None or flags is None:
        return []
    targets = {i + v for i, v in enumerate(offsets)}
    if len(targets) != len(offsets):
        return [f"d2t maps {len(offsets) - len(targets)} draft ids onto target ids another "
                "draft id already has: re-export d2t/t2d from the draft vocabulary"]
    marked = {i for i, f in enumerate(flags) if f}
    if marked != targets:
        return [f"t2d flags {len(marked)} target ids, d2t maps to {len(targets)}, "
                f"{len(marked ^ targets)} differ: the maps come from different vocabularies; "
                "re-export d2t and t2d together"]
    return []


_LAYER = re.compile(r"(?:^|\.)(?:layers\.(\d+)|midlayer)\.")


def draft_body(
    d_text: dict[str, Any], t_text: dict[str, Any], headers: dict[Path, dict[str, Any]]
) -> list[Check]:
    """An EAGLE-3 draft's body: the decoder layers its config counts are the ones its
    weights hold (``midlayer`` is layer 0), ``swap_h_and_emb`` is a flag, and a draft that
    owns its embedding (Osprey) ships it, one row per target token id."""
    checks = []
    found: set[int] = set()
    for header in headers.values():
        for key in header:
            m = _LAYER.search(key)
            if m:
                found.add(int(m.group(1) or 0))
    count = d_text.get("num_hidden_layers")
    if count is not None:
        held = f"the weights hold layers {sorted(found)}" if found else "no layers in the weights"
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            checks.append(Check("draft layers", False, (
                f"num_hidden_layers {count!r}: expected the draft's decoder layer count "
                f"({held})")))
        elif found != set(range(count)):
            checks.append(Check("draft layers", False, (
                f"num_hidden_layers {count}, but {held}: a partial checkpoint or a wrong "
                "config; download the checkpoint whole or set num_hidden_layers to match")))
        else:
            checks.append(Check("draft layers", True, f"{count} decoder layer(s), all in the "
                                "weights"))
    swap = d_text.get("swap_h_and_emb")
    if swap is not None and not isinstance(swap, bool):
        checks.append(Check("swap_h_and_emb", False,
                            f"swap_h_and_emb {swap!r}: expected true or false in config.json"))
    elif swap:
        checks.append(Check("swap_h_and_emb", True, (
            "true: the input layer reads [hidden states, embedding] (stock SGLang reads "
            "[embedding, hidden states])")))
        checks.append(own_embedding(d_text, t_text, headers))
    return checks


def own_embedding(
    d_text: dict[str, Any], t_text: dict[str, Any], headers: dict[Path, dict[str, Any]]
) -> Check:
    """A draft trained with its own tokenizer-aligned embedding needs it in its weights: the
    target's (what SGLang would use instead) is not what it learned to read."""
    found = _find(headers, "embed_tokens.weight")
    if found is None:
        return Check("embed_tokens", False, (
            "swap_h_and_emb drafts carry their own embedding, but the weights hold no "
            "embed_tokens.weight: download the checkpoint whole (the target's embedding is "
            "not the one it was trained with)"))
    shape = headers[found[0]][found[1]].get("shape")
    rows, width = t_text.get("vocab_size"), d_text.get("hidden_size")
    if shape != [rows, width]:
        return Check("embed_tokens", False, (
            f"{found[1]} has shape {shape}, expected [{rows}, {width}] (target vocab_size, "
            "draft hidden_size): its inputs are the target's token ids; use the draft "
            "exported for this target's tokenizer"))
    return Check("embed_tokens", True, f"{found[1]} {shape}: its own embedding over the "
                 "target's vocabulary")
