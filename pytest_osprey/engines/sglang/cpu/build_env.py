"""Build (or refresh) a Python environment that serves real SGLang 0.5.23 on CPU.

    python -m pytest_osprey.engines.sglang.cpu.build_env VENV

PyPI's SGLang pins a CUDA torch and CUDA-only kernels, so the environment is put together by
hand: the CPU torch first, then SGLang and the packages whose requirements would drag CUDA in,
without their dependencies, then the pure-Python packages SGLang's imports need (pinned to a
set seen working). Two pieces are the project's own: a pure-torch ``sgl_kernel`` (PyPI's are
CUDA builds) and a guard in torchvision (PyPI's build is CUDA's and registers fake kernels
for ``torchvision::nms``/``qnms``, operators its CPU-less extension never defines). Every step
is idempotent; the last one imports SGLang's server stack as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .torchvision_guard import GuardError, guard_torchvision

TORCH = "torch==2.13.0"

# Installed without dependencies: their requirements name CUDA torch and CUDA kernels.
NO_DEPS = (
    "sglang==0.5.23",
    "triton==3.8.0",  # imported unconditionally by SGLang's kernels
    "torchvision==0.28.0",
    "apache-tvm-ffi==0.1.11",
    "compressed-tensors==0.18.0",
    "xgrammar==0.2.7",
)

# What SGLang 0.5.23's server imports on CPU (and the packages above require), pinned to a
# working set; their own light dependencies are resolved by pip.
PURE_PYTHON = (
    "aiohttp==3.14.5",
    "anthropic==2.14.0",
    "blobfile==3.0.0",
    "dill==0.4.1",
    "distro==1.9.0",
    "easydict==1.14",
    "einops==0.8.2",
    "fastapi==0.165.0",
    "gguf==0.19.0",
    "interegular==0.3.3",
    "ipython==9.18.1",
    "jsonschema==4.26.0",
    "llguidance==1.9.1",
    "loguru==0.7.3",
    "msgspec==0.23.0",
    "ninja==1.13.2",
    "numpy==2.4.6",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "orjson==3.13.0",
    "packaging==26.4",
    "partial-json-parser==0.2.1.1.post7",
    "pillow==13.0.0",
    "prometheus-client==0.26.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "python-multipart==0.0.34",
    "pyzmq==27.3.0",
    "regex==2026.11.19",
    "requests==2.34.2",
    "scipy==1.17.1",
    "sentencepiece==0.2.1",
    "setproctitle==1.3.8",
    "soundfile==0.13.1",
    "tiktoken==0.14.0",
    "tokenizers==0.23.2",
    "tqdm==4.70.1",
    "transformers==5.19.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "watchfiles==1.3.0",
    "xxhash==4.1.0",
    "zstandard==0.25.0",
)

SHIM_SOURCE = Path(__file__).resolve().parent / "sgl_kernel"
SHIM_MARKER = "OSPREY_CPU_SHIM"  # a file in the installed package: ours to replace

SMOKE = r"""
import json, os
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
import torch, torchvision, sgl_kernel, sglang
from sglang.srt.server_args import prepare_server_args
import sglang.srt.entrypoints.http_server  # the server stack: FastAPI, zmq, tokenizer manager
missing = sorted(n for n in sgl_kernel.SCHEMAS if not hasattr(torch.ops.sgl_kernel, n))
print(json.dumps({"sglang": sglang.__version__, "torch": torch.__version__,
                  "ops": len(sgl_kernel.SCHEMAS), "missing_ops": missing}))
"""


class BuildError(RuntimeError):
    """A step failed; the message says which and why."""


def _say(message: str) -> None:
    print(f"[sglang-cpu] {message}", flush=True)


def _run(argv: list[str], what: str) -> str:
    t0 = time.monotonic()
    _say(f"{what} ...")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    _say(f"{what}: done in {time.monotonic() - t0:.0f} s")
    return proc.stdout


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def install_shim(site: Path) -> Path:
    """Copy the pure-torch sgl_kernel into ``site`` as a top-level package, replacing an
    earlier copy of ours but never somebody else's sgl_kernel (a native build)."""
    target = site / "sgl_kernel"
    if target.exists():
        if not (target / SHIM_MARKER).exists():
            raise BuildError(
                f"{target} exists and is not this project's CPU sgl_kernel (a native build?); "
                f"remove it to use the pure-torch ops"
            )
        shutil.rmtree(target)
    shutil.copytree(SHIM_SOURCE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (target / SHIM_MARKER).write_text("Installed by pytest_osprey.engines.sglang.cpu.build_env\n")
    return target


def build(venv: Path, *, python: str = sys.executable) -> dict[str, object]:
    """Create or refresh ``venv``; returns the smoke test's report and the step timings."""
    t_start = time.monotonic()
    py = venv_python(venv)
    if not py.exists():
        _run([python, "-m", "venv", str(venv)], f"create {venv}")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    # The CPU build first and pinned: anything unpinned afterwards could pull a CUDA torch.
    _run([*pip, TORCH], f"install {TORCH} (CPU)")
    _run([*pip, "--no-deps", *NO_DEPS], "install SGLang and its CUDA-pinned companions, no deps")
    _run([*pip, *PURE_PYTHON], f"install {len(PURE_PYTHON)} pinned pure-Python packages")
    site = site_packages(py)
    shim = install_shim(site)
    _say(f"installed the pure-torch sgl_kernel at {shim}")
    _say(guard_torchvision(site / "torchvision" / "_meta_registrations.py"))
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    t0 = time.monotonic()
    _say("smoke test: import SGLang's server stack ...")
    proc = subprocess.run(
        [str(py), "-c", SMOKE], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
        raise BuildError("smoke import failed:\n" + "\n".join(tail))
    report: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    if report.get("missing_ops"):
        raise BuildError(f"smoke import: sgl_kernel ops not registered: {report['missing_ops']}")
    _say(f"smoke test: done in {time.monotonic() - t0:.0f} s: {report}")
    report["build_s"] = round(time.monotonic() - t_start, 1)
    report["python"] = str(py)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_osprey.engines.sglang.cpu.build_env",
        description="Build or refresh a venv that serves SGLang 0.5.23 on CPU",
    )
    parser.add_argument("venv", type=Path, help="The environment's directory (created if absent)")
    args = parser.parse_args(argv)
    try:
        report = build(args.venv.absolute())
    except (BuildError, GuardError) as exc:
        print(f"[sglang-cpu] error: {exc}", file=sys.stderr)
        return 1
    _say(f"ready in {report['build_s']} s: point OSPREY_SGLANG_PYTHON at {report['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
