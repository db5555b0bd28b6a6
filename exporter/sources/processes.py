"""Process source: what each unit's cgroup holds, read from cgroup v2 files and psutil."""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

import psutil

from exporter.core.model import ProcessSample, ProcessState, frozen_map
from exporter.sources.scopes import ContainerScopes

logger = logging.getLogger(__name__)
T = TypeVar("T")

STATES: Mapping[str, ProcessState] = MappingProxyType(
    {
        psutil.STATUS_RUNNING: ProcessState.RUNNING,
        psutil.STATUS_WAKING: ProcessState.RUNNING,
        psutil.STATUS_SLEEPING: ProcessState.SLEEPING,
        psutil.STATUS_IDLE: ProcessState.SLEEPING,
        psutil.STATUS_PARKED: ProcessState.SLEEPING,
        psutil.STATUS_DISK_SLEEP: ProcessState.DISK_SLEEP,
        "wake-kill": ProcessState.DISK_SLEEP,  # "K" on old kernels; psutil exports no constant for it
        psutil.STATUS_STOPPED: ProcessState.STOPPED,
        psutil.STATUS_TRACING_STOP: ProcessState.STOPPED,
        psutil.STATUS_ZOMBIE: ProcessState.ZOMBIE,
        psutil.STATUS_DEAD: ProcessState.ZOMBIE,
    }
)

# A cgroup removed while we read it answers ENOENT, or ENODEV for a file already open.
GONE = frozenset({errno.ENOENT, errno.ENODEV})

# mountinfo writes space, tab, newline and backslash in paths as three-digit octal escapes.
OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class CgroupUnavailable(OSError):
    """The cgroup v2 root cannot be read: the whole source is down, not any one unit."""


def parse_cgroup2_mount(text: str) -> str | None:
    """The mount point of the first cgroup2 filesystem in a /proc/<pid>/mountinfo text."""
    for line in text.splitlines():
        fields = line.split()
        # Optional fields (shared:N, master:N, …) vary in number; six fields always precede them,
        # so looking for the separator from there cannot mistake a mount point named "-" for it.
        try:
            separator = fields.index("-", 6)
        except ValueError:
            continue
        if fields[separator + 1 : separator + 2] == ["cgroup2"]:
            return OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[4])
    return None


def find_cgroup2_root(mountinfo_path: str | Path = "/proc/self/mountinfo") -> Path | None:
    """Where cgroup2 is mounted: /sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid ones."""
    mount = parse_cgroup2_mount(Path(mountinfo_path).read_text())
    return Path(mount) if mount is not None else None


@dataclass(slots=True)  # the source's own cache entry, not a value handed out
class _Known:
    process: psutil.Process
    # Fixed at first sight: recomputing it each sample would let the drift of the wall/monotonic
    # offset change a process's identity and look like processes coming and going.
    started: float
    io_denied: bool = False  # /proc/<pid>/io refused: said once in the log


@dataclass(frozen=True, slots=True)
class _Reading:
    pid: int
    started: float
    state: ProcessState | None
    cpu_seconds: float
    read_bytes: int
    written_bytes: int
    rss_bytes: int


def create_time_offset() -> float:
    """What to subtract from psutil's create_time() to get CLOCK_MONOTONIC seconds.

    psutil adds /proc/stat's btime, which is whole seconds, so time.time() - time.monotonic() would
    put every start up to a second early; this undoes psutil's own arithmetic exactly.
    """
    return psutil.boot_time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic())


class ProcessSource:
    """Samples the processes of units in the cgroup v2 tree: a systemd service's under one slice, a
    container's in the cgroup named after its id (`place`).

    Keeps the psutil.Process of every process it saw in the last call, so pass every watched unit
    to one `sample` call: a process not seen in a call is forgotten.
    """

    def __init__(self, cgroup_root: Path, slice: str = "system.slice") -> None:
        self.cgroup_root = Path(cgroup_root)
        self.slice = slice
        self._known: dict[int, _Known] = {}
        self._io_warned = False
        self.scopes = ContainerScopes(self.cgroup_root)
        self._containers: dict[str, str] = {}  # unit → container id, for the units that are containers

    def place(self, containers: Mapping[str, str]) -> None:
        """These units are containers (unit → container id): their processes are in the container's cgroup."""
        self._containers = dict(containers)
        self.scopes.find(self._containers.values())

    def cgroup(self, unit: str) -> Path | None:
        """The unit's cgroup directory (which may not exist); None when a container's is not found."""
        container = self._containers.get(unit)
        return self.cgroup_root / self.slice / unit if container is None else self.scopes.cgroup(container)

    def _unplaced(self, unit: str) -> bool:
        """A container whose cgroup is not found yet, but may still appear: no evidence either way."""
        container = self._containers.get(unit)
        return container is not None and self.scopes.cgroup(container) is None and not self.scopes.gone(container)

    def sample(
        self, units: Iterable[str], t: float, boot_offset: float | None = None
    ) -> dict[str, ProcessSample]:
        """Each unit's processes at monotonic time `t` (boot_offset: see create_time_offset).

        A unit with no cgroup gets an empty sample. A unit whose cgroup exists but cannot be read, or a
        container whose cgroup is not found yet, is left out, so its evidence goes stale rather than
        claiming its processes are gone.
        """
        self._check_root()
        if boot_offset is None:
            boot_offset = create_time_offset()
        known: dict[int, _Known] = {}
        samples: dict[str, ProcessSample] = {}
        for unit in units:
            if self._unplaced(unit):
                continue
            cgroup = self.cgroup(unit)
            try:
                pids = _pids(cgroup) if cgroup else set()
            except OSError:
                continue
            readings = []
            for pid in sorted(pids):
                entry = known.get(pid) or self._identify(pid, boot_offset)
                if entry is None:
                    continue
                known[pid] = entry
                reading = _read(entry)
                if reading is not None:
                    readings.append(reading)
            samples[unit] = _summarise(unit, t, readings, _cgroup_cpu_seconds(cgroup) if cgroup else None)
            if not self._io_warned and any(known[r.pid].io_denied for r in readings):
                self._io_warned = True
                logger.warning(
                    "unit=%s cannot read /proc/<pid>/io of its processes (run as root, as their user, or with "
                    "CAP_SYS_PTRACE): read/written bytes and the io signal miss them", unit)
        self._known = known
        return samples

    def list_units(self) -> dict[str, tuple[str, ...]]:
        """Every service under the slice that has a process, with its processes' command lines."""
        self._check_root()
        try:
            entries = sorted(os.scandir(self.cgroup_root / self.slice), key=lambda e: e.name)
        except FileNotFoundError:
            return {}
        units: dict[str, tuple[str, ...]] = {}
        for entry in entries:
            if not entry.name.endswith(".service") or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                pids = _pids(Path(entry.path))
            except OSError:
                continue
            if pids:
                units[entry.name] = _cmdlines(pids)
        return units

    def cmdlines(self, unit: str) -> tuple[str, ...]:
        """The command lines of one unit's processes; () when it has none, or no cgroup."""
        cgroup = self.cgroup(unit)
        try:
            return _cmdlines(_pids(cgroup)) if cgroup else ()
        except OSError:
            return ()

    def _check_root(self) -> None:
        # cgroup.controllers exists in every cgroup2 directory and in no cgroup v1 or tmpfs one, so
        # this also catches a root pointing at the wrong hierarchy, which would read as "no units".
        try:
            os.stat(self.cgroup_root / "cgroup.controllers")
        except OSError as err:
            raise CgroupUnavailable(
                err.errno, f"cannot read the cgroup v2 root ({err.strerror})", str(self.cgroup_root)
            ) from err

    def _identify(self, pid: int, boot_offset: float) -> _Known | None:
        # A pid alone can be reused. A fresh Process costs one read of /proc/<pid>/stat and compares
        # equal to the kept one only if (pid, start time) match; create_time is then not re-read,
        # which would read the whole of /proc/stat again.
        try:
            fresh = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return None
        kept = self._known.get(pid)
        if kept is not None and kept.process == fresh:
            return kept
        try:
            # to the clock tick, so that every agent computes the same identity for the same process
            started = round(fresh.create_time() - boot_offset, 2)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return _Known(fresh, started)


def _gone_or_raise(err: OSError) -> None:
    if err.errno not in GONE:
        raise err


def _pids(cgroup: Path) -> set[int]:
    """Every process in the cgroup and its descendants; a cgroup removed meanwhile holds none."""
    pids: set[int] = set()
    for directory, _, _ in os.walk(cgroup, onerror=_gone_or_raise):
        try:
            with open(os.path.join(directory, "cgroup.procs"), "rb") as f:
                pids.update(int(pid) for pid in f.read().split())
        except OSError as err:
            _gone_or_raise(err)
    return pids


def _cgroup_cpu_seconds(cgroup: Path) -> float | None:
    # The cgroup's own counter keeps the CPU of children that already exited (torch.compile
    # workers), which a sum over the processes still alive loses.
    try:
        with open(cgroup / "cpu.stat", "rb") as f:
            for line in f:
                key, _, value = line.partition(b" ")
                if key == b"usage_usec":
                    return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def _value(read: Callable[[], T], default: T) -> T:
    try:
        return read()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        # exited mid-read, a zombie, or /proc/<pid>/io refused to a user that may not ptrace it
        return default


def _read(known: _Known) -> _Reading | None:
    process = known.process
    with process.oneshot():
        try:
            state: ProcessState | None = STATES.get(process.status(), ProcessState.SLEEPING)
        except psutil.ZombieProcess:
            state = ProcessState.ZOMBIE
        except psutil.NoSuchProcess:
            return None  # exited since its cgroup listed it
        except psutil.AccessDenied:
            state = None
        cpu = _value(process.cpu_times, None)
        try:
            io = process.io_counters()
        except psutil.AccessDenied:  # /proc/<pid>/io needs the same user or CAP_SYS_PTRACE
            io, known.io_denied = None, True
        except psutil.NoSuchProcess:
            io = None
        memory = _value(process.memory_info, None)
    return _Reading(
        pid=process.pid,
        started=known.started,
        state=state,
        cpu_seconds=cpu.user + cpu.system + cpu.children_user + cpu.children_system if cpu else 0.0,
        # rchar/wchar rather than block I/O: they also count sockets, so a download moves them
        read_bytes=io.read_chars if io else 0,
        written_bytes=io.write_chars if io else 0,
        rss_bytes=memory.rss if memory else 0,
    )


def _summarise(unit: str, t: float, readings: list[_Reading], cgroup_cpu: float | None) -> ProcessSample:
    states = dict.fromkeys(ProcessState, 0)
    for reading in readings:
        if reading.state is not None:
            states[reading.state] += 1
    return ProcessSample(
        t=t,
        unit=unit,
        ids=frozenset((r.pid, r.started) for r in readings),
        cpu_seconds=cgroup_cpu if cgroup_cpu is not None else sum(r.cpu_seconds for r in readings),
        read_bytes=sum(r.read_bytes for r in readings),
        written_bytes=sum(r.written_bytes for r in readings),
        rss_bytes=sum(r.rss_bytes for r in readings),
        states=frozen_map(states),
        started_at=min((r.started for r in readings), default=None),
    )


def _cmdlines(pids: set[int]) -> tuple[str, ...]:
    return tuple(line for line in map(_cmdline, sorted(pids)) if line)


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""  # gone, a zombie (no command line left), or hidden from us
