"""The journal reader child's own side: follow the journal and send what it reads to the parent.

Run as `python -m exporter.sources.journal_child COMMANDS RESULTS` (two inherited pipe fds) by
exporter.sources.journal_process, which holds the parent's side. It imports only what reading needs, not
the parent's threads, queues and subprocesses: every module a second interpreter loads is memory the agent
holds twice. Newly watched units' earlier lines are read in a process forked for it
(exporter.sources.journal_catchup): what that reading loads and maps (its module, RE2's screen, a thread,
the journal files it reads through) is given back when it ends, and a SIGBUS there kills only it.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
from collections.abc import Callable

from exporter.sources.journal import Follower, JournalPlace

HEADER = struct.Struct("<I")


class Pipe:
    """One end of a pipe, carrying whole messages: a 4-byte length, then the pickle."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self.fd, view):]

    def ready(self, timeout: float) -> bool:
        return bool(select.select([self.fd], [], [], timeout)[0])

    def receive(self) -> object:
        (size,) = HEADER.unpack(self._exactly(HEADER.size))
        return pickle.loads(self._exactly(size))

    def _exactly(self, size: int) -> bytes:
        parts = []
        while size:
            part = os.read(self.fd, min(size, 1 << 20))
            if not part:
                raise EOFError("the other end closed the pipe")
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        os.close(self.fd)


def catch_up(work: Callable[[], None], inbox: Pipe, new_units: Callable[[], frozenset[str]],
             stopping: Callable[[], bool]) -> None:
    """Run `work` in a forked process and wait for it, still taking the parent's commands (its stop ends both).
    It writes to the parent's pipe itself, while this process writes nothing. OSError when it fails."""
    worker = os.fork()
    if worker == 0:
        code = 1
        try:
            work()
            code = 0
        except BaseException:  # noqa: BLE001 - said on stderr, the agent's; the reader tries again
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)  # nothing of this process's to clean up: that is the reader's
    try:
        while True:
            done, status = os.waitpid(worker, os.WNOHANG)
            if done:
                break
            if stopping():
                raise SystemExit(0)
            inbox.ready(0.05)
            new_units()  # SystemExit on the parent's stop
    except BaseException:
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
        raise
    code = os.waitstatus_to_exitcode(status)
    if code:
        why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise OSError(f"reading newly watched units' earlier lines failed ({why})")


def _read_earlier(place: JournalPlace, screen: bytes, silence: float, send: Callable[[str, object], None],
                  units: list[str], until: str | None) -> None:
    from exporter.sources.journal_catchup import CatchUp  # here, in the forked process: see the module's doc

    catchup = CatchUp(place, screen, silence, send)
    for unit in units:
        catchup.read(unit, until)


def main(commands: int, results: int) -> None:
    """The child: follow the journal, send what it reads, stop with the parent."""
    from exporter.sources.journal_pages import release  # here: the agent imports this module for Pipe alone

    inbox, outbox = Pipe(commands), Pipe(results)
    parent = os.getppid()
    place, cursor, backfilled, resuming, screen, silence = inbox.receive()  # type: ignore[misc]
    watched: frozenset[str] = backfilled

    def new_units() -> frozenset[str]:
        nonlocal watched
        while inbox.ready(0):
            kind, payload = inbox.receive()  # type: ignore[misc]
            if kind == "stop":
                raise SystemExit(0)
            if kind == "watch":
                watched = payload
            # "sync": nothing to do but wake up, which it did: the next pass reads the journal as it stands
        return watched

    def idle(reader: object) -> None:
        """Wait for new entries or a command, half a second at most (poll, not select: a reader holds a
        descriptor per journal file); then let libsystemd take in what changed, as its own wait does."""
        looks = select.poll()
        looks.register(reader.fileno(), select.POLLIN)  # type: ignore[attr-defined]
        looks.register(inbox.fd, select.POLLIN)
        looks.poll(500)
        reader.process()  # type: ignore[attr-defined]

    def send(kind: str, payload: object) -> None:
        outbox.send((kind, payload))

    def stopping() -> bool:
        return os.getppid() != parent

    def read_earlier(units: list[str], until: str | None) -> None:
        catch_up(lambda: _read_earlier(place, screen, silence, send, units, until), inbox, new_units, stopping)

    try:
        Follower(place, send, read_earlier, cursor, backfilled, resuming, idle, release).follow(new_units, stopping)
    except (BrokenPipeError, EOFError, SystemExit):  # the parent is gone or asked us to stop
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
