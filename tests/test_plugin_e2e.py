"""End to end through pytest itself (pytester): activation, usage errors, real tiny pilots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Loaded here, once: an in-process pytester run drops the modules it imported when it ends, and
# numpy's extension cannot be imported a second time in one process.
import pytest_osprey.run.pilot_run  # noqa: F401
from testkit.factories import pilot_data, pilot_text

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "fixtures" / "models"
TRACE = ROOT / "prompts" / "pilot.jsonl"


def pilot_yaml(candidate: str, *, speedup_min: float, prompts: int,
               early_stop: bool = True) -> str:
    return pilot_text(pilot_data(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": str(MODELS / candidate),
                  "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        name="e2e",
        # One thread: two threads on two shared cores wait on each other's stragglers: noisy.
        target={"engine": "transformers", "model": str(MODELS / "tiny-target"),
                "context_length": 1024, "threads": 1},
        trace={"files": [str(TRACE)], "slices": ["core"], "limit": prompts},
        max_new_tokens_cap=24,
        load={"levels": {"low": 1, "concurrent": 2}, "warmup_requests": 1, "passes": 2},
        limits={"speedup_min": speedup_min},
        decision={"primary_load": "low", "early_stop": early_stop},
    ))


def test_inactive_without_config(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_plain(request):
            assert "osprey_config" not in request.fixturenames
        def test_no_fixture(request):
            import pytest
            with pytest.raises(pytest.FixtureLookupError):
                request.getfixturevalue("osprey_campaign")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "osprey pilot" not in out and "[osprey]" not in out and "suites" not in out


def test_help_lists_options(pytester: pytest.Pytester) -> None:
    out = pytester.runpytest("--help").stdout.str()
    for opt in ("--osprey-config=PATH", "--osprey-results=DIR", "--osprey-reuse=DIR",
                "--osprey-conditions=A,B"):
        assert opt in out


def test_bad_pilot_is_usage_error_naming_field(pytester: pytest.Pytester) -> None:
    text = pilot_yaml("tiny-drafter", speedup_min=1.0, prompts=2).replace(
        "speedup_min:", "speedup_mni:"
    )
    pytester.makefile(".yaml", pilot=text)
    result = pytester.runpytest("--osprey-config=pilot.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "pilot.yaml:" in err and "limits.speedup_mni" in err and "speedup_min" in err
    assert "Traceback" not in err + result.stdout.str()


def test_missing_drafter_names_condition(pytester: pytest.Pytester) -> None:
    text = pilot_yaml("no-such-drafter", speedup_min=1.0, prompts=2)
    pytester.makefile(".yaml", pilot=text)
    result = pytester.runpytest("--osprey-config=pilot.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "conditions.cand.drafter: no such directory" in result.stderr.str()


def test_unknown_condition_option(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", pilot=pilot_yaml("tiny-drafter", speedup_min=1.0, prompts=2))
    result = pytester.runpytest("--osprey-config=pilot.yaml", "--osprey-conditions=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown condition(s) nope" in result.stderr.str()


def _summary(pytester: pytest.Pytester) -> dict:  # type: ignore[type-arg]
    found = list((pytester.path / "res").glob("summary.json"))
    assert found, "summary.json was not written"
    return json.loads(found[0].read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_small_pilot_runs_then_rejudges(pytester: pytest.Pytester) -> None:
    """A real tiny pilot (8 prompts x 2 passes x 2 levels), then re-judged from its folder.

    The real timings are this machine's (a shared machine measured 1.04x [0.55, 1.97] where an
    idle one measures 1.5x), so the run itself asserts mechanics only: what was sent,
    recorded and written, and an exit status that agrees with the verdict written. The
    verdicts are asserted on the recorded timings, by re-judging the saved campaign against
    minimums placed from its own measured interval: half its low end keeps the drafter,
    twice its high end drops it, whatever speed this machine had."""
    # Both passes run (no early stop): the records and series below count them.
    pytester.makefile(".yaml", pilot=pilot_yaml("tiny-drafter", speedup_min=1.0, prompts=8,
                                                early_stop=False))
    result = pytester.runpytest_subprocess(
        "--osprey-config=pilot.yaml", "--osprey-results=res", "-p", "no:cacheprovider",
        "--benchmark-json=bench.json", timeout=600,
    )
    out = result.stdout.str()
    summary = _summary(pytester)
    verdict = summary["verdicts"][0]["verdict"]
    assert verdict in ("KEEP", "DROP", "INCONCLUSIVE"), summary["verdicts"]
    assert f"{verdict} cand" in out, out
    # KEEP passes; DROP and INCONCLUSIVE (decision.inconclusive: fail, the default) fail.
    assert result.ret == (0 if verdict == "KEEP" else pytest.ExitCode.TESTS_FAILED), out
    _check_benchmark_json(pytester)
    assert "test_04_speed_cost.py" in out
    outcomes = {(g["kind"], g["id"]): g["outcome"] for g in summary["gates"]}
    # Assisted decoding is lossless: greedy identity passes whatever the speed.
    assert outcomes[("greedy_identity", "cand-vs-baseline")] == "pass", outcomes
    sent = [json.loads(r) for r in
            (pytester.path / "res" / "records.jsonl").read_text().splitlines()]
    measured = [r for r in sent if not r["filler"]]
    # 2 conditions x 2 passes x 2 levels x 8 prompts, and the fillers that held the
    # concurrent level's load (recorded, never judged), at that level only
    assert len(measured) == 64
    fillers = [r for r in sent if r["filler"]]
    assert fillers and {r["concurrency"] for r in fillers} == {max(r["concurrency"] for r in sent)}
    records = [json.dumps(r, separators=(",", ":")) for r in measured]
    rec = measured[0]
    for key in ("schema", "run_id", "condition", "block", "load", "prompt_id", "ttft_s",
                "e2e_s", "output_ids", "top2_margin", "spec_verify_ct", "accept_length"):
        assert key in rec
    drafted = [json.loads(r) for r in records if '"condition":"cand"' in r]
    assert all(r["accept_length"] > 1.0 for r in drafted)
    meta = json.loads((pytester.path / "res" / "campaign.json").read_text())
    assert meta["status"] == "complete"
    assert (meta["plan"]["passes"], meta["plan"]["order"]) == (2, "interleaved")

    # Re-judged under the same pilot, booting nothing: the same sheet, in a marked copy
    # beside the untouched original.
    original = (pytester.path / "res" / "summary.json").read_text()
    same = pytester.runpytest_subprocess(
        "--osprey-config=pilot.yaml", "--osprey-reuse=res", "-p", "no:cacheprovider",
        "-p", "no:benchmark", timeout=300,
    )
    assert same.ret == result.ret and "booting" not in same.stdout.str()
    assert (pytester.path / "res" / "summary.json").read_text() == original
    copy = json.loads(next((pytester.path / "res").glob("rejudged-*/summary.json")).read_text())
    assert copy["rejudged"]
    assert {**copy, "rejudged": None} == json.loads(original)

    # The verdicts, on these recorded timings: a minimum under the measured interval keeps
    # the drafter, one above it drops it; neither boots anything.
    gate = next(g for g in summary["gates"] if g["id"] == "cand-vs-baseline-low"
                and g["kind"] == "speedup")
    low, high = gate["ci"]
    assert 0 < low <= gate["estimate"] <= high, gate
    for name, minimum, want in (("lax", low / 2, "KEEP"), ("strict", high * 2, "DROP")):
        pytester.makefile(".yaml", **{name: pilot_yaml("tiny-drafter", speedup_min=minimum,
                                                       prompts=8, early_stop=False)})
        again = pytester.runpytest_subprocess(
            f"--osprey-config={name}.yaml", "--osprey-reuse=res", "-p", "no:cacheprovider",
            "-p", "no:benchmark", timeout=300,
        )
        text = again.stdout.str()
        assert f"{want} cand" in text and "booting" not in text, text
        assert again.ret == (0 if want == "KEEP" else pytest.ExitCode.TESTS_FAILED), text


def _check_benchmark_json(pytester: pytest.Pytester) -> None:
    """The recorded latency series in pytest-benchmark's JSON, and its compare tool reads it."""
    import statistics
    import subprocess
    import sys

    bench = json.loads((pytester.path / "bench.json").read_text())
    got = {b["param"]: b for b in bench["benchmarks"]}
    want = {f"{c}-{lv}-{m}" for c in ("baseline", "cand") for lv in ("low", "concurrent")
            for m in ("e2e", "ttft")}  # fmt: skip
    assert set(got) == want
    records = [json.loads(line) for line in
               (pytester.path / "res" / "records.jsonl").read_text().splitlines()]
    for c in ("baseline", "cand"):
        e2e = [r["e2e_s"] for r in records
               if r["condition"] == c and r["load"] == "low" and r["mode"] == "greedy"]
        entry = got[f"{c}-low-e2e"]
        assert entry["group"] == "osprey low e2e" and entry["extra_info"]["condition"] == c
        assert entry["stats"]["rounds"] == len(e2e) == 16  # 8 prompts x 2 passes
        assert entry["stats"]["median"] == pytest.approx(statistics.median(e2e))
        assert entry["stats"]["max"] == pytest.approx(max(e2e))
    cli = Path(sys.executable).with_name("pytest-benchmark")
    shown = subprocess.run([str(cli), "compare", str(pytester.path / "bench.json")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "test_latency_series[cand-low-e2e]" in shown.stdout


@pytest.mark.slow
def test_weak_drafter_pilot_fails_on_speed(pytester: pytest.Pytester) -> None:
    """The weak drafter (accept length near 1) measured for real, its DROP line read from a
    re-judging of those recorded timings against a minimum twice the measured interval's
    high end: the words are asserted whatever speed a shared machine had."""
    pytester.makefile(".yaml", pilot=pilot_yaml("tiny-drafter-weak", speedup_min=1.1, prompts=12))
    measured = pytester.runpytest_subprocess(
        "--osprey-config=pilot.yaml", "--osprey-results=res", "-p", "no:cacheprovider",
        timeout=600,
    )
    assert measured.ret in (0, pytest.ExitCode.TESTS_FAILED), measured.stdout.str()
    gate = next(g for g in _summary(pytester)["gates"]
                if (g["kind"], g["id"]) == ("speedup", "cand-vs-baseline-low"))
    pytester.makefile(".yaml", strict=pilot_yaml("tiny-drafter-weak", speedup_min=2 * gate["ci"][1],
                                                 prompts=12))
    result = pytester.runpytest_subprocess(
        "--osprey-config=strict.yaml", "--osprey-reuse=res", "-p", "no:cacheprovider",
        timeout=300,
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "FAILED" in out and "test_speedup[cand-vs-baseline-low]" in out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DROP cand:"))
    verdict = lines[at]
    assert len(verdict) <= 160 and "p=" not in verdict and "[cand-" not in verdict
    assert "speedup " in verdict  # its measured value is this machine's (0.7x to 1.0x seen)
    # The reason is named, and the diagnosis says what an accept length near 1 means (the
    # headline gives its room to the checks that did not run before the accept length).
    assert lines[at + 1].startswith("  - speed at low: ")
    assert "never accepted" in lines[at + 2] or "almost never accepted" in lines[at + 2]
    assert "accept 1.0" in verdict or "accept length 1.0" in lines[at + 2]
    assert "unchecked:" in verdict  # no sampled pass, no expect checks passed by the baseline
    # Quality and completion still pass: the weak drafter is dropped for speed alone.
    summary = json.loads(next((pytester.path / "res").glob("rejudged-*/summary.json")).read_text())
    outcomes = {(g["kind"], g["id"]): g["outcome"] for g in summary["gates"]}
    assert outcomes[("greedy_identity", "cand-vs-baseline")] == "pass"
    assert outcomes[("artifact", "cand")] == "pass"


@pytest.mark.slow  # boots the tiny models
def test_osprey_server_fixture_for_live_tests(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", pilot=pilot_yaml("tiny-drafter", speedup_min=1.0, prompts=2))
    pytester.makepyfile(test_live="""
        import asyncio
        from pytest_osprey.engines import GenerationRequest

        def test_candidate_answers(osprey_server):
            engine = osprey_server("cand")
            assert osprey_server("cand") is engine  # booted once per session
            res = asyncio.run(engine.generate(GenerationRequest("p1", "def add(a, b):", 8)))
            assert res.ok and len(res.output_ids) == 8 and res.accept_length >= 1.0

        def test_unknown_condition(osprey_server):
            import pytest
            with pytest.raises(pytest.UsageError, match="unknown condition 'nope'"):
                osprey_server("nope")
    """)
    result = pytester.runpytest_subprocess(
        "--osprey-config=pilot.yaml", "--osprey-dry-run", "test_live.py", "-p",
        "no:cacheprovider", timeout=300,
    )
    result.assert_outcomes(passed=5)  # 2 live tests + 3 preflight gates of the dry run
