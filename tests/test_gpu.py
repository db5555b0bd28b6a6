"""GPU source: attribution of per-process GPU memory to units, and life without NVML."""

import ctypes.util
import logging
from dataclasses import replace

import pynvml
import pytest

from exporter.core.model import Gpu
from exporter.sources.gpu import GpuReading, GpuSource, by_unit, host_to_local_pids, in_child_pid_namespace
from tests.scrape import wait_for

GiB = 2**30
READING = GpuReading(
    t=100.0,
    devices=(Gpu("0", "GPU-aaa", "H200", "00000000:3B:00.0"), Gpu("1", "GPU-bbb", "H200", "00000000:5D:00.0")),
    usage={
        100: {"0": 10 * GiB, "1": 10 * GiB},
        101: {"0": 2 * GiB},
        200: {"1": 5 * GiB},
        300: {"0": None},  # MIG, or a driver that cannot say per process
    },
)


def ids(*pids, started=50.0):
    return frozenset((pid, started) for pid in pids)


@pytest.mark.parametrize(
    ("reading", "units", "want"),
    [
        pytest.param(READING, {"a": ids(100, 101)}, {"a": {"0": 12 * GiB, "1": 10 * GiB}},
                     id="summed over the unit's processes, per GPU"),
        pytest.param(READING, {"b": ids(200)}, {"b": {"1": 5 * GiB}}, id="only the GPUs it uses"),
        pytest.param(READING, {"c": ids(999)}, {"c": {}}, id="a unit with no GPU process"),
        pytest.param(READING, {"a": ids(100), "b": ids(200)},
                     {"a": {"0": 10 * GiB, "1": 10 * GiB}, "b": {"1": 5 * GiB}},
                     id="other units' processes are not counted"),
        pytest.param(READING, {"d": ids(300, 101)}, {"d": {"0": None}},
                     id="memory NVML cannot report makes the sum unknown, never 0"),
        pytest.param(READING, {"e": ids(100, started=100.5)}, {"e": {}},
                     id="a pid reused after the reading is another process"),
        pytest.param(READING, {"f": frozenset()}, {"f": {}}, id="vanished: no process left"),
        pytest.param(replace(READING, lost=frozenset({"1"})), {"a": ids(100)}, {"a": {"0": 10 * GiB, "1": None}},
                     id="a lost GPU is unknown, not 0"),
    ],
)
def test_by_unit(reading, units, want):
    assert by_unit(reading, units) == want


class _Counted:
    """pynvml itself, counting the agent's calls to nvmlInit."""

    def __init__(self) -> None:
        self.inits = 0

    def __getattr__(self, name: str):
        return getattr(pynvml, name)

    def nvmlInit(self) -> None:
        self.inits += 1
        pynvml.nvmlInit()


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML")
def test_without_nvml_the_source_is_down_and_harmless_and_says_so_once_as_information(caplog):
    # This machine has no NVIDIA driver: the real pynvml cannot load libnvidia-ml.so.1.
    nvml = _Counted()
    source = GpuSource(interval=0.05, nvml=nvml)
    with caplog.at_level(logging.INFO, logger="exporter.sources.gpu"):
        source.start()
        try:
            wait_for(lambda: nvml.inits >= 3, 5, "the GPU source to look for the driver again")
            assert source.latest is None
            assert source.status.health.up is False
        finally:
            source.stop()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "exporter.sources.gpu"]
    assert said == [("INFO", "no NVIDIA driver here: GPU memory will not be sampled")]
    assert source.status.absent == "no NVIDIA driver here: GPU memory will not be sampled"


def _proc(tmp_path, statuses: dict[str, str | None]):
    """A /proc tree whose <pid>/status files hold these lines (None: a process gone before its status was read)."""
    for name, nspid in statuses.items():
        (tmp_path / name).mkdir()
        if nspid is not None:
            (tmp_path / name / "status").write_text(f"Name:\tpython3\nTgid:\t{name}\n{nspid}\nPPid:\t1\n")
    (tmp_path / "meminfo").write_text("MemTotal: 1 kB\n")
    return tmp_path


def test_inside_a_pid_namespace_nvmls_host_pids_become_ours(tmp_path):
    """NVML names processes by their host pid; in a container, /proc/<pid>/status's NSpid line
    (outermost namespace first) says which of ours each one is."""
    proc = _proc(tmp_path, {"self": "NSpid:\t31337\t7", "7": "NSpid:\t31337\t7", "12": "NSpid:\t40001\t12",
                            "13": None, "99": "Umask:\t0022"})
    assert in_child_pid_namespace(proc)
    assert host_to_local_pids(proc) == {31337: 7, 40001: 12}


def test_on_the_host_pids_are_nvmls_own(tmp_path):
    assert not in_child_pid_namespace(_proc(tmp_path, {"self": "NSpid:\t4242", "4242": "NSpid:\t4242"}))
