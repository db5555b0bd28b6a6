"""How far a phase is by the engine's own progress reports, and when the phase and the start should end; pure.

An engine that counts its work (vLLM's and SGLang's shard bar, TGI's downloaded files, Ollama's load
fraction, a tqdm bar) says how far its phase is, and its rate says how much longer. Every estimate here
rests on at least two reports of one bar: no ETA is better than a made-up one. Times are monotonic
seconds, as in the fold; the shell adds the wall-clock offset when it renders them.
"""

from __future__ import annotations

from dataclasses import replace

from exporter.core.grammar import Report
from exporter.core.model import SETTLED, STARTUP_ORDER, Attempt, Expectation, Phase, Progress

# A bar has stopped when it has not advanced for the stall threshold, and for this many times the longest
# it ever waited between two advances: a bar whose every shard takes minutes is slow, not stopped.
STEADY = 3.0


def report(before: Progress | None, phase: Phase, reading: Report, t: float) -> Progress:
    """The phase's progress after one more report. A report that does not continue the bar (another phase,
    another total or item, fewer done) starts a new bar: a draft model's shards after the target's, the
    next of several bars in one phase."""
    if (
        before is None
        or before.phase is not phase
        or before.item != reading.item
        or before.total != reading.total
        or reading.done < before.done
    ):
        return Progress(phase, reading.item, reading.total, reading.done, t, reading.remaining, t, reading.done, t)
    t = max(t, before.at)  # a \r bar's redraws are dated back, each no earlier than the one before
    if reading.done == before.done:
        return replace(before, at=t, remaining=reading.remaining, reports=before.reports + 1)
    return replace(
        before,
        done=reading.done,
        at=t,
        remaining=reading.remaining,
        reports=before.reports + 1,
        advanced=t,
        advances=before.advances + 1,
        longest_wait=max(before.longest_wait, t - before.advanced),
    )


def current(attempt: Attempt | None) -> Progress | None:
    """The progress of the phase the start is in now; None when that phase has reported none, or the start
    is over."""
    if attempt is None or attempt.ended is not None or attempt.phase in SETTLED:
        return None
    found = attempt.progress
    return found if found is not None and found.phase is attempt.phase else None


def phase_end(progress: Progress | None) -> float | None:
    """When the bar should be full: at its last report plus what the engine said was left, or else what is
    left at the rate since the bar's first report. None before two reports, once the bar is full (what
    follows it in the phase is not counted), and while it has not moved."""
    if progress is None or progress.reports < 2 or progress.done >= progress.total:
        return None
    if progress.remaining is not None:
        return progress.at + progress.remaining
    elapsed, done = progress.at - progress.first_at, progress.done - progress.first_done
    if elapsed <= 0 or done <= 0:
        return None
    return progress.at + (progress.total - progress.done) * elapsed / done


def ready_at(expectation: Expectation | None, attempt: Attempt, now: float) -> float | None:
    """When the start should be ready, from the unit's history: the current phase's end by its progress
    (or now, if that has passed) plus the typical duration of every phase still ahead; without progress,
    the typical start from its beginning. None without history, and once ready."""
    if expectation is None or expectation.startup is None or attempt.ready_at is not None:
        return None
    end = phase_end(current(attempt))
    if end is None:
        return attempt.started + expectation.startup.typical
    ahead = STARTUP_ORDER[STARTUP_ORDER.index(attempt.phase) + 1 : -1]
    return max(end, now) + sum(expectation.phases[p].typical for p in ahead if p in expectation.phases)


def stopped_for(progress: Progress | None, now: float, stall: float) -> float | None:
    """How long a bar that used to advance steadily has not advanced, once that counts as stopped: at
    least twice advanced, then nothing for the stall threshold and for STEADY times its longest wait so
    far. None while it moves, or never moved steadily."""
    if progress is None or progress.advances < 2 or progress.done >= progress.total:
        return None
    waited = now - progress.advanced
    return waited if waited >= stall and waited >= STEADY * progress.longest_wait else None
