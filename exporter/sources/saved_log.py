"""A saved log, a file or stdin: a journal file read natively, or text in any format exporter.core.formats knows,
gzip-compressed or not (kubelet and Docker compress the container logs they rotate)."""

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
from exporter.core.containers import log_unit
from exporter.sources.journal_file import is_journal_file, read_journal_file
from exporter.sources.log_files import gunzipped

HEAD = 64 * 1024  # bytes looked at to tell the format
GZIP = b"\x1f\x8b"


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


class _Unpacked(io.RawIOBase):
    """A gzip-compressed file, decompressed as it is read."""

    def __init__(self, chunks: Iterator[bytes], packed: BinaryIO) -> None:
        self.chunks, self.packed, self.pending = chunks, packed, b""

    def readable(self) -> bool:
        return True

    def starts_journal(self) -> bool:
        self.pending = next(self.chunks, b"")
        return is_journal_file(self.pending[:8])

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        data, self.pending = self.pending or next(self.chunks, b""), b""
        size = min(len(buffer), len(data))
        buffer[:size], self.pending = data[:size], data[size:]
        return size

    def close(self) -> None:
        self.packed.close()
        super().close()


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
        if head.startswith(GZIP):
            stream, total = _Unpacked(gunzipped(stream, source), stream), 0  # its size is known at its end
            if stream.starts_journal():
                stream.close()
                raise OSError(f"{source} is a compressed journal file: decompress it (gunzip) and replay that")
    else:
        stream, total = sys.stdin.buffer, 0
        year = year or datetime.now().year
    counted = _Counted(stream)
    reader = io.BufferedReader(counted, HEAD)
    try:
        head = reader.peek(HEAD)[:HEAD].splitlines()[:50]
        last = 0.0
        for entry in formats.read(head, reader, unit=unit or _unit_name(source), year=year):
            if progress and total and time.monotonic() - last > 0.5:
                progress(counted.read_bytes, total)
                last = time.monotonic()
            yield entry
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _unit_name(source: str) -> str:
    """A container runtime's log file names its container in its path (a pod's, or a Docker container's id);
    a plain engine log names no unit: it is the file (`vllm.log`, also when it is `vllm.log.gz`), or `stdin`."""
    if source == "-":
        return "stdin"
    return log_unit(os.path.abspath(source)) or os.path.basename(source).removesuffix(".gz")
