"""One raw MESSAGE (a journal's, a container runtime's line) as the records it holds: colour gone, \r redraws apart.

Nothing else is taken off: the agent reads what the engine printed, as the source gives it. Repairs for what a
user's paste did to a log are replay's alone (exporter.core.formats.paste)."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# Regexes only ever look at the start of a record: a 1 MiB line must not cost 1 MiB of matching.
MAX_RECORD = 4096


# tqdm's "[elapsed<remaining" field: when a bar redrawn with \r reaches the journal in one burst at
# its end, each redraw's elapsed time says how long before the burst it was really drawn.
# Hours take at most 6 digits: any text can hold "[" + 400 nines + ":00:00<", whose age (an int past
# float's range) made `t - age` raise OverflowError in to_observations, which killed the journal reader
# on that entry again after every restart (found by tests/test_fuzz.py).
TQDM_ELAPSED = re.compile(r"\[(?:(\d{1,6}):)?(\d\d):(\d\d)<")


def redraw_ages(records: list[str]) -> list[float]:
    """For each record, how many seconds before the last one it was drawn (0 when it cannot tell)."""
    if len(records) < 2:  # a record is drawn when it is drawn: what nearly every line is
        return [0.0] * len(records)
    elapsed = [_elapsed(r) for r in records]
    last = next((e for e in reversed(elapsed) if e is not None), 0)  # none: every one is None, 0.0 below
    return [max(0.0, last - e) if e is not None else 0.0 for e in elapsed]


def _elapsed(record: str) -> float | None:
    found = TQDM_ELAPSED.search(record)
    if not found:
        return None
    hours, minutes, seconds = found.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)


def clean_records(message: str | bytes) -> list[str]:
    """Decode, strip colour, and split on carriage returns.

    journald stores a record with `\\r` or invalid UTF-8 as bytes; a tqdm bar redrawn with `\\r`
    arrives as one record holding every redraw, so each redraw becomes a record of its own.
    A `\\r\\n` pair (vLLM's multi-line messages) just ends the record.
    """
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
    text = ANSI.sub("", text)
    parts = (part.strip("\n")[:MAX_RECORD] for part in text.split("\r"))
    return [part for part in parts if part.strip()]


def blank(message: bytes) -> bool:
    """Whether clean_records finds no record in a raw MESSAGE that fits a record: decided from its first byte
    where that can (colour codes start with ESC and a \\r split leaves the first part whole, so a printable
    first byte is a record), exactly otherwise."""
    first = message.lstrip()[:1]
    if b"!" <= first <= b"~":
        return False
    return not clean_records(message)  # only whitespace, or a control or non-ASCII byte first: decide exactly
