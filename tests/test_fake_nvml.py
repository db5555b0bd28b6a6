"""The fake libnvidia-ml.so.1 as the real pynvml sees it: each scenario runs pynvml in a subprocess
(pynvml loads the library once per process, and the loader reads LD_LIBRARY_PATH at start) and
reads back, as JSON, what pynvml returned or raised."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.fake_nvml.build import BuildUnavailable, find_header
from tests.fake_nvml.fixtures import (  # noqa: F401  (fixtures)
    Device,
    FakeNvml,
    Process,
    default_bus_id,
    default_uuid,
)  # the fixtures fake_nvml, fake_nvml_lib and fake_nvml_lib_no_v3 come from tests/conftest.py

GiB = 2**30

# Runs in the subprocess: each stdin line is a JSON string of Python code run with pynvml's names
# in scope; each stdout line is {"ok": the value of its last statement if an expression, else None}
# or {"error": class name, "code": NVML code, "message": str(error)}.
CHILD = r'''
import ast, ctypes, json, sys, threading, time
import pynvml
from pynvml import *

def h(i):
    return nvmlDeviceGetHandleByIndex(i)

def addr(handle):
    return ctypes.cast(handle, ctypes.c_void_p).value

def procs(listing, handle):
    return sorted([p.pid, p.usedGpuMemory] for p in listing(handle))

def event(e):
    return {"device": addr(e.device), "type": e.eventType, "data": e.eventData}

def text(value):
    return value.decode() if isinstance(value, bytes) else value

def outcome(fn):
    try:
        return {"ok": fn()}
    except NVMLError as e:
        return {"error": type(e).__name__, "code": e.value, "message": str(e)}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}

class Background:
    """fn() on a thread of its own; .done, and .wait(timeout) -> its outcome."""
    def __init__(self, fn):
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()
    def _run(self, fn):
        self.result = outcome(fn)
    @property
    def done(self):
        return not self.thread.is_alive()
    def wait(self, timeout):
        self.thread.join(timeout)
        return self.result

for line in sys.stdin:
    code = json.loads(line)
    def run(code=code):
        tree = ast.parse(code)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cmd>", "exec"), globals())
        return None if last is None else eval(compile(ast.Expression(last.value), "<cmd>", "eval"), globals())
    print(json.dumps(outcome(run), default=text), flush=True)
'''


class Pynvml:
    """The real pynvml in a subprocess whose libnvidia-ml.so.1 is the fake."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, put: Callable[[str], None]) -> None:
        for line in stream:
            put(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def send(self, code: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 10.0) -> dict[str, Any]:
        try:
            return json.loads(self._lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"no answer in {timeout}s; stderr:\n{self.stderr}") from None

    def pending(self, within: float) -> bool:
        """True if no answer comes within `within` seconds (the call is still running)."""
        try:
            line = self._lines.get(timeout=within)
        except queue.Empty:
            return True
        raise AssertionError(f"answered while it should block: {line}")

    def call(self, code: str, timeout: float = 10.0) -> dict[str, Any]:
        self.send(code)
        return self.result(timeout)

    def ok(self, code: str, timeout: float = 10.0) -> Any:
        answer = self.call(code, timeout)
        assert "ok" in answer, f"{code}: {answer}\nstderr:\n{self.stderr}"
        return answer["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start() -> Iterator[Callable[..., Pynvml]]:
    """start(nvml, lib_dir=None) -> Pynvml running with nvml.env(); closed at teardown."""
    children: list[Pynvml] = []

    def _start(nvml: FakeNvml, lib_dir: Path | None = None) -> Pynvml:
        env = nvml.env()
        if lib_dir is not None:
            env["LD_LIBRARY_PATH"] = str(lib_dir)
        child = Pynvml(env)
        children.append(child)
        return child

    yield _start
    for child in children:
        child.close()


def two_h200s(nvml: FakeNvml) -> None:
    nvml.devices = [
        Device(uuid="GPU-0f3c5a3e-1b2d-4c5e-8f90-123456789abc", pci_bus_id="00000000:3B:00.0",
               memory_total=143_771 * 2**20, memory_used=80 * GiB, utilization=(97, 41)),
        Device(name="NVIDIA H200 NVL", memory_used=0, utilization=None),
    ]
    nvml.write()


def test_devices(fake_nvml, start):
    two_h200s(fake_nvml)
    py = start(fake_nvml)
    py.ok("nvmlInit()")
    assert py.ok("nvmlDeviceGetCount()") == 2
    assert py.ok("nvmlSystemGetDriverVersion()") == "550.54.15"
    assert py.ok("nvmlSystemGetNVMLVersion()") == "12.550.54.15"
    got = py.ok(
        "[[nvmlDeviceGetUUID(h(i)), nvmlDeviceGetName(h(i)), text(nvmlDeviceGetPciInfo(h(i)).busId),"
        " text(nvmlDeviceGetPciInfo_v3(h(i)).busIdLegacy), nvmlDeviceGetPciInfo(h(i)).bus] for i in range(2)]"
    )
    assert got == [
        ["GPU-0f3c5a3e-1b2d-4c5e-8f90-123456789abc", "NVIDIA H200", "00000000:3B:00.0", "0000:3B:00.0", 0x3B],
        [default_uuid(1), "NVIDIA H200 NVL", default_bus_id(1), default_bus_id(1)[4:], 0x28],
    ]
    memory = py.ok("m = nvmlDeviceGetMemoryInfo(h(0)); [m.total, m.used, m.free]")
    assert memory == [143_771 * 2**20, 80 * GiB, 143_771 * 2**20 - 80 * GiB]
    assert py.ok("u = nvmlDeviceGetUtilizationRates(h(0)); [u.gpu, u.memory]") == [97, 41]
    assert py.call("nvmlDeviceGetUtilizationRates(h(1))")["error"] == "NVMLError_NotSupported"
    assert py.call("nvmlDeviceGetHandleByIndex(2)")["error"] == "NVMLError_InvalidArgument"
    # Handles point into a static table: the same device, the same handle, every time.
    assert py.ok("addr(h(0)) == addr(h(0)) != addr(h(1))") is True
    # A function the fake does not export is one "the driver lacks".
    assert py.call("nvmlDeviceGetPowerUsage(h(0))")["error"] == "NVMLError_FunctionNotFound"
    py.ok("nvmlShutdown()")
    assert py.call("nvmlDeviceGetCount()")["error"] == "NVMLError_Uninitialized"


def test_processes_compute_graphics_mps_and_unknown_memory(fake_nvml, start):
    two_h200s(fake_nvml)
    fake_nvml.processes = [
        Process(0, 4242, 70 * GiB),
        Process(0, 4243, None),  # NVML_VALUE_NOT_AVAILABLE
        Process(0, 5000, 512 * 2**20, "graphics"),
        Process(0, 5001, None, "graphics"),
        Process(1, 6000, 3 * GiB, "mps"),
    ]
    fake_nvml.write()
    py = start(fake_nvml)
    py.ok("nvmlInit()")
    for version in ("", "_v3", "_v2"):
        assert py.ok(f"procs(nvmlDeviceGetComputeRunningProcesses{version}, h(0))") == [
            [4242, 70 * GiB], [4243, None]]
        assert py.ok(f"procs(nvmlDeviceGetGraphicsRunningProcesses{version}, h(0))") == [
            [5000, 512 * 2**20], [5001, None]]
        assert py.ok(f"procs(nvmlDeviceGetMPSComputeRunningProcesses{version}, h(1))") == [[6000, 3 * GiB]]
        assert py.ok(f"procs(nvmlDeviceGetComputeRunningProcesses{version}, h(1))") == []
    info = py.ok("p = nvmlDeviceGetComputeRunningProcesses(h(0))[0]; [p.gpuInstanceId, p.computeInstanceId]")
    assert info == [0xFFFFFFFF, 0xFFFFFFFF]  # not MIG

    # More processes than pynvml's first guess: the count / INSUFFICIENT_SIZE protocol.
    fake_nvml.processes = [Process(1, 10_000 + i, i * 2**20) for i in range(300)]
    fake_nvml.write()
    got = py.ok("procs(nvmlDeviceGetComputeRunningProcesses, h(1))")
    assert got == [[10_000 + i, i * 2**20] for i in range(300)]


def test_a_running_process_sees_each_change(fake_nvml, start):
    two_h200s(fake_nvml)
    py = start(fake_nvml)
    py.ok("nvmlInit(); handle = h(0)")
    assert py.ok("procs(nvmlDeviceGetComputeRunningProcesses, handle)") == []

    fake_nvml.add_process(0, 4242, 1 * GiB)
    assert py.ok("procs(nvmlDeviceGetComputeRunningProcesses, handle)") == [[4242, 1 * GiB]]
    fake_nvml.processes[0].used = 40 * GiB
    fake_nvml.set_memory(0, used=41 * GiB)
    assert py.ok("procs(nvmlDeviceGetComputeRunningProcesses, handle)") == [[4242, 40 * GiB]]
    assert py.ok("nvmlDeviceGetMemoryInfo(handle).used") == 41 * GiB
    fake_nvml.remove_processes(4242)
    assert py.ok("procs(nvmlDeviceGetComputeRunningProcesses, handle)") == []

    fake_nvml.add_device(name="NVIDIA H100 80GB HBM3")
    assert py.ok("[nvmlDeviceGetCount(), nvmlDeviceGetName(h(2))]") == [3, "NVIDIA H100 80GB HBM3"]

    # Rewritten in a loop while the child polls: every answer is a whole state, never a torn one.
    py.send(
        "seen = set()\n"
        "for _ in range(400):\n"
        "    seen.add(tuple(map(tuple, procs(nvmlDeviceGetComputeRunningProcesses, handle))))"
    )
    for i in range(100):
        fake_nvml.processes = [Process(0, 1000 + j, (i + 1) * GiB) for j in range(3)]
        fake_nvml.write()
    assert "ok" in py.result(30)
    seen = py.ok("sorted(seen)")
    assert all(len(s) == 3 and len({used for _, used in s}) == 1 for s in seen if s), seen


@pytest.mark.parametrize(
    ("code", "exception", "message"),
    [
        (9, "NVMLError_DriverNotLoaded", "Driver Not Loaded"),
        (18, "NVMLError_LibRmVersionMismatch", "RM has detected an NVML/RM version mismatch."),
    ],
)
def test_init_failure(fake_nvml, start, code, exception, message):
    two_h200s(fake_nvml)
    fake_nvml.set_init(code)
    py = start(fake_nvml)
    assert py.call("nvmlInit()") == {"error": exception, "code": code, "message": message}
    assert py.call("nvmlInitWithFlags(0)")["error"] == exception
    assert py.call("nvmlDeviceGetCount()")["error"] == "NVMLError_Uninitialized"
    fake_nvml.set_init("ok")  # the driver is back: a retry in the same process works
    py.ok("nvmlInit()")
    assert py.ok("nvmlDeviceGetCount()") == 2


def test_without_a_state_file_there_is_no_driver(fake_nvml, start, tmp_path):
    fake_nvml.state_path = tmp_path / "absent.state"
    py = start(fake_nvml)
    assert py.call("nvmlInit()")["error"] == "NVMLError_DriverNotLoaded"
    py.close()
    assert "fake_nvml: cannot read" in py.stderr


def test_a_malformed_state_file_is_loud(fake_nvml, start):
    fake_nvml.write_text("init ok\ndevice 0 GPU-x 00000000:3B:00.0 NVIDIA H200\nproces 0 1 2 compute\n")
    py = start(fake_nvml)
    assert py.call("nvmlInit()")["error"] == "NVMLError_Unknown"
    py.close()
    assert "unknown directive proces" in py.stderr


def test_a_lost_gpu_while_another_works(fake_nvml, start):
    two_h200s(fake_nvml)
    fake_nvml.add_process(0, 4242, 70 * GiB)
    py = start(fake_nvml)
    py.ok("nvmlInit(); h0, h1 = h(0), h(1)")
    fake_nvml.lose(1)
    for call in ("nvmlDeviceGetUUID(h1)", "nvmlDeviceGetName(h1)", "nvmlDeviceGetPciInfo(h1)",
                 "nvmlDeviceGetMemoryInfo(h1)", "nvmlDeviceGetComputeRunningProcesses(h1)",
                 "nvmlDeviceGetHandleByIndex(1)"):
        assert py.call(call) == {"error": "NVMLError_GpuIsLost", "code": 15, "message": "GPU is lost"}, call
    assert py.ok("nvmlDeviceGetCount()") == 2
    assert py.ok("[nvmlDeviceGetUUID(h0), procs(nvmlDeviceGetComputeRunningProcesses, h(0))]") == [
        "GPU-0f3c5a3e-1b2d-4c5e-8f90-123456789abc", [[4242, 70 * GiB]]]
    assert py.ok("nvmlErrorString(15)") == "GPU is lost"
    fake_nvml.recover(1)
    assert py.ok("nvmlDeviceGetUUID(h1)") == default_uuid(1)


def test_block_holds_that_call_until_the_line_goes(fake_nvml, start):
    two_h200s(fake_nvml)
    fake_nvml.add_process(0, 4242, 1 * GiB)
    py = start(fake_nvml)
    py.ok("nvmlInit(); handle = h(0)")

    fake_nvml.block("nvmlDeviceGetComputeRunningProcesses_v3")
    py.send("procs(nvmlDeviceGetComputeRunningProcesses, handle)")
    assert py.pending(0.5)
    fake_nvml.unblock("nvmlDeviceGetComputeRunningProcesses_v3")
    assert py.result(5) == {"ok": [[4242, 1 * GiB]]}  # answered once the line goes

    # A blocked call stalls only its own thread: other calls, other threads go on.
    with fake_nvml.blocking("nvmlDeviceGetUUID"):
        py.ok("stuck = Background(lambda: nvmlDeviceGetUUID(handle))")
        time.sleep(0.3)
        others = py.ok(
            "[stuck.done, nvmlDeviceGetName(handle), procs(nvmlDeviceGetGraphicsRunningProcesses, handle)]"
        )
        assert others == [False, "NVIDIA H200", []]
    assert py.ok("stuck.wait(5)") == {"ok": "GPU-0f3c5a3e-1b2d-4c5e-8f90-123456789abc"}

    # nvmlInit can be blocked too.
    py.ok("nvmlShutdown()")
    fake_nvml.block("nvmlInitWithFlags")
    py.send("nvmlInit()")
    assert py.pending(0.3)
    fake_nvml.unblock("nvmlInitWithFlags")
    assert py.result(5) == {"ok": None}


def test_fail_makes_a_call_return_that_code(fake_nvml, start):
    two_h200s(fake_nvml)
    py = start(fake_nvml)
    py.ok("nvmlInit(); handle = h(0)")
    fake_nvml.fail("nvmlDeviceGetUUID", 999)
    fake_nvml.fail("nvmlDeviceGetComputeRunningProcesses_v3", 3)
    fake_nvml.fail("nvmlDeviceGetName", 19)  # a code pynvml has no text for: it asks nvmlErrorString
    assert py.call("nvmlDeviceGetUUID(handle)") == {
        "error": "NVMLError_Unknown", "code": 999, "message": "Unknown Error"}
    assert py.call("nvmlDeviceGetComputeRunningProcesses(handle)")["error"] == "NVMLError_NotSupported"
    assert py.call("nvmlDeviceGetName(handle)") == {
        "error": "NVMLError_InUse", "code": 19, "message": "In use by another client"}
    assert py.ok("procs(nvmlDeviceGetComputeRunningProcesses_v2, handle)") == []  # only the one named
    fake_nvml.unfail("nvmlDeviceGetUUID")
    assert py.ok("nvmlDeviceGetUUID(handle)").startswith("GPU-0f3c")

    fake_nvml.fail("nvmlInitWithFlags", 9)
    assert py.call("nvmlInit()")["error"] == "NVMLError_DriverNotLoaded"


def test_a_driver_without_v3_process_listings(fake_nvml, fake_nvml_lib_no_v3, start):
    two_h200s(fake_nvml)
    fake_nvml.add_process(0, 4242, 2 * GiB)
    fake_nvml.add_process(0, 5000, None, "graphics")
    py = start(fake_nvml, fake_nvml_lib_no_v3)
    py.ok("nvmlInit(); handle = h(0)")
    for kind in ("Compute", "Graphics", "MPSCompute"):
        answer = py.call(f"nvmlDeviceGet{kind}RunningProcesses_v3(handle)")
        assert answer["error"] == "NVMLError_FunctionNotFound", answer
        # pynvml's unversioned wrapper turns FunctionNotFound into an exception that is no NVMLError.
        answer = py.call(f"nvmlDeviceGet{kind}RunningProcesses(handle)")
        assert answer["error"] == "NVMLLibraryMismatchError", answer
    assert py.ok("issubclass(NVMLLibraryMismatchError, NVMLError)") is False
    assert py.ok("procs(nvmlDeviceGetComputeRunningProcesses_v2, handle)") == [[4242, 2 * GiB]]
    assert py.ok("procs(nvmlDeviceGetGraphicsRunningProcesses_v2, handle)") == [[5000, None]]


def test_xid_events_each_delivered_once(fake_nvml, start):
    two_h200s(fake_nvml)
    fake_nvml.xid(0, 79)  # before the set exists: still pending for it
    py = start(fake_nvml)
    py.ok("nvmlInit(); h0, h1 = h(0), h(1)")
    assert py.ok("nvmlDeviceGetSupportedEventTypes(h0) & nvmlEventTypeXidCriticalError") != 0
    py.ok("events = nvmlEventSetCreate()")
    py.ok("for d in (h0, h1): nvmlDeviceRegisterEvents(d, nvmlEventTypeXidCriticalError, events)")
    h0, h1 = py.ok("[addr(h0), addr(h1)]")

    assert py.ok("event(nvmlEventSetWait_v2(events, 0))") == {"device": h0, "type": 8, "data": 79}
    assert py.call("nvmlEventSetWait_v2(events, 0)")["error"] == "NVMLError_Timeout"

    assert fake_nvml.xid(1, 48) == 2  # the helper numbers them
    fake_nvml.xid(0, 94)
    assert py.ok("event(nvmlEventSetWait_v2(events, 0))") == {"device": h1, "type": 8, "data": 48}
    assert py.ok("event(nvmlEventSetWait(events, 0))") == {"device": h0, "type": 8, "data": 94}
    assert py.call("nvmlEventSetWait_v2(events, 0)")["error"] == "NVMLError_Timeout"

    # The same sequence number again (the line rewritten) is not a new event.
    fake_nvml.xids[-1].xid = 95
    fake_nvml.write()
    assert py.call("nvmlEventSetWait_v2(events, 0)")["error"] == "NVMLError_Timeout"

    # The timeout is honoured, in ms.
    py.ok("t = time.monotonic(); r = outcome(lambda: nvmlEventSetWait_v2(events, 300))\n"
          "waited = time.monotonic() - t")
    error, elapsed = py.ok("[r['error'], waited]")
    assert error == "NVMLError_Timeout" and elapsed >= 0.28  # 300 ms, not 300 µs (300 s would time the call out)

    # An Xid raised during a long wait ends it at once.
    py.send("event(nvmlEventSetWait_v2(events, 20000))")
    assert py.pending(0.3)
    fake_nvml.xid(1, 31)
    assert py.result(5) == {"ok": {"device": h1, "type": 8, "data": 31}}  # within 5 s of a 20 s wait

    # Another set, for GPU 1 only, gets GPU 1's Xids once each, and nothing of GPU 0's.
    py.ok("only1 = nvmlEventSetCreate(); nvmlDeviceRegisterEvents(h1, nvmlEventTypeXidCriticalError, only1)")
    got = py.ok("[event(nvmlEventSetWait_v2(only1, 0))['data'] for _ in range(2)]")
    assert got == [48, 31]
    assert py.call("nvmlEventSetWait_v2(only1, 0)")["error"] == "NVMLError_Timeout"

    # Event types a datacenter GPU supports register (only Xids ever fire); the rest do not.
    py.ok("nvmlDeviceRegisterEvents(h0, nvmlEventTypeDoubleBitEccError | nvmlEventTypePState, only1)")
    answer = py.call("nvmlDeviceRegisterEvents(h0, nvmlEventTypeAll, only1)")
    assert answer["error"] == "NVMLError_NotSupported"
    py.ok("nvmlEventSetFree(only1); nvmlEventSetFree(events)")


def test_missing_header_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_NVML_HEADER", str(tmp_path))
    with pytest.raises(BuildUnavailable, match="no nvml.h there"):
        find_header()
    monkeypatch.delenv("FAKE_NVML_HEADER")
    try:
        header = find_header()
    except BuildUnavailable as error:
        assert "nvidia-nvml-dev" in str(error)
    else:
        assert header.name == "nvml.h" and "NVML_API_VERSION" in header.read_text()
