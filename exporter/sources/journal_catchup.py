"""A newly watched unit's lines of this boot, read as its fold needs them: the agent's first start on a host.

The agent's first start on a host (a new install, a lost state file, a fleet's rollout) must know each
watched unit's starts of this boot before it serves, and most of a unit's lines are a model server
serving: lines no rule of any engine could match, milliseconds apart, that tell the fold only when the
unit last spoke. So, for each unit:

- its starts are found from its last line back, with journal matches: the invocation of its last line
  before the live reader's position, where that invocation's lines begin (`_SYSTEMD_INVOCATION_ID`
  matched), the invocation of the line before that, … back to the boot's first; a few seeks per start;
- each start's lines are read through a match on its invocation alone, so that no line's invocation
  need be fetched: a line costs the journal's `next`, its MESSAGE and its time. Each chunk of them is
  checked, on a thread, against the unit's own match (`next_skip` over the same span lands on the same
  entry only when no line of another invocation, or of none, lies in it); from a chunk that fails, the
  rest is read whole;
- of the lines, only those the fold can notice are handed over (replay's skim, exporter.sources.
  journal_skim, does the same): any that might match a rule of any engine (`grammar.worth_folding`,
  screened a batch at a time), the first of each start and the first after PID 1 or journald spoke of
  the unit, a message longer than a record, and of the others the last before each of these, before the
  end, and before a line that comes a silence after the last one handed over (_Skim says why that is
  all); tests/test_journal_catchup.py checks that the fold comes out as a whole read's;
- PID 1's and journald's entries about the unit are read whole, through their own match, and handed
  over among the lines where their time puts them (before a line of the same microsecond).

A container's lines (the journald log driver's CONTAINER_NAME) are all its own, with no start to find
by invocation: they are read through their match in one piece. A journal that breaks what the walk
rests on (a line without an invocation, a name that is both a unit and a container) is read whole, every
entry made into observations, as it always was. The reader child runs all this in a process forked for it
(exporter.sources.journal_child), which gives back at its end what the reading took.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.core.entries import CONTAINER_LOGGERS, log_lines, to_observations
from exporter.core.lines import MAX_RECORD, blank
from exporter.core.model import Observation, XidError
from exporter.core.screen import AnyOf
from exporter.sources.journal import BATCH, JournalPlace, fields_of, this_boot

if TYPE_CHECKING:
    from systemd._reader import _Reader

CHUNK = 8192  # lines read through an invocation's match between two checks against the unit's own
SCREENED = 256  # lines screened at once: one scan of them all instead of a call each
PENDING = 16  # segments read ahead of their checks, at most: what they hand over waits in memory
SPAWN_TEXT = b"Failed at step"  # entries.SPAWN: the one line of a unit whose other fields (MESSAGE_ID) count
NEVER = 2**64  # µs: after any time

Observed = list[Observation | XidError]
Send = Callable[[str, object], None]
Held = tuple[int, bytes, str]  # a line dropped: its time (µs), MESSAGE and invocation
State = tuple[int, Held | None, int]  # a skim's, between two lines: mark, held, kept (_Skim)


@dataclass(frozen=True, slots=True)
class Run:
    """One invocation's lines: from its first to its last before the next invocation's first line (or
    before where the live reader stands)."""

    invocation: str  # "" for a container's lines, which carry its runtime's invocation, not its own
    first: str  # cursor
    last: str  # cursor
    last_t: int  # its monotonic µs


class Checked(Exception):
    """A check of an invocation's lines against the unit's found a line of another: read whole from `after`."""

    def __init__(self, after: str) -> None:
        super().__init__(after)
        self.after = after


def _last_before(reader: _Reader, until: str) -> tuple[str, int] | None:
    """The cursor and time of the reader's last entry at or before the entry `until` (in the journal's order)."""
    reader.seek_cursor(until)
    if not reader._previous():  # after a seek to a cursor, the entry itself if it matches
        return None
    return reader._get_cursor(), reader._get_monotonic()[0]


def _match(reader: _Reader, *groups: tuple[str, ...]) -> None:
    """Read only this boot's entries that match one of the groups, each of "FIELD=value" terms (all of its
    fields must hold; two values of one field are either). The boot last: added first, it would bind only the
    first group (sd_journal_add_match(3))."""
    reader.flush_matches()
    for group in groups:
        for term in group:
            reader.add_match(term)
        reader.add_disjunction()
    reader.add_conjunction()
    this_boot(reader)


def _invocation(reader: _Reader) -> str:
    try:
        return reader._get("_SYSTEMD_INVOCATION_ID").decode("ascii", "replace")
    except KeyError:
        return ""


class CatchUp:
    """Reads newly watched units' lines of this boot up to where the live reader stands (`until`), and
    hands over, through `send` ("lines", (observations, None)), what their folds can notice."""

    def __init__(self, place: JournalPlace, screen: bytes, silence: float, send: Send) -> None:
        self.place = place
        self.screen = AnyOf(screen)  # grammar.worth_folding()
        self.silence = int(silence * 1e6)  # µs: a gap this long is a silence the fold records
        self._send = send

    def read(self, unit: str, until: str | None) -> None:
        if until is None:  # the journal was empty when the live reader began: it reads everything
            return
        readers: list[_Reader] = []

        def opened(*groups: tuple[str, ...]) -> _Reader:
            reader = self.place.open()
            readers.append(reader)
            _match(reader, *groups)
            return reader

        try:
            own = opened((f"_SYSTEMD_UNIT={unit}",))
            # a container's output, from the journald log driver: CONTAINER_NAME is believed from the runtime only
            box = opened((f"CONTAINER_NAME={unit}", *(f"_COMM={name}" for name in sorted(CONTAINER_LOGGERS))))
            lines = opened()
            own_last, box_last = _last_before(own, until), _last_before(box, until)
            runs: list[Run] | None = []
            if own_last and box_last:
                runs = None
            elif box_last:
                box.seek_head()
                box._next()
                runs = [Run("", box._get_cursor(), *box_last)]
            elif own_last:
                runs = _walk(own, lines, unit, own_last)
            if runs is None:
                self._whole(lines, unit, until, None)
                return
            skim = _Skim(self, unit, self._others(lines, unit, until))
            checker = None if box_last else _Checker(self.place, unit)
            try:
                for run in runs:
                    if box_last:
                        skim.run(box, run, None)  # the match is the container's lines, all of them
                    else:
                        # the invocation alone: a start's id is its own (its unit's and boot's terms cost each
                        # `next` a fifth more); the check against the unit's match vouches for what it reads
                        lines.flush_matches()
                        lines.add_match(f"_SYSTEMD_INVOCATION_ID={run.invocation}")
                        skim.run(lines, run, checker)
                skim.end(checker)
            except Checked as failed:
                skim.give_up()  # what was checked, and the line before `after`; PID 1's come with the whole read
                self._whole(lines, unit, until, failed.after)
            finally:
                if checker is not None:
                    checker.close()
        finally:
            for reader in readers:
                reader.close()

    def _others(self, reader: _Reader, unit: str, until: str) -> list[tuple[int, Observed]]:
        """PID 1's entries about the unit (`UNIT=` is believed from PID 1 only) and journald's, up to `until`,
        with their times (µs), in the journal's order."""
        _match(reader, ("_PID=1", f"UNIT={unit}"), (f"OBJECT_SYSTEMD_UNIT={unit}",))  # journald's notices about it
        last = _last_before(reader, until)
        if last is None:
            return []
        reader.seek_head()
        marks = []
        units = frozenset({unit})
        while reader._next():
            t = reader._get_monotonic()[0]
            if observed := to_observations(fields_of(reader), t / 1e6, units):
                marks.append((t, observed))
            if t >= last[1] and reader.test_cursor(last[0]):
                break
        return marks

    def _whole(self, reader: _Reader, unit: str, until: str, after: str | None) -> None:
        """Every entry of the unit (its lines, PID 1's and journald's about it, a container's) after the entry
        `after` (or from the boot's first) up to `until`, each made into observations: what the skim's
        assumptions do not hold for."""
        _match(reader, (f"_SYSTEMD_UNIT={unit}",), ("_PID=1", f"UNIT={unit}"), (f"OBJECT_SYSTEMD_UNIT={unit}",),
               (f"CONTAINER_NAME={unit}",))
        last = _last_before(reader, until)
        if last is None:
            return
        if after is None:
            reader.seek_head()
        else:
            reader.seek_cursor(after)
            reader._next()  # on `after` itself: it was handed over
            if reader.test_cursor(last[0]):
                return
        units = frozenset({unit})
        batch: Observed = []
        while reader._next():
            t = reader._get_monotonic()[0]
            batch += to_observations(fields_of(reader), t / 1e6, units)
            if len(batch) >= BATCH:
                self._send("lines", (batch, None))
                batch = []
            if t >= last[1] and reader.test_cursor(last[0]):
                break
        self._send("lines", (batch, None))


def _walk(own: _Reader, probe: _Reader, unit: str, last: tuple[str, int]) -> list[Run] | None:
    """The unit's runs of one invocation, oldest first, from its last line (`last`, where `own` stands) back
    to the boot's first; None when a line has no invocation or an invocation comes back after another's."""
    runs = []
    seen = set()
    cursor, t = last
    while True:
        invocation = _invocation(own)
        if not invocation or invocation in seen:
            return None
        seen.add(invocation)
        _match(probe, (f"_SYSTEMD_UNIT={unit}", f"_SYSTEMD_INVOCATION_ID={invocation}"))
        probe.seek_head()
        probe._next()
        first = probe._get_cursor()
        runs.append(Run(invocation, first, cursor, t))
        own.seek_cursor(first)
        own._previous()  # on `first`
        if not own._previous():
            return runs[::-1]
        cursor, t = own._get_cursor(), own._get_monotonic()[0]


class _Skim:
    """One unit's lines, read run by run, of which only what the fold can notice is handed over.

    The fold's use of a line no rule matches is its time: it moves the last-log time on, and a line that comes a
    silence or more after the last-log time records the silence (tracker._silence_ends). So every line that
    might match a rule is handed over; of the others, the last is held, and handed over before the next line
    handed over, or once a line comes a silence or more after the last line handed over that surely moved
    the last-log time (`kept`: one no rule could match; a heartbeat rule's line does not move it). Then every
    line handed over meets the last-log time it meets in a whole read, or one that records the same silence
    (none); no line dropped comes a silence after the last-log time; and the last line is the last-log time.
    """

    def __init__(self, catchup: CatchUp, unit: str, marks: list[tuple[int, Observed]]) -> None:
        self.catchup = catchup
        self.unit = unit
        self.units = frozenset({unit})
        self.marks = marks  # PID 1's and journald's, to hand over among the lines
        self.mark = 0  # the next of them
        self.out: Observed = []  # what the lines read since the last segment ended hand over
        self.checked: Observed = []  # checked, sent a full batch at a time: a batch cut short says the catch-up ended
        self.held: Held | None = None  # the last line dropped, with its invocation
        self.kept = -NEVER  # µs of the last line handed over that surely moved the last-log time; -NEVER: the
        # next line is handed over
        self.invocation = ""
        # what was handed over, in segments queued until the chunk each ends is checked: (the chunk's first entry
        # or None, what the segment hands over, the state after it); checks run behind the reading
        self.segments: list[tuple[str | None, Observed, State]] = []
        self.before = self._state()  # the state after the last segment checked

    def run(self, reader: _Reader, run: Run, checker: _Checker | None) -> None:
        """The run's lines, a chunk at a time; each checked against the unit's own match (`checker`; None: the
        run's match is all of the unit's lines) before what it hands over is sent."""
        self.invocation = run.invocation
        reader.seek_cursor(run.first)
        reader._next()  # on `first`, which is the run's: it was found by the run's match
        t = reader._get_monotonic()[0]
        self._marks(t)
        self._whole(reader, t)
        self._segment(None, checker)
        start, count = run.first, 0
        times: list[int] = []
        messages: list[bytes] = []
        next_, get, monotonic = reader._next, reader._get, reader._get_monotonic
        add_time, add_message = times.append, messages.append
        last, last_t = run.last, run.last_t
        ended = reader.test_cursor(last)
        watch = min(last_t, self._marks_t())
        screened = 0 if ended else SCREENED
        while not ended:  # every line of a start passes here: a `next`, its time and its MESSAGE, nothing more
            if not next_():  # the run's last line is gone (vacuumed under us?): not what was walked
                self.out = []
                self._check(checker, wait=True)
                raise Checked(self._restore(self.before, start))
            t = monotonic()[0]
            if t >= watch:  # rarely: the run's last line, or PID 1 spoke
                if t >= last_t and reader.test_cursor(last):
                    ended, screened = True, 0
                if t >= self._marks_t():
                    count += len(messages)
                    self._screen(reader, times, messages, ahead=1)
                    self._marks(t)
                    watch = min(last_t, self._marks_t())
            try:
                add_message(get("MESSAGE"))
            except KeyError:  # no MESSAGE, no line: kept in step with the entries, as no record
                add_message(b"")
            add_time(t)
            if len(messages) >= screened:
                count += len(messages)
                self._screen(reader, times, messages, ahead=0)
                if count >= CHUNK or ended:
                    here = reader._get_cursor()
                    if checker is not None:
                        checker.ask(start, count, here)
                    self._segment(start, checker)
                    start, count = here, 0

    def end(self, checker: _Checker | None) -> None:
        """The last line, which is when the unit last spoke, and PID 1's words after it; once every chunk is
        checked, all of it sent."""
        self._hand_over_held()
        self._marks(NEVER)
        self._segment(None, checker)
        self._check(checker, wait=True)
        self._send(everything=True)

    def give_up(self) -> None:
        """Send what was checked, and the line held then: a whole read goes on after it."""
        self._hand_over_held()
        self.checked += self.out
        self.out = []
        self._send(everything=True)

    def _segment(self, first: str | None, checker: _Checker | None) -> None:
        """Queue what was handed over since the last segment: to be sent once the chunk that began at the entry
        `first` is checked (None: no chunk, nothing to check), after the segments before it."""
        self.segments.append((first if checker is not None else None, self.out, self._state()))
        self.out = []
        self._check(checker, wait=len(self.segments) > PENDING)

    def _check(self, checker: _Checker | None, wait: bool) -> None:
        """Send what the segments checked so far hand over; from the first chunk that failed, read whole instead."""
        while self.segments:
            first, out, state = self.segments[0]
            verdict = True if first is None else checker.verdict(wait)  # type: ignore[union-attr]
            if verdict is None:  # not checked yet
                return
            if not verdict:
                self.segments.clear()
                raise Checked(self._restore(self.before, first))  # type: ignore[arg-type]
            self.segments.pop(0)
            self.before = state
            self.checked += out
            self._send()

    def _marks_t(self) -> int:
        return self.marks[self.mark][0] if self.mark < len(self.marks) else NEVER

    def _whole(self, reader: _Reader, t: int) -> None:
        """Hand over the entry the reader stands on, whole; the line after it too."""
        self._hand_over_held()
        self.out += to_observations(fields_of(reader), t / 1e6, self.units)
        self.kept = -NEVER

    def _screen(self, reader: _Reader, times: list[int], messages: list[bytes], ahead: int) -> None:
        """Hand over what the fold can notice of the lines read since the last call (the reader stands on the
        last of them, or `ahead` entries past it): before anything else is handed over, so that what is
        handed over stays in order."""
        if not messages:
            return
        silence = self.catchup.silence
        passing = self.catchup.screen.which_may_match(messages)
        last = messages[-1]
        if (not passing and max(times) - self.kept < silence and b"!" <= last[:1] <= b"~"
                and max(map(len, messages)) <= MAX_RECORD):
            self.held = (times[-1], last, self.invocation)  # what a batch of serving lines comes to
        else:
            for at, (t, message) in enumerate(zip(times, messages)):
                if at in passing or len(message) > MAX_RECORD:
                    self._hand_over_held()
                    if SPAWN_TEXT in message:  # whether it is systemd's word takes its MESSAGE_ID: go back for it
                        back = len(messages) - 1 - at + ahead
                        if back:
                            reader._previous(back)
                        self.out += to_observations(fields_of(reader), t / 1e6, self.units)
                        if back:
                            reader._next(back)
                    else:
                        self.out += log_lines(message, t / 1e6, self.unit, self.invocation)
                elif not blank(message):  # a line with no record the fold does not see
                    if t - self.kept >= silence:
                        self._hand_over_held()
                    self.held = (t, message, self.invocation)
        times.clear()
        messages.clear()

    def _hand_over_held(self) -> None:
        if self.held is not None:
            t, message, invocation = self.held
            self.out += log_lines(message, t / 1e6, self.unit, invocation)
            self.held, self.kept = None, t

    def _marks(self, t: int) -> None:
        """PID 1's and journald's entries up to `t`, after the line before them; the line after is handed over."""
        while self.mark < len(self.marks) and self.marks[self.mark][0] <= t:
            self._hand_over_held()
            self.out += self.marks[self.mark][1]
            self.mark += 1
            self.kept = -NEVER

    def _send(self, everything: bool = False) -> None:
        """Send what was checked, a full batch at a time (a batch cut short says the catch-up ended), or all."""
        while len(self.checked) >= BATCH or (everything and self.checked):
            self.catchup._send("lines", (self.checked[:BATCH], None))
            del self.checked[:BATCH]

    def _state(self) -> State:
        return self.mark, self.held, self.kept

    def _restore(self, state: State, start: str) -> str:
        """Back to the state after the entry `start`, which was checked; what came after is not handed over."""
        self.mark, self.held, self.kept = state
        self.out = []
        return start


class _Checker:
    """Checks spans of an invocation's lines against the unit's own match, on a thread of its own: whether the
    unit's match, from a span's first entry, reaches its last in as many steps as the invocation's took (then no
    line of another invocation, or of none, lies between). libsystemd steps without the GIL (`next_skip`), so
    where a second core is free the check costs the reading nothing. The thread opens its own Reader: one is
    used by one thread only (sd-journal(3))."""

    def __init__(self, place: JournalPlace, unit: str) -> None:
        self._spans: queue.SimpleQueue[tuple[str, int, str] | None] = queue.SimpleQueue()
        self._verdicts: queue.SimpleQueue[bool | BaseException] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, args=(place, unit), name="journal-check", daemon=True)
        self._thread.start()

    def ask(self, first: str, count: int, last: str) -> None:
        self._spans.put((first, count, last))

    def verdict(self, wait: bool) -> bool | None:
        """The verdict on the oldest span asked about and not yet answered; None if not known yet and not `wait`."""
        try:
            verdict = self._verdicts.get(block=wait)
        except queue.Empty:
            return None
        if isinstance(verdict, BaseException):  # an OSError of libsystemd's, raised where the reading is
            raise verdict
        return verdict

    def close(self) -> None:
        self._spans.put(None)
        self._thread.join()

    def _work(self, place: JournalPlace, unit: str) -> None:
        reader = None
        try:
            reader = place.open()
            _match(reader, (f"_SYSTEMD_UNIT={unit}",))
            while (span := self._spans.get()) is not None:
                first, count, last = span
                reader.seek_cursor(first)
                reader._next()  # on `first`
                reader._next(count)
                self._verdicts.put(reader.test_cursor(last))
        except BaseException as error:  # noqa: BLE001 - handed to the reading thread
            self._verdicts.put(error)
        finally:
            if reader is not None:
                reader.close()
