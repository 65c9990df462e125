"""A pilot's shards as Ray tasks (``python -m pytest_osprey ray PILOT --shards N``).

One task per shard (shards/plan.py), each with the resources it needs (``num_gpus``: the
shard's GPUs; one shard per node where the cluster offers the custom resource
``osprey_shard``). Each task returns its results folder as an archive, so nothing has to be
shared between nodes but the pilot file and its models; the driver gathers them and merges
them (shards/merge.py). Ray being optional (``pip install pytest-osprey[ray]``), it is imported here
only.

Because Ray has a driver, early stopping works across shards: after each of its passes a
shard reports its new records to a :class:`LookBoard` actor and waits until every live shard
has reported that round; the board then takes the group-sequential look on every shard's
records pooled (``candidate_looks``, the rule a one-machine run applies) and every shard stops once
every candidate is decided. A look taken after N passes at once skips the looks in between:
their share of alpha is not spent, so the rule stays conservative. A shard whose worker dies
(its node lost, its process killed) is named in the merged report, the board stops waiting
for it, and the merge is partial: no verdict is claimed for data that is not there.

Before anything starts, the launcher checks what it can: ``--gpus-per-shard`` a finite
number from 0 (a whole number above 1, as Ray requires), the results folder OUT new or empty
and OUT-shards/ new or empty (an earlier run's shards are never written into), and a given
cluster address answering within :data:`CONNECT_TIMEOUT_S`. A cluster it starts itself
listens on loopback only (127.0.0.1). Once connected, shards whose resources no node offers
are refused at once rather than left pending.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import ipaddress
import logging
import math
import os
import shutil
import socket
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..campaign import StopLook
from ..judgement import candidate_looks
from ..pilot import Pilot
from ..results import SavedCampaign
from ..results.campaign_file import CampaignFile, read_campaign_file
from ..results.records import RequestRecord
from ..run.folders import LOCK, FolderError, claim, one_line
from .plan import Shard

__all__ = ["LookBoard", "RayError", "RayLaunch", "check_gpus", "launch"]

SHARD_RESOURCE = "osprey_shard"
_POLL_S = 0.2
CONNECT_TIMEOUT_S = 5.0
"""How long a given cluster address has to accept a connection before the launch is refused
(Ray's own retries would take minutes, silently)."""


class RayError(RuntimeError):
    """Ray cannot run the pilot (not installed, no cluster at the address)."""


class LookBoard:
    """The driver's view of every shard's records, and the looks taken on them (a Ray actor:
    one instance, its methods called from the shards' tasks and the driver)."""

    def __init__(self, pilot: Pilot, count: int) -> None:
        self.pilot = pilot
        self.count = count
        self.records: list[RequestRecord] = []
        self.meta: CampaignFile | None = None
        self.rounds: dict[int, int] = {}
        self.done: set[int] = set()
        self.dead: dict[int, str] = {}
        self.looks: dict[int, StopLook] = {}

    def report(self, shard: int, records: list[RequestRecord], round_: int,
               meta: dict[str, Any]) -> None:
        """Shard ``shard`` has ended its ``round_``-th pass with these new records."""
        self.records += records
        self.rounds[shard] = round_
        if self.meta is None:
            self.meta = CampaignFile.model_validate(meta)

    def finished(self, shard: int) -> None:
        self.done.add(shard)

    def died(self, shard: int, why: str) -> None:
        self.dead[shard] = why

    def look(self, round_: int) -> StopLook | None:
        """The look after every live shard's ``round_``-th pass (None: not every shard is
        there yet)."""
        if round_ in self.looks:
            return self.looks[round_]
        waiting = [k for k in range(1, self.count + 1)
                   if k not in self.dead and k not in self.done
                   and self.rounds.get(k, 0) < round_]
        if waiting:
            return None
        assert self.meta is not None
        data = SavedCampaign(Path("."), self.meta.model_copy(update={"shard": None}),
                             list(self.records))
        passes = max((r.repetition + 1 for r in data.records if r.mode == "greedy"), default=0)
        self.looks[round_] = StopLook(*candidate_looks(
            self.pilot, data, list(self.meta.conditions), passes,
            {"shards": self.count - len(self.dead)}))
        return self.looks[round_]

    def dead_shards(self) -> dict[int, str]:
        return dict(self.dead)


def _shard_task(pilot_path: str, shard: Shard, board: Any, early_stop: bool) -> bytes:
    """One shard, run where Ray placed it; its results folder as a gzipped tar."""
    import ray

    from ..run.pilot_run import PilotRun, RunOptions

    work = Path(tempfile.mkdtemp(prefix=f"osprey-shard-{shard.index}-"))
    folder = work / f"shard-{shard.index}"
    sent = [0]

    def rule(records: list[RequestRecord], look_index: int) -> StopLook:
        new = [r for r in records[sent[0]:] if not r.filler]
        sent[0] = len(records)
        round_ = (look_index - 1) // shard.count + 1  # its pass p is round p // N + 1
        meta = read_campaign_file(folder / "campaign.json").model_dump(mode="json",
                                                                        by_alias=True)
        ray.get(board.report.remote(shard.index, new, round_, meta))
        while (look := ray.get(board.look.remote(round_))) is None:
            time.sleep(_POLL_S)
        assert isinstance(look, StopLook)
        return look

    options = RunOptions(results=folder, shard=shard,
                         stop_rule=rule if early_stop else None)
    try:
        run = PilotRun(pilot_path, options)
        run.run()
        if run.judged_data is not None:  # the passes after its last look, for later looks
            rest = run.judged_data.records[sent[0]:] if early_stop else []
            if rest:
                ray.get(board.report.remote(shard.index, rest, 10**6,
                                            run.judged_data.meta.model_dump(mode="json",
                                                                            by_alias=True)))
    finally:
        ray.get(board.finished.remote(shard.index))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    shutil.rmtree(work, ignore_errors=True)
    return buffer.getvalue()


@dataclass
class RayLaunch:
    """What a Ray launch gathered: the shards' folders, the dead ones, the merged run."""

    shards: dict[int, Path]
    dead: dict[int, str]
    exit_code: int
    merged: Any  # merge.Merged


def check_gpus(gpus_per_shard: float) -> None:
    """``--gpus-per-shard``: finite, from 0; above 1 a whole number (Ray's rule)."""
    if not math.isfinite(gpus_per_shard) or gpus_per_shard < 0:
        raise RayError(f"--gpus-per-shard {gpus_per_shard}: a number of GPUs from 0")
    if gpus_per_shard > 1 and not float(gpus_per_shard).is_integer():
        raise RayError(f"--gpus-per-shard {gpus_per_shard}: above 1, a whole number of GPUs "
                       "(Ray shares only a fraction of one)")


def _claim_results(out: Path, pilot_path: Path) -> Path:
    """OUT-shards/ made (or an empty one taken) and claimed, after checking that OUT is new
    or empty and not the pilot: before any shard starts, so that an earlier run's results
    are never written over."""
    # Named from OUT's absolute path: "." would otherwise give "./-shards", inside OUT, and
    # the merge would refuse OUT only after every shard had run.
    absolute = Path(os.path.abspath(out))
    gathered = absolute.parent / f"{absolute.name}-shards"
    try:
        if out.resolve() == pilot_path.resolve():
            raise RayError(f"--results {out}: the pilot file itself; an output never replaces "
                           "an input")
        for path, what in ((out, "results folder"), (gathered, "shards' folder")):
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                raise RayError(f"{what} {path}: {'a file' if not path.is_dir() else 'not empty'}"
                               " (an earlier run's?); its results are never written over: "
                               "choose a new --results")
        gathered.mkdir(parents=True, exist_ok=True)
        claim(gathered)
    except FolderError as exc:
        raise RayError(str(exc)) from None
    except (OSError, RuntimeError) as exc:
        raise RayError(one_line(exc, f"--results {out}")) from None
    return gathered


def _endpoint(address: str) -> tuple[str, int] | None:
    """host and port of a cluster address (``host:port`` or ``ray://host:port``); None for
    the addresses Ray resolves itself (``auto``, ``local``)."""
    text = address.strip()
    if text in ("auto", "local"):
        return None
    text = text.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RayError(f"--address {address}: expected HOST:PORT (or ray://HOST:PORT, auto)")
    return host.strip("[]"), int(port)


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client
# server) answers with a SETTINGS frame of its own (RFC 9113, section 3.4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4


def _probe(address: str, source: str) -> None:
    """Refuse a cluster address where nothing answers gRPC within the bound: Ray's own
    connection would retry for minutes, silently (a closed port, a stale RAY_ADDRESS, a
    server that is not Ray's). With TLS (RAY_USE_TLS) only the connection is checked."""
    endpoint = _endpoint(address)
    if endpoint is None:
        return
    tls = os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true")
    try:
        conn = socket.create_connection(endpoint, timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise RayError(f"{source} {address}: no Ray cluster answers there within "
                       f"{CONNECT_TIMEOUT_S:g} s ({why}); start one (ray start --head) or "
                       "give the right address") from None
    head = b""
    with conn:
        if tls:
            return
        try:
            conn.sendall(_H2_PREFACE)
            while len(head) < 9 and (chunk := conn.recv(9 - len(head))):
                head += chunk
        except OSError:  # silent, or reset: what it sent so far is judged below
            pass
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise RayError(f"{source} {address}: something listens there, but not a Ray cluster "
                       f"(no gRPC answer within {CONNECT_TIMEOUT_S:g} s); give the address of "
                       "the cluster's head (ray status shows it)")


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray starting its own cluster on loopback: its node address is then 127.0.0.1, and its
    servers bind there alone. Ray takes the node address from its ``ENABLE_RAY_CLUSTER``
    constant (environment ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read when ray is first
    imported): off, the node is the local host only."""
    constants = importlib.import_module("ray._private.ray_constants")
    name = getattr(constants, "ENABLE_RAY_CLUSTERS_ENV_VAR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    before_env, before = os.environ.get(name), getattr(constants, "ENABLE_RAY_CLUSTER", True)
    os.environ[name] = "0"
    setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010 (read at call time)
    try:
        yield
    finally:
        setattr(constants, "ENABLE_RAY_CLUSTER", before)  # noqa: B010
        if before_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before_env


def _connect(address: str | None) -> None:
    """Join the cluster at ``address`` (or RAY_ADDRESS), after checking it answers; without
    either, start a local one on loopback."""
    import ray

    given = address or os.environ.get("RAY_ADDRESS")
    source = "--address" if address else "RAY_ADDRESS"
    try:
        if given:
            _probe(given, source)
            ray.init(address=given, log_to_driver=False)
            return
        with _loopback_only():
            ray.init(log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    except RayError:
        raise
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise RayError(f"{source if given else 'ray.init'} {given or ''}: "
                       f"{' '.join(str(exc).split())}") from None
    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    if not ipaddress.ip_address(node).is_loopback:  # never left listening beyond loopback
        ray.shutdown()
        raise RayError(f"the local Ray cluster took the address {node}, not loopback; start "
                       "one yourself (ray start --head --node-ip-address 127.0.0.1) and give "
                       "--address")


def _resources(gpus_per_shard: float) -> dict[str, float]:
    """The custom resources a shard's task asks; refused when no live node can ever offer
    what the task needs (it would wait forever, silently)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes()  # type: ignore[no-untyped-call]
             if n.get("Alive")]
    per_node = any(SHARD_RESOURCE in r for r in nodes)
    need = {"CPU": 1.0, "GPU": gpus_per_shard, **({SHARD_RESOURCE: 1.0} if per_node else {})}
    if not any(all(r.get(k, 0.0) >= v for k, v in need.items() if v) for r in nodes):
        most = {k: max((r.get(k, 0.0) for r in nodes), default=0.0) for k, v in need.items()
                if v}
        offer = ", ".join(f"{k} {v:g}" for k, v in most.items())
        raise RayError(f"no node of the Ray cluster can run a shard: each needs "
                       f"{', '.join(f'{k} {v:g}' for k, v in need.items() if v)}, the most "
                       f"one node offers is {offer} (--gpus-per-shard {gpus_per_shard:g})")
    return {SHARD_RESOURCE: 1} if per_node else {}


def launch(pilot_path: Path, pilot: Pilot, shards: int, out: Path, *,
           address: str | None = None, gpus_per_shard: float = 0.0) -> RayLaunch:
    """Run ``shards`` shards of the pilot as Ray tasks, gather and merge them into ``out``."""
    check_gpus(gpus_per_shard)
    try:
        import ray
    except ImportError:
        raise RayError("Ray is not installed: pip install 'pytest-osprey[ray]'") from None
    from .merge import merge_shards

    gathered = _claim_results(out, pilot_path)
    try:
        if not ray.is_initialized():
            _connect(address)
        resources = _resources(gpus_per_shard)
    except BaseException:
        shutil.rmtree(gathered, ignore_errors=True)  # nothing ran: nothing of it is kept
        raise
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # The board lives on the driver's node: a shard's node that dies must not take it along.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    board = ray.remote(LookBoard).options(num_cpus=0, scheduling_strategy=here).remote(
        pilot, shards)
    task = ray.remote(_shard_task).options(num_cpus=1, num_gpus=gpus_per_shard,
                                           resources=resources, max_retries=0)
    # Looks across shards follow the plan's passes: one boot, interleaved (schedule.py).
    early = (pilot.decision.early_stop and pilot.load.boots_per_condition == 1
             and pilot.load.interleaved)
    running = {task.remote(str(pilot_path), Shard(k, shards), board, early): k
               for k in range(1, shards + 1)}
    folders: dict[int, Path] = {}
    dead: dict[int, str] = {}
    while running:
        ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
        for ref in ready:
            k = running.pop(ref)
            try:
                archive = ray.get(ref)
            except Exception as exc:  # a worker or node that died: named, not raised
                dead[k] = f"its Ray worker died ({type(exc).__name__})"
                ray.get(board.died.remote(k, dead[k]))  # type: ignore[attr-defined]
                continue
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                tar.extractall(gathered, filter="data")
            folders[k] = gathered / f"shard-{k}"
    if not folders:
        raise RayError("every shard's Ray worker died: "
                       + "; ".join(f"shard {k}: {why}" for k, why in sorted(dead.items())))
    merged = merge_shards(out, [folders[k] for k in sorted(folders)], partial=bool(dead),
                          missing_notes=dead)
    (gathered / LOCK).unlink(missing_ok=True)  # the run is over: only its shards stay
    return RayLaunch(folders, dead, merged.exit_code, merged)
