"""The one impure loop: pull from the sources, advance the core, judge, publish a Snapshot."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from exporter.core import checkpoint, expectations, grammar, groups, stuck, xids
from exporter.core.checkpoint import Checkpoint
from exporter.core.config import Config
from exporter.core.containers import Container
from exporter.core.model import (
    GpuSample,
    Group,
    Launched,
    LogLine,
    Observation,
    ProcessSample,
    Resumed,
    Snapshot,
    SourceHealth,
    StackSample,
    UnitState,
    UnitView,
    XidError,
    evolve,
    frozen_map,
)
from exporter.core.tracker import advance, assess
from exporter.shell.engines import EngineNames
from exporter.shell.recorder import HistoryRecorder
from exporter.sources.gpu import GpuReading, by_unit
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

DISCOVER_EVERY = 10.0  # seconds between scans of the cgroup tree for model-server units
READ_TO_WAIT = 0.1  # seconds a round waits for the journal to be read up to its samples (an idle reader: 1 ms)
# Samples a unit's process side may wait for the journal to be read up to them: past this, a reader that is stuck
# (not down: it would say so) no longer holds the unit's process side, and the oldest are folded anyway.
HELD_MAX = 64


class JournalFeed(Protocol):
    """What the agent reads the journal through (exporter.sources.journal_process.JournalSource)."""

    status: SourceStatus
    drained_cursor: str | None  # the last entry of what drain() gave
    ready_units: frozenset[str]  # units whose earlier lines (this boot) are all handed over
    read_through: float  # every entry written before this monotonic time is handed over
    restarts: int
    resumed: bool  # it went on from the checkpoint's cursor
    resume_lost: str | None  # why it could not
    behind: bool  # it is catching up: drain after settle(), not at the next round

    def watch(self, units: Iterable[str]) -> None: ...
    def drain(self) -> list[Observation | XidError]: ...
    def settle(self, timeout: float) -> None: ...  # wait until a drain is worth a round
    def sync(self) -> None: ...  # have the journal read as it stands now (read_through)
    def read_to(self, t: float, timeout: float) -> float: ...  # sync, and wait (a little) until read through t


class JournaldFeed(Protocol):
    """What the agent watches journald itself through (exporter.sources.journald.JournaldWatch)."""

    def check(self, writers: Mapping[str, Iterable[int]]) -> str: ...  # why it does not write the journal, or ""


class ProcessFeed(Protocol):
    """What the agent samples the units' processes through (exporter.sources.processes.ProcessSource)."""

    def sample(self, units: Iterable[str], t: float) -> dict[str, ProcessSample]: ...
    def list_units(self) -> dict[str, tuple[str, ...]]: ...
    def cmdlines(self, unit: str) -> tuple[str, ...]: ...
    def place(self, containers: Mapping[str, str]) -> None: ...  # unit → container id: where its processes are


class ContainerFeed(Protocol):
    """What the agent follows containers through (exporter.sources.containers.ContainerSource)."""

    status: SourceStatus

    def containers(self) -> dict[str, Container]: ...
    def follow(self, units: Iterable[str]) -> None: ...
    def drain(self) -> list[Observation]: ...


class GpuFeed(Protocol):
    """What the agent reads GPU memory and Xid events through (exporter.sources.gpu.GpuSource)."""

    status: SourceStatus
    latest: GpuReading | None


class StackFeed(Protocol):
    """What the agent looks at silent units' processes through (exporter.sources.stacks.StackSource)."""

    status: SourceStatus

    def watch(self, targets: Mapping[str, frozenset[int]]) -> None: ...
    def drain(self) -> list[StackSample]: ...


class Agent:
    def __init__(
        self,
        config: Config,
        journal: JournalFeed,
        processes: ProcessFeed,
        gpu: GpuFeed | None,
        recorder: HistoryRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        restored: Checkpoint | None = None,
        containers: ContainerFeed | None = None,
        stacks: StackFeed | None = None,
        journald: JournaldFeed | None = None,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.journal, self.processes, self.gpu, self.containers = journal, processes, gpu, containers
        self.stacks = stacks
        self.journald = journald
        self.journald_status = SourceStatus("journal", logger, wall)  # journald itself; the reader has its own
        self.identities: dict[str, Container] = {}  # the units that are containers (the last seen of each)
        self.present: dict[str, Container] = {}  # the containers on the host now, as the flags select them
        self._looked_at: set[str] = set()  # containers (ids) whose command lines were read
        self._clock, self._wall = clock, wall
        self.grammars = grammar.load_all()
        self.launch_flags = grammar.launch_flags()
        self._launches: dict[str, float] = {}  # unit → the start whose command lines were read
        self.names = EngineNames(config.units, self.grammars)
        self.states: dict[str, UnitState] = {}
        self.processes_status = SourceStatus("processes", logger, wall)
        self._discovered_at: float | None = None
        self._held: dict[str, list[ProcessSample]] = {}  # unit → its samples the journal is not read up to yet
        self._sampled: set[str] = set()  # units with a sample of this agent's folded
        self._caught_up: frozenset[str] = frozenset()  # units whose state the last round's drain completed
        self._xids_seen: float | None = None  # the GPU reading whose Xid events are counted
        self.xid_tally = xids.XidTally()
        self.recorder = recorder
        self._restored = restored  # the agent before this one's states: taken over once the journal goes on
        self._resuming: dict[str, Resumed] = {}  # their process side alone, when it cannot
        self.snapshot = Snapshot(t=clock(), wall_offset=wall() - clock())

    def tick(self) -> Snapshot:
        """One round: sample, fold in time order, judge every unit, publish.

        The order is what keeps the fold in time order, and each step says why it comes where it does.
        """
        t = self._clock()
        offset = self._wall() - t
        # 0. Containers every round (a restarted one has a new id, so a new cgroup); units every so often.
        self._look_at_containers()
        if self._discovered_at is None or t - self._discovered_at >= DISCOVER_EVERY:
            self._discover()
            self._discovered_at = t
        units = self.names.units
        self.journal.watch(units)
        if self.containers:
            self.containers.follow(units)
        # 1. Processes before the logs: a line written before the sample is then read this round. journald itself:
        #    stopped, or not reading what the units write, the units' silence is the journal's.
        samples = self._sample(units, t)
        self._watch_journald(samples, t)
        # 2. A unit's process side waits until its earlier lines are read, so that the fold stays in
        #    time order; asked before draining, so that those lines are surely in this round's drain: the
        #    units whose earlier lines are read, and how far the journal is read.
        failing = self.journal.status.failing
        caught_up = frozenset(units) if failing else self.journal.ready_units
        through = float("inf") if failing else self.journal.read_to(t, READ_TO_WAIT)
        # 3. The journal.
        observations: list[Observation] = []
        found: list[XidError] = []
        for item in self.journal.drain():
            (found if isinstance(item, XidError) else observations).append(item)
        self._take_over()
        if self.containers:  # read whole in this call: a container's earlier lines come with its first drain
            observations += self.containers.drain()
        # 4. A unit named without its engine: its processes' command lines name it, read as soon as it
        #    logs, so that even its first lines are folded with its own grammar.
        unnamed = {o.unit for o in observations if self.names.unknown(o.unit)}
        self._rename(self.names.found({unit: self.processes.cmdlines(unit) for unit in sorted(unnamed)}))
        # 5. Process and GPU samples, and what the agent before this one watched, of caught-up units.
        observations += self._in_order(samples, caught_up, through, t, observations, self.journald_status.failing)
        observations += [self._resuming.pop(u) for u in caught_up & self._resuming.keys()]
        reading = self.gpu.latest if self.gpu else None
        if reading is not None:
            observations += self._gpu_samples(reading, samples, caught_up)
            if reading.t != self._xids_seen:  # each reading's Xid events are counted once
                self._xids_seen = reading.t
                found += reading.xids
        observations += self._count_xids(found, reading)
        if self.stacks:  # looks taken on the stack thread since the last round
            observations += [s for s in self.stacks.drain() if s.unit in caught_up]
        # 6. The fold, in time order. A start the fold pushes out of a unit's state (a round that reads several
        #    starts: a paused agent, a crash loop read back) is handed to the history all the same.
        observations.sort(key=lambda o: o.t)
        passed = []
        for obs in observations:
            before = self.states.get(obs.unit) or UnitState(obs.unit, self.names.engine(obs.unit))
            after = advance(before, obs, self.grammars[self.names.engine(obs.unit)], self.limits)
            if before.previous is not None and after.previous is not before.previous:
                passed.append((before, before.previous))
            self.states[obs.unit] = after
        # 7. A start's command lines, once, as it begins: the hosts it spans, which a rank that never prints a
        #    line still says there.
        self._read_launches(units, t)
        self._caught_up = caught_up
        if self.recorder:
            self.recorder.remember(self.states.values(), offset, self.journal.drained_cursor, caught_up, passed=passed)
        self.snapshot = self._publish(units, t, offset)
        if self.stacks:  # the units silent now are looked at, on the stack thread
            self.stacks.watch({
                view.state.unit: frozenset(pid for pid, _ in view.state.last_process.ids)
                for view in self.snapshot.units
                if view.verdict in stuck.SILENT and view.state.last_process and view.state.last_process.ids
            })
        return self.snapshot

    def warm_up(self, timeout: float = 10.0) -> Snapshot:
        """Tick until the watched units' earlier lines are read and their processes sampled after them, so that
        the first snapshot anyone sees after a (re)start already shows where each unit is, rather than nothing."""
        deadline = self._clock() + timeout
        self.tick()
        while not self._warm() and self._clock() < deadline:
            if set(self.names.units) <= self.journal.ready_units:
                # read: their processes are sampled, and folded once the journal is read past the sample
                self.journal.sync()
                time.sleep(0.05)
            else:
                # a round once a batch is read or the units are, not on a timer: the rounds' samples would take the
                # CPU the reading needs (0.25 s at most: a unit discovered meanwhile is watched at the next)
                self.journal.settle(min(0.25, max(0.0, deadline - self._clock())))
            self.tick()
        return self.snapshot

    def _warm(self) -> bool:
        if self.journal.status.failing:  # nothing to wait for
            return True
        units = self.names.units
        return set(units) <= self.journal.ready_units and (self.processes_status.failing or set(units) <= self._sampled)

    def run(self, stop: threading.Event) -> None:
        """Tick every sample interval until `stop` is set; a failing tick is logged, not fatal."""
        while not stop.is_set():
            started = self._clock()
            try:
                self.tick()
            except Exception:  # the one broad catch: a bug in one round must not end the agent
                logger.exception("agent round failed")
            rest = max(0.0, self.config.interval - (self._clock() - started))
            if self.journal.behind:  # catching up: the next round once a backlog's worth is read
                self.journal.settle(rest)
            else:
                stop.wait(rest)

    def close(self) -> None:
        """A last round and a checkpoint of it as the agent stops: the one after it (an upgrade) reads on
        from here. The round counts a unit whose earlier lines the round before finished reading."""
        if self.recorder:
            self.tick()
            offset = self._wall() - self._clock()
            self.recorder.remember(self.states.values(), offset, self.journal.drained_cursor, self._caught_up,
                                   checkpoint_now=True)

    def _take_over(self) -> None:
        """The checkpoint's states, once the journal reader went on from its cursor (what was drained is
        what followed it); when it could not, only their process side, after the journal is read again."""
        if self._restored is None:
            return
        if self.journal.resumed:
            self.states.update(self._restored.states)
            self._restored = None
        elif self.journal.resume_lost is not None:
            self._resuming = checkpoint.resumed(self._restored)
            self._restored = None

    def _discover(self) -> None:
        try:
            found = self.processes.list_units()
        except OSError as error:
            self.processes_status.down(str(error))
            return
        found.update({u: self.processes.cmdlines(u) for u in self.present if u not in self.names})
        self._rename(self.names.found(found))
        self._forget_removed()

    def _look_at_containers(self) -> None:
        """The containers on the host now, as the selection flags allow; their cgroups found from their ids."""
        if self.containers is None:
            return
        present = self.containers.containers()
        include, exclude = self.config.container_include, self.config.container_exclude
        self.present = {
            unit: c for unit, c in present.items()
            if (include is None or include.fullmatch(unit)) and not (exclude and exclude.fullmatch(unit))
        }
        self.processes.place({unit: c.id for unit, c in self.present.items()})
        # A container just started is looked at now, not at the next discovery: one that fails fast (a crash
        # loop restarts it under a new id each time) would be gone before that.
        new = {u: c for u, c in self.present.items() if c.id not in self._looked_at and u not in self.names}
        cmdlines = {u: lines for u in new if (lines := self.processes.cmdlines(u))}
        self._looked_at = {c.id for c in self.present.values()} & (self._looked_at | {new[u].id for u in cmdlines})
        self._rename(self.names.found(cmdlines))

    def _forget_removed(self) -> None:
        """A container that is gone (a pod deleted, a container removed) and whose last start is over stops
        being a unit: pods come and go under new names, and the series of those gone must not pile up."""
        for unit in [u for u in self.identities if u not in self.present]:
            state = self.states.get(unit)
            if (state is None or state.attempt is None or state.attempt.ended is not None) and self.names.forget(unit):
                logger.info("unit=%s container removed: no longer followed", unit)
                self.states.pop(unit, None)
                self._held.pop(unit, None)
                del self.identities[unit]

    def _rename(self, named: Mapping[str, str]) -> None:
        """A unit published before its engine was known takes its engine's label."""
        for unit, engine in named.items():
            if unit in self.states:
                self.states[unit] = evolve(self.states[unit], engine=engine)

    def _in_order(self, samples: Mapping[str, ProcessSample], caught_up: frozenset[str], through: float,
                  t: float, lines: Iterable[Observation], unwritten: bool) -> list[ProcessSample]:
        """The samples of caught-up units that may be folded now, each unit's in the order they were taken.

        A sample is folded once the journal is read up to the time it was taken (`through`): every line written
        before it is then folded first, so that an exit settles a start only after its last words, whatever the
        order in which the reader and the sampler saw them (a paused agent, a reader catching up, an agent
        restarted after starts it never saw). One that finds no process waits a round more: words printed just
        before the exit may reach the journal only after the sample did; and it is dropped when the unit has
        spoken since (this round's `lines` too): a start that began after the look, whose \r bar dated back past
        it would be ended at once, or last words, after which a later look sees the exit. While journald does not
        write the journal (`unwritten`), a look that finds no process waits for it: the last words are in journald's
        stream, dated when it reads them again, after the look, which is then dropped for them.
        """
        for unit, sample in samples.items():
            if unit in caught_up:
                self._held.setdefault(unit, []).append(sample)
        spoke = {unit: state.last_log for unit, state in self.states.items() if state.last_log is not None}
        for obs in lines:
            if isinstance(obs, LogLine):
                spoke[obs.unit] = max(spoke.get(obs.unit, obs.t), obs.t)
        ready = []
        for unit, held in self._held.items():
            while held and (len(held) > HELD_MAX
                            or held[0].t <= through and (held[0].ids or held[0].t < t and not unwritten)):
                sample = held.pop(0)
                if not sample.ids and spoke.get(unit, sample.t) > sample.t:
                    continue  # it spoke since: a start after the look, or last words (a later look will see the exit)
                ready.append(sample)
                self._sampled.add(unit)
        return ready

    def _watch_journald(self, samples: Mapping[str, ProcessSample], t: float) -> None:
        """Whether journald writes the journal; asked of the processes of the units it should hear (not the
        containers: their output is read from files) that have not been heard for a round."""
        if self.journald is None:
            return
        quiet = {unit for unit, state in self.states.items()
                 if state.last_log is None or t - state.last_log >= self.config.interval}
        why = self.journald.check({unit: [pid for pid, _ in sample.ids] for unit, sample in samples.items()
                                   if unit in quiet and unit not in self.identities and unit not in self.present})
        if why:
            self.journald_status.down(why)
        elif self.journald_status.failing:
            self.journald_status.ok("journald writes the journal again")

    def _sources(self, now: float) -> dict[str, SourceHealth]:
        """Each source's health at wall time `now`; the journal's is the reader's and journald's own."""
        journal = self.journal.status.health
        if self.journald_status.failing:
            journal = replace(self.journald_status.health, last_success=journal.last_success)
        sources = {"journal": journal, "processes": self.processes_status.health}
        if self.gpu:
            sources["gpu"] = self.gpu.status.health
        if self.recorder and not self.recorder.history.readonly:
            sources["history"] = self.recorder.status.health
        if self.containers:
            sources["containers"] = self.containers.status.health
        if self.stacks and self.config.stacks:
            sources["stacks"] = self.stacks.status.health
        # A source whose last success is stale is down, even if its thread is stuck inside a call
        # that has not failed yet (an NVML call can block for minutes).
        return {
            name: h if h.last_success is None or now - h.last_success <= self.limits.stale
            else replace(h, up=False, why=h.why or f"no word from it for {now - h.last_success:.0f} s")
            for name, h in sources.items()
        }

    def _sample(self, units: Iterable[str], t: float) -> dict[str, ProcessSample]:
        try:
            samples = self.processes.sample(units, t)
        except OSError as error:
            self.processes_status.down(str(error))
            return {}
        self.processes_status.ok()
        return samples

    def _read_launches(self, units: Iterable[str], t: float) -> None:
        for unit in units:
            state = self.states.get(unit)
            live = state.attempt if state and state.attempt and state.attempt.ended is None else None
            if live is None or self._launches.get(unit) == live.started or not (state.last_process and state.last_process.ids):
                continue
            self._launches[unit] = live.started
            group = groups.launched(self.launch_flags, self.processes.cmdlines(unit))
            if group != Group():
                self.states[unit] = advance(state, Launched(t, unit, group), self.grammars[self.names.engine(unit)],
                                            self.limits)

    def _gpu_samples(
        self, reading: GpuReading, samples: Mapping[str, ProcessSample], caught_up: frozenset[str]
    ) -> list[GpuSample]:
        """Each reading, folded once per unit: also into a unit whose history was read after it came."""
        ids = {u: s.ids for u, s in samples.items() if u in caught_up and self._gpu_behind(u, reading)}
        return [GpuSample(reading.t, u, frozen_map(m)) for u, m in by_unit(reading, ids).items()]

    def _gpu_behind(self, unit: str, reading: GpuReading) -> bool:
        state = self.states.get(unit)
        return state is None or state.last_gpu is None or state.last_gpu.t < reading.t

    def _count_xids(self, found: list[XidError], reading: GpuReading | None) -> list[Observation]:
        devices = reading.devices if reading else ()
        self.xid_tally, new, faults = xids.count(self.xid_tally, found, devices, self.states.values(), self._clock())
        for xid in new:
            logger.warning("gpu=%s xid=%d source=%s", xid.gpu, xid.xid, xid.source)
        return list(faults)

    def _publish(self, units: list[str], t: float, offset: float) -> Snapshot:
        sources = self._sources(t + offset)
        journal = sources["journal"]
        unheard = journal.why if not journal.up else ""  # the units' silence may be the journal's
        before = {view.state.unit: view for view in self.snapshot.units}
        views = []
        for unit in units:
            state = self.states.setdefault(unit, UnitState(unit, self.names.engine(unit)))
            expected = self.recorder.expected(state) if self.recorder else None
            ceiling = expectations.ceiling(expected, state.phase)
            if unit in self.present:
                self.identities[unit] = self.present[unit]
            container = self.identities.get(unit)  # its lines come from its log files, not the journal
            verdict, why = assess(state, t, self.limits, ceiling, "" if container else unheard)
            view = UnitView(state, verdict, expected, container, why, stuck.where(state, verdict, t, self.limits))
            old = before.get(unit)
            if old is None or old.state.phase is not state.phase or old.verdict is not view.verdict:
                logger.info("unit=%s phase=%s verdict=%s%s", unit, state.phase, view.verdict,
                            f" why={view.why!r}" if view.why else "")
            views.append(view)
        reading = self.gpu.latest if self.gpu else None
        return Snapshot(
            t=t,
            wall_offset=offset,
            units=tuple(views),
            sources=frozen_map(sources),
            gpus=reading.devices if reading else (),
            xid_errors=self.xid_tally.counts,
            stale_after=self.limits.stale,
            stall_after=self.limits.stall,
            journal_reader_restarts=self.journal.restarts,
        )


def boot_id() -> str:
    """This boot's id: with a monotonic start time, it names one start of a unit for good."""
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return ""
