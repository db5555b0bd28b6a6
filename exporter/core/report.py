"""What an operator reads about a unit: a status line, a JSON document, a timeline; pure."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from exporter.core import expectations, progress
from exporter.core.model import Attempt, Group, Outcome, Phase, Progress, Snapshot, Stuck, UnitState, UnitView
from exporter.core.stuck import waiting_for

if TYPE_CHECKING:  # the agent serves its reports without loading replay and the log formats it reads
    from exporter.core.replay import Replayed

GiB = 2**30


def duration(seconds: float | None) -> str:
    """`2h05m`, `2m10s`, `12.3s`: short and readable, for people."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def signals(state: UnitState) -> dict[str, Any]:
    """How fast each liveness signal moves now."""
    sample = state.last_process
    gpu = state.gpu_memory
    change = None if gpu is None or state.gpu_at_last_log is None else gpu - state.gpu_at_last_log
    return {
        "cpu_cores": round(state.cpu_rate, 2),
        "io_bytes_per_second": round(state.io_rate),
        "gpu_memory_bytes": gpu,
        "gpu_memory_change_since_last_log_bytes": change,
        "processes": len(sample.ids) if sample else 0,
        "resident_memory_bytes": sample.rss_bytes if sample else 0,
    }


def bar(found: Progress) -> str:
    """`61/163 shards (37%)`, `2.0 GiB of 4.4 GiB (47%)`, or `52%` for a fraction."""
    share = f"{found.ratio:.0%}"
    if found.item == "byte":
        return f"{size(found.done)} of {size(found.total)} ({share})"
    if found.item:
        plural = found.item + ("es" if found.item.endswith(("s", "x", "ch", "sh")) else "s")
        return f"{found.done:.0f}/{found.total:.0f} {plural} ({share})"
    return share


def progress_text(found: Progress, now: float, stall: float) -> str:
    """The current phase's bar, and how much longer it says, or that it stopped:
    `61/163 shards (37%), ~3m33s left` or `61/163 shards (37%), no new shard for 6m00s`."""
    text = bar(found)
    end = progress.phase_end(found)
    if (stopped := progress.stopped_for(found, now, stall)) is not None:
        return f"{text}, no new {found.item or 'progress'} for {duration(stopped)}"
    if end is not None:
        return f"{text}, ~{duration(end - now)} left" if end >= now else f"{text}, due {duration(now - end)} ago"
    return text


def progress_document(found: Progress, now: float, wall: float, stall: float) -> dict[str, Any]:
    stopped = progress.stopped_for(found, now, stall)
    return {
        "item": found.item or None,
        "done": found.done,
        "total": found.total,
        "ratio": round(found.ratio, 4),
        "last_report": iso(found.at + wall),
        "last_advance": iso(found.advanced + wall),
        "stopped_seconds": _round(stopped),
    }


def unit_document(view: UnitView, snap: Snapshot) -> dict[str, Any]:
    """One unit as `status --format json` and `/api/v1/units` give it."""
    state, now, wall = view.state, snap.t, snap.wall_offset
    attempt = state.attempt
    live = attempt is not None and attempt.ended is None
    found = progress.current(attempt)
    phase_end = progress.phase_end(found)
    ready = progress.ready_at(view.expected, attempt, now) if attempt and live else None
    where = view.container.labels if view.container else {}
    return {
        "unit": state.unit,
        "engine": state.engine,
        "engine_version": state.info.get("engine_version"),
        "model": state.info.get("model"),
        # a container's: its pod's namespace and name (a Docker container has neither), and its own name
        "namespace": where.get("namespace") or None,
        "pod": where.get("pod") or None,
        "container": where.get("container") or None,
        "phase": str(state.phase),
        # the phase was told from the engine's order and the silence (a \r bar not in yet), not from a line
        "phase_inferred": attempt is not None and attempt.inferred_from is not None,
        "verdict": str(view.verdict),
        "phase_seconds": round(now - attempt.phase_since, 3) if attempt else None,
        "startup_seconds": round(attempt.startup_end(now) - attempt.started, 3) if attempt else None,
        "startup_start": iso(attempt.started + wall) if attempt else None,
        "last_log_age_seconds": round(now - state.last_log, 3) if state.last_log is not None else None,
        "failure_reason": str(attempt.reason) if attempt and attempt.reason and attempt.phase is Phase.FAILED else None,
        "expected_remaining_seconds": _round(expectations.remaining(view.expected, attempt, now)) if live else None,
        "slower_than_usual": expectations.slower_than_usual(view.expected, attempt, now) if live else False,
        "progress": progress_document(found, now, wall, snap.stall_after) if found else None,
        "phase_expected_end": iso(phase_end + wall) if phase_end is not None else None,
        "expected_ready": iso(ready + wall) if ready is not None else None,
        "signals": signals(state) if live else None,
        "verdict_reason": view.why or None,
        "stuck": [stuck_document(group) for group in view.stuck],
        # the start over several hosts this one is a part of: where they meet, how many, which one this is
        "group": group_document(attempt.group) if attempt and attempt.group and attempt.group.spans_hosts else None,
        "values": dict(state.values),
        "timeline": timeline(attempt, now, wall) if attempt else [],
        "previous_timeline": timeline(state.previous, now, wall) if state.previous else [],
    }


def group_document(group: Group) -> dict[str, Any]:
    return {"address": group.address, "nnodes": group.hosts, "node_rank": group.node_rank}


def stuck_document(group: Stuck) -> dict[str, Any]:
    return {
        "pids": list(group.pids),
        "frames": [{"function": f.function, "file": f.file, "line": f.line} for f in group.frames],
        "state": group.state,
        "wchan": group.wchan or None,
        "waiting_for": waiting_for(group.wchan) or None,
    }


def stuck_text(group: Stuck, frames: int = 1) -> str:
    """`synchronize (engine.py:212) in 8 processes`, or `D in folio_wait_bit_common (waiting for a page …)`."""
    kernel = group.state + (f" in {group.wchan}" if group.wchan else "")
    if meaning := waiting_for(group.wchan):
        kernel += f" (waiting for {meaning})"
    where = " < ".join(f"{f.function} ({f.file}:{f.line})" for f in group.frames[:frames])
    if not where:
        where = kernel
    elif group.state == "D":  # a Python frame that waits for storage: the kernel says so
        where += f", {kernel}"
    return where + (f" in {len(group.pids)} processes" if len(group.pids) > 1 else "")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def timeline(attempt: Attempt, now: float, wall: float | None) -> list[dict[str, Any]]:
    """Each phase of an attempt with its start and duration (the last one runs until now or the end).

    `wall` turns the attempt's times into wall-clock ones; None when the times are already wall clock.
    """
    offset = wall or 0.0
    return [
        {"phase": str(phase), "start": iso(start + offset), "duration_seconds": round(stop - start, 3)}
        for phase, start, stop in attempt.periods(now)
    ]


def gaps(attempt: Attempt, wall: float | None) -> list[dict[str, Any]]:
    offset = wall or 0.0
    return [
        {"start": iso(start + offset), "duration_seconds": round(stop - start, 3), "phase": str(phase)}
        for start, stop, phase in attempt.gaps
    ]


def status_line(view: UnitView, snap: Snapshot) -> str:
    """`vllm-glm5.service  compiling 2m10s  startup 8m03s  no log 1m05s  CPU 7.6 cores  GPU 51.0 GiB (+1.8 GiB)  silent_progress`"""
    state, now = view.state, snap.t
    parts = [state.unit]
    attempt = state.attempt
    if attempt is None:
        return f"{state.unit}  {state.phase}  {view.verdict}"
    parts.append(f"{state.phase}{' (inferred)' if attempt.inferred_from else ''} {duration(now - attempt.phase_since)}")
    if (found := progress.current(attempt)) is not None:
        parts.append(progress_text(found, now, snap.stall_after))
    if attempt.ready_at is not None:
        parts.append(f"ready after {duration(attempt.ready_at - attempt.started)}")
    elif attempt.ended is None:
        parts.append(f"startup {duration(now - attempt.started)}")
    if attempt.phase is Phase.FAILED and attempt.reason:
        parts.append(f"reason {attempt.reason}")
    if attempt.group and attempt.group.spans_hosts:
        node = "" if attempt.group.node_rank is None else f"node {attempt.group.node_rank} "
        parts.append(f"{node}of {attempt.group.hosts} hosts at {attempt.group.address}")
    if state.last_log is not None and attempt.ended is None and attempt.ready_at is None:
        parts.append(f"no log for {duration(now - state.last_log)}")
    if attempt.ended is None and (left := expectations.remaining(view.expected, attempt, now)) is not None:
        parts.append(f"expected ready in ~{duration(left)}")
    if attempt.ended is None and expectations.slower_than_usual(view.expected, attempt, now):
        span = view.expected.phases[attempt.phase] if view.expected else None
        parts.append(f"slower than usual (longest {attempt.phase} before: {duration(span.longest if span else None)})")
    if attempt.ended is None and attempt.phase is not Phase.READY:
        sig = signals(state)
        parts.append(f"CPU {sig['cpu_cores']:.1f} cores")
        if sig["io_bytes_per_second"]:
            parts.append(f"IO {size(sig['io_bytes_per_second'])}/s")
        if sig["gpu_memory_bytes"] is not None:
            change = sig["gpu_memory_change_since_last_log_bytes"]
            sign = "+" if change and change > 0 else ""
            parts.append(f"GPU {size(sig['gpu_memory_bytes'])}" + (f" ({sign}{size(change)})" if change else ""))
        if sig["processes"]:
            parts.append(f"RSS {size(sig['resident_memory_bytes'])}")
    line = "  ".join(parts) + f": {view.verdict}" + (f" ({view.why})" if view.why else "")
    if view.stuck:
        line += f"; at {stuck_text(view.stuck[0])}"
        if len(view.stuck) > 1:
            others = len(view.stuck) - 1
            line += f" (+{others} other place{'s' if others > 1 else ''})"
    return line


# ---- replay: a saved log's last start ----

# What a report rests on, from the most to the least: the engine's own rules read the last start's markers (and the
# one that placed it in its last phase); the shared vocabulary did; nothing did, and the log names the engine (a syslog identifier, a path, a process tag, the
# unit PID 1 runs), with at most PID 1's words on how the start went.
BASES = {"engine_rules": "{engine}'s own rules", "vocabulary": "shared phase words only (no rule of {engine}'s own)",
         "engine_name": "the engine's name only (no line shows how far the start got)"}


def replay_outcome(attempt: Attempt) -> str:
    """ready, failed, stopped, or incomplete when the log ends without a word of either.

    A log that ends on a failure (a traceback's exception, a CUDA OOM) has failed even though the
    process's exit is not in it: that is what people paste into an issue. A cause the start went on
    past (a later phase began after it) did not end it.
    """
    if attempt.phase is Phase.FAILED:  # also after ready: a server that could not bind its port
        return str(Outcome.FAILED)
    if attempt.outcome is not None:
        return str(attempt.outcome)
    return str(Outcome.FAILED) if attempt.reason is not None and not attempt.outlived else "incomplete"


def _ending(attempt: Attempt, end: float, timed: bool) -> dict[str, Any]:
    """How a start ended (or where the log leaves it), and how long it took."""
    said = replay_outcome(attempt)
    return {
        "outcome": said,
        "last_phase": str(attempt.last_startup_phase or attempt.phase),
        "failure_reason": str(attempt.reason) if attempt.reason and said == "failed" else None,
        "startup_seconds": round(attempt.startup_end(end) - attempt.started, 3) if timed else None,
    }


def replay_document(result: Replayed) -> dict[str, Any]:
    """What `replay --format json` says of a unit's last start (and the starts before it)."""
    state, attempt = result.state, result.state.attempt
    assert attempt is not None
    # a log that ends mid-start: its last phase lasted until the last line
    end = attempt.ended if attempt.ended is not None else max(state.last_log or 0.0, attempt.phase_since)
    phases = timeline(attempt, end, None)
    if not result.timed:
        for span in phases:
            span["start"] = span["duration_seconds"] = None
    return {
        "unit": result.unit,
        "engine": result.engine,
        "engine_version": state.info.get("engine_version"),
        "model": state.info.get("model"),
        **_ending(attempt, end, result.timed),
        "attempts": result.attempts,
        "from_start": result.from_start,
        "earlier_starts": [
            {"start": iso(a.started) if result.timed else None,
             **_ending(a, a.ended if a.ended is not None else a.phase_since, result.timed)}
            for a in result.earlier
        ],
        "basis": result.basis,
        "phases": phases,
        "values": dict(state.values),
        "silent_gaps": gaps(attempt, None) if result.timed else [],
    }


def _said(ending: dict[str, Any]) -> str:
    """`failed (bad_config) in allocating_kv_cache after 42s`, `ready after 3m10s`, `incomplete: the log ends in …`"""
    said = ending["outcome"]
    if ending["failure_reason"]:
        said += f" ({ending['failure_reason']}) in {ending['last_phase']}"
    elif said == "incomplete":
        said += f": the log ends in {ending['last_phase']}"
    return said + (f" after {duration(ending['startup_seconds'])}" if ending["startup_seconds"] is not None else "")


def replay_text(result: Replayed) -> Iterator[str]:
    """What `replay` prints of a unit's last start: a verdict, what it rests on, the starts before, the timeline."""
    doc = replay_document(result)
    about = ", ".join(x for x in (doc["engine"], doc["engine_version"], doc["model"]) if x)
    tries = f"  [start {doc['attempts']} of {doc['attempts']} in this log]" if doc["attempts"] > 1 else ""
    begins = "" if doc["from_start"] else "  [the log begins mid-start: a start already under way]"
    yield f"{doc['unit']} ({about}): {_said(doc)}{tries}{begins}"
    # the starts before the last: why each ended (a log of a restart loop says it here)
    first = doc["attempts"] - len(doc["earlier_starts"])
    for number, earlier in enumerate(doc["earlier_starts"], first):
        at = f" at {earlier['start'][11:19]}" if earlier["start"] else ""
        yield f"  start {number} of {doc['attempts']}{at}: {_said(earlier)}"
    yield f"  basis: {BASES[result.basis].format(engine=result.engine)}"
    for span in doc["phases"]:
        start = (span["start"] or "")[11:23]
        took = duration(span["duration_seconds"]) if span["duration_seconds"] is not None else ""
        yield f"  {start:12}  {span['phase']:<26}{took:>8}"
    for gap in doc["silent_gaps"]:
        yield f"  silent {duration(gap['duration_seconds'])} in {gap['phase']} from {gap['start'][11:19]}"
    if doc["values"]:
        shown = ", ".join(
            f"{k} {size(v) if k.endswith('_bytes') else f'{v:g}'}" for k, v in sorted(doc["values"].items())
        )
        yield f"  values: {shown}"
