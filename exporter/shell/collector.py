"""Snapshot → Prometheus metric families: the live ones, and those of finished phases and starts.

Example of what it renders for one unit (abridged):

    llmstartup_unit_phase{phase="compiling",unit="vllm-glm5.service"} 1.0
    llmstartup_unit_verdict{unit="vllm-glm5.service",verdict="silent_progress"} 1.0
    llmstartup_last_progress_timestamp_seconds{signal="cpu",unit="vllm-glm5.service"} 1.79e+09
    llmstartup_phase_duration_seconds_bucket{le="600.0",phase="loading_weights",unit="vllm-glm5.service"} 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
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
    Verdict,
)
from exporter.core.stuck import frame_labels

NS = "llmstartup"
# The sources sample on their own cadence and a scrape renders their latest snapshot, so that a hung
# GPU cannot hang a scrape (docs/design.md); the HELP texts say so, as writing_exporters.md asks.
CACHED = " Sampled by the agent every --sample.interval, not at scrape time."


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{NS}_{name}", doc, labels=labels)


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    return [(repr(b), c) for b, c in zip(hist.bounds, hist.counts)] + [("+Inf", hist.count)]


class SnapshotCollector(Collector):
    """The families that change every sample interval: phases, verdicts, signals, samples, sources."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        wall = snap.wall_offset

        build = _gauge("build_info", "Version of the llmstartup exporter.", ["version"])
        build.add_metric([__version__], 1)
        yield build

        info = _gauge(
            "unit_info", "The model server a unit runs; for a container, its namespace, pod and name.",
            ["unit", "engine", "engine_version", "model", "namespace", "pod", "container"],
        )
        phase = _gauge("unit_phase", "Startup phase of the unit: 1 for the current one." + CACHED, ["unit", "phase"])
        verdict = _gauge("unit_verdict", "Is the unit progressing, silently progressing, stalled…: 1 for the current one." + CACHED, ["unit", "verdict"])
        startup_start = _gauge("startup_start_timestamp_seconds", "When the unit's current or last start began.", ["unit"])
        phase_start = _gauge("phase_start_timestamp_seconds", "When the unit entered its current phase.", ["unit"])
        ready_at = _gauge("ready_timestamp_seconds", "When the unit's current start became ready.", ["unit"])
        last_log = _gauge("last_log_timestamp_seconds", "When the unit last wrote a journal line.", ["unit"])
        progress = _gauge("last_progress_timestamp_seconds", "When each liveness signal of the unit last moved past its floor.", ["unit", "signal"])
        cpu = CounterMetricFamily(f"{NS}_process_cpu_seconds_total", "CPU time of the unit's processes, exited children included." + CACHED, labels=["unit"])
        suppressed = CounterMetricFamily(f"{NS}_journal_suppressed_lines_total", "Lines of the unit that journald's rate limit dropped (its 'Suppressed N messages' notices).", labels=["unit"])
        read = CounterMetricFamily(f"{NS}_process_read_bytes_total", "Bytes the unit's processes read (rchar: disk, pipes and network)." + CACHED, labels=["unit"])
        written = CounterMetricFamily(f"{NS}_process_written_bytes_total", "Bytes the unit's processes wrote (wchar)." + CACHED, labels=["unit"])
        rss = _gauge("process_resident_memory_bytes", "Resident memory of the unit's processes, summed." + CACHED, ["unit"])
        processes = _gauge("processes", "The unit's processes by state." + CACHED, ["unit", "state"])
        gpu_memory = _gauge("gpu_memory_used_bytes", "GPU memory the unit's processes use on each GPU." + CACHED, ["unit", "gpu"])
        values = {name: _gauge(name, doc, ["unit"]) for name, doc in VALUES.items()}
        progress_ratio = _gauge("phase_progress_ratio", "How far the current phase is (0-1) by the engine's own progress reports; no series while it reports none.", ["unit"])
        progress_done = _gauge("phase_progress_done", "How many of what the engine counts in the current phase are done (shards, files, bytes).", ["unit", "item"])
        progress_target = _gauge("phase_progress_target", "How many of what the engine counts in the current phase there are in all.", ["unit", "item"])
        phase_end = _gauge("phase_expected_end_timestamp_seconds", "When the current phase should end, by the rate of its progress reports (the engine's own estimate when it gives one).", ["unit"])
        ready_expected = _gauge("startup_expected_ready_timestamp_seconds", "When the current start should be ready: the phase's expected end plus the typical durations of the phases ahead (history).", ["unit"])
        stuck_frame = _gauge("unit_stuck_frame_info", "Where a stalled unit is stuck: the innermost Python frame of "
                             "its busiest process, or its kernel wait (file [kernel]); no series while it is not stalled.",
                             ["unit", "function", "file"])

        for view in snap.units:
            state, unit = view.state, view.state.unit
            where = view.container.labels if view.container else {}
            info.add_metric(
                [unit, state.engine, state.info.get("engine_version", ""), state.info.get("model", ""),
                 where.get("namespace", ""), where.get("pod", ""), where.get("container", "")],
                1,
            )
            for p in Phase:
                phase.add_metric([unit, p], float(p is state.phase))
            for v in Verdict:
                verdict.add_metric([unit, v], float(v is view.verdict))
            if attempt := state.attempt:
                startup_start.add_metric([unit], attempt.started + wall)
                phase_start.add_metric([unit], attempt.phase_since + wall)
                if attempt.ready_at is not None:
                    ready_at.add_metric([unit], attempt.ready_at + wall)
            if state.last_log is not None:
                last_log.add_metric([unit], state.last_log + wall)
            for signal in Signal:
                if signal in state.moved:
                    progress.add_metric([unit, signal], state.moved[signal] + wall)
            cpu.add_metric([unit], state.cpu_total)
            suppressed.add_metric([unit], state.suppressed_total)
            read.add_metric([unit], state.read_total)
            written.add_metric([unit], state.written_total)
            sample = state.last_process
            rss.add_metric([unit], sample.rss_bytes if sample else 0)
            for s in ProcessState:
                processes.add_metric([unit, s], sample.states.get(s, 0) if sample else 0)
            if state.last_gpu and snap.t - state.last_gpu.t <= snap.stale_after:  # stale: no series
                for gpu, used in sorted(state.last_gpu.memory.items()):
                    if used is not None:  # unknown is no series, never a 0
                        gpu_memory.add_metric([unit, gpu], used)
            for name, value in state.values.items():
                values[name].add_metric([unit], value)
            if (found := progresses.current(state.attempt)) is not None:
                progress_ratio.add_metric([unit], found.ratio)
                if found.item:
                    progress_done.add_metric([unit, found.item], found.done)
                    progress_target.add_metric([unit, found.item], found.total)
                if (end := progresses.phase_end(found)) is not None:
                    phase_end.add_metric([unit], end + wall)
            if attempt and attempt.ended is None and (ready := progresses.ready_at(view.expected, attempt, snap.t)) is not None:
                ready_expected.add_metric([unit], ready + wall)
            if view.verdict is Verdict.STALLED and (labels := frame_labels(view.stuck)):
                stuck_frame.add_metric([unit, *labels], 1)

        yield from (info, phase, verdict, startup_start, phase_start, ready_at, last_log, progress)
        yield from (cpu, suppressed, read, written, rss, processes, gpu_memory, *values.values())
        yield from (progress_ratio, progress_done, progress_target, phase_end, ready_expected, stuck_frame)

        gpu_info = _gauge("gpu_info", "A GPU the agent sees, by index, with its UUID and name.", ["gpu", "uuid", "name"])
        utilization = _gauge("gpu_utilization_ratio", "GPU busy time (0–1); recorded, never counted as progress." + CACHED, ["gpu"])
        for gpu in snap.gpus:
            gpu_info.add_metric([gpu.index, gpu.uuid, gpu.name], 1)
            if gpu.utilization is not None:
                utilization.add_metric([gpu.index], gpu.utilization)
        xid = CounterMetricFamily(f"{NS}_gpu_xid_errors_total", "Xid errors the driver reported, by GPU and Xid, since the agent started.", labels=["gpu", "xid"])
        for (gpu_index, number), n in sorted(snap.xid_errors.items()):
            xid.add_metric([gpu_index, str(number)], n)
        yield from (gpu_info, utilization, xid)

        up = _gauge("source_up", "Whether the source's last attempt worked.", ["source"])
        success = _gauge("source_last_success_timestamp_seconds", "When the source last worked.", ["source"])
        for source, health in sorted(snap.sources.items()):
            up.add_metric([source], float(health.up))
            if health.last_success is not None:
                success.add_metric([source], health.last_success)
        restarts = CounterMetricFamily(
            f"{NS}_journal_reader_restarts_total",
            "Times the journal reader process died (e.g. SIGBUS on a truncated journal file) and was restarted.",
        )
        restarts.add_metric([], snap.journal_reader_restarts)
        yield from (up, success, restarts)


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


class HistoryCollector(Collector):
    """The families of finished phases and starts (a histogram is 21 lines per unit and phase: over half
    of the exposition), from the units' records alone."""

    def __init__(self, records: Callable[[], Sequence[UnitRecord]]) -> None:
        self._records = records

    def collect(self) -> Iterator[Metric]:
        startups = CounterMetricFamily(f"{NS}_startups_total", "Starts of the unit by how they ended.", labels=["unit", "outcome"])
        failures = CounterMetricFamily(f"{NS}_failures_total", "Failures of the unit by the phase they happened in and why.", labels=["unit", "phase", "reason"])
        phase_hist = HistogramMetricFamily(f"{NS}_phase_duration_seconds", "How long each startup phase took, once per start.", labels=["unit", "phase"])
        startup_hist = HistogramMetricFamily(f"{NS}_startup_duration_seconds", "How long starts took, to ready, failure or stop.", labels=["unit", "outcome"])
        last_phase = _gauge("last_phase_duration_seconds", "How long each phase took the last time the unit passed through it.", ["unit", "phase"])
        expected = _gauge("expected_phase_duration_seconds", "How long each phase typically takes this unit (the median of its recent ready starts with the same settings).", ["unit", "phase"])
        for record in self._records():
            unit = record.unit
            for outcome in Outcome:
                startups.add_metric([unit, outcome], record.startups.get(outcome, 0))
            for (failed_phase, reason), n in sorted(record.failures.items()):
                failures.add_metric([unit, failed_phase, reason], n)
            for p in STARTUP_ORDER:
                if hist := record.phase_durations.get(p):
                    phase_hist.add_metric([unit, p], _buckets(hist), hist.total)
                if p in record.last_phase_durations:
                    last_phase.add_metric([unit, p], record.last_phase_durations[p])
            for outcome, hist in sorted(record.startup_durations.items()):
                startup_hist.add_metric([unit, outcome], _buckets(hist), hist.total)
            if record.expected:
                for p, span in record.expected.phases.items():
                    expected.add_metric([unit, p], span.typical)
        yield from (startups, failures, phase_hist, startup_hist, last_phase, expected)
