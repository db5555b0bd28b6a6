"""A log file followed by its path, across rotations and compression, each line read once."""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from exporter.core.containers import rotation_order
from exporter.core.formats.containers import MAX_LINE

logger = logging.getLogger(__name__)

CHUNK = 1024 * 1024
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's window for a gzip header and trailer
SETTLE_TRIES = 5
HEAD = 256  # a file's first bytes: how the file being read is recognised once it was renamed and compressed


def gunzipped(stream: BinaryIO, name: str = "") -> Iterator[bytes]:
    """The bytes a gzip stream holds, as they are decompressed (members one after another). A stream cut short
    (its compression still under way) or damaged ends where it breaks, with what came before: Python's gzip
    module gives nothing of a last read that hits the cut."""
    decompressor, fed = zlib.decompressobj(GZIP_WBITS), False
    while chunk := stream.read(CHUNK):
        while chunk:
            fed = True
            try:
                data = decompressor.decompress(chunk)
            except zlib.error as error:
                logger.warning("path=%s read up to a damaged part: %s", name, error)
                return
            if data:
                yield data
            chunk = b""
            if decompressor.eof:  # another member may follow
                chunk, decompressor, fed = decompressor.unused_data, zlib.decompressobj(GZIP_WBITS), False
    if fed:
        logger.warning("path=%s read up to where it is cut short", name)


def _content(f: BinaryIO, compressed: bool, name: str, size: int = -1) -> bytes:
    """An open file's bytes from where it stands (the first `size` of them), decompressed if it is."""
    if not compressed:
        return f.read(size)
    data = b""
    for chunk in gunzipped(f, name):
        data += chunk
        if 0 <= size <= len(data):
            return data[:size]
    return data


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    return lines[:-1] + ([lines[-1]] if lines[-1] else [])


def read_whole(path: Path) -> list[bytes]:
    """Every line of a finished log file, plain or gzip-compressed (kubelet's and Docker's rotated files)."""
    try:
        with open(path, "rb") as f:
            return _lines(_content(f, path.name.endswith(".gz"), str(path)))
    except OSError as error:
        logger.warning("path=%s cannot be read: %s", path, error.strerror)
        return []


@dataclass
class _Rotated:
    """A rotated file, held open: renamed again (Docker shifts .1 to .2) or removed, it is still this file."""

    name: str
    file: BinaryIO
    ident: tuple[int, int]

    @property
    def compressed(self) -> bool:
        return self.name.endswith(".gz")

    def head(self, size: int) -> bytes:
        self.file.seek(0)
        return _content(self.file, self.compressed, self.name, size)

    def lines(self) -> list[bytes]:
        self.file.seek(0)
        return _lines(_content(self.file, self.compressed, self.name))


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
    Docker: `-json.log` → `-json.log.1`, the older ones shifted to `.2`, `.3`, …) and the runtime opens a
    new one at the path. The renamed file stays open here and is read once more at the next call
    (containerd may still write to it until it has reopened); the files rotated after it, when several
    rotations passed between two calls, are read whole, compressed or not; then the new file from its start.
    Which file is which is told by its inode, or by its first bytes once compressed (a new inode): never by
    its name, which a rotation under way may be changing.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._current: _Open | None = None
        self._previous: _Open | None = None  # the file read before the last rotation, until the next is open
        self._closing: list[_Open] = []

    def read(self) -> list[bytes]:
        """The lines appended since the last call; at the first, the file's rotated predecessors (oldest
        first) and the file from its start."""
        out: list[bytes] = []
        for old in self._closing:
            out += old.close()
        self._closing = []
        if self._current is None and not self._reopen(out):
            return out
        assert self._current is not None
        out += self._current.lines()
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return out  # renamed away, the new one not created yet: the next call finds it
        if (status.st_dev, status.st_ino) == self._current.ident:
            return out
        old = self._current
        out += old.lines()  # what was written to it between the read above and its rotation, first
        self._closing.append(old)
        self._current, self._previous = None, old
        if self._reopen(out):
            assert self._current is not None
            out += self._current.lines()
        return out

    def _reopen(self, out: list[bytes]) -> bool:
        """Open the file at the path, having read first the rotated files not read yet: every one at the first
        call, after a rotation those rotated after the file read before. False while no file is at the path."""
        rotated, current = self._settled()
        if current is not None:
            gone_by = rotated if self._previous is None else self._after(self._previous, rotated)
            out += [line for r in gone_by for line in r.lines()]
            self._current, self._previous = current, None
        self._close(rotated)
        return current is not None

    def close(self) -> list[bytes]:
        """The lines still unread, the last one even without its newline; the file is then let go."""
        out = self.read()
        for held in (*self._closing, *([self._current] if self._current else [])):
            out += held.close()
        self._closing, self._current = [], None
        return out

    def _settled(self) -> tuple[list[_Rotated], _Open | None]:
        """The rotated files, oldest first, and the file at the path, all opened as they stood at one moment:
        listed, opened, and listed again, until no rotation moved them in between."""
        for _ in range(SETTLE_TRIES):
            names = self._rotated_names()
            rotated = []
            for name in names:
                try:
                    f = open(self.path.parent / name, "rb")
                except OSError:
                    continue
                status = os.fstat(f.fileno())
                rotated.append(_Rotated(name, f, (status.st_dev, status.st_ino)))
            current = self._open()
            settled = self._rotated_names() == names and all(self._stands_at(r) for r in rotated)
            if settled and self._stands(current):
                return rotated, current
            self._close(rotated)
            if current is not None:
                os.close(current.fd)
        logger.warning("path=%s rotates faster than it is read: lines may be missing or repeated", self.path)
        return [], self._open()

    def _stands_at(self, rotated: _Rotated) -> bool:
        """The file opened is still the one of that name."""
        try:
            status = os.stat(self.path.parent / rotated.name)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) == rotated.ident

    def _stands(self, current: _Open | None) -> bool:
        """The file opened is still the one at the path."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return current is None
        return current is not None and (status.st_dev, status.st_ino) == current.ident

    def _after(self, old: _Open, rotated: list[_Rotated]) -> list[_Rotated]:
        """The files rotated after `old`: those that went by unread between two calls."""
        for at in range(len(rotated) - 1, -1, -1):
            found = rotated[at]
            if found.ident == old.ident or (old.head and found.head(len(old.head)) == old.head):
                return rotated[at + 1 :]
        if old.head:  # read before, and now nowhere to be found: removed with whatever followed it
            logger.warning("path=%s: the file read before is gone, and lines may be with it", self.path)
        return []

    def _open(self) -> _Open | None:
        try:
            return _Open(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            return None

    def _rotated_names(self) -> list[str]:
        try:
            return rotation_order(self.path.name, os.listdir(self.path.parent))
        except OSError:
            return []

    @staticmethod
    def _close(rotated: list[_Rotated]) -> None:
        for r in rotated:
            r.file.close()
