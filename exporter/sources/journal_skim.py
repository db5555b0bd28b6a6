"""A journal file for replay, read in parallel slices that skip what no fold could notice.

Most of a big journal is a model server serving: lines no grammar rule matches, a few milliseconds
apart, of a start long settled. The fold's only use for such a line is its time (a silence ends
there) — and only the line just before one that matters, or before a silence, says anything. So
each slice reader hands over:

- every entry it cannot vouch for (PID 1's, a unit's line without an invocation id, journald's own),
  whole, as `read_journal_file` would;
- of each unit's lines: any that might match a rule of any engine (exporter.core.screen, on the raw
  bytes), the first of a new invocation, the first after a silence, the first after PID 1 spoke of
  the unit, the first and last of the slice, and the one just before each of these;

and drops the rest. Replay then folds what is handed over exactly as it folds the whole journal;
tests/test_journal_skim.py checks that the two give the same documents.

The slices are realtime ranges read by a pool of forked processes, while the parent folds those
already read. Each says on which entry it began and on which it stopped; from the first that does
not begin where the one before it stopped (a clock that went back), the rest of the file is read
whole and in order instead.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from systemd import journal

from exporter.core import grammar as grammars
from exporter.core.entries import to_observations
from exporter.core.lines import MAX_RECORD, blank, clean_records
from exporter.core.model import LogLine
from exporter.core.replay import SNIFF, choose_engine, unit_of
from exporter.core.screen import AnyOf, Screen
from exporter.sources.journal import fields_of
from exporter.sources.journal_file import _failed, _open, read_journal_file

Entry = tuple[float, dict[str, bytes]]
# Units whose entries are not all their own lines: PID 1 (init.scope) speaks of other units, and
# journald's include its notices. Their entries are handed over whole.
WHOLE = frozenset({b"init.scope", b"systemd-journald.service"})
SLICES_PER_WORKER = 4  # short slices even out the work, and the fold of the last one is short
PARALLEL_FROM = 16 * 2**20  # bytes of journal: below, forking costs more than it saves


@dataclass(frozen=True)
class Plan:
    """What a slice reader needs to know."""

    path: Path
    owners: Mapping[bytes, bytes]  # invocation id → its unit, for the units read line by line
    silence: int  # µs: a gap this long is a silence the fold records
    only: frozenset[bytes] = frozenset()  # when given, every other unit's lines are dropped


@dataclass
class Slice:
    entries: list[Entry] = field(default_factory=list)
    start: str | None = None  # cursor of the first entry at or after the slice's start; None: none
    stop: str | None = None  # cursor of the first entry past its end; None: it read to the end


class _Line:
    """A unit's last line in the slice, and whether its next line must be handed over."""

    __slots__ = ("held", "invocation", "kept", "t", "unit")

    def __init__(self, unit: bytes) -> None:
        self.unit = unit
        self.t = 0
        # None: the next line is handed over, whatever it is: the unit's first in the slice, or the
        # first since PID 1 spoke of it (what the fold compares a line with has changed)
        self.invocation: bytes | None = None
        self.held: Candidate | None = None  # its last line, dropped unless the next one is handed over
        # the last line held and handed over (one no rule could match: it surely moved the last-log time): a line
        # a silence after it hands over the one held, so that the lines handed over lie a silence apart only
        # where the fold records one (exporter.sources.journal_catchup's skim, which says why, does the same)
        self.kept = 0


# A line no rule but the screen's could keep: its unit's _Line, realtime µs, invocation, MESSAGE.
Candidate = tuple[_Line, int, bytes, bytes]
BATCH = 256  # candidates screened at once: one scan of them all instead of a call each


class _Unreliable(Exception):
    """The file breaks an assumption the skim rests on: read the rest of it in order instead."""


@functools.cache
def _screen() -> AnyOf:
    """Whether a line might matter to a fold beyond its time (grammar.worth_folding): a unit's engine is chosen
    before the skim."""
    return AnyOf(grammars.worth_folding())


def read_slice(plan: Plan, since: int | None, until: int | None) -> Slice:
    """The entries of [since, until) (realtime µs; None: the file's start or end) worth handing over."""
    reader = _open(plan.path)
    try:
        if since is None:
            reader.seek_head()
        else:
            journal._Reader.seek_realtime(reader, since)  # µs, not the subclass's seconds
        return _skim(reader, plan, END if until is None else until)
    except OSError as err:
        raise _failed(plan.path, err) from err
    finally:
        reader.close()


END = 2**64  # past any realtime


def _skim(reader: journal.Reader, plan: Plan, until: int) -> Slice:
    out = Slice()
    kept = out.entries
    units = {unit: _Line(unit) for unit in set(plan.owners.values()) if not plan.only or unit in plan.only}
    lines = {invocation: units[unit] for invocation, unit in plan.owners.items() if unit in units}
    pending: list[Candidate] = []  # screened a batch at a time: see _screen_pending
    owners, silence, longest, batch = plan.owners, plan.silence, MAX_RECORD, BATCH
    next_, get, realtime, hold = reader._next, reader._get, reader._get_realtime, pending.append
    start = None

    while next_():  # every entry of the file passes here: one lookup, then the cheap tests first
        t = realtime()
        if start is None:
            start = out.start = reader._get_cursor()
        if t >= until:
            out.stop = reader._get_cursor()
            break
        try:
            invocation = get("_SYSTEMD_INVOCATION_ID")
        except KeyError:  # PID 1, journald, the kernel, a line without an invocation id
            invocation = None
        line = lines.get(invocation)
        if line is None:
            if invocation not in owners:  # not one of the units read line by line
                _screen_pending(pending, kept, silence)
                _whole(reader, t, units, kept)
            continue  # else a unit not asked for
        try:
            message = get("MESSAGE")
        except KeyError:  # no MESSAGE, no line
            continue
        # handed over whatever the screen says: a new invocation (or the unit's first line, or the first
        # since PID 1 spoke of it), the first after a silence, and a message longer than a record
        if invocation != line.invocation or t - line.t >= silence or len(message) > longest:
            _screen_pending(pending, kept, silence)
            fields = fields_of(reader)
            if fields.get("_SYSTEMD_UNIT") != line.unit:
                raise _Unreliable(f"invocation {invocation!r} is not only {line.unit!r}'s")
            _hand_over(line, (t / 1e6, fields), kept)
            if clean_records(message):  # no record, no line: the fold sees nothing
                line.t, line.invocation = t, invocation
        elif not b"!" <= message[:1] <= b"~" and blank(message):  # a printable first byte: a record
            continue
        else:  # the same invocation as the line before: only the time moves
            hold((line, t, invocation, message))
            line.t = t
            if len(pending) == batch:
                _screen_pending(pending, kept, silence)
    _screen_pending(pending, kept, silence)
    kept += [_entry(line.held) for line in units.values() if line.held is not None]
    return out


def _screen_pending(pending: list[Candidate], kept: list[Entry], silence: int) -> None:
    """Screen the candidates (exporter.core.screen, on the raw bytes): hand over those that might match a
    rule of any engine, each after its unit's line held before it; the rest are held in turn, the one held
    handed over once a line comes a silence after its unit's last line held and handed over (`_Line.kept`).
    Done before anything else is handed over, so that what is handed over stays in order."""
    if not pending:
        return
    passing = _screen().which_may_match([candidate[3] for candidate in pending])  # their MESSAGEs
    for at, candidate in enumerate(pending):
        line = candidate[0]
        if at in passing:
            _hand_over(line, _entry(candidate), kept)
            continue
        if candidate[1] - line.kept >= silence:
            _hand_over_held(line, kept)
        line.held = candidate
    pending.clear()


def _entry(candidate: Candidate) -> Entry:
    line, t, invocation, message = candidate
    return t / 1e6, {"_SYSTEMD_UNIT": line.unit, "MESSAGE": message, "_SYSTEMD_INVOCATION_ID": invocation}


def _hand_over(line: _Line | None, entry: Entry, kept: list[Entry]) -> None:
    """Hand over an entry, after the line held before it: the fold sees when the unit last spoke."""
    if line is not None:
        _hand_over_held(line, kept)
    kept.append(entry)


def _hand_over_held(line: _Line, kept: list[Entry]) -> None:
    if line.held is not None:
        kept.append(_entry(line.held))
        line.kept, line.held = line.held[1], None


def _whole(reader: journal.Reader, t: int, units: dict[bytes, _Line], kept: list[Entry]) -> None:
    """Hand over an entry the skim cannot vouch for; its unit's next line is handed over too."""
    if _raw(reader, "_TRANSPORT") == b"kernel":  # before reading it all: a GPU host's kernel says a lot
        return  # and replay has no use for it
    fields = fields_of(reader)
    subject = fields.get("UNIT") if fields.get("_PID") == b"1" else fields.get("_SYSTEMD_UNIT")
    line = units.get(subject) if isinstance(subject, bytes) else None
    if line is not None:
        line.invocation = None
    _hand_over(line, (t / 1e6, fields), kept)


# ---- the parent: plan, choose engines, run the slices ----


def _plan(path: Path, silence: float, only: frozenset[str]) -> tuple[Plan, list[int]]:
    """The plan, and the realtime bounds of the file's slices."""
    reader = _open(path)
    try:
        owners = {}
        for invocation in reader.query_unique("_SYSTEMD_INVOCATION_ID"):
            reader.flush_matches()
            reader.add_match(_SYSTEMD_INVOCATION_ID=invocation)
            reader.seek_head()
            if reader._next() and (unit := _raw(reader, "_SYSTEMD_UNIT")) and unit not in WHOLE:
                owners[invocation.encode()] = unit
        reader.flush_matches()
        reader.seek_head()
        first = reader._get_realtime() if reader._next() else 0
        reader.seek_tail()
        last = reader._get_realtime() if reader._previous() else 0
    finally:
        reader.close()
    size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*.journal*")))
    workers = len(os.sched_getaffinity(0)) if size >= PARALLEL_FROM else 1
    count = workers * SLICES_PER_WORKER if workers > 1 else 1
    bounds = [first + (last + 1 - first) * i // count for i in range(1, count)]
    return Plan(path, owners, int(silence * 1e6), frozenset(u.encode() for u in only)), bounds


def _raw(reader: journal.Reader, name: str) -> bytes | None:
    try:
        return reader._get(name)
    except KeyError:
        return None


@functools.cache
def _choice_screen() -> Screen:
    """Every rule, settings pattern and mention of every engine: what can count in an engine's choice."""
    loaded = list(grammars.load_all().values())
    mentions = [g.mentions for g in loaded if g.mentions is not None]
    return Screen([p for g in loaded for p in (*(r.pattern for r in g.rules), *g.settings)] + mentions, raw=True)


def choose_engines(path: Path, units: frozenset[bytes]) -> dict[str, tuple[str, int, int]]:
    """Each unit's engine, chosen from its first SNIFF records as replay.Replay chooses it."""
    loaded = list(grammars.load_all().values())
    may_count = _choice_screen().may_match
    chosen = {}
    reader = _open(path)
    try:
        for raw in sorted(units):
            unit = raw.decode("utf-8", "replace")
            reader.flush_matches()
            reader.add_match(_SYSTEMD_UNIT=raw)
            reader.seek_head()
            records: list[str] = []
            names: set[str] = set()
            while len(records) < SNIFF and reader._next():
                if ident := _raw(reader, "SYSLOG_IDENTIFIER"):
                    names.add(ident.decode("utf-8", "replace"))
                message = _raw(reader, "MESSAGE") or b""
                if len(message) <= MAX_RECORD and not may_count(message):
                    # no rule nor mention of any engine matches it, and with no \r nor colour it is one
                    # record (or none, blank): it counts towards SNIFF and scores nothing, unread
                    if not blank(message):
                        records.append("")
                    continue
                fields = fields_of(reader)
                if unit_of(fields, "") == unit:  # not PID 1's, which is about units, nor the kernel's
                    observed = to_observations(fields, 0.0, frozenset({unit}))
                    records += [o.text for o in observed if isinstance(o, LogLine)]
            chosen[unit] = choose_engine(records[:SNIFF], loaded, sorted(names))
    finally:
        reader.close()
    return chosen


def _quiet() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def skim(path: Path, silence: float, only: frozenset[str] = frozenset(),
         forced: str | None = None) -> tuple[dict[str, tuple[str, int, int]], Iterator[Entry]]:
    """(the engine chosen for each unit read line by line, the entries worth folding, in order).

    The entries come as the slices are read: the caller folds the first while the pool reads the
    rest. `silence`: seconds of quiet the fold records as a gap. OSError as `read_journal_file`
    raises it.
    """
    plan, bounds = _plan(path, silence, only)
    units = frozenset(plan.owners.values())
    ranges = list(zip([None, *bounds], [*bounds, None]))
    if len(ranges) == 1:
        chosen = {} if forced else choose_engines(path, units)
        return chosen, _in_order(path, (read_slice(plan, since, until) for since, until in ranges))
    _screen()  # built before the fork, and each grammar's (the fold's and choose_engines'): every worker inherits them
    for loaded in grammars.load_all().values():
        loaded.screen, loaded.own_screen  # noqa: B018
    pool = ProcessPoolExecutor(min(len(ranges), len(os.sched_getaffinity(0))), get_context("fork"),
                               initializer=_quiet)
    try:
        engines = None if forced else pool.submit(choose_engines, path, units)  # first: the fold waits for it
        pieces = [pool.submit(read_slice, plan, since, until) for since, until in ranges]
        chosen = engines.result() if engines else {}
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise
    return chosen, _in_order(path, _finished(pool, pieces))


def _finished(pool: ProcessPoolExecutor, pieces: list[Future[Slice]]) -> Generator[Slice, None, None]:
    """Each slice once it is read, in order; the pool is shut down when the caller is done."""
    try:
        for piece in pieces:
            yield piece.result()
    finally:
        pool.shutdown(cancel_futures=True)


def _in_order(path: Path, slices: Generator[Slice, None, None]) -> Iterator[Entry]:
    """The slices' entries, while each slice starts where the one before it stopped; from the first
    that does not (a clock that went back), or that cannot vouch for its lines' units, the rest of
    the file is read whole and in order."""
    last: Slice | None = None
    try:
        for piece in slices:
            if last is not None and piece.start != last.stop:
                break
            yield from piece.entries
            last = piece
    except _Unreliable:
        pass
    slices.close()  # the slices still being read are no use now
    if last is None:
        yield from read_journal_file(path)
    elif last.stop is not None:  # None: the last slice read to the end of the file
        yield from read_journal_file(path, last.stop)
