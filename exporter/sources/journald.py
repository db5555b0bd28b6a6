"""journald itself, from /proc: whether the process that writes the journal runs, and whether it reads the units.

A stopped or hung journald leaves the reader nothing to read, which looks exactly like every unit falling silent at
once; a model server whose output journald no longer reads even blocks in write() once its stream's buffer is full.
Told apart here, the agent says the journal is down rather than that the servers stalled (docs/reliability.md §1.5).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from exporter.sources.journal import JournalPlace

logger = logging.getLogger(__name__)

COMM = "systemd-journal"  # systemd-journald, as the kernel cuts a command's name (15 characters)
# Where a process waits in the kernel to write into a unix stream socket that is full: a unit's stdout and stderr,
# under StandardOutput=journal, are such a stream to journald.
SENDING = ("sock_alloc_send_pskb", "unix_stream_sendmsg", "sock_wait_for_wmem")
WRITER_WAITS = 3.0  # seconds a unit's process waits to write to its stream before journald counts as not reading
DISK_WAITS = 10.0  # seconds journald may stay in uninterruptible sleep (its disk) before it counts as hung
RESCAN = 30.0  # seconds between looks through /proc for journald's process while none is known


class JournaldWatch:
    """Watches the journald that writes `place`: its process's state, and the units' processes waiting on it."""

    def __init__(self, place: JournalPlace, proc: Path = Path("/proc"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.place = place
        self._proc = proc
        self._clock = clock
        self._pid: int | None = None
        self._looked_at = float("-inf")
        self._waiting: dict[int, float] = {}  # a unit's pid → since when it waits to write to its stream
        self._in_kernel: float | None = None  # since when journald is in uninterruptible sleep

    def check(self, writers: Mapping[str, Iterable[int]]) -> str:
        """Why journald does not write the journal now, "" when it does or that cannot be seen: its process
        stopped, gone or stuck in the kernel, or one of `writers` (a unit's processes, each unit's) waiting to
        write to its stream for longer than journald takes to read it."""
        if self.place.directory is not None:  # journal files, no journald of ours
            return ""
        return self._process() or self._writers(writers)

    def _process(self) -> str:
        now = self._clock()
        stat = self._stat(self._pid) if self._pid is not None else None
        if stat is None and now - self._looked_at >= RESCAN:
            self._looked_at = now
            self._pid = self._find()
            stat = self._stat(self._pid) if self._pid is not None else None
        if stat is None:
            self._pid = None
            if self.place.namespace is None and self._read("1/comm") == "systemd":
                return "journald is not running: no systemd-journald process"
            return ""  # a namespace's journald runs only while a unit logs to it; or journald is not ours to see
        state, pid = stat, self._pid
        if state in "Tt":
            return f"journald (pid {pid}) is stopped: nothing it is sent reaches the journal"
        if state == "D":
            self._in_kernel = now if self._in_kernel is None else self._in_kernel
            if now - self._in_kernel >= DISK_WAITS:
                wait = self._read(f"{pid}/wchan")
                return f"journald (pid {pid}) has waited {now - self._in_kernel:.0f} s in the kernel ({wait or 'state D'})"
        else:
            self._in_kernel = None
        return ""

    def _writers(self, writers: Mapping[str, Iterable[int]]) -> str:
        now = self._clock()
        waiting: dict[int, float] = {}
        said = ""
        for unit, pids in sorted(writers.items()):
            for pid in sorted(pids):
                if not self._sending(pid):
                    continue
                waiting[pid] = since = self._waiting.get(pid, now)
                if not said and now - since >= WRITER_WAITS:
                    said = (f"journald does not read what units write: {unit}'s process {pid} has waited "
                            f"{now - since:.0f} s to write its output to it")
        self._waiting = waiting
        return said

    def _sending(self, pid: int) -> bool:
        """The process waits to write into a full unix stream, and its stdout or stderr is a socket."""
        if not self._read(f"{pid}/wchan").startswith(SENDING):
            return False
        for fd in (1, 2):
            try:
                if os.readlink(self._proc / str(pid) / "fd" / str(fd)).startswith("socket:"):
                    return True
            except OSError:
                continue
        return False

    def _find(self) -> int | None:
        """journald's pid: the one instance for the system journal, the namespace's own for a namespace."""
        try:
            entries = [e.name for e in os.scandir(self._proc) if e.name.isdigit()]
        except OSError:
            return None
        for name in entries:
            if self._read(f"{name}/comm") != COMM:
                continue
            try:
                argv = (self._proc / name / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            args = [a.decode(errors="replace") for a in argv[1:] if a]
            if args == ([self.place.namespace] if self.place.namespace else []):
                return int(name)
        return None

    def _stat(self, pid: int | None) -> str | None:
        """The state letter of journald's process, None when it is gone (or the pid is another's now)."""
        try:
            text = (self._proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        comm, _, rest = text.partition(" (")[2].rpartition(") ")
        return rest[:1] if comm == COMM and rest[:1] not in ("Z", "X", "") else None

    def _read(self, name: str) -> str:
        try:
            return (self._proc / name).read_text().strip()
        except OSError:
            return ""
