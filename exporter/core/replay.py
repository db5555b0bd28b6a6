"""`replay`: the same core fed from a saved log; each unit's last start as a timeline with its outcome.

Pure: it takes (time, journal-like fields) pairs from exporter.core.formats.read or a journal file and folds them
through `tracker.advance`, exactly as the agent folds the live journal, minus the process side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter.core import grammar as grammars
from exporter.core.entries import container_name, field_text, to_observations
from exporter.core.formats.terminal import COMMAND
from exporter.core.grammar import Grammar
from exporter.core.model import (
    Attempt,
    Event,
    Lifecycle,
    Limits,
    LogLine,
    Observation,
    Phase,
    UnitState,
)
from exporter.core.tracker import advance

Fields = Mapping[str, Any]
SNIFF = 500  # records of a unit read before its engine is chosen from them


WORD = re.compile(r"[a-z0-9]+")
UNDESCRIBED = 16  # description-only job lines kept until a unit they describe appears
# What runs an engine for a unit and names its lines in a short format in the unit's stead (ExecStart=/usr/bin/env …,
# python3.12 -m vllm …, a wrapper script, `docker run` in the foreground): its lines are those of the unit PID 1
# then speaks of.
LAUNCHER = re.compile(r"env|sh|bash|dash|python[\d.]*|uv|[\w.-]+\.sh|docker|podman|nerdctl")


def _launcher(unit: str) -> bool:
    return bool(LAUNCHER.fullmatch(unit.removesuffix(".service")))


def _described_only(fields: Fields) -> bool:
    """A job line of PID 1 that names no unit, only a description (`Started Ollama Service.`)."""
    return field_text(fields.get("_PID")) == "1" and bool(fields.get("MESSAGE_ID")) and not fields.get("UNIT")


def unit_of(fields: Fields, default: str) -> str:
    """The unit a line belongs to: the container a runtime's journald log driver names, else journald's
    _SYSTEMD_UNIT, else the syslog identifier of a short-format
    line (as `<identifier>.service`, which is what PID 1's lines call it), else the default.

    "" for PID 1 (its lines are about the unit in their UNIT field; journald files them under
    init.scope) and for the kernel.
    """
    if field_text(fields.get("_PID")) == "1" or field_text(fields.get("_TRANSPORT")) == "kernel":
        return ""
    if unit := container_name(fields) or field_text(fields.get("_SYSTEMD_UNIT")):
        return unit
    ident = field_text(fields.get("SYSLOG_IDENTIFIER"))
    return f"{ident}.service" if ident else default


@dataclass(frozen=True, slots=True)
class Replayed:
    unit: str
    engine: str
    state: UnitState
    attempts: int
    timed: bool  # False when the log carried no time at all: durations are meaningless
    from_start: bool = True  # False: the log begins after the start did (an excerpt, a cut journal)
    earlier: tuple[Attempt, ...] = ()  # the starts before the last, each as it ended
    basis: str = "engine_rules"  # what the reading rests on: report.BASES


def choose_engine(records: Iterable[str], candidates: Iterable[Grammar], names: Iterable[str] = ()) -> tuple[str, int, int]:
    """The engine these records show the most evidence of, how many of its markers they hold, and how many of them
    (or the names) mention it.

    Evidence is a record the engine's own rules read as a marker (a phase, a failure, readiness, a stop; the shared
    vocabulary's markers are every engine's, and no evidence of any), a pasted shell command
    that runs the engine (its `commands`: the start itself, in a paste that shows nothing after it yet), and
    a record or a name (a syslog identifier, a compose service) that mentions the engine. An engine that runs
    another inside it (Ollama runs llama.cpp, Triton runs vLLM) takes that one's evidence too, when
    the log names it; unnamed, the lines are the inner engine's. Ties go to the first in grammar.ENGINES.
    """
    records, names, candidates = list(records), list(names), list(candidates)
    raw = [record.encode("utf-8", "surrogatepass") for record in records]
    commanded = [text for text, line in zip(records, raw) if COMMAND.match(line)]
    markers, said, evidence = {}, {}, {}
    for grammar in candidates:
        maybe = grammar.own_screen.which_may_match(raw)  # one scan of them all rules out most records at once
        found = [m for at in sorted(maybe) if (m := grammars.match(grammar, records[at], own=True))]
        marked = sum(1 for m in found if m.phase is not None or m.reason is not None or m.stops)
        launched = sum(1 for text in commanded if any(c.search(text) for c in grammar.commands))
        markers[grammar.engine] = marked + launched
        said[grammar.engine] = sum(1 for text in (*names, *records) if grammar.mentions and grammar.mentions.search(text))
        evidence[grammar.engine] = markers[grammar.engine] + said[grammar.engine]
    for grammar in candidates:
        if grammar.embeds:  # named, it takes the inner engine's evidence; unnamed, it keeps only what is its own
            inner = sum(evidence.get(engine, 0) for engine in grammar.embeds)
            theirs = sum(markers.get(engine, 0) for engine in grammar.embeds)
            own = evidence[grammar.engine]
            evidence[grammar.engine] = own + inner if said[grammar.engine] else max(0, own - theirs)
    best = max(candidates, key=lambda g: evidence[g.engine], default=None)
    if best is None or not evidence[best.engine]:
        return "generic", 0, 0
    return best.engine, markers[best.engine] + sum(markers.get(inner, 0) for inner in best.embeds), said[best.engine]


class _Unit:
    """One unit's fold; its first records wait in `pending` until the engine is chosen."""

    def __init__(self, unit: str, engine: str | None, score: int = 0, said: int = 0) -> None:
        self.unit, self.engine, self.score, self.said = unit, engine, score, said
        self.pending: list[Observation] = []
        self.records = 0  # log records in `pending`: the engine is chosen from the first SNIFF
        self.names: set[str] = set()  # what the log calls the unit's process: syslog identifiers
        self.state = UnitState(unit, engine or "")
        self.attempts = 0
        self.earlier: list[Attempt] = []  # the starts before the current one, each as it ended
        self.from_start: bool | None = None  # for the current attempt, once its first marker is seen
        self.marks = [0, 0]  # the current attempt's markers read by the engine's own rules, and by the vocabulary
        self.placed = False  # the vocabulary read the marker that moved the current attempt to its last phase
        self.pid1 = False  # PID 1 spoke of it: its name is systemd's


class Replay:
    """The fold of a whole saved log, unit by unit.

    `chosen`: engines (and their evidence, as choose_engine gives them) already chosen for some units from their
    first SNIFF records, by a reader that saw those records before it skimmed the rest (exporter.sources.journal_skim).

    Times that cannot lie: a line without a time of its own takes the time of the last line before it
    that has one, else of the first after it; nothing is dated before the log's first time (a `\r` bar
    dates its redraws back by their elapsed field), so that no phase, gap or start outlasts the log.
    """

    def __init__(self, engine: str | None, limits: Limits, default_unit: str = "", only: Iterable[str] = (),
                 chosen: Mapping[str, tuple[str, int, int]] | None = None) -> None:
        self.forced = engine
        self.chosen = chosen or {}
        self.limits = limits
        self.default_unit = default_unit
        self.only = frozenset(only)
        self.grammars = grammars.load_all()
        self.units: dict[str, _Unit] = {}
        self.t: float | None = None  # the last time a line carried
        self.first: float | None = None  # the log's first time
        self.untimed: list[Fields] = []  # lines before the first time, waiting for it
        # PID 1's job lines naming only a description before any unit they could be about (a paste's first
        # `Started Ollama Service.`), waiting for one; a few: a whole host's journal has many for other units
        self.undescribed: list[tuple[float, Fields]] = []
        self.launched: dict[str, str] = {}  # a launcher's name → the unit PID 1 speaks of
        self.lines = 0
        self.timed = False

    def feed(self, entries: Iterable[tuple[float | None, Fields]]) -> None:
        for t, fields in entries:
            self.lines += 1
            if t is None and self.t is None:
                self.untimed.append(fields)
                continue
            if t is not None:
                if self.t is None:
                    self.first = t
                    self.timed = True
                    self._release(t)
                self.t = t
            self._entry(self.t, fields)

    def _release(self, t: float | None) -> None:
        """The lines that came before the log's first time: at that time, or at their line numbers
        (which keep their order) in a log without any."""
        for number, fields in enumerate(self.untimed, 1):
            self._entry(t if t is not None else float(number), fields)
        self.untimed = []

    def _entry(self, now: float, fields: Fields) -> None:
        own = unit_of(fields, self.default_unit)
        if own and not fields.get("_SYSTEMD_UNIT"):
            own = self.launched.get(own) or self._launching(own) or own
            fields = {**fields, "_SYSTEMD_UNIT": own}  # a short-format line: named by its identifier
        unit = own or field_text(fields.get("UNIT"))  # PID 1 speaking about a unit
        if not unit and _described_only(fields):
            if not (unit := self._described(fields)):
                self.undescribed = [*self.undescribed[-(UNDESCRIBED - 1) :], (now, fields)]
                return
            fields = {**fields, "UNIT": unit}
        if not unit or (self.only and unit not in self.only):
            return
        if not own and unit not in self.units:
            self._adopt(unit)
        known = self.units.get(unit) or self._new(unit)
        if own and (ident := field_text(fields.get("SYSLOG_IDENTIFIER"))):
            known.names.add(ident)
        for obs in to_observations(fields, now, frozenset({unit})):
            if isinstance(obs, (LogLine, Lifecycle)):  # no process side and no GPUs in a saved log
                known.pid1 |= isinstance(obs, Lifecycle)
                if self.first is not None and obs.t < self.first:  # a bar dated back past the log's start
                    obs = replace(obs, t=self.first)
                self._fold(known, obs)

    def _described(self, fields: Fields) -> str:
        """The unit a job line of PID 1 that names only a description is about ("Started Ollama Service.": older
        systemd, and every unit without the `unit - ` form): the one unit of the log so far whose name's first
        word is a word of the description, if there is exactly one."""
        words = set(WORD.findall(field_text(fields.get("MESSAGE")).lower()))
        about = [u for u in self.units if (first := WORD.match(u.lower())) and first.group() in words]
        return about[0] if len(about) == 1 else ""

    def _adopt(self, unit: str) -> None:
        """PID 1 speaks of `unit` for the first time: the one unit so far named after a launcher, and not spoken of
        by PID 1, is this one (`journalctl -u vllm` of a unit that runs `env python3 -m vllm …`)."""
        launched = [u for u in self.units.values() if _launcher(u.unit) and not u.pid1]
        if len(launched) != 1 or not unit.endswith(".service"):
            return
        [adopted] = launched
        del self.units[adopted.unit]
        self.launched[adopted.unit] = unit
        adopted.unit, adopted.state = unit, replace(adopted.state, unit=unit)
        self.units[unit] = adopted

    def _launching(self, name: str) -> str:
        """The unit a launcher's first line is of: the one unit PID 1 has spoken of so far."""
        if name in self.units or not _launcher(name):
            return ""
        spoken = [u.unit for u in self.units.values() if u.pid1]
        if len(spoken) != 1 or not spoken[0].endswith(".service"):
            return ""
        self.launched[name] = spoken[0]
        return spoken[0]

    def _new(self, unit: str) -> _Unit:
        new = self.units[unit] = _Unit(unit, *((self.forced,) if self.forced else self.chosen.get(unit, (None,))))
        waiting, self.undescribed = self.undescribed, []
        for now, fields in waiting:  # those about it come first: they came first
            self._entry(now, fields)
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
        unit.engine, unit.score, unit.said = choose_engine(texts, self.grammars.values(), self._names(unit))
        unit.state = UnitState(unit.unit, unit.engine)
        pending, unit.pending = unit.pending, []
        for obs in pending:
            self._advance(unit, obs)

    def _advance(self, unit: _Unit, obs: Observation) -> None:
        assert unit.engine is not None
        before = unit.state.attempt
        grammar = self.grammars[unit.engine]
        unit.state = advance(unit.state, obs, grammar, self.limits)
        after = unit.state.attempt
        if after is not before and (before is None or after.started != before.started):
            unit.attempts += 1
            unit.from_start, unit.marks, unit.placed = None, [0, 0], False
            if before is not None and unit.state.previous is not None:
                unit.earlier.append(unit.state.previous)
        if isinstance(obs, Lifecycle):
            if unit.from_start is None:  # the attempt's first word says whether the log holds its start
                unit.from_start = obs.event is Event.STARTED
        # the lines until the attempt's first own marker, and those that moved it: what the report rests on (basis)
        elif (not unit.marks[0] or _moves(before) != _moves(after)) and (found := grammars.match(grammar, obs.text)):
            if found.phase or found.reason or found.stops:
                unit.marks[found.shared] += 1
                if before is not None and after is not None and after.last_startup_phase is not before.last_startup_phase:
                    unit.placed = found.shared
            if unit.from_start is None and (found.phase or found.reason) and not found.shared:
                unit.from_start = found.phase is Phase.LAUNCHING  # the start's first own marker: is the start here

    @staticmethod
    def _names(unit: _Unit) -> list[str]:
        """What the log calls the unit: its processes' identifiers, and, where PID 1 speaks of it, its systemd
        name, which the operator may have called after its engine (ollama.service); not a name after the file."""
        return [*sorted(unit.names), *([unit.unit] if unit.pid1 else [])]

    def results(self) -> list[Replayed]:
        """Every unit that looks like a model server (or was asked for), in name order: those its engine's rules
        read; in a log with none, those that name an engine; in a log with neither, those the shared vocabulary read
        a phase or a failure in. A log that names no engine and shows no phase word has none."""
        self._release(None)  # a log without any time: its lines in their order, durations unknown
        tiers: tuple[list[Replayed], ...] = ([], [], [])
        for unit in sorted(self.units.values(), key=lambda u: u.unit):
            if unit.engine is None:
                self._choose(unit)
            asked = unit.unit in self.only or unit.unit == self.default_unit or self.forced
            # a unit PID 1 speaks of, called after its engine or whose processes are: where PID 1's lines may be all
            # there is (a restart loop, a command never run, a status's head)
            mentions = self.grammars[unit.engine or "generic"].mentions
            named = unit.pid1 and mentions is not None and any(mentions.search(name) for name in self._names(unit))
            if unit.state.attempt is None:
                continue
            own, shared = unit.marks
            ruled = own and unit.engine != "generic" and not unit.placed
            basis = "engine_rules" if ruled else "vocabulary" if own or shared else "engine_name"
            found = Replayed(unit.unit, unit.engine or "generic", unit.state, unit.attempts, self.timed,
                             unit.from_start is not False, tuple(unit.earlier), basis)
            if asked or unit.score or named or own:
                tiers[0].append(found)
            elif unit.said or shared or unit.state.phase_durations:
                tiers[1 if unit.said else 2].append(found)
        return next((tier for tier in tiers if tier), [])


def _moves(attempt: Attempt | None) -> tuple[object, ...]:
    """What a line that moves a start changes: its phase, its cause (a bar's redraw only moves its progress)."""
    return (attempt.phase, attempt.reason) if attempt else ()
