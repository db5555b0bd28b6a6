"""The journal Follower in a child process of its own, restarted from the last cursor when it dies.

libsystemd maps journal files; when journald truncates one under a reader (v250–254, or any
version on a filesystem without hole punching), touching it kills the reading process with SIGBUS
and no exception (docs/reliability.md §1.2). Only this child dies; the parent keeps what it has and
starts a new child that resumes after the last entry it handed over.

The child is a plain `python -m exporter.sources.journal_child` (no multiprocessing: no resource
tracker process, and no module loaded that the reading does not need), started with SIGTERM and SIGINT
ignored before it runs a line (systemd's stop and a terminal's Ctrl-C reach every process of the agent;
they are the parent's to handle, which then stops the child). The two talk over a pair of pipes in
length-prefixed pickles.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

from exporter.core.grammar import worth_folding
from exporter.core.model import Limits, Observation, XidError
from exporter.sources.journal import BATCH, JournalPlace
from exporter.sources.journal_child import Pipe
from exporter.sources.status import SourceStatus

logger = logging.getLogger(__name__)

BACKOFF_MAX = 30.0
# Batches read but not yet drained: past this the reader waits for the agent, and the child for the
# reader, so that a catch-up over millions of lines holds a few MB, not hundreds; the agent, told it is
# behind, drains again as soon as a backlog's worth is read instead of at its next round.
BACKLOG = 16


class JournalSource:
    """Follows this boot's journal for the watched units, through a supervised child process.

    `resume`: the cursor and the units of a checkpoint (exporter.core.checkpoint): the child goes on
    from the cursor, and those units count as read up to it once it says it could (`resumed`); when it
    cannot, `resume_lost` says why, and they are read from this boot's start as new units are.
    `silence`: the fold's silence threshold (seconds): of a unit's earlier lines, the child hands over those any
    rule might match and enough of the others that the fold records the silences this long that a whole read
    would (exporter.sources.journal_catchup).
    """

    def __init__(self, place: JournalPlace, wall: Callable[[], float] = time.time,
                 resume: tuple[str, frozenset[str]] | None = None, silence: float = Limits().silence) -> None:
        self.place = place
        self.silence = silence
        self._units: frozenset[str] = frozenset()
        self._out: queue.Queue[tuple[list[Observation | XidError], str | None]] = queue.Queue(BACKLOG)
        self._cut = False  # the last batch was cut at its size: the child has more to send
        self._worth_draining = threading.Event()  # the backlog is full, or the child caught up
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="journal", daemon=True)
        self.cursor: str | None = resume[0] if resume else None  # the last entry handed over live
        self.drained_cursor: str | None = self.cursor  # the last entry of what drain() gave: the agent's state reflects it
        self._resume_units = resume[1] if resume else frozenset()
        self._resuming = resume is not None
        self.resumed = False  # the child went on from the checkpoint's cursor
        self.resume_lost: str | None = None  # why it could not
        self.ready_units: frozenset[str] = frozenset()  # units whose earlier lines are all handed over
        # Every entry written before this monotonic time is handed over (queued for drain()): what a process
        # sample taken earlier may be folded after.
        self.read_through = float("-inf")
        self._through_changed = threading.Condition()
        self.seen_units: frozenset[str] = frozenset()  # units with at least one entry this boot
        self.restarts = 0  # times the reader died and was started again
        self.child_pid: int | None = None
        self.status = SourceStatus("journal", logger, wall)
        # Wakes the supervising thread for a command to the child at once, not at its next look (0.2 s)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._sync = False  # asked for a pass of the child's over the journal as it stands now

    def watch(self, units: Iterable[str]) -> None:
        """Follow these units too; their lines from earlier in this boot are read first."""
        units = self._units | frozenset(units)
        if units != self._units:
            self._units = units
            self._wake()

    def sync(self) -> None:
        """Have the child read the journal as it stands now, and say so (`read_through`), rather than at its
        next look, up to half a second away: what a warming-up agent waits for to fold the samples it took."""
        self._sync = True
        self._wake()

    def read_to(self, t: float, timeout: float) -> float:
        """Have the child read the journal as it stands now and wait, at most `timeout`, until every entry written
        before monotonic `t` is handed over; how far it is (`read_through`). An idle reader answers in a
        millisecond, so the samples a round takes at `t` are folded that round, after the lines written before
        them; a reader catching up does not, and they wait for a later round."""
        with self._through_changed:
            if self.read_through < t:
                self.sync()
                self._through_changed.wait_for(lambda: self.read_through >= t, timeout)
            return self.read_through

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"!")
        except BlockingIOError:  # full: it is woken already
            pass

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)

    @property
    def behind(self) -> bool:
        """The child is catching up (its last batch was cut at its size): drain after `settle`, not at
        the next round, or a catch-up over millions of lines takes a backlog per round."""
        return self._cut

    def settle(self, timeout: float) -> None:
        """Wait, at most `timeout`, until a drain is worth a round: the backlog full, the child caught up, or
        newly watched units' earlier lines all read."""
        self._worth_draining.wait(timeout)

    def drain(self) -> list[Observation | XidError]:
        """Everything read since the last call, in journal order; `drained_cursor` says how far."""
        self._worth_draining.clear()
        out: list[Observation | XidError] = []
        while True:
            try:
                batch, cursor = self._out.get_nowait()
            except queue.Empty:
                return out
            out += batch
            if cursor:
                self.drained_cursor = cursor

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
        commands_read, commands_write = os.pipe()
        results_read, results_write = os.pipe()
        # `trap ''` ignores the stop signals before Python starts: an ignored signal stays ignored
        # across exec, so even one sent while the child imports is the parent's alone.
        argv = ["/bin/sh", "-c", 'trap "" TERM INT; exec "$@"', "sh",
                sys.executable, "-m", "exporter.sources.journal_child", str(commands_read), str(results_write)]
        process = subprocess.Popen(argv, pass_fds=(commands_read, results_write), stdin=subprocess.DEVNULL)
        os.close(commands_read)
        os.close(results_write)
        outbox, inbox = Pipe(commands_write), Pipe(results_read)
        self.child_pid = process.pid
        backfilled = self._resume_units if self._resuming else self.ready_units
        sent: frozenset[str] = backfilled
        try:
            outbox.send((self.place, self.cursor, backfilled, self._resuming, worth_folding(), self.silence))
            looks = select.poll()  # poll, not select: the agent's descriptors may pass 1024
            looks.register(inbox.fd, select.POLLIN)
            looks.register(self._wake_read, select.POLLIN)
            while not self._stop.is_set():
                if self._units != sent:
                    outbox.send(("watch", self._units))
                    sent = self._units
                if self._sync:
                    self._sync = False
                    outbox.send(("sync", None))
                ready = {fd for fd, _ in looks.poll(200)}
                if self._wake_read in ready:
                    os.read(self._wake_read, 4096)
                if inbox.fd in ready:
                    self._receive(*inbox.receive())  # type: ignore[misc]
                elif process.poll() is not None:
                    break
        except (EOFError, OSError):  # the child died mid-message
            pass
        finally:
            if self._stop.is_set():
                try:
                    outbox.send(("stop", None))
                except OSError:
                    pass
                try:
                    process.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    process.kill()
            process.wait()
            outbox.close()
            inbox.close()
        return process.returncode

    def _receive(self, kind: str, payload: object) -> None:
        if kind == "lines":
            batch, cursor = payload  # type: ignore[misc]
            while not self._stop.is_set():
                try:
                    self._out.put((batch, cursor), timeout=0.2)
                    break
                except queue.Full:
                    continue
            self._cut = len(batch) >= BATCH
            if self._out.full() or not self._cut:
                self._worth_draining.set()
            for obs in batch:
                unit = getattr(obs, "unit", None)
                if unit and unit not in self.seen_units:
                    self.seen_units |= {unit}
            if cursor:
                self.cursor = cursor
        elif kind == "seek":
            kept, why = payload  # type: ignore[misc]
            if self._resuming:  # the first child's answer to the checkpoint
                self._resuming = False
                if kept:
                    self.ready_units = self._resume_units
                    self.resumed = True
                else:
                    self.resume_lost = why
            if why:
                logger.warning("journal: %s", why)
        elif kind == "through":
            with self._through_changed:
                self.read_through = max(self.read_through, payload)  # type: ignore[call-overload]
                self._through_changed.notify_all()
        elif kind == "ready":
            self.ready_units = payload  # type: ignore[assignment]
            self._cut = False  # the catch-up's last batch may have been a full one: it is over all the same
            self._worth_draining.set()
        elif kind == "ok":
            self.status.ok(str(payload))
        elif kind == "down":
            self.status.down(str(payload))
