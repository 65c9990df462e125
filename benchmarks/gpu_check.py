"""GPU memory check: the embedded pilot on CUDA, then its memory figures checked.

For a machine with an NVIDIA GPU and no network. It runs from this checkout with a Python
that already has torch (a CUDA build), transformers, nvidia-ml-py and pytest-osprey's other
dependencies (pytest-osprey itself need not be installed: the checkout is put on PYTHONPATH),
for instance the checkout's own venv:

    timeout 420 .venv/bin/python benchmarks/gpu_check.py --out "$OUT"

It writes variants of pilot.yaml (device cuda, fewer prompts and passes; once interleaved, all
conditions loaded at once, once with one engine at a time), runs each through
``pytest --osprey-config`` into --out (sized for about a minute each on a GPU), and checks
per run: every condition's peak memory is recorded and > 0 and was measured on the GPU
(fingerprint memory kind "gpu"), NVML saw the process, and the drafter condition's peak is at
least the baseline's (a drafter adds weights). It also checks NVML directly on a tensor of its own.
It prints torch/CUDA versions, a PASS/WARN/FAIL table (also checks.json in --out) and the
speed verdicts, and exits 1 on any FAIL. WARN: NVML could only give whole-device figures.

``--device cpu`` runs the same checks on the CPU, expecting host-memory figures (tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's pytest_osprey, installed or not

from pytest_osprey.engines import gpu_memory  # noqa: E402
from testkit.factories import pilot_variant  # noqa: E402

Check = dict[str, str]


def run_pilot(pilot: dict[str, Any], where: Path, python: str, timeout_s: float) -> int | None:
    """``pytest --osprey-config`` on ``pilot`` in ``where``; its exit code, None on timeout."""
    where.mkdir(parents=True, exist_ok=True)
    results = where / "results"
    if results.exists():  # the plugin writes only into a new folder: keep the old one aside
        aside = where / f"results.{time.strftime('%Y%m%d-%H%M%S')}"
        results.rename(aside)
        print(f"earlier results moved to {aside}")
    config = where / "pilot.yaml"
    config.write_text(yaml.safe_dump(pilot, sort_keys=False), encoding="utf-8")
    argv = [python, "-m", "pytest", f"--osprey-config={config}",
            f"--osprey-results={where / 'results'}", "-p", "no:cacheprovider"]  # fmt: skip
    if not any(ep.name == "osprey" for ep in entry_points(group="pytest11")):
        argv += ["-p", "pytest_osprey.plugin"]  # not installed: load it from the checkout
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # local models, no network
    with open(where / "pytest.log", "wb") as log:
        try:
            proc = subprocess.run(argv, cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return None
    return proc.returncode


def check(checks: list[Check], name: str, status: str, detail: str = "") -> None:
    checks.append({"check": name, "status": status, "detail": detail})


def _mib(x: Any) -> str:
    return f"{x:.0f} MiB" if isinstance(x, int | float) else str(x)


def check_run(checks: list[Check], order: str, device: str, where: Path, code: int | None) -> None:
    """The memory figures of one pilot run (its campaign.json) against what ``device`` implies."""
    log = where / "pytest.log"
    if code is None:
        check(checks, f"{order}: pilot run", "FAIL", f"timed out; log: {log}")
        return
    # 0: every gate passed; 1: a gate failed (the tiny models' speed on a GPU is not checked).
    check(checks, f"{order}: pilot run", "PASS" if code in (0, 1) else "FAIL",
          f"pytest exit code {code}; log: {log}")  # fmt: skip
    campaign = where / "results" / "campaign.json"
    if not campaign.is_file():
        check(checks, f"{order}: campaign.json", "FAIL", f"not written; log: {log}")
        return
    meta = json.loads(campaign.read_text(encoding="utf-8"))
    conds: dict[str, Any] = meta.get("conditions", {})
    gpu = device.startswith("cuda")
    want_kind = "gpu" if gpu else "host"
    want_scope = ("condition" if order != "sequential" else "engine") if gpu else "condition"
    for name, info in conds.items():
        peak = info.get("peak_memory_mb")
        mem = (info.get("fingerprint") or {}).get("memory") or {}
        ok = isinstance(peak, int | float) and peak > 0
        error = f"; error: {info['error']}" if info.get("error") else ""
        check(checks, f"{order}: {name} peak memory > 0", "PASS" if ok else "FAIL",
              _mib(peak) + error)  # fmt: skip
        seen = (mem.get("kind"), mem.get("scope"))
        how = f"kind {seen[0]}, scope {seen[1]}, basis {mem.get('basis')}: {mem.get('note')}"
        check(checks, f"{order}: {name} measured as {want_kind}/{want_scope}",
              "PASS" if seen == (want_kind, want_scope) else "FAIL", how)  # fmt: skip
        if gpu:
            basis, nvml_mib = mem.get("basis"), mem.get("nvml_mib")
            status = "FAIL"
            if basis == "process" and isinstance(nvml_mib, int | float) and nvml_mib > 0:
                status = "PASS"
            elif basis == "device":
                status = "WARN"
            check(checks, f"{order}: {name} NVML saw the process", status,
                  f"basis {basis}, NVML {_mib(nvml_mib)}, device {mem.get('device')}"
                  + (f"; {mem['nvml']}" if mem.get("nvml") else ""))  # fmt: skip
    base = meta.get("baseline")
    base_peak = conds.get(base, {}).get("peak_memory_mb")
    for cand in meta.get("candidates", []):
        peak = conds.get(cand, {}).get("peak_memory_mb")
        ok = isinstance(peak, int | float) and isinstance(base_peak, int | float)
        ok = ok and peak >= base_peak
        check(checks, f"{order}: {cand} peak >= {base} peak", "PASS" if ok else "FAIL",
              f"{_mib(peak)} vs {_mib(base_peak)}")  # fmt: skip


def verdicts(where: Path) -> list[str]:
    """The speed verdict lines of one run (summary.json)."""
    path = where / "results" / "summary.json"
    if not path.is_file():
        return ["(no summary.json)"]
    summary = json.loads(path.read_text(encoding="utf-8"))
    lines = [f"{v['verdict']} {v['candidate']}" for v in summary.get("verdicts", [])]
    for g in summary.get("gates", []):
        if g.get("kind") in ("speedup", "memory"):
            lines.append(f"  {g['kind']}[{g.get('id')}] {g.get('outcome')}: {g.get('summary')}")
    return lines


def environment() -> dict[str, Any]:
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nvml": gpu_memory.unavailable() or "available",
        # Names from NVML: asking torch would open a CUDA context here during the pilot runs.
        "nvml_devices": [d.describe() for d in gpu_memory.devices() or []],
    }


def check_nvml_self(checks: list[Check], device: str) -> None:
    """NVML on this process: a 256 MiB tensor on the GPU must show (or, on CPU, no error)."""
    if not device.startswith("cuda"):
        why = gpu_memory.unavailable()
        got = gpu_memory.usage([os.getpid()])
        check(checks, "NVML degrades without a GPU", "PASS" if got is None else "WARN",
              why or "NVML available; this process holds no GPU memory")  # fmt: skip
        return
    import torch

    if not torch.cuda.is_available():
        check(checks, "NVML sees this process", "FAIL", "torch sees no CUDA device")
        return
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
    got = gpu_memory.usage([os.getpid()])
    del block
    print(f"torch's device: {torch.cuda.get_device_name(torch.device(device))}")
    if got is None:
        why = gpu_memory.unavailable() or "NVML does not list this process"
        check(checks, "NVML sees this process", "FAIL", why)
    elif got.basis == "process":
        check(checks, "NVML sees this process", "PASS" if got.mib >= 256 else "FAIL",
              f"{got.mib:.0f} MiB with a 256 MiB tensor held")  # fmt: skip
    else:
        check(checks, "NVML sees this process", "WARN", f"{got.mib:.0f} MiB: {got.note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.environ.get("OUT") or ROOT / "osprey-results" / "gpu-check"
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(default_out),
        help="folder for everything written (default: $OUT, else osprey-results/gpu-check)",
    )
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu (a dry run)")
    ap.add_argument("--orders", default="interleaved,sequential",
                    help="campaign orders to run, comma-separated")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24, help="max_new_tokens_cap")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per pilot run")
    ap.add_argument("--python", default=sys.executable, help="Python that runs the pilots")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    env = environment()
    print(json.dumps(env, indent=2))
    checks: list[Check] = []
    speed: dict[str, list[str]] = {}
    for order in [o.strip() for o in args.orders.split(",") if o.strip()]:
        where = out / order
        pilot = pilot_variant(args.device, order, args.prompts, args.passes, args.tokens)
        code = run_pilot(pilot, where, args.python, args.timeout)
        check_run(checks, order, args.device, where, code)
        speed[order] = verdicts(where)
    check_nvml_self(checks, args.device)
    print()
    for c in checks:
        print(f"{c['status']:<5} {c['check']:<50} {c['detail']}")
    for order, lines in speed.items():
        print(f"\nspeed ({order}):")
        print("\n".join(lines))
    failed = sum(c["status"] == "FAIL" for c in checks)
    elapsed = time.perf_counter() - t0
    print(f"\n{'FAIL' if failed else 'PASS'}: {failed} of {len(checks)} checks failed "
          f"({elapsed:.0f} s); everything is in {out}")  # fmt: skip
    report = {"environment": env, "checks": checks, "speed": speed, "seconds": elapsed}
    (out / "checks.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
