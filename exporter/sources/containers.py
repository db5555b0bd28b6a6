"""Containers as units, from the files their runtimes keep: who they are, and their output as it is written.

Kubernetes pods (containerd, CRI-O): kubelet links each container's current log file under
/var/log/containers/POD_NAMESPACE_CONTAINER-ID.log, to /var/log/pods/NAMESPACE_POD_UID/CONTAINER/RESTART.log,
written in the CRI format. Docker: /var/lib/docker/containers/ID/ holds the container's state
(config.v2.json: name, running, when it started and ended, how) and, with the json-file driver, its output.
With the journald driver, the output is in the journal (exporter.core.entries.container_name).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.core.config import DOCKER, PODS
from exporter.core.containers import START_SLACK, Container, PodLog, docker_run, kubelet_link, pod_log
from exporter.core.entries import log_lines
from exporter.core.formats.clock import rfc3339
from exporter.core.formats.containers import Record, cri_record, docker_json_record, joined
from exporter.core.model import Event, Lifecycle, Observation
from exporter.sources.log_files import FollowedFile
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)


class _Lines:
    """Records of one log file's lines, the parts of a line joined, per stream."""

    def __init__(self, parse: Callable[[bytes], Record | None]) -> None:
        self.parse = parse
        self.pending: dict[str, Record] = {}  # per stream: the parts of a line read so far, joined

    def whole(self, lines: list[bytes], last: bool = False) -> list[Record]:
        """The whole lines these records make; `last`: the file ends here, and so do lines it left unended."""
        out = []
        for line in lines:
            record = self.parse(line)
            if record is None:
                continue  # not a record of this format: damaged, or cut by a crash of the writer
            if not record.partial and record.stream not in self.pending:  # a whole line: nearly every one
                out.append(record)
                continue
            before = self.pending.pop(record.stream, None)
            waiting, text = joined(before.text if before else b"", record)
            if text is not None:
                out.append(Record(record.t, record.stream, text, False))
            else:
                self.pending[record.stream] = Record(record.t, record.stream, waiting, True)
        if last:
            out += [Record(r.t, r.stream, r.text, False) for r in self.pending.values()]
            self.pending = {}
        return out


# --- Kubernetes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PodContainer:
    container: Container
    log: PodLog  # the log of its current start (kubelet links the newest)
    linked: float  # when kubelet made the link: the newest start of a pod recreated under the same name wins


def _pod_containers(links: Path) -> dict[str, _PodContainer]:
    """Every container kubelet links a log of, by unit: the newest start of each."""
    found: dict[str, _PodContainer] = {}
    try:
        entries = list(os.scandir(links))
    except FileNotFoundError:
        return {}
    for entry in entries:
        named = kubelet_link(entry.name)
        if named is None:
            continue
        try:
            log = pod_log(os.readlink(entry.path))
            linked = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        namespace, pod, name, container_id = named
        if log is None or (log.namespace, log.pod, log.container) != (namespace, pod, name):
            continue
        unit = log.unit
        known = found.get(unit)
        if known is None or (known.log.uid == log.uid and log.restart > known.log.restart) or (
            known.log.uid != log.uid and linked > known.linked
        ):
            found[unit] = _PodContainer(Container(unit, container_id, namespace, pod, name), log, linked)
    return found


class _PodFollower:
    """A pod container's log files: its earlier starts' once, then the current start's as it grows."""

    def __init__(self, pods: Path, log: PodLog) -> None:
        self.pods = pods
        self.log = log
        self.directory = pods / log.directory
        self.records = _Lines(cri_record)
        self._file: FollowedFile | None = None

    def read(self) -> list[tuple[Record, str]]:
        """(record, the start it belongs to) of every line written since the last call."""
        out: list[tuple[Record, str]] = []
        restarts = self._restarts()
        if self._file is None:  # first read: the earlier starts' files, whole
            for restart in [r for r in restarts if r < self.log.restart]:
                out += self._finished(restart)
            self._file = FollowedFile(self.directory / f"{self.log.restart}.log")
        out += self._tagged(self._file.read(), self.log)
        newer = [r for r in restarts if r > self.log.restart]
        if newer:  # the container was started again: a new file, a new start
            out += self._tagged(self._file.close(), self.log, last=True)
            for restart in newer[:-1]:
                out += self._finished(restart)
            self.log = PodLog(self.log.namespace, self.log.pod, self.log.uid, self.log.container, newer[-1])
            self._file = FollowedFile(self.directory / f"{self.log.restart}.log")
            out += self._tagged(self._file.read(), self.log)
        return out

    def close(self) -> list[tuple[Record, str]]:
        return self._tagged(self._file.close(), self.log, last=True) if self._file else []

    def _restarts(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted({int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit() and ".log" in n})

    def _finished(self, restart: int) -> list[tuple[Record, str]]:
        log = PodLog(self.log.namespace, self.log.pod, self.log.uid, self.log.container, restart)
        return self._tagged(FollowedFile(self.directory / f"{restart}.log").close(), log, last=True)

    def _tagged(self, lines: list[bytes], log: PodLog, last: bool = False) -> list[tuple[Record, str]]:
        return [(record, log.invocation) for record in self.records.whole(lines, last)]


# --- Docker --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DockerState:
    """What config.v2.json says of a container's run (Docker's container.State)."""

    name: str
    running: bool
    started: float | None
    finished: float | None  # the last run's end; None while it never ended
    exit_code: int
    oom_killed: bool
    started_text: str  # the start as Docker wrote it: the id of the run


def _docker_state(config: dict) -> _DockerState | None:  # type: ignore[type-arg]
    state = config.get("State")
    name = config.get("Name")
    if not isinstance(state, dict) or not isinstance(name, str):
        return None
    started_text = str(state.get("StartedAt") or "")
    return _DockerState(
        name=name.lstrip("/"),
        # Docker counts a container waiting to be restarted as running (Restarting too): its run has ended
        running=bool(state.get("Running")) and not state.get("Restarting"),
        started=rfc3339(started_text),
        finished=rfc3339(str(state.get("FinishedAt") or "")),  # the zero time "0001-01-01…" is none
        exit_code=int(state.get("ExitCode") or 0),
        oom_killed=bool(state.get("OOMKilled")),
        started_text=started_text,
    )


def _exit_detail(code: int) -> str:
    """Docker's exit code in PID 1's words (code/status/name): 128+N is death by signal N."""
    if code > 128:
        return f"killed/{code - 128}/SIG{code - 128}"
    return f"exited/{code}/{'SUCCESS' if code == 0 else 'FAILURE'}"


@dataclass
class _DockerContainer:
    """One Docker container's directory: its state as last read, and the runs of it followed so far."""

    container: Container
    directory: Path
    log_driver: str
    state: _DockerState
    changed: float  # config.v2.json's mtime when it was read
    accounted: _DockerState | None = None  # the state its runs and ends were last told from
    runs: tuple[tuple[float, str], ...] = ()  # (from when, run), wall clock: containers.docker_run
    file: FollowedFile | None = None
    records: _Lines = field(default_factory=lambda: _Lines(docker_json_record))

    def reread(self) -> None:
        """Read the state again if Docker rewrote it (it does at each start and end of a run)."""
        try:
            changed = os.stat(self.directory / "config.v2.json").st_mtime
        except OSError:
            return
        if changed != self.changed and (read := _read_docker(self.directory)) is not None:
            self.state, self.log_driver, self.changed = read
            self.container = Container(self.state.name, self.container.id, name=self.state.name)

    def news(self, offset: float) -> list[Observation]:
        """A run begun or ended since the state was last told from: its bounds, and Docker's word on the end
        (exit code, OOM kill) in PID 1's terms. `offset`: wall − monotonic."""
        state, before = self.state, self.accounted
        self.accounted = state
        if before is None or state.started_text != before.started_text:  # first look, or started again
            # An end that came and went between two looks left no exit code (a new run resets it): the
            # new run's first line ends the old start, and its processes' going says it failed.
            self._began(state)
            return self._ended(state, offset) if not state.running else []
        return self._ended(state, offset) if before.running and not state.running else []

    def _began(self, state: _DockerState) -> None:
        if state.started is None:
            return
        # From the previous run's end when Docker says when that was, else from a moment before the start.
        ended = state.finished if state.running else None
        since = ended if ended is not None and ended < state.started else state.started - START_SLACK
        self.runs = (*self.runs, (since, state.started_text))

    def _ended(self, state: _DockerState, offset: float) -> list[Observation]:
        if state.finished is None:
            return []
        t, unit = state.finished - offset, self.container.unit
        out: list[Observation] = []
        if state.oom_killed:
            out.append(Lifecycle(t, unit, Event.OOM_KILLED, "", state.started_text))
        out.append(Lifecycle(t, unit, Event.EXITED, _exit_detail(state.exit_code), state.started_text))
        return out


def _read_docker(directory: Path) -> tuple[_DockerState, str, float] | None:
    """(state, log driver, config.v2.json's mtime) of one container directory; None when unreadable."""
    try:
        changed = os.stat(directory / "config.v2.json").st_mtime
        config = json.loads((directory / "config.v2.json").read_bytes())
    except (OSError, ValueError):
        return None
    try:
        host = json.loads((directory / "hostconfig.json").read_bytes())
        driver = str(host.get("LogConfig", {}).get("Type") or "json-file")
    except (OSError, ValueError, AttributeError):
        driver = "json-file"  # Docker's default
    state = _docker_state(config) if isinstance(config, dict) else None
    return (state, driver, changed) if state else None


# --- the source ----------------------------------------------------------------------------------


class ContainerSource:
    """The containers on this host (kubelet's pods, Docker's containers) and their output, as observations.

    `containers()` is cheap (a directory listing each, and a stat per Docker container): call it every round,
    then `drain()`, which says whether the round's reading worked.
    """

    def __init__(
        self,
        pods: Path | None = PODS,
        docker: Path | None = DOCKER,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pods, self.docker = pods, docker
        # kubelet keeps its links beside the pods' logs: /var/log/containers
        self.links = pods.parent / "containers" if pods else None
        self._wall, self._clock = wall, clock
        self.status = SourceStatus("containers", logger, wall)
        self._pod: dict[str, _PodContainer] = {}
        self._docker: dict[str, _DockerContainer] = {}  # by id
        self._followed_pods: dict[str, _PodFollower] = {}
        self._followed_docker: set[str] = set()  # units
        self._pending: list[Observation] = []  # the last lines of a pod's container whose pod was made anew
        self._trouble: list[str] = []  # what could not be read this round

    def containers(self) -> dict[str, Container]:
        """Every container on the host, by unit."""
        found: dict[str, Container] = {}
        try:
            if self.links is not None and self.pods is not None:
                self._pod = _pod_containers(self.links)
                found.update({unit: p.container for unit, p in self._pod.items()})
            if self.docker is not None:
                self._scan_docker()
                found.update({d.container.unit: d.container for d in self._docker.values()})
        except OSError as error:  # a directory we may not read: said at the drain, and what was found is kept
            self._trouble = [f"{error.filename}: {error.strerror}"]
            return found
        self._trouble = []
        return found

    def follow(self, units: Iterable[str]) -> None:
        """Read these units' output (those that are containers), from their earlier starts on."""
        wanted = set(units)
        for unit in list(self._followed_pods):
            if unit not in wanted:
                self._followed_pods.pop(unit).close()
        for unit in wanted & self._pod.keys():
            log = self._pod[unit].log
            follower = self._followed_pods.get(unit)
            if follower is None or follower.log.uid != log.uid:  # new, or its pod was created anew
                if follower is not None:
                    self._pending += self._observations(follower.close(), unit)
                assert self.pods is not None
                self._followed_pods[unit] = _PodFollower(self.pods, log)
        self._followed_docker = wanted & {d.container.unit for d in self._docker.values()}

    def drain(self) -> list[Observation]:
        """Every line the followed containers wrote since the last call (and Docker's word on their runs).

        A file that cannot be read (not root's group, or gone mid-read) says why, and the others are read on.
        """
        out, self._pending = self._pending, []
        failed = list(self._trouble)
        for unit, follower in sorted(self._followed_pods.items()):
            try:
                out += self._observations(follower.read(), unit)
            except OSError as error:
                failed.append(f"{error.filename or follower.directory}: {error.strerror}")
        for docker in sorted(self._docker.values(), key=lambda d: d.container.unit):
            unit = docker.container.unit
            if unit not in self._followed_docker:
                continue
            try:
                out += self._docker_lines(docker)
            except OSError as error:
                failed.append(f"{error.filename or docker.directory}: {error.strerror}")
        if failed:
            self.status.down("; ".join(failed))
        else:
            self.status.ok()
        return out

    def _docker_lines(self, docker: _DockerContainer) -> list[Observation]:
        docker.reread()  # before its lines: a line of a new run is then told as one
        out = docker.news(self._offset())
        if docker.log_driver != "json-file":
            return out  # journald: the journal source reads it; other drivers leave no file to read
        if docker.file is None:
            docker.file = FollowedFile(docker.directory / f"{docker.container.id}-json.log")
        records = docker.records.whole(docker.file.read())
        runs = [(r, docker_run(r.t, docker.runs) if r.t else "") for r in records]
        return out + self._observations(runs, docker.container.unit)

    # -- Docker --

    def _scan_docker(self) -> None:
        assert self.docker is not None
        root = self.docker / "containers"
        try:
            ids = [e.name for e in os.scandir(root) if len(e.name) == 64]
        except FileNotFoundError:
            ids = []
        for gone in self._docker.keys() - set(ids):  # removed (docker rm): its file is let go
            if (file := self._docker.pop(gone).file) is not None:
                file.close()
        for container_id in ids:
            known = self._docker.get(container_id)
            if known is not None:
                known.reread()
            elif (read := _read_docker(root / container_id)) is not None:
                state, driver, changed = read
                container = Container(state.name, container_id, name=state.name)
                directory = root / container_id
                self._docker[container_id] = _DockerContainer(container, directory, driver, state, changed)

    # -- both --

    def _offset(self) -> float:
        """wall − monotonic: the runtimes write wall-clock times, the core counts in CLOCK_MONOTONIC."""
        return self._wall() - self._clock()

    def _observations(self, records: list[tuple[Record, str]], unit: str) -> list[Observation]:
        offset = self._offset()
        out: list[Observation] = []
        last = self._clock()
        for record, invocation in records:
            t = record.t - offset if record.t is not None else last  # untimed: when the one before was
            last = t
            out += log_lines(record.text, t, unit, invocation)
        return out

