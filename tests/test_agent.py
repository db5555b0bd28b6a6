"""The agent's round (`Agent.tick`) driven by fake sources and a fake clock: what it folds, in what order."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import replace

import pytest

from exporter.core.config import Config
from exporter.core.containers import Container
from exporter.core.entries import log_lines
from exporter.core.model import (
    Frame,
    Gpu,
    Group,
    LogLine,
    Phase,
    ProcessSample,
    ProcessStack,
    Reason,
    StackSample,
    ThreadStack,
    Verdict,
    XidError,
)
from exporter.core.report import status_line
from exporter.shell.agent import DISCOVER_EVERY, Agent
from exporter.shell.collector import SnapshotCollector
from exporter.shell.history import History
from exporter.shell.recorder import HistoryRecorder
from exporter.sources.gpu import GpuReading
from exporter.sources.status import SourceStatus

U = "llm.service"
LOG = logging.getLogger("test")
CONFIG = Config(units=((U, None),), interval=1.0, silence=10.0, stall=30.0, gpu=True)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeJournal:
    """Hands over what the test queues; a unit's earlier lines are 'read' once the test says so. Up at every drain,
    as the reader says it is every time it has read the journal to its end."""

    def __init__(self, wall=lambda: 0.0) -> None:
        self.status = SourceStatus("journal", LOG, wall)
        self.status.ok()
        self.drained_cursor: str | None = None
        self.ready_units: frozenset[str] = frozenset()
        self.restarts = 0
        self.resumed = False
        self.resume_lost: str | None = None
        self.behind = False
        self.read_through = float("inf")  # the reader is never behind the samples, unless the test says so
        self.queued: list = []

    def watch(self, units: Iterable[str]) -> None:
        pass

    def drain(self) -> list:
        self.status.ok()
        out, self.queued = self.queued, []
        return out

    def settle(self, timeout: float) -> None:
        pass

    def sync(self) -> None:
        pass

    def read_to(self, t: float, timeout: float) -> float:
        return self.read_through


class FakeProcesses:
    """One unit's processes: their command lines and their CPU, which the test turns."""

    def __init__(self, cmdline: str = "python -m vllm.entrypoints.openai.api_server") -> None:
        self.cmdline = cmdline
        self.pids: frozenset[tuple[int, float]] = frozenset({(42, 999.0)})
        self.cpu = 0.0
        self.rss = 0
        self.sampled: list[float] = []

    def sample(self, units: Iterable[str], t: float) -> dict[str, ProcessSample]:
        self.sampled.append(t)
        started = min((start for _, start in self.pids), default=None)
        return {u: ProcessSample(t, u, self.pids, self.cpu, 0, 0, self.rss, started_at=started) for u in units}

    def list_units(self) -> dict[str, tuple[str, ...]]:
        return {U: (self.cmdline,), "sshd.service": ("/usr/sbin/sshd -D",)} if self.pids else {}

    def cmdlines(self, unit: str) -> tuple[str, ...]:
        return (self.cmdline,) if unit == U and self.pids else ()


class FakeStacks:
    """Looks at what the agent says is silent, when the test says so: each look is the frames the test set."""

    def __init__(self) -> None:
        self.status = SourceStatus("stacks", LOG, lambda: 0.0)
        self.status.ok()
        self.targets: dict[str, frozenset[int]] = {}
        self.frames: tuple[Frame, ...] | None = (Frame("synchronize", "vllm/worker.py", 212),)
        self.cpu = 0.0
        self.looks: list[StackSample] = []

    def watch(self, targets) -> None:
        self.targets = dict(targets)

    def look(self, t: float) -> None:
        threads = None if self.frames is None else (ThreadStack(42, self.frames),)
        self.looks += [StackSample(t, u, (ProcessStack(pid, "R", "", self.cpu, threads),))
                       for u, pids in self.targets.items() for pid in sorted(pids)]

    def drain(self) -> list[StackSample]:
        out, self.looks = self.looks, []
        return out


class FakeGpu:
    def __init__(self) -> None:
        self.status = SourceStatus("gpu", LOG, lambda: 0.0)
        self.status.ok()
        self.latest: GpuReading | None = None


class FakeJournald:
    """journald as the test says it is: `why` it does not write the journal, "" when it does."""

    def __init__(self) -> None:
        self.why = ""
        self.asked: list[dict[str, list[int]]] = []

    def check(self, writers) -> str:
        self.asked.append({unit: sorted(pids) for unit, pids in writers.items()})
        return self.why


def agent(config: Config = CONFIG, processes: FakeProcesses | None = None, recorder=None):
    clock = Clock()
    journal, procs, gpu = FakeJournal(lambda: clock.t + 1.7e9), processes or FakeProcesses(), FakeGpu()
    return Agent(config, journal, procs, gpu, recorder, clock=clock, wall=lambda: clock.t + 1.7e9,
                 stacks=FakeStacks(), journald=FakeJournald()), clock


def recording(path):
    """An agent whose recorder writes the history at `path`, on the agent's own clock; the agent, clock and history."""
    clock_box: list[Clock] = []
    a, clock = agent(recorder=HistoryRecorder(History(path), "boot-1", lambda: clock_box[0].t))
    clock_box.append(clock)
    return a, clock, a.recorder.history


def view(snapshot, unit: str = U):
    return next(v for v in snapshot.units if v.state.unit == unit)


def test_a_unit_is_followed_from_its_lines_to_silence_to_a_stall() -> None:
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0")]
    assert (view(a.tick()).state.phase, view(a.snapshot).verdict) == (Phase.LAUNCHING, Verdict.PROGRESSING)
    verdicts = []
    for _ in range(20):  # silent, but its memory grows: silent work (weights paged in, a graph traced)
        clock.t += 2
        a.processes.rss += 40 * 2**20
        verdicts.append(view(a.tick()).verdict)
    assert verdicts[-1] is Verdict.SILENT_PROGRESS
    for _ in range(20):  # nothing moves for longer than the stall threshold
        clock.t += 2
        verdicts.append(view(a.tick()).verdict)
    assert verdicts[-1] is Verdict.STALLED
    first = {v: verdicts.index(v) for v in verdicts}
    assert first[Verdict.PROGRESSING] < first[Verdict.SILENT_PROGRESS] < first[Verdict.STALLED]


def test_a_stopped_journald_is_the_journals_outage_not_the_units(caplog) -> None:
    caplog.set_level(logging.INFO)
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0")]
    a.tick()
    assert a.journald.asked[-1] == {}, "a unit heard this round is not asked about"
    a.journald.why = "journald (pid 812) is stopped: nothing it is sent reaches the journal"
    for _ in range(25):  # past the stall threshold, nothing moving
        clock.t += 2
        snapshot = a.tick()
    assert a.journald.asked[-1] == {U: [42]}
    assert (view(snapshot).verdict, view(snapshot).why) == (Verdict.UNKNOWN, f"its lines cannot be read: {a.journald.why}")
    assert (snapshot.sources["journal"].up, snapshot.sources["journal"].why) == (False, a.journald.why)
    assert f"journal source down: {a.journald.why}" in caplog.text
    a.journald.why = ""  # journald again: the silence is the unit's own
    clock.t += 2
    snapshot = a.tick()
    assert (view(snapshot).verdict, snapshot.sources["journal"].up) == (Verdict.STALLED, True)
    assert "journal source up: journald writes the journal again" in caplog.text


def test_the_process_side_waits_until_the_units_earlier_lines_are_read() -> None:
    a, clock = agent()
    for _ in range(30):  # longer than the stall threshold, history still being read
        clock.t += 2
        snapshot = a.tick()
    assert view(snapshot).state.last_process is None
    assert view(snapshot).verdict is Verdict.INACTIVE  # nothing folded: never a stall from a half-read past
    a.journal.ready_units = frozenset({U})
    clock.t += 2
    assert view(a.tick()).state.last_process is not None


def test_lines_and_samples_are_folded_in_time_order() -> None:
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    clock.t += 5
    # the line was written before this round's sample: it must be folded first, or the sample would
    # begin an attempt that the line's invocation then replaces
    a.journal.queued = [LogLine(clock.t - 1, U, "Started engine process with PID 7", "inv-1")]
    state = view(a.tick()).state
    assert state.attempt is not None and state.attempt.started == clock.t - 1
    assert state.attempt.invocation == "inv-1"


@pytest.mark.parametrize(
    ("named", "cmdline", "line", "engine", "phase"),
    [
        pytest.param(((U, None),), "python3 -m sglang.launch_server --model-path m", "Load weight begin. avail mem=70.00 GB",
                     "sglang", Phase.DOWNLOADING, id="named without engine: its command line tells"),
        pytest.param(((U, "tgi"),), "python3 -m sglang.launch_server --model-path m", "Starting shard rank=0",
                     "tgi", Phase.LOADING_WEIGHTS, id="named with engine: the flag wins"),
        pytest.param((), "/usr/bin/llama-server -m /models/m.gguf", "main: server is listening on http://0.0.0.0:8080 - starting the main loop",
                     "llamacpp", Phase.READY, id="not named: discovered from its command line"),
    ],
)
def test_each_unit_is_read_with_its_engines_grammar(named, cmdline, line, engine, phase) -> None:
    a, clock = agent(Config(units=named, interval=1.0), FakeProcesses(cmdline))
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, line)]
    state = view(a.tick()).state
    assert (state.engine, state.phase) == (engine, phase)
    assert [v.state.unit for v in a.snapshot.units] == [U]  # sshd is no model server


def test_an_xid_seen_by_the_kernel_and_by_nvml_counts_once_and_fails_the_start_it_hits() -> None:
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, "vLLM API server version 0.11.0")]
    a.gpu.latest = GpuReading(clock.t, (Gpu("0", "GPU-0", "H200", "00000000:3B:00.0"),), {42: {"0": 40 * 2**30}})
    a.tick()
    clock.t += 1
    a.journal.queued = [XidError(clock.t, "0000:3b:00", 79, "kernel")]
    a.gpu.latest = GpuReading(clock.t, a.gpu.latest.devices, a.gpu.latest.usage,
                              xids=(XidError(clock.t + 0.5, "0", 79, "nvml"),))
    assert a.tick().xid_errors == {("0", 79): 1}
    clock.t += 10
    a.tick()  # the same reading again, later than any repeat would be: its events are not counted twice
    a.processes.pids = frozenset()  # the start dies (the sample that sees it is folded a round later)
    for _ in range(2):
        clock.t += 1
        state = view(a.tick()).state
    assert a.snapshot.xid_errors == {("0", 79): 1}
    assert (state.phase, state.attempt.reason) == (Phase.FAILED, Reason.GPU_XID)


def test_a_finished_start_is_stored_once_whatever_the_rounds(tmp_path) -> None:
    a, clock, history = recording(tmp_path / "history.db")
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, "vLLM API server version 0.11.0"),
                        LogLine(clock.t + 5, U, "Application startup complete.")]
    for _ in range(5):
        clock.t += 10
        a.tick()
    [record] = history.recent(U)
    assert (record.outcome, record.boot_id, record.ended - record.started) == ("ready", "boot-1", pytest.approx(5))
    assert view(a.snapshot).expected.startup.typical == pytest.approx(5)


def test_every_start_a_round_reads_is_stored_though_the_state_keeps_two(tmp_path) -> None:
    """A paused agent, or one restarted after a crash loop, reads several starts of a unit in one round: those
    that passed through its state in the fold are stored too, not only the last two the state keeps."""
    a, clock, history = recording(tmp_path / "history.db")
    a.journal.ready_units = frozenset({U})
    a.processes.pids = frozenset()
    a.journal.queued = [line for n in range(4) for line in (
        LogLine(clock.t + 10 * n, U, "vLLM API server version 0.11.0", f"inv-{n}"),
        LogLine(clock.t + 10 * n + 1, U, OOM_LINE, f"inv-{n}"))]
    clock.t += 60
    a.tick()
    assert sorted(r.started - 1.7e9 for r in history.recent(U)) == [pytest.approx(1000.0 + 10 * n) for n in range(3)]
    assert {(r.outcome, r.failure_reason) for r in history.recent(U)} == {("failed", "cuda_oom")}


def test_a_starts_last_words_are_read_before_the_sample_that_saw_it_exit() -> None:
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0")]
    a.tick()
    clock.t += 2
    a.processes.pids = frozenset()  # it printed its OOM and exited; the sample sees it gone first
    exited_at = clock.t
    a.tick()
    clock.t += 2
    a.journal.queued = [LogLine(exited_at - 0.1, U, OOM_LINE)]
    state = view(a.tick()).state
    assert (state.phase, state.attempt.reason) == (Phase.FAILED, Reason.CUDA_OOM)
    assert state.failures == {(Phase.LAUNCHING, Reason.CUDA_OOM): 1}


OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize(
    ("seen_before", "after"),
    [
        pytest.param(True, frozenset(), id="a start seen live, that exited while the agent was paused"),
        pytest.param(False, frozenset(), id="a start that began and exited while the agent was paused"),
        pytest.param(True, frozenset({(43, 1020.0)}), id="a start restarted while the agent was paused"),
    ],
)
def test_an_exit_settles_a_start_only_once_the_journal_is_read_up_to_it(seen_before, after) -> None:
    """The reader is behind the samples (a paused agent, a reader catching up): the start fails with the reason
    its lines give, not `exited`, whichever of its exit and its lines the agent sees first."""
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    first = LogLine(clock.t + 1, U, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0", "inv-1")
    if seen_before:
        a.journal.queued = [first]
    else:
        a.processes.pids = frozenset()
    clock.t += 2
    a.tick()
    # Paused for 30 s; meanwhile the start printed its OOM and exited. The reader has read only its first line.
    clock.t += 30
    a.processes.pids = after
    a.journal.read_through = clock.t - 25
    a.journal.queued = [] if seen_before else [replace(first, t=clock.t - 26)]
    for _ in range(3):
        clock.t += 1
        state = view(a.tick()).state
        assert state.failures == {}, "an exit settled before the lines written before it were read"
    a.journal.queued = [LogLine(clock.t - 20, U, OOM_LINE, "inv-1")]
    a.journal.read_through = clock.t
    for _ in range(2):
        clock.t += 1
        state = view(a.tick()).state
    assert state.failures == {(Phase.LAUNCHING, Reason.CUDA_OOM): 1}
    ended = state.previous if after else state.attempt
    assert (ended.phase, ended.reason) == (Phase.FAILED, Reason.CUDA_OOM)
    assert (state.attempt.ended is None) is bool(after)


def test_a_look_before_a_start_began_does_not_end_it() -> None:
    """A look that found no process, taken just before the unit started, waits a round; that round reads the
    start's first lines, and a \r bar among them dated back past the look (its elapsed field says so). Folded in
    time order, the look came after the bar's first redraw: it must not end the start it never saw."""
    a, clock = agent()
    a.journal.ready_units = frozenset({U})
    a.processes.pids = frozenset()
    a.tick()  # the look that finds nothing: held a round
    clock.t += 1
    a.processes.pids = frozenset({(42, clock.t - 0.5)})
    bar = "\r".join(f"Loading: {n:3d}%|#| {n}/100 [00:{n // 2:02d}<00:01, 9.99it/s]" for n in range(0, 41, 40))
    a.journal.queued = [LogLine(clock.t - 0.4, U, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0", "inv-1"),
                        *log_lines(bar, clock.t - 0.3, U, "inv-1")]  # its first redraw dated 20 s back
    a.tick()
    clock.t += 1
    a.journal.queued = [LogLine(clock.t - 0.5, U, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:09 [gpu_model_runner.py:2602] "
                                                  "Starting to load model Qwen/Qwen3-8B...", "inv-1")]
    state = view(a.tick()).state
    assert (state.phase, state.failures, state.previous) == (Phase.DOWNLOADING, {}, None)


def test_a_full_disk_neither_freezes_the_agent_nor_loses_a_start(small_disk, caplog) -> None:
    a, clock, history = recording(small_disk / "history.db")
    a.journal.ready_units = frozenset({U})
    a.processes.pids = frozenset()
    a.tick()
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # the disk fills up
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    for n in range(5):  # five starts end while nothing can be written, more than the two a unit's state keeps
        a.journal.queued = [LogLine(clock.t + 1, U, "vLLM API server version 0.11.0", f"inv-{n}"),
                            LogLine(clock.t + 2, U, OOM_LINE, f"inv-{n}")]
        clock.t += 10
        snapshot = a.tick()
    a.journal.queued = [LogLine(clock.t + 1, U, "vLLM API server version 0.11.0", "inv-5"),
                        LogLine(clock.t + 5, U, "Application startup complete.", "inv-5")]
    clock.t += 10
    snapshot = a.tick()
    assert view(snapshot).state.phase is Phase.READY  # published, though nothing could be written
    assert snapshot.sources["history"].up is False
    [said] = [r.message for r in caplog.records if "cannot write" in r.message]
    assert re.search(rf"cannot write {small_disk}/history.db: database or disk is full \(\d+ KiB free there\)", said)
    filler.unlink()  # space again: every start not recorded before is recorded now
    clock.t += 10
    snapshot = a.tick()
    assert snapshot.sources["history"].up is True
    assert sorted((r.outcome, r.failure_reason) for r in history.recent(U)) == [
        *[("failed", "cuda_oom")] * 5, ("ready", None)]


# --- containers: discovered, named, folded and forgotten like units ------------------------------

POD = "llm/vllm-0/vllm"


class FakeContainers:
    """The host's containers, which the test changes; their lines, which it queues."""

    def __init__(self, present: dict[str, Container]) -> None:
        self.status = SourceStatus("containers", LOG, lambda: 0.0)
        self.status.ok()
        self.present = present
        self.followed: list[str] = []
        self.queued: list = []

    def containers(self) -> dict[str, Container]:
        return dict(self.present)

    def follow(self, units: Iterable[str]) -> None:
        self.followed = [u for u in units if u in self.present]

    def drain(self) -> list:
        out, self.queued = self.queued, []
        return out


class ContainerProcesses(FakeProcesses):
    """Processes in the containers' cgroups, as placed by their ids."""

    def __init__(self, cmdlines: dict[str, str]) -> None:
        super().__init__()
        self.by_id = cmdlines  # container id → its process's command line
        self.placed: dict[str, str] = {}

    def place(self, containers) -> None:
        self.placed = dict(containers)

    def list_units(self) -> dict[str, tuple[str, ...]]:
        return {}

    def cmdlines(self, unit: str) -> tuple[str, ...]:
        line = self.by_id.get(self.placed.get(unit, ""))
        return (line,) if line else ()

    def sample(self, units: Iterable[str], t: float) -> dict[str, ProcessSample]:
        return {u: ProcessSample(t, u, self.pids if self.by_id.get(self.placed.get(u, "")) else frozenset(), 0.0, 0, 0, 0)
                for u in units}


def container_agent(config: Config, present: dict[str, Container], cmdlines: dict[str, str]):
    clock = Clock()
    containers = FakeContainers(present)
    a = Agent(config, FakeJournal(lambda: clock.t + 1.7e9), ContainerProcesses(cmdlines), FakeGpu(), clock=clock, wall=lambda: clock.t + 1.7e9,
              containers=containers)
    a.journal.ready_units = frozenset({POD, "sidecar", "vllm"})
    return a, clock, containers


VLLM_CMD = "python3 -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B"


def test_a_model_server_container_is_discovered_placed_and_named() -> None:
    present = {POD: Container(POD, "a" * 64, "llm", "vllm-0", "vllm"), "redis": Container("redis", "b" * 64, name="redis")}
    a, clock, containers = container_agent(Config(interval=1.0), present, {"a" * 64: VLLM_CMD, "b" * 64: "redis-server *:6379"})
    containers.queued = [LogLine(clock.t, POD, "Starting to load model Qwen/Qwen3-8B...", "uid/vllm/0")]
    snapshot = a.tick()
    assert a.processes.placed == {POD: "a" * 64, "redis": "b" * 64}  # each container's cgroup, by its id
    assert [v.state.unit for v in snapshot.units] == [POD]  # redis is no model server
    assert containers.followed == [POD]
    [pod] = snapshot.units
    assert (pod.state.engine, pod.state.phase) == ("vllm", Phase.DOWNLOADING)
    assert pod.container == present[POD]


@pytest.mark.parametrize(
    ("include", "exclude", "followed"),
    [
        pytest.param(None, None, [POD, "vllm"], id="all by default"),
        pytest.param(r"llm/.*", None, [POD], id="a namespace"),
        pytest.param(None, r".*/vllm-0/.*", ["vllm"], id="not a pod"),
        pytest.param(r"vllm", None, ["vllm"], id="the whole name: a Docker container's"),
    ],
)
def test_containers_are_selected_by_their_unit(include, exclude, followed) -> None:
    present = {POD: Container(POD, "a" * 64, "llm", "vllm-0", "vllm"), "vllm": Container("vllm", "c" * 64, name="vllm")}
    config = Config(interval=1.0, container_include=include and re.compile(include),
                    container_exclude=exclude and re.compile(exclude))
    a, _, containers = container_agent(config, present, {"a" * 64: VLLM_CMD, "c" * 64: VLLM_CMD})
    assert [v.state.unit for v in a.tick().units] == followed
    assert containers.followed == followed


def test_a_removed_container_is_forgotten_once_its_start_is_over() -> None:
    present = {POD: Container(POD, "a" * 64, "llm", "vllm-0", "vllm")}
    a, clock, containers = container_agent(Config(interval=1.0), present, {"a" * 64: VLLM_CMD})
    containers.queued = [LogLine(clock.t, POD, "vLLM API server version 0.11.0", "uid/vllm/0")]
    a.tick()
    containers.present = {}  # the pod is deleted …
    clock.t += DISCOVER_EVERY
    assert [v.state.unit for v in a.tick().units] == [POD]  # … but its processes were last seen running
    a.processes.by_id = {}  # they are gone: the start ends
    clock.t += 1
    assert view(a.tick(), POD).state.attempt.ended is not None
    clock.t += DISCOVER_EVERY
    assert a.tick().units == ()




MiB = 2**20


def _silent_spin(config: Config, stacks_move: bool = False, readable: bool = True, rounds: int = 30):
    """A unit that prints one line, then only burns a core; the stack feed looks at it every round."""
    a, clock = agent(config)
    if not readable:
        a.stacks.frames = None
    a.journal.ready_units = frozenset({U})
    a.journal.queued = [LogLine(clock.t, U, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0")]
    a.tick()
    views = []
    for n in range(rounds):
        clock.t += 2
        a.processes.cpu += 2.0
        a.stacks.cpu += 2.0
        if stacks_move:
            a.stacks.frames = (Frame("step", "torch/_dynamo/symbolic_convert.py", 100 + n),)
        a.stacks.look(clock.t - 0.5)
        views.append(view(a.tick()))
    return a, views


STACKS_ON = replace(CONFIG, stacks=True)


@pytest.mark.parametrize(
    ("config", "stacks_move", "readable", "verdict", "why"),
    [
        pytest.param(STACKS_ON, False, True, Verdict.STALLED, "the Python stacks stay the same",
                     id="spinning, stacks unchanged: stalled"),
        pytest.param(STACKS_ON, True, True, Verdict.SILENT_PROGRESS, "", id="busy, stacks moving: silent work"),
        pytest.param(STACKS_ON, False, False, Verdict.UNKNOWN, "cannot be read",
                     id="spinning, stacks unreadable: unknown"),
        pytest.param(CONFIG, False, True, Verdict.UNKNOWN, "--collector.stacks",
                     id="spinning, stacks off: unknown, with the hint"),
    ],
)
def test_only_cpu_moving_is_judged_by_the_stacks(config, stacks_move, readable, verdict, why) -> None:
    _, views = _silent_spin(config, stacks_move, readable)
    assert (views[-1].verdict, why in views[-1].why) == (verdict, True), views[-1].why
    if verdict is not Verdict.STALLED:
        assert Verdict.STALLED not in [v.verdict for v in views]


def _stuck_frames(snapshot) -> list[tuple[str, str, str, float]]:
    families = {f.name: f for f in SnapshotCollector(lambda: snapshot).collect()}
    return [(s.labels["unit"], s.labels["function"], s.labels["file"], s.value)
            for s in families["llmstartup_unit_stuck_frame_info"].samples]


def test_silent_units_are_handed_to_the_stack_feed_and_located() -> None:
    a, views = _silent_spin(replace(CONFIG, stacks=True))
    assert a.stacks.targets == {U: frozenset({42})}
    stalled = views[-1]
    assert [(s.pids, s.frames[0].function) for s in stalled.stuck] == [((42,), "synchronize")]
    assert "stacks" in a.snapshot.sources
    assert _stuck_frames(a.snapshot) == [(U, "synchronize", "vllm/worker.py", 1.0)]
    assert "synchronize (vllm/worker.py:212)" in status_line(stalled, a.snapshot)
    # a line: the unit speaks again, so it is no longer looked at, nor shown as stuck
    a.journal.queued = [LogLine(a._clock(), U, "Graph capturing finished in 8 secs, took 0.52 GiB")]
    spoke = view(a.tick())
    assert (spoke.verdict, spoke.stuck, a.stacks.targets) == (Verdict.PROGRESSING, (), {})
    assert _stuck_frames(a.snapshot) == []


def test_a_silent_unit_that_is_not_stalled_has_no_stuck_frame_series() -> None:
    a, views = _silent_spin(CONFIG, readable=False)  # stacks off: unknown, located by the kernel alone
    assert views[-1].verdict is Verdict.UNKNOWN and views[-1].stuck
    assert _stuck_frames(a.snapshot) == []


def test_the_stacks_source_is_published_only_when_stacks_are_on() -> None:
    a, _ = agent(CONFIG)
    assert "stacks" not in a.tick().sources


def test_a_starts_command_lines_are_read_once_and_say_its_group() -> None:
    """A start over several hosts names its group on its command line; the agent reads it once per start, even
    from a rank that never prints a line."""
    processes = FakeProcesses("/opt/vllm/bin/vllm serve zai-org/GLM-5-FP8 --nnodes 2 --node-rank 1 "
                              "--master-addr 10.0.0.1 --master-port 29501 --headless")
    reads = []
    cmdlines = processes.cmdlines
    processes.cmdlines = lambda unit: reads.append(unit) or cmdlines(unit)  # type: ignore[method-assign]
    a, clock = agent(processes=processes)
    a.journal.ready_units = frozenset({U})
    for _ in range(3):
        snapshot = a.tick()
        clock.t += 1
    assert view(snapshot).state.attempt.group == Group("10.0.0.1:29501", 2, 1)
    assert reads == [U]
    processes.pids = frozenset()  # the start ends; the next one, under new processes, is read again
    for pids in (frozenset(), frozenset(), frozenset({(43, clock.t)})):
        processes.pids = pids
        a.tick()
        clock.t += 1
    assert reads == [U, U]
