"""Saved journal files (one file, or a directory of them) read natively with systemd-python, for replay."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

from systemd import journal

from exporter.sources.journal import fields_of

SIGNATURE = b"LPKSHHRH"  # the first 8 bytes of every journal file (systemd's journal-def.h)
MACHINE_DIR = re.compile(r"[0-9a-f]{32}")


def is_journal_file(head: bytes) -> bool:
    """Whether these first bytes of a file are a journal file's."""
    return head[:8] == SIGNATURE


def _journal_files(directory: Path) -> list[Path]:
    """The files sd_journal_open_directory() reads: *.journal[~] in the directory and in its
    machine-id subdirectories (not in namespace ones, `<machine-id>.<namespace>`)."""
    found = []
    machines = [p for p in directory.iterdir() if MACHINE_DIR.fullmatch(p.name) and p.is_dir()]
    for place in [directory, *machines]:
        found += [p for p in place.iterdir() if p.name.endswith((".journal", ".journal~"))]
    return found


def _failed(path: Path, err: OSError) -> OSError:
    reason = err.strerror or str(err)
    if err.errno == errno.EPROTONOSUPPORT:
        reason += " (written by a newer systemd than this libsystemd can read)"
    elif err.errno == errno.EACCES:
        reason += " (journal files are readable by root and the systemd-journal group)"
    return OSError(err.errno, f"cannot read journal {path}: {reason}")


def _open(path: Path) -> journal.Reader:
    try:
        directory = path.is_dir()
        if directory:
            files, head = _journal_files(path), b""
        else:
            with open(path, "rb") as f:
                files, head = [path], f.read(len(SIGNATURE))
    except OSError as err:
        raise _failed(path, err) from err
    if directory and not files:
        namespaces = sorted(p.name for p in path.iterdir() if p.is_dir() and "." in p.name)
        hint = f"; a namespace's journal has a directory of its own: {', '.join(namespaces)}"
        hint *= bool(namespaces)
        raise OSError(errno.ENOENT, f"no journal files (*.journal) in directory {path}{hint}")
    if not directory and not is_journal_file(head):
        signature = SIGNATURE.decode()
        raise OSError(errno.EBADMSG, f"{path} is not a journal file (it does not start with {signature})")
    try:
        return journal.Reader(path=str(path)) if directory else journal.Reader(files=[str(path)])
    except OSError as err:
        raise _failed(path, err) from err


def read_journal_file(path: Path, start: str | None = None) -> Iterator[tuple[float, dict[str, bytes]]]:
    """Every entry of a journal file or directory, all boots, in journal order; from the entry at
    cursor `start` on when given.

    Yields (realtime seconds since the epoch, fields): the fields in `exporter.core.entries.FIELDS` that
    the entry has, as raw bytes. OSError with the path and the reason when the journal cannot be
    opened or read.
    """
    path = Path(os.fspath(path))
    reader = _open(path)
    try:
        if start is not None:
            reader.seek_cursor(start)  # the next entry read is the one at the cursor
        count = 0
        while True:
            try:
                if not reader._next():
                    return
                fields = fields_of(reader)
                t = reader._get_realtime() / 1e6
            except OSError as err:
                raise OSError(
                    err.errno, f"cannot read journal {path} after {count} entries: {err.strerror or err}"
                ) from err
            count += 1
            yield t, fields
    finally:
        reader.close()
