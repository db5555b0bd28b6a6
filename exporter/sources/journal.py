"""systemd-python Reader → LogLine and Lifecycle observations: one Reader, on one thread."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from systemd import journal

from exporter.formats import FIELDS  # the fields an observation is built from; no other is decoded
from exporter.lines import clean_records, redraw_ages
from exporter.model import Event, Lifecycle, LogLine, Observation, Suppressed, XidError, frozen_map

logger = logging.getLogger(__name__)


# PID 1's unit lifecycle messages (src/systemd/sd-messages.h); text differs across versions, ids do not.
LIFECYCLE_IDS: Mapping[str, Event] = frozen_map(
    {
        "39f53479d3a045ac8e11786248231fbf": Event.STARTED,
        "98e322203f7a4ed290d09fe03c09fe15": Event.EXITED,
        "d9b373ed55a64feb8242e02dbe79a49c": Event.FAILED,
        "5eb03494b6584870a536b337290809b3": Event.RESTART_SCHEDULED,
        "de5b426a63be47a7b6ac3eaac82e2f6f": Event.STOPPING,
        "9d1aaa27d60140bd96365438aad20286": Event.STOPPED,
        "7ad2d189f7e94e70a38c781354912448": Event.STOPPED,  # "Deactivated successfully."
        "fe6faa94e7774663a0da52717891d8ef": Event.OOM_KILLED,
    }
)
EXIT = re.compile(r"Main process exited, code=(\w+), status=(\d+)/(\w+)")
FAILED_RESULT = re.compile(r"Failed with result '([\w-]+)'")
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d{1,6})\b")
SUPPRESSED = "a596d6fe7bfa4994828e72309e95d61e"  # journald: "Suppressed N messages from UNIT"
COUNT = re.compile(r"[0-9]{1,12}")  # ASCII digits, bounded: a saved log can hold anything


def _text(value: bytes | str | list | None) -> str:  # type: ignore[type-arg]
    if isinstance(value, list):  # a field given twice: journald keeps both, the first one counts
        value = value[0] if value else None
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def to_observations(
    fields: Mapping[str, bytes | str], t: float, units: frozenset[str]
) -> list[Observation | XidError]:
    """One journal entry as observations of the watched units or a GPU Xid; [] for anything else.

    `UNIT=` is a field any local user may set, so lifecycle lines are believed only from PID 1,
    and Xid lines only from the kernel: journald fills in `_PID` and `_TRANSPORT` itself
    (systemd.journal-fields(7): trusted fields).
    """
    transport = _text(fields.get("_TRANSPORT"))
    if transport == "driver" and _text(fields.get("MESSAGE_ID")) == SUPPRESSED:  # journald's own word
        unit = _text(fields.get("OBJECT_SYSTEMD_UNIT"))
        dropped = _text(fields.get("N_DROPPED"))
        return [Suppressed(t, unit, int(dropped))] if unit in units and COUNT.fullmatch(dropped) else []
    if transport == "kernel":
        found = XID.search(_text(fields.get("MESSAGE")))
        return [XidError(t, found.group(1).lower(), int(found.group(2)), "kernel")] if found else []
    unit = _text(fields.get("_SYSTEMD_UNIT"))
    if unit in units:
        invocation = _text(fields.get("_SYSTEMD_INVOCATION_ID"))
        message = fields.get("MESSAGE", b"")
        records = clean_records(message[0] if isinstance(message, list) and message else message or b"")
        # A \r bar arrives when it ends; date each redraw back to when it was drawn.
        return [LogLine(t - age, unit, r, invocation) for r, age in zip(records, redraw_ages(records))]
    subject = _text(fields.get("UNIT"))
    if subject not in units or _text(fields.get("_PID")) != "1":
        return []
    event = LIFECYCLE_IDS.get(_text(fields.get("MESSAGE_ID")))
    if event is None:
        return []
    message = _text(fields.get("MESSAGE"))
    detail = ""
    if event is Event.EXITED and (found := EXIT.search(message)):
        detail = "/".join(found.groups())
    elif event is Event.FAILED:
        found = FAILED_RESULT.search(message)
        detail = _text(fields.get("UNIT_RESULT")) or (found.group(1) if found else "")
    return [Lifecycle(t, subject, event, detail, _text(fields.get("INVOCATION_ID")))]


@dataclass(frozen=True, slots=True)
class JournalPlace:
    """Which journal to read: the host's, a namespace's, or a directory of journal files."""

    namespace: str | None = None
    directory: Path | None = None

    def open(self) -> journal.Reader:
        if self.directory is not None:
            return journal.Reader(path=str(self.directory))
        if self.namespace is not None:
            return journal.Reader(namespace=self.namespace)
        return journal.Reader()

    def __str__(self) -> str:
        if self.directory is not None:
            return f"directory {self.directory}"
        return f"namespace {self.namespace}" if self.namespace else "the system journal"


def fields_of(reader: journal.Reader) -> dict[str, bytes]:
    """The current entry's FIELDS, raw bytes. One C call for all fields, and no decoding: a `_get`
    per field raising KeyError for each missing one costs three times as much (bench/ingest.py), and
    decoding every field five times (reliability.md §1.1)."""
    everything = reader._get_all()
    return {name: everything[name] for name in FIELDS if name in everything}


def _entry(reader: journal.Reader) -> tuple[dict[str, bytes], float]:
    return fields_of(reader), reader._get_monotonic()[0] / 1e6


class Follower:
    """Reads this boot's journal for the watched units: one Reader, used by one thread only
    (sd-journal(3)), in the child process of exporter.sources.journal_process.

    `send(kind, payload)` hands results over: ("lines", (observations, cursor)) where cursor is the
    position of the last entry read live, ("ready", units) once a unit's earlier lines were all
    sent, ("ok", detail) and ("down", reason).
    """

    def __init__(
        self,
        place: JournalPlace,
        send: Callable[[str, object], None],
        cursor: str | None = None,
        backfilled: frozenset[str] = frozenset(),
    ) -> None:
        self.place = place
        self._send = send
        self.cursor = cursor
        self.units = backfilled
        self._position = 0  # realtime µs of the newest live entry: backfills read up to it

    def follow(self, new_units: Callable[[], frozenset[str]], stopping: Callable[[], bool]) -> None:
        backoff = 1.0
        while not stopping():
            try:
                self._follow(new_units, stopping)
                return
            except OSError as error:  # rotation races, vanished files: reopen at the cursor
                self._send("down", f"{self.place}: {error}")
                time.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _follow(self, new_units: Callable[[], frozenset[str]], stopping: Callable[[], bool]) -> None:
        reader = self.place.open()
        try:
            reader.this_boot()
            if not (reader.has_persistent_files() or reader.has_runtime_files()):
                raise OSError("no journal files can be read (missing, or not in the systemd-journal group?)")
            pending = self._seek(reader)
            while not stopping():
                self._backfill(new_units() - self.units)
                batch = [*pending]
                pending = []
                while reader._next():
                    fields, t = _entry(reader)
                    self._position = reader._get_realtime()
                    batch += to_observations(fields, t, self.units)
                    if len(batch) >= 1000:  # keep each message small; the cursor says how far
                        self._hand_over(batch, reader)
                        batch = []
                self._hand_over(batch, reader)
                self._send("ok", f"reading {self.place}")
                reader.wait(0.5)  # returns at once on new entries; INVALIDATE means the same to us
        finally:
            reader.close()

    def _seek(self, reader: journal.Reader) -> list[Observation | XidError]:
        """Stand on the last entry already handed over; what the seek lands on that was not, is returned."""
        if self.cursor:
            try:
                reader.seek_cursor(self.cursor)
                if reader._next():
                    if reader.test_cursor(self.cursor):  # the entry at the cursor was processed
                        self._position = reader._get_realtime()
                        return []
                    # the cursor's entry is gone (vacuumed): this is the next one, not yet read
                    fields, t = _entry(reader)
                    self._position = reader._get_realtime()
                    return to_observations(fields, t, self.units)
            except (OSError, ValueError):  # a cursor from a wiped journal, or garbage
                pass
        # No usable cursor: stand on the newest entry; seek_tail() then next() is unreliable
        # (python-systemd#146), seek_tail() then previous() is not.
        reader.seek_tail()
        reader.get_previous()
        try:
            self._position = reader._get_realtime()
            self.cursor = reader._get_cursor()
        except OSError:  # an empty journal
            self._position = 0
        return []

    def _hand_over(self, batch: list[Observation | XidError], reader: journal.Reader) -> None:
        try:
            self.cursor = reader._get_cursor()
        except OSError:
            pass
        if batch:
            self._send("lines", (batch, self.cursor))

    def _backfill(self, added: frozenset[str]) -> None:
        """Read this boot's entries of newly watched units up to where the live reader stands."""
        if not added:
            return
        reader = self.place.open()
        try:
            reader.this_boot()
            for unit in sorted(added):
                reader.add_match(_SYSTEMD_UNIT=unit)
                reader.add_disjunction()
                reader.add_match(_PID="1", UNIT=unit)  # two fields of one match: both must hold
                reader.add_disjunction()
                reader.add_match(OBJECT_SYSTEMD_UNIT=unit)  # journald's notices about it
                reader.add_disjunction()
            batch: list[Observation | XidError] = []
            while reader._next() and reader._get_realtime() <= self._position:
                fields, t = _entry(reader)
                batch += to_observations(fields, t, added)
                if len(batch) >= 1000:
                    self._send("lines", (batch, None))
                    batch = []
            self._send("lines", (batch, None))
        finally:
            reader.close()
        self.units |= added
        self._send("ready", self.units)
