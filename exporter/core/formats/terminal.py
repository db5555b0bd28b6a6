"""An engine's own output, as a file or a terminal session: each line one MESSAGE, dated by the engine's own time;
a pasted command starts the process, a prompt alone after its output says it ended, `^C` that it was stopped."""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterable, Iterator
from datetime import tzinfo

from exporter.core.entries import MessageId
from exporter.core.formats.clock import Years, printed_time, time_of, zone_of
from exporter.core.formats.containers import ANSI_BYTES, service
from exporter.core.formats.fields import HEAD, Fields, line, pid1, text

# `$ ./llama-server -m …` (or `user@host:/dir# …`, after a conda or venv environment's `(name) `) starts the process,
# and a prompt alone after its output says it has ended, how it does not say.
PROMPT = rb"(?:\([\w.-]+\) )?(?:\$|[\w.-]+@[\w.-]+(?::[^\s$#]*)?[$#])"
COMMAND = re.compile(PROMPT + rb" +\S")
PROMPT_ALONE = re.compile(PROMPT + rb"\s*")
CTRL_C = re.compile(rb"(?:\^C)+ *")  # the terminal's echo of Ctrl-C: the user asked the process to stop
HEAD_LINES = 200  # lines of an engine's own output looked at for the year and zone it prints, and its services


def read_plain(lines: Iterable[bytes], unit: str, year: int, tz: tzinfo | None) -> Iterator[tuple[float | None, Fields]]:
    """The lines, each one MESSAGE of the unit's; times printed without a zone are taken in `tz`, else in the zone
    the first lines print, else in this machine's; without a year, in the year of the first full date the first
    lines print (an engine's output mixes layouts: vLLM's `MM-DD` beside SGLang's full dates), else in `year`.
    In `docker compose` output of one service (or `kubectl logs --prefix` of one container), a line without its
    prefix lost it (a `\r` bar redrawn over it) and is that service's."""
    lines, (printed_year, printed_zone), services = _head(lines, unit)
    tz = tz or printed_zone
    years = Years(printed_year or year, tz)
    only: Fields = {"SYSLOG_IDENTIFIER": services.pop()} if len(services) == 1 else {}
    unit = f"{only['SYSLOG_IDENTIFIER']}.service" if only else unit
    output = False  # a line of the process's own since its command
    for raw in lines:
        body = line(raw)
        if not body.strip():
            continue
        body, fields = service(body, unit)
        fields = only if only and "SYSLOG_IDENTIFIER" not in fields else fields
        stop = CTRL_C.match(body) if unit else None
        if stop:
            echo, body = body[: stop.end()], body[stop.end() :]  # and what was printed on after it, on its line
        # a dated line glued on after a bar's last \r redraw (a terminal's stdout and stderr) was written then
        t = next((t for part in (body, *reversed(body.split(b"\r")[1:])) if (t := _time(part, years, tz)) is not None),
                 None)
        if stop:
            yield t, pid1(unit, MessageId.UNIT_STOPPING, echo)
            if not body.strip():
                continue
        if unit and COMMAND.match(body):
            yield t, pid1(unit, MessageId.UNIT_STARTED, body)
            output = False
        elif unit and output and PROMPT_ALONE.fullmatch(body):
            yield t, pid1(unit, MessageId.UNIT_PROCESS_EXIT, body)
            output = False
            continue
        else:
            output = True
        yield t, {**fields, "MESSAGE": text(body)}


def _printed(body: bytes) -> re.Match[bytes] | None:
    head = body[:HEAD]
    return printed_time(ANSI_BYTES.sub(b"", head) if b"\x1b" in head else head)


def _time(body: bytes, years: Years, tz: tzinfo | None) -> float | None:
    found = _printed(body)
    return time_of(found, years, tz) if found else None


def _head(lines: Iterable[bytes], unit: str) -> tuple[Iterable[bytes], tuple[int | None, tzinfo | None], set[str]]:
    """The lines, whole; the year (of the first full date) and zone (of the first time with an offset) their first
    lines print (Go's `log` without a zone beside slog's offsets, all on one clock); the services they name."""
    rest = iter(lines)
    head = list(itertools.islice(rest, HEAD_LINES))
    year: int | None = None
    zone: tzinfo | None = None
    services = set()
    for raw in head:
        body, fields = service(line(raw), unit)
        if isinstance(named := fields.get("SYSLOG_IDENTIFIER"), str):
            services.add(named)
        named = found.groupdict() if (found := _printed(body)) else {}
        year = year or int(named.get("year") or 0) or None
        if zone is None and named.get("year") and named.get("zone"):
            with contextlib.suppress(ValueError):  # an offset of 24 hours or more: none
                zone = zone_of(named["zone"], None)
    return itertools.chain(head, rest), (year, zone), services
