"""journalctl's short formats (short, short-precise, short-iso): `TIME host ident[pid]: message`, PID 1's words read
back into the lifecycle fields they lost, and `systemctl status`'s head above a unit's last lines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import tzinfo

from exporter.core.entries import SPAWN, MessageId
from exporter.core.formats.clock import MONTHS, RFC3339, Years, fraction, stamp
from exporter.core.formats.fields import HEAD, Fields, line, pid1, text

# the time, then "host ident[pid]: " (host absent when the entry has no _HOSTNAME)
SHORT_TIME = re.compile(
    rb"([^\s\d.]{3,12}\.?|\d{1,2}\xe6\x9c\x88) ?([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))? "
)
ISO_TIME = re.compile(RFC3339 + rb" ")
# "host ident[pid]: "; a host a user hid behind a placeholder may hold spaces (`<ollama server>`)
SYSLOG_HEAD = re.compile(rb"(?:<[^<>]{1,64}> |[^\s\[\]:]+ )?([^\s\[\]:]+)(?:\[(\d+)\])?:(?: |$)")
# journalctl's "-- Boot … --", "-- No entries --", "-- Logs begin at … --" lines
SEPARATOR = re.compile(rb"-- .* --")

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

    def read(self, said: bytes, tz: tzinfo | None) -> list[tuple[float | None, Fields]] | None:
        """PID 1's lines this line of the head says ([] for none yet), or None for a line of another kind."""
        if found := STATUS_ACTIVE.match(said):
            self.since = stamp((*found.groups()[2:], None), tz)
            if result := found["result"]:
                self.failed.append((self.since, pid1(self.unit, MessageId.UNIT_FAILURE_RESULT,
                                                     f"{self.unit}: Failed with result '{result.decode()}'.",
                                                     UNIT_RESULT=result.decode())))
                return []
            if found["state"] in (b"active", b"activating", b"reloading"):
                return [(self.since, pid1(self.unit, MessageId.UNIT_STARTED, f"Started {self.unit}."))]
            return []
        if (found := STATUS_MAIN_EXIT.match(said)) and self.since is not None:
            name = (found["name"] or b"n/a").decode()
            self.failed.insert(0, (self.since, pid1(self.unit, MessageId.UNIT_PROCESS_EXIT,
                                                    f"{self.unit}: Main process exited, code={found['code'].decode()}, "
                                                    f"status={found['status'].decode()}/{name}")))
            return []
        return None


def read_short(lines: Iterable[bytes], years: Years, tz: tzinfo | None) -> Iterator[tuple[float | None, Fields]]:
    """journalctl short, short-precise and short-iso[-precise]; journalctl prints the later lines of
    a multi-line MESSAGE indented under the first, so they are joined back with \\n. `systemctl status`'s
    head above them says what PID 1 would have (_StatusHead)."""
    pending: tuple[float | None, Fields, list[bytes], int] | None = None
    status: _StatusHead | None = None

    def finish() -> tuple[float | None, Fields]:
        assert pending is not None
        t, fields, parts, _ = pending
        fields["MESSAGE"] = text(b"\n".join(parts))
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
        body = line(raw)
        if head := STATUS_HEAD.fullmatch(body[:HEAD]):
            if pending is not None:
                yield finish()
                pending = None
            if status is not None:
                yield from status.failed
            status = _StatusHead(head["unit"].decode("utf-8", "replace"))
            continue
        if status is not None and pending is None and (said := status.read(body[:HEAD], tz)) is not None:
            yield from said
            continue
        if pending is not None and body[:1] in (b" ", b"\t"):
            indent = pending[3]
            stripped = body.lstrip(b" ")
            pending[2].append(body[min(indent, len(body) - len(stripped)) :])
            continue
        if not body.strip() or SEPARATOR.fullmatch(body[:HEAD]):
            continue
        if pending is not None:
            yield finish()
            pending = None
        head = body[:HEAD]
        t, end = _short_time(head, years, tz)
        if t is None and end == 0:
            yield None, {"MESSAGE": text(body)}
            continue
        fields: Fields = {}
        start = end
        if found := SYSLOG_HEAD.match(head, end):
            fields["SYSLOG_IDENTIFIER"] = text(found.group(1))
            if found.group(2):
                fields["_PID"] = found.group(2).decode("ascii", "replace")
            start = found.end()
        if status is not None and fields.get("SYSLOG_IDENTIFIER") not in ("systemd", "kernel"):
            fields["_SYSTEMD_UNIT"] = status.unit  # the lines below the head are the unit's, whatever runs in it
        pending = (t, fields, [body[start:]], start)
    if pending is not None:
        yield finish()
    if status is not None:
        yield from status.failed


def _short_time(head: bytes, years: Years, tz: tzinfo | None) -> tuple[float | None, int]:
    """The time at the start of a short-format line and where it ends; (None, 0) without one."""
    if found := SHORT_TIME.match(head):
        month, day, hh, mm, ss, part = found.groups()
        number = MONTHS.get(month.rstrip(b".").decode("utf-8", "replace").lower().encode())
        t = years.at(number, int(day), (int(hh), int(mm), int(ss)), fraction(part)) if number else None
        return t, found.end()
    if found := ISO_TIME.match(head):
        return stamp(found.groups(), tz), found.end()
    return None, 0
