"""`init`: a pilot written from flags (an SGLang stack, an endpoint stack) loads and its dry run
passes; the prompts fill what the flags leave out in a terminal; speculation follows each
drafter's architecture; SGLang's version and defaults are asked of its own Python; an
existing file is never replaced without --force; missing or bad values exit 4 in one line
naming the flag or field, and leave nothing behind."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from pytest_osprey.__main__ import main
from pytest_osprey.engines.kinds import CHAIN_SPEC, OSPREY_SPEC
from pytest_osprey.engines.sglang.defaults import sglang_defaults
from pytest_osprey.init_pilot import drafter_answer
from pytest_osprey.pilot import load_pilot
from pytest_osprey.pilot.writer import Answers, pilot_text, write_pilot
from testkit.fake_server import Reply, ScriptedServer
from testkit.pilot_run import FAKEPKGS

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "fixtures" / "models"
TRACE = ROOT / "prompts" / "pilot.jsonl"


def wrapper(folder: Path, site: Path) -> Path:
    """An engine 'venv' Python: this one, with ``site`` (fake engine packages) importable."""
    path = folder / "engine-python"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", Pipe())


def run_init(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["init", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # over a second on 2 busy cores
def test_sglang_stack_from_flags_loads_and_its_dry_run_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None) -> None:
    python = wrapper(tmp_path, FAKEPKGS)  # the fake SGLang: its parser checks the lines
    out = tmp_path / "stack" / "pilot.yaml"
    code, said, err = run_init(
        capsys, "--engine", "sglang", "--python", python, "--target", MODELS / "tiny-target",
        "--drafter", f"today={MODELS / 'tiny-eagle3'}", "--drafter", MODELS / "tiny-drafter",
        "--temperature", "0.7", "--top-p", "0.9", "--concurrency", "16", "--trace", TRACE,
        "--out", out)
    assert code == 0, err
    assert f"wrote {out}" in said and "dry run: nothing was booted" in said
    assert "command line FAILED" not in said and "artifact" in said and "FAILED" not in said
    pilot = load_pilot(out)
    assert pilot.target.engine == "sglang" and pilot.target.python == str(python)
    # the first of two drafters serves today; a bare path is named after its folder
    assert {n: c.role for n, c in pilot.conditions.items()} == {
        "baseline": "baseline", "today": "current", "tiny-drafter": "candidate"}
    today, plain = pilot.conditions["today"], pilot.conditions["tiny-drafter"]
    assert today.speculation is not None and plain.speculation is not None
    assert (today.speculation.algorithm, today.speculation.num_steps) == ("EAGLE3", 3)
    assert plain.speculation.algorithm == "STANDALONE" and not plain.speculation.adaptive
    assert Path(str(today.drafter)) == MODELS / "tiny-eagle3"
    assert {k: v for k, v in pilot.load.levels.items()} == {"low": 1, "served": 16}
    assert pilot.decision.primary_load == "served" and pilot.load.order == "sequential"
    assert (pilot.sampling.serving.temperature, pilot.sampling.serving.top_p) == (0.7, 0.9)
    text = out.read_text()
    assert "# A 1-layer EAGLE-3 draft" in text and "kill switch" in text


def test_speculation_follows_each_drafters_architecture(tmp_path: Path) -> None:
    osprey = drafter_answer("sglang", "o", str(MODELS / "tiny-osprey"), "candidate", tmp_path)
    eagle3 = drafter_answer("sglang", "e", str(MODELS / "tiny-eagle3"), "candidate", tmp_path)
    assert osprey.speculation == {"algorithm": "EAGLE3", **OSPREY_SPEC, "adaptive": False}
    assert "Osprey" in osprey.why[0] and "patch" in osprey.why[0]
    assert eagle3.speculation == {"algorithm": "EAGLE3", **CHAIN_SPEC, "adaptive": False}
    on_vllm = [drafter_answer("vllm", "x", str(MODELS / m), "candidate", tmp_path)
               for m in ("tiny-eagle3", "tiny-drafter")]
    assert [a.speculation["algorithm"] for a in on_vllm if a.speculation] == [
        "eagle3", "draft_model"]
    assert "plain causal-LM drafter" in on_vllm[1].why[0]
    unread = drafter_answer("sglang", "u", str(tmp_path / "absent"), "candidate", tmp_path)
    assert unread.speculation is not None and unread.speculation["algorithm"] == "STANDALONE"
    assert "not readable here" in unread.why[0]


def fake_sglang_site(site: Path, version: str, defaults: dict[str, object]) -> None:
    """An installed SGLang as far as init asks: its distribution's version and a ServerArgs
    dataclass with these defaults."""
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    fields = "\n".join(f"    {k}: object = {v!r}" for k, v in defaults.items())
    (site / "sglang" / "srt" / "server_args.py").write_text(
        f"import dataclasses\n\n@dataclasses.dataclass\nclass ServerArgs:\n{fields}\n")
    meta = site / f"sglang-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")


def test_sglang_is_asked_its_version_and_defaults(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None) -> None:
    site = tmp_path / "site"
    planted = {"mem_fraction_static": 0.77, "max_running_requests": 12,
               "speculative_num_steps": None, "unrelated_flag": 5}
    fake_sglang_site(site, "9.8.7", planted)
    python = wrapper(tmp_path, site)
    answer = sglang_defaults(str(python))
    assert answer.version == "9.8.7"
    assert answer.defaults == {k: v for k, v in planted.items() if k != "unrelated_flag"}
    out = tmp_path / "pilot.yaml"
    code, said, err = run_init(
        capsys, "--engine", "sglang", "--python", python, "--target", MODELS / "tiny-target",
        "--drafter", f"e={MODELS / 'tiny-eagle3'}", "--temperature", "0", "--concurrency", "1",
        "--trace", TRACE, "--out", out, "--no-dry-run")
    assert code == 0, err
    pilot = load_pilot(out)
    assert pilot.conditions["e"].pins.engine_version == "9.8.7"  # fairness holds it to this
    assert "mem_fraction_static 0.77" in out.read_text() and "SGLang 9.8.7" in said
    assert pilot.load.levels == {"low": 1} and pilot.decision.primary_load == "low"
    # not importable: said, and nothing is pinned
    bare = sglang_defaults(sys.executable)
    assert not bare.asked and "not importable" in bare.line()


@pytest.mark.slow  # over a second on 2 busy cores
def test_endpoint_stack_reports_an_unreachable_server_and_its_dry_run_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None) -> None:
    models = Reply(json_body={"object": "list", "data": [{"id": "tiny-served"}]})
    with ScriptedServer({("GET", "/v1/models"): models}) as server:
        out = tmp_path / "pilot.yaml"
        code, said, err = run_init(
            capsys, "--engine", server.url, "--target", MODELS / "tiny-target",
            "--drafter", "spec=http://127.0.0.1:9", "--temperature", "0.5",
            "--concurrency", "4", "--trace", TRACE, "--out", out)
    assert code == 0, err
    assert f"{server.url}: serves tiny-served" in said
    assert "http://127.0.0.1:9: not reachable now" in said  # said, not a traceback
    assert "Traceback" not in said + err
    assert "endpoint http://127.0.0.1:9 (openai): nothing is launched" in said
    pilot = load_pilot(out)
    assert pilot.target.engine == "endpoint" and pilot.load.order == "interleaved"
    base, spec = pilot.conditions["baseline"], pilot.conditions["spec"]
    assert base.endpoint is not None and base.endpoint.url == server.url
    assert spec.endpoint is not None and spec.role == "candidate" and spec.drafter is None


def test_prompts_fill_what_the_flags_leave_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs.jsonl"
    logs.write_text("".join(json.dumps({"prompt": f"question {i} about topic {i * 7}"}) + "\n"
                            for i in range(30)))
    answers = iter(["vllm", str(MODELS / "tiny-target"), f"a={MODELS / 'tiny-drafter'}",
                    f"b={MODELS / 'tiny-eagle3'}", "", "b", "warm", "0.8", "0.95", "6",
                    f"build {logs}"])
    asked: list[str] = []

    def fake_input(question: str) -> str:
        asked.append(question)
        return next(answers)

    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", fake_input)
    out = tmp_path / "pilot.yaml"
    code, said, err = run_init(capsys, "--out", out, "--no-dry-run")
    assert code == 0, err
    assert len(asked) == 11 and asked[0].startswith("Engine")
    # a wrong answer is asked again, saying why
    assert asked[7].startswith("(--temperature: 'warm' is not a number) Serving temperature")
    pilot = load_pilot(out)
    assert pilot.target.engine == "vllm"
    assert {n: c.role for n, c in pilot.conditions.items()} == {
        "baseline": "baseline", "a": "candidate", "b": "current"}
    b = pilot.conditions["b"].speculation
    assert b is not None and b.algorithm == "eagle3"  # its config says EAGLE-3
    assert (pilot.sampling.serving.temperature, pilot.sampling.serving.top_p) == (0.8, 0.95)
    assert pilot.load.levels == {"low": 1, "served": 6}
    built = tmp_path / "pilot-trace.jsonl"  # `trace build` ran on the logs
    assert pilot.trace.files == [built] and built.is_file() and "prompts" in said


def test_an_existing_pilot_is_kept_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None) -> None:
    out = tmp_path / "pilot.yaml"
    out.write_text("mine\n")
    flags = ["--engine", "transformers", "--target", MODELS / "tiny-target", "--drafter",
             f"d={MODELS / 'tiny-drafter'}", "--temperature", "0", "--concurrency", "2",
             "--trace", TRACE, "--out", out, "--no-dry-run"]
    code, _, err = run_init(capsys, *flags)
    assert code == 4 and err.count("\n") == 1 and str(out) in err and "--force" in err
    assert out.read_text() == "mine\n"
    code, _, err = run_init(capsys, *flags, "--force")
    assert code == 0, err
    assert load_pilot(out).conditions["d"].speculation is not None


def test_missing_values_without_a_terminal_exit_4_naming_the_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None) -> None:
    out = tmp_path / "pilot.yaml"
    code, _, err = run_init(capsys, "--engine", "sglang", "--target", "m",
                            "--drafter", "d=/x", "--out", out)
    assert code == 4 and err.count("\n") == 1
    assert "--temperature" in err and "--concurrency" in err and "--trace" in err
    assert "--engine" not in err and not out.exists()


def test_a_bad_value_names_its_field_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None) -> None:
    out = tmp_path / "pilot.yaml"
    code, _, err = run_init(
        capsys, "--engine", "transformers", "--target", MODELS / "tiny-target",
        "--drafter", f"bad name={MODELS / 'tiny-drafter'}", "--temperature", "0",
        "--concurrency", "2", "--trace", TRACE, "--out", out)
    assert code == 4 and "condition name 'bad name'" in err and str(out) in err
    assert list(tmp_path.iterdir()) == []  # neither the pilot nor its temporary file
    code, _, err = run_init(capsys, "--engine", "tgi", "--target", "m", "--drafter", "d=/x",
                            "--temperature", "0", "--concurrency", "2", "--trace", TRACE,
                            "--out", out)
    assert code == 4 and "--engine 'tgi'" in err
    common = ["--engine", "sglang", "--target", "m", "--drafter", "d=/x", "--drafter", "e=/y",
              "--concurrency", "2", "--trace", TRACE, "--out", out]
    code, _, err = run_init(capsys, *common, "--temperature", "0.7", "--top-p", "0")
    assert code == 4 and "--top-p" in err  # 0 is no top-p, not the default 1.0
    code, _, err = run_init(capsys, *common, "--temperature", "0", "--current", "f")
    assert code == 4 and "--current 'f'" in err and "d, e" in err
    assert not out.exists()


def test_sglang_above_48_in_flight_says_so_and_the_text_loads(tmp_path: Path) -> None:
    drafter = drafter_answer("sglang", "e", str(MODELS / "tiny-eagle3"), "candidate", tmp_path)
    answers = Answers(engine="sglang", target="org/model", drafters=(drafter,),
                      trace=str(TRACE), temperature=0.0, concurrency=64)
    text = pilot_text(answers)
    assert "--max-running-requests" in text
    pilot = write_pilot(text, tmp_path / "p.yaml")
    assert pilot.load.levels == {"low": 1, "served": 64} and pilot.target.model == "org/model"
    few = pilot_text(Answers(engine="sglang", target="org/model", drafters=(drafter,),
                             trace=str(TRACE), temperature=0.0, concurrency=48))
    assert "--max-running-requests" not in few
