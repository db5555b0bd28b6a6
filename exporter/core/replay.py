"""`replay`: the same core fed from a saved log; each unit's last start as a timeline with its outcome.

Pure: it takes (time, journal-like fields) pairs from exporter.core.formats or a journal file and folds them
through `tracker.advance`, exactly as the agent folds the live journal, minus the process side.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.core import grammar as grammars
from exporter.core.grammar import Grammar
from exporter.core.model import (
    STARTUP_ORDER,
    Attempt,
    Lifecycle,
    Limits,
    LogLine,
    Observation,
    Outcome,
    Phase,
    UnitState,
)
from exporter.core.report import duration, gaps, size, timeline
from exporter.core.entries import container_name, to_observations
from exporter.core.tracker import advance

Fields = Mapping[str, Any]
SNIFF = 500  # records of a unit read before its engine is chosen from them


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


def unit_of(fields: Fields, default: str) -> str:
    """The unit a line belongs to: the container a runtime's journald log driver names, else journald's
    _SYSTEMD_UNIT, else the syslog identifier of a short-format
    line (as `<identifier>.service`, which is what PID 1's lines call it), else the default.

    "" for PID 1 (its lines are about the unit in their UNIT field; journald files them under
    init.scope) and for the kernel.
    """
    if _text(fields.get("_PID")) == "1" or _text(fields.get("_TRANSPORT")) == "kernel":
        return ""
    if unit := container_name(fields) or _text(fields.get("_SYSTEMD_UNIT")):
        return unit
    ident = _text(fields.get("SYSLOG_IDENTIFIER"))
    return f"{ident}.service" if ident else default


@dataclass(frozen=True, slots=True)
class Replayed:
    unit: str
    engine: str
    state: UnitState
    attempts: int
    timed: bool  # False when the log carried no time at all: durations are meaningless


def choose_engine(records: Iterable[str], candidates: Iterable[Grammar]) -> tuple[str, int]:
    """The engine whose phase markers match most of these records, and how many did."""
    best, best_score = "generic", 0
    records = list(records)
    raw = [record.encode("utf-8", "surrogatepass") for record in records]
    for grammar in candidates:
        maybe = grammar.screen.which_may_match(raw)  # one scan of them all rules out most records at once
        score = sum(1 for at in maybe if (m := grammars.match(grammar, records[at])) and m.phase is not None)
        if score > best_score:
            best, best_score = grammar.engine, score
    return best, best_score


class _Unit:
    """One unit's fold; its first records wait in `pending` until the engine is chosen."""

    def __init__(self, unit: str, engine: str | None, score: int = 0) -> None:
        self.unit, self.engine, self.score = unit, engine, score
        self.pending: list[Observation] = []
        self.records = 0  # log records in `pending`: the engine is chosen from the first SNIFF
        self.state = UnitState(unit, engine or "")
        self.attempts = 0


class Replay:
    """The fold of a whole saved log, unit by unit.

    `chosen`: engines (and their scores) already chosen for some units from their first SNIFF
    records, by a reader that saw those records before it skimmed the rest (exporter.sources.journal_skim).
    """

    def __init__(self, engine: str | None, limits: Limits, default_unit: str = "", only: Iterable[str] = (),
                 chosen: Mapping[str, tuple[str, int]] | None = None) -> None:
        self.forced = engine
        self.chosen = chosen or {}
        self.limits = limits
        self.default_unit = default_unit
        self.only = frozenset(only)
        self.grammars = grammars.load_all()
        self.units: dict[str, _Unit] = {}
        self.t: float | None = None
        self.lines = 0
        self.timed = False

    def feed(self, entries: Iterable[tuple[float | None, Fields]]) -> None:
        for t, fields in entries:
            self.lines += 1
            if t is not None:
                self.t, self.timed = t, True
            # a line without a time happened after the one before it; a log with no time at all
            # gets its line numbers as times, so that the order still holds
            now = self.t if self.t is not None else float(self.lines)
            unit = unit_of(fields, self.default_unit)
            if unit and not fields.get("_SYSTEMD_UNIT"):
                fields = {**fields, "_SYSTEMD_UNIT": unit}  # a short-format line: named by its identifier
            unit = unit or _text(fields.get("UNIT"))  # PID 1 speaking about a unit
            if not unit or (self.only and unit not in self.only):
                continue
            for obs in to_observations(fields, now, frozenset({unit})):
                if isinstance(obs, (LogLine, Lifecycle)):  # no process side and no GPUs in a saved log
                    self._fold(self.units.get(unit) or self._new(unit), obs)

    def _new(self, unit: str) -> _Unit:
        engine, score = (self.forced, 0) if self.forced else self.chosen.get(unit, (None, 0))
        new = self.units[unit] = _Unit(unit, engine, score)
        return new

    def _fold(self, unit: _Unit, obs: Observation) -> None:
        if unit.engine is not None:
            self._advance(unit, obs)
            return
        unit.pending.append(obs)
        unit.records += isinstance(obs, LogLine)
        if unit.records >= SNIFF:
            self._choose(unit)

    def _choose(self, unit: _Unit) -> None:
        texts = [o.text for o in unit.pending if isinstance(o, LogLine)]
        unit.engine, unit.score = choose_engine(texts, self.grammars.values())
        unit.state = UnitState(unit.unit, unit.engine)
        pending, unit.pending = unit.pending, []
        for obs in pending:
            self._advance(unit, obs)

    def _advance(self, unit: _Unit, obs: Observation) -> None:
        assert unit.engine is not None
        before = unit.state.attempt
        unit.state = advance(unit.state, obs, self.grammars[unit.engine], self.limits)
        if unit.state.attempt is not before and (before is None or unit.state.attempt.started != before.started):
            unit.attempts += 1

    def results(self) -> list[Replayed]:
        """Every unit that looks like a model server (or was asked for), in name order."""
        out = []
        for unit in sorted(self.units.values(), key=lambda u: u.unit):
            if unit.engine is None:
                self._choose(unit)
            asked = unit.unit in self.only or unit.unit == self.default_unit or self.forced
            if unit.state.attempt is None or not (asked or unit.score or unit.state.phase_durations):
                continue
            out.append(Replayed(unit.unit, unit.engine or "generic", unit.state, unit.attempts, self.timed))
        return out


# ---- what replay prints ----


def outcome(attempt: Attempt) -> str:
    """ready, failed, stopped, or incomplete when the log ends without a word of either.

    A log that ends on a failure marker (a traceback, a CUDA OOM) has failed even though the
    process's exit is not in it: that is what people paste into an issue.
    """
    if attempt.outcome is not None:
        return str(attempt.outcome)
    return str(Outcome.FAILED) if attempt.reason is not None else "incomplete"


def document(result: Replayed) -> dict[str, Any]:
    state, attempt = result.state, result.state.attempt
    assert attempt is not None
    # a log that ends mid-start: its last phase lasted until the last line
    end = attempt.ended if attempt.ended is not None else max(state.last_log or 0.0, attempt.phase_since)
    phases = timeline(attempt, end, None)
    if not result.timed:
        for span in phases:
            span["start"] = span["duration_seconds"] = None
    return {
        "unit": result.unit,
        "engine": result.engine,
        "engine_version": state.info.get("engine_version"),
        "model": state.info.get("model"),
        "outcome": outcome(attempt),
        "last_phase": str(attempt.last_startup_phase or attempt.phase),
        "failure_reason": str(attempt.reason) if attempt.reason and outcome(attempt) == "failed" else None,
        "startup_seconds": round(attempt.startup_end(end) - attempt.started, 3) if result.timed else None,
        "attempts": result.attempts,
        "phases": phases,
        "values": dict(state.values),
        "silent_gaps": gaps(attempt, None) if result.timed else [],
    }


def text(result: Replayed) -> Iterator[str]:
    doc = document(result)
    about = ", ".join(x for x in (doc["engine"], doc["engine_version"], doc["model"]) if x)
    verdict = doc["outcome"]
    if doc["failure_reason"]:
        verdict += f" ({doc['failure_reason']}) in {doc['last_phase']}"
    elif verdict == "incomplete":
        verdict += f": the log ends in {doc['last_phase']}"
    took = f" after {duration(doc['startup_seconds'])}" if doc["startup_seconds"] is not None else ""
    tries = f"  [start {doc['attempts']} of {doc['attempts']} in this log]" if doc["attempts"] > 1 else ""
    yield f"{doc['unit']} ({about}): {verdict}{took}{tries}"
    for span in doc["phases"]:
        start = (span["start"] or "")[11:23]
        took = duration(span["duration_seconds"]) if span["duration_seconds"] is not None else ""
        yield f"  {start:12}  {span['phase']:<26}{took:>8}"
    for gap in doc["silent_gaps"]:
        yield f"  silent {duration(gap['duration_seconds'])} in {gap['phase']} from {gap['start'][11:19]}"
    if doc["values"]:
        shown = ", ".join(
            f"{k} {size(v) if k.endswith('_bytes') else f'{v:g}'}" for k, v in sorted(doc["values"].items())
        )
        yield f"  values: {shown}"
