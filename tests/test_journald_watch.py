"""journald itself (exporter/sources/journald.py): a writer blocked on its output stream, with real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from exporter.sources.journal import JournalPlace
from exporter.sources.journald import WRITER_WAITS, JournaldWatch
from tests.scrape import wait_for

# Writes until its stdout takes no more, then waits there; its stdout is what the test gives it.
WRITER = "import sys\nwhile True:\n    sys.stdout.write('x' * 4096)\n    sys.stdout.flush()\n"


def _waiting_to_write(pid: int) -> bool:
    with open(f"/proc/{pid}/wchan") as f:
        return f.read() not in ("", "0")


@pytest.mark.parametrize(
    ("stream", "said"),
    [
        pytest.param("socket", True, id="its stdout a socket nobody reads (journald's stream): said, after a while"),
        pytest.param("pipe", False, id="its stdout a full pipe: not journald's"),
    ],
)
def test_a_unit_waiting_to_write_its_output(stream, said):
    if stream == "socket":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        out, keep = theirs.fileno(), (ours, theirs)
    else:
        read, out = os.pipe()
        keep = (read, out)
    writer = subprocess.Popen([sys.executable, "-c", WRITER], stdout=out)
    try:
        wait_for(lambda: _waiting_to_write(writer.pid), 10, "the writer to wait in the kernel")
        now = [100.0]
        watch = JournaldWatch(JournalPlace(namespace="llmstartup-no-such-namespace"), clock=lambda: now[0])
        assert watch.check({"x.service": [writer.pid]}) == "", "not yet: journald may be a moment late"
        now[0] += WRITER_WAITS
        why = watch.check({"x.service": [writer.pid]})
        assert (f"x.service's process {writer.pid} has waited 3 s to write its output" in why) is said, why
        assert watch.check({}) == "", "a writer no longer asked about is forgotten"
    finally:
        writer.kill()
        writer.wait()
        for end in keep:
            end.close() if isinstance(end, socket.socket) else os.close(end)


def test_journal_files_have_no_journald_to_watch(tmp_path):
    assert JournaldWatch(JournalPlace(directory=tmp_path)).check({}) == ""
