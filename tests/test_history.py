"""History in SQLite and what it teaches: stored once, migrated, survives corruption; expectations."""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys
from dataclasses import replace

import pytest

from exporter.core.expectations import ceiling, learn, phase_durations
from exporter.shell.history import SCHEMA_VERSION, AttemptRecord, History
from exporter.core.model import Attempt, Phase
from tests.scrape import Scrape, fetch, free_port, try_fetch, wait_for
from tests.test_operator import READY_QUICKLY


def record(unit="vllm.service", started=100.0, outcome="ready", fingerprint="f1", cache="", **phases):
    return AttemptRecord(unit, "boot", started, started, started + sum(phases.values()), outcome,
                         fingerprint=fingerprint, compile_cache=cache, phases=phases)


def test_a_start_is_stored_once(tmp_path):
    history = History(tmp_path / "h.db")
    assert history.record(record(compiling=30.0))
    assert not history.record(record(compiling=30.0)), "seen again after a restart: not stored twice"
    [back] = history.recent("vllm.service")
    assert back.phases == {"compiling": 30.0}
    assert sqlite3.connect(tmp_path / "h.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize(
    ("started", "invocation", "stored"),
    [
        pytest.param(100.4, "inv-1", 1, id="the same run, dated from its first line by an agent restarted after it: once"),
        pytest.param(131.0, "inv-1", 2, id="the engine's next start in the same run (a wrapper's loop): stored"),
        pytest.param(100.4, "inv-2", 2, id="another run at the same time: stored"),
        pytest.param(100.4, "", 2, id="no invocation: only the same start time is the same start"),
    ],
)
def test_a_start_is_the_same_start_by_its_invocation_and_time(tmp_path, started, invocation, stored):
    history = History(tmp_path / "h.db")
    assert history.record(replace(record(started=100.0, loading_weights=30.0), invocation="inv-1"))
    history.record(replace(record(started=started, loading_weights=30.0), invocation=invocation))
    assert len(history.recent("vllm.service")) == stored


def test_old_starts_are_pruned(tmp_path):
    history = History(tmp_path / "h.db")
    for n in range(205):
        history.record(record(started=float(n), loading_weights=1.0))
    kept = history.recent("vllm.service", limit=1000)
    assert [r.started for r in kept] == [float(n) for n in range(204, 4, -1)], "docs/operations.md: the newest 200 starts"


def test_migration_from_the_first_schema(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE attempts (id INTEGER PRIMARY KEY, unit TEXT NOT NULL, boot_id TEXT NOT NULL,
            started_monotonic REAL NOT NULL, started REAL NOT NULL, ended REAL, engine TEXT,
            engine_version TEXT, model TEXT, outcome TEXT NOT NULL, failure_phase TEXT, failure_reason TEXT,
            UNIQUE (unit, boot_id, started_monotonic));
        CREATE TABLE phase_durations (attempt_id INTEGER NOT NULL REFERENCES attempts (id) ON DELETE CASCADE,
            phase TEXT NOT NULL, seconds REAL NOT NULL, PRIMARY KEY (attempt_id, phase));
        INSERT INTO attempts VALUES (1, 'vllm.service', 'b', 5.0, 5.0, 65.0, 'vllm', '0.8.5', 'm', 'ready', NULL, NULL);
        INSERT INTO phase_durations VALUES (1, 'compiling', 42.0);
        PRAGMA user_version = 1;
    """)
    db.close()
    [old] = History(path).recent("vllm.service")
    assert (old.engine_version, old.fingerprint, old.phases) == ("0.8.5", "", {"compiling": 42.0})
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("content", [b"not a database at all\n" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_corrupt_file_is_moved_aside(tmp_path, caplog, content):
    path = tmp_path / "h.db"
    path.write_bytes(content)
    history = History(path)
    assert history.recent("x") == []
    assert history.record(record())
    aside = list(tmp_path.glob("h.db.corrupt-*"))
    assert aside and aside[0].read_bytes() == content, "the broken file is kept for a person to look at"
    assert "moved aside" in caplog.text


# ---- what the history teaches ----

RECORDS = [  # newest first
    record(started=5, fingerprint="f1", cache="warm", compiling=20.0, loading_weights=300.0),
    record(started=4, fingerprint="f1", cache="cold", compiling=600.0, loading_weights=310.0),
    record(started=3, fingerprint="f1", cache="cold", compiling=700.0, loading_weights=290.0),
    record(started=2, fingerprint="f2", cache="cold", compiling=60.0, loading_weights=30.0),
    record(started=1, outcome="failed", fingerprint="f1", compiling=5000.0),
]


@pytest.mark.parametrize(
    ("fingerprint", "cache", "phase", "typical", "longest"),
    [
        pytest.param("f1", "cold", Phase.COMPILING, 650.0, 700.0, id="a cold compile is learned from cold ones"),
        pytest.param("f1", "warm", Phase.COMPILING, 20.0, 20.0, id="a cache hit from cache hits"),
        pytest.param("f1", "", Phase.LOADING_WEIGHTS, 300.0, 310.0, id="same settings only"),
        pytest.param("f2", "", Phase.LOADING_WEIGHTS, 30.0, 30.0, id="other settings, other expectations"),
        pytest.param("f9", "", Phase.LOADING_WEIGHTS, 295.0, 310.0, id="new settings: every ready start of the unit"),
    ],
)
def test_learn(fingerprint, cache, phase, typical, longest):
    span = learn(RECORDS, fingerprint, cache).phases[phase]
    assert (span.typical, span.longest) == (typical, longest)


def test_failed_starts_teach_nothing_and_the_ceiling_is_well_past_the_longest():
    expected = learn(RECORDS, "f1", "cold")
    assert expected.phases[Phase.COMPILING].samples == 2
    assert ceiling(expected, Phase.COMPILING) == 1400.0
    assert ceiling(expected, Phase.WARMING_UP) is None


def test_phase_durations_of_a_finished_start():
    attempt = Attempt(started=0, spans=((Phase.LAUNCHING, 0), (Phase.LOADING_WEIGHTS, 3), (Phase.COMPILING, 10),
                                        (Phase.READY, 25)))
    assert phase_durations(attempt) == {"launching": 3, "loading_weights": 7, "compiling": 15}


def test_starts_are_learned_across_restarts_of_the_unit_and_of_the_agent(agent, units, tmp_path):
    """Two ready starts teach an expectation; a restarted agent stores neither again."""
    unit = units("learn", READY_QUICKLY)
    port = agent(f"{unit.name}=vllm")
    for n in range(2):
        if n:  # the same unit started again, 2 s longer in profiling: the median is neither start
            unit = units("learn", [{"sleep": 5} if step == {"sleep": 3} else step for step in READY_QUICKLY])
        wait_for(lambda: Scrape(fetch(port)).value("llmstartup_startups_total", unit=unit.name, outcome="ready") == n + 1,
                 30, f"start {n + 1} ready")
        unit.stop()
    s = wait_for(lambda: (s := Scrape(fetch(port))).value("llmstartup_expected_phase_duration_seconds",
                                                            unit=unit.name, phase="loading_weights") is not None and s,
                 10, "an expectation learned")
    db = sqlite3.connect(tmp_path / "state.db")
    profiled = [seconds for (seconds,) in db.execute("SELECT seconds FROM phase_durations WHERE phase = 'profiling'")]
    assert len(profiled) == 2 and max(profiled) - min(profiled) > 1, profiled
    assert s.value("llmstartup_expected_phase_duration_seconds", unit=unit.name, phase="profiling") == \
        pytest.approx(statistics.median(profiled)), "the typical profiling is the median of the two learned"

    again = agent(f"{unit.name}=vllm")  # a second agent on the same history re-reads this boot's journal
    wait_for(lambda: Scrape(fetch(again)).value("llmstartup_startups_total", unit=unit.name, outcome="ready") == 2,
             15, "both starts seen again")
    rows = sqlite3.connect(tmp_path / "state.db").execute("SELECT count(*) FROM attempts").fetchone()[0]
    assert rows == 2


def test_a_checkpoint_round_trips_and_is_refused_from_another_boot():
    from exporter.core import checkpoint
    from exporter.core.model import ProcessSample, Signal, UnitState

    sample = ProcessSample(50.0, "u.service", frozenset({(10, 1.5)}), 12.5, 100, 200, 300, started_at=1.5)
    state = UnitState("u.service", attempt=Attempt(started=1.0, invocation="abc"), watched_since=20.0,
                      moved={Signal.CPU: 49.0}, last_process=sample)
    text = checkpoint.dump([state], "boot-1", "s=cursor")
    known = checkpoint.load(text, "boot-1")
    assert (known.cursor, dict(known.states)) == ("s=cursor", {"u.service": state})
    [resumed] = checkpoint.resumed(known).values()
    assert (resumed.sample, resumed.invocation, resumed.watched_since) == (sample, "abc", 20.0)
    assert checkpoint.load(text, "boot-2") is None
    assert checkpoint.load("{not json", "boot-1") is None
    assert checkpoint.load('{"boot_id": "boot-1", "cursor": 3, "states": []}', "boot-1") is None


def test_a_locked_history_is_refused_with_the_reason_and_not_moved_aside(tmp_path):
    import sqlite3

    from exporter.shell.history import HistoryError

    path = tmp_path / "history.db"
    History(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HistoryError, match="locked"):
            History(path)
    finally:
        holder.close()
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
    History(path).close()  # and once free, it opens as it was


def test_a_file_from_a_newer_llmstartup_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "h.db"
    newer = sqlite3.connect(path)
    newer.execute("CREATE TABLE future (x)")
    newer.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    newer.commit()
    newer.close()
    history = History(path)
    assert history.recent("x") == [] and history.record(record())
    [aside] = tmp_path.glob("h.db.corrupt-*")
    assert sqlite3.connect(aside).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1, "kept as it was"
    assert f"newer than this llmstartup knows ({SCHEMA_VERSION})" in caplog.text and "moved aside" in caplog.text


def test_without_a_history_file_the_agent_says_so_and_runs_on(tmp_path):
    """--state.path where no file can be created (here under a regular file): an error line, then the agent
    serves as ever, without expectations."""
    (tmp_path / "journal").mkdir()
    (tmp_path / "not-a-directory").write_text("")
    port, log = free_port(), tmp_path / "serve.log"
    argv = [sys.executable, "-m", "exporter", "serve", "--journal.directory", str(tmp_path / "journal"),
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu",
            "--state.path", str(tmp_path / "not-a-directory" / "history.db")]
    with open(log, "w") as err:
        agent = subprocess.Popen(argv, stderr=err)
    try:
        wait_for(lambda: agent.poll() is not None or try_fetch(port), 15, "the agent to serve /metrics")
        assert agent.poll() is None, log.read_text()
        assert "llmstartup_build_info" in fetch(port)
    finally:
        agent.terminate()
        assert agent.wait(timeout=10) == 0
    said = [line for line in log.read_text().splitlines() if "no history" in line]
    assert len(said) == 1 and "not-a-directory" in said[0] and "level=ERROR" in said[0], log.read_text()


def test_expectations_are_learned_from_the_last_10_ready_starts():
    old = [record(started=n, loading_weights=1000.0) for n in range(5)]  # long ago: slow storage since replaced
    recent = [record(started=10 + n, loading_weights=100.0 + n) for n in range(10)]
    newest_first = sorted([*old, *recent], key=lambda r: r.started, reverse=True)
    span = learn(newest_first, "f1").phases[Phase.LOADING_WEIGHTS]
    assert (span.typical, span.longest, span.samples) == (104.5, 109.0, 10)


def test_a_phase_well_past_its_history_with_only_the_cpu_turning_is_stalled(agent, units, tmp_path):
    """Its compiles took 1 s; this one has compiled for more than twice that with nothing but its CPU
    moving (an NCCL collective spinning): stalled once the stall threshold passes, though the CPU turns,
    and whatever the stacks say. Without the history and the stacks the same silence is unknown."""
    from tests.test_serve import LOAD

    unit = units("spin", [*LOAD, {"burn": 120, "workers": 1, "cache": False}])
    History(tmp_path / "state.db").record(record(unit=unit.name, started=1.7e9, compiling=1.0, loading_weights=2.0))
    port = agent(unit.name)
    s = wait_for(lambda: (s := Scrape(fetch(port))).one_of("unit_verdict", unit.name, "verdict") == "stalled" and s,
                 60, "the busy-only compile to be judged stalled")
    assert s.one_of("unit_phase", unit.name, "phase") == "compiling"
    assert s.value("llmstartup_expected_phase_duration_seconds", unit=unit.name, phase="compiling") == 1.0
    cpu = s.value("llmstartup_process_cpu_seconds_total", unit=unit.name)
    later = wait_for(lambda: (x := Scrape(fetch(port))).value("llmstartup_process_cpu_seconds_total", unit=unit.name) > cpu
                     and x, 10, "the CPU to go on turning")
    assert later.one_of("unit_verdict", unit.name, "verdict") == "stalled", "CPU alone does not make it progress"
    [doc] = [d for d in json.loads(fetch(port, "/api/v1/units")) if d["unit"] == unit.name]
    assert doc["slower_than_usual"] is True
