"""Turn one raw journal MESSAGE into the clean text records an engine meant to print."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# What a line picks up around what the engine printed, on its way into a container's log or a user's
# paste, and is not the engine's: docker compose's `service  | ` (also in the journal of a unit that
# runs `docker compose up`), markdown quotes, a terminal's box borders (k9s, rich), stray backticks,
# Ray's `[repeated 30x across cluster]`, markdown emphasis (`in **17 secs**`) and links a forum made of
# file names (`[main.rs:329:](http://main.rs/…)`), and colour codes that lost their ESC on the way
# (`[1;36m`, CloudWatch's `#033[2m`, a pager's `^[[0m`), and a phone's `tel:` links around a date and hour
# (`[[2025-11-19 14](tel:2025-11-19 14):41:27]`). Left on, these break every anchored rule
# (`^Connected$`) and every number a rule reads.
COMPOSE = re.compile(r"([A-Za-z0-9][\w.-]*) +\| ?")
# A program that runs the engine and logs its output through its own logger: Python's logging with
# `%(asctime)s - %(name)s - %(levelname)s - ` (an app wrapping vLLM or SGLang), TorchServe's MODEL_LOG.
WRAPPER = re.compile(
    r"\d{4}-\d\d-\d\d[ T][\d:,.]+ - [\w.]+ - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
    r"|\S+ \[(?:DEBUG|INFO|WARN|ERROR) ?\] \S+ MODEL_LOG - "
)
FRAMING_HEAD = re.compile(r"(?:>[ \t]*)+(?:\|[ \t]*)?|│[ \t]*|`+[ \t]*")  # a quoted table's `>   | ` too
FRAMING_TAIL = re.compile(r"[ \t]*(?:(?:│|`+)[ \t]*$|\[repeated \d+x across cluster\].*$)")
EMPHASIS_OR_COLOUR = re.compile(r"\*\*|(?:#033|\^\[)\[[0-9;]*[A-Za-z]|\[\d+(?:;\d+)*m")
LINK = re.compile(r"\[([^\]]*)\]\((?:https?://|tel:)[^)]*\)")


def unframe(record: str) -> str:
    """The line as the engine printed it, without the framing around it (see above)."""
    # A cheap first look, substring tests only: this runs for every line a unit prints, and most lines
    # carry no framing at all.
    if not (
        record[:1] in ">│`"
        or "| " in record[:48]
        or "**" in record
        or "[0m" in record
        or "[m" in record
        or "[1;" in record
        or "#033[" in record
        or "^[[" in record
        or record[-1:] in "│`"
        or "x across cluster" in record
        or "](http" in record
        or "](tel:" in record
        # a wrapper logger's asctime comes first (WRAPPER); an access log's ` - ` after a client address does not
        or (record[:1].isdigit() and " - " in record[:100])
        or "MODEL_LOG - " in record[:200]
    ):
        return record
    record = LINK.sub(r"\1", EMPHASIS_OR_COLOUR.sub("", record))
    if head := COMPOSE.match(record):
        record = record[head.end() :]
    if head := WRAPPER.match(record):
        record = record[head.end() :]
    record = FRAMING_HEAD.sub("", record, count=1) if record[:1] in ">│`" else record
    return FRAMING_TAIL.sub("", record, count=1)


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
    last = next((e for e in reversed(elapsed) if e is not None), None)
    if last is None:
        return [0.0] * len(records)
    return [max(0.0, last - e) if e is not None else 0.0 for e in elapsed]


def _elapsed(record: str) -> float | None:
    found = TQDM_ELAPSED.search(record)
    if not found:
        return None
    hours, minutes, seconds = found.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)


def clean_records(message: str | bytes) -> list[str]:
    """Decode, strip colour and framing, and split on carriage returns.

    journald stores a record with `\\r` or invalid UTF-8 as bytes; a tqdm bar redrawn with `\\r`
    arrives as one record holding every redraw, so each redraw becomes a record of its own.
    A `\\r\\n` pair (vLLM's multi-line messages) just ends the record.
    """
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
    text = ANSI.sub("", text)
    parts = (unframe(part.strip("\n")[:MAX_RECORD]) for part in text.split("\r"))
    return [part for part in parts if part.strip()]
