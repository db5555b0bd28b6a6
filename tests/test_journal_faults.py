"""The journal under the reader: its death by SIGBUS, rotation, vacuum, journald restarts, truncation.

JournalSource reads through a child process (exporter/sources/journal_process.py); these tests follow
a unit that prints numbered ticks and check that every tick arrives once, in order, whatever happens. A
tick is a health probe's access line, which a rule reads (a heartbeat): the reading of a unit's earlier
lines hands each of them over too, where it drops the lines no rule reads (exporter.sources.journal_catchup).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys

import pytest

from exporter.shell.demo import sandbox
from exporter.core.model import LogLine
from exporter.sources.journal import JournalPlace
from exporter.sources.journal_process import JournalSource
from tests.scrape import Scrape, fetch, free_port, try_fetch, wait_for

TICKER = ("import sys, time\nfor i in range(1_000_000):\n"
          "    print(f'INFO:     127.0.0.1:43210 - \"GET /health HTTP/1.1\" 200 OK tick {i}', flush=True)\n"
          "    time.sleep(0.01)\n")
TICK = re.compile(r"tick (\d+)$")


class Ticks:
    """What a JournalSource hands over for one ticking unit."""

    def __init__(self, source: JournalSource, unit: str) -> None:
        self.source, self.unit, self.seen = source, unit, []

    def read(self) -> list[int]:
        for obs in self.source.drain():
            if isinstance(obs, LogLine) and obs.unit == self.unit and (m := TICK.search(obs.text)):
                self.seen.append(int(m.group(1)))
        return self.seen

    def past(self, n: int, what: str, timeout: float = 20) -> None:
        wait_for(lambda: (self.read() and self.seen[-1] >= n), timeout, what)

    def assert_once_in_order(self) -> None:
        assert self.seen == sorted(set(self.seen)), "a tick handed over twice or out of order"


@pytest.fixture
def ticking(journald, tmp_path):
    name = f"test-tick-{secrets.token_hex(4)}.service"
    unit = sandbox.start_unit(journald, name, [sys.executable, "-c", TICKER])
    source = JournalSource(JournalPlace(namespace=journald.namespace))
    source.watch([name])
    source.start()
    ticks = Ticks(source, name)
    ticks.past(20, "the first ticks")
    yield ticks
    source.stop()
    unit.stop()


def journalctl(journald, *args: str) -> None:
    subprocess.run(["journalctl", "--namespace", journald.namespace, *args], check=True, capture_output=True)


def test_the_reader_killed_by_sigbus_resumes_after_the_last_entry(ticking):
    for _ in range(3):
        before = ticking.read()[-1]
        os.kill(ticking.source.child_pid, signal.SIGBUS)
        ticking.past(before + 100, "ticks after the reader died")
    assert ticking.source.restarts == 3
    ticking.assert_once_in_order()
    assert ticking.seen == list(range(ticking.seen[0], ticking.seen[-1] + 1)), "a tick was lost"


def test_a_sigterm_that_reaches_the_reader_is_the_agents_to_handle(ticking):
    """systemd's stop signals every process of the unit; the reader leaves it to the agent, which
    stops it itself, and reads on meanwhile."""
    child = ticking.source.child_pid
    before = ticking.read()[-1]
    os.kill(child, signal.SIGTERM)
    ticking.past(before + 100, "ticks after the SIGTERM")
    assert (ticking.source.child_pid, ticking.source.restarts) == (child, 0)
    ticking.assert_once_in_order()


def test_rotation_and_vacuum_while_reading(ticking, journald):
    for _ in range(5):
        journalctl(journald, "--rotate")
        journalctl(journald, "--vacuum-files=2")
        ticking.past(ticking.read()[-1] + 30, "ticks after a rotation and vacuum")
    ticking.assert_once_in_order()
    assert ticking.seen == list(range(ticking.seen[0], ticking.seen[-1] + 1)), "a tick was lost"
    assert ticking.source.status.health.up


def _ticks_in_journal(journald, unit: str) -> list[int]:
    reader = journald.reader(_SYSTEMD_UNIT=unit)
    try:
        return [int(m.group(1)) for entry in reader if (m := TICK.search(str(entry.get("MESSAGE", ""))))]
    finally:
        reader.close()


def _every_surviving_tick_handed_over(ticking, journald) -> None:
    """Every tick between the first and the last seen was handed over, once and in order, but those no
    longer in the journal: none that survived was skipped (as by a reader that started again at the end)."""
    ticking.assert_once_in_order()
    seen, kept = set(ticking.seen), set(_ticks_in_journal(journald, ticking.unit))
    missed = [t for t in range(ticking.seen[0], ticking.seen[-1]) if t not in seen]
    skipped = [t for t in missed if t in kept]
    assert not skipped, f"ticks still in the journal were never handed over: {skipped[:5]}… ({len(skipped)})"
    assert missed, "no tick was lost to the fault: the test did not do what it says"


def test_a_vacuumed_cursor(ticking, journald):
    # The reader dies; while it is down the file holding its cursor is archived and vacuumed away. The
    # new one cannot find the entry at its cursor and goes on from the next one there is.
    child = ticking.source.child_pid
    os.kill(child, signal.SIGSTOP)
    journalctl(journald, "--rotate")  # archives the file holding the cursor's entry
    journalctl(journald, "--rotate")  # and one more, newer: vacuum keeps only that one
    journalctl(journald, "--vacuum-files=1")
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: ticking.source.restarts == 1, 20, "the reader to be started again")
    last = ticking.read()[-1]  # all the dead reader sent: the next tick is the new reader's
    assert last not in _ticks_in_journal(journald, ticking.unit), "the cursor's entry is vacuumed"
    ticking.past(last + 50, "ticks after resuming from a vacuumed cursor")
    _every_surviving_tick_handed_over(ticking, journald)
    assert ticking.source.restarts == 1


def test_journald_restarted_under_the_reader(ticking, journald):
    journald.restart()  # the ticking unit's stream dies with the old journald, as on a real host
    name = f"test-after-restart-{secrets.token_hex(4)}.service"
    ticking.source.watch([name])
    with sandbox.start_unit(journald, name, [sys.executable, "-c", TICKER]):
        after = Ticks(ticking.source, name)
        after.past(30, "a unit started after journald's restart")
    after.assert_once_in_order()


def test_an_archived_file_truncated_under_the_reader(ticking, journald):
    # The reader is held while the file it reads is archived and truncated, with ticks in it it has not
    # read yet (what journald 250–254 does to archived files on vacuum); then it reads on.
    child = ticking.source.child_pid
    os.kill(child, signal.SIGSTOP)
    last = wait_for(lambda: (t := _ticks_in_journal(journald, ticking.unit)) and t[-1] > ticking.read()[-1] + 10 and t,
                    10, "ticks the stopped reader has not read")[-1]
    journalctl(journald, "--rotate")
    archived = [p for d in journald.journal_dirs if d.is_dir() for p in d.glob("*@*.journal")]
    assert archived, "journalctl --rotate archived a file"
    for path in archived:
        os.truncate(path, 4096)
    os.kill(child, signal.SIGCONT)
    ticking.past(last + 100, "ticks after the truncation, reader dead or not")
    _every_surviving_tick_handed_over(ticking, journald)
    # libsystemd notices the truncation and reads on; where it dies of SIGBUS instead, that is one restart
    assert ticking.source.restarts == (ticking.source.child_pid != child)


def test_the_agent_killed_mid_startup_comes_back_where_it_was(agent, units, journal_records):
    """SIGKILL, then start again: the same phase and verdict at once, and no start counted twice."""
    from tests.test_serve import CUDA_OOM, HANG_AFTER_COMPILE

    failed = units("failed", CUDA_OOM)
    hang = units("hang", HANG_AFTER_COMPILE)
    journal_records(hang, until=lambda es: any("torch.compile" in str(e.get("MESSAGE")) for e in es))
    first = agent(failed.name, hang.name)
    before = wait_for(lambda: (s := Scrape(fetch(first))).one_of("unit_verdict", hang.name, "verdict") == "stalled"
                      and s.one_of("unit_verdict", failed.name, "verdict") == "failed" and s,
                      30, "one failed, one stalled")
    pid = next(p for p in _agents() if str(first) in " ".join(p.cmdline()))
    pid.kill()
    pid.wait(5)

    second = agent(failed.name, hang.name)  # it answers /metrics only once it has read the units' history
    after = Scrape(fetch(second))
    for unit in (failed.name, hang.name):
        assert after.one_of("unit_phase", unit, "phase") == before.one_of("unit_phase", unit, "phase")
        assert after.one_of("unit_verdict", unit, "verdict") == before.one_of("unit_verdict", unit, "verdict")
    for name, labels in [("llmstartup_startups_total", {"unit": failed.name, "outcome": "failed"}),
                         ("llmstartup_failures_total", {"unit": failed.name, "phase": "compiling", "reason": "cuda_oom"}),
                         ("llmstartup_phase_duration_seconds_count", {"unit": hang.name, "phase": "loading_weights"})]:
        assert after.value(name, **labels) == before.value(name, **labels) == 1, name


def _agents():
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if "serve" in (p.info["cmdline"] or []) and "exporter" in (p.info["cmdline"] or [])]


def test_a_stop_sent_to_the_whole_group_is_quiet(journald, tmp_path):
    """systemd's stop (KillMode=control-group) and a terminal's Ctrl-C reach the reader child too; the
    agent stops it itself, and has no reader's death to report. A stop as soon as it serves is not lost."""
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu", "--state.path", str(tmp_path / "s.db")]
    for stop in (signal.SIGTERM, signal.SIGINT):
        log = tmp_path / f"agent-{stop.name}.log"
        with open(log, "w") as err:
            agent = subprocess.Popen(argv, stderr=err, start_new_session=True)
        try:
            wait_for(lambda: try_fetch(port), 15, "the agent to serve /metrics")
            wait_for(lambda: Scrape(fetch(port)).value("llmstartup_source_up", source="journal") == 1, 10,
                     "the reader child to read")  # it ignores the stop signals once it runs
            os.killpg(agent.pid, stop)
            assert agent.wait(timeout=10) == 0
        finally:
            agent.kill()
        assert "journal reader died" not in log.read_text(), log.read_text()


def _checkpoint_saying(path, unit: str, cursor: str) -> None:
    """A history whose checkpoint says `unit` is ready, as of the journal entry `cursor`."""
    from exporter.core import checkpoint
    from exporter.core.model import Attempt, Outcome, Phase, UnitState
    from exporter.shell.agent import boot_id
    from exporter.shell.history import History

    attempt = Attempt(started=1.0, phase=Phase.READY, phase_since=2.0, outcome=Outcome.READY, ready_at=2.0,
                      spans=((Phase.LAUNCHING, 1.0), (Phase.READY, 2.0)))
    state = UnitState(unit, "vllm", attempt=attempt, startups={Outcome.READY: 1})
    history = History(path)
    history.save_checkpoint(checkpoint.dump([state], boot_id(), cursor))
    history.close()


@pytest.mark.parametrize("cursor_kept", [True, False], ids=["its cursor in the journal", "its cursor gone"])
def test_a_restarted_agent_takes_over_the_checkpoint_only_with_its_journal_position(
        agent, units, journal_records, journald, tmp_path, cursor_kept):
    """A restart reads on from the checkpoint's cursor, not this boot's whole journal (what the checkpoint
    says stands, though the journal says otherwise before the cursor); a cursor that cannot be used is
    said, and the journal read from this boot's start as on a first start."""
    from tests.test_serve import HANG_AFTER_COMPILE

    hang = units("hang", HANG_AFTER_COMPILE)
    journal_records(hang, until=lambda es: any("torch.compile" in str(e.get("MESSAGE")) for e in es))
    reader = journald.reader()
    reader.seek_tail()
    reader.get_previous()
    cursor = reader._get_cursor() if cursor_kept else "s=0123456789abcdef0123456789abcdef;i=1;b=00;m=1;t=1;x=1"
    reader.close()
    _checkpoint_saying(tmp_path / "state.db", hang.name, cursor)
    port = agent(hang.name)
    scrape = Scrape(fetch(port))
    phase = scrape.one_of("unit_phase", hang.name, "phase")
    log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
    if cursor_kept:
        assert phase == "ready"  # the checkpoint's word: the journal before the cursor was not read again
        assert "cannot be used" not in log
    else:
        # Never the checkpoint's word: its states are dropped, and the journal is read from this boot's start.
        # That reading is a first start's, whose first scrape waits for it at most the warm-up's 10 s (a
        # shared namespace journal on a loaded CI machine has taken longer): then it shows the journal's phase.
        assert phase in ("compiling", "inactive")
        seen = [phase]
        try:
            wait_for(lambda: seen.append(Scrape(fetch(port)).one_of("unit_phase", hang.name, "phase")) or seen[-1] == "compiling",
                     30, "the unit's phase read from the journal")
        except AssertionError as error:  # say what the agent saw and did, for a failure that is rare
            log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
            raise AssertionError(f"{error}; phases seen {sorted(set(map(str, seen)))}; the agent's log:\n{log}") from None
        log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
        assert "journal position s=0123456789abcdef" in log and "cannot be used" in log


def test_a_dead_reader_is_counted_in_the_exposition(agent, units, journal_records):
    import psutil

    hang = units("hang", [{"log": "vLLM API server version 0.11.0"}, {"hang": True}])
    port = agent(hang.name)
    assert Scrape(fetch(port)).value("llmstartup_journal_reader_restarts_total") == 0
    [serve] = [p for p in _agents() if str(port) in " ".join(p.cmdline())]
    [reader] = [c for c in serve.children() if "exporter.sources.journal_child" in " ".join(c.cmdline())]
    reader.send_signal(signal.SIGBUS)
    wait_for(lambda: (s := Scrape(fetch(port))).value("llmstartup_journal_reader_restarts_total") == 1
             and s.value("llmstartup_source_up", source="journal") == 1, 20, "the restart counted, the journal read again")
    assert psutil.wait_procs([reader], timeout=5)[0], "the reader died"
