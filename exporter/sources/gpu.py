"""pynvml → GPU memory of each process per GPU, and Xid events, on a thread of its own because GPUs hang."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from exporter.core.model import Gpu, XidError, frozen_map
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

# What NVML says on a host without an NVIDIA driver, in a person's words.
ABSENT = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver here: GPU memory will not be sampled",
    "NVMLError_DriverNotLoaded": "no NVIDIA driver loaded here: GPU memory will not be sampled",
}
# Newest first: a driver without the _v3 calls makes pynvml raise FunctionNotFound, then _v2 is tried.
PROCESS_LISTINGS = tuple(
    f"nvmlDeviceGet{kind}RunningProcesses{version}"
    for kind in ("Compute", "Graphics", "MPSCompute")
    for version in ("_v3", "_v2")
)


@dataclass(frozen=True, slots=True)
class GpuReading:
    t: float  # monotonic
    devices: tuple[Gpu, ...]
    usage: Mapping[int, Mapping[str, int | None]] = field(default_factory=frozen_map)  # pid → gpu → bytes
    lost: frozenset[str] = frozenset()  # GPUs that did not answer (GPU_IS_LOST and the like)
    xids: tuple[XidError, ...] = ()  # NVML Xid events since the previous reading


def by_unit(
    reading: GpuReading, ids: Mapping[str, frozenset[tuple[int, float]]]
) -> dict[str, dict[str, int | None]]:
    """GPU memory per unit and GPU, summed over the unit's processes; None where NVML cannot say.

    A process counts only if it started before the reading: a pid reused since then is another
    process. A lost GPU's memory is unknown for every unit, never 0 (that would read as movement).
    """
    result: dict[str, dict[str, int | None]] = {}
    for unit, unit_ids in ids.items():
        memory: dict[str, int | None] = {}
        for pid, started in unit_ids:
            if pid not in reading.usage or started > reading.t:
                continue
            for gpu, used in reading.usage[pid].items():
                before = memory.get(gpu, 0)
                memory[gpu] = None if used is None or before is None else before + used
        memory.update({gpu: None for gpu in reading.lost})
        result[unit] = memory
    return result


def _nspid(status: Path) -> list[int]:
    """A process's pid in each pid namespace it is in, outermost (the host's) first."""
    for line in status.read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:]]
    return []


def in_child_pid_namespace(proc: Path = Path("/proc")) -> bool:
    try:
        return len(_nspid(proc / "self" / "status")) > 1
    except OSError:
        return False


def host_to_local_pids(proc: Path = Path("/proc")) -> dict[int, int]:
    """NVML reports pids as the host sees them; in a container with its own pid namespace, this maps
    them to ours through each process's NSpid line."""
    mapping = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                pids = _nspid(entry / "status")
            except OSError:  # gone between listing and reading
                continue
            if pids:
                mapping[pids[0]] = int(entry.name)
    return mapping


class GpuSource:
    """Reads NVML every interval. Without NVML (no driver, no GPU) it reports itself down, retries
    with back-off, and nothing else in the agent notices. A call that blocks stalls only this thread:
    the reading goes stale, and the agent's verdicts say unknown rather than guess."""

    def __init__(
        self,
        interval: float,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.interval = interval
        if nvml is None:
            import pynvml  # here: an agent without the GPU collector never loads it (1.8 MiB of its memory)

            nvml = pynvml
        self._nvml = nvml
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu", daemon=True)
        self._events: Any = None
        self.latest: GpuReading | None = None
        self.status = SourceStatus("gpu", logger, wall)
        self._namespaced = in_child_pid_namespace()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)  # a hung NVML call keeps its daemon thread; we do not wait for it

    def _run(self) -> None:
        backoff = self.interval
        while not self._stop.is_set():
            try:
                self._nvml.nvmlInit()
                self._events = self._watch_xids()
            except self._nvml.NVMLError as error:
                # A host without a GPU is no fault: said once, as information. The driver may come later (or
                # come back after an upgrade): it is looked for again either way.
                absent = ABSENT.get(type(error).__name__)
                self.status.down(absent or f"NVML unavailable: {error}", absent=absent is not None)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            backoff = self.interval
            try:
                while not self._stop.is_set():
                    self.latest = self._read()
                    self.status.ok(f"{len(self.latest.devices)} GPUs, {len(self.latest.lost)} lost")
                    self._stop.wait(self.interval)
            except self._nvml.NVMLError as error:
                self.status.down(f"NVML failed: {error}")
            finally:
                self._close()
            self._stop.wait(backoff)

    def _close(self) -> None:
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
        self._events = None

    def _watch_xids(self) -> Any:
        """An NVML event set for critical Xids on every GPU that supports it; None if none does."""
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return None
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    nvml.nvmlDeviceGetHandleByIndex(index), nvml.nvmlEventTypeXidCriticalError, events
                )
            except nvml.NVMLError as error:  # this GPU cannot report Xids: the kernel log still can
                logger.info("gpu=%d gives no Xid events: %s", index, error)
        return events

    def _read(self) -> GpuReading:
        nvml = self._nvml
        devices, usage, lost, handles = [], {}, set(), {}
        for index in range(nvml.nvmlDeviceGetCount()):
            gpu = str(index)
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                handles[_address(handle)] = gpu
                devices.append(self._device(gpu, handle))
                per_pid = {p.pid: p.usedGpuMemory for p in self._processes(handle)}  # one process, one value
            except nvml.NVMLError as error:  # GPU_IS_LOST, Unknown: this GPU says nothing, the others may
                if gpu not in (self.latest.lost if self.latest else ()):
                    logger.warning("gpu=%s unreadable: %s", gpu, error)
                lost.add(gpu)
                continue
            for pid, used in per_pid.items():
                usage.setdefault(pid, {})[gpu] = used
        if self._namespaced:
            local = host_to_local_pids()
            usage = {local[pid]: u for pid, u in usage.items() if pid in local}
        return GpuReading(
            self._clock(),
            tuple(devices),
            frozen_map({p: frozen_map(u) for p, u in usage.items()}),
            frozenset(lost),
            tuple(self._xids(handles)),
        )

    def _device(self, gpu: str, handle: Any) -> Gpu:
        nvml = self._nvml
        try:
            utilization: float | None = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            utilization = None
        try:
            bus_id = _str(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            bus_id = ""
        uuid, name = _str(nvml.nvmlDeviceGetUUID(handle)), _str(nvml.nvmlDeviceGetName(handle))
        return Gpu(gpu, uuid, name, bus_id, utilization)

    def _processes(self, handle: Any) -> Iterator[Any]:
        nvml = self._nvml
        done: set[str] = set()
        for name in PROCESS_LISTINGS:
            kind = name.rsplit("_", 1)[0]
            if kind in done:
                continue
            try:
                yield from getattr(nvml, name)(handle)
                done.add(kind)
            except nvml.NVMLError_FunctionNotFound:
                continue  # an older driver: try the older version of the call
            except nvml.NVMLError_NotSupported:
                done.add(kind)

    def _xids(self, handles: Mapping[int, str]) -> Iterator[XidError]:
        nvml = self._nvml
        if self._events is None:
            return
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError_Timeout:
                return
            gpu = handles.get(_address(event.device), "unknown")
            yield XidError(self._clock(), gpu, int(event.eventData), "nvml")


def _address(handle: Any) -> int:
    import ctypes  # loaded by pynvml already

    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
