"""`llmstartup status` and `llmstartup wait` against scripted units in the test journald."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from exporter.shell.demo import sandbox
from tests.scrape import INTERVAL, SILENCE, STALL
from tests.test_serve import CUDA_OOM, HANG_AFTER_COMPILE, LOAD

READY_QUICKLY = [*LOAD, {"log": "torch.compile takes 2.10 s in total"}, {"sleep": 3},
                 {"raw": "INFO:     Application startup complete."}, {"hang": True}]
SLOW = [*LOAD, {"burn": 120, "workers": 1}]


# The tests' own history, which none of them writes: status and wait never read the host's.
NO_HISTORY = Path(tempfile.gettempdir()) / f"llmstartup-tests-{os.getpid()}" / "history.db"


def llmstartup(journald, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    flags = ["--journal.namespace", journald.namespace, "--sample.interval", f"{INTERVAL:g}s",
             "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s", "--no-collector.gpu"]
    if "--state.path" not in args:  # never the host's history
        flags += ["--state.path", str(NO_HISTORY)]
    return subprocess.run([sys.executable, "-m", "exporter", *args, *flags], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize(
    ("steps", "code", "says"),
    [
        pytest.param(READY_QUICKLY, 0, ": ready", id="ready: 0"),
        pytest.param(CUDA_OOM, 1, "reason cuda_oom", id="failed: 1"),
        pytest.param(HANG_AFTER_COMPILE, 2, ": stalled", id="stalled: 2"),
    ],
)
def test_wait_exit_codes(units, journald, steps, code, says):
    unit = units("wait", steps)
    done = llmstartup(journald, "wait", unit.name, "--heartbeat", "2s")
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert says in lines[-1]
    if code == 2:  # it took the stall threshold: the silent phase was printed on the way
        assert any(" compiling " in line and "silent_progress" in line for line in lines)


def test_wait_times_out(units, journald):
    unit = units("slow", SLOW)
    done = llmstartup(journald, "wait", unit.name, "--timeout", "6s", "--heartbeat", "2s")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "timed out after" in done.stdout
    heartbeats = [l for l in done.stdout.splitlines() if "silent_progress" in l]
    assert heartbeats and "CPU" in heartbeats[-1], "the heartbeat shows the evidence"


def test_wait_for_a_unit_that_does_not_exist(journald):
    done = llmstartup(journald, "wait", "no-such-model-server")
    assert done.returncode == 4
    assert "no such unit: no-such-model-server.service" in done.stderr


def test_status_text_and_json(units, journald, journal_records):
    ready = units("ready", READY_QUICKLY)
    hang = units("hang", HANG_AFTER_COMPILE)
    journal_records(ready, until=lambda es: any("startup complete" in str(e.get("MESSAGE")) for e in es))
    journal_records(hang, until=lambda es: any("torch.compile" in str(e.get("MESSAGE")) for e in es))

    text = llmstartup(journald, "status", ready.name, hang.name)
    assert text.returncode == 0, text.stderr
    by_unit = {line.split()[0]: line for line in text.stdout.splitlines()}
    assert "ready after" in by_unit[ready.name] and by_unit[ready.name].endswith(": ready")
    assert " compiling " in by_unit[hang.name] and "no log for" in by_unit[hang.name]

    done = llmstartup(journald, "status", ready.name, hang.name, "--format", "json")
    docs = {d["unit"]: d for d in json.loads(done.stdout)}
    assert docs[ready.name]["verdict"] == "ready"
    assert docs[hang.name]["phase"] == "compiling"
    for doc in docs.values():
        assert {"unit", "engine", "phase", "verdict", "phase_seconds", "startup_seconds",
                "last_log_age_seconds", "signals"} <= doc.keys()
    assert docs[hang.name]["signals"]["processes"] >= 1
    assert [span["phase"] for span in docs[ready.name]["timeline"]][-1] == "ready"


def test_status_of_a_unit_that_does_not_exist(journald):
    done = llmstartup(journald, "status", "nope")
    assert done.returncode == 4
    assert "no such unit" in done.stderr


def _history_with_a_start(path) -> None:
    from exporter.shell.history import AttemptRecord, History

    history = History(path)
    history.record(AttemptRecord("x.service", "boot", 1.0, 1.7e9, 1.7e9 + 60, "ready", phases={"loading_weights": 50.0}))
    history.close()


def _files(path) -> dict[str, bytes]:
    """The history's files and what they hold; of SQLite's shared memory (-shm), a reader's scratch
    space, only that it is there."""
    return {p.name: b"" if p.name.endswith("-shm") else p.read_bytes() for p in sorted(path.parent.iterdir())}


@pytest.mark.parametrize("newer", [False, True], ids=["the agent's own file", "a file from a newer llmstartup"])
def test_status_and_wait_only_ever_read_the_history(units, journald, journal_records, tmp_path, newer):
    import sqlite3

    path = tmp_path / "state" / "history.db"
    path.parent.mkdir()
    _history_with_a_start(path)
    if newer:
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 99")
        db.close()
    before = _files(path)
    ready = units("ready", READY_QUICKLY)
    journal_records(ready, until=lambda es: any("startup complete" in str(e.get("MESSAGE")) for e in es))
    for args in (["status", ready.name], ["wait", ready.name, "--timeout", "30s"]):
        done = llmstartup(journald, *args, "--state.path", str(path))
        assert done.returncode == 0, done.stderr
        assert ("schema version 99 is a newer llmstartup" in done.stderr) is newer
        assert _files(path) == before  # not migrated, not written, not moved aside


def test_status_never_creates_a_history(units, journald, journal_records, tmp_path):
    ready = units("ready", READY_QUICKLY)
    journal_records(ready, until=lambda es: any("startup complete" in str(e.get("MESSAGE")) for e in es))
    done = llmstartup(journald, "status", ready.name, "--state.path", str(tmp_path / "none" / "history.db"))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "none").exists()
    assert "history" not in done.stderr
def test_status_without_units_shows_every_model_server(journald, journal_records, tmp_path):
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([*LOAD, {"hang": True}]))
    # argv[0] "vllm", as `vllm serve …` shows in a real unit's command line
    argv = ["bash", "-c", f'exec -a vllm {sys.executable} -m exporter.shell.demo.vllm_startup "$0"', str(steps)]
    with sandbox.start_unit(journald, f"test-{secrets.token_hex(3)}-found.service", argv) as unit:
        journal_records(unit, until=lambda es: any("torch.compile" in str(e.get("MESSAGE")) for e in es))
        done = llmstartup(journald, "status")
    assert done.returncode == 0, done.stderr
    by_unit = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert " compiling " in by_unit[unit.name], done.stdout
    assert not {"ssh.service", "cron.service", "systemd-journald.service"} & by_unit.keys(), "no model servers"


@pytest.mark.parametrize(("steps", "code", "verdict"), [
    pytest.param(READY_QUICKLY, 0, "ready", id="ready"),
    pytest.param(CUDA_OOM, 1, "failed", id="failed"),
])
def test_wait_json_lines_for_scripts(units, journald, steps, code, verdict):
    unit = units("wait-json", steps)
    done = llmstartup(journald, "wait", unit.name, "--format", "json", "--heartbeat", "1s")
    assert done.returncode == code, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]  # every line one JSON object
    assert events[0]["event"] == "change" and events[-1]["event"] == "end"
    assert (events[-1]["exit"], events[-1]["verdict"], events[-1]["unit"]) == (code, verdict, unit.name)
    assert {e["event"] for e in events} <= {"change", "heartbeat", "end"}
    changes = [(e["phase"], e["verdict"]) for e in events if e["event"] == "change"]
    assert len(changes) == len(set(changes)), "a change is said once"
    assert all({"phase", "verdict", "phase_seconds", "signals", "timeline"} <= e.keys() for e in events)
