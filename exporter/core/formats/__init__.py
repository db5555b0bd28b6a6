"""Saved logs (journalctl json/export/short*, container runtimes' log files, docker logs -t, engine output, terminal
sessions) as (time, journal fields): a small reader per kind, paste repair for what a user pasted; and the records of
the container runtimes' log files, which the agent follows live."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import tzinfo

from exporter.core.formats import containers, paste, short
from exporter.core.formats.clock import Years
from exporter.core.formats.detect import Format, detect
from exporter.core.formats.fields import Fields
from exporter.core.formats.journal import read_export, read_json
from exporter.core.formats.terminal import read_plain

__all__ = ["Format", "detect", "entries", "read"]


def entries(
    lines: Iterable[bytes], fmt: Format, *, unit: str = "", year: int, tz: tzinfo | None = None
) -> Iterator[tuple[float | None, Fields]]:
    """Each entry of a saved log as (seconds since the epoch or None, journal-like fields).

    `lines` are the raw chunks of the log in order (iterating a file opened in binary mode gives them): a text format
    takes each as one line, its `\\n` or `\\r\\n` dropped; JOURNAL_EXPORT joins them back, as its binary fields are
    length-prefixed. Fields keep journald's names, only those in FIELDS, str where valid UTF-8; MESSAGE keeps its
    `\\r`s and colours. The short formats give SYSLOG_IDENTIFIER and _PID (and what `short.lifecycle_fields` reads of
    PID 1's lines), the runtimes' files and plain text _SYSTEMD_UNIT=`unit`; a runtime's line split in parts is given
    once, whole. Dates without a year are in `year` until they go back past New Year; times without a zone in `tz`,
    else this machine's (an engine's output may say both: terminal.read_plain). t is None for a line without a time
    (the caller carries the last one forward). Malformed input never raises: an unreadable text line is passed on
    untimed, an unreadable journal entry skipped.
    """
    fmt = Format(fmt)
    if fmt is Format.JOURNAL_JSON:
        return read_json(lines)
    if fmt is Format.JOURNAL_EXPORT:
        return read_export(lines)
    if fmt in (Format.SHORT, Format.SHORT_PRECISE, Format.SHORT_ISO):
        return short.read_short(lines, Years(year, tz), tz)
    if fmt is Format.CRI:
        return containers.read_records(lines, containers.cri_record, unit)
    if fmt is Format.DOCKER_JSON:
        return containers.read_records(lines, containers.docker_json_record, unit)
    if fmt is Format.DOCKER:
        return containers.read_docker(lines, unit)
    return read_plain(lines, unit, year, tz)


def read(head: list[bytes], lines: Iterable[bytes], *, unit: str, year: int) -> Iterator[tuple[float | None, Fields]]:
    """A saved text log, pasted or written as it was (`head`: its first lines, which `lines` holds too), as `replay`
    reads it: the paste's frame taken off, its format told from its head, and each entry's MESSAGE repaired
    (paste.repaired). The live agent never reads through here."""
    if frame := paste.frame(head):
        head, lines = list(paste.unframed(head, frame)), paste.unframed(lines, frame)
    return ((t, paste.repaired(fields)) for t, fields in entries(lines, detect(head), unit=unit, year=year))
