"""What every saved-log reader shares: journal-like fields, a line without its terminator, PID 1's words."""

from __future__ import annotations

from exporter.core.entries import FIELDS

Fields = dict[str, bytes | str]
WANTED = frozenset(FIELDS)  # the journal fields a replay keeps; everything else is dropped
HEAD = 512  # header regexes only ever look at this much of a line


def text(value: bytes) -> bytes | str:
    """A field value as str when it is valid UTF-8, else the raw bytes (as journald keeps it)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def line(raw: bytes) -> bytes:
    """One line without its terminator: \\n or \\r\\n (any other \\r is the message's own)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


def pid1(unit: str, message_id: str, message: bytes | str, **extra: str) -> Fields:
    """What PID 1 would have said of the unit, for a terminal session's command and returning prompt, and for
    what a `systemctl status` head says."""
    return {"_PID": "1", "UNIT": unit, "MESSAGE_ID": message_id,
            "MESSAGE": message if isinstance(message, str) else text(message), **extra}


def of_unit(message: bytes, unit: str) -> Fields:
    """A line of the unit's own output, as the journal would file it."""
    return {"MESSAGE": text(message), **({"_SYSTEMD_UNIT": unit} if unit else {})}
