"""The agent's journal reader on what the tests' sandbox cannot produce live: PID 1's lifecycle lines (systemd
is not PID 1 here) and the kernel's `NVRM: Xid` lines (there is no NVIDIA driver). They are written, with
the journal's own export format, into journal files by systemd-journal-remote, which keeps the trusted
fields (`_PID`, `_TRANSPORT`) as given, and read by the real JournalSource from that folder: its match for
a unit's earlier lines (its own, and PID 1's about it), then its live reading, as on a host.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from bench.common import JOURNAL_REMOTE
from exporter.core.entries import MessageId
from exporter.core.model import Event, Lifecycle, LogLine, XidError
from exporter.sources.journal import JournalPlace
from exporter.sources.journal_process import JournalSource
from tests.needs import needs
from tests.scrape import wait_for

REMOTE = next((path for path in JOURNAL_REMOTE if Path(path).exists()), None)
pytestmark = needs(REMOTE, "systemd-journal-remote (Debian package systemd-journal-remote)")
BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
EARLIER_BOOT_BEGAN = 8 * 86400
UNIT = "vllm-glm5.service"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


def _entry(ago: float, boot: str = BOOT, **fields: str) -> bytes:
    """One entry in export format, `ago` seconds before now, of this boot unless `boot` names an earlier one
    (which began EARLIER_BOOT_BEGAN seconds ago: its monotonic clock counts from then)."""
    up = time.monotonic() if boot == BOOT else EARLIER_BOOT_BEGAN
    head = {"__REALTIME_TIMESTAMP": str(int((time.time() - ago) * 1e6)),
            "__MONOTONIC_TIMESTAMP": str(int((up - ago) * 1e6)), "_BOOT_ID": boot,
            "_HOSTNAME": "gpu-node-17"}
    return b"".join(f"{k}={v}\n".encode() for k, v in {**head, **fields}.items()) + b"\n"


def _pid1(ago: float, message_id: str, message: str, **extra: str) -> bytes:
    return _entry(ago, _PID="1", _SYSTEMD_UNIT="init.scope", _TRANSPORT="journal", SYSLOG_IDENTIFIER="systemd",
                  UNIT=UNIT, MESSAGE_ID=message_id, MESSAGE=message, **extra)


def _write(path: Path, *entries: bytes) -> None:
    subprocess.run([REMOTE, f"--output={path}", "--split-mode=none", "-"], input=b"".join(entries), check=True,
                   capture_output=True, timeout=30)


@pytest.fixture
def journal_folder(tmp_path):
    folder = tmp_path / "journal"
    folder.mkdir()
    return folder


@pytest.fixture
def reading(journal_folder):
    """A JournalSource on the folder, watching UNIT; stopped at teardown."""
    source = JournalSource(JournalPlace(directory=journal_folder))
    yield source
    source.stop()


def test_pid1s_lines_about_a_unit_are_read_and_only_pid1s(journal_folder, reading):
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    _write(journal_folder / "earlier.journal",
           _pid1(9, MessageId.UNIT_STARTED, f"Started {UNIT} - vLLM GLM-5.", INVOCATION_ID=first),
           _entry(8, _SYSTEMD_UNIT=UNIT, _PID="4242", _TRANSPORT="stdout", _SYSTEMD_INVOCATION_ID=first,
                  MESSAGE="INFO 11-29 07:06:40 [api_server.py:1] vLLM API server version 0.11.0"),
           # a local user's forgery: UNIT= and a MESSAGE_ID anyone may write, from another unit's process
           _entry(7, _SYSTEMD_UNIT="evil.service", _PID="666", _TRANSPORT="journal", UNIT=UNIT,
                  MESSAGE_ID=MessageId.UNIT_PROCESS_EXIT, MESSAGE=f"{UNIT}: Main process exited, code=exited, status=0/SUCCESS"),
           _entry(6, _TRANSPORT="kernel", MESSAGE=XID),  # before the agent: not an Xid it counts
           _pid1(5, MessageId.UNIT_PROCESS_EXIT, f"{UNIT}: Main process exited, code=killed, status=9/KILL",
                 INVOCATION_ID=first),
           _pid1(5, MessageId.UNIT_FAILURE_RESULT, f"{UNIT}: Failed with result 'signal'.", UNIT_RESULT="signal",
                 INVOCATION_ID=first))
    reading.watch([UNIT])
    reading.start()
    wait_for(lambda: UNIT in reading.ready_units, 20, "the unit's earlier lines read")
    assert reading.status.health.up, "a folder of journal files is a journal that can be read"
    earlier = reading.drain()
    assert [(type(o).__name__, getattr(o, "event", None), getattr(o, "detail", "")) for o in earlier] == [
        ("Lifecycle", Event.STARTED, ""),
        ("LogLine", None, ""),
        ("Lifecycle", Event.EXITED, "killed/9/KILL"),
        ("Lifecycle", Event.FAILED, "signal"),
    ]
    assert earlier[0] == Lifecycle(earlier[0].t, UNIT, Event.STARTED, "", first)

    # Live, in a file written now: PID 1 starts the unit again, and the kernel reports an Xid.
    _write(journal_folder / "now.journal",
           _pid1(0.2, MessageId.UNIT_STARTED, f"Started {UNIT} - vLLM GLM-5.", INVOCATION_ID=second),
           _entry(0.1, _SYSTEMD_UNIT="evil.service", _PID="666", _TRANSPORT="syslog", SYSLOG_IDENTIFIER="kernel",
                  MESSAGE=XID),  # a user's "kernel" line: only _TRANSPORT=kernel is the kernel's
           _entry(0.0, _TRANSPORT="kernel", SYSLOG_IDENTIFIER="kernel", MESSAGE=XID))
    live: list = []
    wait_for(lambda: live.extend(reading.drain()) or len(live) >= 2, 20, "the live entries")
    assert [type(o) for o in live] == [Lifecycle, XidError]
    assert (live[0].event, live[0].invocation) == (Event.STARTED, second)
    assert (live[1].gpu, live[1].xid, live[1].source) == ("0000:3b:00", 79, "kernel")
    assert not [o for o in live if isinstance(o, LogLine)]


def test_a_units_earlier_lines_are_this_boots_only(journal_folder, reading):
    """A host keeps months of journal: the unit's lines of earlier boots, PID 1's, journald's and a
    container's about it included, are another boot's starts, whose monotonic times mean nothing in this one."""
    earlier_boot, run = uuid.uuid4().hex, uuid.uuid4().hex
    week = 7 * 86400
    _write(journal_folder / "system@earlier.journal",
           _pid1(week, MessageId.UNIT_STARTED, f"Started {UNIT} - vLLM GLM-5.", boot=earlier_boot),
           _entry(week - 1, earlier_boot, _SYSTEMD_UNIT=UNIT, _PID="4242", _TRANSPORT="stdout",
                  MESSAGE="INFO 11-22 07:06:40 [api_server.py:1] vLLM API server version 0.10.0"),
           _entry(week - 2, earlier_boot, _PID="311", _TRANSPORT="driver", OBJECT_SYSTEMD_UNIT=UNIT, N_DROPPED="5000",
                  MESSAGE_ID=MessageId.JOURNAL_DROPPED, MESSAGE=f"Suppressed 5000 messages from {UNIT}"),
           _entry(week - 3, earlier_boot, CONTAINER_NAME=UNIT, _COMM="dockerd", _PID="977", _TRANSPORT="journal",
                  MESSAGE="INFO 11-22 07:06:43 [gpu_model_runner.py:1] Starting to load model zai-org/GLM-5..."),
           _pid1(week - 4, MessageId.UNIT_FAILURE_RESULT, f"{UNIT}: Failed with result 'oom-kill'.",
                 boot=earlier_boot, UNIT_RESULT="oom-kill"))
    _write(journal_folder / "system.journal",
           _pid1(3, MessageId.UNIT_STARTED, f"Started {UNIT} - vLLM GLM-5.", INVOCATION_ID=run),
           _entry(2, _SYSTEMD_UNIT=UNIT, _PID="5151", _TRANSPORT="stdout", _SYSTEMD_INVOCATION_ID=run,
                  MESSAGE="INFO 11-29 07:06:40 [api_server.py:1] vLLM API server version 0.11.0"))
    reading.watch([UNIT])
    reading.start()
    wait_for(lambda: UNIT in reading.ready_units, 20, "the unit's earlier lines read")
    read = reading.drain()
    assert [(type(o).__name__, getattr(o, "event", None) or getattr(o, "text", "")) for o in read] == [
        ("Lifecycle", Event.STARTED),
        ("LogLine", "INFO 11-29 07:06:40 [api_server.py:1] vLLM API server version 0.11.0"),
    ]


def test_a_catch_up_is_handed_over_at_the_readers_pace_not_at_the_agents_rounds(journal_folder, reading):
    """Agent.run's loop, with a round every 30 s: while the reader is behind, the next drain comes once a
    backlog's worth is read, so 40 batches arrive in seconds, not in one round each (a round per 16,000
    lines made a first start over 10 M serving lines take tens of minutes). The lines are health probes, which
    a rule reads (a heartbeat): a catch-up hands each of them over."""
    first = uuid.uuid4().hex
    lines = 40_000
    _write(journal_folder / "earlier.journal", *(
        _entry(60 - i / 1000, _SYSTEMD_UNIT=UNIT, _PID="4242", _TRANSPORT="stdout", _SYSTEMD_INVOCATION_ID=first,
               MESSAGE=f"INFO:     10.0.0.7:51234 - \"GET /health HTTP/1.1\" 200 OK #{i}")
        for i in range(lines)))
    reading.watch([UNIT])
    reading.start()
    wait_for(lambda: reading.behind, 10, "the reader to start catching up", every=0.01)
    read: list[str] = []
    deadline = time.monotonic() + 20
    while len(read) < lines and time.monotonic() < deadline:
        read += [o.text for o in reading.drain() if isinstance(o, LogLine)]
        if reading.behind:
            reading.settle(30)
        elif len(read) < lines:
            time.sleep(min(30, max(0.0, deadline - time.monotonic())))  # the agent's interval
    assert [m.rsplit("#", 1)[1] for m in read] == [str(i) for i in range(lines)]
    assert not reading.behind


def _journal_rss(pid: int, folder: Path) -> int:
    """Bytes of the folder's journal files that the process holds in its memory (resident in its mappings)."""
    held, mapping = 0, ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields[0].endswith(":"):
            if fields[0] == "Rss:" and mapping.startswith(str(folder)):
                held += int(fields[1]) * 1024
        else:
            mapping = fields[5] if len(fields) > 5 else ""
    return held


def test_a_reader_following_a_busy_journal_gives_back_the_pages_it_read(journal_folder, reading):
    """libsystemd keeps every page of a journal file that a read touched mapped, in up to 64 windows of 8 MiB:
    a reader following a busy host's journal would hold most of what it read (187 MiB after 1 M entries).
    The reader child gives them back as it goes (exporter.sources.journal_pages), and reads on unharmed."""
    import psutil

    run, lines = uuid.uuid4().hex, 60_000
    _write(journal_folder / "system@earlier.journal", _entry(5, _SYSTEMD_UNIT=UNIT, _PID="4242", _TRANSPORT="stdout",
                                                             _SYSTEMD_INVOCATION_ID=run, MESSAGE="started"))
    reading.watch([UNIT])
    reading.start()
    wait_for(lambda: UNIT in reading.ready_units, 20, "the unit's earlier lines read")
    reading.drain()
    busy = journal_folder / "system.journal"
    _write(busy, *(_entry(1 - i / 100_000, _SYSTEMD_UNIT=UNIT, _PID="4242", _TRANSPORT="stdout",
                          _SYSTEMD_INVOCATION_ID=run, MESSAGE=f"INFO:     10.0.0.7:51234 - \"POST /v1/completions\" #{i}")
                   for i in range(lines)))
    read: list[str] = []
    wait_for(lambda: read.extend(o.text for o in reading.drain() if isinstance(o, LogLine)) or len(read) >= lines,
             60, "the live lines read")
    assert [m.rsplit("#", 1)[1] for m in read] == [str(i) for i in range(lines)]
    [child] = [c for c in psutil.Process().children() if "exporter.sources.journal_child" in " ".join(c.cmdline())]
    held, size = _journal_rss(child.pid, journal_folder), busy.stat().st_size
    assert held < size / 4, f"the reader holds {held >> 10} KiB of the {size >> 10} KiB of journal it read"
