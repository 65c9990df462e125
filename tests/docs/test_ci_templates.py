"""The CI templates users copy (ci-templates/): they pass GitHub's and GitLab's schemas (and
actionlint where it is installed), their matrices cover shards 1..N, and their scripts, run as
the runners run them with a stand-in for `python -m pytest_osprey`, keep a shard that measured,
fail one that did not, and fail the judging job on DROP/INCONCLUSIVE (merge exit 1) or a
refusal while still writing the report. The pull-request comment script, run with node against
a stand-in GitHub client, keeps one comment per pull request."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.factories import ROOT

TEMPLATES = ROOT / "ci-templates"
PILOT_WF = TEMPLATES / "github" / "osprey-pilot.yml"
REJUDGE_WF = TEMPLATES / "github" / "osprey-rejudge.yml"
GITLAB = TEMPLATES / "gitlab" / ".gitlab-ci.yml"
WORKFLOWS = [PILOT_WF, REJUDGE_WF]


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _step(job: dict[str, Any], name: str) -> dict[str, Any]:
    (step,) = (s for s in job["steps"] if s.get("name") == name)
    return step


def _schema_check(schema: str, *files: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("check_jsonschema")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema,
                           *map(str, files)], capture_output=True, text=True, timeout=120,
                          check=False)


# ---------------------------------------------------------------- linters


def test_workflows_pass_the_github_workflow_schema(tmp_path: Path) -> None:
    done = _schema_check("vendor.github-workflows", *WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr
    # Planted in the text (PyYAML would read the key `on` back as true): a misspelt key.
    text = PILOT_WF.read_text()
    judge = text.index("\n  judge:")
    (tmp_path / "broken.yml").write_text(
        text[:judge] + text[judge:].replace("    steps:", "    step:", 1))
    assert _schema_check("vendor.github-workflows", tmp_path / "broken.yml").returncode != 0


def test_the_gitlab_pipeline_passes_the_gitlab_ci_schema(tmp_path: Path) -> None:
    done = _schema_check("vendor.gitlab-ci", GITLAB)
    assert done.returncode == 0, done.stdout + done.stderr
    text = GITLAB.read_text()
    assert "  parallel: 4\n" in text
    (tmp_path / ".gitlab-ci.yml").write_text(  # planted: not a count
        text.replace("  parallel: 4\n", "  parallel: four\n"))
    assert _schema_check("vendor.gitlab-ci", tmp_path / ".gitlab-ci.yml").returncode != 0


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # a venv's, though not on PATH
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (the test extra installs it on x86-64 Linux)")
    return found


def _actionlint(*workflows: Path) -> subprocess.CompletedProcess[str]:
    """actionlint with shellcheck over the `run:` scripts (named, so none is skipped)."""
    config = TEMPLATES / "actionlint.yaml"  # the GPU runners' label
    return subprocess.run([_tool("actionlint"), f"-shellcheck={_tool('shellcheck')}",
                           "-config-file", str(config), *map(str, workflows)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_workflows_pass_actionlint() -> None:
    done = _actionlint(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_checks_the_run_scripts(tmp_path: Path) -> None:
    """A planted unquoted variable in a `run:` script is found: shellcheck really runs."""
    bad = tmp_path / "bad.yml"
    bad.write_text("name: bad\non: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
                   "    steps:\n      - run: cd $RESULTS_DIR\n")
    done = _actionlint(bad)
    assert done.returncode == 1 and "SC2086" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------- what the templates call


def test_the_matrix_covers_every_shard_and_the_judge_needs_no_gpu() -> None:
    wf = _load(PILOT_WF)
    n = int(wf["env"]["OSPREY_SHARDS"])
    shard, judge = wf["jobs"]["shard"], wf["jobs"]["judge"]
    assert shard["strategy"]["matrix"]["shard"] == list(range(1, n + 1))
    assert shard["strategy"]["fail-fast"] is False  # one shard failing stops no other
    measure = _step(shard, "Measure")
    assert measure["env"]["SHARD"] == "${{ matrix.shard }}"
    assert 'run "$PILOT" --shard "$SHARD/$OSPREY_SHARDS"' in measure["run"]
    assert "gpu" in shard["runs-on"] and "self-hosted" in shard["runs-on"]
    assert judge["needs"] == "shard" and "!cancelled()" in judge["if"]
    assert judge["runs-on"] == "ubuntu-latest"
    assert "pytest_osprey merge merged shards/osprey-shard-*" in _step(judge,
                                                                      "Merge and judge")["run"]
    uploads = [s["with"]["name"] for s in shard["steps"] if "upload-artifact" in s.get("uses", "")]
    assert uploads == ["osprey-shard-${{ matrix.shard }}"]
    assert judge["permissions"]["pull-requests"] == "write"
    assert wf["permissions"] == {"contents": "read"}  # the GPU jobs get no write token


def test_no_script_interpolates_an_expression() -> None:
    """Values reach scripts through env (no script injection); this also lets the tests below
    run the scripts exactly as written."""
    for path in WORKFLOWS:
        for job in _load(path)["jobs"].values():
            for step in job["steps"]:
                assert "${{" not in step.get("run", ""), (path.name, step.get("name"))


# ---------------------------------------------------------------- the scripts, run

FAKE_PYTHON = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:2] == ["-m", "pip"]:
    sys.exit(0)
assert args[:2] == ["-m", "pytest_osprey"], args
if args[2] == "run":
    Path(args[args.index("--results") + 1]).mkdir(parents=True)
    sys.exit(int(os.environ.get("FAKE_RUN_RC", "0")))
if args[2] == "merge":
    out = Path([a for a in args[3:] if not a.startswith("--")][0])
    out.mkdir(parents=True)
    (out / "report.md").write_text("## report of " + str(len(args)) + " args\\n")
    sys.exit(int(os.environ.get("FAKE_MERGE_RC", "0")))
sys.exit(99)
"""


class Runner:
    """A runner's shell in tmp: the stand-in python first on PATH, the log of its calls."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "python").write_text(FAKE_PYTHON.format(python=sys.executable))
        (bin_dir / "python").chmod(0o755)
        self.output, self.summary = tmp / "output", tmp / "summary"
        self.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp / "log"),
                    "GITHUB_OUTPUT": str(self.output), "GITHUB_STEP_SUMMARY": str(self.summary)}

    def bash(self, script: str, **env: str) -> int:
        """As GitHub runs `shell: bash` (and GitLab its script): errexit and pipefail."""
        path = self.tmp / "step.sh"
        path.write_text(script)
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)],
                              cwd=self.tmp, env={**self.env, **env}, timeout=60,
                              check=False).returncode

    def calls(self) -> list[list[str]]:
        log = self.tmp / "log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def outputs(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.output.read_text().splitlines())


@pytest.mark.parametrize(("run_rc", "step_rc"), [(0, 0), (1, 0), (2, 2), (3, 3), (4, 4)])
def test_the_shard_step_keeps_a_measured_shard_and_fails_one_that_did_not(
        tmp_path: Path, run_rc: int, step_rc: int) -> None:
    wf, runner = _load(PILOT_WF), Runner(tmp_path)
    step = _step(wf["jobs"]["shard"], "Measure")
    assert runner.bash(step["run"], **wf["env"], SHARD="3", FAKE_RUN_RC=str(run_rc)) == step_rc
    (call,) = runner.calls()
    assert call[2:] == ["run", "pilot.yaml", "--shard", "3/4", "--results",
                        "osprey-results/shard-3"]


@pytest.mark.parametrize("workflow", ["pilot", "rejudge"])
@pytest.mark.parametrize(("merge_rc", "fails"), [(0, False), (1, True), (2, True), (4, True)])
def test_the_judge_writes_the_summary_and_fails_on_drop_or_refusal(
        tmp_path: Path, workflow: str, merge_rc: int, fails: bool) -> None:
    path = PILOT_WF if workflow == "pilot" else REJUDGE_WF
    wf, runner = _load(path), Runner(tmp_path)
    job = wf["jobs"]["judge" if workflow == "pilot" else "rejudge"]
    merge = _step(job, "Merge and judge" if workflow == "pilot" else "Merge and judge again")
    for k in (1, 2):
        (tmp_path / "shards" / f"osprey-shard-{k}").mkdir(parents=True)
    extra = {"PARTIAL": "true"} if workflow == "rejudge" else {}
    assert runner.bash(merge["run"], FAKE_MERGE_RC=str(merge_rc), **extra) == 0  # judged later
    (call,) = runner.calls()
    assert call[2] == "merge" and call[-2:] == ["shards/osprey-shard-1", "shards/osprey-shard-2"]
    assert ("--partial" in call) == (workflow == "rejudge")
    assert runner.summary.read_text().startswith("## report of")
    rc = runner.outputs()["rc"]
    assert rc == str(merge_rc)
    verdict = runner.bash(_step(job, "Verdict")["run"], RC=rc)
    assert (verdict != 0) == fails
    if merge_rc == 2:  # a partial merge stays a partial campaign's code, as `report` gives it
        assert verdict == 2
    assert runner.bash(_step(job, "Verdict")["run"], RC="") != 0  # the merge never ran


def test_the_pr_comment_is_one_comment_updated_in_place(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed")
    script = _step(_load(PILOT_WF)["jobs"]["judge"], "Comment on the pull request")["with"][
        "script"]
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "report.md").write_text("x" * 70_000)
    harness = """
const calls = [];
const existing = JSON.parse(process.env.EXISTING);
const github = {
  paginate: async (fn, params) => { calls.push(['list', params.issue_number]); return existing; },
  rest: { issues: {
    listComments: 'listComments',
    updateComment: async (p) => calls.push(['update', p.comment_id, p.body.length]),
    createComment: async (p) => calls.push(['create', p.issue_number, p.body.length]),
  } },
};
const context = { repo: { owner: 'o', repo: 'r' }, issue: { number: 7 } };
(async () => { SCRIPT
})().then(() => console.log(JSON.stringify(calls)));
""".replace("SCRIPT", script)
    (tmp_path / "harness.js").write_text(harness)
    marker = "<!-- pytest-osprey report -->"

    def calls(existing: list[dict[str, Any]]) -> list[list[Any]]:
        done = subprocess.run([node, "harness.js"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=True,
                              env={**os.environ, "EXISTING": json.dumps(existing)})
        result: list[list[Any]] = json.loads(done.stdout)
        return result

    bot, user = {"type": "Bot"}, {"type": "User"}
    assert calls([]) == [["list", 7], ["create", 7, 65000]]
    assert calls([{"id": 1, "user": user, "body": marker + " quoted"},
                  {"id": 2, "user": bot, "body": "another bot"},
                  {"id": 3, "user": bot, "body": marker + "\nold"}]) == [
        ["list", 7], ["update", 3, 65000]]


def test_the_gitlab_pipeline_shards_by_node_index_and_judges_without_a_gpu(
        tmp_path: Path) -> None:
    ci = _load(GITLAB)
    shard, judge = ci["osprey-shard"], ci["osprey-judge"]
    assert isinstance(shard["parallel"], int) and shard["parallel"] >= 2
    assert shard["artifacts"]["when"] == "always"
    assert judge["needs"] == [{"job": "osprey-shard", "artifacts": True}]
    assert "tags" not in judge and all(r["when"] == "always" for r in judge["rules"])
    runner = Runner(tmp_path)
    env = {k: str(v) for k, v in ci["variables"].items()}
    for index, (run_rc, want) in enumerate([(0, 0), (1, 0), (4, 4)], 1):
        got = runner.bash("\n".join(shard["script"]), **env, CI_NODE_INDEX=str(index),
                          CI_NODE_TOTAL=str(shard["parallel"]), FAKE_RUN_RC=str(run_rc))
        assert got == want
    shards = [c[c.index("--shard") + 1] for c in runner.calls() if "run" in c]
    assert shards == [f"{k}/{shard['parallel']}" for k in (1, 2, 3)]
    for merge_rc in (0, 1, 2, 4):
        shutil.rmtree(tmp_path / "merged", ignore_errors=True)
        assert runner.bash("\n".join(judge["script"]), **env,
                           FAKE_MERGE_RC=str(merge_rc)) == merge_rc
    merge = [c for c in runner.calls() if "merge" in c][-1]
    assert merge[3:] == ["merged", *(f"osprey-results/shard-{k}" for k in (1, 2, 3))]
    assert re.search(r"\bexit \"\$rc\"", judge["script"][-1])
