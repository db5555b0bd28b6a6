"""Which format a saved log is written in, from its first lines: each line votes for the format it looks like."""

from __future__ import annotations

import json
from enum import StrEnum

from exporter.core.formats.clock import engine_own
from exporter.core.formats.containers import CRI_RECORD, DOCKER_TIME
from exporter.core.formats.fields import HEAD, line
from exporter.core.formats.journal import FIELD_NAME
from exporter.core.formats.paste import FENCES
from exporter.core.formats.short import ISO_TIME, SEPARATOR, SHORT_TIME, SYSLOG_HEAD


class Format(StrEnum):
    """How a saved log is written; the values are journalctl's `-o` names where there is one. In the order of
    detection's ties: the stricter first."""

    JOURNAL_JSON = "json"  # journalctl -o json (or json-seq)
    JOURNAL_EXPORT = "export"  # journalctl -o export
    SHORT_ISO = "short-iso"  # journalctl -o short-iso[-precise], rsyslog's RFC 3339 files
    SHORT_PRECISE = "short-precise"  # journalctl -o short-precise: "Nov 29 12:00:01.123456 host …"
    SHORT = "short"  # journalctl [-o short]: "Nov 29 12:00:01 host ident[pid]: msg"
    CRI = "cri"  # containerd's and CRI-O's log files (/var/log/pods): "2026-11-29T12:00:01.12345Z stdout F line"
    DOCKER_JSON = "docker-json"  # Docker's json-file driver: {"log":"line\n","stream":"stdout","time":"…"}
    DOCKER = "docker"  # docker logs -t / kubectl logs --timestamps: "2026-11-29T12:00:01.123456789Z line"
    PLAIN = "plain"  # an engine's own output, as it would have reached the journal line by line


PRIORITY = tuple(Format)
# journalctl -x's explanatory catalog lines (`░░ Subject: …`; `-- Subject: …` before systemd 246), and a
# markdown fence around a pasted log
SAYS_NOTHING = ("░░".encode(), b"-- ", *FENCES)
JOURNAL_KEYS = ("__REALTIME_TIMESTAMP", "__CURSOR", "MESSAGE", "_BOOT_ID")


def _classify(body: bytes) -> Format | None:
    """Which format one line looks like; None for lines that say nothing (blank, separators, indented,
    journalctl -x's catalog text, a markdown fence around a paste)."""
    if not body.strip() or body[:1] in b" \t" or SEPARATOR.fullmatch(body[:HEAD]) or body.startswith(SAYS_NOTHING):
        return None
    if body[:1] in (b"{", b"\x1e"):
        try:
            entry = json.loads(body.lstrip(b"\x1e"))
        except (ValueError, RecursionError):
            return Format.PLAIN
        if isinstance(entry, dict) and any(key in entry for key in JOURNAL_KEYS):
            return Format.JOURNAL_JSON
        if isinstance(entry, dict) and isinstance(entry.get("log"), str) and "time" in entry:
            return Format.DOCKER_JSON
        return Format.PLAIN
    head = body[:HEAD]
    if engine_own(head):  # an engine's own head (TGI's), however much it looks like a prefix
        return Format.PLAIN
    if (found := ISO_TIME.match(head)) and SYSLOG_HEAD.match(head, found.end()):
        return Format.SHORT_ISO
    if found := SHORT_TIME.match(head):
        return Format.SHORT_PRECISE if found.group(6) else Format.SHORT
    if CRI_RECORD.match(head):
        return Format.CRI
    if DOCKER_TIME.match(head):
        return Format.DOCKER
    name, eq, _ = head.partition(b"=")
    if FIELD_NAME.fullmatch(name if eq else head):
        return Format.JOURNAL_EXPORT
    return Format.PLAIN


def detect(head: list[bytes]) -> Format:
    """The format of a saved log, from its first lines (raw, with or without their terminators).

    Each non-empty line votes for the format it looks like; the most votes win, ties going to the
    stricter format. Lines that look like nothing in particular vote PLAIN, so a file of engine
    output with no wrapper, an empty head and binary garbage all come out PLAIN.
    """
    votes = dict.fromkeys(PRIORITY, 0)
    for raw in head[:50]:
        kind = _classify(line(raw))
        if kind is not None:
            votes[kind] += 1
    if votes[Format.JOURNAL_EXPORT] and not any(
        line(raw).startswith((b"__CURSOR=", b"__REALTIME_TIMESTAMP=")) for raw in head[:50]
    ):
        votes[Format.PLAIN] += votes.pop(Format.JOURNAL_EXPORT)  # KEY=value lines alone prove nothing
    if not any(votes.values()):
        return Format.PLAIN
    return max(votes, key=lambda kind: (votes[kind], -PRIORITY.index(kind)))
