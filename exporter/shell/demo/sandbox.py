"""Run commands as systemd-like units in a private journald namespace, for the demo and the tests.

On a host without systemd as PID 1 (a container, CI), root can still produce journal entries that
look exactly like a systemd service's: `systemd-journald NAMESPACE` runs a private journald
instance, and a process whose cgroup v2 path is `system.slice/NAME.service` and whose stdout and
stderr are a stream connected to that instance's `stdout` socket is recorded with
`_SYSTEMD_UNIT=NAME.service`. journald reads `_SYSTEMD_INVOCATION_ID` from the symlink
`/run/systemd/units/invocation:NAME.service`, which this module writes afresh for every start,
as systemd does.

    with Journald("llmstartup-demo") as journald:
        with start_unit(journald, "vllm.service", [sys.executable, "-m", "exporter.shell.demo.vllm_startup",
                                                   "--scenario", "demo"]) as unit:
            ...  # journal.Reader(namespace="llmstartup-demo") sees the unit's lines

Everything here needs root, `systemd-journald` and a cgroup2 mount; `preflight()` says which is
missing. Nothing survives `stop()`: the processes, the unit cgroups, the journal files and the
runtime directory of the namespace are removed.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.sources.processes import find_cgroup2_root

JOURNALD_BINARIES = ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald")
RUN_SYSTEMD = Path("/run/systemd")
UNITS_DIR = RUN_SYSTEMD / "units"
JOURNAL_DIRS = (Path("/var/log/journal"), Path("/run/log/journal"))
SLICE = "system.slice"

# journald's log_namespace_name_valid(): a file name that is also a valid unit instance name.
NAMESPACE = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,199}")
UNIT_NAME = re.compile(r"[A-Za-z0-9_.:@\\-]{1,249}\.service")

# What systemd's connect_logger_as() sends for StandardOutput=journal in the system manager:
# identifier, unit id, priority, level prefix, forward to syslog, kmsg, console. systemd passes the
# unit id (EXEC_PASS_LOG_UNIT), which journald uses only when it can no longer read the writer's
# cgroup, e.g. for the last lines of a process that has already exited; the level prefix is
# systemd's default SyslogLevelPrefix=yes.
STREAM_HEADER = "{identifier}\n{unit}\n6\n1\n0\n0\n0\n"
SNDBUF = 8 * 1024 * 1024  # systemd's SNDBUF_SIZE for service streams

STARTUP_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
POLL = 0.02


# --- environment -------------------------------------------------------------------------------


def journald_binary() -> str:
    """Path of systemd-journald; RuntimeError when it is not installed."""
    for candidate in JOURNALD_BINARIES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        "systemd-journald is not installed (looked for " + ", ".join(JOURNALD_BINARIES) + "); "
        "install the 'systemd' package to run units in a private journald namespace"
    )


def cgroup2_root() -> Path:
    """Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    root = find_cgroup2_root()
    if root is None:
        raise RuntimeError(
            "no cgroup v2 hierarchy is mounted (no 'cgroup2' filesystem in /proc/self/mountinfo); "
            "units need one so that journald can tell which unit a process belongs to"
        )
    return root


def preflight() -> str:
    """Check root, systemd-journald and cgroup2; return journald's path or raise RuntimeError."""
    if os.geteuid() != 0:
        raise RuntimeError(
            "the sandbox must run as root: it starts systemd-journald and moves processes between cgroups"
        )
    binary = journald_binary()
    cgroup2_root()
    return binary


def machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip()
    except OSError as err:
        raise RuntimeError(
            f"cannot read /etc/machine-id ({err.strerror}); journald needs a machine id"
        ) from err


def _listening(path: Path) -> bool:
    """Whether a unix socket bound at `path` is listening, read from /proc/net/unix (no connection made)."""
    wanted = os.fsdecode(path)
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                fields = line.split(None, 7)
                # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000 is __SO_ACCEPTCON.
                if len(fields) == 8 and fields[7].rstrip("\n") == wanted and int(fields[3], 16) & 0x10000:
                    return True
    except OSError:
        return False
    return False


def _runtime_dir(namespace: str) -> Path:
    return RUN_SYSTEMD / f"journal.{namespace}"


def namespace_running(namespace: str) -> bool:
    """Whether a journald instance of this namespace is running (its stdout socket listens)."""
    return _listening(_runtime_dir(namespace) / "stdout")


def unit_running(name: str) -> bool:
    """Whether a unit of this name has processes (in its cgroup under system.slice)."""
    return bool(_pids(cgroup2_root() / SLICE / _unit_name(name)))


def _pids(cgroup: Path) -> set[int]:
    """Every process in the cgroup and its descendants; none when the cgroup is gone."""
    pids: set[int] = set()
    for directory, _, _ in os.walk(cgroup):
        try:
            with open(os.path.join(directory, "cgroup.procs")) as f:
                pids.update(int(line) for line in f if line.strip())
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENODEV):
                raise
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


# --- journald ----------------------------------------------------------------------------------


def end(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout`; reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Journald:
    """A private journald namespace instance, run as our child; read it with Reader(namespace=…)."""

    def __init__(self, namespace: str) -> None:
        if not NAMESPACE.fullmatch(namespace):
            raise ValueError(f"invalid journal namespace name {namespace!r}")
        self.namespace = namespace
        self.runtime_dir = _runtime_dir(namespace)
        self.stdout_socket = self.runtime_dir / "stdout"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._keepalive: socket.socket | None = None
        self._units: dict[str, Unit] = {}
        self._invocations: dict[str, str] = {}  # unit name → the invocation id we last wrote

    def __repr__(self) -> str:
        return f"Journald({self.namespace!r}, running={self.running})"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def journal_dirs(self) -> tuple[Path, ...]:
        """Where this namespace's journal files go: /var/log/journal when it exists, else /run/log/journal."""
        mid = machine_id()
        return tuple(base / f"{mid}.{self.namespace}" for base in JOURNAL_DIRS)

    def start(self) -> Journald:
        if self.process is not None:
            raise RuntimeError(f"journald namespace {self.namespace} was already started by this object")
        binary = preflight()
        if _listening(self.stdout_socket):
            raise RuntimeError(
                f"journald namespace {self.namespace} is already running "
                f"({self.stdout_socket} is listening); stop that instance or choose another namespace"
            )
        # The namespace is not running: whatever it left behind is stale, and a stale journal
        # would show a previous run's lines to our readers.
        self._remove_files()
        atexit.register(self.stop)
        self._launch(binary)
        return self

    def restart(self, timeout: float = STOP_TIMEOUT) -> None:
        """Restart journald alone, keeping its files, as `systemctl restart systemd-journald@NS` would.

        The units' stdout streams end with the old instance (systemd-journald.service(8)): what they
        print afterwards is lost until they are started again.
        """
        process = self.process
        if process is None:
            raise RuntimeError(f"journald namespace {self.namespace} is not running")
        process.terminate()
        process.wait(timeout)
        self._launch(preflight())

    def _launch(self, binary: str) -> None:
        self._close_keepalive()
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [binary, self.namespace],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not killed with our terminal's process group; stop() ends it
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _listening(self.stdout_socket):
            if self.process.poll() is not None:
                status, output = self.process.returncode, self._output()
                self.stop()
                raise RuntimeError(
                    f"{binary} {self.namespace} exited with status {status} before listening on "
                    f"{self.stdout_socket}: {output or '(no output)'}"
                )
            if time.monotonic() > deadline:
                output = self._output()
                self.stop()
                raise RuntimeError(
                    f"{binary} {self.namespace} did not listen on {self.stdout_socket} within "
                    f"{STARTUP_TIMEOUT:.0f} s: {output or '(no output)'}"
                )
            time.sleep(POLL)
        # A namespace journald exits after 30 s without a stream (systemd-journald@.service is
        # socket-activated); a stream that never writes keeps it up for as long as we want it.
        self._keepalive = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._keepalive.connect(str(self.stdout_socket))
        self._keepalive.sendall(b"llmstartup-keepalive\n\n6\n0\n0\n0\n0\n")

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop our units, then journald; remove its runtime directory, journal files and our symlinks."""
        for unit in list(self._units.values()):
            unit.stop()
        self._close_keepalive()
        process, self.process = self.process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        end(process, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        for name, invocation in self._invocations.items():
            link = UNITS_DIR / f"invocation:{name}"
            try:
                if os.readlink(link) == invocation:
                    link.unlink()
            except OSError:
                pass
        self._invocations.clear()
        self._remove_files()

    def _close_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.close()
            self._keepalive = None

    def reader(self, **matches: str) -> Any:
        """A fresh systemd.journal.Reader over this namespace, with optional field matches."""
        from systemd import journal

        reader = journal.Reader(namespace=self.namespace)
        if matches:
            reader.add_match(**matches)
        return reader

    def __enter__(self) -> Journald:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace").strip()[-2000:]

    def _remove_files(self) -> None:
        _remove(self.runtime_dir)
        for directory in self.journal_dirs:
            _remove(directory)


# --- units -------------------------------------------------------------------------------------


@dataclass(eq=False)
class Unit:
    """One start of a unit: its main process, its cgroup and the invocation id journald records."""

    name: str
    invocation: str
    process: subprocess.Popen[bytes]
    cgroup: Path
    journald: Journald = field(repr=False)
    started: float  # time.monotonic() just before the fork: the journal's __MONOTONIC_TIMESTAMP clock

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> set[int]:
        """Every process now in the unit's cgroup (and any cgroup below it)."""
        return _pids(self.cgroup)

    @property
    def running(self) -> bool:
        return self.process.poll() is None or bool(self.pids())

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the main process to exit; its exit status (negative: killed by that signal)."""
        return self.process.wait(timeout)

    def records(self) -> list[dict[str, Any]]:
        """This invocation's journal entries so far, oldest first."""
        reader = self.journald.reader(_SYSTEMD_UNIT=self.name, _SYSTEMD_INVOCATION_ID=self.invocation)
        try:
            return list(reader)
        finally:
            reader.close()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM every process of the unit, SIGKILL after `timeout`; remove the cgroup.

        Returns the main process's exit status.
        """
        if self.cgroup.exists():
            for pid in self.pids():
                _signal(pid, signal.SIGTERM)
            if not self._wait_empty(timeout):
                self._kill()
                if not self._wait_empty(STOP_TIMEOUT):
                    raise RuntimeError(
                        f"{self.name}: processes {sorted(self.pids())} survived SIGKILL in {self.cgroup}"
                    )
            self._remove_cgroup()
        elif self.process.poll() is None:  # the cgroup was removed under us; still end our child
            self.process.kill()
        status = self.process.wait()
        self.journald._units.pop(self.name, None)
        return status

    def __enter__(self) -> Unit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            # Reap the main process so it cannot linger as our zombie.
            if self.process.poll() is not None and not self.pids():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL)

    def _kill(self) -> None:
        kill_file = self.cgroup / "cgroup.kill"  # Linux ≥ 5.14: kills the whole subtree, forks included
        try:
            kill_file.write_text("1")
        except OSError:
            pass
        for pid in self.pids():
            _signal(pid, signal.SIGKILL)

    def _remove_cgroup(self) -> None:
        # cgroupfs directories can only be rmdir'ed (their files cannot be deleted), deepest first;
        # right after the last process exits the kernel may still answer EBUSY for a moment.
        directories = [Path(d) for d, _, _ in os.walk(self.cgroup)]
        deadline = time.monotonic() + STOP_TIMEOUT
        for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise RuntimeError(f"cannot remove cgroup {directory}: {err.strerror}") from err
                    time.sleep(POLL)


def _unit_name(name: str) -> str:
    if not name.endswith(".service"):
        name += ".service"
    if not UNIT_NAME.fullmatch(name):
        raise ValueError(f"invalid unit name {name!r}")
    return name


def _write_invocation(name: str, invocation: str) -> None:
    """Point /run/systemd/units/invocation:NAME at the id, atomically, as systemd does at each start."""
    UNITS_DIR.mkdir(parents=True, exist_ok=True)
    link = UNITS_DIR / f"invocation:{name}"
    temporary = UNITS_DIR / f".#invocation:{name}.{os.getpid()}"
    temporary.unlink(missing_ok=True)
    os.symlink(invocation, temporary)
    os.replace(temporary, link)


def _enter_unit(procs: bytes, stdout_socket: bytes, header: bytes) -> None:
    """In the forked child, before exec: join the unit's cgroup, then put stdout+stderr on the journal.

    The order matters: journald takes the stream's peer credentials at connect time and reads that
    pid's cgroup to name the unit.
    """
    fd = os.open(procs, os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stream.connect(stdout_socket)
        stream.shutdown(socket.SHUT_RD)
        try:
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        except OSError:
            pass
        stream.sendall(header)
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
    finally:
        stream.close()


def start_unit(
    journald: Journald,
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    identifier: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Unit:
    """Start `argv` as unit `name` (".service" appended if missing), logging to `journald`.

    The child inherits our environment updated with `env`, plus PYTHONUNBUFFERED=1 and
    INVOCATION_ID (as systemd sets it); stdin is /dev/null. `identifier` is SYSLOG_IDENTIFIER
    (default: argv[0]'s base name, as systemd does).
    """
    if not journald.running:
        raise RuntimeError(f"journald namespace {journald.namespace} is not running; start it first")
    if not argv:
        raise ValueError("argv is empty")
    name = _unit_name(name)
    cgroup = cgroup2_root() / SLICE / name
    if cgroup.exists() and _pids(cgroup):
        raise RuntimeError(
            f"unit {name} is already running: its cgroup {cgroup} holds {sorted(_pids(cgroup))}"
        )
    cgroup.mkdir(parents=True, exist_ok=True)

    invocation = uuid.uuid4().hex  # sd_id128_randomize(): a v4 UUID, as 32 hex digits
    _write_invocation(name, invocation)
    journald._invocations[name] = invocation

    environment = dict(os.environ)
    environment.update(env or {})
    environment["PYTHONUNBUFFERED"] = "1"
    environment["INVOCATION_ID"] = invocation
    header = STREAM_HEADER.format(identifier=identifier or os.path.basename(argv[0]), unit=name).encode()
    procs, stdout_socket = os.fsencode(cgroup / "cgroup.procs"), os.fsencode(journald.stdout_socket)

    started = time.monotonic()
    try:
        process = subprocess.Popen(
            list(argv),
            env=environment,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: _enter_unit(procs, stdout_socket, header),
        )
    except (OSError, subprocess.SubprocessError) as err:
        try:
            cgroup.rmdir()
        except OSError:
            pass
        raise RuntimeError(
            f"could not start {name} ({argv[0]}): {err}; the child must be able to join {cgroup} "
            f"and connect to {journald.stdout_socket}"
        ) from err
    unit = Unit(name, invocation, process, cgroup, journald, started)
    journald._units[name] = unit
    return unit
