"""The SGLang CPU environment builder's own pieces: the torchvision guard and the sgl_kernel
install (the pip steps are exercised by CI's build of a real environment)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_osprey.engines.sglang.cpu import build_env
from pytest_osprey.engines.sglang.cpu.torchvision_guard import (
    GuardError,
    guard_torchvision,
    patch_source,
)

# The shape of torchvision 0.28.0's _meta_registrations.py around the two registrations.
ORIGINAL = '''import functools

import torch
import torch._custom_ops
import torch.library

# Ensure that torch.ops.torchvision is visible
import torchvision.extension  # noqa: F401


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets.new_empty(0, dtype=torch.long)


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets.new_empty(0, dtype=torch.long)


@torch.library.register_fake("torchvision::roi_align")
def meta_roi_align(*args):
    return None
'''


def load(path: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_guard_patches_once_and_only_the_two_registrations() -> None:
    patched, changed = patch_source(ORIGINAL)
    assert changed
    assert '@torch.library.register_fake("torchvision::nms")' not in patched
    assert '@torch.library.register_fake("torchvision::qnms")' not in patched
    assert '@torch.library.register_fake("torchvision::roi_align")' in patched
    again, changed_again = patch_source(patched)
    assert not changed_again and again == patched


def test_guarded_registrations_are_skipped_when_the_operator_is_missing(tmp_path: Path) -> None:
    # Without the stub's extension import (no torchvision here), only the guard runs.
    text, _ = patch_source(ORIGINAL)
    text = text.replace("import torchvision.extension  # noqa: F401\n", "")
    text = text[: text.index('@torch.library.register_fake("torchvision::roi_align")')]
    path = tmp_path / "meta.py"
    path.write_text(text.replace("torchvision::", "osprey_test_absent::"))
    module = load(path, "osprey_guard_probe")
    assert callable(module.meta_nms) and callable(module.meta_qnms)  # type: ignore[attr-defined]
    # The unguarded registration of a missing operator is what fails without the patch.
    unguarded = tmp_path / "unguarded.py"
    unguarded.write_text(ORIGINAL.replace("import torchvision.extension  # noqa: F401\n", "")
                         .replace("torchvision::", "osprey_test_absent::"))  # fmt: skip
    with pytest.raises(Exception, match="osprey_test_absent"):
        load(unguarded, "osprey_guard_probe_unguarded")


@pytest.mark.parametrize(
    "text",
    [
        ORIGINAL.replace('"torchvision::qnms"', '"torchvision::other"'),
        ORIGINAL.replace("import torchvision.extension  # noqa: F401\n", ""),
        patch_source(ORIGINAL)[0].replace("_osprey_fake_if_defined(\"torchvision::qnms\")",
                                          "torch.library.register_fake(\"torchvision::qnms\")"),
    ],
    ids=["missing-registration", "no-anchor", "half-patched"],
)
def test_guard_refuses_a_file_it_does_not_recognise(text: str) -> None:
    with pytest.raises(GuardError, match="not as expected"):
        patch_source(text)


def test_guard_on_disk_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "_meta_registrations.py"
    path.write_text(ORIGINAL)
    assert "applied" in guard_torchvision(path)
    first = path.read_text()
    assert "already in place" in guard_torchvision(path)
    assert path.read_text() == first
    with pytest.raises(GuardError, match="not found"):
        guard_torchvision(tmp_path / "absent.py")


def test_shim_install_replaces_its_own_copy_but_not_a_native_build(tmp_path: Path) -> None:
    target = build_env.install_shim(tmp_path)
    assert (target / "__init__.py").is_file() and (target / build_env.SHIM_MARKER).is_file()
    assert not list(target.rglob("__pycache__"))
    (target / "stale.py").write_text("")
    build_env.install_shim(tmp_path)  # ours: replaced whole
    assert not (target / "stale.py").exists()
    (target / build_env.SHIM_MARKER).unlink()  # now it looks like somebody else's build
    with pytest.raises(build_env.BuildError, match="not this project's"):
        build_env.install_shim(tmp_path)


@pytest.mark.slow  # over a second on 2 busy cores
def test_installed_shim_imports_as_top_level_sgl_kernel(tmp_path: Path) -> None:
    build_env.install_shim(tmp_path)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import torch, sgl_kernel, "
        "sgl_kernel.speculative; print(sorted(n for n in sgl_kernel.SCHEMAS "
        "if hasattr(torch.ops.sgl_kernel, n)) == sorted(sgl_kernel.SCHEMAS))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, check=True, timeout=300)  # fmt: skip
    assert out.stdout.strip() == "True"


def test_pins_are_exact_and_torch_comes_first() -> None:
    for spec in (build_env.TORCH, *build_env.NO_DEPS, *build_env.PURE_PYTHON):
        name, _, version = spec.partition("==")
        assert name and version, spec
    assert build_env.TORCH == "torch==2.13.0"
    assert not any(p.startswith(("torch==", "nvidia", "cuda")) for p in build_env.PURE_PYTHON)
