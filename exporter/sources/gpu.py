"""pynvml → GPU memory of each process per GPU, sampled on a thread of its own because GPUs hang."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pynvml

from exporter.model import frozen_map
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuReading:
    t: float  # monotonic
    devices: tuple[tuple[str, str, str], ...]  # (index, uuid, name)
    usage: Mapping[int, Mapping[str, int | None]] = field(default_factory=frozen_map)  # pid → gpu → bytes


def by_unit(
    reading: GpuReading, pids: Mapping[str, frozenset[int]]
) -> dict[str, dict[str, int | None]]:
    """GPU memory per unit and GPU: the sum over the unit's processes; None when NVML could not say."""
    result: dict[str, dict[str, int | None]] = {}
    for unit, unit_pids in pids.items():
        memory: dict[str, int | None] = {}
        for pid in unit_pids & reading.usage.keys():
            for gpu, used in reading.usage[pid].items():
                before = memory.get(gpu, 0)
                memory[gpu] = None if used is None or before is None else before + used
        result[unit] = memory
    return result


class GpuSource:
    """Reads NVML every interval. Without NVML (no driver, no GPU) it reports itself down, retries
    with back-off, and nothing else in the agent notices."""

    def __init__(
        self,
        interval: float,
        nvml: Any = pynvml,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.interval = interval
        self._nvml = nvml
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu", daemon=True)
        self.latest: GpuReading | None = None
        self.status = SourceStatus("gpu", logger, wall)

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
            except self._nvml.NVMLError as error:
                self.status.down(f"NVML unavailable: {error}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            try:
                while not self._stop.is_set():
                    self.latest = self._read()
                    self.status.ok(f"{len(self.latest.devices)} GPUs")
                    self._stop.wait(self.interval)
            except self._nvml.NVMLError as error:
                self.status.down(f"NVML failed: {error}")
            finally:
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError:
                    pass
            self._stop.wait(backoff)

    def _read(self) -> GpuReading:
        nvml = self._nvml
        devices, usage = [], {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = str(index)
            devices.append((gpu, _str(nvml.nvmlDeviceGetUUID(handle)), _str(nvml.nvmlDeviceGetName(handle))))
            per_pid: dict[int, int | None] = {}  # a process in both lists is one process, not two
            for listing in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    for process in listing(handle):
                        per_pid[process.pid] = process.usedGpuMemory
                except nvml.NVMLError_NotSupported:
                    pass
            for pid, used in per_pid.items():
                usage.setdefault(pid, {})[gpu] = used
        return GpuReading(self._clock(), tuple(devices), frozen_map({p: frozen_map(u) for p, u in usage.items()}))

def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
