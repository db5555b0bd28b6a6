"""The journal Follower in a child process of its own, restarted from the last cursor when it dies.

libsystemd maps journal files; when journald truncates one under a reader (v250–254, or any
version on a filesystem without hole punching), touching it kills the reading process with SIGBUS
and no exception (docs/reliability.md §1.2). Only this child dies; the parent keeps what it has and
starts a new child that resumes after the last entry it handed over.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection

from exporter.core.model import Observation, XidError
from exporter.sources.journal import Follower, JournalPlace
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

BACKOFF_MAX = 30.0


def _child(place: JournalPlace, conn: Connection, cursor: str | None, backfilled: frozenset[str]) -> None:
    """The child: follow the journal, send what it reads, stop with the parent."""
    parent = os.getppid()
    # A terminal's Ctrl-C and systemd's stop (KillMode=control-group) reach every process of the
    # agent: they are the parent's to handle, which then stops this child itself
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    watched: frozenset[str] = backfilled

    def new_units() -> frozenset[str]:
        nonlocal watched
        while conn.poll():
            kind, payload = conn.recv()
            if kind == "stop":
                raise SystemExit(0)
            watched = payload
        return watched

    def send(kind: str, payload: object) -> None:
        conn.send((kind, payload))

    try:
        Follower(place, send, cursor, backfilled).follow(new_units, lambda: os.getppid() != parent)
    except (BrokenPipeError, EOFError, SystemExit):  # the parent is gone or asked us to stop
        pass


class JournalSource:
    """Follows this boot's journal for the watched units, through a supervised child process."""

    def __init__(self, place: JournalPlace, wall: Callable[[], float] = time.time) -> None:
        self.place = place
        self._context = multiprocessing.get_context("spawn")  # never fork a process holding a Reader
        self._units: frozenset[str] = frozenset()
        self._out: queue.SimpleQueue[Observation | XidError] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="journal", daemon=True)
        self.cursor: str | None = None  # the last entry handed over live
        self.ready_units: frozenset[str] = frozenset()  # units whose earlier lines are all handed over
        self.seen_units: frozenset[str] = frozenset()  # units with at least one entry this boot
        self.restarts = 0  # times the reader died and was started again
        self.child_pid: int | None = None
        self.status = SourceStatus("journal", logger, wall)

    def watch(self, units: Iterable[str]) -> None:
        """Follow these units too; their lines from earlier in this boot are read first."""
        self._units = self._units | frozenset(units)

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

    def _supervise(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            started = time.monotonic()
            code = self._run_child()
            if self._stop.is_set():
                return
            self.restarts += 1
            why = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            self.status.down(f"journal reader died ({why}); starting a new one after the last entry read")
            backoff = 1.0 if time.monotonic() - started > 60 else min(backoff * 2, BACKOFF_MAX)
            self._stop.wait(backoff)

    def _run_child(self) -> int | None:
        conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=_child, args=(self.place, child_conn, self.cursor, self.ready_units), name="journal-reader",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self.child_pid = process.pid
        sent: frozenset[str] = self.ready_units
        try:
            while not self._stop.is_set():
                if self._units != sent:
                    conn.send(("watch", self._units))
                    sent = self._units
                if conn.poll(0.2):
                    self._receive(*conn.recv())
                elif not process.is_alive():
                    break
        except (EOFError, OSError):  # the child died mid-message
            pass
        finally:
            if self._stop.is_set():
                try:
                    conn.send(("stop", None))
                except OSError:
                    pass
                process.join(timeout=2)
                if process.is_alive():
                    process.kill()
            process.join(timeout=5)
            conn.close()
        return process.exitcode

    def _receive(self, kind: str, payload: object) -> None:
        if kind == "lines":
            batch, cursor = payload  # type: ignore[misc]
            for obs in batch:
                self._out.put(obs)
                unit = getattr(obs, "unit", None)
                if unit and unit not in self.seen_units:
                    self.seen_units |= {unit}
            if cursor:
                self.cursor = cursor
        elif kind == "ready":
            self.ready_units = payload  # type: ignore[assignment]
        elif kind == "ok":
            self.status.ok(str(payload))
        elif kind == "down":
            self.status.down(str(payload))
