"""The agent's memory across restarts: finished starts into the history, what it teaches, what was watched."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable

from exporter.core import checkpoint, expectations
from exporter.core.checkpoint import Checkpoint
from exporter.core.model import Attempt, Expectation, Phase, UnitState, frozen_map
from exporter.shell.history import KEEP_PER_UNIT, AttemptRecord, History
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

# How often what the agent knows is saved for the agent after it: a restarted agent reads on from a
# journal position at most this old, and judges across a gap at most this much longer than its own.
CHECKPOINT_EVERY = 5.0


class HistoryRecorder:
    """Puts each start that reached an outcome into the history once, and keeps what the history expects."""

    def __init__(self, history: History, boot_id: str, clock: Callable[[], float],
                 wall: Callable[[], float] = time.time) -> None:
        self.history = history
        self.status = SourceStatus("history", logger, wall)
        self._boot_id = boot_id
        self._clock = clock
        self._recorded: set[tuple[str, float]] = set()  # the starts taken in: written, or waiting to be
        self._unwritten: list[AttemptRecord] = []  # finished starts a write failed for (a full disk): kept until one works
        self._expectations: dict[str, tuple[tuple[str, str], Expectation]] = {}  # unit → (key, expectation)
        self._saved_at = float("-inf")
        self._saved = ""  # the checkpoint last written: one that has not changed is not written again

    def checkpoint(self) -> Checkpoint | None:
        """What the agent before this one knew, if it ran in this boot."""
        try:
            return checkpoint.load(self.history.checkpoint(), self._boot_id)
        except sqlite3.Error as error:
            logger.warning("cannot read the checkpoint in %s: %s", self.history.path, error)
            return None

    def remember(self, states: Iterable[UnitState], offset: float, cursor: str | None,
                 caught_up: frozenset[str] = frozenset(), checkpoint_now: bool = False,
                 passed: Iterable[tuple[UnitState, Attempt]] = ()) -> None:
        """Store every start that has an outcome, once: those of the states, and those the round's fold pushed
        out of them (`passed`, each with the state it was in); now and then a checkpoint of the caught-up units
        and the journal position their states reflect.

        A write that fails (a full disk, a file locked for too long) leaves the finished starts in memory, to be
        written at the first round that can, and the source down meanwhile: the agent goes on following its
        units either way, and loses no start.
        """
        if self.history.readonly:
            return
        states = tuple(states)
        for state, attempt in (*passed, *((s, a) for s in states for a in (s.previous, s.attempt))):
            if attempt is not None and attempt.outcome is not None and (state.unit, attempt.started) not in self._recorded:
                self._recorded.add((state.unit, attempt.started))
                self._keep(self._record(state, attempt, offset))
        try:
            self._write(states, cursor, caught_up, checkpoint_now)
        except sqlite3.Error as error:
            self.status.down(f"cannot write {self.history.path}: {error} ({self._free()} free there); "
                             "finished starts are kept in memory until a write works")
        else:
            self.status.ok(f"writing {self.history.path}")

    def _write(self, states: tuple[UnitState, ...], cursor: str | None, caught_up: frozenset[str],
               checkpoint_now: bool) -> None:
        while self._unwritten:
            record = self._unwritten[0]
            self.history.record(record)
            self._unwritten.pop(0)
            self._expectations.pop(record.unit, None)
        now = self._clock()
        if cursor and (checkpoint_now or now - self._saved_at >= CHECKPOINT_EVERY):
            saved = checkpoint.dump([s for s in states if s.unit in caught_up], self._boot_id, cursor)
            if saved != self._saved:
                self.history.save_checkpoint(saved)
                self._saved = saved
            self._saved_at = now

    def _keep(self, record: AttemptRecord) -> None:
        """A finished start, to be written; of a unit's waiting starts, no more than the history keeps per unit
        (it would delete the oldest at once): what a disk full for days costs in memory is bounded."""
        self._unwritten.append(record)
        same = [r for r in self._unwritten if r.unit == record.unit]
        if len(same) > KEEP_PER_UNIT:
            self._unwritten.remove(same[0])

    def _free(self) -> str:
        try:
            found = os.statvfs(self.history.path.parent)
        except OSError as error:
            return f"free space unknown: {error.strerror}"
        return f"{found.f_bavail * found.f_frsize / 1024:.0f} KiB"

    def expected(self, state: UnitState) -> Expectation:
        """What this unit's history expects of its current start (learned again when that changes)."""
        attempt = state.attempt
        key = (expectations.attempt_fingerprint(state, attempt), attempt.compile_cache) if attempt else ("", "")
        known = self._expectations.get(state.unit)
        if known is None or known[0] != key:
            known = (key, expectations.learn(self.history.recent(state.unit), *key))
            self._expectations[state.unit] = known
        return known[1]

    def _record(self, state: UnitState, attempt: Attempt, offset: float) -> AttemptRecord:
        settled = attempt.settled_at
        failed = attempt.phase is Phase.FAILED
        return AttemptRecord(
            unit=state.unit,
            boot_id=self._boot_id,
            started_monotonic=attempt.started,
            started=attempt.started + offset,
            ended=settled + offset if settled is not None else None,
            outcome=str(attempt.outcome),
            engine=state.engine,
            engine_version=state.info.get("engine_version", ""),
            model=state.info.get("model", ""),
            fingerprint=expectations.attempt_fingerprint(state, attempt),
            compile_cache=attempt.compile_cache,
            failure_phase=str(attempt.last_startup_phase) if failed else None,
            failure_reason=str(attempt.reason) if failed and attempt.reason else None,
            invocation=attempt.invocation,
            phases=frozen_map(expectations.phase_durations(attempt)),
        )
