"""GPU memory through NVML, with a fake ``pynvml`` (no GPU here), and the GPU check's dry run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psutil
import pytest

from pytest_osprey.engines import BootSpec, gpu_memory
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.engines.process import ServerProcess
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import ROOT, TINY_DRAFTER, TINY_TARGET, make_pilot, pilot_variant

MIB = 2**20
NOT_AVAILABLE = 2**64 - 1
NO_SUCH_PID = 2**22 + 7  # above Linux's largest pid_max: never a live process here


class FakeNVMLError(Exception):
    pass


@dataclass
class FakeGPU:
    name: str | bytes = "NVIDIA H200"
    total: int = 143_771 * MIB
    used: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    migs: list[FakeGPU] | None = None
    fail_procs: bool = False


class FakeNVML:
    """What gpu_memory uses of pynvml, over a list of FakeGPU."""

    def __init__(self, gpus: list[FakeGPU], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0

    def module(self, *, mig: bool = False) -> ModuleType:
        m = ModuleType("pynvml")
        ns: dict[str, Any] = {
            "NVMLError": FakeNVMLError,
            "nvmlInit": self.init,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": lambda i: self.gpus[i],
            "nvmlDeviceGetName": lambda h: h.name,
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=h.total, used=h.used),
            "nvmlDeviceGetComputeRunningProcesses": self.procs,
        }
        if mig:
            ns.update(
                NVML_DEVICE_MIG_ENABLE=1,
                nvmlDeviceGetMigMode=lambda h: (1 if h.migs else 0, 0),
                nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
                nvmlDeviceGetMigDeviceHandleByIndex=self.mig_handle,
            )
        m.__dict__.update(ns)
        return m

    def init(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    @staticmethod
    def procs(h: FakeGPU) -> list[SimpleNamespace]:
        if h.fail_procs:
            raise FakeNVMLError("Not Supported")
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in h.procs]

    @staticmethod
    def mig_handle(h: FakeGPU, j: int) -> FakeGPU:
        if h.migs is None or j >= len(h.migs):
            raise FakeNVMLError("Not Found")
        return h.migs[j]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install a fake pynvml: ``nvml(gpus, init_error=None, mig=False) -> FakeNVML``."""

    def install(
        gpus: list[FakeGPU], init_error: Exception | None = None, mig: bool = False
    ) -> FakeNVML:
        fake = FakeNVML(gpus, init_error)
        gpu_memory.reset()
        monkeypatch.setitem(sys.modules, "pynvml", fake.module(mig=mig))
        return fake

    gpu_memory.reset()
    yield install
    gpu_memory.reset()


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    """A real process tree: (parent pid, child pid)."""
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        yield parent.pid, child
    finally:
        for pid in (child, parent.pid):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        parent.wait(timeout=10)
        parent.stdout.close()


# --------------------------------------------------------------------------- NVML absent


def test_no_module_gives_none_and_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_memory.reset()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    try:
        assert gpu_memory.usage([os.getpid()]) is None
        assert gpu_memory.usage(gpu_memory.process_tree(os.getpid())) is None
        assert gpu_memory.devices() is None
        assert not gpu_memory.available()
        assert "nvidia-ml-py" in (gpu_memory.unavailable() or "")
    finally:
        gpu_memory.reset()


def test_init_error_gives_none_and_a_reason(nvml: Any) -> None:
    fake = nvml([FakeGPU()], init_error=FakeNVMLError("Driver Not Loaded"))
    assert gpu_memory.usage([os.getpid()]) is None
    assert gpu_memory.devices() is None
    reason = gpu_memory.unavailable()
    assert reason is not None and "Driver Not Loaded" in reason
    gpu_memory.usage([1])
    assert fake.inits == 1  # a failed start is not retried on every sample


def test_no_device_gives_none(nvml: Any) -> None:
    nvml([])
    assert gpu_memory.usage([os.getpid()]) is None
    assert gpu_memory.unavailable() == "NVML sees no GPU"


def test_real_nvml_without_gpu_degrades() -> None:
    pytest.importorskip("pynvml")
    gpu_memory.reset()
    try:
        reason = gpu_memory.unavailable()
        if reason is None:
            pytest.skip("NVML works here: a GPU machine")
        assert "NVML" in reason
        assert gpu_memory.usage([os.getpid()]) is None
        assert gpu_memory.devices() is None
    finally:
        gpu_memory.reset()


# --------------------------------------------------------------------------- figures


def test_tree_summed_over_devices_and_others_left_out(nvml: Any, tree: tuple[int, int]) -> None:
    parent, child = tree
    fake = nvml([
        FakeGPU(used=9000 * MIB, procs=[(parent, 100 * MIB), (os.getpid(), 4000 * MIB)]),
        FakeGPU(name=b"NVIDIA H200", used=500 * MIB, procs=[(child, 50 * MIB)]),
        FakeGPU(procs=[(os.getpid(), 1000 * MIB)]),
    ])  # fmt: skip
    got = gpu_memory.usage(gpu_memory.process_tree(parent))
    assert got is not None
    assert got.basis == "process" and got.mib == pytest.approx(150)
    assert got.pids == tuple(sorted((parent, child)))
    assert [d.index for d in got.devices] == ["0", "1"]
    assert got.devices[1].name == "NVIDIA H200"  # bytes from an older binding, decoded
    assert got.devices[0].describe() == "NVIDIA H200 (143771 MiB)"
    devs = gpu_memory.devices()
    assert devs is not None and [d.used_mib for d in devs] == [9000, 500, 0]
    gpu_memory.usage([parent])
    assert fake.inits == 1


def test_used_memory_not_available_falls_back_to_device(nvml: Any, tree: tuple[int, int]) -> None:
    parent, child = tree
    nvml([
        FakeGPU(used=7000 * MIB, procs=[(parent, None)]),
        FakeGPU(used=3000 * MIB, procs=[(child, NOT_AVAILABLE)]),
        FakeGPU(used=999 * MIB, procs=[(os.getpid(), 10 * MIB)]),  # not ours: not counted
    ])  # fmt: skip
    got = gpu_memory.usage(gpu_memory.process_tree(parent))
    assert got is not None
    assert got.basis == "device" and got.mib == pytest.approx(10_000)
    assert "usedGpuMemory" in got.note and "whole device" in got.note


def test_hidden_pids_fall_back_to_device(nvml: Any, tree: tuple[int, int]) -> None:
    parent, _ = tree
    nvml([FakeGPU(used=2048 * MIB, procs=[(NO_SUCH_PID, 2000 * MIB)]), FakeGPU(used=1 * MIB)])
    got = gpu_memory.usage(gpu_memory.process_tree(parent))
    assert got is not None
    assert got.basis == "device" and got.mib == pytest.approx(2048)
    assert "pid namespace" in got.note


def test_tree_not_on_a_gpu_gives_none(nvml: Any, tree: tuple[int, int]) -> None:
    parent, _ = tree
    nvml([FakeGPU(used=4000 * MIB, procs=[(os.getpid(), 4000 * MIB)])])
    assert gpu_memory.usage(gpu_memory.process_tree(parent)) is None
    assert gpu_memory.unavailable() is None  # NVML works; the tree is just not on a GPU
    assert gpu_memory.usage(gpu_memory.process_tree(NO_SUCH_PID)) is None


def test_query_errors_never_escape(nvml: Any) -> None:
    me = os.getpid()
    nvml([FakeGPU(fail_procs=True), FakeGPU(procs=[(me, 64 * MIB)])])
    got = gpu_memory.usage([me])
    assert got is not None and got.mib == pytest.approx(64) and got.devices[0].index == "1"
    mod = sys.modules["pynvml"]

    def broken(_: Any) -> Any:
        raise FakeNVMLError("GPU is lost")

    mod.nvmlDeviceGetMemoryInfo = broken  # type: ignore[attr-defined]
    got = gpu_memory.usage([me])
    assert got is not None and got.devices[0].total_mib == 0
    mod.nvmlDeviceGetCount = lambda: 1 / 0  # type: ignore[attr-defined]
    assert gpu_memory.usage([me]) is None
    assert gpu_memory.devices() is None


def test_mig_instances_are_devices(nvml: Any) -> None:
    me = os.getpid()
    nvml([
        FakeGPU(migs=[FakeGPU(name="NVIDIA H200 MIG 1g.18gb", total=16_384 * MIB),
                      FakeGPU(name="NVIDIA H200 MIG 1g.18gb", procs=[(me, 300 * MIB)])]),
        FakeGPU(procs=[(me, 200 * MIB)]),
    ], mig=True)  # fmt: skip
    got = gpu_memory.usage([me])
    assert got is not None and got.mib == pytest.approx(500)
    assert [d.index for d in got.devices] == ["0/1", "1"]
    devs = gpu_memory.devices()
    assert devs is not None and [d.index for d in devs] == ["0/0", "0/1", "1"]


# --------------------------------------------------------------------------- server engines


TREE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess("cand", [sys.executable, "-c", TREE], env=dict(os.environ),
                        log_path=tmp_path / "cand.log", health_url="http://127.0.0.1:9/",
                        boot_timeout_s=5, grace_s=1)  # fmt: skip
    srv.launch()
    try:
        for _ in range(200):  # until the child shows in the tree
            if len(srv.pids()) == 2:
                break
            time.sleep(0.05)
        assert len(srv.pids()) == 2
        srv.boot_s = 0.1  # ready: the first reading now fixes the kind
        yield srv
    finally:
        srv.stop()


def test_server_reports_gpu_of_its_tree(nvml: Any, server: ServerProcess) -> None:
    leader, child = sorted(server.pids(), key=lambda p: p != server.pid)
    gpu = FakeGPU(used=70_000 * MIB, procs=[(child, 60_000 * MIB), (leader, 500 * MIB)])
    nvml([gpu])
    assert server.memory_mb() == pytest.approx(60_500)
    facts = server.memory_facts()
    assert facts["kind"] == "gpu" and facts["basis"] == "process"
    assert facts["device"] == "NVIDIA H200 (143771 MiB)" and facts["nvml_mib"] == 60_500
    assert sorted(facts["gpu_pids"]) == sorted((leader, child))
    # A later sample on another basis is dropped rather than mixed in.
    gpu.procs = [(child, None)]
    assert server.memory_mb() is None
    gpu.procs = []
    assert server.memory_mb() is None


def test_server_device_basis_is_said(nvml: Any, server: ServerProcess) -> None:
    child = max(server.pids())
    nvml([FakeGPU(used=80_000 * MIB, procs=[(child, None)])])
    assert server.memory_mb() == pytest.approx(80_000)
    facts = server.memory_facts()
    assert facts["kind"] == "gpu" and facts["basis"] == "device"
    assert "whole device" in facts["note"]


def test_server_without_nvml_reports_rss(nvml: Any, server: ServerProcess) -> None:
    nvml([FakeGPU()], init_error=FakeNVMLError("Driver Not Loaded"))
    mb = server.memory_mb()
    assert mb is not None and mb > 1 and mb == pytest.approx(server.rss_mb() or 0, rel=0.5)
    facts = server.memory_facts()
    assert facts["kind"] == "host" and facts["basis"] == "rss"
    assert "Driver Not Loaded" in facts["nvml"]


def test_server_on_cpu_beside_a_gpu_reports_rss(nvml: Any, server: ServerProcess) -> None:
    nvml([FakeGPU(used=1000 * MIB, procs=[(os.getpid(), 1000 * MIB)])])
    assert (server.memory_mb() or 0) > 1
    facts = server.memory_facts()
    assert facts["basis"] == "rss" and "none of the server's processes" in facts["nvml"]


def test_sglang_kv_capacity_from_a_scheduler_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_osprey.engines.sglang.engine import SGLangClient

    client = SGLangClient("http://127.0.0.1:9", "cand")
    info = {"version": "0.5", "internal_states": [{"max_total_num_tokens": 4096}]}
    monkeypatch.setattr(client, "server_info", lambda: info)
    assert client.fingerprint()["kv_capacity_tokens"] == 4096
    info["max_total_num_tokens"] = 8192
    assert client.fingerprint()["kv_capacity_tokens"] == 8192


# --------------------------------------------------------------------------- embedded engine


def _pilot(order: str = "interleaved") -> Pilot:
    return make_pilot(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                  "speculation": {"algorithm": "assisted"}}},
        target={"model": str(TINY_TARGET), "device": "cuda", "context_length": 1024},
        trace={"files": [str(ROOT / "prompts" / "pilot.jsonl")]},
        load={"order": order},
    )  # fmt: skip


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """torch.cuda's memory counters, set by the test (bytes)."""
    torch = pytest.importorskip("torch")
    counters = {"reserved": 0, "max_reserved": 0}
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev=None: counters["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved",
                        lambda dev=None: counters["max_reserved"])  # fmt: skip
    props = SimpleNamespace(name="NVIDIA H200", total_memory=143_771 * MIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev=None: props)
    return counters


def _loaded(order: str, condition: str = "cand") -> TransformersEngine:
    engine = TransformersEngine(_pilot(order), condition, BootSpec(condition, Path(".")))
    engine._cuda = True
    engine._model = object()  # loaded, as far as memory_mb is concerned
    engine._weights_bytes = 300 * MIB
    engine._work_bytes = 50 * MIB
    return engine


def test_embedded_interleaved_gives_each_condition_its_share(
    nvml: Any, fake_cuda: dict[str, int]
) -> None:
    # Both conditions' models live in this process: NVML's 2000 MiB are all of them.
    nvml([FakeGPU(used=2100 * MIB, procs=[(os.getpid(), 2000 * MIB)])])
    fake_cuda.update(reserved=1500 * MIB, max_reserved=1600 * MIB)
    engine = _loaded("interleaved")
    # 500 MiB outside torch's pool (context) + 300 weights + 50 working memory.
    assert engine.memory_mb() == pytest.approx(850)
    facts = engine.memory_facts()
    assert facts["kind"] == "gpu" and facts["basis"] == "process"
    assert facts["scope"] == "condition" and facts["nvml_mib"] == 2000
    assert facts["device"] == "NVIDIA H200 (143771 MiB)" and facts["nvml"] is None


def test_embedded_one_at_a_time_takes_the_process(nvml: Any, fake_cuda: dict[str, int]) -> None:
    nvml([FakeGPU(used=2100 * MIB, procs=[(os.getpid(), 2000 * MIB)])])
    fake_cuda.update(reserved=1500 * MIB, max_reserved=1600 * MIB)
    engine = _loaded("sequential")
    assert engine.memory_mb() == pytest.approx(2000)  # NVML above torch's reserved peak
    fake_cuda.update(max_reserved=2500 * MIB)
    assert engine.memory_mb() == pytest.approx(2500)
    facts = engine.memory_facts()
    assert facts["scope"] == "engine" and facts["basis"] == "process"


def test_embedded_without_nvml_uses_the_allocator(nvml: Any, fake_cuda: dict[str, int]) -> None:
    nvml([FakeGPU()], init_error=FakeNVMLError("Driver Not Loaded"))
    fake_cuda.update(reserved=1500 * MIB, max_reserved=1600 * MIB)
    assert _loaded("sequential").memory_mb() == pytest.approx(1600)
    engine = _loaded("interleaved")
    assert engine.memory_mb() == pytest.approx(350)
    facts = engine.memory_facts()
    assert facts["basis"] == "allocator" and "Driver Not Loaded" in facts["nvml"]


def test_embedded_cpu_fingerprint_says_weights(tmp_path: Path) -> None:
    pilot = _pilot()
    pilot = pilot.model_copy(update={"target": pilot.target.model_copy(update={"device": "cpu"})})
    engine = TransformersEngine(pilot, "cand", BootSpec("cand", tmp_path))
    engine.start()
    try:
        fp = engine.fingerprint()
        mb = engine.memory_mb()
    finally:
        engine.stop()
    assert fp["memory"]["kind"] == "host" and fp["memory"]["basis"] == "weights"
    assert fp["memory_method"] == fp["memory"]["note"] and fp["kv_capacity_tokens"] is None
    assert mb is not None and mb > 0


# --------------------------------------------------------------------------- GPU check script


def test_gpu_check_pilot_variant() -> None:
    variant = pilot_variant("cuda", "sequential", prompts=3, passes=1, tokens=8)
    assert variant["target"]["device"] == "cuda"
    assert Path(variant["target"]["model"]).is_dir()
    assert variant["load"]["order"] == "sequential" and variant["load"]["passes"] == 1
    assert len(variant["trace"]["ids"]) == 3
    assert all(Path(f).is_file() for f in variant["trace"]["files"])


@pytest.mark.slow  # boots the tiny models through a pilot run
def test_gpu_check_dry_run_on_cpu(tmp_path: Path) -> None:
    """The script's CPU mode end to end: a tiny pilot through pytest, its checks passing."""
    argv = ["--device", "cpu", "--out", str(tmp_path), "--orders", "interleaved", "--prompts", "2",
            "--passes", "1", "--tokens", "8", "--timeout", "300"]  # fmt: skip
    script = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *argv],
                            capture_output=True, text=True, timeout=900)
    code, out = script.returncode, script.stdout
    assert code == 0, out + script.stderr
    report = json.loads((tmp_path / "checks.json").read_text())
    names = {c["check"]: c["status"] for c in report["checks"]}
    assert names["interleaved: tiny-drafter peak >= baseline peak"] == "PASS"
    assert names["interleaved: baseline measured as host/condition"] == "PASS"
    assert all(s == "PASS" for s in names.values()), names
    assert "speed (interleaved)" in out and report["environment"]["torch"]
    assert (tmp_path / "interleaved" / "results" / "campaign.json").is_file()

