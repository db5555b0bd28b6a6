"""Xid errors: which GPU a kernel line names, one count per event, and the units it hits."""

import pytest

from exporter.core.model import Fault, Gpu, GpuSample, Reason, UnitState, XidError
from exporter.core.xids import XidTally, bus_key, count, faults, is_repeat, resolve

GPUS = (Gpu("0", "GPU-a", "H200", "00000000:3B:00.0"), Gpu("1", "GPU-b", "H200", "00000000:5D:00.0"))


@pytest.mark.parametrize(
    ("bus", "key"),
    [("0000:3b:00", "3b:00"), ("00000000:3B:00.0", "3b:00"), ("3b:00.0", "3b:00")],
)
def test_bus_key(bus, key):
    assert bus_key(bus) == key


def test_kernel_line_gets_the_nvml_index():
    assert resolve(XidError(1, "0000:5d:00", 79, "kernel"), GPUS).gpu == "1"
    assert resolve(XidError(1, "0000:99:00", 79, "kernel"), GPUS).gpu == "0000:99:00"


@pytest.mark.parametrize(
    ("xid", "want"),
    [
        pytest.param(XidError(12, "0", 79, "nvml"), True, id="NVML's event for the kernel's line"),
        pytest.param(XidError(12, "0", 79, "kernel"), False, id="the same source twice is two events"),
        pytest.param(XidError(30, "0", 79, "nvml"), False, id="long after: another event"),
        pytest.param(XidError(12, "1", 79, "nvml"), False, id="another GPU"),
        pytest.param(XidError(12, "0", 31, "nvml"), False, id="another Xid"),
    ],
)
def test_is_repeat(xid, want):
    assert is_repeat(xid, [XidError(10, "0", 79, "kernel")]) is want


def test_faults_hit_the_units_with_memory_on_that_gpu():
    on0 = UnitState("a.service", last_gpu=GpuSample(1, "a.service", {"0": 2**30}))
    on1 = UnitState("b.service", last_gpu=GpuSample(1, "b.service", {"1": 2**30}))
    idle = UnitState("c.service")
    assert faults(XidError(5, "0", 79, "nvml"), [on0, on1, idle]) == [Fault(5, "a.service", Reason.GPU_XID)]


@pytest.mark.parametrize(
    ("nvml_after", "counted"),
    [
        pytest.param(0.0, 1, id="at once: one event"),
        pytest.param(5.0, 1, id="5 s after the kernel's line: still the same event"),
        pytest.param(5.01, 2, id="just past 5 s: another event"),
    ],
)
def test_the_kernel_and_nvml_report_one_xid_within_5_s(nvml_after, counted):
    """The kernel's line is read first (the agent's round), NVML's event of the same Xid later."""
    tally, new, _ = count(XidTally(), [XidError(10.0, "0000:3b:00", 79, "kernel")], GPUS, [], now=10.0)
    assert new == [XidError(10.0, "0", 79, "kernel")]
    later = 10.0 + nvml_after
    tally, new, _ = count(tally, [XidError(later, "0", 79, "nvml")], GPUS, [], now=later)
    assert tally.counts == {("0", 79): counted}
    assert len(new) == counted - 1
