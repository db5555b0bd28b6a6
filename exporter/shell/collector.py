"""Snapshot → Prometheus metric families, each defined once in `LIVE` or `HISTORY`: its name, type, help,
labels, what README.md's metrics table says of it, and how it is read from a snapshot (the live families)
or from the units' records (those of finished phases and starts). `tests/test_golden.py` renders the
README's table from these definitions and fails when the two differ. A new family is one entry.

Example of what it renders for one unit (abridged):

    llmstartup_unit_phase{phase="compiling",unit="vllm-glm5.service"} 1.0
    llmstartup_unit_verdict{unit="vllm-glm5.service",verdict="silent_progress"} 1.0
    llmstartup_last_progress_timestamp_seconds{signal="cpu",unit="vllm-glm5.service"} 1.79e+09
    llmstartup_phase_duration_seconds_count{phase="loading_weights",unit="vllm-glm5.service"} 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.core import progress as progresses
from exporter.core.grammar import VALUES
from exporter.core.model import (
    STARTUP_ORDER,
    Expectation,
    Histogram,
    Outcome,
    Phase,
    ProcessState,
    Reason,
    Signal,
    Snapshot,
    UnitState,
    UnitView,
    Verdict,
)
from exporter.core.stuck import frame_labels

NS = "llmstartup"
# The sources sample on their own cadence and a scrape renders their latest snapshot, so that a hung
# GPU cannot hang a scrape (docs/design.md); the HELP texts say so, as writing_exporters.md asks.
CACHED = " Sampled by the agent every --sample.interval, not at scrape time."
KINDS = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily,
         "summary": SummaryMetricFamily}

T = TypeVar("T")
Sample = tuple[Sequence[str], Any]  # label values and the value: a number, or a Histogram for a histogram or a summary


@dataclass(frozen=True, slots=True)
class Family(Generic[T]):
    """One metric family: what /metrics serves of it, and what the README says."""

    name: str  # after the prefix; a counter's ends in _total
    type: str  # gauge, counter, histogram or summary (a Histogram's count and sum without its buckets)
    labels: tuple[str, ...]
    help: str  # its HELP line
    doc: str  # the README's "what"
    read: Callable[[T], Iterable[Sample]]  # its series, from a Snapshot (LIVE) or the units' records (HISTORY)

    def render(self, source: T) -> Metric:
        family = KINDS[self.type](f"{NS}_{self.name}", self.help, labels=list(self.labels))
        for labels, value in self.read(source):
            if self.type == "summary":
                family.add_metric(list(labels), value.count, value.total)
            elif self.type == "histogram":
                family.add_metric(list(labels), _buckets(value), value.total)
            else:
                family.add_metric(list(labels), value)
        return family


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    """The histogram's buckets where its durations fell: each bucket the count rises at, the one below it, and
    +Inf; none of the runs of buckets where it stays the same. Per series, histogram_quantile reads the same
    quantiles from these as from all twenty (the bucket a rank falls in and the one below it are always kept),
    and a bucket once shown stays (counts only rise): a phase of ten like starts costs about 6 series, not 23
    (bench/series.py). Aggregate across units from per-unit quantiles: two units' histograms hold different buckets."""
    counts = (*hist.counts, hist.count)
    rises = [i for i, c in enumerate(counts) if c > (counts[i - 1] if i else 0)]
    kept = sorted({i for i in rises if i < len(hist.bounds)} | {i - 1 for i in rises if i})
    return [(repr(hist.bounds[i]), hist.counts[i]) for i in kept] + [("+Inf", hist.count)]


def _listed(values: Iterable[str]) -> str:
    return ", ".join(values)


# ---- the live families: a snapshot's, rendered once per snapshot ----


def per_unit(read: Callable[[UnitView, Snapshot], Iterable[Sample]]) -> Callable[[Snapshot], Iterator[Sample]]:
    """A family with a series (or several) per unit, its label values after the unit's."""

    def each(snap: Snapshot) -> Iterator[Sample]:
        for view in snap.units:
            for labels, value in read(view, snap):
                yield (view.state.unit, *labels), value

    return each


def _info(view: UnitView, _: Snapshot) -> Iterator[Sample]:
    state, where = view.state, view.container.labels if view.container else {}
    yield (state.engine, state.info.get("engine_version", ""), state.info.get("model", ""),
           where.get("namespace", ""), where.get("pod", ""), where.get("container", "")), 1


def _attempt_time(field: str) -> Callable[[UnitView, Snapshot], Iterator[Sample]]:
    """When the unit's current (or last) start reached a point: an Attempt field, None until it does."""

    def read(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
        if (attempt := view.state.attempt) and (t := getattr(attempt, field)) is not None:
            yield (), t + snap.wall_offset

    return read


def _last_log(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
    if view.state.last_log is not None:
        yield (), view.state.last_log + snap.wall_offset


def _moved(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
    for signal in Signal:
        if signal in view.state.moved:
            yield (signal,), view.state.moved[signal] + snap.wall_offset


def _processes(view: UnitView, _: Snapshot) -> Iterator[Sample]:
    sample = view.state.last_process
    for state in ProcessState:
        yield (state,), sample.states.get(state, 0) if sample else 0


def _gpu_memory(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
    gpu = view.state.last_gpu
    if gpu and snap.t - gpu.t <= snap.stale_after:  # stale: no series
        for index, used in sorted(gpu.memory.items()):
            if used is not None:  # unknown is no series, never a 0
                yield (index,), used


def _of(get: Callable[[UnitState], float]) -> Callable[[UnitView, Snapshot], Iterator[Sample]]:
    """One series per unit, of a number its state holds."""

    def read(view: UnitView, _: Snapshot) -> Iterator[Sample]:
        yield (), get(view.state)

    return read


def _value(name: str) -> Callable[[UnitView, Snapshot], Iterator[Sample]]:
    def read(view: UnitView, _: Snapshot) -> Iterator[Sample]:
        if name in view.state.values:
            yield (), view.state.values[name]

    return read


def _progress(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
    if (found := progresses.current(view.state.attempt)) is not None:
        yield (), found.ratio


def _progress_count(total: bool) -> Callable[[UnitView, Snapshot], Iterator[Sample]]:
    def read(view: UnitView, _: Snapshot) -> Iterator[Sample]:
        if (found := progresses.current(view.state.attempt)) is not None and found.item:
            yield (found.item,), found.total if total else found.done

    return read


def _phase_end(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
    if (found := progresses.current(view.state.attempt)) is not None and (end := progresses.phase_end(found)) is not None:
        yield (), end + snap.wall_offset


def _expected_ready(view: UnitView, snap: Snapshot) -> Iterator[Sample]:
    attempt = view.state.attempt
    if attempt and attempt.ended is None and (ready := progresses.ready_at(view.expected, attempt, snap.t)) is not None:
        yield (), ready + snap.wall_offset


def _group(view: UnitView, _: Snapshot) -> Iterator[Sample]:
    attempt = view.state.attempt
    if attempt and (group := attempt.group) and group.spans_hosts and (attempt.ended is None or attempt.phase is Phase.FAILED):
        yield (group.address, "" if group.node_rank is None else str(group.node_rank), str(group.hosts)), 1


def _stuck(view: UnitView, _: Snapshot) -> Iterator[Sample]:
    if view.verdict is Verdict.STALLED and (labels := frame_labels(view.stuck)):
        yield labels, 1


LIVE: tuple[Family[Snapshot], ...] = (
    Family("build_info", "gauge", ("version",),
           help="Version of the llmstartup exporter.",
           doc="always 1",
           read=lambda snap: [((__version__,), 1)]),
    Family("unit_info", "gauge", ("unit", "engine", "engine_version", "model", "namespace", "pod", "container"),
           help="The model server a unit runs; for a container, its namespace, pod and name.",
           doc="always 1; namespace, pod, container are a container's (empty for a systemd unit)",
           read=per_unit(_info)),
    # The phase and the verdict: only the current one's series, not a state set's 0 for every other. Every rule and
    # panel reads them as `== 1`, and Prometheus ends the last phase's series at the next scrape (a staleness
    # marker), so nothing reads differently; a unit costs 19 series fewer (issue 27's budget, bench/series.py).
    Family("unit_phase", "gauge", ("unit", "phase"),
           help="Startup phase of the unit: 1, for the current one only." + CACHED,
           doc="1, for the current phase only",
           read=per_unit(lambda view, _: [((view.state.phase,), 1.0)])),
    Family("unit_verdict", "gauge", ("unit", "verdict"),
           help="Is the unit progressing, silently progressing, stalled…: 1, for the current one only." + CACHED,
           doc="1, for the current verdict only",
           read=per_unit(lambda view, _: [((view.verdict,), 1.0)])),
    Family("startup_start_timestamp_seconds", "gauge", ("unit",),
           help="When the unit's current or last start began.",
           doc="when the current or last start began",
           read=per_unit(_attempt_time("started"))),
    Family("phase_start_timestamp_seconds", "gauge", ("unit",),
           help="When the unit entered its current phase.",
           doc="when the current phase began",
           read=per_unit(_attempt_time("phase_since"))),
    Family("ready_timestamp_seconds", "gauge", ("unit",),
           help="When the unit's current start became ready.",
           doc="when the current start became ready",
           read=per_unit(_attempt_time("ready_at"))),
    Family("last_log_timestamp_seconds", "gauge", ("unit",),
           help="When the unit last wrote a journal line.",
           doc="the unit's last journal line",
           read=per_unit(_last_log)),
    Family("last_progress_timestamp_seconds", "gauge", ("unit", "signal"),
           help="When each liveness signal of the unit last moved past its floor.",
           doc=f"when each signal last moved: {_listed(Signal)}",
           read=per_unit(_moved)),
    Family("process_cpu_seconds_total", "counter", ("unit",),
           help="CPU time of the unit's processes, exited children included." + CACHED,
           doc="CPU of the unit's processes, exited children included",
           read=per_unit(_of(lambda state: state.cpu_total))),
    Family("journal_suppressed_lines_total", "counter", ("unit",),
           help="Lines of the unit that journald's rate limit dropped (its 'Suppressed N messages' notices).",
           doc="lines journald's rate limit dropped (its \"Suppressed N messages from UNIT\" notices, trusted only "
           "from journald itself); they count as log movement",
           read=per_unit(_of(lambda state: state.suppressed_total))),
    Family("process_read_bytes_total", "counter", ("unit",),
           help="Bytes the unit's processes read (rchar: disk, pipes and network)." + CACHED,
           doc="rchar: what the unit's processes read (disk, pipes, network)",
           read=per_unit(_of(lambda state: state.read_total))),
    Family("process_written_bytes_total", "counter", ("unit",),
           help="Bytes the unit's processes wrote (wchar)." + CACHED,
           doc="wchar: what they wrote",
           read=per_unit(_of(lambda state: state.written_total))),
    Family("process_resident_memory_bytes", "gauge", ("unit",),
           help="Resident memory of the unit's processes, summed." + CACHED,
           doc="RSS, summed",
           read=per_unit(_of(lambda state: state.last_process.rss_bytes if state.last_process else 0))),
    Family("processes", "gauge", ("unit", "state"),
           help="The unit's processes by state." + CACHED,
           doc=_listed(ProcessState),
           read=per_unit(_processes)),
    Family("gpu_memory_used_bytes", "gauge", ("unit", "gpu"),
           help="GPU memory the unit's processes use on each GPU." + CACHED,
           doc="GPU memory of the unit's processes; no series when NVML cannot say",
           read=per_unit(_gpu_memory)),
    *(Family(name, "gauge", ("unit",), help=text, doc="as the engine reports them", read=per_unit(_value(name)))
      for name, text in VALUES.items()),
    Family("phase_progress_ratio", "gauge", ("unit",),
           help="How far the current phase is (0-1) by the engine's own progress reports; no series while it "
           "reports none.",
           doc="how far the current phase is (0–1) by the engine's own progress reports; no series while it "
           "reports none",
           read=per_unit(_progress)),
    Family("phase_progress_done", "gauge", ("unit", "item"),
           help="How many of what the engine counts in the current phase are done (shards, files, bytes).",
           doc="what the engine counts in that phase, done (`item`: shard, file, byte, …), where it counts",
           read=per_unit(_progress_count(total=False))),
    Family("phase_progress_target", "gauge", ("unit", "item"),
           help="How many of what the engine counts in the current phase there are in all.",
           doc="the same, in all",
           read=per_unit(_progress_count(total=True))),
    Family("phase_expected_end_timestamp_seconds", "gauge", ("unit",),
           help="When the current phase should end, by the rate of its progress reports (the engine's own "
           "estimate when it gives one).",
           doc="when the current phase should end by its progress (the engine's own estimate when it gives one)",
           read=per_unit(_phase_end)),
    Family("startup_expected_ready_timestamp_seconds", "gauge", ("unit",),
           help="When the current start should be ready: the phase's expected end plus the typical durations of "
           "the phases ahead (history).",
           doc="when the start should be ready, from that and the unit's history",
           read=per_unit(_expected_ready)),
    Family("unit_group_info", "gauge", ("unit", "group", "node_rank", "nnodes"),
           help="The start that spans hosts the unit is one host's part of: its group (where the hosts meet, the "
           "same on each), this host's node rank and how many hosts; no series for a start on one host.",
           doc="1 while the unit's start is one host's part of a start over several (its command line's or its "
           "lines' `--nnodes`, `--node-rank`, rendezvous address): `group` is where the hosts meet, the same on "
           "every host; no series for a start on one host",
           read=per_unit(_group)),
    Family("unit_stuck_frame_info", "gauge", ("unit", "function", "file"),
           help="Where a stalled unit is stuck: the innermost Python frame of its busiest process, or its kernel "
           "wait (file [kernel]); no series while it is not stalled.",
           doc="1 while the unit is stalled: the innermost Python frame of its busiest process (`file` relative "
           "to its package, e.g. `torch/distributed/distributed_c10d.py`), or its kernel wait channel with "
           "`file=\"[kernel]\"`; at most one series per unit, none when unknown",
           read=per_unit(_stuck)),
    Family("gpu_info", "gauge", ("gpu", "uuid", "name"),
           help="A GPU the agent sees, by index, with its UUID and name.",
           doc="always 1",
           read=lambda snap: [((gpu.index, gpu.uuid, gpu.name), 1) for gpu in snap.gpus]),
    Family("gpu_utilization_ratio", "gauge", ("gpu",),
           help="GPU busy time (0–1); recorded, never counted as progress." + CACHED,
           doc="GPU busy time, 0–1; recorded, never counted as progress",
           read=lambda snap: [((gpu.index,), gpu.utilization) for gpu in snap.gpus if gpu.utilization is not None]),
    Family("gpu_xid_errors_total", "counter", ("gpu", "xid"),
           help="Xid errors the driver reported, by GPU and Xid, since the agent started.",
           doc="Xid errors since the agent started, from the kernel's `NVRM: Xid` lines and NVML's events, each "
           "event counted once",
           read=lambda snap: [((gpu, str(xid)), n) for (gpu, xid), n in sorted(snap.xid_errors.items())]),
    Family("source_up", "gauge", ("source",),
           help="Whether the source's last attempt worked.",
           doc="journal, processes, gpu, containers, history (serve's writes), stacks (with `--collector.stacks`); "
           "a source stuck in a call counts as down once its last success is stale",
           read=lambda snap: [((source,), float(health.up)) for source, health in sorted(snap.sources.items())]),
    Family("source_last_success_timestamp_seconds", "gauge", ("source",),
           help="When the source last worked.",
           doc="when it last worked",
           read=lambda snap: [((source,), health.last_success) for source, health in sorted(snap.sources.items())
                              if health.last_success is not None]),
    Family("journal_reader_restarts_total", "counter", (),
           help="Times the journal reader process died (e.g. SIGBUS on a truncated journal file) and was restarted.",
           doc="times the journal reader process died (e.g. SIGBUS) and was restarted",
           read=lambda snap: [((), snap.journal_reader_restarts)]),
)


@dataclass(frozen=True, slots=True)
class UnitRecord:
    """A unit's finished phases and starts, and what its past expects: all that HistoryCollector renders
    of it, so that equal records render the same lines. They change only when a phase or a start ends."""

    unit: str
    startups: Mapping[Outcome, int]
    failures: Mapping[tuple[Phase, Reason], int]
    phase_durations: Mapping[Phase, Histogram]
    last_phase_durations: Mapping[Phase, float]
    startup_durations: Mapping[Outcome, Histogram]
    expected: Expectation | None


def unit_records(snap: Snapshot) -> tuple[UnitRecord, ...]:
    return tuple(UnitRecord(v.state.unit, v.state.startups, v.state.failures, v.state.phase_durations,
                            v.state.last_phase_durations, v.state.startup_durations, v.expected) for v in snap.units)


# ---- the families of finished phases and starts: rendered again only when one ends ----


def per_record(read: Callable[[UnitRecord], Iterable[Sample]]) -> Callable[[Sequence[UnitRecord]], Iterator[Sample]]:
    def each(records: Sequence[UnitRecord]) -> Iterator[Sample]:
        for record in records:
            for labels, value in read(record):
                yield (record.unit, *labels), value

    return each


HISTORY: tuple[Family[Sequence[UnitRecord]], ...] = (
    Family("startups_total", "counter", ("unit", "outcome"),
           help="Starts of the unit by how they ended.",
           doc=_listed(Outcome),
           read=per_record(lambda record: (((o,), record.startups.get(o, 0)) for o in Outcome))),
    Family("failures_total", "counter", ("unit", "phase", "reason"),
           help="Failures of the unit by the phase they happened in and why.",
           doc=_listed(Reason),
           read=per_record(lambda record: (((phase, reason), n) for (phase, reason), n in sorted(record.failures.items())))),
    Family("phase_duration_seconds", "summary", ("unit", "phase"),
           help="How long each startup phase took, once per start: their count and sum.",
           doc="each phase once per start (count and sum; the whole start's histogram has the buckets)",
           read=per_record(lambda record: (((p,), record.phase_durations[p]) for p in STARTUP_ORDER
                                           if record.phase_durations.get(p)))),
    Family("startup_duration_seconds", "histogram", ("unit", "outcome"),
           help="How long starts took, to ready, failure or stop.",
           doc="each start once",
           read=per_record(lambda record: (((o,), hist) for o, hist in sorted(record.startup_durations.items())))),
    Family("last_phase_duration_seconds", "gauge", ("unit", "phase"),
           help="How long each phase took the last time the unit passed through it.",
           doc="the last time through each phase",
           read=per_record(lambda record: (((p,), record.last_phase_durations[p]) for p in STARTUP_ORDER
                                           if p in record.last_phase_durations))),
    Family("expected_phase_duration_seconds", "gauge", ("unit", "phase"),
           help="How long each phase typically takes this unit (the median of its recent ready starts with the same "
           "settings).",
           doc="the typical duration from the unit's history",
           read=per_record(lambda record: (((p,), span.typical) for p, span in record.expected.phases.items())
                           if record.expected else ())),
)
FAMILIES: tuple[Family[Any], ...] = LIVE + HISTORY


class SnapshotCollector(Collector):
    """The families that change every sample interval: phases, verdicts, signals, samples, sources."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        return (family.render(snap) for family in LIVE)


class HistoryCollector(Collector):
    """The families of finished phases and starts (their histograms and counters: a large part of the exposition,
    which changes only when a phase or a start ends), from the units' records alone."""

    def __init__(self, records: Callable[[], Sequence[UnitRecord]]) -> None:
        self._records = records

    def collect(self) -> Iterator[Metric]:
        records = self._records()
        return (family.render(records) for family in HISTORY)
