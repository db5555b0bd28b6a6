"""The stack source against real processes: real py-spy dumps, /proc's kernel view, and py-spy's failures
(a process that exits mid-dump, a dump past its timeout, no permission): never a crash, never a stack
that was not read, and the source down with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from exporter.core.model import StackSample
from exporter.core.stuck import waiting_for
from exporter.sources import stacks
from exporter.sources.stacks import DumpFailed, StackSource, dump, find_py_spy, kernel_view, may_ptrace
from tests.scrape import wait_for

PY_SPY = find_py_spy()
pytestmark = pytest.mark.skipif(PY_SPY is None, reason="py-spy is a dependency: pip install -e .")

# A Python process whose main thread spins in synchronize() while another thread sleeps.
SPINNER = textwrap.dedent("""
    import sys, threading, time
    def idle():
        time.sleep(3600)
    def synchronize():
        while True: pass
    threading.Thread(target=idle, name="idle", daemon=True).start()
    print("spinning", flush=True)
    synchronize()
""")


def _started(argv: list[str]) -> Iterator[subprocess.Popen]:  # type: ignore[type-arg]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen]:  # type: ignore[type-arg]
    for process in _started([sys.executable, "-c", SPINNER]):
        assert process.stdout and process.stdout.readline() == "spinning\n"
        yield process


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:  # type: ignore[type-arg]
    """A native process: coreutils' sleep."""
    yield from _started(["sleep", "3600"])


def _look(source: StackSource, unit: str, pids: set[int]) -> StackSample:
    source.watch({unit: frozenset(pids)})
    source.look_once()
    [sample] = source.drain()
    return sample


def test_a_python_process_is_dumped_busiest_thread_first(spinner) -> None:
    source = StackSource(interval=1.0, every=0.0, python=True)
    _look(source, "u.service", {spinner.pid})
    time.sleep(0.3)  # the busiest thread is the one that burned CPU since the look before
    [process] = _look(source, "u.service", {spinner.pid}).processes
    assert process.threads is not None
    busiest, *others = process.threads
    assert (busiest.thread, busiest.frames[0].function) == (spinner.pid, "synchronize")
    assert [t.frames[0].function for t in others] == ["idle"]
    assert process.state == "R" and process.cpu_seconds > 0
    assert source.status.health.up


def test_a_native_process_is_not_dumped_and_the_kernel_says_where_it_waits(sleeper) -> None:
    source = StackSource(interval=1.0, every=0.0, python=True)
    deadline = time.monotonic() + 5
    while "sleeps" not in waiting_for(kernel_view(sleeper.pid).wchan):  # exec'd, loaded, and asleep
        assert time.monotonic() < deadline, kernel_view(sleeper.pid)
        time.sleep(0.01)
    [process] = _look(source, "u.service", {sleeper.pid}).processes
    assert process.threads is None
    assert process.state == "S"
    assert "sleeps" in waiting_for(process.wchan), process.wchan
    assert source.status.health.up


def test_a_process_that_has_not_run_since_its_last_dump_is_not_dumped_again(tmp_path) -> None:
    """No thread on a CPU since the last look (schedstat's count): no code ran, the stacks are the same."""
    counted = tmp_path / "py-spy"
    calls = tmp_path / "calls"
    counted.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexec {PY_SPY} \"$@\"\n")
    counted.chmod(0o755)
    idle_code = "import time; print('ready', flush=True); time.sleep(3600)"
    waking_code = "import time; print('ready', flush=True)\nwhile True: time.sleep(0.01)"
    for idle in _started([sys.executable, "-c", idle_code]):
        for waking in _started([sys.executable, "-c", waking_code]):
            for process in (idle, waking):
                assert process.stdout and process.stdout.readline() == "ready\n"
            source = StackSource(interval=1.0, every=0.0, python=True, py_spy=str(counted))
            looks = []
            for _ in range(3):
                time.sleep(0.3)  # the idle one is asleep for good, the other has woken a few times
                looks.append(_look(source, "u.service", {idle.pid, waking.pid}))
            dumped = [line.split()[-1] for line in calls.read_text().splitlines()]
            assert dumped.count(str(idle.pid)) == 1 and dumped.count(str(waking.pid)) == 3, dumped
            idle_stacks = [p.threads for look in looks for p in look.processes if p.pid == idle.pid]
            assert idle_stacks[0] and idle_stacks.count(idle_stacks[0]) == 3  # the same stacks, each look


def test_without_stacks_only_the_kernel_is_asked(spinner) -> None:
    source = StackSource(interval=1.0, every=0.0, python=False)
    [process] = _look(source, "u.service", {spinner.pid}).processes
    assert (process.state, process.threads) == ("R", None)


def test_a_dump_past_its_timeout_is_abandoned_and_the_source_is_down(spinner) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    source = StackSource(interval=1.0, every=0.0, python=True, timeout=0.001)
    [process] = _look(source, "u.service", {spinner.pid}).processes
    assert process.threads is None  # no stack that was not read
    assert process.state == "R"  # the kernel's view is still there
    assert not source.status.health.up
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before  # no py-spy left running
    with pytest.raises(DumpFailed, match="timed out"):
        dump(PY_SPY, spinner.pid, timeout=0.001)


def test_a_process_that_exits_mid_dump_is_nobodys_fault() -> None:
    source = StackSource(interval=1.0, every=0.0, python=True)
    for delay in (0.0, 0.005, 0.01, 0.02, 0.04):
        for target in _started([sys.executable, "-c", SPINNER]):
            assert target.stdout and target.stdout.readline() == "spinning\n"
            looked = threading.Thread(target=_look, args=(source, "u.service", {target.pid}))
            looked.start()
            time.sleep(delay)
            target.kill()
            looked.join()
        assert source.status.health.up, delay
    with pytest.raises(DumpFailed) as failed:
        dump(PY_SPY, target.pid)
    assert failed.value.gone


def test_a_unit_is_looked_at_once_it_falls_silent_then_every_so_often(spinner) -> None:
    clock = [100.0]
    source = StackSource(interval=1.0, every=10.0, python=False, clock=lambda: clock[0])
    source.watch({"u.service": frozenset({spinner.pid})})
    source.look_once()
    clock[0] += 5
    source.look_once()
    assert [s.t for s in source.drain()] == [100.0]
    clock[0] += 5
    source.look_once()
    assert [s.t for s in source.drain()] == [110.0]
    source.watch({})  # it spoke: not looked at
    source.look_once()
    source.watch({"u.service": frozenset({spinner.pid})})  # silent again: looked at at once
    clock[0] += 1
    source.look_once()
    assert [s.t for s in source.drain()] == [111.0]


def test_the_source_thread_looks_without_being_asked_twice(spinner) -> None:
    source = StackSource(interval=0.05, every=0.0, python=True)
    source.start()
    try:
        source.watch({"u.service": frozenset({spinner.pid})})
        wait_for(source.drain, 10, "a look by the source's own thread", every=0.02)
    finally:
        source.stop()


def test_without_py_spy_the_source_is_down_and_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setattr(stacks, "find_py_spy", lambda: None)
    source = StackSource(interval=1.0, every=0.0, python=True)
    assert not source.status.health.up
    assert source.py_spy is None


@pytest.mark.parametrize(
    ("status", "allowed"),
    [
        pytest.param("CapEff:\t000001fffeffffff\n", True, id="root's capabilities"),
        pytest.param("CapEff:\t0000000000080000\n", True, id="CAP_SYS_PTRACE alone"),
        pytest.param("CapEff:\t0000000000000000\n", False, id="none"),
    ],
)
def test_ptrace_is_read_from_the_effective_capabilities(status, allowed) -> None:
    assert may_ptrace(status) is allowed


NOBODY = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from exporter.sources.stacks import StackSource, dump, DumpFailed
    pid = int(sys.argv[1])
    source = StackSource(interval=1.0, every=0.0, python=True)
    source.watch({"u.service": frozenset({pid})})
    source.look_once()
    [sample] = source.drain()
    try:
        dump(source.py_spy or sys.argv[2], pid)
        direct = "dumped"
    except DumpFailed as error:
        direct = str(error)
    [process] = sample.processes
    print(json.dumps({"up": source.status.health.up, "threads": process.threads, "state": process.state,
                      "direct": direct}))
""")


def test_without_permission_the_source_is_down_with_its_reason_and_the_rest_works(spinner) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs a process as nobody: needs root")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", sys.executable, "-c", NOBODY,
         str(spinner.pid), PY_SPY],
        capture_output=True, text=True, cwd=here, env={**os.environ, "PYTHONPATH": here}, timeout=60, check=False,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen == {"up": False, "threads": None, "state": "R", "direct": seen["direct"]}
    assert "permission denied" in seen["direct"].lower() and "CAP_SYS_PTRACE" in seen["direct"]
    assert "needs root or CAP_SYS_PTRACE" in run.stderr  # one clear line in its log
    assert run.stderr.count("stacks source down") == 1
