"""The Ray launcher fails fast and says why: options out of range, a results folder already
holding a run, an address where no cluster answers, resources no node offers; and a cluster
it starts itself listens on loopback only (a real local cluster, in a subprocess of its own:
the process that starts Ray is the one bound by it)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_osprey.__main__ import EXIT_USAGE, main
from testkit.factories import ROOT, write_pilot
from testkit.pilot_run import MARK, fake_sglang

ray = pytest.importorskip("ray")



def _pilot(folder: Path) -> Path:
    sections = fake_sglang(folder / "events", blocks=2, order="interleaved", levels={"low": 1})
    sections["load"].pop("block_prompts")
    sections["target"]["env"][MARK] = str(folder)
    return write_pilot(folder, sections.pop("conditions"), prompts=3, **sections)


def _ray(pilot: Path, out: Path, *more: str,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    capsys.readouterr()
    started = time.monotonic()
    code = main(["ray", str(pilot), "--shards", "2", "--results", str(out), *more])
    return code, capsys.readouterr().err.strip(), time.monotonic() - started


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """These cases must be refused before any cluster is joined or started."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()


@pytest.mark.parametrize("gpus", ["-1", "nan", "inf", "1.5"])
def test_gpus_out_of_range_are_refused_before_anything_starts(
        gpus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err, _ = _ray(_pilot(tmp_path), tmp_path / "out", "--gpus-per-shard", gpus,
                        capsys=capsys)
    assert code == EXIT_USAGE and "--gpus-per-shard" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out-shards").exists() and not ray.is_initialized()


def test_an_earlier_runs_shards_are_never_written_into(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pilot = _pilot(tmp_path)
    earlier = tmp_path / "out-shards" / "shard-1"
    earlier.mkdir(parents=True)
    (earlier / "records.jsonl").write_text("earlier\n")
    code, err, _ = _ray(pilot, tmp_path / "out", capsys=capsys)
    assert code == EXIT_USAGE and "out-shards: not empty" in err, err
    assert (earlier / "records.jsonl").read_text() == "earlier\n"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "summary.json").write_text("{}")
    code, err, _ = _ray(pilot, tmp_path / "taken", capsys=capsys)
    assert code == EXIT_USAGE and "taken: not empty" in err, err
    code, err, _ = _ray(pilot, pilot, capsys=capsys)
    assert code == EXIT_USAGE and "an output never replaces an input" in err, err
    assert not ray.is_initialized()  # refused before Ray was started


def test_results_here_puts_the_shards_beside_it(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`--results .`: OUT-shards/ is named from the folder's own name, beside it (inside it,
    the merge would refuse OUT only after every shard had run), so an earlier run's shards
    there are found before anything starts."""
    pilot = _pilot(tmp_path / "p")
    (tmp_path / "out").mkdir()
    earlier = tmp_path / "out-shards" / "shard-1"
    earlier.mkdir(parents=True)
    (earlier / "records.jsonl").write_text("earlier\n")
    monkeypatch.chdir(tmp_path / "out")
    code, err, _ = _ray(pilot, Path("."), capsys=capsys)
    assert code == EXIT_USAGE and f"{tmp_path / 'out-shards'}: not empty" in err, err
    assert not list((tmp_path / "out").iterdir())
    assert (earlier / "records.jsonl").read_text() == "earlier\n"
    assert not ray.is_initialized()


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_an_address_where_no_cluster_answers_fails_fast(
        how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    more: tuple[str, ...] = ("--address", "127.0.0.1:1") if how == "--address" else ()
    if how == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # stale: its cluster is gone
    code, err, took = _ray(_pilot(tmp_path), tmp_path / "out", *more, capsys=capsys)
    assert code == EXIT_USAGE and f"{how} 127.0.0.1:1: no Ray cluster answers" in err, err
    assert len(err.splitlines()) == 1 and took < 15 and err.count(how) == 1
    assert not (tmp_path / "out-shards").exists()  # nothing of a launch that never began
    code, err, _ = _ray(_pilot(tmp_path), tmp_path / "out", "--address", "nowhere",
                        capsys=capsys)
    assert code == EXIT_USAGE and "expected HOST:PORT" in err


_BOUND = """
import json, psutil, ray
from pytest_osprey.shards.ray import RayError, _connect, _probe, _resources
_connect(None)
_probe(ray.get_runtime_context().gcs_address, "--address")  # a real cluster passes the probe
me = psutil.Process()
pids = {me.pid} | {c.pid for c in me.children(recursive=True)}
listening = sorted({c.laddr.ip for c in psutil.net_connections("inet")
                    if c.status == psutil.CONN_LISTEN and c.pid in pids})
try:
    _resources(1.0)
    refused = None
except RayError as exc:
    refused = str(exc)
ray.shutdown()
print(json.dumps({"listening": listening, "refused": refused}))
"""


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_cluster_it_starts_listens_on_loopback_and_refuses_what_no_node_offers(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", _BOUND], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["listening"], "no listening socket seen"
    for ip in got["listening"]:
        address = ipaddress.ip_address(ip)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        assert address.is_loopback, got["listening"]
    assert got["refused"] and "no node of the Ray cluster can run a shard" in got["refused"]
    assert "GPU 1" in got["refused"] and "GPU 0" in got["refused"]


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("server", ["silent", "http"])
def test_an_address_where_something_else_listens_fails_fast(
        server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port that accepts but is not Ray's (Ray's own connection would wait minutes)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            if server == "http":
                conn.recv(1024)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            else:
                time.sleep(8)  # longer than the bound: the launcher must not wait it out

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        code, err, took = _ray(_pilot(tmp_path), tmp_path / "out", "--address",
                               f"127.0.0.1:{port}", capsys=capsys)
    finally:
        listener.close()
    assert code == EXIT_USAGE and "something listens there, but not a Ray cluster" in err, err
    assert len(err.splitlines()) == 1 and took < 15 and err.count("--address") == 1
    assert not (tmp_path / "out-shards").exists()
