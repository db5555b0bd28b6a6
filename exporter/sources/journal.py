"""systemd-python Reader → LogLine and Lifecycle observations: one Reader, on one thread."""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from systemd import journal

from exporter.lines import clean_records, redraw_ages
from exporter.model import Event, Lifecycle, LogLine, Observation, XidError, frozen_map
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

# The fields an observation is built from; everything else in an entry is never decoded.
FIELDS = (
    "MESSAGE",
    "_SYSTEMD_UNIT",
    "_PID",
    "UNIT",
    "MESSAGE_ID",
    "_SYSTEMD_INVOCATION_ID",
    "INVOCATION_ID",
    "UNIT_RESULT",
    "_TRANSPORT",
)

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
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def to_observations(
    fields: Mapping[str, bytes | str], t: float, units: frozenset[str]
) -> list[Observation | XidError]:
    """One journal entry as observations of the watched units or a GPU Xid; [] for anything else.

    `UNIT=` is a field any local user may set, so lifecycle lines are believed only from PID 1,
    and Xid lines only from the kernel: journald fills in `_PID` and `_TRANSPORT` itself
    (systemd.journal-fields(7): trusted fields).
    """
    if _text(fields.get("_TRANSPORT")) == "kernel":
        found = XID.search(_text(fields.get("MESSAGE")))
        return [XidError(t, found.group(1).lower(), int(found.group(2)), "kernel")] if found else []
    unit = _text(fields.get("_SYSTEMD_UNIT"))
    if unit in units:
        invocation = _text(fields.get("_SYSTEMD_INVOCATION_ID"))
        records = clean_records(fields.get("MESSAGE", b""))
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


def _entry(reader: journal.Reader) -> tuple[dict[str, bytes], float]:
    fields = {}
    for name in FIELDS:
        try:
            fields[name] = reader._get(name)  # raw bytes: decoding every field costs 5x (reliability.md §1.1)
        except KeyError:
            pass
    return fields, reader._get_monotonic()[0] / 1e6


class JournalSource:
    """Follows this boot's journal for the watched units on a thread of its own.

    sd-journal objects must stay on the thread that made them (sd-journal(3)), so the Reader is
    opened, read and closed inside `_run`; other threads only exchange units and observations.
    """

    def __init__(self, place: JournalPlace, wall: Callable[[], float] = time.time) -> None:
        self.place = place
        self._units: frozenset[str] = frozenset()
        self._new_units: queue.SimpleQueue[frozenset[str]] = queue.SimpleQueue()
        self._out: queue.SimpleQueue[Observation | XidError] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
        self._position: int | None = None  # realtime µs of the newest entry read
        self.ready_units: frozenset[str] = frozenset()  # units whose earlier lines are all handed over
        self.seen_units: frozenset[str] = frozenset()  # units with at least one entry this boot
        self.status = SourceStatus("journal", logger, wall)

    def watch(self, units: Iterable[str]) -> None:
        """Follow these units too; their lines from earlier in this boot are read first."""
        units = frozenset(units)
        if not units <= self._units:
            self._new_units.put(units)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def drain(self) -> list[Observation | XidError]:
        """Everything read since the last call, in journal order."""
        out = []
        while True:
            try:
                out.append(self._out.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._follow()
                return
            except OSError as error:  # rotation races, vanished files: reopen where we were
                self.status.down(f"{self.place}: {error}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _follow(self) -> None:
        reader = self.place.open()
        try:
            reader.this_boot()
            if not (reader.has_persistent_files() or reader.has_runtime_files()):
                raise OSError("no journal files can be read (missing, or not in the systemd-journal group?)")
            resuming = self._position is not None
            if self._position is None:
                # Position on the newest entry; seek_tail() then next() is unreliable (python-systemd#146).
                reader.seek_tail()
                reader.get_previous()
                self._position = reader._get_realtime() if self._has_entry(reader) else 0
            else:
                reader.seek_realtime(self._position / 1e6)
            while not self._stop.is_set():
                self._backfill(self._position)
                while reader._next():
                    realtime = reader._get_realtime()
                    if resuming and realtime <= self._position:
                        continue  # already read before the reopen
                    resuming = False
                    fields, t = _entry(reader)
                    self._position = realtime
                    self._hand_over(to_observations(fields, t, self._units))
                self.status.ok(f"reading {self.place}")
                reader.wait(0.5)  # returns at once on new entries; INVALIDATE means the same to us
        finally:
            reader.close()

    @staticmethod
    def _has_entry(reader: journal.Reader) -> bool:
        try:
            reader._get_realtime()
            return True
        except OSError:
            return False

    def _hand_over(self, observations: list[Observation | XidError]) -> None:
        for obs in observations:
            self._out.put(obs)
            unit = getattr(obs, "unit", None)
            if unit and unit not in self.seen_units:
                self.seen_units |= {unit}

    def _backfill(self, until: int) -> None:
        """Read this boot's entries of newly watched units up to where the live reader stands."""
        added: frozenset[str] = frozenset()
        while True:
            try:
                added |= self._new_units.get_nowait() - self._units
            except queue.Empty:
                break
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
            while reader._next() and reader._get_realtime() <= until:
                fields, t = _entry(reader)
                self._hand_over(to_observations(fields, t, added))
        finally:
            reader.close()
        self._units |= added
        self.ready_units = self._units
