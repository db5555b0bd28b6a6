"""exporter.shell.demo.sandbox against a real journald namespace and the real cgroup v2 tree."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from systemd import journal

from exporter.shell.demo import sandbox

LINE = re.compile(
    r"^\((?P<proc>\w+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<src>[\w.]+:\d+)\] (?P<msg>.*)$"
)
HEX32 = re.compile(r"^[0-9a-f]{32}$")


def text(entry: dict[str, Any]) -> str:
    value = entry.get("MESSAGE", "")
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def invocation(entry: dict[str, Any]) -> str:
    value = entry["_SYSTEMD_INVOCATION_ID"]  # a str, or a UUID where a converter is registered
    return getattr(value, "hex", value)


def has(fragment: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda entries: any(fragment in text(e) for e in entries)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return result


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cgroup_cpu_usec(unit: sandbox.Unit) -> int:
    for line in (unit.cgroup / "cpu.stat").read_text().splitlines():
        key, value = line.split()
        if key == "usage_usec":
            return int(value)
    raise AssertionError("no usage_usec in cpu.stat")


def test_unit_lines_carry_unit_and_invocation(journald, units, journal_records):
    unit = units("fields", [
        {"log": "vLLM API server version 0.11.0"},
        {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B'"},
        {"log": "Application startup complete."},
        {"hang": True},
    ])
    journal_records(unit, has("Application startup complete."))

    # Read it the way the exporter does: a plain Reader on the namespace, matched on the unit.
    reader = journal.Reader(namespace=journald.namespace)
    reader.add_match(_SYSTEMD_UNIT=unit.name)
    entries = list(reader)
    reader.close()

    assert [e["_SYSTEMD_UNIT"] for e in entries] == [unit.name] * 3
    assert HEX32.match(unit.invocation)
    assert {invocation(e) for e in entries} == {unit.invocation}
    assert {e["_PID"] for e in entries} == {unit.pid}
    assert all(e["__MONOTONIC_TIMESTAMP"].timestamp.total_seconds() >= unit.started for e in entries)

    banner, engine, ready = (text(e) for e in entries)
    first = LINE.match(banner)
    assert first and first["proc"] == "APIServer" and int(first["pid"]) == unit.pid
    assert (first["level"], first["src"]) == ("INFO", "api_server.py:1839")
    assert first["msg"] == "vLLM API server version 0.11.0"
    second = LINE.match(engine)
    assert second and second["proc"] == "EngineCore_DP0" and second["src"] == "core.py:77"
    assert int(second["pid"]) in unit.pids()  # a real EngineCore child in the unit's cgroup
    assert ready == f"(APIServer pid={unit.pid}) INFO:     Application startup complete."


def test_restart_gets_a_new_invocation_id(units, journal_records):
    steps = [{"log": "vLLM API server version 0.11.0"}, {"hang": True}]
    first = units("restart", steps)
    journal_records(first, lambda entries: len(entries) == 1)
    first.stop()  # it prints what vLLM prints on SIGTERM before it exits: those lines are the first's too

    second = units("restart", steps)
    assert second.name == first.name
    assert second.invocation != first.invocation
    entries = journal_records(second, lambda entries: any(invocation(e) == second.invocation for e in entries))
    firsts = [e for e in entries if invocation(e) == first.invocation]
    seconds = [e for e in entries if invocation(e) == second.invocation]
    assert firsts and entries == firsts + seconds
    assert {e["_PID"] for e in firsts} == {first.pid} and {e["_PID"] for e in seconds} == {second.pid}
    assert [text(e) for e in second.records()] == [text(e) for e in seconds]


def test_carriage_return_bar_arrives_as_one_record(units, journal_records):
    unit = units("bar", [
        {"bar": "Loading safetensors checkpoint shards", "steps": 3, "seconds": 0.3, "per_line": True},
        {"bar": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "steps": 5, "seconds": 0.5},
        {"log": "Graph capturing finished in 1 secs, took 0.52 GiB"},
        {"hang": True},
    ])
    entries = journal_records(unit, has("Graph capturing finished"))
    messages = [text(e) for e in entries]
    prefix = "(EngineCore_DP0 pid="

    capture = [m for m in messages if "Capturing CUDA graphs" in m]
    assert len(capture) == 1, messages
    record = capture[0]
    assert record.startswith(prefix) and "\n" not in record
    # tqdm: the first draw, one redraw per step, the final state again on close; all one record.
    assert record.count("\r") == 7
    redraws = record.split("\r")[1:]
    assert "  0%|          | 0/5 [00:00<?, ?it/s]" in redraws[0]
    assert "100%|██████████| 5/5 [" in redraws[-1]

    # vLLM's shard bar ends every redraw with a newline: one record per redraw, then tqdm's close.
    shards = [m for m in messages if "Loading safetensors checkpoint shards" in m]
    assert [re.search(r"\d+/3", m)[0] for m in shards] == ["0/3", "1/3", "2/3", "3/3", "3/3"]
    assert all(m.startswith(prefix) and ") \rLoading" in m for m in shards)


def test_burn_workers_are_in_the_unit_cgroup_while_burning(units, journal_records):
    unit = units("burn", [
        {"log": "Dynamo bytecode transform time: 1.00 s"},
        {"burn": 3.0, "workers": 2},
        {"log": "torch.compile takes 4.00 s in total"},
        {"hang": True},
    ])
    journal_records(unit, has("Dynamo bytecode transform time"))

    def workers() -> set[int]:
        return {pid for pid in unit.pids() if comm(pid) == "compile_worker"}

    burning = wait_for(lambda: len(workers()) == 2 and workers(), 5.0, "two compile workers in cgroup.procs")
    for pid in burning:
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(unit.pid)
    before = cgroup_cpu_usec(unit)
    wait_for(lambda: cgroup_cpu_usec(unit) - before > 200_000, 5.0, "the workers to burn CPU")

    journal_records(unit, has("torch.compile takes"))
    wait_for(lambda: not workers(), 5.0, "the compile workers to leave")
    assert unit.pid in unit.pids()
    assert all(not alive(pid) for pid in burning)


def test_stop_leaves_no_process_and_no_cgroup(units, journal_records):
    unit = units("stop", [
        {"log": "Dynamo bytecode transform time: 1.00 s"},
        {"burn": 600.0, "workers": 2},
    ])
    journal_records(unit, has("Dynamo bytecode transform time"))
    pids = wait_for(lambda: len(unit.pids()) == 4 and unit.pids(), 5.0, "main, EngineCore and two workers")

    assert unit.stop() == 0  # SIGTERM: the program ends its children and exits cleanly
    assert not unit.cgroup.exists()
    wait_for(lambda: not any(alive(pid) for pid in pids), 5.0, "every process of the unit to be gone")
    assert unit.stop() == 0  # stopping again is harmless


def test_stop_kills_what_ignores_sigterm(journald):
    argv = ["/bin/sh", "-c", "trap '' TERM; sleep 600 & sleep 600"]
    with sandbox.start_unit(journald, f"test-{os.getpid()}-stubborn", argv) as unit:
        pids = wait_for(lambda: len(unit.pids()) == 3 and unit.pids(), 5.0, "sh and its two sleeps")
        status = unit.stop(timeout=0.3)
    assert status == -9
    assert not unit.cgroup.exists()
    wait_for(lambda: not any(alive(pid) for pid in pids), 5.0, "every process of the unit to be gone")


def test_short_lived_unit_keeps_unit_and_invocation(units, journal_records):
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. "
           "GPU 0 has a total capacity of 79.19 GiB of which 1.25 GiB is free.")
    unit = units("crash", [
        {"log": "Starting to load model Qwen/Qwen3-8B..."},
        {"traceback": oom},
        {"exit": 1},
    ])
    assert unit.wait(timeout=10) == 1
    entries = journal_records(unit, lambda entries: entries and text(entries[-1]).endswith(oom))
    assert {invocation(e) for e in entries} == {unit.invocation}
    messages = [text(e) for e in entries]
    # vLLM ends each line of a multi-line message with "\r\n"; journald strips the trailing "\r".
    failed = [m for m in messages if "[core.py:708] EngineCore failed to start." in m]
    assert len(failed) == 1 and " ERROR " in failed[0] and failed[0].endswith("failed to start.")
    assert sum("Traceback (most recent call last):" in m for m in messages) == 2


def test_clear_errors(journald, units):
    with pytest.raises(RuntimeError, match="already running"):
        sandbox.Journald(journald.namespace).start()
    unit = units("twice", [{"hang": True}])
    with pytest.raises(RuntimeError, match=f"unit {re.escape(unit.name)} is already running"):
        sandbox.start_unit(journald, unit.name, ["/bin/true"])
    with pytest.raises(ValueError, match="invalid unit name"):
        sandbox.start_unit(journald, "bad/name", ["/bin/true"])
