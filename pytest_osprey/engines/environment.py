"""The environment an interpreter the pilot names runs with: this process's, less what could
be a credential.

A pilot file is code: ``target.python``, ``target.env`` (``PYTHONPATH`` above all) and
``engine_args`` choose what runs, in the dry run too (SGLang's own argument parser, package
versions). CI jobs hold secrets in their environment (``GITHUB_TOKEN``, cloud keys), so an
engine's process starts from an allow-list of this process's variables: what interpreters,
compilers, accelerators and the engines read to run, never a name that looks like a
credential. What the pilot's ``env`` sets passes as written: naming a variable there is the
pilot's deliberate choice (``HF_TOKEN: ${HF_TOKEN}`` for a gated model, say).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Exact names passed through.
PASSED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "PWD",
    "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH", "LD_PRELOAD", "LIBRARY_PATH", "CPATH",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "NO_PROXY", "no_proxy", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX",
    "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE",
    "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE",
})
# Prefixes passed through: locale, accelerators, threading, the engines and their compilers.
PASSED_PREFIXES = ("LC_", "XDG_", "CUDA_", "NVIDIA_", "ROCM_", "HIP_", "HSA_", "OMP_",
                   "MKL_", "KMP_", "OPENBLAS_", "TORCH", "TRITON_", "SGLANG_", "SGL_",
                   "VLLM_", "FLASHINFER_", "OSPREY_")
# Never passed whatever the prefix: a name that reads as a credential.
SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE|AUTH|"
                    r"SESSION|COOKIE", re.IGNORECASE)


def passed(name: str) -> bool:
    """Whether this process's variable ``name`` reaches an engine's process."""
    if SECRET.search(name):
        return False
    return name in PASSED or name.startswith(PASSED_PREFIXES)


def engine_environ(*layers: Mapping[str, str]) -> dict[str, str]:
    """This process's passed variables, then each of ``layers`` as given (the pilot's
    ``target.env``, a condition's ``env``, the boot's own)."""
    env = {k: v for k, v in os.environ.items() if passed(k)}
    for layer in layers:
        env.update(layer)
    return env


def withheld(*layers: Mapping[str, str]) -> list[str]:
    """The names of this process's variables an engine does not get (for the dry run)."""
    given = {k for layer in layers for k in layer}
    return sorted(k for k in os.environ if not passed(k) and k not in given)
