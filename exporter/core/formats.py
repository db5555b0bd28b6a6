"""Saved logs (journalctl json/export/short*, container runtimes' log files, docker logs -t, engine output) as
(time, journal fields); and the records of the container runtimes' log files, which the agent follows live."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from enum import StrEnum

from exporter.core.entries import FIELDS, SPAWN, MessageId
from exporter.core.lines import ANSI, COMPOSE

# The journal fields a replay keeps; everything else is dropped.
_WANTED = frozenset(FIELDS)

Fields = dict[str, bytes | str]


class Format(StrEnum):
    """How a saved log is written; the values are journalctl's `-o` names where there is one."""

    JOURNAL_JSON = "json"  # journalctl -o json (or json-seq)
    JOURNAL_EXPORT = "export"  # journalctl -o export
    SHORT = "short"  # journalctl [-o short]: "Nov 29 12:00:01 host ident[pid]: msg"
    SHORT_ISO = "short-iso"  # journalctl -o short-iso[-precise], rsyslog's RFC 3339 files
    SHORT_PRECISE = "short-precise"  # journalctl -o short-precise: "Nov 29 12:00:01.123456 host …"
    CRI = "cri"  # containerd's and CRI-O's log files (/var/log/pods): "2026-11-29T12:00:01.12345Z stdout F line"
    DOCKER_JSON = "docker-json"  # Docker's json-file driver: {"log":"line\n","stream":"stdout","time":"…"}
    DOCKER = "docker"  # docker logs -t / kubectl logs --timestamps: "2026-11-29T12:00:01.123456789Z line"
    PLAIN = "plain"  # an engine's own output, as it would have reached the journal line by line


# --- helpers -----------------------------------------------------------------------------------

# journalctl prints the month in the locale's words (strftime's %b): the common ones, lower case and
# without a final dot; 中文 and 日本語 write `8月`. A month it does not know leaves the line untimed.
MONTHS = {
    name.encode(): number
    for names in (
        "jan feb mar apr may jun jul aug sep oct nov dec",  # English, and the default C locale
        "jan feb mär apr mai jun jul aug sep okt nov dez",  # German
        "janv févr mars avr mai juin juil août sept oct nov déc",  # French
        "ene feb mar abr may jun jul ago sep oct nov dic",  # Spanish
        "gen feb mar apr mag giu lug ago set ott nov dic",  # Italian
        "jan fev mar abr mai jun jul ago set out nov dez",  # Portuguese
        "янв фев мар апр мая июн июл авг сен окт ноя дек",  # Russian (genitive, as %b gives it)
        "1月 2月 3月 4月 5月 6月 7月 8月 9月 10月 11月 12月",  # Chinese, Japanese
    )
    for number, name in enumerate(names.split(), 1)
} | {"май".encode(): 5}
HEAD = 512  # header regexes only ever look at this much of a line
CLOCK_LOOKAHEAD = 200  # lines of an engine's own output looked at for the year and zone it prints
MAX_FIELD = 64 * 1024 * 1024  # a binary export field longer than this is taken for garbage
# Times a timeline can print (report.iso: datetime's years 1 to 9999, a day's margin for any zone). A
# date at the edge in a far zone ("0001-01-01T00:00:00+23:59") or a realtime of 30 digits is garbage,
# read as no time: report.iso raised ValueError on it and `replay` died (found by tests/test_fuzz.py).
MIN_TIME, MAX_TIME = -62135596800.0 + 86400, 253402300799.0 - 86400
ANSI_BYTES = re.compile(ANSI.pattern.encode())  # lines.ANSI, for raw bytes
COMPOSE_BYTES = re.compile(COMPOSE.pattern.encode())  # lines.COMPOSE: `docker compose logs`' `service  | `
KUBECTL_PREFIX = re.compile(rb"\[pod/([^/\]\s]+/[^/\]\s]+)\] ")  # `kubectl logs --prefix`: `[pod/NAME/CONTAINER] `
FIELD_NAME = re.compile(rb"[A-Z_][A-Z0-9_]{0,63}")
# journalctl's "-- Boot … --", "-- No entries --", "-- Logs begin at … --" lines
SEPARATOR = re.compile(rb"-- .* --")
# journalctl -x's explanatory catalog lines (`░░ Subject: …`; `-- Subject: …` before systemd 246), and a
# markdown fence around a pasted log
SAYS_NOTHING = ("░░".encode(), b"-- ", b"```", b"~~~")
# What a paste may carry on every line, around the log: a markdown quote's marks (nested too); `grep -n`'s line
# numbers (`109:`, `110-` beside a match), `cat -n`'s, a paste site's (`  12. `). A number followed by a digit
# is a time's or a date's.
PASTE_FRAMES = (
    re.compile(rb"^(?:>[ \t]?)+"),
    re.compile(rb"^\d{1,7}[:-](?=\D)"),
    re.compile(rb"^ *\d{1,7}\t"),
    re.compile(rb"^ *\d{1,7}\. "),
)

_ZONE = rb"(Z|[+-]\d\d:?\d\d)"
_FRACTION = rb"(?:[.,](\d{1,9}))?"
_YMD_HMS = rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)" + _FRACTION

# journalctl short formats: the time, then "host ident[pid]: " (host absent when the entry has no _HOSTNAME).
SHORT_TIME = re.compile(
    rb"([^\s\d.]{3,12}\.?|\d{1,2}\xe6\x9c\x88) ?([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))? "
)
ISO_TIME = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)" + _FRACTION + _ZONE + rb" ")
# "host ident[pid]: "; a host a user hid behind a placeholder may hold spaces (`<ollama server>`)
SYSLOG_HEAD = re.compile(rb"(?:<[^<>]{1,64}> |[^\s\[\]:]+ )?([^\s\[\]:]+)(?:\[(\d+)\])?:(?: |$)")
# The CRI logging format (kubelet's CRI spec): RFC 3339 time, stream, tags (P: a part of a longer line,
# F: the end of one), one space, the content. containerd writes Go's RFC3339Nano, whose zeros are trimmed.
CRI_RECORD = re.compile(
    rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)" + _FRACTION + _ZONE + rb" (stdout|stderr) ([PF])(?::\S*)?(?: |$)"
)
DOCKER_TIME = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)" + _FRACTION + _ZONE + rb"(?: |$)")
# TGI's tracing-subscriber lines: "2026-11-29T12:00:01.123456Z  INFO target: …" (6 digits, padded level).
TGI_LINE = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{1,6}Z\s+(?:TRACE|DEBUG|INFO|WARN|ERROR)\s")

# Engine timestamps in plain output: (regex, layout). Tried in order on the ANSI-stripped head.
VLLM_TIME = re.compile(
    rb"(?:\([^()]*? pid=\d+(?:, ip=[^)]*)?\)\s+)?(?:\[rank\d+\]:\s?)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    rb"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?\s"
)
PLAIN_TIMES: tuple[tuple[re.Pattern[bytes], str], ...] = (
    (VLLM_TIME, "mdhms"),  # vLLM: "(Name pid=N) INFO 11-29 12:00:01 [file.py:12] …", no year
    (re.compile(rb"\[" + _YMD_HMS + rb"[^\]]*\]"), "ymdhms"),  # SGLang: "[2026-11-29 12:00:01.123 TP0] …"
    (re.compile(_YMD_HMS + _ZONE + rb"?\s"), "ymdhms"),  # TGI, Python's default asctime, RFC 3339
    (re.compile(rb"time=" + _YMD_HMS + _ZONE + rb"?\s"), "ymdhms"),  # Ollama (Go slog)
    (re.compile(rb"(\d{4})/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)" + _FRACTION + rb"\s"), "ymdhms"),  # Go log
    # Ollama's HTTP log: "[GIN] 2026/11/29 - 12:00:35 | 200 | …"
    (re.compile(rb"\[GIN\] (\d{4})/(\d\d)/(\d\d) - (\d\d):(\d\d):(\d\d)" + _FRACTION + rb" "), "ymdhms"),
    (re.compile(rb"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})\s+\d+ "), "mdhms"),  # glog: Triton
    # torch's c10 warnings: "[rank0]:[W1129 12:00:01.112374421 ProcessGroupNCCL.cpp:1538] …"
    (re.compile(rb"(?:\[rank\d+\]:)?\[[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9}) "), "mdhms"),
    (re.compile(rb"\[(\d\d)/(\d\d)/(\d{4})-(\d\d):(\d\d):(\d\d)\]"), "mdyhms"),  # trtllm-serve
    # JSON logs (TGI --json-output): {"timestamp":"2026-11-29T12:00:01.118245Z",…}
    (re.compile(rb'\{.{0,200}?"(?:timestamp|time|ts)"\s*:\s*"' + _YMD_HMS + _ZONE + rb'?"'), "ymdhms"),
)


def _text(value: bytes) -> bytes | str:
    """A field value as str when it is valid UTF-8, else the raw bytes (as journald keeps it)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _ascii(value: bytes) -> str:
    return value.decode("ascii", "replace")


def _zone(raw: bytes | None, default: tzinfo | None) -> tzinfo | None:
    if not raw:
        return default
    if raw == b"Z":
        return UTC
    sign = -1 if raw[:1] == b"-" else 1
    digits = raw[1:].replace(b":", b"")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4])))


def _fraction(raw: bytes | None) -> float:
    return int(raw) / 10 ** len(raw) if raw else 0.0


def _epoch(year: int, month: int, day: int, hms: tuple[int, int, int], zone: tzinfo | None) -> float | None:
    """Seconds since the epoch; a naive time (zone None) is local time. None for an impossible date."""
    try:
        t = datetime(year, month, day, *hms, tzinfo=zone).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return t if MIN_TIME <= t <= MAX_TIME else None


def _stamp(groups: tuple[bytes | None, ...], default: tzinfo | None) -> float | None:
    """Regex groups year, month, day, hour, minute, second, fraction[, zone] as seconds since the
    epoch, in `default` when the zone is absent; None for an impossible time or zone."""
    y, mo, d, hh, mm, ss, fraction, *zone = groups
    try:
        tz = _zone(zone[0] if zone else None, default)
    except ValueError:  # an offset of 24 hours or more
        return None
    t = _epoch(int(y or 0), int(mo or 0), int(d or 0), (int(hh or 0), int(mm or 0), int(ss or 0)), tz)
    return t + _fraction(fraction) if t is not None else None


def _line(raw: bytes) -> bytes:
    """One line without its terminator: \\n or \\r\\n (any other \\r is the message's own)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


class _Years:
    """Dates without a year: start in `year`, move to the next when the time jumps back past New Year."""

    ROLLOVER = 7 * 86400.0  # a jump back this far can only be a new year
    STRAGGLER = 300 * 86400.0  # this far ahead of the newest line: a line from just before New Year

    def __init__(self, year: int, zone: tzinfo | None) -> None:
        self.year = year
        self.zone = zone
        self.newest: float | None = None
        self._cache: tuple[tuple[int, ...], float | None] = ((), None)

    def at(self, month: int, day: int, hms: tuple[int, int, int], fraction: float) -> float | None:
        t = self._whole(self.year, month, day, hms)
        if t is not None and self.newest is not None:
            if t < self.newest - self.ROLLOVER:
                later = self._whole(self.year + 1, month, day, hms)
                if later is not None:
                    self.year, t = self.year + 1, later
            elif t > self.newest + self.STRAGGLER:
                earlier = self._whole(self.year - 1, month, day, hms)
                if earlier is not None and earlier > self.newest - self.ROLLOVER:
                    t = earlier
        if t is None:
            return None
        t += fraction
        self.newest = t if self.newest is None else max(self.newest, t)
        return t

    def _whole(self, year: int, month: int, day: int, hms: tuple[int, int, int]) -> float | None:
        key = (year, month, day, *hms)
        if self._cache[0] != key:  # consecutive lines mostly share their second
            self._cache = (key, _epoch(year, month, day, hms, self.zone))
        return self._cache[1]


# --- detection ---------------------------------------------------------------------------------

_PRIORITY = (
    Format.JOURNAL_JSON,
    Format.JOURNAL_EXPORT,
    Format.SHORT_ISO,
    Format.SHORT_PRECISE,
    Format.SHORT,
    Format.CRI,
    Format.DOCKER_JSON,
    Format.DOCKER,
    Format.PLAIN,
)


def _classify(line: bytes) -> Format | None:
    """Which format one line looks like; None for lines that say nothing (blank, separators, indented,
    journalctl -x's catalog text, a markdown fence around a paste)."""
    if not line.strip() or line[:1] in b" \t" or SEPARATOR.fullmatch(line[:HEAD]) or line.startswith(SAYS_NOTHING):
        return None
    if line[:1] in (b"{", b"\x1e"):
        try:
            entry = json.loads(line.lstrip(b"\x1e"))
        except (ValueError, RecursionError):
            return Format.PLAIN
        journal_keys = ("__REALTIME_TIMESTAMP", "__CURSOR", "MESSAGE", "_BOOT_ID")
        if isinstance(entry, dict) and any(key in entry for key in journal_keys):
            return Format.JOURNAL_JSON
        if isinstance(entry, dict) and isinstance(entry.get("log"), str) and "time" in entry:
            return Format.DOCKER_JSON
        return Format.PLAIN
    head = line[:HEAD]
    # TGI's own `TIME  LEVEL target: ` looks like `TIME host ident: ` where a page collapsed its two spaces
    if (found := ISO_TIME.match(head)) and SYSLOG_HEAD.match(head, found.end()) and not TGI_LINE.match(head):
        return Format.SHORT_ISO
    if found := SHORT_TIME.match(head):
        return Format.SHORT_PRECISE if found.group(6) else Format.SHORT
    if CRI_RECORD.match(head):
        return Format.CRI
    if (found := DOCKER_TIME.match(head)) and (len(found.group(7) or b"") == 9 or not TGI_LINE.match(head)):
        return Format.DOCKER
    name, eq, _ = head.partition(b"=")
    if FIELD_NAME.fullmatch(name if eq else head):
        return Format.JOURNAL_EXPORT
    return Format.PLAIN


def paste_frame(head: list[bytes]) -> re.Pattern[bytes] | None:
    """The frame around every line of a paste (PASTE_FRAMES: a markdown quote, `grep -n`'s numbers), when every
    line of its head that says anything is in it: the frame is the paste's, in none of its lines, and hides
    their format. `unframed` takes it off."""
    said = [line for line in map(_line, head) if line.strip() and not line.startswith((b"```", b"~~~"))]  # a fence outside
    return next((frame for frame in PASTE_FRAMES if said and all(frame.match(line) for line in said)), None)


def unframed(lines: Iterable[bytes], frame: re.Pattern[bytes]) -> Iterator[bytes]:
    """The lines of a paste without its frame."""
    for raw in lines:
        yield frame.sub(b"", raw, count=1)


def detect(head: list[bytes]) -> Format:
    """The format of a saved log, from its first lines (raw, with or without their terminators).

    Each non-empty line votes for the format it looks like; the most votes win, ties going to the
    stricter format. Lines that look like nothing in particular vote PLAIN, so a file of engine
    output with no wrapper, an empty head and binary garbage all come out PLAIN.
    """
    votes = dict.fromkeys(_PRIORITY, 0)
    for raw in head[:50]:
        kind = _classify(_line(raw))
        if kind is not None:
            votes[kind] += 1
    if votes[Format.JOURNAL_EXPORT] and not any(
        _line(raw).startswith((b"__CURSOR=", b"__REALTIME_TIMESTAMP=")) for raw in head[:50]
    ):
        votes[Format.PLAIN] += votes.pop(Format.JOURNAL_EXPORT)  # KEY=value lines alone prove nothing
    if not any(votes.values()):
        return Format.PLAIN
    return max(votes, key=lambda kind: (votes[kind], -_PRIORITY.index(kind)))


# --- systemd's own lines in the short formats ---------------------------------------------------

_SUFFIXES = "service|socket|target|device|mount|automount|swap|timer|path|slice|scope"
_UNIT = rf"(?P<unit>[A-Za-z0-9:_.\\@-]+\.(?:{_SUFFIXES}))"
# Job messages name the unit as "Description", or as "unit - Description" (newer systemd), or as
# the bare unit name when it has no description; only the latter two tell which unit it was.
_JOB_TEXTS = (
    (re.compile(r"Starting (?P<what>.+)\.\.\."), MessageId.UNIT_STARTING),
    (re.compile(r"Started (?P<what>.+)\."), MessageId.UNIT_STARTED),
    (re.compile(r"Stopping (?P<what>.+)\.\.\."), MessageId.UNIT_STOPPING),
    (re.compile(r"Stopped (?P<what>.+)\."), MessageId.UNIT_STOPPED),
    (re.compile(r"Failed to start (?P<what>.+)\."), MessageId.UNIT_FAILED),
)
_JOB_SUBJECT = re.compile(_UNIT + r"(?: - .*)?")
# Unit messages are "unit: text" (log_unit_*), always with the unit name.
_UNIT_TEXTS = (
    (re.compile(_UNIT + r": [Mm]ain process exited, code=\w+, status=\S+"), MessageId.UNIT_PROCESS_EXIT),
    (re.compile(_UNIT + r": Failed with result '(?P<result>[\w-]+)'\."), MessageId.UNIT_FAILURE_RESULT),
    (re.compile(r"Unit " + _UNIT + r" entered failed state\."), MessageId.UNIT_FAILURE_RESULT),  # ≤ v235
    (re.compile(_UNIT + r": Scheduled restart job, restart counter is at \d+\."), MessageId.UNIT_RESTART_SCHEDULED),
    (re.compile(_UNIT + r" holdoff time over, scheduling restart\."), MessageId.UNIT_RESTART_SCHEDULED),  # ≤ v235
    (re.compile(_UNIT + r": Deactivated successfully\."), MessageId.UNIT_SUCCESS),
    (re.compile(_UNIT + r": A process of this unit has been killed by the OOM killer\."), MessageId.UNIT_OUT_OF_MEMORY),
    # a glyph first (`[🡕] `) where journalctl marks the line
    (re.compile(r"(?:\[\S{1,2}\] )?" + _UNIT + r": systemd-oomd killed \d+ process\(es\) in this unit\."),
     MessageId.UNIT_OOMD_KILL),
    (re.compile(_UNIT + r": Consumed .+ CPU time\b.*"), MessageId.UNIT_RESOURCES),
)


# A process systemd forked for a unit, already in the unit's cgroup, says "unit: text" as it sets up the command
# (and, failing, which step failed): journald files its lines under that unit, not under PID 1.
_CHILD_TEXT = re.compile(_UNIT + r": ")


def lifecycle_fields(message: str) -> dict[str, str] | None:
    """The MESSAGE_ID (and UNIT, UNIT_RESULT where the text names them) of one of PID 1's unit messages.

    For logs that lost the journal fields (the short formats): `Started vllm.service - vLLM.` gives
    MessageId.UNIT_STARTED and UNIT=vllm.service; the older `Started vLLM.` gives only the MESSAGE_ID.
    None for any other text.
    """
    message = message.strip()
    for pattern, message_id in _UNIT_TEXTS:
        if found := pattern.fullmatch(message):
            fields = {"MESSAGE_ID": message_id, "UNIT": found["unit"]}
            if result := found.groupdict().get("result"):
                fields["UNIT_RESULT"] = result
            return fields
    for pattern, message_id in _JOB_TEXTS:
        if found := pattern.fullmatch(message):
            fields = {"MESSAGE_ID": message_id}
            if subject := _JOB_SUBJECT.fullmatch(found["what"]):
                fields["UNIT"] = subject["unit"]
            return fields
    return None


# --- readers per format ------------------------------------------------------------------------


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
    New Year. In an engine's own output, whose lines may mix formats, the first full date among its
    first lines gives that year instead (SGLang's dates beside vLLM's yearless ones). Times printed
    without a zone are taken in `tz`; by default, in an engine's own output, in the zone of the first
    of its first lines that prints one (Ollama's Go `log` prints its first lines without a zone and slog
    the rest with one, all on the same clock), else in this machine's local zone.
    t is None where a line carries no time (tracebacks, raw C output, unparseable lines); the
    caller carries the previous one forward. Malformed input never raises: lines that cannot be
    read are passed on as a MESSAGE with t None (text formats) or skipped (journal formats).
    """
    fmt = Format(fmt)
    if fmt is Format.JOURNAL_JSON:
        return _json(lines)
    if fmt is Format.JOURNAL_EXPORT:
        return _export(lines)
    if fmt in (Format.SHORT, Format.SHORT_PRECISE, Format.SHORT_ISO):
        return _short(lines, _Years(year, tz), tz)
    if fmt is Format.CRI:
        return _container(lines, cri_record, unit)
    if fmt is Format.DOCKER_JSON:
        return _container(lines, docker_json_record, unit)
    if fmt is Format.DOCKER:
        return _docker(lines, unit)
    lines, printed = _clock_in_head(lines, unit)
    if tz is None:
        tz = printed.zone
    return _plain(lines, unit, _Years(printed.year or year, tz), tz)


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
                return _text(bytes(value))
            except ValueError:
                return None
        return _json_value(value[0])
    return None


def _json(lines: Iterable[bytes]) -> Iterator[tuple[float | None, Fields]]:
    for raw in lines:
        line = raw.strip().lstrip(b"\x1e")  # -o json-seq puts an RS before each entry
        if not line.startswith(b"{"):
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a truncated last line, or garbage
        if not isinstance(entry, dict):
            continue
        fields: Fields = {}
        for name in _WANTED & entry.keys():
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
                line, self._at = self._buffer[self._at : end + 1], end + 1
                return line
            if not self._more():
                line, self._buffer, self._at = self._buffer[self._at :], b"", 0
                return line

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

    def peek(self, size: int) -> bytes:
        while len(self._buffer) - self._at < size and self._more():
            pass
        return self._buffer[self._at : self._at + size]


def _export(chunks: Iterable[bytes]) -> Iterator[tuple[float | None, Fields]]:
    """journalctl -o export (systemd's JOURNAL_EXPORT_FORMATS): `NAME=value\\n` for printable
    values, `NAME\\n` + little-endian u64 size + raw value + `\\n` for the rest; a blank line ends
    an entry. A last entry cut short is still given, without the field that was cut."""
    stream = _Stream(chunks)
    fields: Fields = {}
    t: float | None = None
    seen = False
    while line := stream.readline():
        body = _line(line)
        if not body:  # the blank line that ends an entry
            if seen:
                yield t, fields
            fields, t, seen = {}, None, False
            continue
        name, eq, value = body.partition(b"=")
        if not eq:
            if not line.endswith(b"\n") or not FIELD_NAME.fullmatch(body):
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
            if stream.peek(1) == b"\n":
                stream.read(1)
            elif stream.peek(2) == b"\r\n":
                stream.read(2)
        elif not FIELD_NAME.fullmatch(name):
            continue
        seen = True
        key = name.decode("ascii")
        if key == "__REALTIME_TIMESTAMP":
            t = _realtime(value)
        elif key in _WANTED and key not in fields:  # the first of a repeated field, as sd-journal gives
            fields[key] = _text(value)
    if seen:
        yield t, fields


# `systemctl status UNIT` prints a head above the unit's last journal lines: the unit (after a bullet: ● ○ × ↻,
# or `*` on a console without UTF-8), its state and since when, and how its main process ended.
STATUS_HEAD = re.compile("(?:\u25cf|\u25cb|\u00d7|\u21bb|\\*) ".encode() + _UNIT.encode() + rb"(?: - .*)?")
STATUS_ACTIVE = re.compile(
    rb"\s+Active: (?P<state>[\w-]+)(?: \([\w-]+\))?(?: \(Result: (?P<result>[\w-]+)\))? since \w+ "
    rb"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)"
)
STATUS_MAIN_EXIT = re.compile(rb"\s+Main PID: \d+ \(code=(?P<code>\w+), status=(?P<status>\d+)(?:/(?P<name>\w+))?\)")


@dataclass
class _StatusHead:
    """What a `systemctl status` head says, as the lines PID 1 logged: a unit active since a time was Started then;
    one that failed (or waits to restart after failing) ended so at that time, which comes after the journal's
    lines below the head, so those words (`failed`) wait for the head's end."""

    unit: str
    since: float | None = None
    failed: list[tuple[float | None, Fields]] = field(default_factory=list)

    def read(self, line: bytes, tz: tzinfo | None) -> list[tuple[float | None, Fields]] | None:
        """PID 1's lines this line of the head says ([] for none yet), or None for a line of another kind."""
        if found := STATUS_ACTIVE.match(line):
            self.since = _stamp((*found.groups()[2:], None), tz)
            if result := found["result"]:
                self.failed.append((self.since, _pid1(self.unit, MessageId.UNIT_FAILURE_RESULT,
                                                      f"{self.unit}: Failed with result '{result.decode()}'.",
                                                      UNIT_RESULT=result.decode())))
                return []
            if found["state"] in (b"active", b"activating", b"reloading"):
                return [(self.since, _pid1(self.unit, MessageId.UNIT_STARTED, f"Started {self.unit}."))]
            return []
        if (found := STATUS_MAIN_EXIT.match(line)) and self.since is not None:
            name = (found["name"] or b"n/a").decode()
            self.failed.insert(0, (self.since, _pid1(self.unit, MessageId.UNIT_PROCESS_EXIT,
                                                     f"{self.unit}: Main process exited, code={found['code'].decode()}, "
                                                     f"status={found['status'].decode()}/{name}")))
            return []
        return None


def _short(lines: Iterable[bytes], years: _Years, tz: tzinfo | None) -> Iterator[tuple[float | None, Fields]]:
    """journalctl short, short-precise and short-iso[-precise]; journalctl prints the later lines of
    a multi-line MESSAGE indented under the first, so they are joined back with \\n. `systemctl status`'s
    head above them says what PID 1 would have (_StatusHead)."""
    pending: tuple[float | None, Fields, list[bytes], int] | None = None
    status: _StatusHead | None = None

    def finish() -> tuple[float | None, Fields]:
        assert pending is not None
        t, fields, parts, _ = pending
        fields["MESSAGE"] = _text(b"\n".join(parts))
        ident, pid, message = fields.get("SYSLOG_IDENTIFIER"), fields.get("_PID"), fields["MESSAGE"]
        if ident == "systemd" and isinstance(message, str):
            if said := lifecycle_fields(message):  # PID 1's, or a user manager's (`journalctl --user`): its units' PID 1
                fields.update(said, _PID="1")
            elif child := _CHILD_TEXT.match(message):
                fields["_SYSTEMD_UNIT"] = child["unit"]
                if SPAWN.match(message, child.end()):
                    fields["MESSAGE_ID"] = MessageId.SPAWN_FAILED
        elif ident == "kernel" and pid is None:
            fields["_TRANSPORT"] = "kernel"
        return t, fields

    for raw in lines:
        line = _line(raw)
        if head := STATUS_HEAD.fullmatch(line[:HEAD]):
            if pending is not None:
                yield finish()
                pending = None
            if status is not None:
                yield from status.failed
            status = _StatusHead(head["unit"].decode("utf-8", "replace"))
            continue
        if status is not None and pending is None and (said := status.read(line[:HEAD], tz)) is not None:
            yield from said
            continue
        if pending is not None and line[:1] in (b" ", b"\t"):
            indent = pending[3]
            stripped = line.lstrip(b" ")
            pending[2].append(line[min(indent, len(line) - len(stripped)) :])
            continue
        if not line.strip() or SEPARATOR.fullmatch(line[:HEAD]):
            continue
        if pending is not None:
            yield finish()
            pending = None
        head = line[:HEAD]
        t, end = _short_time(head, years, tz)
        if t is None and end == 0:
            yield None, {"MESSAGE": _text(line)}
            continue
        fields: Fields = {}
        start = end
        if found := SYSLOG_HEAD.match(head, end):
            fields["SYSLOG_IDENTIFIER"] = _text(found.group(1))
            if found.group(2):
                fields["_PID"] = _ascii(found.group(2))
            start = found.end()
        if status is not None and fields.get("SYSLOG_IDENTIFIER") not in ("systemd", "kernel"):
            fields["_SYSTEMD_UNIT"] = status.unit  # the lines below the head are the unit's, whatever runs in it
        pending = (t, fields, [line[start:]], start)
    if pending is not None:
        yield finish()
    if status is not None:
        yield from status.failed


def _short_time(head: bytes, years: _Years, tz: tzinfo | None) -> tuple[float | None, int]:
    """The time at the start of a short-format line and where it ends; (None, 0) without one."""
    if found := SHORT_TIME.match(head):
        month, day, hh, mm, ss, fraction = found.groups()
        number = MONTHS.get(month.rstrip(b".").decode("utf-8", "replace").lower().encode())
        t = years.at(number, int(day), (int(hh), int(mm), int(ss)), _fraction(fraction)) if number else None
        return t, found.end()
    if found := ISO_TIME.match(head):
        return _stamp(found.groups(), tz), found.end()
    return None, 0


def _docker(lines: Iterable[bytes], unit: str) -> Iterator[tuple[float | None, Fields]]:
    """docker logs -t (and kubectl logs --timestamps): an RFC 3339 time, one space, the line."""
    for raw in lines:
        line = _line(raw)
        if not line.strip():
            continue
        line, fields = _service(line, unit)
        t: float | None = None
        if (found := DOCKER_TIME.match(line[:HEAD])) and (t := _stamp(found.groups(), None)) is not None:
            line = line[found.end() :]
        if not line.strip():
            continue
        yield t, {**fields, "MESSAGE": _text(line)}


def _service(line: bytes, unit: str) -> tuple[bytes, Fields]:
    """A `docker compose logs` line is its service's, and a `kubectl logs --prefix` line its pod's container's:
    the line without its `service  | ` or `[pod/NAME/CONTAINER] `, and the fields that name the service
    or `NAME/CONTAINER` (its syslog identifier, as journalctl's short formats name a process)."""
    head = ANSI_BYTES.sub(b"", line[:HEAD]) if b"\x1b" in line[:HEAD] else line[:HEAD]
    if found := COMPOSE_BYTES.match(head) or KUBECTL_PREFIX.match(head):
        return head[found.end():] + line[HEAD:], {"SYSLOG_IDENTIFIER": _text(found.group(1))}
    return line, {"_SYSTEMD_UNIT": unit} if unit else {}


# A terminal session pasted whole: `$ ./llama-server -m …` (or `user@host:/dir# …`, after a conda or venv
# environment's `(name) `) starts the process, and a prompt alone after its output says it has ended, how
# it does not say.
PROMPT = rb"(?:\([\w.-]+\) )?(?:\$|[\w.-]+@[\w.-]+(?::[^\s$#]*)?[$#])"
COMMAND = re.compile(PROMPT + rb" +\S")
PROMPT_ALONE = re.compile(PROMPT + rb"\s*")
CTRL_C = re.compile(rb"(?:\^C)+ *")  # the terminal's echo of Ctrl-C: the user asked the process to stop
# --- container runtimes' log files --------------------------------------------------------------

MAX_LINE = 1024 * 1024  # a line joined from parts ends here: a writer that never ends its line cannot fill memory


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a container runtime's log file: a whole line, or a part of a longer one.

    Runtimes cut a line at 16 KiB (containerd's and Docker's default) and write each part as a record.
    """

    t: float | None  # seconds since the epoch
    stream: str  # stdout or stderr
    text: bytes
    partial: bool  # more of the same line follows in the next record of this stream


def rfc3339(text: str | bytes) -> float | None:
    """Seconds since the epoch of an RFC 3339 time with a zone ("2026-11-29T12:00:01.48291Z"); None otherwise."""
    raw = text.encode("ascii", "replace") if isinstance(text, str) else text
    # the fraction apart from the whole second, which the lines of one second share: one date computed a second
    head, rest = raw[:19], raw[19:]
    digits = b""
    if rest[:1] in (b".", b","):
        zone_at = len(rest) - 1 if rest.endswith(b"Z") else max(rest.rfind(b"+"), rest.rfind(b"-"), 1)
        digits, rest = rest[1:zone_at], rest[zone_at:]
        if not (0 < len(digits) <= 9 and digits.isdigit()):
            return None
    whole = _whole_second(head, rest)
    return whole + _fraction(digits) if whole is not None else None


@functools.lru_cache(maxsize=1024)
def _whole_second(head: bytes, zone: bytes) -> float | None:
    found = DOCKER_TIME.match(head + zone)
    return _stamp(found.groups(), None) if found and found.end() == len(head) + len(zone) and zone else None


STREAMS = {b"stdout": "stdout", b"stderr": "stderr"}


def cri_record(line: bytes) -> Record | None:
    """One line of a CRI log file, without its newline; None when it is not one."""
    # `TIME STREAM TAGS CONTENT`: split rather than matched, as the agent reads every line of every pod
    parts = line.split(b" ", 3)
    if len(parts) < 3 or (stream := STREAMS.get(parts[1])) is None:
        return None
    tag = parts[2]
    if tag[:1] not in (b"P", b"F") or (len(tag) > 1 and tag[1:2] != b":"):
        return None
    t = rfc3339(parts[0])
    if t is None:
        return None
    return Record(t, stream, parts[3] if len(parts) > 3 else b"", tag[:1] == b"P")


def docker_json_record(line: bytes) -> Record | None:
    """One line of Docker's json-file log; None when it is not one. A line's parts lack its newline."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or not isinstance(log := entry.get("log"), str):
        return None
    text = log.encode("utf-8", "replace")  # a lone surrogate escaped in the JSON
    stream, when = entry.get("stream"), entry.get("time")
    t = rfc3339(when) if isinstance(when, str) else None
    if text.endswith(b"\n"):
        return Record(t, stream if isinstance(stream, str) else "stdout", text[:-1], False)
    return Record(t, stream if isinstance(stream, str) else "stdout", text, True)


def joined(pending: bytes, record: Record) -> tuple[bytes, bytes | None]:
    """A record added to the parts of its stream's line that wait: (what still waits, the whole line or None)."""
    text = pending + record.text if pending else record.text
    if record.partial and len(text) < MAX_LINE:
        return text, None
    return b"", text


def _container(
    lines: Iterable[bytes], parse: Callable[[bytes], Record | None], unit: str
) -> Iterator[tuple[float | None, Fields]]:
    """CRI or json-file records: each whole line once, at the time of its last part."""
    pending: dict[str, bytes] = {}
    last: dict[str, float | None] = {}
    for raw in lines:
        record = parse(_line(raw))
        if record is None:
            if raw.strip():
                yield None, _unit_fields(_line(raw), unit)  # damaged: passed on as it is, untimed
            continue
        pending[record.stream], whole = joined(pending.get(record.stream, b""), record)
        last[record.stream] = record.t
        if whole is not None and whole.strip():
            yield record.t, _unit_fields(whole, unit)
    for stream, rest in pending.items():  # the file ends inside a line: what was written of it
        if rest.strip():
            yield last[stream], _unit_fields(rest, unit)


def _unit_fields(message: bytes, unit: str) -> Fields:
    fields: Fields = {"MESSAGE": _text(message)}
    if unit:
        fields["_SYSTEMD_UNIT"] = unit
    return fields


def _plain(
    lines: Iterable[bytes], unit: str, years: _Years, tz: tzinfo | None
) -> Iterator[tuple[float | None, Fields]]:
    """An engine's own output: each line is one MESSAGE, timed by the engine's own timestamp."""
    output = False  # a line of the process's own since its command
    for raw in lines:
        line = _line(raw)
        if not line.strip():
            continue
        line, fields = _service(line, unit)
        stop = CTRL_C.match(line) if unit else None
        if stop:
            echo, line = line[: stop.end()], line[stop.end() :]  # and what was printed on after it, on its line
        t = _plain_time(line, years, tz)
        if t is None:
            t = _glued_time(line, years, tz)
        if stop:
            yield t, _pid1(unit, MessageId.UNIT_STOPPING, echo)
            if not line.strip():
                continue
        if unit and COMMAND.match(line):
            yield t, _pid1(unit, MessageId.UNIT_STARTED, line)
            output = False
        elif unit and output and PROMPT_ALONE.fullmatch(line):
            yield t, _pid1(unit, MessageId.UNIT_PROCESS_EXIT, line)
            output = False
            continue
        else:
            output = True
        yield t, {**fields, "MESSAGE": _text(line)}


def _pid1(unit: str, message_id: str, message: bytes | str, **extra: str) -> Fields:
    """What PID 1 would have said of the unit, for a terminal session's command and returning prompt, and for
    what a `systemctl status` head says."""
    return {"_PID": "1", "UNIT": unit, "MESSAGE_ID": message_id,
            "MESSAGE": message if isinstance(message, str) else _text(message), **extra}


def _plain_stamp(line: bytes) -> tuple[tuple[bytes | None, ...], str] | None:
    """The groups and layout of the time a line of an engine's own output starts with, if any."""
    head = line[:HEAD]
    if b"\x1b" in head:
        head = ANSI_BYTES.sub(b"", head)
    for pattern, layout in PLAIN_TIMES:
        if found := pattern.match(head):
            return found.groups(), layout
    return None


@dataclass(frozen=True)
class _Printed:
    """What a log's own first dated lines say of its clock: the year (of the first full date) and the
    zone (of the first time with an offset); None where none of them says."""

    year: int | None = None
    zone: tzinfo | None = None


def _clock_in_head(lines: Iterable[bytes], unit: str) -> tuple[Iterable[bytes], _Printed]:
    """The lines, whole, and what the first of them print of their clock. An engine's output mixes
    formats: vLLM's yearless `MM-DD` beside SGLang's full dates, Go's `log` without a zone beside slog's
    offsets; the first take their year and zone from the others, all on one clock."""
    rest = iter(lines)
    head = list(itertools.islice(rest, CLOCK_LOOKAHEAD))
    year: int | None = None
    zone: tzinfo | None = None
    for raw in head:
        stamp = _plain_stamp(_service(_line(raw), unit)[0])
        if stamp is None or stamp[1] != "ymdhms":
            continue
        groups = stamp[0]
        if year is None and groups[0]:
            year = int(groups[0])
        if zone is None and len(groups) > 7 and groups[7]:
            with contextlib.suppress(ValueError):  # an offset of 24 hours or more: none
                zone = _zone(groups[7], None)
        if year is not None and zone is not None:
            break
    return itertools.chain(head, rest), _Printed(year, zone)


def _glued_time(line: bytes, years: _Years, tz: tzinfo | None) -> float | None:
    """The time of a dated line glued on after a bar's last \r redraw (a paste of a terminal's stdout and
    stderr): the whole line was written then, and the bar's redraws are dated back from it."""
    for part in reversed(line.split(b"\r")[1:]):
        if (t := _plain_time(part, years, tz)) is not None:
            return t
    return None


def _plain_time(line: bytes, years: _Years, tz: tzinfo | None) -> float | None:
    if (stamp := _plain_stamp(line)) is None:
        return None
    groups, layout = stamp
    if layout == "mdhms":
        mo, d, hh, mm, ss, fraction = groups
        return years.at(int(mo), int(d), (int(hh), int(mm), int(ss)), _fraction(fraction))
    if layout == "mdyhms":
        mo, d, y, hh, mm, ss = groups
        groups = (y, mo, d, hh, mm, ss, None)
    return _stamp(groups, tz)
