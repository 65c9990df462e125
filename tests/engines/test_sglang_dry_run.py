"""``--osprey-dry-run`` on SGLang: each condition's command line checked by SGLang's parser
and, where the checkpoints are here, by what SGLang checks at launch; each condition gets
only its own errors. The fake sglang package (testkit/fakepkgs) stands in for SGLang
here; the slow tests at the end run the real 0.5.23 (OSPREY_SGLANG_PYTHON)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.sglang.check import SEED_NOTE, dry_run_check
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.preflight.command_lines import check_command_lines
from testkit.factories import ROOT, make_pilot
from testkit.pilot_run import FAKEPKGS

MODELS = Path(os.environ.get("OSPREY_TINY_MODELS") or ROOT / "fixtures" / "models")
REAL = os.environ.get("OSPREY_SGLANG_PYTHON")
REJECTION = ["--speculative-use-rejection-sampling"]


def pilot(model: str = "fake-model", env: dict[str, str] | None = None,
          python: str | None = sys.executable, **conditions: Any) -> Pilot:
    return make_pilot(
        {"base": {"role": "baseline"}, **conditions},
        target={"engine": "sglang", "model": model, "python": python,
                "env": {"PYTHONPATH": str(FAKEPKGS), **(env or {})}},
    )


def standalone(drafter: Path | str, extra: list[str] | None = None) -> dict[str, Any]:
    return {"role": "candidate", "drafter": str(drafter), "engine_args": extra or [],
            "speculation": {"algorithm": "STANDALONE", "num_steps": 3}}


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """A target and a drafter folder: launch-time checks need local checkpoints."""
    (tmp_path / "target").mkdir()
    (tmp_path / "drafter").mkdir()
    return tmp_path / "target", tmp_path / "drafter"


def test_without_sglang_every_condition_says_it_was_not_checked() -> None:
    p = pilot(cand=standalone("/m/d"))
    p = p.model_copy(update={"target": p.target.model_copy(update={"env": {}})})
    verdicts = dry_run_check(p)
    assert set(verdicts) == {"base", "cand"}
    for v in verdicts.values():
        assert v.ok and len(v.lines) == 1 and "not importable" in v.lines[0]


def test_parsed_and_launch_checked_where_the_checkpoints_are(
        folders: tuple[Path, Path]) -> None:  # fmt: skip
    target, drafter = folders
    verdicts = dry_run_check(pilot(str(target), cand=standalone(drafter)))
    for v in verdicts.values():
        assert v.ok and v.lines == ["sglang 0.0.fake: command line parsed and passed SGLang's "
                                    "launch-time checks"]


def test_launch_checks_are_not_run_without_the_checkpoints() -> None:
    verdicts = dry_run_check(pilot(cand=standalone("/nowhere/drafter")))
    assert verdicts["base"].ok and verdicts["cand"].ok
    assert "launch-time checks not run here (the target fake-model is not a local folder" in (
        verdicts["base"].lines[0])


def test_a_combination_sglang_refuses_at_launch_is_refused_for_its_condition_only(
        folders: tuple[Path, Path]) -> None:  # fmt: skip
    target, drafter = folders
    p = pilot(str(target), cand=standalone(drafter, REJECTION),
              other=standalone(drafter))
    checks = check_command_lines(p, ["base", "cand", "other"])
    assert not checks["cand"].ok
    refusal = checks["cand"].lines[1]
    assert refusal.startswith("SGLang 0.0.fake would refuse this at launch: NotImplementedError:")
    assert "only supported for EAGLE / EAGLE3" in refusal
    for name in ("base", "other"):  # nobody else's errors
        assert checks[name].ok, checks[name].lines
        assert not any("refuse" in line for line in checks[name].lines)


def test_a_parser_rejection_is_shown_in_sglangs_words_not_as_systemexit() -> None:
    p = pilot(cand=standalone("/m/d", ["--no-such-flag"]))
    checks = check_command_lines(p, ["base", "cand"])
    assert not checks["cand"].ok and checks["base"].ok
    (said,) = [line for line in checks["cand"].lines if "refuses" in line]
    assert said == ("SGLang 0.0.fake refuses the command line: sglang serve: error: "
                    "unrecognized arguments: --no-such-flag")
    assert not any("SystemExit" in line for c in checks.values() for line in c.lines)
    assert not any("no-such-flag" in line for line in checks["base"].lines[1:])


def test_what_this_machine_lacks_is_not_a_refusal(folders: tuple[Path, Path]) -> None:
    """A GPU deployment checked on a CPU machine: SGLang's resolution stops for want of an
    accelerator, which says nothing about the configuration."""
    target, drafter = folders
    p = pilot(str(target), env={"OSPREY_FAKE_NO_ACCELERATOR": "1"}, cand=standalone(drafter))
    for v in dry_run_check(p).values():
        assert v.ok
        assert "launch-time checks not run here (RuntimeError: No accelerator" in v.lines[0]


def test_a_sampled_pass_without_deterministic_inference_is_noted() -> None:
    p = pilot(cand=standalone("/m/d"))
    p = p.model_copy(update={"sampling": p.sampling.model_copy(update={
        "sampled": p.sampling.sampled.model_copy(update={"enabled": True})})})
    checks = check_command_lines(p, ["base", "cand"])
    assert all(SEED_NOTE in c.lines and c.ok for c in checks.values())
    deterministic = p.model_copy(update={"target": p.target.model_copy(
        update={"deterministic": True})})
    checks = check_command_lines(deterministic, ["base", "cand"])
    assert not any(SEED_NOTE in c.lines for c in checks.values())


# --------------------------------------------------------------------------- real SGLang

real = pytest.mark.skipif(not REAL, reason="set OSPREY_SGLANG_PYTHON (a real SGLang 0.5.23)")
CPU = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
CPU_ARGS = ["--device", "cpu", "--attention-backend", "torch_native",
            "--prefill-attention-backend", "intel_amx", "--decode-attention-backend", "intel_amx"]


@pytest.mark.engine
@real
def test_real_sglang_refuses_standalone_with_rejection_sampling_at_dry_run() -> None:
    assert REAL is not None
    p = make_pilot(
        {"base": {"role": "baseline"},
         "cand": standalone(MODELS / "tiny-drafter", REJECTION),
         "ok": standalone(MODELS / "tiny-drafter")},
        target={"engine": "sglang", "model": str(MODELS / "tiny-target"), "python": REAL,
                "env": CPU, "engine_args": CPU_ARGS},
    )  # fmt: skip
    checks = check_command_lines(p, ["base", "cand", "ok"])
    assert not checks["cand"].ok, checks["cand"].lines
    assert "would refuse this at launch: NotImplementedError: " in checks["cand"].lines[1]
    assert "speculative_algorithm=STANDALONE" in checks["cand"].lines[1]
    for name in ("base", "ok"):
        assert checks[name].ok, checks[name].lines
        assert "passed SGLang's launch-time checks" in checks[name].lines[1]


def test_a_pilot_named_interpreter_never_sees_the_ci_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pilot is code: target.env's PYTHONPATH plants an `sglang` that the dry run imports.
    It runs, but without the CI job's credentials; the variables the pilot sets itself pass,
    and the dry run names what was withheld."""
    from pytest_osprey.engines.base import BootSpec
    from pytest_osprey.engines.process import engine_env

    planted = tmp_path / "planted" / "sglang"
    planted.mkdir(parents=True)
    seen = tmp_path / "seen.txt"
    (planted / "__init__.py").write_text(
        f"import os\nopen({str(seen)!r}, 'w').write('\\n'.join(sorted(os.environ)))\n")
    for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "SGLANG_API_KEY", "CI_JOB_TOKEN"):
        monkeypatch.setenv(name, "s3cr3t-value")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    p = pilot(env={"PYTHONPATH": str(planted.parent), "MY_SETTING": "x"})
    checks = check_command_lines(p, ["base"])
    names = set(seen.read_text().split("\n"))
    assert not names & {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "SGLANG_API_KEY",
                        "CI_JOB_TOKEN"}
    assert {"PATH", "OMP_NUM_THREADS", "MY_SETTING", "PYTHONPATH"} <= names
    env_line = checks["base"].environment or ""
    assert "MY_SETTING, PYTHONPATH" in env_line and "withheld" in env_line
    assert "s3cr3t" not in env_line
    booted = engine_env(p, "base", BootSpec("base", tmp_path))
    assert "GITHUB_TOKEN" not in booted and booted["MY_SETTING"] == "x"


@pytest.mark.parametrize("fault", ["truncated", "padded", "missing shard"])
def test_a_damaged_target_checkpoint_fails_the_dry_run(tmp_path: Path, fault: str) -> None:
    """Headers and sizes of the target's safetensors are checked before anything boots."""
    import json

    import torch
    from safetensors.torch import save_file

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
    weights = target / "model-00001-of-00002.safetensors"
    save_file({"w": torch.zeros(64, 64)}, str(weights))
    whole = weights.read_bytes()
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "w": weights.name, **({"v": "model-00002-of-00002.safetensors"}
                              if fault == "missing shard" else {})}}))
    if fault == "truncated":
        weights.write_bytes(whole[:-100])
    elif fault == "padded":
        weights.write_bytes(whole + b"\0" * 10)
    checks = check_command_lines(pilot(model=str(target)), ["base"])
    assert not checks["base"].ok
    line = checks["base"].lines[0]
    assert line.startswith("target weights:")
    assert ("missing shard" in line) if fault == "missing shard" else (weights.name in line)
    weights.write_bytes(whole)
    if fault != "missing shard":
        again = check_command_lines(pilot(model=str(target)), ["base"])["base"].lines
        assert not any(ln.startswith("target weights") for ln in again)
