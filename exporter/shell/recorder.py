"""The agent's memory across restarts: finished starts into the history, what it teaches, what was watched."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterable

from exporter.core import checkpoint, expectations
from exporter.core.checkpoint import Checkpoint
from exporter.core.model import Attempt, Expectation, Phase, UnitState, frozen_map
from exporter.shell.history import AttemptRecord, History
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
        self._recorded: set[tuple[str, float]] = set()
        self._expectations: dict[str, tuple[tuple[str, str], Expectation]] = {}  # unit → (key, expectation)
        self._saved_at = float("-inf")

    def checkpoint(self) -> Checkpoint | None:
        """What the agent before this one knew, if it ran in this boot."""
        try:
            return checkpoint.load(self.history.checkpoint(), self._boot_id)
        except sqlite3.Error as error:
            logger.warning("cannot read the checkpoint in %s: %s", self.history.path, error)
            return None

    def remember(self, states: Iterable[UnitState], offset: float, cursor: str | None,
                 caught_up: frozenset[str] = frozenset(), checkpoint_now: bool = False) -> None:
        """Store every start that has an outcome, once; now and then a checkpoint of the caught-up units
        and the journal position their states reflect.

        A write that fails (a full disk, a file locked for too long) is tried again at the next round,
        and the source is down meanwhile: the agent goes on following its units either way.
        """
        if self.history.readonly:
            return
        try:
            self._remember(tuple(states), offset, cursor, caught_up, checkpoint_now)
        except sqlite3.Error as error:
            self.status.down(f"cannot write {self.history.path}: {error}")
        else:
            self.status.ok(f"writing {self.history.path}")

    def _remember(self, states: tuple[UnitState, ...], offset: float, cursor: str | None,
                  caught_up: frozenset[str], checkpoint_now: bool) -> None:
        for state in states:
            for attempt in (state.previous, state.attempt):
                if attempt is None or attempt.outcome is None or (state.unit, attempt.started) in self._recorded:
                    continue
                self.history.record(self._record(state, attempt, offset))
                self._recorded.add((state.unit, attempt.started))  # once stored: a failed write is tried again
                self._expectations.pop(state.unit, None)
        now = self._clock()
        if cursor and (checkpoint_now or now - self._saved_at >= CHECKPOINT_EVERY):
            known = [s for s in states if s.unit in caught_up]
            self.history.save_checkpoint(checkpoint.dump(known, self._boot_id, cursor))
            self._saved_at = now

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
            phases=frozen_map(expectations.phase_durations(attempt)),
        )
