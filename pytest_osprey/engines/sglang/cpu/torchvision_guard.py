"""The project's patch to torchvision 0.28.0's ``_meta_registrations.py`` for a CPU torch.

PyPI's torchvision 0.28.0 is a CUDA build: beside the CPU torch its compiled extension does
not load, so ``torchvision::nms`` and ``torchvision::qnms`` are never defined, and the two
unconditional ``@torch.library.register_fake`` decorators for them fail at import (SGLang
imports torchvision through transformers). The patch makes those two registrations
conditional on the operator existing; nothing else changes.
"""

from __future__ import annotations

from pathlib import Path

GUARDED_OPS = ("torchvision::nms", "torchvision::qnms")
HELPER = "_osprey_fake_if_defined"
_HELPER_SOURCE = f"""

def {HELPER}(name):
    # Patched for a CPU torch: the CUDA build's extension may not define the operator.
    namespace, op = name.split("::")
    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return lambda fn: fn
    return torch.library.register_fake(name)

"""
_ANCHOR = "\nimport torchvision.extension  # noqa: F401\n"


class GuardError(RuntimeError):
    """The file does not look like the one the patch was written for."""


def _decorator(op: str, helper: bool) -> str:
    name = HELPER if helper else "torch.library.register_fake"
    return f'@{name}("{op}")\n'


def patch_source(text: str) -> tuple[str, bool]:
    """The patched text and whether it changed; raises GuardError on an unexpected file."""
    originals = [text.count(_decorator(op, helper=False)) for op in GUARDED_OPS]
    guarded = [text.count(_decorator(op, helper=True)) for op in GUARDED_OPS]
    has_helper = f"def {HELPER}(" in text
    if guarded == [1, 1] and originals == [0, 0] and has_helper:
        return text, False
    if originals != [1, 1] or any(guarded) or has_helper:
        raise GuardError(
            "torchvision/_meta_registrations.py is not as expected (torchvision 0.28.0): "
            f"unguarded registrations {dict(zip(GUARDED_OPS, originals, strict=True))}, "
            f"guarded {dict(zip(GUARDED_OPS, guarded, strict=True))}, helper {has_helper}"
        )
    if text.count(_ANCHOR) != 1:
        raise GuardError(
            "torchvision/_meta_registrations.py is not as expected: no single "
            "'import torchvision.extension' line to place the guard after"
        )
    text = text.replace(_ANCHOR, _ANCHOR + _HELPER_SOURCE, 1)
    for op in GUARDED_OPS:
        text = text.replace(_decorator(op, helper=False), _decorator(op, helper=True), 1)
    return text, True


def guard_torchvision(path: Path) -> str:
    """Patch ``path`` in place (idempotent); returns what was done."""
    if not path.is_file():
        raise GuardError(f"{path}: not found (is torchvision 0.28.0 installed?)")
    text, changed = patch_source(path.read_text())
    if not changed:
        return f"torchvision guard: already in place in {path}"
    path.write_text(text)
    # A stale bytecode cache would keep the unpatched registrations alive.
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink()
    return f"torchvision guard: applied to {path}"
