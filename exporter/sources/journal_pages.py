"""libc's madvise, through ctypes: give back the journal-file pages libsystemd's readers keep mapped.

libsystemd reads a journal file through 8 MiB windows of it, mmapped, and keeps up to 64 windows mapped
for as long as the Reader lives; every page of them that a read touched stays in the process's memory.
A reader that follows a busy journal touches every page of it as it is written (1 M entries: 187 MiB of
RSS and PSS), and standing on the newest entry walks each file's chain of entry arrays (0.7 MiB a file:
17 MiB over a 10 M-line boot's 24 files). The pages are the page cache's, and a read needs few of them
again: MADV_DONTNEED takes them out of this process's page tables (they stay in the page cache, as
clean copies of the file), and the next read of one faults it back in. libsystemd maps its files shared
and read-only, so this changes nothing it reads.
"""

from __future__ import annotations

import ctypes

MADV_DONTNEED = 4  # <sys/mman.h>, the same on every Linux architecture
SUFFIXES = (".journal", ".journal~")  # an online or archived file, and one journald found dirty


def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(None)  # the symbols the process has loaded: the interpreter's libc among them
    except OSError:
        return None
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _madvise()


def journal_mappings(maps: str) -> list[tuple[int, int]]:
    """The address ranges, [start, end), of the journal files in a /proc/PID/maps text (a file vacuumed
    while mapped ends in " (deleted)")."""
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue  # anonymous memory
        path = fields[5].removesuffix(" (deleted)")
        if path.endswith(SUFFIXES):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def release() -> int:
    """Take every journal file's pages out of this process's memory; how many bytes of mappings were
    advised (0 where /proc or libc's madvise cannot be had: the pages then stay, as they always did).

    Only for a process whose one thread reads the journal (the reader child): the ranges are read from
    /proc and then advised, and only libsystemd unmaps a window, which it does in no call between the two;
    with a second reading thread, a window it unmapped could be another mapping by then."""
    if _MADVISE is None:
        return 0
    try:
        with open("/proc/self/maps") as maps:
            ranges = journal_mappings(maps.read())
    except OSError:
        return 0
    released = 0
    for start, end in ranges:
        if _MADVISE(start, end - start, MADV_DONTNEED) == 0:
            released += end - start
    return released
