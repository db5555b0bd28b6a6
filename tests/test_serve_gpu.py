"""End to end with GPUs: `llmstartup serve` on the real pynvml, loading the fake libnvidia-ml.

Units are real processes in real cgroups logging to the test journald; the fake library reports
GPU memory for their pids and the faults a test asks for (tests/fake_nvml/README.md).
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.scrape import INTERVAL, STALL, Scrape, fetch, wait_for
from tests.test_serve import LOAD

MiB, GiB = 2**20, 2**30
SILENT = [*LOAD, {"hang": True}]  # announces torch.compile, then prints nothing and burns no CPU


@pytest.fixture
def silent_unit(units, journal_records):
    """A unit that has printed its last line and now sits idle; its GPU memory is the test's to set."""

    def start(suffix: str = "gpu"):
        unit = units(suffix, SILENT)
        journal_records(unit, until=lambda es: any("torch.compile" in str(e.get("MESSAGE")) for e in es))
        return unit

    return start


def scrape(port: int) -> Scrape:
    return Scrape(fetch(port))


def verdict(port: int, unit) -> str | None:
    return scrape(port).one_of("unit_verdict", unit.name, "verdict")


def test_gpu_memory_growing_while_silent_is_progress_and_flat_is_stalled(agent, silent_unit, fake_nvml):
    fake_nvml.add_device()
    unit = silent_unit()
    fake_nvml.add_process(0, unit.pid, 1 * GiB)
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)

    # Each second, 256 MiB more (the floor is 64 MiB): what CUDA-graph capture looks like from outside.
    used, verdicts = 1 * GiB, []
    deadline = time.monotonic() + STALL + 4
    while time.monotonic() < deadline:
        used += 256 * MiB
        fake_nvml.remove_processes(unit.pid)
        fake_nvml.add_process(0, unit.pid, used)
        time.sleep(INTERVAL)
        verdicts.append(verdict(port, unit))
    assert verdicts[-1] == "silent_progress"
    assert "stalled" not in verdicts

    shown = wait_for(lambda: (s := scrape(port)).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") == used and s,
                     5, "gpu_memory_used_bytes to equal what NVML reports for the unit's process")
    assert shown.value("llmstartup_source_up", source="gpu") == 1
    assert shown.all("llmstartup_gpu_info")[0].labels["name"] == "NVIDIA H200"

    # The memory stops moving, and nothing else moves: silent progress while the last change is within
    # the stall threshold, then stalled (how soon is bench/stall.py's figure; test_tracker.py has the edge).
    after: list[str | None] = []
    wait_for(lambda: after.append(verdict(port, unit)) or after[-1] == "stalled", 60, "the stalled verdict")
    changes = [v for v, before in zip(after, [None, *after]) if v != before]
    assert changes == ["silent_progress", "stalled"], changes


def test_a_blocked_nvml_call_stalls_only_the_gpu_evidence(agent, silent_unit, fake_nvml, record_property):
    fake_nvml.add_device()
    unit = silent_unit()
    fake_nvml.add_process(0, unit.pid, 4 * GiB)
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    wait_for(lambda: scrape(port).value("llmstartup_source_up", source="gpu") == 1, 10, "the GPU source up")

    with fake_nvml.blocking("nvmlDeviceGetCount_v2"):
        latencies = []
        down = None
        deadline = time.monotonic() + STALL + 6
        while time.monotonic() < deadline:
            started = time.monotonic()
            s = scrape(port)  # urlopen's 5 s timeout fails the test if a scrape hangs
            latencies.append(time.monotonic() - started)
            if down is None and s.value("llmstartup_source_up", source="gpu") == 0:
                down = s
            time.sleep(0.25)
        assert down is not None, "a GPU source stuck inside NVML is reported down once its evidence is stale"
        # Nothing in the unit moves, but the GPU might: unknown, never a false stalled.
        assert verdict(port, unit) == "unknown"
        assert s.value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") is None
        assert s.value("llmstartup_source_up", source="journal") == 1
    record_property("metrics_latency_max_ms_while_nvml_blocks", round(max(latencies) * 1000, 1))

    wait_for(lambda: scrape(port).value("llmstartup_source_up", source="gpu") == 1, 10, "the GPU source back")
    wait_for(lambda: verdict(port, unit) == "stalled", 10, "a stalled verdict once the evidence is fresh again")


def test_nvml_missing_then_back(agent, silent_unit, fake_nvml, tmp_path):
    fake_nvml.add_device()
    fake_nvml.set_init(9)  # NVML_ERROR_DRIVER_NOT_LOADED
    unit = silent_unit()
    fake_nvml.add_process(0, unit.pid, 3 * GiB)
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    s = wait_for(lambda: (s := scrape(port)).one_of("unit_phase", unit.name, "phase") == "compiling" and s, 10,
                 "the unit followed without NVML")
    assert s.value("llmstartup_source_up", source="gpu") == 0
    assert s.value("llmstartup_source_up", source="processes") == 1
    log = (tmp_path / "agent-0.log").read_text()  # no driver is no fault: information, in a person's words
    assert "level=INFO logger=exporter.sources.gpu msg=no NVIDIA driver loaded here: GPU memory will not be sampled" \
        in log and "gpu source down" not in log, log

    fake_nvml.set_init("ok")  # the driver is back: the source retries with back-off and recovers
    wait_for(lambda: scrape(port).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") == 3 * GiB,
             20, "GPU memory after the driver came back")


def test_version_mismatch_is_reported_and_survived(agent, silent_unit, fake_nvml, tmp_path):
    fake_nvml.set_init(18)  # NVML_ERROR_LIB_RM_VERSION_MISMATCH: driver upgraded, not reloaded
    unit = silent_unit()
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    wait_for(lambda: scrape(port).one_of("unit_phase", unit.name, "phase") == "compiling", 10, "the unit followed")
    assert scrape(port).value("llmstartup_source_up", source="gpu") == 0
    log = wait_for(lambda: "mismatch" in (text := (tmp_path / "agent-0.log").read_text()).lower() and text, 5,
                   "the reason in the agent's log")
    assert "gpu source down" in log


def test_one_gpu_lost_while_the_other_works(agent, silent_unit, fake_nvml):
    fake_nvml.add_device()
    fake_nvml.add_device()
    unit = silent_unit()
    fake_nvml.add_process(0, unit.pid, 2 * GiB)
    fake_nvml.add_process(1, unit.pid, 5 * GiB)
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    wait_for(lambda: scrape(port).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="1") == 5 * GiB,
             10, "memory on both GPUs")

    fake_nvml.lose(1)
    s = wait_for(lambda: (s := scrape(port)).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="1") is None and s,
                 10, "the lost GPU's memory to become unknown")
    assert s.value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") == 2 * GiB
    assert s.value("llmstartup_source_up", source="gpu") == 1


def test_a_driver_without_the_v3_calls(agent, silent_unit, fake_nvml, fake_nvml_lib_no_v3):
    fake_nvml.lib_dir = fake_nvml_lib_no_v3
    fake_nvml.add_device()
    unit = silent_unit()
    fake_nvml.add_process(0, unit.pid, 7 * GiB)
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    wait_for(lambda: scrape(port).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") == 7 * GiB,
             10, "memory through the _v2 calls")


def test_an_xid_on_its_gpu_is_why_the_start_failed(agent, silent_unit, fake_nvml):
    fake_nvml.add_device()
    fake_nvml.add_device()
    unit = silent_unit()
    fake_nvml.add_process(0, unit.pid, 6 * GiB)
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    wait_for(lambda: scrape(port).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") == 6 * GiB,
             10, "the unit's memory on GPU 0")

    fake_nvml.xid(0, 79)
    fake_nvml.xid(1, 48)  # on a GPU the unit does not use: counted, but not its cause
    wait_for(lambda: scrape(port).value("llmstartup_gpu_xid_errors_total", gpu="0", xid="79") == 1, 10, "the Xid counted")
    unit.stop()
    s = wait_for(lambda: (s := scrape(port)).one_of("unit_verdict", unit.name, "verdict") == "failed" and s, 10,
                 "the start to fail")
    assert s.value("llmstartup_failures_total", unit=unit.name, phase="compiling", reason="gpu_xid") == 1
    assert s.value("llmstartup_gpu_xid_errors_total", gpu="1", xid="48") == 1


def test_graphics_and_mps_memory_count_with_compute(agent, silent_unit, fake_nvml):
    """Each of the unit's processes is in any of NVML's three listings; its memory is summed per GPU, once
    per process even where a process is in two listings of one GPU (NVML gives it the same value in each)."""
    fake_nvml.add_device()
    fake_nvml.add_device()
    unit = silent_unit()
    [engine] = psutil.Process(unit.pid).children()  # the EngineCore child its first EngineCore line forked
    fake_nvml.add_process(0, unit.pid, 4 * GiB, "compute")
    fake_nvml.add_process(0, engine.pid, 6 * GiB, "graphics")
    fake_nvml.add_process(0, engine.pid, 6 * GiB, "compute")
    fake_nvml.add_process(1, engine.pid, 3 * GiB, "mps")
    fake_nvml.add_process(1, unit.pid, 1 * GiB, "graphics")
    port = agent(unit.name, env=fake_nvml.env(), gpu=True)
    wait_for(lambda: (s := scrape(port)).value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="0") == 10 * GiB
             and s.value("llmstartup_gpu_memory_used_bytes", unit=unit.name, gpu="1") == 4 * GiB,
             10, "10 GiB on GPU 0 and 4 GiB on GPU 1: compute, graphics and MPS, each process once")
