"""`python -m pytest_osprey k8s`: the manifests pass the Kubernetes object schemas (the
`kubernetes` client's models, which refuse planted faults), and their shell scripts, run with
stand-ins for `python -m pytest_osprey` and the aws CLI, hand shard K = index + 1 of N to
`run`, keep a DROP shard as measured, fail a refused one, and merge every shard in order."""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_osprey.__main__ import EXIT_USAGE, main
from pytest_osprey.pilot.base import ConfigError
from pytest_osprey.shards.k8s import K8sOptions, manifests, merge_script, render, shard_script
from testkit.factories import ROOT
from testkit.k8s_models import ManifestError, validate

pytest.importorskip("kubernetes")

BASE = K8sOptions(pilot="pilots/p.yaml", shards=3, image="ghcr.io/acme/osprey:1", name="osprey-p",
                  gpus=2)
VARIANTS = {
    "claim-made": BASE,
    "claim-given": K8sOptions(**{**BASE.__dict__, "pvc": "shared-rwx", "namespace": "ml",
                                 "secrets": ("hf-token",), "workdir": "/work"}),
    "object-store": K8sOptions(**{**BASE.__dict__, "object_store": "s3://bucket/osprey/"}),
    "no-gpu": K8sOptions(**{**BASE.__dict__, "gpus": 0, "storage_class": "nfs"}),
}


def _jobs(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    shard, merge = (d for d in docs if d["kind"] == "Job")
    return shard, merge


@pytest.mark.parametrize("variant", VARIANTS)
def test_manifests_pass_the_kubernetes_models(variant: str) -> None:
    o = VARIANTS[variant]
    docs = manifests(o)
    assert list(yaml.safe_load_all(render(docs, "header"))) == docs  # the YAML is the data
    models = [validate(d) for d in docs]
    kinds = [d["kind"] for d in docs]
    assert kinds == (["PersistentVolumeClaim"] if variant in ("claim-made", "no-gpu") else []) \
        + ["Job", "Job"]
    shard, merge = _jobs(docs)
    spec = models[kinds.index("Job")].spec
    assert (spec.completion_mode, spec.completions, spec.parallelism) == ("Indexed", 3, 3)
    container = spec.template.spec.containers[0]
    limits = container.resources.limits or {}
    assert limits == ({"nvidia.com/gpu": "2"} if o.gpus else {})
    merge_pod = merge["spec"]["template"]["spec"]
    assert "limits" not in merge_pod["containers"][0]["resources"]  # judged without a GPU
    assert not merge_pod.get("tolerations")
    volume = shard["spec"]["template"]["spec"]["volumes"][0]
    if o.object_store:
        assert volume == {"name": "results", "emptyDir": {}}
    else:
        assert volume["persistentVolumeClaim"]["claimName"] == (o.pvc or "osprey-p-results")
        assert merge_pod["volumes"][0] == volume  # the merge reads the shards' claim
    if variant in ("claim-made", "no-gpu"):
        assert docs[0]["spec"]["accessModes"] == ["ReadWriteMany"]


def _planted(path: tuple[Any, ...], change: str) -> dict[str, Any]:
    job = copy.deepcopy(_jobs(manifests(BASE))[0])
    node: Any = job
    for key in path[:-1]:
        node = node[key]
    if change == "delete":
        del node[path[-1]]
    elif change == "string":
        node[path[-1]] = str(node[path[-1]])
    else:
        node[change] = 1
    return job


POD = ("spec", "template", "spec")


@pytest.mark.parametrize(("path", "change"), [
    (("spec", "completions"), "string"),  # a count given as text
    (("spec", "x"), "completionsMode"),  # a misspelt field
    ((*POD, "containers", 0, "name"), "delete"),  # a required field missing
    ((*POD, "containers", 0, "x"), "gpus"),  # a field the container has not
    ((*POD, "volumes", 0, "x"), "claim"),
])
def test_planted_faults_are_refused(path: tuple[Any, ...], change: str) -> None:
    with pytest.raises(ManifestError):
        validate(_planted(path, change))


# ---------------------------------------------------------------- the scripts, run

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$3" in
  run) mkdir -p "$8" && echo "$6" > "$8/shard.txt"; exit "${FAKE_RUN_RC:-0}";;
  merge) mkdir -p "$4" && echo "report of $#" > "$4/report.md"; exit "${FAKE_MERGE_RC:-0}";;
esac
exit 99
"""

FAKE_AWS = """#!{python}
import os, shutil, sys
from pathlib import Path
root = Path(os.environ["FAKE_S3"])
args = [a for a in sys.argv[2:] if a not in ("--only-show-errors", "--recursive")]
def at(url):
    return root / url.removeprefix("s3://") if url.startswith("s3://") else Path(url)
if args[0] == "ls":
    sys.exit(0 if at(args[1]).exists() else 1)
if args[0] == "rm":
    p = at(args[1])
    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
elif args[1] == "-":
    at(args[2]).parent.mkdir(parents=True, exist_ok=True)
    at(args[2]).write_bytes(sys.stdin.buffer.read())
else:
    shutil.copytree(at(args[1]), at(args[2]), dirs_exist_ok=True)
"""


@pytest.fixture
def pod(tmp_path: Path) -> dict[str, str]:
    """The environment of a pod: the stand-ins first on PATH, the results mount in tmp."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python", FAKE_PYTHON), ("aws", FAKE_AWS.format(python=sys.executable))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "mount").mkdir()
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OSPREY_RESULTS": str(tmp_path / "mount"),
            "FAKE_LOG": str(tmp_path / "log"), "FAKE_S3": str(tmp_path / "s3")}


def _sh(script: str, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", script], env={**env, **extra}, text=True,
                          capture_output=True, timeout=60, check=False)


def _log(env: dict[str, str]) -> list[str]:
    path = Path(env["FAKE_LOG"])
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("variant", ["claim-made", "object-store"])
def test_each_index_runs_its_shard_and_the_merge_takes_them_all(variant: str,
                                                                pod: dict[str, str]) -> None:
    o = VARIANTS[variant]
    for index, rc in ((0, "0"), (1, "1"), (2, "0")):  # a shard whose own gates fail: measured
        done = _sh(shard_script(o), pod, JOB_COMPLETION_INDEX=str(index), FAKE_RUN_RC=rc)
        assert done.returncode == 0, done.stderr
    runs = _log(pod)
    assert [line.split()[5] for line in runs] == ["1/3", "2/3", "3/3"]
    assert all(line.split()[2:4] == ["run", "pilots/p.yaml"] for line in runs)
    merged = _sh(merge_script(o), pod, FAKE_MERGE_RC="1")
    assert merged.returncode == 1  # the merge's verdict is the Job's outcome
    assert "report of" in merged.stdout  # report.md shown in the pod's log
    merge = _log(pod)[-1].split()
    assert merge[2] == "merge"
    inputs = merge[4:]
    assert [Path(p).name for p in inputs] == ["shard-1", "shard-2", "shard-3"]
    for k, path in enumerate(inputs, 1):  # each folder is the one shard k wrote
        assert (Path(path) / "shard.txt").read_text().strip() == f"{k}/3"
    if o.object_store:  # the merged folder is stored beside the shards
        assert (Path(pod["FAKE_S3"]) / "bucket/osprey/osprey-p/merged/report.md").is_file()


@pytest.mark.parametrize("rc", [2, 3, 4])
def test_a_shard_that_did_not_measure_fails_its_pod_and_leaves_no_marker(
        rc: int, pod: dict[str, str]) -> None:
    done = _sh(shard_script(BASE), pod, JOB_COMPLETION_INDEX="0", FAKE_RUN_RC=str(rc))
    assert done.returncode == rc
    assert not list(Path(pod["OSPREY_RESULTS"]).rglob("*.done"))
    retry = _sh(shard_script(BASE), pod, JOB_COMPLETION_INDEX="0")
    assert retry.returncode == 0
    base = Path(pod["OSPREY_RESULTS"]) / "osprey-p"
    assert (base / "shard-1.done").is_file()
    assert [p.name.split("-")[1] for p in base.glob("shard-1.failed-*")] == ["1.failed"]


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_merge_gives_up_on_a_shard_that_never_finishes(pod: dict[str, str]) -> None:
    o = K8sOptions(**{**BASE.__dict__, "merge_wait_s": 1})
    _sh(shard_script(o), pod, JOB_COMPLETION_INDEX="0")
    _sh(shard_script(o), pod, JOB_COMPLETION_INDEX="2")
    merged = _sh(merge_script(o), pod)
    assert merged.returncode == 2
    assert "shard 2 of 3" in merged.stderr
    assert not any(" merge " in line for line in _log(pod))


# ---------------------------------------------------------------- the command


def test_the_command_writes_manifests_for_the_pilot(tmp_path: Path) -> None:
    out = tmp_path / "osprey.yaml"
    code = main(["k8s", str(ROOT / "pilot.yaml"), "--shards", "2", "--image", "img:1",
                 "--gpus", "1", "--pilot-in-image", "pilot.yaml", "--out", str(out)])
    assert code == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    for doc in docs:
        validate(doc)
    assert docs[1]["metadata"]["name"] == "osprey-embedded-cpu-shards"  # from the pilot's name
    assert "run pilot.yaml --shard \"$k/2\"" in docs[1]["spec"]["template"]["spec"][
        "containers"][0]["command"][2]


@pytest.mark.parametrize(("args", "named"), [
    (["--shards", "0"], "--shards"),
    (["--gpus", "-1"], "--gpus"),
    (["--image", "a b"], "--image"),
    (["--name", "Osprey_P"], "--name"),
    (["--pvc", "x", "--object-store", "s3://bucket/p"], "--object-store"),
    (["--object-store", "gs://bucket/p"], "--object-store"),
    (["--storage-size", "lots"], "--storage-size"),
    (["--out", "/no/such/folder/x.yaml"], "--out"),
])
def test_bad_options_are_one_line_exit_4(args: list[str], named: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    base = ["k8s", str(ROOT / "pilot.yaml"), "--shards", "2", "--image", "img:1"]
    assert main(base + args) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "Traceback" not in err


def test_a_bad_pilot_is_refused_before_any_manifest(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nconditions: {}\n")
    assert main(["k8s", str(bad), "--shards", "2", "--image", "img:1"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and str(bad) in captured.err
    with pytest.raises(ConfigError, match="--shards"):
        manifests(K8sOptions(**{**BASE.__dict__, "shards": 0}))


def test_the_header_names_the_command_that_writes_the_same_manifests(tmp_path: Path) -> None:
    first, again = tmp_path / "a.yaml", tmp_path / "b.yaml"
    pilot = str(ROOT / "pilot.yaml")
    assert main(["k8s", pilot, "--shards", "3", "--image", "img:1", "--gpus", "0",
                 "--object-store", "s3://bucket/p", "--secret", "s3", "--retries", "2",
                 "--pilot-in-image", "/app/pilot.yaml", "--out", str(first)]) == 0
    (line,) = (x for x in first.read_text().splitlines() if x.startswith("# Written by: "))
    words = shlex.split(line.removeprefix("# Written by: "))
    assert words[:4] == ["python", "-m", "pytest_osprey", "k8s"]
    assert main([*words[3:], "--out", str(again)]) == 0
    assert again.read_text() == first.read_text()
