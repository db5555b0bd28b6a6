"""A saved log, a file or stdin: a journal file read natively, or text in any format exporter.core.formats knows."""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from exporter.core import formats
from exporter.sources.journal_file import is_journal_file, read_journal_file

HEAD = 64 * 1024  # bytes looked at to tell the format


class _Counted(io.RawIOBase):
    """A binary stream that counts what was read from it, for the progress line."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.read_bytes = stream, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)


def journal_file(source: str) -> Path | None:
    """The path of `source` when it is a journal file (not stdin, not text); OSError when unreadable."""
    if source == "-":
        return None
    with open(source, "rb") as probe:
        return Path(source) if is_journal_file(probe.read(8)) else None


def entries(
    source: str, unit: str = "", year: int | None = None, progress: Callable[[int, int], None] | None = None
) -> Iterator[tuple[float | None, dict]]:  # type: ignore[type-arg]
    """(time, fields) for each entry of the log at `source` (a path, or `-` for stdin).

    `progress(bytes_read, total_bytes)` is called now and then for a file whose size is known.
    """
    if source != "-":
        path = Path(source)
        with path.open("rb") as probe:
            head = probe.read(8)
        if is_journal_file(head):
            yield from read_journal_file(path)
            return
        stream: BinaryIO = path.open("rb")
        total = path.stat().st_size
        year = year or datetime.fromtimestamp(path.stat().st_mtime).year  # the log's year, not today's
    else:
        stream, total = sys.stdin.buffer, 0
        year = year or datetime.now().year
    counted = _Counted(stream)
    reader = io.BufferedReader(counted, HEAD)
    try:
        fmt = formats.detect(reader.peek(HEAD)[:HEAD].splitlines()[:50])
        last = 0.0
        for entry in formats.entries(reader, fmt, unit=unit or _unit_name(source), year=year):
            if progress and total and time.monotonic() - last > 0.5:
                progress(counted.read_bytes, total)
                last = time.monotonic()
            yield entry
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _unit_name(source: str) -> str:
    """A plain engine log names no unit: call it after the file, as a unit name."""
    stem = "stdin" if source == "-" else os.path.basename(source).split(".")[0] or "log"
    return f"{stem}.service"
