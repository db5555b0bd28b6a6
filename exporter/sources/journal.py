"""systemd-python: one Reader, on one thread, following this boot's journal for the watched units."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.core.entries import (  # the fields an observation is built from; no other is decoded
    FIELDS,
    to_observations,
)
from exporter.core.model import Observation, XidError

TYPE_CHECKING = False  # typing's, without importing typing in the reader child (exporter.core.model says why)
if TYPE_CHECKING:
    from systemd._reader import _Reader


@dataclass(frozen=True, slots=True)
class JournalPlace:
    """Which journal to read: the host's, a namespace's, or a directory of journal files."""

    namespace: str | None = None
    directory: Path | None = None

    def open(self) -> _Reader:
        """systemd-python's C reader, which every read here goes through (`_next`, `_get_all`, …), without
        systemd.journal's Reader around it: that converts fields we read raw, and imports logging, uuid,
        datetime and traceback, 1 MiB of the reader child's memory."""
        # Imported here: the agent's own process names the place and never reads it (its reader child does),
        # and systemd-python is 1.3 MiB of a process's memory (docs/performance.md).
        from systemd._reader import LOCAL_ONLY, _Reader

        if self.directory is not None:
            return _Reader(0, path=str(self.directory))  # sd_journal_open_directory(3) takes no LOCAL_ONLY
        if self.namespace is not None:
            return _Reader(LOCAL_ONLY, namespace=self.namespace)
        return _Reader(LOCAL_ONLY)

    def readable(self, reader: _Reader) -> bool:
        """Whether the Reader found journal files it can read. libsystemd counts a directory's files as
        persistent or runtime by their path (/var, /run): one elsewhere (a copy in /srv, a host's journal
        mounted at /host/var/log/journal) is asked itself."""
        if reader.has_persistent_files() or reader.has_runtime_files():
            return True
        if self.directory is None:
            return False
        return any(f.name.endswith((".journal", ".journal~")) and os.access(f, os.R_OK) for f in self.directory.iterdir())

    def __str__(self) -> str:
        if self.directory is not None:
            return f"directory {self.directory}"
        return f"namespace {self.namespace}" if self.namespace else "the system journal"


def this_boot(reader: _Reader) -> None:
    """Read only this boot's entries: the match systemd.journal.Reader.this_boot adds."""
    reader.add_match(f"_BOOT_ID={_boot_id()}")


@functools.cache
def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")  # as sd_id128_get_boot


def fields_of(reader: _Reader) -> dict[str, bytes]:
    """The current entry's FIELDS, raw bytes. One C call for all fields, and no decoding: a `_get`
    per field raising KeyError for each missing one costs three times as much (bench/ingest.py), and
    decoding every field five times (docs/reliability.md §1.1)."""
    everything = reader._get_all()
    return {name: everything[name] for name in FIELDS if name in everything}


# Observations a message carries at most: a batch this full was cut short, and more are coming.
BATCH = 1000
# Entries read between two releases of the journal pages they touched (`release`): about 2 MiB of them.
RELEASE_EVERY = 10_000


def _entry(reader: _Reader) -> tuple[dict[str, bytes], float]:
    return fields_of(reader), reader._get_monotonic()[0] / 1e6


class Follower:
    """Reads this boot's journal for the watched units: one Reader, used by one thread only
    (sd-journal(3)), in the child process of exporter.sources.journal_process.

    `send(kind, payload)` hands results over: ("lines", (observations, cursor)) where cursor is the
    position of the last entry read live, ("through", t) once every entry written before the monotonic
    time t was sent, ("ready", units) once a unit's earlier lines were all sent, ("ok", detail) and
    ("down", reason). `read_earlier(units, until)` reads newly watched units' lines of this boot up to
    the entry `until` and sends them (exporter.sources.journal_catchup). `idle(reader)` waits between two
    passes over the journal: for new entries, or (the child's) a command. `release()` gives back the
    journal pages the reading touched (exporter.sources.journal_pages, in the child): after the Reader
    stands where it goes on from, and every RELEASE_EVERY entries.
    """

    def __init__(
        self,
        place: JournalPlace,
        send: Callable[[str, object], None],
        read_earlier: Callable[[list[str], str | None], None],
        cursor: str | None = None,
        backfilled: frozenset[str] = frozenset(),
        resuming: bool = False,
        idle: Callable[[_Reader], None] = lambda reader: reader.wait(500_000),  # µs
        release: Callable[[], object] = lambda: None,
    ) -> None:
        self.place = place
        self._send = send
        self._read_earlier = read_earlier
        self._idle = idle  # waits, at most half a second, for new entries (INVALIDATE means the same to us)
        self._release = release
        self.cursor = cursor  # the live reader's position: newly watched units are read up to it
        self.units = backfilled
        # The backfilled units are a checkpoint's: read up to the cursor only if it can be used; if it
        # cannot, they are read from this boot's start as new units are.
        self._resuming = resuming

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
            this_boot(reader)
            if not self.place.readable(reader):
                raise OSError("no journal files can be read (missing, or not in the systemd-journal group?)")
            pending = self._seek(reader)
            # entries read since the last release; the seek and the first `next` after it walk every file's
            # entry arrays (0.7 MiB a file), so the first pass ends with one
            read = RELEASE_EVERY
            while not stopping():
                self._backfill(new_units() - self.units)
                batch = [*pending]
                pending = []
                while True:
                    looked = time.monotonic()  # the journal as it stood then: read whole once _next() finds no more
                    if not reader._next():
                        break
                    fields, t = _entry(reader)
                    batch += to_observations(fields, t, self.units)
                    if len(batch) >= BATCH:  # keep each message small; the cursor says how far
                        self._hand_over(batch, reader)
                        self._send("through", t)  # a journal written faster than it is read: as far as it is
                        batch = []
                    read = self._released_after(read + 1)  # a long pass: a journal written as fast as it is read
                self._hand_over(batch, reader)
                read = self._released_after(read)
                self._send("through", looked)
                self._send("ok", f"reading {self.place}")
                self._idle(reader)
        finally:
            reader.close()

    def _released_after(self, read: int) -> int:
        """Give the journal pages back once `read` entries since the last time reach RELEASE_EVERY; the count
        since then."""
        if read < RELEASE_EVERY:
            return read
        self._release()
        return 0

    def _seek(self, reader: _Reader) -> list[Observation | XidError]:
        """Stand on the last entry already handed over; what the seek lands on that was not, is returned.
        Says ("seek", (kept, why)) whether it could go on from the cursor it was given."""
        resuming, self._resuming = self._resuming, False
        if self.cursor:
            why = "it is in none of the journal's files (another boot's, or wiped)"
            try:
                reader.seek_cursor(self.cursor)
                if reader._next():
                    if reader.test_cursor(self.cursor):  # the entry at the cursor was processed
                        self._send("seek", (True, ""))
                        return []
                    # the cursor's entry is gone (vacuumed): this is the next one, not yet read
                    fields, t = _entry(reader)
                    self._send("seek", (True, "its entry was vacuumed: going on from the next one there is"))
                    return to_observations(fields, t, self.units)
            except (OSError, ValueError) as error:  # a cursor from a wiped journal, or garbage
                why = f"it cannot be read ({error})"
            self._send("seek", (False, f"the journal position {self.cursor[:48]}… cannot be used: {why}"))
            self.cursor = None
            if resuming:
                self.units = frozenset()
        # No usable cursor: stand on the newest entry; seek_tail() then next() is unreliable
        # (python-systemd#146), seek_tail() then previous() is not. Where the live reading starts is
        # handed over at once: the position the agent's state reflects before a line comes.
        reader.seek_tail()
        reader._previous()
        try:
            self.cursor = reader._get_cursor()
        except OSError:  # an empty journal
            pass
        self._send("lines", ([], self.cursor))
        return []

    def _hand_over(self, batch: list[Observation | XidError], reader: _Reader) -> None:
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
        self._read_earlier(sorted(added), self.cursor)
        self.units |= added
        self._send("ready", self.units)
