"""What an installed SGLang would choose by itself: its version and the ``ServerArgs`` defaults
a pilot writer pins or comments on (the speculative depth SGLang picks when left unset, the
memory fraction it sizes at boot, its cap on running requests).

Asked of the engine's own Python in a subprocess (SGLang usually lives in another venv, and
importing it here would load torch), booting nothing."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

from ..environment import engine_environ

MARK = "OSPREY-SGLANG-DEFAULTS "
# The ServerArgs fields a pilot for a speculative stack depends on.
ASKED = ("dtype", "mem_fraction_static", "max_running_requests", "context_length",
         "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
         "speculative_num_draft_tokens")

_ASK = r"""
import dataclasses, importlib.metadata, json, sys
MARK = sys.argv[1]
try:
    import sglang
    from sglang.srt.server_args import ServerArgs
except Exception as exc:
    print(MARK + json.dumps({"why": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
# ServerArgs is a dataclass in every SGLang release this reads; anything else has no defaults
# to read this way (the version is still an answer).
found = {f.name: f.default for f in dataclasses.fields(ServerArgs)
         if f.default is not dataclasses.MISSING} if dataclasses.is_dataclass(ServerArgs) else {}
asked = json.loads(sys.argv[2])
try:  # as the artifact check reads it (engine_version): the pin it holds SGLang to
    version = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    version = None
print(MARK + json.dumps({"version": version,
                         "defaults": {k: found[k] for k in asked if k in found}}, default=str))
"""


@dataclass(frozen=True)
class SGLangDefaults:
    """An SGLang's answer: its version and defaults, or why it could not be asked."""

    python: str
    version: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    why_not: str | None = None

    @property
    def asked(self) -> bool:
        return self.why_not is None

    def line(self) -> str:
        if self.why_not is not None:
            return f"SGLang not asked with {self.python}: {self.why_not}"
        shown = ", ".join(f"{k} {self.defaults[k]!r}" for k in ASKED if k in self.defaults)
        return (f"SGLang {self.version or '(no installed version)'} at {self.python}; "
                + (f"defaults: {shown}" if shown else "no ServerArgs defaults readable"))


def sglang_defaults(python: str, env: dict[str, str] | None = None,
                    timeout_s: float = 120.0) -> SGLangDefaults:
    """Ask the SGLang ``python`` imports for its version and :data:`ASKED` defaults."""
    try:
        proc = subprocess.run(
            [python, "-c", _ASK, MARK, json.dumps(ASKED)], capture_output=True, text=True,
            env=engine_environ(env or {}), timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SGLangDefaults(python, why_not=f"could not run it: {exc}")
    found = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if not found:
        tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return SGLangDefaults(python, why_not=f"no answer ({tail or 'no output'})")
    try:
        answer = json.loads(found[-1][len(MARK):])
    except json.JSONDecodeError:
        return SGLangDefaults(python, why_not="an answer that is not JSON")
    if "why" in answer:
        return SGLangDefaults(python, why_not=f"sglang is not importable ({answer['why']})")
    defaults = answer.get("defaults")
    version = answer.get("version")
    return SGLangDefaults(python, str(version) if version else None,
                          defaults if isinstance(defaults, dict) else {})
