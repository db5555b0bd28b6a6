"""Container runtimes' logs: containerd's and CRI-O's CRI files and Docker's json-file (whose records the agent
follows live too), `docker logs -t`, and the service or pod prefixes of `docker compose logs` and `kubectl logs`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from exporter.core.formats.clock import RFC3339, rfc3339, stamp
from exporter.core.formats.fields import HEAD, Fields, line, of_unit, text
from exporter.core.lines import ANSI

MAX_LINE = 1024 * 1024  # a line joined from parts ends here: a writer that never ends its line cannot fill memory
# The CRI logging format (kubelet's CRI spec): RFC 3339 time, stream, tags (P: a part of a longer line,
# F: the end of one), one space, the content. containerd writes Go's RFC3339Nano, whose zeros are trimmed.
CRI_RECORD = re.compile(RFC3339 + rb" (stdout|stderr) ([PF])(?::\S*)?(?: |$)")
DOCKER_TIME = re.compile(RFC3339 + rb"(?: |$)")  # docker logs -t, kubectl logs --timestamps
COMPOSE = re.compile(rb"([A-Za-z0-9][\w.-]*) +\| ?")  # `docker compose logs`' `service  | `
KUBECTL_PREFIX = re.compile(rb"\[pod/([^/\]\s]+/[^/\]\s]+)\] ")  # `kubectl logs --prefix`: `[pod/NAME/CONTAINER] `
ANSI_BYTES = re.compile(ANSI.pattern.encode())
STREAMS = {b"stdout": "stdout", b"stderr": "stderr"}


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a container runtime's log file: a whole line, or a part of a longer one.

    Runtimes cut a line at 16 KiB (containerd's and Docker's default) and write each part as a record.
    """

    t: float | None  # seconds since the epoch
    stream: str  # stdout or stderr
    text: bytes
    partial: bool  # more of the same line follows in the next record of this stream


def cri_record(raw: bytes) -> Record | None:
    """One line of a CRI log file, without its newline; None when it is not one."""
    # `TIME STREAM TAGS CONTENT`: split rather than matched, as the agent reads every line of every pod
    parts = raw.split(b" ", 3)
    if len(parts) < 3 or (stream := STREAMS.get(parts[1])) is None:
        return None
    tag = parts[2]
    if tag[:1] not in (b"P", b"F") or (len(tag) > 1 and tag[1:2] != b":"):
        return None
    t = rfc3339(parts[0])
    if t is None:
        return None
    return Record(t, stream, parts[3] if len(parts) > 3 else b"", tag[:1] == b"P")


def docker_json_record(raw: bytes) -> Record | None:
    """One line of Docker's json-file log; None when it is not one. A line's parts lack its newline."""
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or not isinstance(log := entry.get("log"), str):
        return None
    said = log.encode("utf-8", "replace")  # a lone surrogate escaped in the JSON
    stream, when = entry.get("stream"), entry.get("time")
    t = rfc3339(when) if isinstance(when, str) else None
    stream = stream if isinstance(stream, str) else "stdout"
    return Record(t, stream, said[:-1], False) if said.endswith(b"\n") else Record(t, stream, said, True)


def joined(pending: bytes, record: Record) -> tuple[bytes, bytes | None]:
    """A record added to the parts of its stream's line that wait: (what still waits, the whole line or None)."""
    whole = pending + record.text if pending else record.text
    if record.partial and len(whole) < MAX_LINE:
        return whole, None
    return b"", whole


def read_records(
    lines: Iterable[bytes], parse: Callable[[bytes], Record | None], unit: str
) -> Iterator[tuple[float | None, Fields]]:
    """CRI or json-file records: each whole line once, at the time of its last part."""
    pending: dict[str, bytes] = {}
    last: dict[str, float | None] = {}
    for raw in lines:
        record = parse(line(raw))
        if record is None:
            if raw.strip():
                yield None, of_unit(line(raw), unit)  # damaged: passed on as it is, untimed
            continue
        pending[record.stream], whole = joined(pending.get(record.stream, b""), record)
        last[record.stream] = record.t
        if whole is not None and whole.strip():
            yield record.t, of_unit(whole, unit)
    for stream, rest in pending.items():  # the file ends inside a line: what was written of it
        if rest.strip():
            yield last[stream], of_unit(rest, unit)


def read_docker(lines: Iterable[bytes], unit: str) -> Iterator[tuple[float | None, Fields]]:
    """docker logs -t (and kubectl logs --timestamps): an RFC 3339 time, one space, the line."""
    for raw in lines:
        body = line(raw)
        if not body.strip():
            continue
        body, fields = service(body, unit)
        t: float | None = None
        if (found := DOCKER_TIME.match(body[:HEAD])) and (t := stamp(found.groups(), None)) is not None:
            body = body[found.end() :]
        if body.strip():
            yield t, {**fields, "MESSAGE": text(body)}


def service(body: bytes, unit: str) -> tuple[bytes, Fields]:
    """A `docker compose logs` line is its service's, and a `kubectl logs --prefix` line its pod's container's:
    the line without its `service  | ` or `[pod/NAME/CONTAINER] `, and the fields that name the service
    or `NAME/CONTAINER` (its syslog identifier, as journalctl's short formats name a process)."""
    head = ANSI_BYTES.sub(b"", body[:HEAD]) if b"\x1b" in body[:HEAD] else body[:HEAD]
    if found := COMPOSE.match(head) or KUBECTL_PREFIX.match(head):
        return head[found.end():] + body[HEAD:], {"SYSLOG_IDENTIFIER": text(found.group(1))}
    return body, {"_SYSTEMD_UNIT": unit} if unit else {}
