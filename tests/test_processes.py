"""The process source against real processes in real cgroup v2 directories."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from exporter.core.model import ProcessSample, ProcessState
from exporter.sources.processes import (
    CgroupUnavailable,
    ProcessSource,
    create_time_offset,
    find_cgroup2_root,
    parse_cgroup2_mount,
)
from tests.needs import needs

T = TypeVar("T")

CGROUP2 = find_cgroup2_root()
needs_cgroup = needs(
    os.geteuid() == 0 and CGROUP2 is not None,
    "root and a mounted cgroup2 filesystem, to create cgroups and move processes into them",
    root=True,
)

WAIT = "import sys; sys.stdin.readline()"
BURN = "import sys; sys.stdin.readline()\nwhile True: pass"
MiB = 1024 * 1024


# ---- mountinfo ----

PURE_V2 = """\
22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:8 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_ONLY = """\
31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
33 31 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
"""


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(PURE_V2, "/sys/fs/cgroup", id="pure v2"),
        pytest.param(HYBRID, "/sys/fs/cgroup/unified", id="hybrid: v2 beside the v1 controllers"),
        pytest.param(V1_ONLY, None, id="v1 only"),
        pytest.param("", None, id="empty"),
        pytest.param(
            "41 31 0:38 / /sys/fs/cgroup rw shared:1 master:2 propagate_from:3 - cgroup2 none rw\n",
            "/sys/fs/cgroup",
            id="several optional fields before the separator",
        ),
        pytest.param(
            "41 31 0:38 /docker/abc /sys/fs/cgroup ro,relatime - cgroup2 cgroup rw\n",
            "/sys/fs/cgroup",
            id="container: a subtree mounted as the root",
        ),
        pytest.param(
            "41 31 0:38 / /mnt/my\\040cgroup rw - cgroup2 cgroup2 rw\n",
            "/mnt/my cgroup",
            id="octal escape in the mount point",
        ),
        pytest.param(
            "50 31 0:40 / /srv/cgroup2 rw - ext4 /dev/sda1 rw\n",
            None,
            id="cgroup2 in a path is not the fstype",
        ),
        pytest.param(
            "50 31 0:40 / - rw - ext4 /dev/sda1 rw\n",
            None,
            id="a mount point named '-' is not the separator",
        ),
        pytest.param("garbage\n41 31 0:38\n", None, id="truncated lines"),
    ],
)
def test_parse_cgroup2_mount(text: str, expected: str | None) -> None:
    assert parse_cgroup2_mount(text) == expected


def test_find_cgroup2_root_reads_a_mountinfo_file(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(HYBRID)
    assert find_cgroup2_root(mountinfo) == Path("/sys/fs/cgroup/unified")


# ---- helpers ----


boot_offset = create_time_offset


def poll(check: Callable[[], T], timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still {result!r} after {timeout} s")
        time.sleep(0.01)
    return result


def tell(proc: subprocess.Popen[str], line: str = "go") -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def hear(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _procs(cgroup: Path) -> list[int]:
    pids = []
    for directory, _, _ in os.walk(cgroup):
        with suppress(FileNotFoundError):
            pids += [int(pid) for pid in Path(directory, "cgroup.procs").read_text().split()]
    return pids


@dataclass
class Unit:
    """A service cgroup of our own, with a nested `sub` cgroup, and the processes we put in it."""

    root: Path
    path: Path
    children: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    def spawn(self, code: str, *args: str, sub: str = "") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.children.append(proc)
        (self.path / sub / "cgroup.procs").write_text(str(proc.pid))
        return proc

    def sample(self, source: ProcessSource) -> ProcessSample:
        return source.sample([self.name], time.monotonic(), boot_offset())[self.name]

    def clear(self) -> None:
        for proc in self.children:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        deadline = time.monotonic() + 10
        while (pids := _procs(self.path)) and time.monotonic() < deadline:
            for pid in pids:  # grandchildren forked by our children
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for pid in _procs(self.path):  # whatever would not die must not keep the cgroup alive
            with suppress(ProcessLookupError):
                (self.root / "cgroup.procs").write_text(str(pid))
        for cgroup in (self.path / "sub", self.path):
            poll(lambda cgroup=cgroup: _rmdir(cgroup))


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY while an exiting process still counts as a member
        return False
    return True


@pytest.fixture
def unit() -> Unit:
    assert CGROUP2 is not None
    slice_dir = CGROUP2 / "system.slice"
    made_slice = not slice_dir.exists()
    slice_dir.mkdir(exist_ok=True)
    path = slice_dir / f"test-{secrets.token_hex(4)}.service"
    (path / "sub").mkdir(parents=True)
    made = Unit(CGROUP2, path)
    try:
        yield made
    finally:
        made.clear()
        if made_slice:
            with suppress(OSError):  # another test run may be using it by now
                slice_dir.rmdir()


@pytest.fixture
def source() -> ProcessSource:
    assert CGROUP2 is not None
    return ProcessSource(CGROUP2)


# ---- real cgroups ----


@needs_cgroup
def test_ids_and_started_at(unit: Unit, source: ProcessSource) -> None:
    before = time.monotonic()
    first = unit.spawn(WAIT)
    between = time.monotonic()
    second = unit.spawn(WAIT)

    # both wait on stdin once their interpreter is up
    sample = poll(lambda: (s := unit.sample(source)).states[ProcessState.SLEEPING] == 2 and s)

    assert {pid for pid, _ in sample.ids} == {first.pid, second.pid}
    started = dict(sample.ids)
    assert sample.started_at == started[first.pid] <= started[second.pid]
    # /proc/<pid>/stat counts start times in 10 ms clock ticks
    assert before - 0.011 <= sample.started_at <= between
    assert sample.rss_bytes > 0
    assert sample.unit == unit.name


@needs_cgroup
def test_ids_do_not_change_while_the_processes_live(unit: Unit, source: ProcessSource) -> None:
    unit.spawn(WAIT)
    first = unit.sample(source)
    # the wall/monotonic offset drifts under NTP; a process must keep its identity regardless
    later = source.sample([unit.name], time.monotonic(), boot_offset() + 0.5)[unit.name]
    assert later.ids == first.ids
    assert later.started_at == first.started_at


@needs_cgroup
def test_cpu_seconds_grow_while_a_process_burns_cpu(unit: Unit, source: ProcessSource) -> None:
    burner = unit.spawn(BURN)
    first = unit.sample(source)
    tell(burner)
    grown = poll(lambda: (s := unit.sample(source)).cpu_seconds >= first.cpu_seconds + 0.2 and s)
    assert grown.t > first.t


@needs_cgroup
def test_cpu_of_exited_children_stays_counted(unit: Unit, source: ProcessSource) -> None:
    # a torch.compile worker that burns CPU and exits must not take its CPU time with it
    parent = unit.spawn(
        "import subprocess, sys\n"
        "sys.stdin.readline()\n"
        "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time() + 0.3\\n"
        "while time.process_time() < t: pass'])\n"
        "print('done', flush=True)\n"
        "sys.stdin.readline()"
    )
    first = unit.sample(source)
    tell(parent)
    assert hear(parent) == "done"
    after = unit.sample(source)
    assert {pid for pid, _ in after.ids} == {parent.pid}
    assert after.cpu_seconds >= first.cpu_seconds + 0.3


@needs_cgroup
def test_a_zombie_child_is_not_listed_and_does_not_raise(unit: Unit, source: ProcessSource) -> None:
    # The kernel leaves dead processes out of cgroup.procs, so a child its parent never waits for
    # is invisible here; only its parent remains.
    parent = unit.spawn(
        "import os, sys\nsys.stdin.readline()\npid = os.fork()\n"
        "if pid == 0: os._exit(0)\nprint(pid, flush=True)\n"
        "sys.stdin.readline()\nos.waitpid(pid, 0)\nprint('reaped', flush=True)\nsys.stdin.readline()"
    )
    tell(parent)
    child = int(hear(parent))
    try:
        poll(lambda: psutil.Process(child).status() == psutil.STATUS_ZOMBIE)

        sample = unit.sample(source)

        assert {pid for pid, _ in sample.ids} == {parent.pid}
        assert sample.states[ProcessState.ZOMBIE] == 0
    finally:
        # reaped here: orphaned, it would wait for PID 1, which in a container may never reap it
        tell(parent)
        assert hear(parent) == "reaped"


@needs_cgroup
def test_a_process_whose_main_thread_exited_counts_as_zombie(unit: Unit, source: ProcessSource) -> None:
    # The one zombie cgroup.procs does list: the leader is dead, another thread still runs.
    proc = unit.spawn(
        "import ctypes, sys, threading\n"
        "threading.Thread(target=sys.stdin.readline).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)"
    )
    poll(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE)

    sample = unit.sample(source)

    assert {pid for pid, _ in sample.ids} == {proc.pid}
    assert sample.states[ProcessState.ZOMBIE] == 1
    assert source.list_units()[unit.name] == ()  # a zombie has no command line left


@needs_cgroup
def test_a_process_that_vanished_between_samples(unit: Unit, source: ProcessSource) -> None:
    stays, goes = unit.spawn(WAIT), unit.spawn(WAIT)
    first = unit.sample(source)
    assert len(first.ids) == 2

    goes.kill()
    goes.wait()
    second = unit.sample(source)
    assert {pid for pid, _ in second.ids} == {stays.pid}
    assert second.ids < first.ids

    stays.kill()
    stays.wait()
    last = unit.sample(source)
    assert last.ids == frozenset()
    assert last.started_at is None
    assert last.rss_bytes == 0


@needs_cgroup
def test_processes_vanishing_while_being_read_never_raise(
    unit: Unit, source: ProcessSource, tmp_path: Path
) -> None:
    # short-lived children come and go between cgroup.procs and /proc/<pid>: a compile worker pool
    flag = tmp_path / "fork"
    flag.touch()
    forker = unit.spawn(
        "import os, sys\nprint('forking', flush=True)\n"
        "while os.path.exists(sys.argv[1]):\n"
        "    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\n"
        "print('stopped', flush=True)\nsys.stdin.readline()",
        str(flag),
    )
    assert hear(forker) == "forking"
    seen: set[int] = set()
    try:
        for _ in range(300):
            sample = unit.sample(source)
            assert forker.pid in dict(sample.ids)
            seen |= {pid for pid, _ in sample.ids}
    finally:
        flag.unlink()  # stop forking so no child is orphaned by the teardown's SIGKILL
        assert hear(forker) == "stopped"
    assert len(seen) > 1


@needs_cgroup
def test_a_process_in_a_nested_cgroup_counts(unit: Unit, source: ProcessSource) -> None:
    top = unit.spawn(WAIT)
    nested = unit.spawn(WAIT, sub="sub")
    sample = unit.sample(source)
    assert {pid for pid, _ in sample.ids} == {top.pid, nested.pid}


@needs_cgroup
def test_read_and_written_chars_grow(unit: Unit, source: ProcessSource, tmp_path: Path) -> None:
    writer = unit.spawn(
        "import sys\nsys.stdin.readline()\n"
        "with open(sys.argv[1], 'wb') as f: f.write(bytes(1 << 20))\n"
        "with open(sys.argv[1], 'rb') as f: f.read()\n"
        "print('done', flush=True)\nsys.stdin.readline()",
        str(tmp_path / "blob"),
    )
    first = unit.sample(source)
    tell(writer)
    assert hear(writer) == "done"
    after = unit.sample(source)
    assert after.written_bytes >= first.written_bytes + MiB
    assert after.read_bytes >= first.read_bytes + MiB


@needs_cgroup
def test_a_unit_without_a_cgroup_is_empty(source: ProcessSource) -> None:
    name = f"absent-{secrets.token_hex(4)}.service"
    sample = source.sample([name], 12.5, boot_offset())[name]
    assert sample == ProcessSample(
        t=12.5,
        unit=name,
        ids=frozenset(),
        cpu_seconds=0.0,
        read_bytes=0,
        written_bytes=0,
        rss_bytes=0,
        states=sample.states,
        started_at=None,
    )
    assert dict(sample.states) == dict.fromkeys(ProcessState, 0)


@needs_cgroup
def test_list_units_finds_a_unit_by_command_line(unit: Unit, source: ProcessSource) -> None:
    assert unit.name not in source.list_units()  # no process yet
    marker = f"--model=marker-{secrets.token_hex(4)}"
    proc = unit.spawn(WAIT, marker, sub="sub")
    assert source.list_units()[unit.name] == (f"{sys.executable} -c {WAIT} {marker}",)
    assert proc.pid in dict(unit.sample(source).ids)


@needs_cgroup
def test_one_units_command_lines(unit: Unit, source: ProcessSource) -> None:
    """What the agent reads when a unit named without its engine first logs."""
    assert source.cmdlines(unit.name) == ()  # no process yet
    assert source.cmdlines("no-such-unit.service") == ()
    marker = f"--model=marker-{secrets.token_hex(4)}"
    unit.spawn(WAIT, marker, sub="sub")
    assert source.cmdlines(unit.name) == (f"{sys.executable} -c {WAIT} {marker}",)


# ---- no cgroup2 needed ----


def test_an_unreadable_root_raises(tmp_path: Path) -> None:
    source = ProcessSource(tmp_path / "missing")
    with pytest.raises(CgroupUnavailable, match="cgroup v2 root") as raised:
        source.sample(["x.service"], 0.0, 0.0)
    assert isinstance(raised.value, OSError)
    with pytest.raises(CgroupUnavailable):
        source.list_units()


def test_a_root_that_is_not_cgroup2_raises(tmp_path: Path) -> None:
    (tmp_path / "system.slice").mkdir()  # looks like a tree, but has no cgroup.controllers
    with pytest.raises(CgroupUnavailable):
        ProcessSource(tmp_path).sample(["x.service"], 0.0, 0.0)


def test_cpu_falls_back_to_process_times_without_cpu_stat(tmp_path: Path) -> None:
    # a directory tree shaped like cgroupfs but with no cpu.stat, listing a real process
    (tmp_path / "cgroup.controllers").touch()
    cgroup = tmp_path / "system.slice" / "fake.service"
    cgroup.mkdir(parents=True)
    burner = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, text=True)
    try:
        (cgroup / "cgroup.procs").write_text(f"{burner.pid}\n")
        source = ProcessSource(tmp_path)
        tell(burner)

        def sampled() -> ProcessSample | None:
            got = source.sample(["fake.service"], time.monotonic(), boot_offset())["fake.service"]
            return got if got.cpu_seconds >= 0.2 else None

        sample = poll(sampled)
        times = psutil.Process(burner.pid).cpu_times()
        assert sample.cpu_seconds <= times.user + times.system + 0.01
        assert {pid for pid, _ in sample.ids} == {burner.pid}
    finally:
        burner.kill()
        burner.wait()
        assert burner.stdin is not None
        burner.stdin.close()
