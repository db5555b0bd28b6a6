"""The one impure loop: pull from the sources, advance the core, judge, publish a Snapshot."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from exporter import evidence, expectations, grammar, xids
from exporter.config import Config
from exporter.grammar import Grammar
from exporter.history import AttemptRecord, History
from exporter.model import (
    STARTUP_ORDER,
    Attempt,
    Expectation,
    Fault,
    GpuSample,
    Observation,
    Phase,
    Snapshot,
    UnitState,
    UnitView,
    XidError,
    evolve,
    frozen_map,
)
from exporter.sources.gpu import GpuReading, GpuSource, by_unit
from exporter.sources.journal_process import JournalSource
from exporter.sources.processes import ProcessSource
from exporter.sources.status import SourceStatus
from exporter.tracker import advance, judge

logger = logging.getLogger(__name__)

DEFAULT_ENGINE = "vllm"
DISCOVER_EVERY = 10.0  # seconds between scans of the cgroup tree for model-server units
# How often what the agent watched is saved for the agent after it: the gap a successor judges
# across is at most this much longer than the time it was down.
EVIDENCE_EVERY = 5.0


class Agent:
    def __init__(
        self,
        config: Config,
        journal: JournalSource,
        processes: ProcessSource,
        gpu: GpuSource | None,
        history: History | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.journal, self.processes, self.gpu = journal, processes, gpu
        self._clock, self._wall = clock, wall
        self.grammars: dict[str, Grammar] = {e: grammar.load(e) for e in grammar.ENGINES}
        self.engines: dict[str, str | None] = dict(config.units)  # None: detect from the command line
        self.states: dict[str, UnitState] = {}
        self.processes_status = SourceStatus("processes", logger, wall)
        self._discovered_at: float | None = None
        self._xids_seen: float | None = None
        self._recent_xids: list[XidError] = []
        self.xid_errors: dict[tuple[str, int], int] = {}
        self.history = history
        self.expectations: dict[str, tuple[tuple[str, str], Expectation]] = {}  # unit → (key, expectation)
        self._recorded: set[tuple[str, float]] = set()
        self._saved_cursor: str | None = None
        self._saved_evidence_at = float("-inf")
        self._boot_id = _boot_id()
        self._resuming = evidence.load(history.evidence(), self._boot_id) if history else {}
        self.snapshot = Snapshot(t=clock(), wall_offset=wall() - clock())

    def engine(self, unit: str) -> str:
        return self.engines.get(unit) or DEFAULT_ENGINE

    def tick(self) -> Snapshot:
        """One round: sample, fold in time order, judge every unit, publish."""
        t = self._clock()
        offset = self._wall() - t
        if self._discovered_at is None or t - self._discovered_at >= DISCOVER_EVERY:
            self._discover()
            self._discovered_at = t
        units = sorted(self.engines)
        self.journal.watch(units)
        # Samples first, journal second: a line written before the sample is then read in this round.
        samples = self._sample(units, t)
        # A unit's process side waits until its earlier lines are read, so the fold stays in time
        # order; asked before draining, so that those lines are surely in this round's drain.
        history_read = frozenset(units) if self.journal.status.failing else self.journal.ready_units
        observations: list[Observation] = []
        found: list[XidError] = []
        for item in self.journal.drain():
            (found if isinstance(item, XidError) else observations).append(item)
        # A unit named without its engine: its processes' command lines name it, read as soon as
        # it logs, so that even its first lines are folded with its own grammar.
        self._detect({o.unit for o in observations if self.engines.get(o.unit, "") is None})
        observations += [s for u, s in samples.items() if u in history_read]
        observations += [self._resuming.pop(u) for u in history_read & self._resuming.keys()]
        reading = self.gpu.latest if self.gpu else None
        if reading is not None:
            # Each reading is folded once per unit, also into a unit whose history was read later.
            ids = {u: s.ids for u, s in samples.items() if u in history_read and self._gpu_behind(u, reading)}
            observations += [GpuSample(reading.t, u, frozen_map(m)) for u, m in by_unit(reading, ids).items()]
            if reading.t != self._xids_seen:
                self._xids_seen = reading.t
                found += reading.xids
        observations += self._count_xids(found, reading)
        observations.sort(key=lambda o: o.t)
        for obs in observations:
            before = self.states.get(obs.unit) or UnitState(obs.unit, self.engine(obs.unit))
            self.states[obs.unit] = advance(before, obs, self.grammars[self.engine(obs.unit)], self.limits)
        if self.history:
            self._remember(offset)
        self.snapshot = self._publish(units, t, offset)
        return self.snapshot

    def warm_up(self, timeout: float = 10.0) -> Snapshot:
        """Tick until the watched units' earlier lines are read, so that the first snapshot anyone
        sees after a (re)start already shows where each unit is, rather than nothing."""
        deadline = self._clock() + timeout
        self.tick()
        while (
            not set(self.engines) <= self.journal.ready_units
            and not self.journal.status.failing
            and self._clock() < deadline
        ):
            time.sleep(0.05)
            self.tick()
        return self.tick()  # once more: the process side of units whose history just arrived

    def run(self, stop: threading.Event) -> None:
        """Tick every sample interval until `stop` is set; a failing tick is logged, not fatal."""
        while not stop.is_set():
            started = self._clock()
            try:
                self.tick()
            except Exception:  # the one broad catch: a bug in one round must not end the agent
                logger.exception("agent round failed")
            stop.wait(max(0.0, self.config.interval - (self._clock() - started)))

    def _discover(self) -> None:
        try:
            found = self.processes.list_units()
        except OSError as error:
            self.processes_status.down(str(error))
            return
        for unit, cmdlines in found.items():
            engine = self._engine_of(cmdlines)
            if unit in self.engines and self.engines[unit] is None and engine:
                self._name(unit, engine, "detected from its command line")
            elif unit not in self.engines and engine and not self.config.units:
                self._name(unit, engine, "discovered")

    def _detect(self, units: set[str]) -> None:
        for unit in sorted(units):
            if engine := self._engine_of(self.processes.cmdlines(unit)):
                self._name(unit, engine, "detected from its command line")

    def _engine_of(self, cmdlines: Iterable[str]) -> str | None:
        grammars = tuple(self.grammars.values())
        return next((e for c in cmdlines if (e := grammar.detect(grammars, c))), None)

    def _name(self, unit: str, engine: str, how: str) -> None:
        self.engines[unit] = engine
        if unit in self.states:  # published before its engine was known: its label follows
            self.states[unit] = evolve(self.states[unit], engine=engine)
        logger.info("unit=%s engine=%s %s", unit, engine, how)

    def _sample(self, units: Iterable[str], t: float) -> dict:  # type: ignore[type-arg]
        try:
            samples = self.processes.sample(units, t)
        except OSError as error:
            self.processes_status.down(str(error))
            return {}
        self.processes_status.ok()
        return samples

    def _remember(self, offset: float) -> None:
        """Put every start that has an outcome into the history, once; refresh what it teaches."""
        assert self.history is not None
        for state in self.states.values():
            for attempt in (state.previous, state.attempt):
                if attempt is None or attempt.outcome is None or (state.unit, attempt.started) in self._recorded:
                    continue
                self._recorded.add((state.unit, attempt.started))
                self.history.record(self._record(state, attempt, offset))
                self.expectations.pop(state.unit, None)
        now = self._clock()
        if now - self._saved_evidence_at >= EVIDENCE_EVERY:
            self.history.save_evidence(evidence.dump(self.states.values(), self._boot_id))
            self._saved_evidence_at = now
        if self.journal.cursor and self.journal.cursor != self._saved_cursor:
            self.history.save_cursor(self.journal.cursor)
            self._saved_cursor = self.journal.cursor

    def _record(self, state: UnitState, attempt: Attempt, offset: float) -> AttemptRecord:
        ends = [t for phase, t in attempt.spans if phase in (Phase.READY, Phase.FAILED, Phase.STOPPING)]
        failed_in = [p for p, _ in attempt.spans if p in STARTUP_ORDER][-1:] if attempt.phase is Phase.FAILED else []
        return AttemptRecord(
            unit=state.unit,
            boot_id=self._boot_id,
            started_monotonic=attempt.started,
            started=attempt.started + offset,
            ended=ends[0] + offset if ends else None,
            outcome=str(attempt.outcome),
            engine=state.engine,
            engine_version=state.info.get("engine_version", ""),
            model=state.info.get("model", ""),
            fingerprint=expectations.attempt_fingerprint(state, attempt),
            compile_cache=attempt.compile_cache,
            failure_phase=str(failed_in[0]) if failed_in else None,
            failure_reason=str(attempt.reason) if attempt.phase is Phase.FAILED and attempt.reason else None,
            phases=frozen_map(expectations.phase_durations(attempt)),
        )

    def _expected(self, state: UnitState) -> Expectation | None:
        """What this unit's history expects of its current start (learned again when that changes)."""
        if self.history is None:
            return None
        attempt = state.attempt
        key = (expectations.attempt_fingerprint(state, attempt), attempt.compile_cache) if attempt else ("", "")
        known = self.expectations.get(state.unit)
        if known is None or known[0] != key:
            known = (key, expectations.learn(self.history.recent(state.unit), *key))
            self.expectations[state.unit] = known
        return known[1]

    def _gpu_behind(self, unit: str, reading: GpuReading) -> bool:
        state = self.states.get(unit)
        return state is None or state.last_gpu is None or state.last_gpu.t < reading.t

    def _count_xids(self, found: list[XidError], reading: GpuReading | None) -> list[Fault]:
        result = []
        self._recent_xids = [x for x in self._recent_xids if self._clock() - x.t <= xids.SAME_EVENT]
        for xid in found:
            xid = xids.resolve(xid, reading.devices if reading else ())
            if xids.is_repeat(xid, self._recent_xids):
                continue
            self._recent_xids.append(xid)
            key = (xid.gpu, xid.xid)
            self.xid_errors[key] = self.xid_errors.get(key, 0) + 1
            logger.warning("gpu=%s xid=%d source=%s", xid.gpu, xid.xid, xid.source)
            result += xids.faults(xid, self.states.values())
        return result

    def _publish(self, units: list[str], t: float, offset: float) -> Snapshot:
        before = {view.state.unit: view for view in self.snapshot.units}
        views = []
        for unit in units:
            state = self.states.setdefault(unit, UnitState(unit, self.engine(unit)))
            expected = self._expected(state)
            ceiling = expectations.ceiling(expected, state.phase)
            view = UnitView(state, judge(state, t, self.limits, ceiling), expected)
            old = before.get(unit)
            if old is None or old.state.phase is not state.phase or old.verdict is not view.verdict:
                logger.info("unit=%s phase=%s verdict=%s", unit, state.phase, view.verdict)
            views.append(view)
        sources = {"journal": self.journal.status.health, "processes": self.processes_status.health}
        if self.gpu:
            sources["gpu"] = self.gpu.status.health
        now = t + offset
        # A source whose last success is stale is down, even if its thread is stuck inside a call
        # that has not failed yet (an NVML call can block for minutes).
        sources = {
            name: h if h.last_success is None or now - h.last_success <= self.limits.stale else replace(h, up=False)
            for name, h in sources.items()
        }
        reading = self.gpu.latest if self.gpu else None
        return Snapshot(
            t=t,
            wall_offset=offset,
            units=tuple(views),
            sources=frozen_map(sources),
            gpus=reading.devices if reading else (),
            xid_errors=frozen_map(self.xid_errors),
            stale_after=self.limits.stale,
            journal_reader_restarts=self.journal.restarts,
        )


def _boot_id() -> str:
    """This boot's id: with a monotonic start time, it names one start of a unit for good."""
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return ""
