"""journalctl's own formats: -o json (and json-seq), one entry a line; -o export, fields by length where binary."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

from exporter.core.formats.clock import MAX_TIME
from exporter.core.formats.fields import WANTED, Fields, line, text

FIELD_NAME = re.compile(rb"[A-Z_][A-Z0-9_]{0,63}")
MAX_FIELD = 64 * 1024 * 1024  # a binary export field longer than this is taken for garbage


def _realtime(value: object) -> float | None:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    # isascii(): str.isdigit() is also true of "²", which int() refuses; a realtime that is not 1 to 18
    # ASCII digits (µs up to year 9999) made int() or the division raise ValueError or OverflowError
    # on a hostile -o json or -o export log (found by tests/test_fuzz.py).
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        t = int(value) / 1e6
        return t if t <= MAX_TIME else None
    return None


def _json_value(value: object) -> bytes | str | None:
    """journalctl -o json: a string; an array of byte values (not printable UTF-8); an array of
    those when the field occurs more than once (the first is kept, as sd_journal_get_data does);
    null when it is over 4096 bytes and -a was not given."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(b, int) for b in value):
            try:
                return text(bytes(value))
            except ValueError:
                return None
        return _json_value(value[0])
    return None


def read_json(lines: Iterable[bytes]) -> Iterator[tuple[float | None, Fields]]:
    for raw in lines:
        stripped = raw.strip().lstrip(b"\x1e")  # -o json-seq puts an RS before each entry
        if not stripped.startswith(b"{"):
            continue
        try:
            entry = json.loads(stripped)
        except (ValueError, RecursionError):
            continue  # a truncated last line, or garbage
        if not isinstance(entry, dict):
            continue
        fields: Fields = {}
        for name in WANTED & entry.keys():
            value = _json_value(entry[name])
            if value is not None:
                fields[name] = value
            elif name == "MESSAGE":
                fields[name] = ""  # too long to show without -a
        yield _realtime(entry.get("__REALTIME_TIMESTAMP")), fields


class _Stream:
    """The concatenation of byte chunks, read by lines and by counts."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self._at = 0

    def _more(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._buffer = self._buffer[self._at :] + bytes(chunk)
                self._at = 0
                return True
        return False

    def readline(self) -> bytes:
        """The next line with its \\n; the rest of the stream at its end; b"" when there is no more."""
        while True:
            end = self._buffer.find(b"\n", self._at)
            if end >= 0:
                found, self._at = self._buffer[self._at : end + 1], end + 1
                return found
            if not self._more():
                found, self._buffer, self._at = self._buffer[self._at :], b"", 0
                return found

    def read(self, size: int) -> bytes:
        """`size` bytes, fewer at the end of the stream."""
        parts, wanted = [], size
        while wanted > 0:
            if self._at >= len(self._buffer) and not self._more():
                break
            part = self._buffer[self._at : self._at + wanted]
            self._at += len(part)
            parts.append(part)
            wanted -= len(part)
        return b"".join(parts)


def read_export(chunks: Iterable[bytes]) -> Iterator[tuple[float | None, Fields]]:
    """journalctl -o export (systemd's JOURNAL_EXPORT_FORMATS): `NAME=value\\n` for printable
    values, `NAME\\n` + little-endian u64 size + raw value + `\\n` for the rest; a blank line ends
    an entry. A last entry cut short is still given, without the field that was cut."""
    stream = _Stream(chunks)
    fields: Fields = {}
    t: float | None = None
    seen = False
    while raw := stream.readline():
        body = line(raw)
        if not body:  # the blank line that ends an entry
            if seen:
                yield t, fields
            fields, t, seen = {}, None, False
            continue
        name, eq, value = body.partition(b"=")
        if not eq:
            if not raw.endswith(b"\n") or not FIELD_NAME.fullmatch(body):
                continue  # garbage
            size = stream.read(8)
            if len(size) < 8:
                break  # cut short
            length = int.from_bytes(size, "little")
            if length > MAX_FIELD:
                continue  # garbage that looked like a field name
            value = stream.read(length)
            if len(value) < length:
                break  # cut short
            stream.readline()  # the value's own \n (or \r\n)
        elif not FIELD_NAME.fullmatch(name):
            continue
        seen = True
        key = name.decode("ascii")
        if key == "__REALTIME_TIMESTAMP":
            t = _realtime(value)
        elif key in WANTED and key not in fields:  # the first of a repeated field, as sd-journal gives
            fields[key] = text(value)
    if seen:
        yield t, fields
