"""The shipped examples (examples/*.yaml) cut for a test: the same target, conditions and
sampling, a smaller speed design. A real-engine test asserts mechanics and quality, which
need each condition booted and sampled, not several passes of timings.

The copy is written with absolute paths, so it runs from any folder.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


def shrunk_example(example: Path, folder: Path, *, conditions: Collection[str] | None = None,
                   ids: Sequence[str] | None = None, load: Mapping[str, Any] | None = None
                   ) -> Path:
    """``example`` with only ``conditions`` (the baseline always kept), the trace cut to
    ``ids`` and ``load`` merged over its load section; written under ``folder``."""
    data = yaml.safe_load(example.read_text("utf-8"))
    here = example.parent

    def absolute(path: str) -> str:
        return str((here / path).resolve())

    data["target"]["model"] = absolute(data["target"]["model"])
    if conditions is not None:
        data["conditions"] = {n: c for n, c in data["conditions"].items()
                              if c.get("role") == "baseline" or n in conditions}
    for cond in data["conditions"].values():
        if cond.get("drafter"):
            cond["drafter"] = absolute(cond["drafter"])
    data["trace"]["files"] = [absolute(f) for f in data["trace"]["files"]]
    if ids is not None:
        data["trace"]["ids"] = list(ids)
    data["load"] = {**data.get("load", {}), **(load or {})}
    out = folder / f"{example.stem}-shrunk.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return out


def aa_example(example: Path, folder: Path, *, copies: int, prompts: int, samples: int,
               tokens: int, ids: Sequence[str] | None = None) -> Path:
    """An A/A pilot on ``example``'s engine: its target, engine arguments and environment,
    with the conditions replaced by the baseline and ``copies`` plain boots of the same server
    as candidates (nothing differs but the boot), one pass at x1 and a sampled pass of
    ``prompts`` x ``samples`` x ``tokens``; written under ``folder``."""
    shrunk = shrunk_example(example, folder, conditions=(), ids=ids,
                            load={"levels": {"low": 1}, "passes": 1, "order": "sequential"})
    data = yaml.safe_load(shrunk.read_text("utf-8"))
    data["name"] = f"{data.get('name', example.stem)}-aa"
    data["conditions"] = {"baseline": {"role": "baseline"},
                          **{f"plain-{k + 2}": {"role": "candidate"} for k in range(copies)}}
    data["decision"] = {"primary_load": "low", "inconclusive": "pass"}
    data["sampling"] = {**data.get("sampling", {}),
                        "sampled": {"prompts": prompts, "samples_per_prompt": samples,
                                    "max_new_tokens": tokens},
                        "params": {"enabled": False}}
    data["report"] = {"html": False}
    out = folder / f"{example.stem}-aa.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    shrunk.unlink()
    return out
