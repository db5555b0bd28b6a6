"""GPU source: attribution of per-process GPU memory to units, and life without NVML."""

import ctypes.util

import pytest

from exporter.sources.gpu import GpuReading, GpuSource, by_unit
from tests.scrape import wait_for

GiB = 2**30
READING = GpuReading(
    t=1.0,
    devices=(("0", "GPU-aaa", "H200"), ("1", "GPU-bbb", "H200")),
    usage={
        100: {"0": 10 * GiB, "1": 10 * GiB},
        101: {"0": 2 * GiB},
        200: {"1": 5 * GiB},
        300: {"0": None},
    },
)


@pytest.mark.parametrize(
    ("pids", "want"),
    [
        pytest.param({"a.service": frozenset({100, 101})}, {"a.service": {"0": 12 * GiB, "1": 10 * GiB}},
                     id="summed over the unit's processes, per GPU"),
        pytest.param({"b.service": frozenset({200})}, {"b.service": {"1": 5 * GiB}}, id="only the GPUs it uses"),
        pytest.param({"c.service": frozenset({999})}, {"c.service": {}}, id="a unit with no GPU process"),
        pytest.param({"d.service": frozenset({300, 101})}, {"d.service": {"0": None}},
                     id="memory NVML cannot report makes the sum unknown, never 0"),
        pytest.param({"a.service": frozenset({100}), "b.service": frozenset({200})},
                     {"a.service": {"0": 10 * GiB, "1": 10 * GiB}, "b.service": {"1": 5 * GiB}},
                     id="other units' processes are not counted"),
    ],
)
def test_by_unit(pids, want):
    assert by_unit(READING, pids) == want


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML")
def test_without_nvml_the_source_is_down_and_harmless():
    # This machine has no NVIDIA driver: the real pynvml cannot load libnvidia-ml.so.1.
    source = GpuSource(interval=0.1)
    source.start()
    try:
        wait_for(lambda: source.status.failing, 5, "the GPU source to report itself down")
        assert source.latest is None
        assert source.status.health.up is False
    finally:
        source.stop()
