"""A first start's reading of the units' earlier lines (exporter.sources.journal_catchup) against a whole read.

The agent's first start on a host reads each watched unit's starts of this boot by walking back from its last
line with journal matches and hands over only the lines a fold can notice. Whatever it skips, the fold must
come out the same as the fold of every entry: phases, verdicts, counters, histograms, the timelines of the last
two starts, the last-log time. The journals here are written by systemd-journal-remote (PID 1's lines cannot
be produced live here), as tests/test_journal_reader.py writes them, and read by the real JournalSource.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.ingest import _startup_records
from exporter.core import grammar
from exporter.core.entries import MessageId, to_observations
from exporter.core.model import (
    Limits,
    LogLine,
    Observation,
    Outcome,
    Phase,
    Reason,
    UnitState,
    Verdict,
    XidError,
)
from exporter.core.tracker import advance, judge
from exporter.sources.journal import JournalPlace, this_boot
from exporter.sources.journal import _entry as read_entry
from exporter.sources.journal_process import JournalSource
from tests.needs import needs
from tests.scrape import wait_for
from tests.test_journal_reader import REMOTE, _entry, _write

pytestmark = needs(REMOTE, "systemd-journal-remote (Debian package systemd-journal-remote)")

STARTUP = _startup_records(7001, 7002)  # the demo's vLLM 0.11 startup, to `Application startup complete.`
READY_AT = next(i for i, line in enumerate(STARTUP) if "Application startup complete" in line)
LOADING = next(i for i, line in enumerate(STARTUP) if "Starting to load model" in line)
SERVING = '(APIServer pid=7001) INFO:     10.0.3.{}:{} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
OOM = ("(EngineCore_DP0 pid=7002) ERROR 11-29 07:06:50 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
       "Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.91 GiB is free.")
PORT = "(APIServer pid=7001) OSError: [Errno 98] Address already in use"
FATAL = ("(APIServer pid=7001) RuntimeError: Engine core initialization failed. See root cause above. "
         "Failed core proc(s): {}")
LIMITS = Limits()


class Journal:
    """Entries of this boot, oldest first, each `pace` seconds after the one before, ending a moment ago."""

    STARTING, SERVING = 0.5, 0.01  # a startup's lines come slower than a busy server's (its \r bar is dated
    # back by 8 s: it must not reach back into the start before)

    def __init__(self) -> None:
        self.entries: list[tuple[float, dict[str, str]]] = []
        self.pace = self.STARTING

    def add(self, **fields: str) -> None:
        self.entries.append((self.pace, fields))

    def gap(self, seconds: float) -> None:
        """Nothing for `seconds`: a silence."""
        self.entries.append((seconds, {}))

    def write(self, path: Path) -> None:
        ago = sum(pace for pace, _ in self.entries) + 1
        out = []
        for pace, fields in self.entries:
            ago -= pace
            if fields:
                out.append(_entry(ago, **fields))
        _write(path, *out)


def pid1(journal: Journal, unit: str, message_id: str, message: str, invocation: str, **extra: str) -> None:
    journal.add(_PID="1", _SYSTEMD_UNIT="init.scope", _TRANSPORT="journal", SYSLOG_IDENTIFIER="systemd", UNIT=unit,
                MESSAGE_ID=message_id, MESSAGE=message, INVOCATION_ID=invocation, **extra)


def line(journal: Journal, unit: str, message: str, invocation: str | None, **extra: str) -> None:
    fields = {"_SYSTEMD_UNIT": unit, "_PID": "7001", "_TRANSPORT": "stdout", "MESSAGE": message, **extra}
    if invocation is not None:
        fields["_SYSTEMD_INVOCATION_ID"] = invocation
    journal.add(**fields)


def failed_start(journal: Journal, unit: str, lines: list[str], status: str = "1/FAILURE") -> str:
    invocation = uuid.uuid4().hex
    pid1(journal, unit, MessageId.UNIT_STARTED, f"Started {unit} - vLLM.", invocation)
    for text in lines:
        line(journal, unit, text, invocation)
    pid1(journal, unit, MessageId.UNIT_PROCESS_EXIT, f"{unit}: Main process exited, code=exited, status={status}",
         invocation)
    pid1(journal, unit, MessageId.UNIT_FAILURE_RESULT, f"{unit}: Failed with result 'exit-code'.", invocation,
         UNIT_RESULT="exit-code")
    return invocation


def serving(journal: Journal, emit, count: int) -> None:
    journal.pace = Journal.SERVING
    for i in range(count):
        emit(SERVING.format(i % 8, 41000 + i % 64))
    journal.pace = Journal.STARTING


def a_systemd_unit(journal: Journal, unit: str) -> None:
    """Three failed starts (CUDA OOM while loading, systemd unable to run the command after ExecStartPre spoke,
    the port taken at the end), then a start that became ready and has served since: three silences (one with a
    heartbeat in it), journald dropping lines, a warning a rule reads."""
    failed_start(journal, unit, [*STARTUP[:LOADING + 6], OOM, FATAL])
    invocation = uuid.uuid4().hex
    pid1(journal, unit, MessageId.UNIT_STARTED, f"Started {unit} - vLLM.", invocation)
    line(journal, unit, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c2d)", invocation)  # ExecStartPre=nvidia-smi -L
    line(journal, unit, f"{unit}: Failed at step EXEC spawning /opt/vllm/bin/vllm: No such file or directory",
         invocation, MESSAGE_ID=MessageId.SPAWN_FAILED, _PID="7003", _TRANSPORT="journal")
    pid1(journal, unit, MessageId.UNIT_PROCESS_EXIT, f"{unit}: Main process exited, code=exited, status=203/EXEC",
         invocation)
    failed_start(journal, unit, [*STARTUP[:READY_AT - 1], PORT])
    invocation = uuid.uuid4().hex
    pid1(journal, unit, MessageId.UNIT_STARTED, f"Started {unit} - vLLM.", invocation)
    for text in STARTUP:
        line(journal, unit, text, invocation)
    emit = lambda text: line(journal, unit, text, invocation)
    serving(journal, emit, 9000)
    journal.gap(90)
    serving(journal, emit, 9000)
    journal.add(_PID="311", _TRANSPORT="driver", OBJECT_SYSTEMD_UNIT=unit, N_DROPPED="5000",
                MESSAGE_ID=MessageId.JOURNAL_DROPPED, MESSAGE=f"Suppressed 5000 messages from {unit}")
    serving(journal, emit, 300)
    emit("(APIServer pid=7001) WARNING 11-29 08:06:40 [protocol.py:93] The following fields were present in the "
         "request but ignored: {'stream_options'}")
    journal.gap(70)
    serving(journal, emit, 3000)
    journal.gap(45)  # then the engine's heartbeat, which is no sign of life: the silence goes on past it
    emit("(EngineCore_DP0 pid=7002) WARNING 11-29 08:06:40 [shm_broadcast.py:466] No available shared memory "
         "broadcast block found in 60 seconds. This typically happens when some processes are hanging.")
    journal.gap(20)
    serving(journal, emit, 3000)


def a_unit_without_pid1(journal: Journal, unit: str) -> None:
    """What the tests' sandbox and a host whose PID 1 is not systemd give: invocation ids and no PID 1. The port
    taken; then a start in which the engine, once ready, started again in the same invocation, gave up on CUDA
    memory, and started a third time."""
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    for text in [*STARTUP[:READY_AT - 1], PORT]:
        line(journal, unit, text, first)
    emit = lambda text: line(journal, unit, text, second)
    for text in STARTUP:
        emit(text)
    serving(journal, emit, 3000)
    for text in [*STARTUP[:LOADING + 4], OOM, FATAL]:
        emit(text)
    for text in STARTUP:
        emit(text)
    serving(journal, emit, 9000)


def a_container(journal: Journal, unit: str) -> None:
    """Docker's journald log driver: the container's lines under docker.service's unit and invocation, named by
    CONTAINER_NAME. Its starts are told by the engine's first word only."""
    docker = uuid.uuid4().hex

    def emit(text: str) -> None:
        journal.add(_SYSTEMD_UNIT="docker.service", _SYSTEMD_INVOCATION_ID=docker, _COMM="dockerd", _PID="977",
                    _TRANSPORT="journal", CONTAINER_NAME=unit, MESSAGE=text)

    for text in [*STARTUP[:LOADING + 2], OOM, FATAL]:
        emit(text)
    for text in STARTUP:
        emit(text)
    serving(journal, emit, 9000)


def odd_unit(journal: Journal, unit: str, kind: str) -> None:
    """What the walk cannot vouch for: read whole from where it stops."""
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    if kind == "no invocation ids":
        for text in [*STARTUP[:LOADING + 2], OOM]:
            line(journal, unit, text, None)
        for text in STARTUP:
            line(journal, unit, text, None)
        serving(journal, lambda text: line(journal, unit, text, None), 3000)
    elif kind == "a line without one among a start's":
        for text in STARTUP:
            line(journal, unit, text, first)
        serving(journal, lambda text: line(journal, unit, text, first), 9000)
        line(journal, unit, OOM, None)
        serving(journal, lambda text: line(journal, unit, text, first), 3000)
    elif kind == "a start's last words after the next began":
        for text in [*STARTUP[:LOADING + 2], OOM]:
            line(journal, unit, text, first)
        for text in STARTUP:
            line(journal, unit, text, second)
        line(journal, unit, FATAL, first)
        serving(journal, lambda text: line(journal, unit, text, second), 3000)


def fold(observations: list[Observation | XidError], units: list[str], limits: Limits = LIMITS) -> dict[str, UnitState]:
    """The agent's fold: a drain's observations in time order, each into its unit's state."""
    vllm = grammar.load("vllm")
    states = {unit: UnitState(unit, "vllm") for unit in units}
    for obs in sorted((o for o in observations if not isinstance(o, XidError)), key=lambda o: o.t):
        states[obs.unit] = advance(states[obs.unit], obs, vllm, limits)
    return states


def whole_read(folder: Path, units: list[str]) -> list[Observation | XidError]:
    """Every entry of this boot, made into observations: what the agent read before it skimmed."""
    reader = JournalPlace(directory=folder).open()
    out: list[Observation | XidError] = []
    try:
        this_boot(reader)
        while reader._next():
            fields, t = read_entry(reader)
            out += to_observations(fields, t, frozenset(units))
    finally:
        reader.close()
    return out


def first_start(folder: Path, units: list[str], silence: float = LIMITS.silence) -> list[Observation | XidError]:
    """What the JournalSource of an agent's first start hands over for the units, until they are read."""
    source = JournalSource(JournalPlace(directory=folder), silence=silence)
    try:
        source.watch(units)
        source.start()
        read: list[Observation | XidError] = []
        wait_for(lambda: read.extend(source.drain()) or set(units) <= source.ready_units, 60, "the units read")
        read += source.drain()
        assert source.restarts == 0
        return read
    finally:
        source.stop()


def test_a_first_start_folds_as_a_whole_read_of_the_boot(tmp_path):
    """Several failed starts before the current one, each failing in its own phase for its own reason; a unit
    without PID 1; a container; and journals the walk cannot vouch for, read whole from where it stops."""
    journal = Journal()
    units = {"vllm-a.service": a_systemd_unit, "engine-b.service": a_unit_without_pid1, "vllm-box": a_container}
    for unit, write in units.items():
        write(journal, unit)
    odd = ["no invocation ids", "a line without one among a start's", "a start's last words after the next began"]
    for n, kind in enumerate(odd):
        odd_unit(journal, f"odd-{n}.service", kind)
    names = [*units, *(f"odd-{n}.service" for n in range(len(odd)))]
    folder = tmp_path / "journal"
    folder.mkdir()
    journal.write(folder / "system.journal")

    whole, skimmed = whole_read(folder, names), first_start(folder, names)
    expected, got = fold(whole, names), fold(skimmed, names)
    a = expected["vllm-a.service"]
    # the journal is what it says: three failures, each its own phase and reason, before a start that is ready
    assert set(a.failures) == {(Phase.LOADING_WEIGHTS, Reason.CUDA_OOM), (Phase.LAUNCHING, Reason.BAD_CONFIG),
                               (Phase.STARTING_API, Reason.PORT_IN_USE)}, a.failures
    assert dict(a.startups) == {Outcome.FAILED: 3, Outcome.READY: 1}
    assert a.suppressed_total == 5000 and len(a.attempt.gaps) == 3
    assert dict(expected["engine-b.service"].startups) == {Outcome.FAILED: 2, Outcome.READY: 2}
    assert dict(expected["vllm-box"].startups) == {Outcome.FAILED: 1, Outcome.READY: 1}
    for unit in names:
        assert got[unit] == expected[unit], unit
        now = expected[unit].last_log + 1
        assert judge(got[unit], now, LIMITS) == judge(expected[unit], now, LIMITS) is not Verdict.INACTIVE
    # and most serving lines never crossed the pipe
    lines = {unit: sum(isinstance(o, LogLine) and o.unit == unit for o in skimmed) for unit in units}
    assert all(lines[unit] < 400 for unit in units), lines


@pytest.mark.parametrize("silence", [pytest.param(5.0, id="a shorter silence threshold"),
                                     pytest.param(120.0, id="a longer one")])
def test_the_silences_handed_over_are_the_folds(tmp_path, silence):
    """The child hands over the first line after each silence of the agent's threshold, not of the default."""
    journal = Journal()
    a_systemd_unit(journal, "vllm-a.service")
    folder = tmp_path / "journal"
    folder.mkdir()
    journal.write(folder / "system.journal")
    units, limits = ["vllm-a.service"], Limits(silence=silence)
    assert fold(first_start(folder, units, silence), units, limits) == fold(whole_read(folder, units), units, limits)
