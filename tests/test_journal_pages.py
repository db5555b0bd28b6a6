"""Which mappings the reader child gives the pages of back: the journal files', and nothing else of its memory."""

from __future__ import annotations

import pytest

from exporter.sources.journal_pages import journal_mappings

CASES = [
    # (a line of /proc/PID/maps, the range given back)
    ("7f0a00000000-7f0a00800000 r--s 00000000 fd:01 1234 /var/log/journal/0a1b/system.journal", (0x7F0A00000000, 0x7F0A00800000)),
    ("7f0a00800000-7f0a01000000 r--s 07000000 fd:01 1235 /var/log/journal/0a1b/system@00061a-00061b.journal",
     (0x7F0A00800000, 0x7F0A01000000)),
    ("7f0a01000000-7f0a01800000 r--s 00000000 fd:01 1236 /run/log/journal/0a1b/system@00061a.journal~",
     (0x7F0A01000000, 0x7F0A01800000)),
    ("7f0a01800000-7f0a02000000 r--s 00000000 fd:01 1237 /var/log/journal/0a1b/user-1000.journal (deleted)",
     (0x7F0A01800000, 0x7F0A02000000)),
    ("7f0a02000000-7f0a02800000 r--s 00000000 fd:01 1238 /srv/journal copies/gpu node 17/system.journal",
     (0x7F0A02000000, 0x7F0A02800000)),
    ("55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0 [heap]", None),
    ("7f0a03000000-7f0a03100000 rw-p 00000000 00:00 0 ", None),  # anonymous: the interpreter's own objects
    ("7f0a03100000-7f0a03200000 rw-p 00000000 00:00 0", None),
    ("7f0a03200000-7f0a03300000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libsystemd.so.0.35.0", None),
    ("7f0a03300000-7f0a03400000 r--p 00000000 fd:01 98 /var/log/journal/0a1b/system.journal.bak", None),
]


@pytest.mark.parametrize(("line", "given_back"), CASES, ids=[c[0].rsplit(" ", 1)[-1] or "anonymous" for c in CASES])
def test_only_journal_files_are_given_back(line: str, given_back: tuple[int, int] | None) -> None:
    assert journal_mappings(line + "\n") == ([given_back] if given_back else [])
