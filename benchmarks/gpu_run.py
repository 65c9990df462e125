"""One script for a lent GPU machine, under 10 minutes: benchmarks/gpu_check.py on the device,
then the embedded pilot (pilot.yaml, every prompt and pass) on the device, everything written
under --out (default $OUT): each stage's log, the pilot's reports (its figures are embedded
in report.html) and gpu_run.json (stages, exit codes, seconds, the verdict lines, what the
pilot's campaign cost). Exit 1 when the GPU check fails or a stage could not run (the pilot's
own exit 1, a gate that did not pass, is its verdict).

    python benchmarks/gpu_run.py                      # cuda, --out $OUT
    python benchmarks/gpu_run.py --device cpu --quick # the same stages on CPU, cut down
    python benchmarks/gpu_run.py --dry-run            # print the plan, run nothing

The machine has no package registry: the modules the checkout needs beyond what it has
(pydantic, pyyaml, psutil, nvidia-ml-py, ...) are installed from --wheels (a folder of wheels
carried with the checkout; pip --no-index) when given, else named as missing in gpu_run.json
and the stages that need them are not run. Each stage has its own timeout within --budget-s.
"""

from __future__ import annotations

import argparse
import importlib.util
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
sys.path.insert(0, str(ROOT))  # this checkout's testkit

from testkit.factories import embedded_pilot  # noqa: E402

# import name -> distribution, for the message and pip
NEEDED = {"numpy": "numpy", "scipy": "scipy", "pydantic": "pydantic", "yaml": "pyyaml",
          "regex": "regex", "httpx": "httpx", "psutil": "psutil", "pynvml": "nvidia-ml-py",
          "prometheus_client": "prometheus_client", "jsonschema": "jsonschema",
          "matplotlib": "matplotlib", "torch": "torch", "transformers": "transformers",
          "safetensors": "safetensors", "pytest": "pytest", "pytest_benchmark": "pytest-benchmark"}


def missing_modules() -> list[str]:
    """Distributions whose module this Python cannot import."""
    return [dist for mod, dist in NEEDED.items() if importlib.util.find_spec(mod) is None]


def stages(args: argparse.Namespace, out: Path) -> list[tuple[str, list[str], Path, float]]:
    """(name, argv, log, timeout) per stage; the pilot's config is written by run()."""
    py = args.python
    check = [py, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", args.device,
             "--out", str(out / "gpu_check"), "--python", py]
    if args.quick:
        check += ["--orders", "interleaved", "--prompts", "2", "--passes", "1", "--tokens", "8"]
    pilot = out / "pilot"
    run = [py, "-m", "pytest", f"--osprey-config={pilot / 'pilot.yaml'}",
           f"--osprey-results={pilot / 'results'}", "-p", "no:cacheprovider"]
    if not any(ep.name == "osprey" for ep in entry_points(group="pytest11")):
        run += ["-p", "pytest_osprey.plugin"]  # not installed: load it from the checkout
    first = min(args.budget_s * 0.45, 260.0)
    return [("gpu_check", check, out / "gpu_check.log", first),
            ("embedded_pilot", run, pilot / "pytest.log", args.budget_s - first - 10)]


def summary_of(results: Path) -> dict[str, Any]:
    """The pilot's verdicts and cost from its summary.json (empty when absent)."""
    path = results / "summary.json"
    if not path.is_file():
        return {}
    s = json.loads(path.read_text("utf-8"))
    html = results / "report.html"
    figures = html.read_text("utf-8").count("data:image/png") if html.is_file() else 0
    return {"verdicts": [f"{v['verdict']} {v['candidate']}" for v in s.get("verdicts", [])],
            "spent": (s.get("campaign") or {}).get("spent"),
            "reports": sorted(p.name for p in results.glob("report.*")),
            "figures_in_report_html": figures}


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": args.device, "quick": args.quick, "stages": []}
    missing = missing_modules()
    if missing and args.wheels:
        pip = [args.python, "-m", "pip", "install", "--no-index", "--find-links",
               str(args.wheels), *missing]
        done = subprocess.run(pip, capture_output=True, text=True, check=False)
        report["pip"] = {"argv": pip, "rc": done.returncode, "tail": done.stdout[-2000:]}
        missing = missing_modules()
    report["missing"] = missing
    plan = stages(args, out)
    if args.dry_run:
        report["plan"] = [{"stage": n, "argv": a, "timeout_s": t} for n, a, _, t in plan]
        return report
    pilot_dir = out / "pilot"
    pilot_dir.mkdir(parents=True, exist_ok=True)
    (pilot_dir / "pilot.yaml").write_text(
        yaml.safe_dump(embedded_pilot(args.device, args.quick), sort_keys=False), "utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name, argv, log, timeout in plan:
        entry: dict[str, Any] = {"stage": name, "timeout_s": round(timeout)}
        if missing:
            entry["skipped"] = f"missing modules: {', '.join(missing)} (give --wheels)"
            report["stages"].append(entry)
            continue
        t0 = time.perf_counter()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            try:
                rc: int | None = subprocess.run(argv, cwd=log.parent, env=env, stdout=fh,
                                                stderr=subprocess.STDOUT, timeout=timeout,
                                                check=False).returncode
            except subprocess.TimeoutExpired:
                rc = None
        entry.update(rc=rc, seconds=round(time.perf_counter() - t0, 1))
        tail = log.read_text("utf-8", errors="replace").splitlines()[-25:]
        entry["tail"] = tail
        report["stages"].append(entry)
        print(f"== {name}: rc {rc} in {entry['seconds']} s", flush=True)
        print("\n".join(tail), flush=True)
    report["pilot"] = summary_of(pilot_dir / "results")
    report["load_average"] = list(os.getloadavg())
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or
                                                     ROOT / "osprey-results" / "gpu-run"))
    ap.add_argument("--device", default="cuda", help="cuda (the run), or cpu (a dry mode)")
    ap.add_argument("--quick", action="store_true", help="cut both stages down (CPU dry mode)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--wheels", type=Path, default=None, help="wheels for missing modules")
    ap.add_argument("--budget-s", type=float, default=560.0, help="all stages together")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    report = run(args)
    out: Path = args.out.resolve()
    (out / "gpu_run.json").write_text(json.dumps(report, indent=2), "utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "stages"}, indent=2))
    # The pilot's pytest exits 1 when a gate does not pass (a verdict, not a failure to run).
    ran = {"gpu_check": (0,), "embedded_pilot": (0, 1)}
    failed = bool(report["missing"]) or any(s.get("rc") not in ran[s["stage"]]
                                            for s in report["stages"] if "skipped" not in s)
    return 1 if failed and not args.dry_run else 0


if __name__ == "__main__":
    sys.exit(main())
