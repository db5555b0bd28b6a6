"""A slow network mount: a read-only FUSE server (fusepy) that serves one file, one read at a time, at a
set rate, and can stop answering for good after some bytes, as a hung NFS or FUSE server does.

    with SlowMount(model, tmp_path / "mnt", rate=8e6) as slow: ...           # slow.mountpoint / model.name
    python -m tests.slow_mount FILE MOUNTPOINT RATE [DEAD_AFTER]              # the server itself

A mount is new each time, so the kernel's page cache holds none of the file: every page a reader maps
comes through the server. On the way out the server is killed (the kernel then fails the reads it was
waiting for) and the mount is detached.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

ROOT = Path(__file__).parent.parent


class SlowMount:
    def __init__(self, file: Path, mountpoint: Path, rate: float, dead_after: int | None = None) -> None:
        self.file, self.mountpoint, self.rate, self.dead_after = file, mountpoint, rate, dead_after
        self.server: subprocess.Popen | None = None  # type: ignore[type-arg]

    def __enter__(self) -> Self:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.slow_mount", str(self.file), str(self.mountpoint), str(self.rate)]
        if self.dead_after is not None:
            argv.append(str(self.dead_after))
        self.server = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not os.path.ismount(self.mountpoint):
            if self.server.poll() is not None or time.monotonic() > deadline:
                self.abort()
                raise RuntimeError(f"the FUSE server did not mount {self.mountpoint} (exit {self.server.poll()})")
            time.sleep(0.05)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.abort()

    def abort(self) -> None:
        """Kill the server and detach the mount: what a reader waits for then fails."""
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGKILL)  # the kernel aborts the connection: waiting readers get errors
            self.server.wait()
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, check=False)


def serve(file: str, mountpoint: str, rate: float, dead_after: int | None) -> None:
    from fuse import FUSE, FuseOSError, Operations  # fusepy, over libfuse2

    name = "/" + os.path.basename(file)
    size = os.path.getsize(file)
    fd = os.open(file, os.O_RDONLY)
    served = 0
    hung = threading.Event()  # never set: past dead_after, the server never answers again

    class Slow(Operations):  # type: ignore[misc]
        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path == name:
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": size}
            raise FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", name[1:]]

        def open(self, path: str, flags: int) -> int:
            return 0

        def read(self, path: str, length: int, offset: int, fh: int) -> bytes:
            nonlocal served
            if dead_after is not None and served >= dead_after:
                hung.wait()
            time.sleep(length / rate)
            served += length
            return os.pread(fd, length, offset)

    # nothreads: one request at a time, as a single slow link serves them
    FUSE(Slow(), mountpoint, foreground=True, nothreads=True, ro=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    serve(args[0], args[1], float(args[2]), int(args[3]) if len(args) > 3 else None)
