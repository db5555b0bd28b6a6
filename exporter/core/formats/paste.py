"""Paste repair, for saved logs only (never the live agent's): the frame a paste puts around all its lines, and the
debris a page, a terminal or a wrapper leaves around each line an engine printed."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator

from exporter.core.formats.containers import COMPOSE
from exporter.core.formats.fields import Fields, line
from exporter.core.lines import clean_records

# What a paste may carry on every line, around the log: a markdown quote's marks (nested too); `grep -n`'s line
# numbers (`109:`, `110-` beside a match), `cat -n`'s, a paste site's (`  12. `). A number followed by a digit
# is a time's or a date's.
FRAMES = (
    re.compile(rb"^(?:>[ \t]?)+"),
    re.compile(rb"^\d{1,7}[:-](?=\D)"),
    re.compile(rb"^ *\d{1,7}\t"),
    re.compile(rb"^ *\d{1,7}\. "),
)
FENCES = (b"```", b"~~~")  # a markdown fence around a pasted log


# A log viewer's first column, the name of the container or pod each line is from (`kserve-container (EngineCore_0
# pid=58) INFO …`): one lower-case name before every line that is not a continuation (indented: a traceback's frames).
COLUMN = re.compile(rb"[a-z][a-z_.-]*[a-z] (?=\S)")


def frame(head: list[bytes]) -> re.Pattern[bytes] | None:
    """The frame around every line of a paste (FRAMES: a markdown quote, `grep -n`'s numbers, with the indent every line
    has inside it; or that indent alone: markdown's indented code block; or a viewer's COLUMN), when every line of its
    head that says anything is in it: the frame is the paste's, in none of its lines, and hides their format.
    `unframed` takes it off."""
    said = [body for body in map(line, head) if body.strip() and not body.startswith(FENCES)]  # a fence outside
    found = next((found for found in FRAMES if said and all(found.match(body) for body in said)), None)
    if indent := _shared_indent([found.sub(b"", body, count=1) for body in said] if found else said):
        return re.compile((found.pattern if found else b"^") + re.escape(indent))
    if found:
        return found
    starts = [body for body in said if body[:1] not in b" \t"]
    column = COLUMN.match(starts[0]) if len(starts) >= 3 else None
    named = re.compile(re.escape(column.group()) + rb"(?=\S)") if column else None
    return named if named and all(named.match(body) for body in starts) else None


def _shared_indent(lines: list[bytes]) -> bytes:
    """The blanks every one of `lines` starts with."""
    shared = os.path.commonprefix(lines) if lines else b""
    return shared[: len(shared) - len(shared.lstrip(b" \t"))]


def unframed(lines: Iterable[bytes], found: re.Pattern[bytes]) -> Iterator[bytes]:
    """The lines of a paste without its frame."""
    return (found.sub(b"", raw, count=1) for raw in lines)


# What a line picks up around what the engine printed on its way into a paste: docker compose's `service  | `
# (also in the journal of a unit that runs `docker compose up`), a wrapper's logger, markdown quotes, a terminal's
# box borders (k9s, rich), stray backticks (an odd one out: a code span's pair is the engine's), Ray's
# `[repeated 30x across cluster]`, markdown's strong emphasis (`in **17 secs**`, never a lone `**kwargs`), links
# a forum made of file names (`[main.rs:329:](http://main.rs/…)`) or a phone of a date and hour (`[[2025-11-19
# 14](tel:2025-11-19 14):41:27]`), and colour codes that lost their ESC (`[1;36m`, CloudWatch's `#033[2m`, a
# pager's `^[[0m`). Left on, these break every anchored rule (`^Connected$`) and every number a rule reads.
SERVICE = re.compile(COMPOSE.pattern.decode())
# A program that runs the engine and logs its output through its own logger: Python's logging with
# `%(asctime)s - %(name)s - %(levelname)s - ` (an app wrapping vLLM or SGLang), TorchServe's MODEL_LOG.
WRAPPER = re.compile(
    r"\d{4}-\d\d-\d\d[ T][\d:,.]+ - [\w.]+ - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
    r"|\S+ \[(?:DEBUG|INFO|WARN|ERROR) ?\] \S+ MODEL_LOG - "
)
QUOTE_OR_BORDER = re.compile(r"(?:>[ \t]*)+(?:\|[ \t]*)?|│[ \t]*|`+[ \t]*")  # a quoted table's `>   | ` too
TAIL = re.compile(r"[ \t]*(?:│[ \t]*$|\[repeated \d+x across cluster\].*$)")
COLOUR = re.compile(r"(?:#033|\^\[)\[[0-9;]*[A-Za-z]|\[\d+(?:;\d+)*m")
EMPHASIS = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")  # CommonMark: no space just inside the delimiters
LINK = re.compile(r"\[([^\]]*)\]\((?:https?://|tel:)[^)]*\)")
# A cheap first look: most lines carry none of the above.
SIGNS = re.compile(r"^[>│`\d]|\| |\*\*|\[[\d;]*m|#033\[|\^\[\[|[│`]$|x across cluster\]|\]\((?:https?|tel):|MODEL_LOG - ")


def unframe(record: str) -> str:
    """One record as the engine printed it, without the debris around it (see above)."""
    if not SIGNS.search(record):
        return record
    record = LINK.sub(r"\1", EMPHASIS.sub(r"\1", COLOUR.sub("", record)))
    for head in (SERVICE, WRAPPER, QUOTE_OR_BORDER):
        if found := head.match(record):
            record = record[found.end() :]
    record = TAIL.sub("", record, count=1)
    if record.endswith("`") and record.count("`") % 2:
        record = record.rstrip("`").rstrip(" \t")
    return record


def repaired(fields: Fields) -> Fields:
    """An entry of a pasted log with its MESSAGE as the engine printed it: each `\\r` redraw unframed."""
    message = fields.get("MESSAGE")
    if not message:
        return fields
    bare = "\r".join(map(unframe, clean_records(message)))
    return fields if bare == message else {**fields, "MESSAGE": bare}
