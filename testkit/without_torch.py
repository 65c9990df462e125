"""Run ``python -m pytest_osprey ARGS`` as a machine without the embedded extra would: torch
and safetensors cannot be imported (a finder ahead of every other refuses them), whatever this
interpreter has installed. ``python -m testkit.without_torch run pilot.yaml``; the environment
variable ``REFUSE_ALSO`` (comma-separated) refuses more packages, e.g. ``matplotlib``."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

EMBEDDED_ONLY = ("torch", "safetensors")


class RefuseEmbedded:
    """A meta-path finder that refuses the embedded extra's packages."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        refused = {*EMBEDDED_ONLY, *filter(None, os.environ.get("REFUSE_ALSO", "").split(","))}
        if name.split(".")[0] in refused:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def install() -> None:
    sys.meta_path.insert(0, RefuseEmbedded())


if __name__ == "__main__":
    install()
    sys.argv = ["pytest_osprey", *sys.argv[1:]]
    runpy.run_module("pytest_osprey", run_name="__main__", alter_sys=True)
