"""Turn one raw journal MESSAGE into the clean text records an engine meant to print."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Regexes only ever look at the start of a record: a 1 MiB line must not cost 1 MiB of matching.
MAX_RECORD = 4096


def clean_records(message: str | bytes) -> list[str]:
    """Decode, strip colour and split on carriage returns.

    journald stores a record with `\\r` or invalid UTF-8 as bytes; a tqdm bar redrawn with `\\r`
    arrives as one record holding every redraw, so each redraw becomes a record of its own.
    A `\\r\\n` pair (vLLM's multi-line messages) just ends the record.
    """
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
    text = ANSI.sub("", text)
    parts = (part.strip("\n")[:MAX_RECORD] for part in text.split("\r"))
    return [part for part in parts if part.strip()]
