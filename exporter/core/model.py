"""Value types every part shares: phases, verdicts, observations and per-unit state; no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType

from exporter.core.containers import Container

# typing.TYPE_CHECKING without importing typing, as type checkers allow (PEP 781): the reader child loads this
# module, and typing would be 0.4 MiB of its memory for one TypeVar that only a checker reads
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T", "UnitState", "Attempt")


class Phase(StrEnum):
    """Startup phases, in the order an attempt passes through them (docs/design.md)."""

    INACTIVE = "inactive"
    LAUNCHING = "launching"
    INITIALIZING_DISTRIBUTED = "initializing_distributed"
    DOWNLOADING = "downloading"
    LOADING_WEIGHTS = "loading_weights"
    COMPILING = "compiling"
    PROFILING = "profiling"
    ALLOCATING_KV_CACHE = "allocating_kv_cache"
    WARMING_UP = "warming_up"
    CAPTURING_GRAPHS = "capturing_graphs"
    STARTING_API = "starting_api"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


# Phases an attempt moves forward through; a marker never moves an attempt backwards, because
# the ranks of a tensor-parallel engine print the same markers out of step with each other.
STARTUP_ORDER: tuple[Phase, ...] = tuple(Phase)[: tuple(Phase).index(Phase.READY) + 1]
# Phases after which a start is no longer starting: nothing it prints moves it on.
SETTLED = frozenset({Phase.READY, Phase.FAILED, Phase.STOPPING})


class Verdict(StrEnum):
    INACTIVE = "inactive"
    PROGRESSING = "progressing"
    SILENT_PROGRESS = "silent_progress"
    STALLED = "stalled"
    READY = "ready"
    FAILED = "failed"
    UNKNOWN = "unknown"


class Signal(StrEnum):
    """Evidence that a unit is alive; each has its own last-movement time."""

    LOG = "log"
    CPU = "cpu"
    IO = "io"
    GPU_MEMORY = "gpu_memory"
    PROCESSES = "processes"
    MEMORY = "memory"
    STACK = "stack"


class Outcome(StrEnum):
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class Reason(StrEnum):
    """Why a startup failed: a bounded set, so it can be a label."""

    CUDA_OOM = "cuda_oom"
    HOST_OOM_KILLED = "host_oom_killed"
    NCCL = "nccl"
    GPU_XID = "gpu_xid"
    CUDA_ERROR = "cuda_error"
    ENGINE_INIT = "engine_init"
    BAD_CONFIG = "bad_config"
    PORT_IN_USE = "port_in_use"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    KILLED = "killed"
    EXITED = "exited"


# Reasons that only say *that* it died, and how much each says: a clean exit nothing; "init failed" that
# the engine gave up; a signal or a traceback how it died. Any other reason is a root cause, and says
# the most; a reason replaces an earlier one of the same attempt only when it says more.
REASON_DETAIL: Mapping[Reason, int] = MappingProxyType(
    {Reason.EXITED: 0, Reason.ENGINE_INIT: 1, Reason.CRASHED: 2, Reason.KILLED: 2}
)


class ProcessState(StrEnum):
    RUNNING = "running"
    SLEEPING = "sleeping"
    DISK_SLEEP = "disk_sleep"
    ZOMBIE = "zombie"
    STOPPED = "stopped"


class Event(StrEnum):
    """What PID 1 says about a unit (systemd's unit lifecycle messages)."""

    STARTED = "started"
    EXITED = "exited"  # Main process exited, code=…, status=…
    FAILED = "failed"  # Failed with result '…'
    RESTART_SCHEDULED = "restart_scheduled"
    STOPPING = "stopping"
    STOPPED = "stopped"
    OOM_KILLED = "oom_killed"
    SPAWN_FAILED = "spawn_failed"  # not PID 1's: its child, in the unit's cgroup, could not run the command


def frozen_map(d: Mapping | None = None) -> Mapping:  # type: ignore[type-arg]
    return MappingProxyType(dict(d or {}))


def evolve(state: T, **changes: object) -> T:
    """`dataclasses.replace` for the fold's two state classes, at a seventh of its cost: a copy of the
    instance's dict. The fold replaces a UnitState for every line a unit prints, and replace() runs
    __init__'s 25 frozen setattrs; neither class has an init-only field or a __post_init__ to skip."""
    if not changes.keys() <= _FIELDS[type(state)]:
        raise TypeError(f"{type(state).__name__} has no field {', '.join(changes.keys() - _FIELDS[type(state)])}")
    new = object.__new__(type(state))
    new.__dict__.update(state.__dict__, **changes)
    return new


# ---- observations: what the sources hand to the core, each stamped with CLOCK_MONOTONIC seconds ----


@dataclass(frozen=True, slots=True)
class LogLine:
    t: float
    unit: str
    text: str
    invocation: str = ""  # systemd's _SYSTEMD_INVOCATION_ID: one per start of the unit


@dataclass(frozen=True, slots=True)
class Lifecycle:
    t: float
    unit: str
    event: Event
    detail: str = ""  # e.g. "killed/9/KILL" for EXITED, "oom-kill" for FAILED
    invocation: str = ""


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """The unit's cgroup at one instant. An empty `ids` means no process is left."""

    t: float
    unit: str
    ids: frozenset[tuple[int, float]]  # (pid, start time): a pid alone can be reused
    cpu_seconds: float
    read_bytes: int
    written_bytes: int
    rss_bytes: int
    states: Mapping[ProcessState, int] = field(default_factory=frozen_map)
    started_at: float | None = None  # monotonic start of the oldest process


@dataclass(frozen=True, slots=True)
class Launched:
    """What the command lines of a start's processes say of the hosts it spans (exporter.core.groups reads
    them), once per start: a rank that never gets as far as its first line still names its group there."""

    t: float
    unit: str
    group: Group


@dataclass(frozen=True, slots=True)
class GpuSample:
    """GPU memory of the unit's processes per GPU index; None where NVML could not say."""

    t: float
    unit: str
    memory: Mapping[str, int | None]


@dataclass(frozen=True, slots=True)
class Fault:
    """A cause of failure seen outside the unit's own log, e.g. an Xid on a GPU the unit uses."""

    t: float
    unit: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class Resumed:
    """What an agent killed before this one had watched of a start: its process side, so that a
    restarted agent judges stillness across the gap instead of starting to watch from zero."""

    t: float  # the saved process sample's time
    unit: str
    invocation: str  # the start it watched, by systemd's invocation id when there is one
    attempt_started: float
    watched_since: float
    moved: Mapping[Signal, float]
    sample: ProcessSample


@dataclass(frozen=True, slots=True)
class Suppressed:
    """journald dropped this many of the unit's lines (its rate limit): hidden lines are lines too."""

    t: float
    unit: str
    count: int


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame, as py-spy reads it: `file` is the short path (`torch/distributed/distributed_c10d.py`)."""

    function: str
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread: int  # the OS thread id
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True, slots=True)
class ProcessStack:
    """Where one process of a unit is: what the kernel says of it, and its Python threads when they were read."""

    pid: int
    state: str  # the kernel's state letter (R, S, D, …) of its most telling thread: one in D if any, else the main one
    wchan: str  # the kernel function that thread waits in; "" when it runs, or the kernel would not say
    cpu_seconds: float  # its CPU time so far, threads and all: which processes burn CPU between two dumps
    threads: tuple[ThreadStack, ...] | None = None  # the busiest first; None when not read (native, off, failed)


@dataclass(frozen=True, slots=True)
class StackSample:
    """One look at where a silent unit's processes are (exporter.sources.stacks), the busiest first."""

    t: float
    unit: str
    processes: tuple[ProcessStack, ...]


Observation = LogLine | Lifecycle | ProcessSample | GpuSample | Fault | Resumed | Suppressed | StackSample | Launched


@dataclass(frozen=True, slots=True)
class XidError:
    """The driver's report of a GPU error (kernel `NVRM: Xid` line or NVML event); not a unit's."""

    t: float
    gpu: str  # GPU index, or the PCI bus id when no NVML device matches it
    xid: int
    source: str  # "kernel" or "nvml"


@dataclass(frozen=True, slots=True)
class Gpu:
    index: str
    uuid: str
    name: str
    bus_id: str = ""
    utilization: float | None = None  # recorded, never progress: a hung NCCL collective spins at 100%


# ---- state ----


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts, as Prometheus wants them; immutable so the fold can carry it."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int = 0
    total: float = 0.0

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Histogram:
        return cls(bounds, (0,) * len(bounds))

    def observe(self, value: float) -> Histogram:
        counts = tuple(c + (value <= b) for c, b in zip(self.counts, self.bounds))
        return Histogram(self.bounds, counts, self.count + 1, self.total + value)


@dataclass(frozen=True, slots=True)
class Group:
    """A start that spans hosts, as this host's part of it says (exporter.core.groups): where its hosts meet,
    how many there are and which one this is. Every field is None until a command line or a line says it."""

    address: str | None = None  # where the hosts meet, host[:port], spelled as every host's command line or line spells it
    nnodes: int | None = None  # how many hosts the start spans
    node_rank: int | None = None  # which of them this one is, from 0
    world_size: int | None = None  # ranks in all, said beside local_world_size (vLLM's DP group leader)
    local_world_size: int | None = None  # ranks on this host

    @property
    def hosts(self) -> int | None:
        """How many hosts the start spans: as said, else its ranks over this host's."""
        if self.nnodes is not None:
            return self.nnodes
        if self.world_size and self.local_world_size and self.world_size % self.local_world_size == 0:
            return self.world_size // self.local_world_size
        return None

    @property
    def spans_hosts(self) -> bool:
        """Whether this is one host's part of a start on several: its meeting place known, and more than one host."""
        return self.address is not None and (self.hosts or 0) > 1

    def filled(self, more: Group) -> Group:
        """This group with the fields it lacks taken from `more`: what was said first stays."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        return Group(**{name: getattr(more, name) if value is None else value for name, value in mine.items()})


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress bar of a phase as the engine reported it (exporter.core.progress folds the reports):
    how far it is, since when it is counted, and how steadily it has moved."""

    phase: Phase
    item: str  # what it counts, singular ("shard", "file", "byte"); "" for a fraction
    total: float
    done: float
    at: float  # when `done` was reported
    remaining: float | None  # the engine's own estimate of the seconds left, at `at`
    first_at: float  # the bar's first report, and how much was done then
    first_done: float
    advanced: float  # when `done` last grew (the first report until it does)
    advances: int = 0
    longest_wait: float = 0.0  # the longest time from one advance (or the first report) to the next
    reports: int = 1

    @property
    def ratio(self) -> float:
        """How much of the bar is done, 0–1 (a bar can overshoot its total: tqdm's does)."""
        return min(1.0, self.done / self.total)


@dataclass(frozen=True)  # no slots: evolve() copies its __dict__
class Attempt:
    """One start of a unit, from its first process (or PID 1's Started) until ready, failure or stop."""

    started: float
    invocation: str = ""
    phase: Phase = Phase.LAUNCHING
    phase_since: float = 0.0
    reason: Reason | None = None  # root cause seen so far; the attempt fails with it
    # The attempt went on to a later phase after its cause was seen: the cause did not end it (a later
    # cause replaces it), and a log that ends here has not shown a failure.
    outlived: bool = False
    # The phase was set by a failure's report (a frame, a failure that names its step): a vaguer
    # failure after it (TGI's `Shard 0 failed to start`) does not move it.
    located: bool = False
    # The reason is a report's first line's (a traceback's header): the line that ends the report says the cause.
    reason_opened: bool = False
    ended: float | None = None
    outcome: Outcome | None = None
    ready_at: float | None = None
    settings: str = ""  # the engine's own account of its settings (args line), for the fingerprint
    compile_cache: str = ""  # "cold" or "warm", when the engine says whether torch.compile hit its cache
    spans: tuple[tuple[Phase, float], ...] = ()  # each phase entered, with when: the timeline
    gaps: tuple[tuple[float, float, Phase], ...] = ()  # silences past the threshold: (from, to, phase)
    progress: Progress | None = None  # the engine's last progress bar in this start, of whichever phase
    skips: frozenset[Phase] = frozenset()  # silent phases its launching lines say it goes without (eager mode)
    # The phase was entered from the engine's order and the start's silence, not from a line (a \r bar reaches
    # the journal only when it ends): the phase it left and since when, to go back to when a line says otherwise.
    inferred_from: tuple[Phase, float] | None = None
    group: Group | None = None  # the hosts this start spans, once a command line or a line says so

    def at(self, phase: Phase, t: float) -> Attempt:
        """This attempt in `phase` from `t` on, with its timeline extended."""
        same = phase is Phase.INACTIVE or (self.spans and self.spans[-1][0] is phase)
        spans = self.spans if same else (*self.spans, (phase, t))
        return evolve(self, phase=phase, phase_since=t, spans=spans)

    @property
    def settled_at(self) -> float | None:
        """When the start stopped being a start: it became ready, failed, or was asked to stop; None while
        it is still starting. The end of `startup_seconds`, of the landing page's bar and of a history row."""
        return next((t for phase, t in self.spans if phase in SETTLED), None)

    def startup_end(self, now: float) -> float:
        """Where the start ends for its duration: when it settled, else when its processes ended, else `now`."""
        return next(t for t in (self.settled_at, self.ended, now) if t is not None)

    @property
    def last_startup_phase(self) -> Phase | None:
        """The furthest startup phase the attempt reached (ready included); None before any."""
        return next((phase for phase, _ in reversed(self.spans) if phase in STARTUP_ORDER), None)

    def periods(self, now: float) -> list[tuple[Phase, float, float]]:
        """Each phase the attempt entered, from when to when. Ready and failed are instants; the last
        other phase runs until the attempt ended, or until `now` while it runs."""
        end = self.ended if self.ended is not None else now
        out = []
        for (phase, start), nxt in zip(self.spans, [*self.spans[1:], None]):
            stop = nxt[1] if nxt else (start if phase in (Phase.READY, Phase.FAILED) else end)
            out.append((phase, start, stop))
        return out


@dataclass(frozen=True)  # no slots: evolve() copies its __dict__
class UnitState:
    """Everything the core knows about one unit; a fold over its observations."""

    unit: str
    engine: str = ""
    info: Mapping[str, str] = field(default_factory=frozen_map)  # engine_version, model
    values: Mapping[str, float] = field(default_factory=frozen_map)  # engine-reported, base units
    attempt: Attempt | None = None
    previous: Attempt | None = None  # the start before this one, for its timeline
    last_log: float | None = None
    moved: Mapping[Signal, float] = field(default_factory=frozen_map)  # last time each signal moved
    watched_since: float | None = None  # first process sample: we cannot vouch for stillness before it
    last_process: ProcessSample | None = None
    last_gpu: GpuSample | None = None
    # cumulative tallies, rendered as counters and histograms
    startups: Mapping[Outcome, int] = field(default_factory=frozen_map)
    failures: Mapping[tuple[Phase, Reason], int] = field(default_factory=frozen_map)
    phase_durations: Mapping[Phase, Histogram] = field(default_factory=frozen_map)
    last_phase_durations: Mapping[Phase, float] = field(default_factory=frozen_map)
    startup_durations: Mapping[Outcome, Histogram] = field(default_factory=frozen_map)
    cpu_total: float = 0.0
    suppressed_total: int = 0  # lines journald's rate limit dropped
    read_total: int = 0
    written_total: int = 0
    # how fast things move now, for people: CPU cores in use, bytes read+written a second
    cpu_rate: float = 0.0
    io_rate: float = 0.0
    gpu_at_last_log: int | None = None  # GPU memory when the unit last spoke: what moved in silence
    rss_at_last_move: int | None = None  # resident memory when the memory signal last moved
    stacks: StackSample | None = None  # the last look at where its processes are
    stacks_compared: float | None = None  # the last dump that found every CPU-burning process's stacks twice

    @property
    def gpu_memory(self) -> int | None:
        """All the unit's GPU memory now, or None when unknown or not sampled."""
        if self.last_gpu is None or any(v is None for v in self.last_gpu.memory.values()):
            return None
        return sum(v for v in self.last_gpu.memory.values() if v is not None)

    @property
    def phase(self) -> Phase:
        return self.attempt.phase if self.attempt else Phase.INACTIVE


_FIELDS = {cls: frozenset(f.name for f in fields(cls)) for cls in (UnitState, Attempt)}


@dataclass(frozen=True, slots=True)
class Limits:
    silence: float = 60.0  # no log line for this long: the unit is silent
    stall: float = 300.0  # nothing moved for this long: the unit is stalled
    stale: float = 6.0  # a sample older than this is no evidence at all
    cpu_floor: float = 0.05  # CPU seconds per second (5% of a core) that count as work
    io_floor: int = 64 * 1024  # bytes read or written between samples that count as work
    gpu_floor: int = 64 * 1024 * 1024  # a GPU memory change that counts as movement
    memory_floor: int = 32 * 1024 * 1024  # a change of the unit's resident memory that counts as movement
    infer_after: float = 5.0  # silent this long after the phases a silent one follows: the start is in it
    gpu: bool = True  # whether GPU evidence is expected at all
    stacks: bool = False  # whether Python stacks are sampled (--collector.stacks)
    stack_every: float = 60.0  # how often a silent unit's processes are looked at

    @property
    def stack_fresh(self) -> float:
        """How old a look at a unit's processes may be and still be judged by: the next is due, and late."""
        return self.stack_every + self.stale


@dataclass(frozen=True, slots=True)
class Span:
    """How long something took over a unit's recent starts."""

    typical: float  # the median
    longest: float
    samples: int


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the unit's own past says its start should take (exporter.core.expectations learns it)."""

    phases: Mapping[Phase, Span] = field(default_factory=frozen_map)
    startup: Span | None = None


@dataclass(frozen=True, slots=True)
class Stuck:
    """Processes of a silent unit that are in the same place: the same innermost Python frames of their
    busiest thread, or, where no stack was read, the same kernel state and wait."""

    pids: tuple[int, ...]
    frames: tuple[Frame, ...]  # innermost first; () when no stack was read
    state: str
    wchan: str


@dataclass(frozen=True, slots=True)
class UnitView:
    """A unit as published: its state, the verdict at the snapshot's time, and what its past expects."""

    state: UnitState
    verdict: Verdict
    expected: Expectation | None = None
    container: Container | None = None  # the unit is this container (its namespace, pod and name)
    why: str = ""  # what the verdict rests on, when it is stalled or unknown
    stuck: tuple[Stuck, ...] = ()  # where a silent unit's processes are, the busiest first


@dataclass(frozen=True, slots=True)
class SourceHealth:
    up: bool
    last_success: float | None = None  # wall-clock seconds
    why: str = ""  # why it is down


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a scrape renders: immutable, swapped in whole by the agent."""

    t: float  # monotonic time of the snapshot
    wall_offset: float  # wall = monotonic + wall_offset
    units: tuple[UnitView, ...] = ()
    sources: Mapping[str, SourceHealth] = field(default_factory=frozen_map)
    gpus: tuple[Gpu, ...] = ()
    xid_errors: Mapping[tuple[str, int], int] = field(default_factory=frozen_map)  # (gpu, xid) → count
    stale_after: float = float("inf")  # evidence older than this (seconds) is not rendered
    stall_after: float = float("inf")  # --stall.threshold: a progress bar still this long has stopped
    journal_reader_restarts: int = 0
