"""A journal entry (its fields, as the journal or a saved log gives them) as the core's observations; pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from exporter.core.lines import clean_records, redraw_ages
from exporter.core.model import Event, Lifecycle, LogLine, Observation, Suppressed, XidError, frozen_map

# The journal fields a replay keeps (those `to_observations` reads, and the
# identifier a caller maps to a unit when a format has no _SYSTEMD_UNIT); everything else is dropped.
FIELDS = (
    "MESSAGE",
    "_SYSTEMD_UNIT",
    "_PID",
    "UNIT",
    "MESSAGE_ID",
    "_SYSTEMD_INVOCATION_ID",
    "INVOCATION_ID",
    "UNIT_RESULT",
    "_TRANSPORT",
    "SYSLOG_IDENTIFIER",
    "OBJECT_SYSTEMD_UNIT",  # journald's "Suppressed N messages from UNIT" notice names the unit here
    "N_DROPPED",
    "CONTAINER_NAME",  # Docker's and Podman's journald log driver: the container a line is from
    "_COMM",  # which program wrote the entry (trusted): the container runtime, for CONTAINER_NAME
)
# The programs whose CONTAINER_NAME is believed: Docker's daemon and Podman's conmon write their containers'
# output to the journal themselves, so journald files it under their own unit (docker.service, a scope).
CONTAINER_LOGGERS = frozenset({"dockerd", "conmon"})


class MessageId(StrEnum):
    """The MESSAGE_IDs of PID 1's unit lifecycle lines and journald's own notices (src/systemd/sd-messages.h,
    docs/log-markers.md §9): their texts differ across systemd versions, their ids do not."""

    UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
    UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"
    UNIT_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
    UNIT_STOPPED = "9d1aaa27d60140bd96365438aad20286"
    UNIT_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
    UNIT_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"
    UNIT_RESOURCES = "ae8f7b866b0347b9af31fe1c80b127c0"
    UNIT_SUCCESS = "7ad2d189f7e94e70a38c781354912448"
    UNIT_FAILURE_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"
    UNIT_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
    UNIT_OUT_OF_MEMORY = "fe6faa94e7774663a0da52717891d8ef"
    UNIT_OOMD_KILL = "d989611b15e44c9dbf31e3c81256e4ed"  # "UNIT: systemd-oomd killed N process(es) in this unit."
    JOURNAL_DROPPED = "a596d6fe7bfa4994828e72309e95d61e"  # journald: "Suppressed N messages from UNIT"
    SPAWN_FAILED = "641257651c1b4ec9a8624d7a40a9e1e7"  # "UNIT: Failed at step EXEC spawning PATH: …"


# PID 1's unit lifecycle messages (src/systemd/sd-messages.h); text differs across versions, ids do not.
LIFECYCLE_IDS: Mapping[str, Event] = frozen_map(
    {
        MessageId.UNIT_STARTED: Event.STARTED,
        MessageId.UNIT_PROCESS_EXIT: Event.EXITED,
        MessageId.UNIT_FAILURE_RESULT: Event.FAILED,
        MessageId.UNIT_RESTART_SCHEDULED: Event.RESTART_SCHEDULED,
        MessageId.UNIT_STOPPING: Event.STOPPING,
        MessageId.UNIT_STOPPED: Event.STOPPED,
        MessageId.UNIT_SUCCESS: Event.STOPPED,  # "Deactivated successfully."
        MessageId.UNIT_OUT_OF_MEMORY: Event.OOM_KILLED,
        MessageId.UNIT_OOMD_KILL: Event.OOM_KILLED,  # systemd-oomd's, under memory pressure, before the kernel's
    }
)
EXIT = re.compile(r"[Mm]ain process exited, code=(\w+), status=(\d+)/(\w+)")
FAILED_RESULT = re.compile(r"Failed with result '([\w-]+)'")
# The process systemd forked for the unit, already in the unit's cgroup, says which step of its set-up failed
# (ExecStart's binary missing or not executable, User=, WorkingDirectory=…) and exits. The same id, at
# level info, says an ignored `-` command is missing: no failure.
SPAWN = re.compile(r"Failed at step (\w+) spawning ")
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d{1,6})\b")
COUNT = re.compile(r"[0-9]{1,12}")  # ASCII digits, bounded: a saved log can hold anything


def field_text(value: bytes | str | list | None) -> str:  # type: ignore[type-arg]
    """A journal field as text: bytes decoded, the first of a field given twice, "" for none."""
    if isinstance(value, list):  # a field given twice: journald keeps both, the first one counts
        value = value[0] if value else None
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def container_name(fields: Mapping[str, bytes | str]) -> str:
    """The container an entry is the output of (the journald log driver's CONTAINER_NAME), or "".

    CONTAINER_NAME is a field any local program may set: it is believed only from the container runtime,
    which journald names in the trusted `_COMM`.
    """
    if field_text(fields.get("_COMM")) not in CONTAINER_LOGGERS:
        return ""
    return field_text(fields.get("CONTAINER_NAME"))


def log_lines(message: bytes | str, t: float, unit: str, invocation: str = "") -> list[Observation]:
    """One record a unit printed (a journal MESSAGE, or a container's line) as the LogLines it holds."""
    records = clean_records(message)
    # A \r bar arrives when it ends; date each redraw back to when it was drawn.
    return [LogLine(t - age, unit, r, invocation) for r, age in zip(records, redraw_ages(records))]


def to_observations(
    fields: Mapping[str, bytes | str], t: float, units: frozenset[str]
) -> list[Observation | XidError]:
    """One journal entry as observations of the watched units or a GPU Xid; [] for anything else.

    `UNIT=` is a field any local user may set, so lifecycle lines are believed only from PID 1,
    and Xid lines only from the kernel: journald fills in `_PID` and `_TRANSPORT` itself
    (systemd.journal-fields(7): trusted fields).
    """
    transport = field_text(fields.get("_TRANSPORT"))
    if transport == "driver" and field_text(fields.get("MESSAGE_ID")) == MessageId.JOURNAL_DROPPED:  # journald's own word
        unit = field_text(fields.get("OBJECT_SYSTEMD_UNIT"))
        dropped = field_text(fields.get("N_DROPPED"))
        return [Suppressed(t, unit, int(dropped))] if unit in units and COUNT.fullmatch(dropped) else []
    if transport == "kernel":
        found = XID.search(field_text(fields.get("MESSAGE")))
        return [XidError(t, found.group(1).lower(), int(found.group(2)), "kernel")] if found else []
    container = container_name(fields)
    unit = container or field_text(fields.get("_SYSTEMD_UNIT"))
    if unit in units:
        # the runtime's own invocation id is no start of the container's: its starts are told by its processes
        invocation = "" if container else field_text(fields.get("_SYSTEMD_INVOCATION_ID"))
        message = fields.get("MESSAGE", b"")
        if field_text(fields.get("MESSAGE_ID")) == MessageId.SPAWN_FAILED and (found := SPAWN.search(field_text(message))):
            return [Lifecycle(t, unit, Event.SPAWN_FAILED, found.group(1), invocation)]
        return log_lines(message[0] if isinstance(message, list) and message else message or b"", t, unit, invocation)
    subject = field_text(fields.get("UNIT"))
    if subject not in units or field_text(fields.get("_PID")) != "1":
        return []
    event = LIFECYCLE_IDS.get(field_text(fields.get("MESSAGE_ID")))
    if event is None:
        return []
    message = field_text(fields.get("MESSAGE"))
    detail = ""
    if event is Event.EXITED and (found := EXIT.search(message)):
        detail = "/".join(found.groups())
    elif event is Event.FAILED:
        found = FAILED_RESULT.search(message)
        detail = field_text(fields.get("UNIT_RESULT")) or (found.group(1) if found else "")
    return [Lifecycle(t, subject, event, detail, field_text(fields.get("INVOCATION_ID")))]
