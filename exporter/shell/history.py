"""SQLite history: every finished start and its phase durations, kept across restarts and boots."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.core.model import frozen_map

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3
KEEP_PER_UNIT = 200  # starts kept per unit: enough for expectations, bounded on disk
# The write-ahead log is copied into the file every WAL_PAGES pages written (SQLite's default is 1,000: 4 MiB)
# and cut back to WAL_BYTES then (by default it is never cut): the state stays small on a small volume (a tmpfs,
# a Kubernetes emptyDir with a sizeLimit), where a log grown to 4 MiB filled the disk and lost history.
WAL_PAGES = 32
WAL_BYTES = 128 * 1024

# Each entry takes the schema from the version before it to its own; version 1 is the first.
MIGRATIONS = {
    1: """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            unit TEXT NOT NULL,
            boot_id TEXT NOT NULL,
            started_monotonic REAL NOT NULL,
            started REAL NOT NULL,
            ended REAL,
            engine TEXT, engine_version TEXT, model TEXT,
            outcome TEXT NOT NULL,
            failure_phase TEXT, failure_reason TEXT,
            UNIQUE (unit, boot_id, started_monotonic)
        );
        CREATE TABLE phase_durations (
            attempt_id INTEGER NOT NULL REFERENCES attempts (id) ON DELETE CASCADE,
            phase TEXT NOT NULL,
            seconds REAL NOT NULL,
            PRIMARY KEY (attempt_id, phase)
        );
    """,
    2: """
        ALTER TABLE attempts ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
        ALTER TABLE attempts ADD COLUMN compile_cache TEXT NOT NULL DEFAULT '';
        CREATE INDEX attempts_by_unit ON attempts (unit, started);
    """,
    3: """
        ALTER TABLE attempts ADD COLUMN invocation TEXT NOT NULL DEFAULT '';
    """,
}


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    unit: str
    boot_id: str
    started_monotonic: float  # with boot_id, what makes a start the same start when it is seen again
    started: float  # wall clock
    ended: float | None
    outcome: str
    engine: str = ""
    engine_version: str = ""
    model: str = ""
    fingerprint: str = ""  # the settings that change startup cost; see expectations.fingerprint
    compile_cache: str = ""  # "cold", "warm" or "" when the engine did not say
    failure_phase: str | None = None
    failure_reason: str | None = None
    invocation: str = ""  # systemd's id of the unit's run, when it gave one
    phases: Mapping[str, float] = field(default_factory=frozen_map)


class HistoryError(Exception):
    """The history file cannot be used at all, even fresh: the message says where and why."""


class History:
    """One SQLite file in WAL mode; every write is one transaction, so a crash loses at most it.

    `readonly`: `status` and `wait` consult the agent's file; they never migrate it, write to it, or
    move it aside, whatever they find in it: any trouble is a HistoryError that says what.
    """

    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        if readonly:
            try:
                self._db = self._open_readonly()
            except sqlite3.Error as error:
                raise HistoryError(f"cannot read history {path}: {error}") from None
            return
        try:
            self._db = self._open()
        except sqlite3.OperationalError as error:  # locked by another writer, no permission, no space
            raise HistoryError(f"cannot open history {path}: {error}") from None
        except sqlite3.DatabaseError as error:  # corrupt, not a database at all, or from a newer llmstartup
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                try:
                    Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
                except FileNotFoundError:
                    pass
                except OSError as cannot:
                    raise HistoryError(f"history {path} is unreadable ({error}) and cannot be moved aside: {cannot}") from None
            logger.error("history %s is unreadable (%s): moved aside to %s, starting a fresh one", path, error, aside)
            try:
                self._db = self._open()
            except sqlite3.Error as again:
                raise HistoryError(f"history {path}: {again}") from again

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            db.execute(f"PRAGMA journal_size_limit={WAL_BYTES}")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA quick_check").fetchone()
            self._migrate(db)
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise sqlite3.OperationalError("no such file")
        # A file no agent has open (no -shm beside it) is read as it is, creating no -wal or -shm that the
        # agent's user could not open later; one an agent writes is read through its shared memory.
        shared = Path(f"{self.path}-shm").exists()
        uri = f"file:{self.path}?mode=ro" + ("" if shared else "&immutable=1")
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                newer = "a newer llmstartup" if version > SCHEMA_VERSION else "an older llmstartup, which the agent migrates"
                raise sqlite3.DatabaseError(f"schema version {version} is {newer} (this one reads {SCHEMA_VERSION})")
        except sqlite3.Error:
            db.close()
            raise
        return db

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version} is newer than this llmstartup knows ({SCHEMA_VERSION})")
        for step in range(version + 1, SCHEMA_VERSION + 1):
            db.execute("BEGIN")  # statement by statement: executescript() would commit half a migration
            for statement in filter(str.strip, MIGRATIONS[step].split(";")):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {step}")
            db.execute("COMMIT")
            if version:
                logger.info("history schema migrated from version %d to %d", step - 1, step)

    def record(self, attempt: AttemptRecord) -> bool:
        """Store a finished start once; seeing it again (after a restart) stores nothing. True if new.

        The same start is the same boot and monotonic start, or the same invocation over the same time: an agent
        that saw its processes before its first line dates it from them, and one restarted after it, reading only
        its lines, from its first line."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            ended = attempt.started if attempt.ended is None else attempt.ended
            if attempt.invocation and db.execute(
                "SELECT 1 FROM attempts WHERE unit = ? AND boot_id = ? AND invocation = ?"
                " AND started <= ? AND ? <= COALESCE(ended, started)",
                (attempt.unit, attempt.boot_id, attempt.invocation, ended, attempt.started),
            ).fetchone():
                db.execute("COMMIT")
                return False
            cursor = db.execute(
                "INSERT OR IGNORE INTO attempts (unit, boot_id, started_monotonic, started, ended, engine,"
                " engine_version, model, fingerprint, compile_cache, outcome, failure_phase, failure_reason,"
                " invocation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (attempt.unit, attempt.boot_id, round(attempt.started_monotonic, 6), attempt.started, attempt.ended,
                 attempt.engine, attempt.engine_version, attempt.model, attempt.fingerprint, attempt.compile_cache,
                 attempt.outcome, attempt.failure_phase, attempt.failure_reason, attempt.invocation),
            )
            if cursor.rowcount:
                db.executemany(
                    "INSERT INTO phase_durations (attempt_id, phase, seconds) VALUES (?, ?, ?)",
                    [(cursor.lastrowid, phase, seconds) for phase, seconds in attempt.phases.items()],
                )
                db.execute(
                    "DELETE FROM attempts WHERE unit = ? AND id NOT IN"
                    " (SELECT id FROM attempts WHERE unit = ? ORDER BY started DESC LIMIT ?)",
                    (attempt.unit, attempt.unit, KEEP_PER_UNIT),
                )
            db.execute("COMMIT")
            return bool(cursor.rowcount)
        except BaseException:
            if db.in_transaction:  # SQLite rolls back itself on some errors (a full disk): the error is that one
                db.execute("ROLLBACK")
            raise

    def recent(self, unit: str, limit: int = 50) -> list[AttemptRecord]:
        """The unit's latest finished starts, newest first."""
        rows = self._db.execute(
            "SELECT id, unit, boot_id, started_monotonic, started, ended, outcome, engine, engine_version, model,"
            " fingerprint, compile_cache, failure_phase, failure_reason, invocation FROM attempts WHERE unit = ?"
            " ORDER BY started DESC LIMIT ?",
            (unit, limit),
        ).fetchall()
        phases: dict[int, dict[str, float]] = {}
        for attempt_id, phase, seconds in self._db.execute(
            f"SELECT attempt_id, phase, seconds FROM phase_durations WHERE attempt_id IN ({','.join('?' * len(rows))})",
            [r[0] for r in rows],
        ):
            phases.setdefault(attempt_id, {})[phase] = seconds
        return [AttemptRecord(*row[1:], phases=frozen_map(phases.get(row[0], {}))) for row in rows]

    def save_checkpoint(self, checkpoint: str) -> None:
        """What the agent knows (exporter.core.checkpoint, JSON), for the agent after it."""
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('checkpoint', ?)", (checkpoint,))

    def checkpoint(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'checkpoint'").fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self._db.close()
