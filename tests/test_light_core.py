"""The core install (no ``[embedded]`` extra: no torch) judges a campaign against a running
server; the embedded engine without torch is one line naming the field and the extra; a
machine without matplotlib still gets its reports, without plots, and is told so.

Run in child processes whose interpreter refuses torch and safetensors
(:mod:`testkit.without_torch`), whatever this venv has installed. .ci/run also runs the twin
pilot from a venv with the core install alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.core_pilot import run as run_core_pilot

ROOT = Path(__file__).resolve().parents[1]


def refused(*args: str, also: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REFUSE_ALSO": also,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    return subprocess.run([sys.executable, "-m", "testkit.without_torch", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.slow  # over a second on 2 busy cores
def test_every_module_but_the_sglang_kernel_imports_without_torch() -> None:
    code = ("import importlib, pkgutil, pytest_osprey\n"
            "bad = []\n"
            "for m in pkgutil.walk_packages(pytest_osprey.__path__, 'pytest_osprey.'):\n"
            "    try:\n"
            "        importlib.import_module(m.name)\n"
            "    except ImportError as e:\n"
            "        bad.append((m.name, e.name))\n"
            "import sys; print(sorted(bad)); print('torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "import testkit.without_torch as w; "
                           "w.install(); exec(open(0).read())"], input=code, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=True)
    bad, torch_loaded = proc.stdout.strip().splitlines()[-2:]
    # The pure-torch sgl_kernel is installed into SGLang's own venv, never imported here.
    assert eval(bad) == [("pytest_osprey.engines.sglang.cpu.sgl_kernel", "torch")], bad
    assert torch_loaded == "False"


@pytest.mark.slow
def test_an_endpoint_pilot_runs_start_to_finish_without_torch(tmp_path: Path) -> None:
    code = run_core_pilot(tmp_path, refuse_torch=True)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert code in (0, 1), code
    assert [v["candidate"] for v in summary["verdicts"]] == ["cand"]
    # The EAGLE-3-like twin is about 2x the plain one at x1: the core install measured it.
    fig = next(f for f in summary["figures"] if f["condition"] == "cand")
    assert fig["speedup"] > 1.3
    assert (tmp_path / "results" / "report.html").stat().st_size > 0
    assert (tmp_path / "results" / "report.md").is_file()


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_embedded_engine_without_torch_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    proc = refused("run", str(ROOT / "pilot.yaml"), "--results", str(tmp_path / "res"))
    assert proc.returncode == 4, proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "target.engine" in lines[0] and "pytest-osprey[embedded]" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "res").exists()


@pytest.mark.slow  # over a second on 2 busy cores
def test_reports_without_matplotlib_are_written_without_plots_and_say_so(
        tmp_path: Path) -> None:
    from testkit.endpoint_pilot import sglang_routes, write_endpoint_pilot
    from testkit.fake_server import ScriptedServer

    with ScriptedServer(routes=sglang_routes()) as srv:
        pilot = write_endpoint_pilot(tmp_path, srv.url, 3, html=True)
        proc = refused("run", str(pilot), "--results", str(tmp_path / "res"), also="matplotlib")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "report.html has no plots: matplotlib is not installed" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    html = (tmp_path / "res" / "report.html").read_text()
    assert "<img" not in html and "verdict" in html.lower()
    assert (tmp_path / "res" / "report.md").is_file()
