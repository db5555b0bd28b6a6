"""9. Series per unit: what one unit costs a Prometheus, at rest and during a start, as the agent rendered it before
issue 27 (the reference: every histogram bucket, each phase's durations a histogram, the phase and the verdict whole
state sets) and as it renders it now (exporter/shell/collector.py: a histogram's buckets where its durations fell,
each phase's durations as a count and a sum, only the current phase and verdict). Pure CPU, no root, a second.

A unit here is the demo's real-format vLLM 0.11 start (exporter/shell/demo/vllm_startup.py, its lines as vLLM prints
them), folded by the core as the agent folds it, each start's pace drawn between 4x and 9x the demo's (five to nine
minutes a start, as a 70B model on a warm host takes), its processes sampled every 15 s (CPU, I/O, memory, a new
worker now and then) and its GPU memory growing. "A typical history" is ten such starts, all ready, and what the
history teaches of them (expected_phase_duration_seconds); tests/test_series.py pins the budget of that unit.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from bench.common import Row, demo_records, say
from exporter.core import expectations, grammar
from exporter.core.model import (
    STARTUP_ORDER,
    Expectation,
    Gpu,
    GpuSample,
    Limits,
    LogLine,
    Observation,
    Phase,
    ProcessSample,
    Snapshot,
    Span,
    UnitState,
    UnitView,
    Verdict,
    frozen_map,
)
from exporter.core.tracker import advance, judge
from exporter.shell import collector
from exporter.shell.exposition import Exposition

UNIT = "vllm.service"
WALL = 1_767_225_000.0
GiB = 2**30
HISTORY = 10  # starts behind a unit with a typical history (the history keeps the last 10: expectations.RECENT)
BUDGET = 80  # series of a ready unit with a typical history on one GPU (issue 27)
FLEET_HOSTS, UNITS_PER_HOST, GPUS_PER_HOST = 2000, 4, 8
LIMITS = Limits(gpu=True)


def starts(count: int, gpus: int, seed: int = 27) -> Iterator[list[Observation]]:
    """`count` starts of the unit, one after another, each its observations in time order."""
    rng, lines, t, pid = random.Random(seed), demo_records("4242", "4310"), 1000.0, 4000
    for _ in range(count):
        pace = rng.uniform(4.0, 9.0)
        end = t + lines[-1][0] * pace
        observations: list[Observation] = [LogLine(t + at * pace, UNIT, text) for at, text in lines]
        cpu, rss, workers = 0.0, 2 * GiB, 1
        for n, when in enumerate(_every(t, end + 60, 15.0)):
            workers += n % 7 == 3
            cpu, rss = cpu + 14.0, rss + (GiB // 2 if when < end else 0)
            ids = frozenset((pid + w, t) for w in range(workers))
            observations.append(ProcessSample(when, UNIT, ids, cpu, int(cpu * 2**27), 2**20, rss, started_at=t))
            memory = min(70 * GiB, int((when - t) / (end - t) * 70 * GiB)) if when < end else 70 * GiB
            observations.append(GpuSample(when, UNIT, frozen_map({str(g): memory for g in range(gpus)})))
        yield sorted(observations, key=lambda o: o.t)
        t, pid = end + 600.0, pid + 100
        yield [ProcessSample(t - 300.0, UNIT, frozenset(), cpu, int(cpu * 2**27), 2**20, 0)]  # stopped; then the next


def _every(start: float, stop: float, step: float) -> Iterator[float]:
    while start < stop:
        yield start
        start += step


@dataclass(frozen=True)
class Scenario:
    name: str
    snapshot: Snapshot


def unit_after(count: int, gpus: int, until: Phase | None = None, history: bool = True) -> Scenario:
    """The unit after `count` starts (the last one stopped at `until`, if given: during a start), with what its
    earlier starts teach when `history`."""
    vllm = grammar.load("vllm")
    state, finished = UnitState(UNIT, "vllm"), []
    batches = list(starts(count, gpus))
    last_start = len(batches) - 2
    for n, batch in enumerate(batches[: last_start + 1]):
        for obs in batch:
            if n == last_start and until is not None and state.phase is until:
                break
            before = state.attempt
            state = advance(state, obs, vllm, LIMITS)
            if before is not None and state.attempt is not before and state.attempt.started != before.started:
                finished.append(before)
    now = state.last_process.t if state.last_process else 0.0
    learned = _expectation(finished) if history and finished else None
    view = UnitView(state, judge(state, now, LIMITS), learned)
    devices = tuple(Gpu(str(g), f"GPU-{g:08x}", "NVIDIA H200") for g in range(gpus))
    label = f"{'during a start' if until else 'at rest, ready'}, {count - 1 if until else count} start(s) behind it, {gpus} GPU(s)"
    return Scenario(label, Snapshot(now, WALL, (view,), gpus=devices, stale_after=LIMITS.stale))


def _expectation(attempts: list) -> Expectation:  # type: ignore[type-arg]
    """What the history teaches of these starts: per phase the median and longest (exporter.core.expectations)."""
    per_phase: dict[Phase, list[float]] = {}
    for attempt in attempts[-HISTORY:]:
        for phase, took in expectations.phase_durations(attempt).items():
            per_phase.setdefault(Phase(phase), []).append(took)
    return Expectation(frozen_map({p: Span(statistics.median(v), max(v), len(v))
                                   for p, v in per_phase.items() if p in STARTUP_ORDER}))


def unit_series(snapshot: Snapshot, leaving_out: str = "\0") -> int:
    """The unit's series in the exposition: every sample line that names it (less the family `leaving_out`)."""
    text = Exposition(lambda: snapshot, process=False)().decode()
    return sum(1 for line in text.splitlines()
               if not line.startswith(("#", leaving_out)) and f'unit="{UNIT}"' in line)


@contextmanager
def as_rendered_before() -> Iterator[None]:
    """The reference: the unit as the agent rendered it before issue 27: each histogram with all its buckets, the
    phases' durations as histograms, and the phase and the verdict as whole state sets (a 0 for every other)."""
    state_sets = {
        "unit_phase": lambda view, _: (((p,), float(p is view.state.phase)) for p in Phase),
        "unit_verdict": lambda view, _: (((v,), float(v is view.verdict)) for v in Verdict),
    }

    def before(family: collector.Family) -> collector.Family:  # type: ignore[type-arg]
        if family.name in state_sets:
            return replace(family, read=collector.per_unit(state_sets[family.name]))
        return replace(family, type="histogram") if family.type == "summary" else family

    kept = collector._buckets, collector.LIVE, collector.HISTORY
    collector._buckets = lambda hist: [(repr(b), c) for b, c in zip(hist.bounds, hist.counts)] + [("+Inf", hist.count)]
    collector.LIVE, collector.HISTORY = tuple(map(before, collector.LIVE)), tuple(map(before, collector.HISTORY))
    try:
        yield
    finally:
        collector._buckets, collector.LIVE, collector.HISTORY = kept


def scenarios() -> list[Scenario]:
    return [
        unit_after(1, 1),
        unit_after(HISTORY, 1),
        unit_after(HISTORY, 8),
        unit_after(1, 1, until=Phase.COMPILING),
        unit_after(HISTORY + 1, 1, until=Phase.COMPILING),
        unit_after(HISTORY + 1, 8, until=Phase.COMPILING),
    ]


def measure(scenario: Scenario, count: Callable[[Snapshot], int] = unit_series) -> tuple[int, int]:
    """(series now, series as rendered before)."""
    ours = count(scenario.snapshot)
    with as_rendered_before():
        reference = count(scenario.snapshot)
    return ours, reference


def run() -> list[Row]:
    say("== 9. Series per unit (reference: as rendered before issue 27: every bucket, phase histograms, whole state sets) ==")
    rows = []
    for scenario in scenarios():
        ours, reference = measure(scenario)
        say(f"{scenario.name}: {ours} series, {reference} as rendered before ({ours / reference:.2f}x)")
        budget = "at rest, ready" in scenario.name and "10 start" in scenario.name and "1 GPU" in scenario.name
        rows.append(Row(f"series of one unit {scenario.name}", str(ours), str(reference), f"{ours / reference:.2f}x",
                        f"≤ {BUDGET}" if budget else "", ours <= BUDGET if budget else None))
    phases = unit_series(unit_after(HISTORY, 1).snapshot, "llmstartup_phase_duration_seconds")
    say(f"of which the phases' durations (count and sum): {measure(unit_after(HISTORY, 1))[0] - phases}")
    typical = unit_after(HISTORY, GPUS_PER_HOST)
    ours, reference = measure(typical)
    fleet = FLEET_HOSTS * UNITS_PER_HOST
    say(f"a fleet of {FLEET_HOSTS} hosts x {UNITS_PER_HOST} units on {GPUS_PER_HOST} GPUs at rest: "
        f"{fleet * ours / 1e6:.2f} M unit series, {fleet * reference / 1e6:.2f} M as rendered before")
    rows.append(Row(f"unit series of {FLEET_HOSTS} hosts x {UNITS_PER_HOST} units at rest", f"{fleet * ours / 1e6:.2f} M",
                    f"{fleet * reference / 1e6:.2f} M", f"{ours / reference:.2f}x", "", None))
    say()
    return rows
