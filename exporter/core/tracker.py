"""The pure core: fold observations into a unit's state (`advance`) and judge it at a time (`judge`).

Never reads a clock, logs, or touches the host: `serve`, `status`, `wait` and `replay` all feed it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

from exporter.core import grammar as grammars
from exporter.core import groups, progress
from exporter.core.grammar import Grammar
from exporter.core.model import (
    REASON_DETAIL,
    SETTLED,
    STARTUP_ORDER,
    Attempt,
    Event,
    Fault,
    GpuSample,
    Group,
    Histogram,
    Launched,
    Lifecycle,
    Limits,
    LogLine,
    Observation,
    Outcome,
    Phase,
    ProcessSample,
    Reason,
    Resumed,
    Signal,
    StackSample,
    Suppressed,
    UnitState,
    Verdict,
    evolve,
    frozen_map,
)

DURATION_BUCKETS = (1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 240, 300, 450, 600, 900, 1200, 1800, 2700, 3600)

K = TypeVar("K")


def _bump(tally: Mapping[K, int], key: K) -> Mapping[K, int]:
    return frozen_map({**tally, key: tally.get(key, 0) + 1})


def _observe(hists: Mapping[K, Histogram], key: K, value: float) -> Mapping[K, Histogram]:
    hist = hists.get(key) or Histogram.empty(tuple(float(b) for b in DURATION_BUCKETS))
    return frozen_map({**hists, key: hist.observe(value)})


def _moved(state: UnitState, signal: Signal, t: float) -> UnitState:
    return evolve(state, moved=frozen_map({**state.moved, signal: t}))


def _live(state: UnitState) -> Attempt | None:
    """The attempt whose processes may still run, if any."""
    return state.attempt if state.attempt and state.attempt.ended is None else None


# ---- attempts ----


def _begin(state: UnitState, t: float, invocation: str) -> UnitState:
    state = _end(state, t) if _live(state) else state
    attempt = Attempt(started=t, invocation=invocation).at(Phase.LAUNCHING, t)
    return evolve(state, attempt=attempt, previous=state.attempt, values=frozen_map())


def _enter(state: UnitState, phase: Phase, t: float, progress: bool = True) -> UnitState:
    """Move the live attempt forward to `phase`, observing how long the phase it leaves took.

    `progress`: the start went on to this phase, outliving the cause it had so far; not so for a
    phase read off a failure's own report (the frame it died in, the step a failure names)."""
    attempt = state.attempt
    assert attempt is not None
    t = max(t, attempt.phase_since)  # a back-dated \r bar cannot start before the phase it ends
    left, took = attempt.phase, t - attempt.phase_since
    if left in STARTUP_ORDER and left is not Phase.READY:
        state = evolve(
            state,
            phase_durations=_observe(state.phase_durations, left, took),
            last_phase_durations=frozen_map({**state.last_phase_durations, left: took}),
        )
    attempt = attempt.at(phase, t)
    if progress and attempt.reason is not None and not attempt.outlived:
        attempt = evolve(attempt, outlived=True)
    if phase is Phase.READY:  # causes seen on the way no longer explain a later exit
        state, attempt = _count_outcome(state, evolve(attempt, ready_at=t, reason=None), Outcome.READY, t)
    return evolve(state, attempt=attempt)


def _retract(attempt: Attempt) -> Attempt:
    """The attempt as it was before the agent inferred its phase: a line said otherwise, or it ended."""
    if attempt.inferred_from is None:
        return attempt
    phase, since = attempt.inferred_from
    return evolve(attempt, phase=phase, phase_since=since, spans=attempt.spans[:-1], inferred_from=None)


def _infer(state: UnitState, t: float, grammar: Grammar, limits: Limits) -> UnitState:
    """A start silent for a while after the phases a silent phase follows, its processes still there, is in it:
    entered, inferred, from when the silence began; the next line of the start confirms or retracts it."""
    live = _live(state)
    if (live is None or live.inferred_from is not None or not grammar.silent or state.last_log is None
            or t - state.last_log < limits.infer_after or not (state.last_process and state.last_process.ids)):
        return state
    silent = next((s for s in grammar.silent if live.phase in s.after and s.phase not in live.skips), None)
    if silent is None:
        return state
    since = max(state.last_log, live.phase_since)
    return evolve(state, attempt=evolve(live.at(silent.phase, since), inferred_from=(live.phase, live.phase_since)))


def _count_outcome(state: UnitState, attempt: Attempt, outcome: Outcome, t: float) -> tuple[UnitState, Attempt]:
    """How the start ended, counted once: startups_total and startup_duration_seconds."""
    state = evolve(
        state,
        startups=_bump(state.startups, outcome),
        startup_durations=_observe(state.startup_durations, outcome, t - attempt.started),
    )
    return state, evolve(attempt, outcome=outcome)


def _cause(attempt: Attempt, reason: Reason, opens: bool = False) -> Attempt:
    """Remember why the attempt is failing: the first root cause wins over any that says less about it
    (REASON_DETAIL), any cause over one the attempt has outlived, and the line that ends a report over the
    reason of the line that opened it. A report opened again before its end was named ended unnamed."""
    old = attempt.reason
    if (old is None or attempt.outlived or (attempt.reason_opened and not opens)
            or _detail(reason) > _detail(old)):
        return evolve(attempt, reason=reason, outlived=False, reason_opened=opens)
    return evolve(attempt, reason_opened=False) if attempt.reason_opened else attempt


def _fail(state: UnitState, t: float, reason: Reason) -> UnitState:
    attempt = state.attempt
    assert attempt is not None
    if attempt.phase in (Phase.FAILED, Phase.STOPPING):  # after a stop, what breaks is the stop's doing
        return state
    attempt = _retract(attempt)  # a failure is counted where the start's own lines put it, as replay does
    attempt = _cause(attempt, reason)
    assert attempt.reason is not None
    state = evolve(state, failures=_bump(state.failures, (attempt.phase, attempt.reason)))
    if attempt.outcome is None:
        state, attempt = _count_outcome(state, attempt, Outcome.FAILED, t)
    return evolve(state, attempt=attempt.at(Phase.FAILED, t))


def _stop(state: UnitState, t: float) -> UnitState:
    attempt = state.attempt
    assert attempt is not None
    attempt = _retract(attempt)
    if attempt.outcome is None:
        state, attempt = _count_outcome(state, attempt, Outcome.STOPPED, t)
    return evolve(state, attempt=attempt.at(Phase.STOPPING, t))


def _end(state: UnitState, t: float, reason: Reason | None = None) -> UnitState:
    """The attempt's processes are gone. Before ready and not asked to stop, that is a failure."""
    attempt = state.attempt
    assert attempt is not None
    state = evolve(state, attempt=(attempt := _retract(attempt)))
    cause = reason or attempt.reason
    if attempt.outcome is None or cause is not None:
        state = _fail(state, t, cause or Reason.EXITED)  # nothing, once failed or asked to stop
    attempt = state.attempt
    assert attempt is not None
    phase = Phase.FAILED if attempt.phase is Phase.FAILED else Phase.INACTIVE
    return evolve(state, attempt=evolve(attempt.at(phase, t), ended=t))


# ---- observations ----


def _line(state: UnitState, line: LogLine, grammar: Grammar, limits: Limits) -> UnitState:
    live = _live(state)
    found = grammars.match(grammar, line.text, settled=live is not None and live.phase in SETTLED)
    if found is None or not found.heartbeat:  # a heartbeat line says nothing about progress
        state = _silence_ends(state, line.t, limits)
        state = evolve(  # one copy: this runs for every line a unit prints
            state,
            last_log=line.t,
            gpu_at_last_log=state.gpu_memory,
            moved=frozen_map({**state.moved, Signal.LOG: line.t}),
        )
    attempt = state.attempt
    if attempt is None:
        state = _begin(state, line.t, line.invocation)
    elif attempt.ended is not None:
        late = attempt.invocation == line.invocation if line.invocation else line.t <= attempt.ended
        if late:  # the last words of an attempt we already saw end: nothing to start or judge
            return state
        state = _begin(state, line.t, line.invocation)
    elif line.invocation and attempt.invocation and line.invocation != attempt.invocation:
        state = _begin(state, line.t, line.invocation)  # systemd started the unit again
    elif found is not None and found.begins and (attempt.phase in SETTLED or _dying(attempt)):
        # the engine's first word again: it started again, and a start that was failing ended with its cause
        state = _begin(state, line.t, line.invocation)
    elif line.invocation and not attempt.invocation:
        state = evolve(state, attempt=evolve(attempt, invocation=line.invocation))

    live = _live(state)
    if live and not live.settings and grammar.settings and (said := grammars.settings(grammar, line.text)):
        state = evolve(state, attempt=(live := evolve(live, settings=said)))
    if found is None:
        return state
    if live and found.phase is Phase.LAUNCHING and grammar.silent and (skips := grammars.skipped(grammar, line.text)):
        state = evolve(state, attempt=(live := evolve(live, skips=live.skips | skips)))
    if live and live.inferred_from and (found.phase or found.reason or found.stops):
        # a line that says where the start is: the inferred phase was right (the bar, when it ends, dated back
        # to when it began: the phase began then) or it was not, and the start goes on from where its lines put it
        inferred = live.phase
        state = evolve(state, attempt=_retract(live))
        if found.phase is inferred:
            state = _enter(state, inferred, line.t)
    if found.cache and live and live.compile_cache != "cold":  # one miss makes the compile cold
        state = evolve(state, attempt=evolve(state.attempt, compile_cache=found.cache))
    if found.info or found.values:  # most markers carry neither: no copy of the state for them
        state = evolve(
            state,
            info=frozen_map({**state.info, **found.info}),
            values=frozen_map({**state.values, **found.values}),
        )
    if found.group and (live := _live(state)):  # what the command line said first stays (_launched)
        state = evolve(state, attempt=evolve(live, group=(live.group or Group()).filled(groups.read(found.group))))
    # The phase first: a failure marker that says where it happened (vLLM's KV-cache check, a
    # traceback's frame) moves the start there before the failure is remembered in it; a failure
    # marker's phase does not override one a failure's report already located.
    # The shared vocabulary's words after a cause prove no progress (a traceback's tail, a note pasted under it), nor
    # place a failure that says less than the cause already pending (a wrapper's `Error loading the model` after the
    # engine refused its arguments): the failure stays where the start was when it happened.
    attempt = state.attempt
    if (found.phase is not None and _forward(attempt.phase, found.phase) and not (found.reason and attempt.located)
            and not (found.shared and _dying(attempt) and (found.moves_on or _says_less(found.reason, attempt)))):
        state = _enter(state, found.phase, line.t, found.outlives)
        if attempt.located is found.moves_on:
            state = evolve(state, attempt=evolve(state.attempt, located=not found.moves_on))
    if found.reason is not None:
        if found.fatal:
            return _fail(state, line.t, found.reason)
        state = evolve(state, attempt=_cause(state.attempt, found.reason, found.opens))
    if found.retry and (live := _live(state)) and live.reason is not None and not live.outlived:
        state = evolve(state, attempt=evolve(live, outlived=True))  # it tries again: those causes did not end it
    if found.stops and (live := _live(state)) and live.phase is not Phase.FAILED:
        # A stop after a failure still pending only ends that failure; but a bare `crashed` is most often the
        # header of the stop's own traceback (Python prints `Traceback …` before its KeyboardInterrupt).
        own = live.reason is Reason.CRASHED
        cause = None if live.outlived or own else live.reason
        if live.phase not in SETTLED:
            state = _fail(state, line.t, cause) if cause else _stop(state, line.t)
        elif own:  # a server already ready (or stopping): nothing failed, and its exit will not say so
            state = evolve(state, attempt=evolve(live, reason=None))
    if found.progress is not None:
        state = _progress(state, found, line.t)
    return state


def _says_less(reason: Reason | None, attempt: Attempt) -> bool:
    """Whether a failure's reason says less of why the start died than the one it already has (REASON_DETAIL)."""
    assert attempt.reason is not None
    return reason is not None and _detail(reason) < _detail(attempt.reason)


def _detail(reason: Reason) -> int:
    """How much a reason says of why a start died: a root cause (3) over a crash, init failed, a bare exit."""
    return REASON_DETAIL.get(reason, 3)


def _dying(attempt: Attempt) -> bool:
    """The start has a cause it did not go on past: its engine's next first word is the next start (a log
    with neither systemd's lines nor processes: `docker logs` of a crash loop, a journal saved as text)."""
    return attempt.reason is not None and not attempt.outlived


def _progress(state: UnitState, found: grammars.Match, t: float) -> UnitState:
    """A progress record counts for the phase the start is in, when it is that phase's (a late rank's
    shard bar after the start moved on is not the current phase's progress)."""
    live = _live(state)
    if live is None or live.phase in SETTLED or (found.phase or live.phase) is not live.phase:
        return state
    assert found.progress is not None
    return evolve(state, attempt=evolve(live, progress=progress.report(live.progress, live.phase, found.progress, t)))


def _silence_ends(state: UnitState, t: float, limits: Limits) -> UnitState:
    """A line after a silence past the threshold: the silence goes into the attempt's timeline."""
    live, last = _live(state), state.last_log
    if live is None or last is None or last < live.started or t - last < limits.silence:
        return state
    return evolve(state, attempt=evolve(live, gaps=(*live.gaps, (last, t, live.phase))))


def _forward(current: Phase, new: Phase) -> bool:
    return (
        current in STARTUP_ORDER
        and new in STARTUP_ORDER
        and STARTUP_ORDER.index(new) > STARTUP_ORDER.index(current)
    )


# systemd's exit statuses (systemd.exec(5), "Process Exit Codes"), as PID 1 names them: "203/EXEC"
SYSTEMD_EXIT = re.compile(r"2(?:[0-3]\d|4[0-5])/[A-Z_]+")


# PID 1's words for how the main process ended ("code/status/name"), when no log line said why.
def _exit_reason(detail: str) -> Reason | None:
    code, _, status = detail.partition("/")
    if code == "exited":
        if status.startswith("0/"):
            return None
        # 200-245 are systemd's own: a step of setting up the command failed (203/EXEC, 217/USER…), before it ran
        return Reason.BAD_CONFIG if SYSTEMD_EXIT.fullmatch(status) else Reason.CRASHED
    if code == "killed":
        return Reason.KILLED if status.split("/")[0] in ("9", "15", "2") else Reason.CRASHED
    if not code:  # it ended, how nobody said (a pasted terminal's prompt came back)
        return Reason.EXITED
    return Reason.CRASHED  # dumped: a core dump


def _says_it_failed(event: Lifecycle) -> bool:
    if event.event is Event.EXITED:
        return _exit_reason(event.detail) is not None
    return event.event in (Event.FAILED, Event.OOM_KILLED, Event.SPAWN_FAILED)


FAILED_RESULTS: Mapping[str, Reason] = frozen_map(
    {"oom-kill": Reason.HOST_OOM_KILLED, "timeout": Reason.TIMEOUT, "signal": Reason.KILLED}
)


def _lifecycle(state: UnitState, event: Lifecycle) -> UnitState:
    live = _live(state)
    if event.event is Event.STARTED:
        # A start that failed is over, whatever its processes still do: Restart= brings the next, which a log
        # without invocation ids (a pasted journal) tells only by this line
        same = live and live.phase is not Phase.FAILED and (
            not event.invocation or not live.invocation or live.invocation == event.invocation
        )
        return state if same else _begin(state, event.t, event.invocation)
    if live is None and state.attempt is None and _says_it_failed(event):
        # the first word of a unit is how a start failed: the start is before what was read (an excerpt, a vacuumed
        # journal), already under way
        state = _begin(state, event.t, event.invocation)
        live = _live(state)
    if live is None:
        return state
    if event.event is Event.STOPPING:
        return _stop(state, event.t)
    if event.event is Event.OOM_KILLED:
        return evolve(state, attempt=_cause(live, Reason.HOST_OOM_KILLED))
    if event.event is Event.EXITED:
        reason = _exit_reason(event.detail)
        if reason is None and live.phase is not Phase.STOPPING and live.outcome is None:
            return _stop(state, event.t)  # a clean exit before ready: nobody's fault, but no start
        return _fail(state, event.t, reason) if reason else state
    if event.event is Event.FAILED:
        return _fail(state, event.t, FAILED_RESULTS.get(event.detail, Reason.CRASHED))
    if event.event is Event.SPAWN_FAILED:  # systemd could not run the command as the unit configures it
        return _fail(state, event.t, Reason.BAD_CONFIG)
    if event.event is Event.STOPPED:
        return _end(state, event.t)
    return state  # RESTART_SCHEDULED: the Started that follows begins the next attempt


def _delta(now: float, before: float) -> float:
    """Growth of a counter that restarts from zero when systemd recreates the unit's cgroup."""
    return now - before if now >= before else now


def _processes(state: UnitState, sample: ProcessSample, limits: Limits) -> UnitState:
    before = state.last_process
    cpu = _delta(sample.cpu_seconds, before.cpu_seconds) if before else 0.0
    read = int(_delta(sample.read_bytes, before.read_bytes)) if before else 0
    written = int(_delta(sample.written_bytes, before.written_bytes)) if before else 0
    state = evolve(
        state,
        last_process=sample,
        watched_since=state.watched_since if state.watched_since is not None else sample.t,
        cpu_total=state.cpu_total + cpu,
        read_total=state.read_total + read,
        written_total=state.written_total + written,
    )
    if before is not None:
        elapsed = max(sample.t - before.t, 1e-9)
        state = evolve(state, cpu_rate=cpu / elapsed, io_rate=(read + written) / elapsed)
        if cpu / elapsed >= limits.cpu_floor:
            state = _moved(state, Signal.CPU, sample.t)
        if read + written >= limits.io_floor:
            state = _moved(state, Signal.IO, sample.t)
        if sample.ids != before.ids:
            state = _moved(state, Signal.PROCESSES, sample.t)
    mark = state.rss_at_last_move
    if mark is None or abs(sample.rss_bytes - mark) >= limits.memory_floor:
        # weights paged in through mmap, a graph being traced: resident memory is what moves
        state = evolve(state, rss_at_last_move=sample.rss_bytes)
        if mark is not None:
            state = _moved(state, Signal.MEMORY, sample.t)

    live = _live(state)
    if live and before and _replaced(before, sample, live):
        # systemd restarted the unit between two samples (RestartSec= defaults to 100 ms)
        t = max(before.t, min(sample.started_at or sample.t, sample.t))
        return _begin(state, t, "")
    if sample.ids and live is None:
        started = sample.started_at if sample.started_at is not None else sample.t
        ended = state.attempt.ended if state.attempt and state.attempt.ended is not None else started
        return _begin(state, min(sample.t, max(started, ended)), "")
    if not sample.ids and live is not None:
        return _end(state, sample.t)
    return state


def _replaced(before: ProcessSample, sample: ProcessSample, live: Attempt) -> bool:
    """Every process is new, and newer than the attempt: a new start, not workers coming and going."""
    return (
        bool(before.ids and sample.ids)
        and before.ids.isdisjoint(sample.ids)
        and sample.started_at is not None
        and sample.started_at > live.started
    )


def _gpu(state: UnitState, sample: GpuSample, limits: Limits) -> UnitState:
    before = state.last_gpu
    state = evolve(state, last_gpu=sample)
    if state.gpu_at_last_log is None:
        state = evolve(state, gpu_at_last_log=state.gpu_memory)
    if before is None:
        return state
    for gpu in sample.memory.keys() | before.memory.keys():
        now, then = sample.memory.get(gpu, 0), before.memory.get(gpu, 0)
        if now is not None and then is not None and abs(now - then) >= limits.gpu_floor:
            return _moved(state, Signal.GPU_MEMORY, sample.t)
    return state


def _stacks(state: UnitState, sample: StackSample, limits: Limits) -> UnitState:
    """A look at where the processes are. The stack moves when a thread of a process seen in the look before
    has other frames; the look counts as a comparison when every process that burned CPU in between had
    its stacks read both times: only then can unchanged stacks say that a busy unit spins."""
    before = state.stacks
    state = evolve(state, stacks=sample)
    if before is None or sample.t - before.t > limits.stack_fresh:
        return state  # nothing recent to compare with: the unit spoke in between, or the looks failed
    elapsed = max(sample.t - before.t, 1e-9)
    earlier = {p.pid: p for p in before.processes}
    compared, blind, changed = False, False, False
    for process in sample.processes:
        old = earlier.get(process.pid)
        if old is None:  # a new process: the processes signal saw it come
            continue
        if process.threads is None or old.threads is None:
            blind |= (process.cpu_seconds - old.cpu_seconds) / elapsed >= limits.cpu_floor
            continue
        compared = True
        changed |= frozenset(process.threads) != frozenset(old.threads)
    if changed:
        state = _moved(state, Signal.STACK, sample.t)
    if compared and not blind:
        state = evolve(state, stacks_compared=sample.t)
    return state


def advance(state: UnitState, obs: Observation, grammar: Grammar, limits: Limits) -> UnitState:
    """The unit's state after one more observation. Observations arrive in time order."""
    if isinstance(obs, LogLine):
        return _line(state, obs, grammar, limits)
    if isinstance(obs, Lifecycle):
        return _lifecycle(state, obs)
    if isinstance(obs, ProcessSample):
        return _infer(_processes(state, obs, limits), obs.t, grammar, limits)
    if isinstance(obs, Fault):
        live = _live(state)
        return evolve(state, attempt=_cause(live, obs.reason)) if live else state
    if isinstance(obs, Resumed):
        return _resumed(state, obs)
    if isinstance(obs, Suppressed):  # the unit printed, even if journald kept none of it
        state = evolve(state, suppressed_total=state.suppressed_total + obs.count, last_log=obs.t)
        return _moved(state, Signal.LOG, obs.t)
    if isinstance(obs, GpuSample):
        return _gpu(state, obs, limits)
    if isinstance(obs, StackSample):
        return _stacks(state, obs, limits)
    if isinstance(obs, Launched):
        return _launched(state, obs)
    raise TypeError(f"advance: a {type(obs).__name__} is no observation")


def _launched(state: UnitState, launched: Launched) -> UnitState:
    """The group the start's command lines say. They are read once, as the start began, and every host of a
    start runs the same flags: they override what the engine's lines said, so that a host that got further
    names its group as one that never printed a line does."""
    live = _live(state)
    if live is None:
        return state
    return evolve(state, attempt=evolve(live, group=launched.group.filled(live.group or Group())))


def _resumed(state: UnitState, resumed: Resumed) -> UnitState:
    """Take over what the previous agent watched, if it watched this very start."""
    live = _live(state)
    if live is None or state.last_process is not None:
        return state
    same = live.invocation == resumed.invocation if live.invocation else live.started == resumed.attempt_started
    if not same:
        return state
    moved = {**resumed.moved, **{s: t for s, t in state.moved.items() if t > resumed.moved.get(s, -1.0)}}
    return evolve(state, watched_since=resumed.watched_since, moved=frozen_map(moved), last_process=resumed.sample,
                  rss_at_last_move=resumed.sample.rss_bytes)


def judge(state: UnitState, now: float, limits: Limits, ceiling: float | None = None, unheard: str = "") -> Verdict:
    """The verdict of `assess`, without its reason."""
    return assess(state, now, limits, ceiling, unheard)[0]


def assess(state: UnitState, now: float, limits: Limits, ceiling: float | None = None,
           unheard: str = "") -> tuple[Verdict, str]:
    """Progressing, silent but alive, stalled, or unknown when the evidence cannot say; and, for stalled
    and unknown, what the verdict rests on.

    CPU alone proves nothing: a hung collective spins at 100% of a core. Every other signal (a line, I/O,
    GPU memory, the process set, resident memory, a Python stack) proves progress. When for the whole
    stall threshold only CPU moved, the unit is stalled if the stacks of its busy processes were compared
    and stayed the same, and unknown when they were not read.

    `ceiling`: how long this unit's current phase has ever been allowed to take (from its history);
    past it, a unit in which only CPU moves is stalled whatever the stacks say.

    `unheard`: why the unit's lines cannot be read now (the journal is down, journald stopped), "" when they
    can: its silence may then be the journal's, and a silent unit is unknown, never stalled.
    """
    attempt = state.attempt
    if attempt is None or (attempt.ended is not None and attempt.phase is not Phase.FAILED):
        return Verdict.INACTIVE, ""
    if attempt.phase is Phase.FAILED:
        return Verdict.FAILED, ""
    if attempt.phase is Phase.READY:
        return Verdict.READY, ""
    # A start's silence is its own: it counts from its last line or, before its first, from its beginning (an
    # engine prints nothing while Python imports it), never from the start before's last line.
    spoke = attempt.started if state.last_log is None else max(state.last_log, attempt.started)
    if now - spoke < limits.silence:
        return Verdict.PROGRESSING, ""
    if unheard:
        return Verdict.UNKNOWN, f"its lines cannot be read: {unheard}"
    # Silence alone proves nothing (journald drops, \r bars, stopped streams): ask the process side.
    if state.last_process is None or now - state.last_process.t > limits.stale:
        return Verdict.UNKNOWN, "no fresh sample of its processes"
    gpu_stale = (
        limits.gpu and state.last_gpu is not None and now - state.last_gpu.t > limits.stale
    )
    real = max((t for signal, t in state.moved.items() if signal is not Signal.CPU), default=None)
    cpu = state.moved.get(Signal.CPU)
    spinning = cpu is not None and now - cpu < limits.stall
    if ceiling is not None and now - attempt.phase_since > ceiling and (real is None or now - real >= limits.stall):
        return Verdict.STALLED, "past the longest this phase ever took, and only CPU moves" if spinning else "nothing moves"
    if real is not None and now - real < limits.stall:
        return Verdict.SILENT_PROGRESS, ""
    if gpu_stale:
        return Verdict.UNKNOWN, "its GPU evidence is stale, and nothing else moves"  # the GPU might: do not guess
    assert state.watched_since is not None
    quiet_since = max(attempt.started if real is None else real, state.watched_since, attempt.started)
    if now - quiet_since < limits.stall:
        return Verdict.UNKNOWN, "not watched for the stall threshold yet"
    if not spinning:
        return Verdict.STALLED, "nothing moves"
    compared = state.stacks_compared
    if limits.stacks and compared is not None and now - compared <= limits.stack_fresh:
        return Verdict.STALLED, "only CPU moves, and the Python stacks stay the same"
    if limits.stacks:
        return Verdict.UNKNOWN, "only CPU moves, and the busy processes' Python stacks cannot be read"
    return Verdict.UNKNOWN, "only CPU moves (--collector.stacks tells a spin from silent work)"
