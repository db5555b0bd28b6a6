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

    `lines` are the raw chunks of the log, in order, whose concatenation is the log: iterating a
    file opened in binary mode gives exactly that. Text formats take each chunk as one line (its
    `\\n` or `\\r\\n` ending is dropped; a last line without one is read as it is). JOURNAL_EXPORT
    joins the chunks back into one byte stream, because a binary field's value is length-prefixed
    and may hold newlines; for that format any chunking works (lines, or fixed-size blocks).

    Fields keep journald's names and only those in FIELDS; a value is str when it is valid UTF-8,
    else the raw bytes. MESSAGE keeps its `\\r`s and colours. The journal formats carry their own
    fields; the short formats give SYSLOG_IDENTIFIER and _PID, plus what `lifecycle_fields` reads
    from `systemd[1]` lines and _TRANSPORT=kernel for `kernel:` lines, but no _SYSTEMD_UNIT; CRI,
    DOCKER_JSON, DOCKER and PLAIN lines get _SYSTEMD_UNIT=`unit` (when given). The container runtimes'
    files give each line once whole: the parts of a line they split (P records, json-file entries
    without their newline) are joined, stdout's and stderr's apart.

    `year` is the year of the first dated line of a format that prints none (short,
    short-precise, vLLM, glog); later lines move to the next year when the dates go back past
    New Year. Times printed without a zone are taken in `tz`, else in this machine's local zone; an engine's own
    output may say both itself (terminal.read_plain).
    t is None where a line carries no time (tracebacks, raw C output, unparseable lines); the
    caller carries the previous one forward. Malformed input never raises: lines that cannot be
    read are passed on as a MESSAGE with t None (text formats) or skipped (journal formats).
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
    return map(_repaired, entries(lines, detect(head), unit=unit, year=year))


def _repaired(entry: tuple[float | None, Fields]) -> tuple[float | None, Fields]:
    return entry[0], paste.repaired(entry[1])
