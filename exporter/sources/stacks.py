"""Stack source: where the processes of silent units are, from py-spy (Python stacks) and /proc (kernel waits).

`py-spy dump --nonblocking --json` reads a process's memory without stopping it; that needs root or
CAP_SYS_PTRACE. The kernel's view (each thread's state, wait channel and CPU time) is in /proc. Looks
run on a thread of their own, so that a slow dump never delays a sample.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from exporter.core.model import Frame, ProcessStack, StackSample, ThreadStack
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

DUMP_TIMEOUT = 5.0  # seconds one dump may take; a process with hundreds of threads takes well under one
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CAP_SYS_PTRACE = 19
# The executable of a Python process: python, python3, python3.11, … (native engines are not dumped)
PYTHON = re.compile(r"python\d*(\.\d+)?")


class DumpFailed(Exception):
    """py-spy could not dump a process; `gone` when the process ended meanwhile, which is nobody's fault."""

    def __init__(self, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


def find_py_spy() -> str | None:
    """The py-spy installed with this package (the scripts folder of its environment), else on PATH."""
    import sysconfig  # here: an agent without --collector.stacks never looks

    beside = Path(sysconfig.get_path("scripts")) / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def may_ptrace(status: str | None = None) -> bool:
    """Whether this process may read other users' processes: root, or CAP_SYS_PTRACE in effect."""
    if status is None:
        if os.geteuid() == 0:
            return True
        status = Path("/proc/self/status").read_text()
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> CAP_SYS_PTRACE & 1)


def dump(py_spy: str, pid: int, timeout: float = DUMP_TIMEOUT) -> tuple[ThreadStack, ...]:
    """The Python threads of `pid` with their frames, innermost first, without stopping it."""
    started = _start_time(pid)
    try:
        done = subprocess.run(
            [py_spy, "dump", "--nonblocking", "--json", "--pid", str(pid)],
            capture_output=True, timeout=timeout, env={**os.environ, "RUST_BACKTRACE": "0"}, check=False,
        )
    except subprocess.TimeoutExpired:  # run() killed py-spy; --nonblocking never stopped the target
        raise DumpFailed(f"py-spy dump of pid {pid} timed out after {timeout:g}s") from None
    if done.returncode != 0:
        if started is None or _start_time(pid) != started:
            raise DumpFailed(f"pid {pid} exited", gone=True)
        said = done.stderr.decode(errors="replace").strip().splitlines()
        first = said[0].removeprefix("Error: ") if said else f"exit status {done.returncode}"
        if "Permission Denied" in first or "Operation not permitted" in first:
            first = "permission denied (needs root or CAP_SYS_PTRACE)"
        raise DumpFailed(f"py-spy cannot dump pid {pid}: {first}")
    try:
        threads = json.loads(done.stdout)
        return tuple(
            ThreadStack(int(t["os_thread_id"] or 0), tuple(
                Frame(str(f["name"]), str(f["short_filename"] or f["filename"]), int(f["line"])) for f in t["frames"]
            ))
            for t in threads
        )
    except (ValueError, KeyError, TypeError) as error:
        raise DumpFailed(f"py-spy's dump of pid {pid} is not what it prints: {error}") from None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (its identity with the pid); None when it is gone or has
    exited and waits to be reaped (a zombie: nothing left to dump)."""
    stat = _stat(f"/proc/{pid}/stat")
    return int(stat[19]) if stat and stat[0] not in ("Z", "X") else None


def _stat(path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command name: [0] is the state (field 3 of proc(5))."""
    try:
        with open(path, "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _wchan(path: str) -> str:
    try:
        with open(path) as f:
            wchan = f.read().strip()
    except OSError:
        return ""
    return "" if wchan == "0" else wchan  # 0: running, or the kernel will not tell us


@dataclass(frozen=True, slots=True)
class KernelView:
    """What /proc says of one process, without ptrace."""

    started: int  # start time in clock ticks: with the pid, the process's identity
    state: str  # of its most telling thread: one in D if there is one (it waits for storage), else the main one
    wchan: str  # where that thread waits in the kernel
    cpu_seconds: float
    threads: Mapping[int, float]  # CPU seconds of each thread by its id
    ran: Mapping[int, int] | None  # how many times each thread has been on a CPU (schedstat); None: unknown


def kernel_view(pid: int) -> KernelView | None:
    """The process's state, wait channel and CPU time, per thread too; None when it is gone."""
    stat = _stat(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        tids = []
    threads: dict[int, float] = {}
    ran: dict[int, int] | None = {}
    telling = pid
    for tid in tids:
        task = _stat(f"/proc/{pid}/task/{tid}/stat")
        if task is None:
            continue
        threads[tid] = (int(task[11]) + int(task[12])) / CLOCK_TICKS
        if task[0] == "D" and telling == pid and stat[0] != "D":
            telling = tid
        if ran is not None:
            ran = _timeslices(f"/proc/{pid}/task/{tid}/schedstat", ran, tid)
    state = "D" if telling != pid else stat[0]
    cpu = (int(stat[11]) + int(stat[12])) / CLOCK_TICKS
    return KernelView(int(stat[19]), state, _wchan(f"/proc/{pid}/task/{telling}/wchan"), cpu, threads, ran)


def _timeslices(path: str, ran: dict[int, int], tid: int) -> dict[int, int] | None:
    """`ran` with the thread's count of times on a CPU (the third field of schedstat); None when unreadable."""
    try:
        with open(path, "rb") as f:
            ran[tid] = int(f.read().split()[2])
    except (OSError, IndexError, ValueError):
        return None
    return ran


def is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter; PermissionError where /proc/<pid>/exe is hidden."""
    try:
        return bool(PYTHON.fullmatch(os.path.basename(os.readlink(f"/proc/{pid}/exe"))))
    except FileNotFoundError:
        return False


@dataclass(slots=True)  # the source's own record of one process, not a value handed out
class _Seen:
    started: int
    python: bool | None  # None until asked (only when stacks are on)
    kernel: KernelView
    dumped: tuple[ThreadStack, ...] | None = None  # its last dump


def _still(before: KernelView, now: KernelView) -> bool:
    """No thread of the process has been on a CPU since `before`: no code ran, so its stacks are the same."""
    return before.ran is not None and before.ran == now.ran


class StackSource:
    """Looks at the processes of the units the agent says are silent, each unit at most every `every`
    seconds: the kernel's view always, the Python stacks too when `python` (--collector.stacks)."""

    def __init__(
        self, interval: float, every: float, python: bool, timeout: float = DUMP_TIMEOUT,
        py_spy: str | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval, self.every, self.timeout = interval, every, timeout
        self.status = SourceStatus("stacks", logger)
        self._clock = clock
        self._targets: dict[str, frozenset[int]] = {}
        self._looked: dict[str, float] = {}  # unit → when it was last looked at
        self._seen: dict[int, _Seen] = {}  # pid → what the last look saw
        self._pending: list[StackSample] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.py_spy: str | None = None
        if python:
            found = py_spy or find_py_spy()
            if found is None:
                self.status.down("py-spy is not installed (pip install py-spy): Python stacks are off")
            elif not may_ptrace():
                self.status.down("--collector.stacks needs root or CAP_SYS_PTRACE (py-spy reads the processes' "
                                 "memory): Python stacks are off")
            else:
                self.py_spy = found
                self.status.ok(found)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=self.timeout + 1)

    def watch(self, targets: Mapping[str, frozenset[int]]) -> None:
        """The silent units now, with their processes; a unit new to the list is looked at at once."""
        targets = dict(targets)
        fresh = targets.keys() - self._targets.keys()
        self._targets = targets
        if fresh:
            self._wake.set()

    def drain(self) -> list[StackSample]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def look_once(self) -> None:
        """One round: every silent unit due for a look is looked at."""
        targets = self._targets
        for unit in self._looked.keys() - targets.keys():  # it spoke: its next silence is looked at at once
            del self._looked[unit]
        watched = frozenset().union(*targets.values())
        self._seen = {pid: seen for pid, seen in self._seen.items() if pid in watched}
        failures: list[str] = []
        dumped = False
        for unit, pids in sorted(targets.items()):
            if self._clock() - self._looked.get(unit, float("-inf")) < self.every:
                continue
            looks = []
            for pid in sorted(pids):
                look, failure = self._look(pid)
                if look is not None:
                    looks.append(look)
                    dumped |= look[0].threads is not None
                if failure:
                    failures.append(failure)
            t = self._clock()
            self._looked[unit] = t
            looks.sort(key=lambda look: -look[1])  # the busiest first
            with self._lock:
                self._pending.append(StackSample(t, unit, tuple(process for process, _ in looks)))
        if self.py_spy is None:
            return
        if failures:
            self.status.down(failures[0])
        elif dumped or not self.status.failing:  # an idle round proves nothing to a failing source
            self.status.ok()

    def _look(self, pid: int) -> tuple[tuple[ProcessStack, float] | None, str]:
        """One process: (what was seen and the CPU it used since the last look, or None when it is gone;
        why its stacks could not be read)."""
        kernel = kernel_view(pid)
        if kernel is None:
            return None, ""
        seen = self._seen.get(pid)
        if seen is None or seen.started != kernel.started:
            seen = _Seen(kernel.started, None, KernelView(kernel.started, "", "", 0.0, {}, None))
        before, seen.kernel = seen.kernel, kernel
        self._seen[pid] = seen
        threads, failure = None, ""
        if self.py_spy is not None:
            try:
                if seen.python is None:
                    seen.python = is_python(pid)
                if seen.python and seen.dumped is not None and _still(before, kernel):
                    threads = seen.dumped  # the dump a process that has not run since would give again
                elif seen.python:
                    threads = dump(self.py_spy, pid, self.timeout)
            except PermissionError:
                failure = f"cannot read /proc/{pid}/exe: permission denied (needs root or CAP_SYS_PTRACE)"
            except DumpFailed as error:
                failure = "" if error.gone else str(error)
            seen.dumped = threads
        if threads is not None:
            busy = {tid: cpu - before.threads.get(tid, 0.0) for tid, cpu in kernel.threads.items()}
            # the busiest thread first; between equals, the main thread
            threads = tuple(sorted(threads, key=lambda t: (-busy.get(t.thread, 0.0), t.thread != pid)))
        process = ProcessStack(pid, kernel.state, kernel.wchan, kernel.cpu_seconds, threads)
        return (process, kernel.cpu_seconds - before.cpu_seconds), failure

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.look_once()
            except Exception:  # the one broad catch of this thread: a bug here must not end the looks
                logger.exception("stack round failed")
            self._wake.wait(self.interval)
