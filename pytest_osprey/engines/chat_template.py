"""The target's chat template for server engines, applied in the client process.

Chat prompts reach every engine as text rendered by ``pilot.trace.render_prompt`` with the
target's own tokenizer, so SGLang, vLLM, an endpoint and the embedded engine are sent the
same string, the one a chat deployment serves. The servers' chat endpoints are not used:
SGLang reports its speculation counters per request on the native /generate only, vLLM its
per-request acceptance on /v1/completions, and two servers' chat endpoints would each render
with their own defaults, out of this tool's sight.

The tokenizer is read from local files only: the model folder, or the Hugging Face cache a
server fills when it downloads a model id at boot. Without one, chat prompts fall back to a
plain ``System:/User:/Assistant:`` layout, and the fingerprint says so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

NONE = "none"
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _has_template(folder: Path) -> bool:
    """Whether a model folder ships a chat template (read without loading the tokenizer)."""
    if any((folder / name).is_file() for name in _TEMPLATE_FILES):
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def _cached_folder(model_id: str) -> Path | None:
    """The snapshot folder of ``model_id``'s tokenizer in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "tokenizer_config.json")
    except Exception:  # not a valid model id, no cache: nothing local to read
        return None
    return Path(found).parent if isinstance(found, str) else None


def template_digest(tokenizer: Any) -> str:
    """``sha256:<12 hex>`` of the tokenizer's chat template, or ``none``: conditions that
    render chats differently are not comparable (fairness compares it)."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if not template:
        return NONE
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def load_chat_tokenizer(model: str) -> tuple[Any | None, str]:
    """(the target's tokenizer if it has a chat template, else None; how chat prompts are
    rendered, in words for the fingerprint)."""
    folder = Path(model)
    if not folder.is_dir():
        cached = _cached_folder(model)
        if cached is None:
            return None, (f"{model} is neither a folder nor in the local Hugging Face cache: "
                          "chats use the plain layout")
        folder = cached
    if not _has_template(folder):
        # Most folders without a template: no need to import transformers to learn it.
        return None, f"no chat template in {model}: chats use the plain layout"
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception as exc:  # any loader failure: say it, fall back to the plain layout
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return None, (f"tokenizer of {model} not readable here ({why}): chats use the plain "
                      "layout")
    if not getattr(tokenizer, "chat_template", None):
        return None, f"no chat template in {model}: chats use the plain layout"
    return tokenizer, f"chat template of {model} ({template_digest(tokenizer)})"
