"""Kubernetes manifests for a sharded pilot: an Indexed Job whose completion index is the shard
(index 0 runs shard 1 of N), a results store the shards share (a ReadWriteMany claim, or an S3
path), and a merge Job without a GPU that waits for every shard, then judges them as one.

Built as data (dicts in the API's own field names, checked in the tests against the
``kubernetes`` client's models), written as one multi-document YAML for ``kubectl apply -f``.
The shards and the merge run the project's own commands (``run PILOT --shard K/N --results
DIR``, ``merge OUT DIR...``); nothing here shards or merges."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..pilot.base import ConfigError
from ..pilot.schema import Pilot

Manifest = dict[str, Any]

# A DNS-1123 label, as Job and claim names must be; 50 leaves room for "-results" and for the
# pods' own suffixes within the 63 characters a label value may have.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 50
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")
_S3 = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*'()/-]*)?$")
MOUNT = "/results"
POLL_S = 30
# Exit codes of `run` and `merge` (__main__): 1 a gate failed, 2 interrupted, 3 internal error,
# 4 usage error. A shard that exits 0 or 1 has measured: its verdict is the merge's to give.
# 3 and 4 repeat on every retry, so they end the Job at once; 5 is the store failing (retried).
EXIT_FINAL = (3, 4)
EXIT_STORE = 5


@dataclass(frozen=True)
class K8sOptions:
    """What the manifests are made of; :func:`check` says what is wrong with them."""

    pilot: str  # the pilot file's path inside the image (relative to ``workdir``)
    shards: int
    image: str
    name: str
    gpus: int = 1
    gpu_resource: str = "nvidia.com/gpu"
    namespace: str | None = None
    pvc: str | None = None  # an existing ReadWriteMany claim; None: the manifests make one
    storage_size: str = "20Gi"
    storage_class: str | None = None
    object_store: str | None = None  # s3://bucket/prefix instead of a claim (needs the aws CLI)
    secrets: tuple[str, ...] = ()  # Secrets whose keys become environment variables
    workdir: str | None = None
    retries: int = 1  # per shard (backoffLimitPerIndex)
    shm_size: str = "8Gi"
    merge_wait_s: int = 86_400


def check(o: K8sOptions) -> None:
    """One :class:`ConfigError` naming the option, for the first thing wrong."""
    if o.shards < 1:
        raise ConfigError(f"--shards: at least 1 (got {o.shards})")
    if o.gpus < 0:
        raise ConfigError(f"--gpus: 0 or more (got {o.gpus})")
    if o.retries < 0:
        raise ConfigError(f"--retries: 0 or more (got {o.retries})")
    if o.merge_wait_s < 1:
        raise ConfigError(f"--merge-wait: at least 1 second (got {o.merge_wait_s})")
    if not o.image or any(c.isspace() for c in o.image):
        raise ConfigError(f"--image: an image reference without spaces (got {o.image!r})")
    if not o.pilot:
        raise ConfigError("--pilot-in-image: empty")
    if len(o.name) > MAX_NAME or not _LABEL.match(o.name):
        raise ConfigError(f"--name: lower-case letters, digits and '-', at most {MAX_NAME} "
                          f"characters, starting and ending with a letter or digit (got "
                          f"{o.name!r})")
    for flag, value in (("--namespace", o.namespace),):
        if value is not None and (len(value) > 63 or not _LABEL.match(value)):
            raise ConfigError(f"{flag}: a DNS label (got {value!r})")
    for flag, value in [("--pvc", o.pvc), *(("--secret", s) for s in o.secrets),
                        ("--storage-class", o.storage_class)]:
        if value is not None and (len(value) > 253 or not _SUBDOMAIN.match(value)):
            raise ConfigError(f"{flag}: a Kubernetes object name (got {value!r})")
    for flag, value in (("--storage-size", o.storage_size), ("--shm-size", o.shm_size)):
        if not _QUANTITY.match(value):
            raise ConfigError(f"{flag}: a quantity such as 20Gi (got {value!r})")
    if not _RESOURCE.match(o.gpu_resource):
        raise ConfigError(f"--gpu-resource: an extended resource name such as nvidia.com/gpu "
                          f"(got {o.gpu_resource!r})")
    if o.object_store is not None:
        if o.pvc is not None:
            raise ConfigError("--object-store: give it or --pvc, not both")
        if not _S3.match(o.object_store.rstrip("/")):
            raise ConfigError(f"--object-store: an s3://bucket/prefix path (got "
                              f"{o.object_store!r})")


def _labels(o: K8sOptions, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "pytest-osprey", "app.kubernetes.io/instance": o.name,
            "app.kubernetes.io/component": component}


def _meta(o: K8sOptions, name: str, component: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(o, component)}
    if o.namespace:
        meta["namespace"] = o.namespace
    return meta


def claim_name(o: K8sOptions) -> str:
    return o.pvc or f"{o.name}-results"


def _store(o: K8sOptions) -> str:
    assert o.object_store is not None
    return shlex.quote(f"{o.object_store.rstrip('/')}/{o.name}")


def shard_script(o: K8sOptions) -> str:
    """The shard pod's shell script: shard K = JOB_COMPLETION_INDEX + 1 of N."""
    run = (f"python -m pytest_osprey run {shlex.quote(o.pilot)} --shard \"$k/{o.shards}\" "
           "--results \"$out\"")
    keep = ("# 0 and 1 leave a measured shard (the verdict is the merge's); 2, 3 and 4 fail "
            "the pod.\nif [ \"$rc\" -gt 1 ]; then exit \"$rc\"; fi\n")
    head = "set -u\nk=$((JOB_COMPLETION_INDEX + 1))\n"
    if o.object_store is None:
        return (head + f"base=\"$OSPREY_RESULTS/{o.name}\"\nout=\"$base/shard-$k\"\n"
                "mkdir -p \"$base\"\nrm -f \"$out.done\"\n"
                "# A retried shard starts afresh; the folder of the attempt that failed is "
                "kept beside it.\n"
                "if [ -e \"$out\" ]; then mv \"$out\" \"$out.failed-$(date +%s)\"; fi\n"
                f"{run}\nrc=$?\n{keep}"
                "echo \"$rc\" > \"$out.done.tmp\" && mv \"$out.done.tmp\" \"$out.done\"\n")
    return (head + f"out=\"$OSPREY_RESULTS/shard-$k\"\ndest={_store(o)}\"/shard-$k\"\n"
            "aws s3 rm --only-show-errors \"$dest.done\" >/dev/null 2>&1 || true\n"
            "aws s3 rm --recursive --only-show-errors \"$dest/\" >/dev/null 2>&1 || true\n"
            f"{run}\nrc=$?\n{keep}"
            "aws s3 cp --recursive --only-show-errors \"$out\" \"$dest/\" "
            f"|| exit {EXIT_STORE}\n"
            f"echo \"$rc\" | aws s3 cp - \"$dest.done\" || exit {EXIT_STORE}\n")


def merge_script(o: K8sOptions) -> str:
    """The merge pod's shell script: wait for every shard's marker, merge, show report.md."""
    shards = " ".join(str(k) for k in range(1, o.shards + 1))
    poll = min(POLL_S, o.merge_wait_s)
    if o.object_store is None:
        base, done = f"\"$OSPREY_RESULTS/{o.name}\"", "[ -e \"$base/shard-$k.done\" ]"
        fetch = ""
        out = "\"$base/merged\""
    else:
        base, done = _store(o), "aws s3 ls \"$base/shard-$k.done\" >/dev/null 2>&1"
        fetch = (f"for k in {shards}; do\n  aws s3 cp --recursive --only-show-errors "
                 f"\"$base/shard-$k/\" \"$OSPREY_RESULTS/shard-$k\" || exit {EXIT_STORE}\n"
                 "done\n")
        out = "\"$OSPREY_RESULTS/merged\""
    src = "$base" if o.object_store is None else "$OSPREY_RESULTS"
    inputs = " ".join(f"\"{src}/shard-{k}\"" for k in range(1, o.shards + 1))
    text = (f"set -u\nbase={base}\nout={out}\nwaited=0\n"
            f"for k in {shards}; do\n  until {done}; do\n"
            f"    if [ \"$waited\" -ge {o.merge_wait_s} ]; then\n"
            f"      echo \"shard $k of {o.shards}: not finished after {o.merge_wait_s} s\" >&2\n"
            "      exit 2\n    fi\n"
            f"    sleep {poll}\n    waited=$((waited + {poll}))\n  done\ndone\n{fetch}"
            "if [ -e \"$out\" ]; then mv \"$out\" \"$out.earlier-$(date +%s)\"; fi\n"
            f"python -m pytest_osprey merge \"$out\" {inputs}\nrc=$?\n"
            "if [ -f \"$out/report.md\" ]; then cat \"$out/report.md\"; fi\n")
    if o.object_store is not None:
        text += ("if [ -d \"$out\" ]; then\n"
                 "  aws s3 rm --recursive --only-show-errors \"$base/merged/\" >/dev/null 2>&1"
                 " || true\n"
                 "  aws s3 cp --recursive --only-show-errors \"$out\" \"$base/merged/\" "
                 f"|| exit {EXIT_STORE}\nfi\n")
    return text + "exit \"$rc\"\n"


def _volumes(o: K8sOptions, shm: bool) -> list[dict[str, Any]]:
    results: dict[str, Any] = (
        {"name": "results", "emptyDir": {}} if o.object_store is not None
        else {"name": "results", "persistentVolumeClaim": {"claimName": claim_name(o)}})
    out = [results]
    if shm:  # engines share tensors between processes through /dev/shm (64 MiB by default)
        out.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": o.shm_size}})
    return out


def _container(o: K8sOptions, name: str, script: str, shm: bool,
               resources: dict[str, Any]) -> dict[str, Any]:
    mounts = [{"name": "results", "mountPath": MOUNT}]
    if shm:
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    container: dict[str, Any] = {
        "name": name, "image": o.image, "command": ["/bin/sh", "-c", script],
        "env": [{"name": "OSPREY_RESULTS", "value": MOUNT}],
        "resources": resources, "volumeMounts": mounts}
    if o.secrets:
        container["envFrom"] = [{"secretRef": {"name": s}} for s in o.secrets]
    if o.workdir:
        container["workingDir"] = o.workdir
    return container


def _failure_policy(container: str, final: tuple[int, ...]) -> dict[str, Any]:
    # Rules match in order: a preempted or evicted pod (whatever it exited with) is retried
    # first, without counting against its retries.
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                  "status": "True"}]},
        {"action": "FailJob",
         "onExitCodes": {"containerName": container, "operator": "In", "values": list(final)}}]}


def shard_job(o: K8sOptions) -> Manifest:
    gpu = o.gpus > 0
    resources: dict[str, Any] = {"limits": {o.gpu_resource: str(o.gpus)}} if gpu else {}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [_container(o, "shard", shard_script(o), gpu, resources)],
        "volumes": _volumes(o, gpu),
        # One shard per node where the cluster allows: a shard is a machine to the statistics.
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": _labels(o, "shard")}}]}
    if gpu:
        pod["tolerations"] = [{"key": o.gpu_resource, "operator": "Exists",
                               "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(o, f"{o.name}-shards", "shard"),
        "spec": {"completionMode": "Indexed", "completions": o.shards, "parallelism": o.shards,
                 "backoffLimitPerIndex": o.retries,
                 "podFailurePolicy": _failure_policy("shard", EXIT_FINAL),
                 "template": {"metadata": {"labels": _labels(o, "shard")}, "spec": pod}}}


def merge_job(o: K8sOptions) -> Manifest:
    resources = {"requests": {"cpu": "1", "memory": "2Gi"}}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(o, f"{o.name}-merge", "merge"),
        "spec": {"backoffLimit": o.retries,
                 # a verdict (1), a shard that never came (2) or a refusal (4) is the answer
                 "podFailurePolicy": _failure_policy("merge", (1, 2, *EXIT_FINAL)),
                 "template": {"metadata": {"labels": _labels(o, "merge")}, "spec": {
                     "restartPolicy": "Never",
                     "containers": [_container(o, "merge", merge_script(o), False, resources)],
                     "volumes": _volumes(o, False)}}}}


def claim(o: K8sOptions) -> Manifest:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                            "resources": {"requests": {"storage": o.storage_size}}}
    if o.storage_class:
        spec["storageClassName"] = o.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(o, claim_name(o), "results"), "spec": spec}


def manifests(o: K8sOptions) -> list[Manifest]:
    """The claim (unless an existing one or an object store is named), the shards, the merge."""
    check(o)
    made = [claim(o)] if o.pvc is None and o.object_store is None else []
    return [*made, shard_job(o), merge_job(o)]


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Scripts as literal blocks: the manifest reads as the shell it runs.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(docs: list[Manifest], header: str = "") -> str:
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def _default_name(pilot_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", pilot_name.lower()).strip("-")
    return f"osprey-{slug}"[:MAX_NAME].rstrip("-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pilot", help="The pilot file (read here to check it)")
    parser.add_argument("--shards", type=int, required=True, metavar="N",
                        help="Shards: the Indexed Job's completions and parallelism")
    parser.add_argument("--image", required=True, metavar="IMG",
                        help="Image with pytest-osprey, the engine and the pilot's files")
    parser.add_argument("--gpus", type=int, default=1, metavar="G",
                        help="GPUs per shard (default 1; 0 for none)")
    parser.add_argument("--gpu-resource", default="nvidia.com/gpu", metavar="NAME",
                        help="The GPUs' extended resource name (default nvidia.com/gpu)")
    parser.add_argument("--name", help="Name prefix of the Jobs (default: osprey-<pilot name>)")
    parser.add_argument("--namespace", help="Namespace of every object")
    parser.add_argument("--pvc", metavar="CLAIM",
                        help="An existing ReadWriteMany claim for the results (default: one "
                        "is written, <name>-results)")
    parser.add_argument("--storage-size", default="20Gi", metavar="SIZE",
                        help="Size of the claim written (default 20Gi)")
    parser.add_argument("--storage-class", metavar="CLASS",
                        help="Storage class of the claim written (one offering ReadWriteMany)")
    parser.add_argument("--object-store", metavar="S3PATH",
                        help="s3://bucket/prefix instead of a claim (the image needs the aws "
                        "CLI; credentials from --secret)")
    parser.add_argument("--secret", action="append", default=[], metavar="NAME",
                        help="A Secret whose keys become environment variables (repeatable)")
    parser.add_argument("--pilot-in-image", metavar="PATH",
                        help="The pilot's path inside the image (default: PILOT as given)")
    parser.add_argument("--workdir", metavar="DIR", help="Working directory in the image")
    parser.add_argument("--retries", type=int, default=1,
                        help="Retries per shard and of the merge (default 1)")
    parser.add_argument("--shm-size", default="8Gi", metavar="SIZE",
                        help="Shared memory of a GPU shard (default 8Gi)")
    parser.add_argument("--merge-wait", type=int, default=86_400, metavar="SECONDS",
                        help="How long the merge waits for the shards (default 86400)")
    parser.add_argument("--out", metavar="FILE", help="Write here (default: standard output; "
                        "never the pilot or its trace, an existing file only with --force)")
    parser.add_argument("--force", action="store_true", help="Replace an existing --out file")


def command_line(pilot: str, o: K8sOptions) -> str:
    """The ``k8s`` command that writes these manifests (every option spelt out)."""
    words = ["python", "-m", "pytest_osprey", "k8s", pilot, "--shards", str(o.shards),
             "--image", o.image, "--gpus", str(o.gpus), "--name", o.name]
    defaults = K8sOptions(pilot=o.pilot, shards=o.shards, image=o.image, name=o.name)
    flags = {"gpu_resource": "--gpu-resource", "namespace": "--namespace", "pvc": "--pvc",
             "storage_size": "--storage-size", "storage_class": "--storage-class",
             "object_store": "--object-store", "workdir": "--workdir", "retries": "--retries",
             "shm_size": "--shm-size", "merge_wait_s": "--merge-wait"}
    if o.pilot != Path(pilot).as_posix():
        words += ["--pilot-in-image", o.pilot]
    for key, flag in flags.items():
        if getattr(o, key) != getattr(defaults, key):
            words += [flag, str(getattr(o, key))]
    for secret in o.secrets:
        words += ["--secret", secret]
    return shlex.join(words)


def command(args: argparse.Namespace) -> None:
    """``k8s``: check the pilot and the options, write the manifests; ConfigError on bad input."""
    from ..pilot.loading import load_pilot

    pilot = load_pilot(args.pilot, check_paths=False)
    if args.shards > pilot.load.passes:  # each shard takes whole passes (shards/plan.py)
        raise ConfigError(f"--shards {args.shards}: the pilot has {pilot.load.passes} passes "
                          f"(load.passes), fewer than the shards; every pod would fail: raise "
                          "load.passes or run fewer shards")
    out = Path(args.out) if args.out is not None else None
    if out is not None:
        _check_out(out, _inputs(Path(args.pilot), pilot), args.force)
    options = K8sOptions(
        pilot=args.pilot_in_image if args.pilot_in_image is not None
        else Path(args.pilot).as_posix(),
        shards=args.shards, image=args.image, name=args.name or _default_name(pilot.name),
        gpus=args.gpus, gpu_resource=args.gpu_resource, namespace=args.namespace, pvc=args.pvc,
        storage_size=args.storage_size, storage_class=args.storage_class,
        object_store=args.object_store, secrets=tuple(args.secret), workdir=args.workdir,
        retries=args.retries, shm_size=args.shm_size, merge_wait_s=args.merge_wait)
    header = (f"pytest-osprey: {options.shards} shard(s) of {pilot.name} and their merge.\n"
              f"Written by: {command_line(args.pilot, options)}\n"
              "Apply: kubectl apply -f THIS_FILE; the verdict: kubectl logs "
              f"job/{options.name}-merge (docs/kubernetes.md)")
    text = render(manifests(options), header)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        _write_atomic(out, text)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {out}: {exc.strerror}") from None
    print(f"wrote {out}: kubectl apply -f {out}", file=sys.stderr)


def _inputs(path: Path, pilot: Pilot) -> list[tuple[str, Path]]:
    """What the pilot at ``path`` reads, named, as this machine resolves it (relative paths
    from the pilot's folder): the pilot, its trace files, the conditions' adaptation data."""
    base = path.resolve().parent
    named = [("the pilot's trace file", Path(f)) for f in pilot.trace.files]
    named += [(f"condition {name}'s adaptation data", c.held_out.adaptation_data)
              for name, c in pilot.conditions.items() if c.held_out is not None]
    return [("the pilot file", path),
            *((what, base / os.path.expanduser(p)) for what, p in named)]


def _check_out(out: Path, inputs: list[tuple[str, Path]], force: bool) -> None:
    """An output never replaces an input (the pilot, its trace, adaptation data or a file in
    its folder), nor an existing file unless forced: --force replaces an earlier manifest,
    never what the campaign reads."""
    if not out.parent.is_dir():
        raise ConfigError(f"--out: no such folder {out.parent}")
    target = Path(os.path.realpath(out))
    for what, path in inputs:
        source = Path(os.path.realpath(path))
        if target == source or source in target.parents:
            where = "is" if target == source else "lies inside"
            raise ConfigError(f"--out {out}: it {where} {what} {path}; an output never "
                              "replaces an input")
    if out.exists() and not out.is_file():
        raise ConfigError(f"--out {out}: not a regular file")
    if out.exists() and not force:
        raise ConfigError(f"--out {out}: already exists; give --force to replace it")


def _write_atomic(path: Path, text: str) -> None:
    """A temporary file beside ``path``, renamed over it: a reader never sees half a
    manifest, and a failed write leaves the old file (launchers reach no results code)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
