"""What a unit's own past says a start should take, per phase and in all; pure."""

from __future__ import annotations

import hashlib
from typing import Iterable

from exporter.core import progress
from exporter.core.model import STARTUP_ORDER, Attempt, Expectation, Phase, Span, UnitState, frozen_map

RECENT = 10  # starts an expectation is learned from: recent enough to follow upgrades
# A busy process whose phase has run this many times longer than the longest ever seen, with
# nothing but CPU moving, is a collective hang (NCCL spinning), not a slow start.
WELL_PAST = 2.0


def fingerprint(engine: str, version: str, model: str, settings: str) -> str:
    """Starts with the same engine, version, model and settings cost about the same."""
    return hashlib.sha256("\0".join((engine, version, model, settings)).encode()).hexdigest()[:16]


def attempt_fingerprint(state: UnitState, attempt: Attempt) -> str:
    return fingerprint(state.engine, state.info.get("engine_version", ""), state.info.get("model", ""), attempt.settings)


def _span(values: list[float]) -> Span | None:
    return Span(_median(values), max(values), len(values)) if values else None


def _median(values: list[float]) -> float:
    """statistics.median's value, without the module: it imports fractions and decimal, 0.3 MiB of the
    agent's memory for this."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def phase_durations(attempt: Attempt) -> dict[str, float]:
    """How long each startup phase of a finished start took, from its timeline."""
    # The last period is how the start ended (ready, failed, stopping): not a phase it went through.
    return {
        str(phase): round(stop - start, 3)
        for phase, start, stop in attempt.periods(attempt.started)[:-1]
        if phase in STARTUP_ORDER and phase is not Phase.READY
    }


def learn(records: Iterable, fingerprint: str = "", compile_cache: str = "") -> Expectation:  # type: ignore[type-arg]
    """From the newest-first history records (exporter.shell.history.AttemptRecord) of one unit.

    Only starts that reached ready teach what a start takes. Those with the same fingerprint are
    preferred when there are any; the compile phase is learned only from starts with the same
    cache state when the engine said which (a cold torch.compile takes minutes, a cache hit seconds).
    """
    ready = [r for r in records if r.outcome == "ready"]
    same = [r for r in ready if fingerprint and r.fingerprint == fingerprint] or ready
    same = same[:RECENT]
    phases = {}
    for phase in STARTUP_ORDER[:-1]:
        pool = same
        if phase is Phase.COMPILING and compile_cache:
            pool = [r for r in same if r.compile_cache == compile_cache] or same
        if span := _span([r.phases[str(phase)] for r in pool if str(phase) in r.phases]):
            phases[phase] = span
    startup = _span([r.ended - r.started for r in same if r.ended is not None])
    return Expectation(frozen_map(phases), startup)


def ceiling(expectation: Expectation | None, phase: Phase) -> float | None:
    """How long the phase may run before a busy-only process in it counts as hung."""
    span = expectation.phases.get(phase) if expectation else None
    return span.longest * WELL_PAST if span else None


def remaining(expectation: Expectation | None, attempt: Attempt, now: float) -> float | None:
    """Expected seconds to ready (exporter.core.progress.ready_at); None without history."""
    ready = progress.ready_at(expectation, attempt, now)
    return None if ready is None else max(0.0, ready - now)


def slower_than_usual(expectation: Expectation | None, attempt: Attempt, now: float) -> bool:
    span = expectation.phases.get(attempt.phase) if expectation else None
    return span is not None and now - attempt.phase_since > span.longest
