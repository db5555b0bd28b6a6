"""The journal reader child's own side: follow the journal and send what it reads to the parent.

Run as `python -m exporter.sources.journal_child COMMANDS RESULTS` (two inherited pipe fds) by
exporter.sources.journal_process, which holds the parent's side. It imports only what reading needs, not
the parent's threads, queues and subprocesses: every module a second interpreter loads is memory the agent
holds twice.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import sys

from exporter.sources.journal import Follower

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


def main(commands: int, results: int) -> None:
    """The child: follow the journal, send what it reads, stop with the parent."""
    inbox, outbox = Pipe(commands), Pipe(results)
    parent = os.getppid()
    place, cursor, backfilled, resuming = inbox.receive()  # type: ignore[misc]
    watched: frozenset[str] = backfilled

    def new_units() -> frozenset[str]:
        nonlocal watched
        while inbox.ready(0):
            kind, payload = inbox.receive()  # type: ignore[misc]
            if kind == "stop":
                raise SystemExit(0)
            watched = payload
        return watched

    try:
        Follower(place, lambda kind, payload: outbox.send((kind, payload)), cursor, backfilled, resuming).follow(
            new_units, lambda: os.getppid() != parent)
    except (BrokenPipeError, EOFError, SystemExit):  # the parent is gone or asked us to stop
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
