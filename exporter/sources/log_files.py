"""A log file followed by its path, across rotations and compression, each line read once."""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from pathlib import Path

from exporter.core.containers import rotation_order
from exporter.core.formats import MAX_LINE

logger = logging.getLogger(__name__)

CHUNK = 1024 * 1024
HEAD = 256  # a file's first bytes: how the file being read is recognised once it was renamed and compressed


def read_whole(path: Path) -> list[bytes]:
    """Every line of a finished log file, plain or gzip-compressed (kubelet's and Docker's rotated files).

    A compressed file cut short (compression still under way, or a damaged one) gives what it holds.
    """
    opener = gzip.open if path.name.endswith(".gz") else open
    data = b""
    try:
        with opener(path, "rb") as f:
            while chunk := f.read(CHUNK):
                data += chunk
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        logger.warning("path=%s read up to a damaged part: %s", path, error)
    lines = data.split(b"\n")
    return lines[:-1] + ([lines[-1]] if lines[-1] else [])


def _head(path: Path, size: int) -> bytes:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read(size)
    except (OSError, EOFError, zlib.error):
        return b""


class _Open:
    """One open log file: its identity, its first bytes, and the start of a line not ended yet."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        status = os.fstat(fd)
        self.ident = (status.st_dev, status.st_ino)
        self.head = b""
        self.tail = b""

    def lines(self) -> list[bytes]:
        """The whole lines appended since the last call; a line longer than MAX_LINE is cut there."""
        out: list[bytes] = []
        while chunk := os.read(self.fd, CHUNK):
            if len(self.head) < HEAD:
                self.head += chunk[: HEAD - len(self.head)]
            parts = (self.tail + chunk).split(b"\n")
            self.tail = parts.pop()
            out += parts
            while len(self.tail) >= MAX_LINE:
                out.append(self.tail[:MAX_LINE])
                self.tail = self.tail[MAX_LINE:]
        return out

    def close(self) -> list[bytes]:
        """The last lines, and a last line without its newline (its writer is gone)."""
        out = self.lines()
        if self.tail:
            out.append(self.tail)
        os.close(self.fd)
        return out


class FollowedFile:
    """The lines appended to a log file, read by its path: each line once, whole, across rotations.

    A rotation renames the file (kubelet: `0.log` → `0.log.<time>`, compressed to `.gz` at the next one;
    Docker: `-json.log` → `-json.log.1`) and the runtime opens a new one at the path. The renamed file
    stays open here and is read once more at the next call (containerd may still write to it until it
    has reopened); the files rotated after it, when several rotations passed between two calls, are read
    whole where they lie, compressed or not; then the new file from its start.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._current: _Open | None = None
        self._closing: list[_Open] = []

    def read(self) -> list[bytes]:
        """The lines appended since the last call; at the first, the file's rotated predecessors (oldest
        first) and the file from its start."""
        out: list[bytes] = []
        for old in self._closing:
            out += old.close()
        self._closing = []
        if self._current is None:
            self._current = self._open()
            if self._current is None:
                return out
            out += [line for name in self._rotated() for line in read_whole(self.path.parent / name)]
        out += self._current.lines()
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return out  # renamed away, the new one not created yet: the next call finds it
        if (status.st_dev, status.st_ino) == self._current.ident:
            return out
        old = self._current
        out += [line for name in self._missed(old) for line in read_whole(self.path.parent / name)]
        self._closing.append(old)
        self._current = self._open()
        if self._current is not None:
            out += self._current.lines()
        return out

    def close(self) -> list[bytes]:
        """The lines still unread, the last one even without its newline; the file is then let go."""
        out = self.read()
        for held in (*self._closing, *([self._current] if self._current else [])):
            out += held.close()
        self._closing, self._current = [], None
        return out

    def _open(self) -> _Open | None:
        try:
            return _Open(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            return None

    def _rotated(self) -> list[str]:
        try:
            return rotation_order(self.path.name, os.listdir(self.path.parent))
        except OSError:
            return []

    def _missed(self, old: _Open) -> list[str]:
        """The files rotated after `old`, oldest first: those that went by unread between two calls."""
        rotated = self._rotated()
        for at in range(len(rotated) - 1, -1, -1):
            path = self.path.parent / rotated[at]
            try:
                status = os.stat(path)
            except OSError:
                continue
            if (status.st_dev, status.st_ino) == old.ident or (old.head and _head(path, len(old.head)) == old.head):
                return rotated[at + 1 :]
        if old.head:  # read before, and now nowhere to be found: deleted with whatever followed it
            logger.warning("path=%s the file read before was rotated away and removed: lines may be missing", self.path)
        return []
