"""Pure tables for the core: sequences of observations → phase, verdict and tallies."""

from __future__ import annotations

import functools

import pytest

from exporter.core import grammar
from exporter.core.entries import log_lines
from exporter.core.model import (
    Event,
    Fault,
    GpuSample,
    Lifecycle,
    Limits,
    LogLine,
    Outcome,
    Phase,
    ProcessSample,
    Reason,
    Signal,
    Suppressed,
    UnitState,
    Verdict,
    XidError,
)
from exporter.core.tracker import advance, assess, judge

VLLM = grammar.load("vllm")
LIMITS = Limits(silence=60, stall=300, stale=6, gpu=True)
U = "vllm.service"
GiB, MiB = 2**30, 2**20


def line(t, text, inv="a"):
    return LogLine(t, U, text, inv)


def procs(t, *pids, cpu=0.0, io=0, started=0.0, rss=0):
    return ProcessSample(
        t, U, frozenset((p, started) for p in pids), cpu, io, 0, rss, started_at=started if pids else None
    )


def gpu(t, gib):
    return GpuSample(t, U, {"0": None if gib is None else int(gib * GiB)})


def pid1(t, event, detail="", inv="a"):
    return Lifecycle(t, U, event, detail, inv)


def fold(observations, limits=LIMITS):
    return functools.reduce(
        lambda state, obs: advance(state, obs, VLLM, limits), observations, UnitState(U)
    )


# A startup up to the silent torch.compile, with the process side watched from the start.
TO_COMPILE = [
    procs(0, 10, cpu=0),
    line(1, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0"),
    line(5, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:09 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B..."),
    line(6, "(EngineCore_DP0 pid=11) Loading safetensors checkpoint shards:   0% Completed | 0/5 [00:00<?, ?it/s]"),
    line(20, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:24 [gpu_model_runner.py:2653] Model loading took 15.27 GiB and 12.30 seconds"),
    line(21, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:25 [backends.py:548] Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone for vLLM's torch.compile"),
    procs(22, 10, cpu=30),
]


@pytest.mark.parametrize(
    ("observations", "now", "want"),
    [
        pytest.param([], 0, Verdict.INACTIVE, id="never seen: inactive"),
        pytest.param(TO_COMPILE, 25, Verdict.PROGRESSING, id="a line within the silence threshold"),
        pytest.param(
            [*TO_COMPILE, procs(200, 10, 11, 12, cpu=400), procs(202, 10, cpu=420)],
            203,
            Verdict.SILENT_PROGRESS,
            id="silent compile burning CPU in workers: silent progress",
        ),
        pytest.param(
            [*TO_COMPILE, *(procs(t, 10, cpu=30) for t in range(30, 331, 10))],
            330,
            Verdict.STALLED,
            id="nothing moved for the stall threshold: stalled",
        ),
        pytest.param(
            [*TO_COMPILE, *(procs(t, 10, cpu=30) for t in range(30, 301, 10))],
            300,
            Verdict.SILENT_PROGRESS,
            id="quiet, but the last line is younger than the stall threshold",
        ),
        pytest.param(
            [*TO_COMPILE, procs(100, 10, cpu=30)],
            330,
            Verdict.UNKNOWN,
            id="process samples stale: say so, do not guess",
        ),
        pytest.param(
            [*TO_COMPILE, gpu(22, 15.3), *(procs(t, 10, cpu=30) for t in range(30, 331, 10))],
            330,
            Verdict.UNKNOWN,
            id="GPU evidence went stale and nothing else moved: unknown, not stalled",
        ),
        pytest.param(
            [*TO_COMPILE, gpu(22, 15.3), *(x for t in range(30, 331, 10) for x in (procs(t, 10, cpu=30), gpu(t, 15.3 + t / 100)))],
            330,
            Verdict.SILENT_PROGRESS,
            id="GPU memory creeping during graph capture: silent progress",
        ),
        pytest.param(
            [*TO_COMPILE, gpu(22, 15.3), *(x for t in range(30, 331, 10) for x in (procs(t, 10, cpu=30), gpu(t, 15.3)))],
            330,
            Verdict.STALLED,
            id="GPU memory flat and fresh, everything else flat: stalled",
        ),
        pytest.param(
            [*TO_COMPILE, *(procs(t, 10, cpu=30 + t * 0.01) for t in range(30, 331, 10))],
            330,
            Verdict.STALLED,
            id="CPU below the floor (1% of a core) is not work",
        ),
        pytest.param(
            [*TO_COMPILE, *(procs(t, 10, cpu=30, io=t * 10**6) for t in range(30, 331, 10))],
            330,
            Verdict.SILENT_PROGRESS,
            id="reading a slow disk is progress",
        ),
        pytest.param(
            [*TO_COMPILE[1:5], procs(400, 10, cpu=30), procs(402, 10, cpu=30)],
            402,
            Verdict.UNKNOWN,
            id="agent started long after the last line: not watched long enough to call a stall",
        ),
        pytest.param(
            [*TO_COMPILE, procs(30), procs(100, 20, started=99), procs(102, 20, started=99)],
            103,
            Verdict.PROGRESSING,
            id="a new start that has said nothing yet: its silence counts from its beginning, not the start before's",
        ),
        pytest.param(
            [*TO_COMPILE, procs(30), *(procs(t, 20, started=99) for t in range(100, 171, 10))],
            170,
            Verdict.SILENT_PROGRESS,
            id="a new start silent past the threshold since its beginning: judged as any silence",
        ),
    ],
)
def test_judge(observations, now, want):
    assert judge(fold(observations), now, LIMITS) is want


STILL = [*TO_COMPILE, *(procs(t, 10, cpu=30) for t in range(30, 331, 10))]
JOURNALD_STOPPED = "journald (pid 812) is stopped: nothing it is sent reaches the journal"


@pytest.mark.parametrize(
    ("observations", "now", "unheard", "want"),
    [
        pytest.param(STILL, 330, "", Verdict.STALLED, id="heard, nothing moves: stalled"),
        pytest.param(STILL, 330, JOURNALD_STOPPED, Verdict.UNKNOWN,
                     id="journald stopped: its silence may be the journal's, unknown, never stalled"),
        pytest.param([*TO_COMPILE, procs(200, 10, 11, cpu=400), procs(202, 10, cpu=420)], 203, JOURNALD_STOPPED,
                     Verdict.UNKNOWN, id="working without a line while journald is stopped: unknown, not silent"),
        pytest.param(TO_COMPILE, 25, JOURNALD_STOPPED, Verdict.PROGRESSING, id="a line within the threshold still says"),
        pytest.param([*TO_COMPILE, line(30, "INFO:     Application startup complete.")], 400, JOURNALD_STOPPED,
                     Verdict.READY, id="a ready server stays ready"),
    ],
)
def test_a_unit_the_journal_cannot_hear(observations, now, unheard, want):
    verdict, why = assess(fold(observations), now, LIMITS, unheard=unheard)
    assert verdict is want
    assert (JOURNALD_STOPPED in why) is (want is Verdict.UNKNOWN)


def test_phases_follow_the_markers_and_never_go_back():
    state = fold(TO_COMPILE)
    assert state.phase is Phase.COMPILING
    late_rank = line(23, "(Worker_TP3 pid=14) INFO 10-21 09:12:24 [gpu_model_runner.py:2653] Model loading took 15.27 GiB and 14.02 seconds")
    assert advance(state, late_rank, VLLM, LIMITS).phase is Phase.COMPILING
    assert state.info["model"] == "Qwen/Qwen3-8B"
    assert state.values["model_weights_bytes"] == pytest.approx(15.27 * GiB)


def test_each_phase_duration_is_observed_once_per_attempt():
    state = fold([*TO_COMPILE, line(60, "INFO:     Application startup complete.")])
    assert state.phase is Phase.READY
    assert judge(state, 10_000, LIMITS) is Verdict.READY
    assert state.phase_durations[Phase.LOADING_WEIGHTS].count == 1
    assert state.last_phase_durations[Phase.DOWNLOADING] == pytest.approx(1)
    assert state.last_phase_durations[Phase.LOADING_WEIGHTS] == pytest.approx(15)
    assert state.last_phase_durations[Phase.COMPILING] == pytest.approx(39)
    assert Phase.READY not in state.phase_durations
    assert state.startups == {Outcome.READY: 1}
    assert state.startup_durations[Outcome.READY].total == pytest.approx(60)


OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.25 GiB is free."


@pytest.mark.parametrize(
    ("tail", "phase", "reason", "outcome"),
    [
        pytest.param(
            [line(30, "Traceback (most recent call last):"), line(30, OOM), procs(31)],
            Phase.COMPILING, Reason.CUDA_OOM, Outcome.FAILED,
            id="CUDA OOM traceback then the processes exit",
        ),
        pytest.param(
            [line(30, "ERROR 10-21 09:12:34 [core.py:708] EngineCore failed to start."), line(30, OOM), procs(31)],
            Phase.COMPILING, Reason.CUDA_OOM, Outcome.FAILED,
            id="the specific root cause wins over the generic one printed first",
        ),
        pytest.param(
            [line(30, "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")],
            Phase.COMPILING, Reason.ENGINE_INIT, Outcome.FAILED,
            id="a fatal marker fails the attempt before the processes exit",
        ),
        pytest.param(
            [line(30, "Traceback (most recent call last):"),
             line(30, '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core_client.py", line 430, in _wait_for_engine_startup'),
             line(30, "RuntimeError: Engine core initialization failed. See root cause above.")],
            Phase.COMPILING, Reason.ENGINE_INIT, Outcome.FAILED,
            id="a traceback's exception line names its cause, though it says less than the header's crash",
        ),
        pytest.param(
            [line(29, "Traceback (most recent call last):"),
             line(29, '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 211, in compile_or_warm_up_model'),
             line(30, "Traceback (most recent call last):"),
             line(30, "RuntimeError: Engine core initialization failed. See root cause above.")],
            Phase.COMPILING, Reason.CRASHED, Outcome.FAILED,
            id="a traceback cut before its exception line, then another: the first crashed of something unnamed",
        ),
        pytest.param([procs(31)], Phase.COMPILING, Reason.EXITED, Outcome.FAILED, id="processes gone before ready, no word why"),
        pytest.param(
            [Fault(30, U, Reason.GPU_XID), line(30, "Traceback (most recent call last):"), procs(31)],
            Phase.COMPILING, Reason.GPU_XID, Outcome.FAILED,
            id="an Xid on its GPU, then a traceback and exit: the Xid is the cause",
        ),
        pytest.param(
            [pid1(30, Event.OOM_KILLED), pid1(30, Event.EXITED, "killed/9/KILL"), pid1(30, Event.FAILED, "oom-kill")],
            Phase.COMPILING, Reason.HOST_OOM_KILLED, Outcome.FAILED,
            id="PID 1: OOM killer, then killed by SIGKILL",
        ),
        pytest.param(
            [pid1(30, Event.EXITED, "dumped/11/SEGV")],
            Phase.COMPILING, Reason.CRASHED, Outcome.FAILED, id="PID 1: core dump",
        ),
        pytest.param(
            [pid1(30, Event.EXITED, "exited/1/FAILURE")],
            Phase.COMPILING, Reason.CRASHED, Outcome.FAILED, id="PID 1: the engine exited non-zero",
        ),
        pytest.param(
            [pid1(30, Event.EXITED, "exited/217/USER")],
            Phase.COMPILING, Reason.BAD_CONFIG, Outcome.FAILED,
            id="PID 1: systemd's own exit status, a step of setting up the command failed (User=)",
        ),
        pytest.param(
            [pid1(30, Event.SPAWN_FAILED, "EXEC")],
            Phase.COMPILING, Reason.BAD_CONFIG, Outcome.FAILED,
            id="systemd's child could not run the command (ExecStart= missing, not executable)",
        ),
        pytest.param(
            [pid1(30, Event.STOPPING), pid1(31, Event.EXITED, "killed/15/TERM"), procs(32)],
            None, None, Outcome.STOPPED, id="an operator stopped it: no failure",
        ),
        pytest.param(
            [line(30, "(APIServer pid=1) KeyboardInterrupt: terminated"),
             line(30, "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
             procs(31)],
            None, None, Outcome.STOPPED,
            id="the engine says it was asked to stop (a container's SIGTERM): what breaks after is the stop's doing",
        ),
        pytest.param(
            [line(30, "(APIServer pid=1) Traceback (most recent call last):"),
             line(30, '(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 1953, in <module>'),
             line(30, "(APIServer pid=1) KeyboardInterrupt: terminated"), procs(31)],
            None, None, Outcome.STOPPED, id="the traceback before a KeyboardInterrupt is the stop's own",
        ),
        pytest.param(
            [line(29, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
             line(30, "(APIServer pid=1) KeyboardInterrupt: terminated"), procs(31)],
            Phase.COMPILING, Reason.CUDA_OOM, Outcome.FAILED,
            id="a stop after a failure still pending only ends that failure",
        ),
    ],
)
def test_failures(tail, phase, reason, outcome):
    state = fold([*TO_COMPILE, *tail])
    assert state.attempt.outcome is outcome
    if reason is None:
        assert state.failures == {}
        assert state.phase is Phase.INACTIVE
        assert judge(state, 40, LIMITS) is Verdict.INACTIVE
    else:
        assert state.failures == {(phase, reason): 1}
        assert state.phase is Phase.FAILED
        assert judge(state, 40, LIMITS) is Verdict.FAILED
    assert state.startups == {outcome: 1}


def test_a_late_line_of_an_ended_attempt_starts_nothing():
    state = fold([*TO_COMPILE, procs(31), line(30.5, "RuntimeError: CUDA error: an illegal memory access", inv="a")])
    assert state.phase is Phase.FAILED
    assert state.startups == {Outcome.FAILED: 1}


def test_restart_with_a_new_invocation_is_a_new_attempt():
    state = fold([*TO_COMPILE, line(40, "INFO 10-21 09:13:04 [api_server.py:1839] vLLM API server version 0.11.0", inv="b")])
    assert state.attempt.started == 40
    assert state.attempt.invocation == "b"
    assert state.phase is Phase.LAUNCHING
    assert state.failures == {(Phase.COMPILING, Reason.EXITED): 1}
    assert state.values == {}


# A pasted journal: PID 1's lines and the engine's, without invocation ids or a process side.
PASTED = [pid1(0, Event.STARTED, inv=""), line(1, "vLLM API server version 0.11.0", inv=""),
          line(21, "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone", inv="")]


@pytest.mark.parametrize(
    ("tail", "started", "phase", "startups"),
    [
        pytest.param([pid1(40, Event.EXITED, "exited/1/FAILURE", inv=""), pid1(40, Event.FAILED, "exit-code", inv=""),
                      pid1(42, Event.RESTART_SCHEDULED, inv=""), pid1(42, Event.STARTED, inv="")],
                     42, Phase.LAUNCHING, {Outcome.FAILED: 1}, id="a restart loop's next Started: the failed start is over"),
        pytest.param([line(30, "INFO:     Application startup complete.", inv=""), pid1(31, Event.STARTED, inv="")],
                     0, Phase.READY, {Outcome.READY: 1}, id="Type=notify: PID 1's Started after ready is the same start"),
    ],
)
def test_pid1s_started_without_invocation_ids(tail, started, phase, startups):
    """Without invocation ids, PID 1's Started alone tells a restart from the start it follows."""
    state = fold([*PASTED, *tail])
    assert (state.attempt.started, state.phase, state.startups) == (started, phase, startups)


@pytest.mark.parametrize(
    ("observations", "failures"),
    [
        pytest.param([pid1(40, Event.OOM_KILLED, inv=""), pid1(40, Event.EXITED, "killed/9/KILL", inv=""),
                      pid1(40, Event.FAILED, "oom-kill", inv="")],
                     {(Phase.LAUNCHING, Reason.HOST_OOM_KILLED): 1}, id="PID 1's word on how it failed"),
        pytest.param([pid1(40, Event.EXITED, "exited/0/SUCCESS", inv=""), pid1(40, Event.STOPPED, inv="")], {},
                     id="a clean exit: nothing"),
    ],
)
def test_a_start_never_seen_that_failed_is_a_failed_start(observations, failures):
    """An excerpt, or a journal vacuumed past the start: the first word of the unit says how a start ended."""
    state = fold(observations)
    assert state.failures == failures
    assert state.startups == ({Outcome.FAILED: 1} if failures else {})


def test_processes_replaced_between_two_samples_is_a_new_attempt():
    state = fold([*TO_COMPILE, procs(24, 20, cpu=1, started=23.5)])
    assert state.attempt.started == 23.5
    assert state.startups == {Outcome.FAILED: 1}


def test_workers_coming_and_going_is_the_same_attempt_and_counts_as_movement():
    state = fold([*TO_COMPILE, procs(24, 10, 11, cpu=30), procs(26, 10, cpu=30)])
    assert state.attempt.started == 0
    assert state.moved[Signal.PROCESSES] == 26


def test_pid1_started_then_processes_begin_one_attempt():
    state = fold([pid1(1, Event.STARTED), procs(2, 10, started=1.1), line(3, "vLLM API server version 0.11.0")])
    assert state.attempt.started == 1
    assert state.phase is Phase.LAUNCHING


def test_counters_survive_a_recreated_cgroup():
    state = fold([procs(0, 10, cpu=100, io=1000), procs(2, 10, cpu=120, io=3000), procs(4, 10, cpu=5, io=500)])
    assert state.cpu_total == pytest.approx(25)
    assert state.read_total == 2500


def test_a_ready_server_interrupted_stays_ready_and_fails_nothing():
    # Ctrl-C on a ready server (no systemd to say "Stopping"): Python's traceback, then its processes end
    state = fold([*TO_COMPILE, line(60, "INFO:     Application startup complete."),
                  line(70, "Traceback (most recent call last):"), line(70, "KeyboardInterrupt"), procs(71)])
    assert state.failures == {}
    assert state.startups == {Outcome.READY: 1}
    assert state.phase is Phase.INACTIVE


def test_ready_then_stopped_counts_no_failure():
    state = fold([*TO_COMPILE, line(60, "INFO:     Application startup complete."), procs(70)])
    assert state.failures == {}
    assert state.phase is Phase.INACTIVE
    assert state.startups == {Outcome.READY: 1}


def test_a_warning_before_ready_does_not_explain_a_later_exit():
    state = fold([*TO_COMPILE, line(30, "NCCL WARN Call to ibv_reg_mr failed"), line(60, "INFO:     Application startup complete."), procs(70)])
    assert state.failures == {}


def test_a_heartbeat_line_is_no_progress():
    tgi = grammar.parse("tgi", "[[rule]]\nmatch = 'Waiting for shard to be ready'\nheartbeat = true\n")
    heartbeats = [x for t in range(10, 401, 10) for x in (procs(t, 10), line(t, "Waiting for shard to be ready..."))]
    state = functools.reduce(
        lambda s, o: advance(s, o, tgi, LIMITS), [procs(0, 10), line(1, "Starting shard"), *heartbeats], UnitState(U)
    )
    assert judge(state, 400, LIMITS) is Verdict.STALLED


def test_vllms_broadcast_wait_is_no_progress():
    # the EngineCore prints it every 60 s while its workers take nothing, in a long compile or a hang alike:
    # a hang that prints it is not progressing, and nothing else moving makes it stalled
    wait = "(EngineCore_DP0 pid=11) INFO 10-21 09:14:25 [shm_broadcast.py:542] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization)."
    waits = [x for t in range(80, 501, 60) for x in (procs(t, 10, cpu=30), line(t + 1, wait))]
    state = fold([*TO_COMPILE, *waits, procs(505, 10, cpu=30)])
    assert judge(state, 505, LIMITS) is Verdict.STALLED
    assert state.phase is Phase.COMPILING


def test_the_attempt_keeps_its_timeline_and_silences():
    state = fold([*TO_COMPILE, line(200, "torch.compile takes 179.0 s in total"), line(201, "INFO:     Application startup complete.")])
    assert [p for p, _ in state.attempt.spans] == [
        Phase.LAUNCHING, Phase.DOWNLOADING, Phase.LOADING_WEIGHTS, Phase.COMPILING, Phase.PROFILING, Phase.READY
    ]
    assert state.attempt.spans[3] == (Phase.COMPILING, 21)
    assert state.attempt.gaps == ((21, 200, Phase.COMPILING),)


def test_a_new_attempt_keeps_the_previous_one():
    state = fold([*TO_COMPILE, procs(31), procs(40, 20, started=39)])
    assert state.previous.phase is Phase.FAILED
    assert state.previous.spans[-1] == (Phase.FAILED, 31)
    assert state.attempt.started == 39


BUSY = [*TO_COMPILE, *(procs(t, 10, cpu=30 + t) for t in range(30, 1001, 10))]  # one core, nothing else


@pytest.mark.parametrize(
    ("observations", "ceiling", "want"),
    [
        pytest.param(BUSY, None, Verdict.UNKNOWN, id="busy without history or stacks: only CPU moves, unknown"),
        pytest.param(BUSY, 2000, Verdict.UNKNOWN, id="busy, within what this phase has taken before: unknown"),
        pytest.param(BUSY, 600, Verdict.STALLED, id="busy only, well past anything seen before: a spinning hang"),
        pytest.param([*BUSY[:-1], procs(1000, 10, cpu=2000, io=10**9)], 600, Verdict.SILENT_PROGRESS,
                     id="past the ceiling but reading a disk: still work"),
    ],
)
def test_the_ceiling_from_history(observations, ceiling, want):
    assert judge(fold(observations), 1000, LIMITS, ceiling) is want


def test_settings_and_compile_cache_are_kept_on_the_attempt():
    state = fold([
        line(1, "INFO 10-21 09:12:04 [utils.py:233] non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768}"),
        line(2, "INFO 10-21 09:12:05 [backends.py:164] Directly load the compiled graph(s) for dynamic shape from the cache, took 3.112 s"),
        line(3, "INFO 10-21 09:12:06 [backends.py:218] Compiling a graph for dynamic shape takes 17.96 s"),
        line(4, "INFO 10-21 09:12:07 [backends.py:164] Directly load the compiled graph(s) for dynamic shape from the cache, took 3.112 s"),
    ])
    assert state.attempt.settings == "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768}"
    assert state.attempt.compile_cache == "cold"


def _resumed(**changes):
    from exporter.core.model import Resumed

    saved = dict(t=22, unit=U, invocation="a", attempt_started=0, watched_since=0, moved={Signal.CPU: 22.0}, sample=procs(22, 10, cpu=30))
    saved.update(changes)
    return Resumed(**saved)


@pytest.mark.parametrize(
    ("observations", "want"),
    [
        pytest.param([*TO_COMPILE[1:5], _resumed(), *(procs(t, 10, cpu=30) for t in range(330, 341, 10))],
                     Verdict.STALLED, id="nothing moved across the gap: still stalled at once"),
        pytest.param([*TO_COMPILE[1:5], _resumed(), *(procs(t, 10, cpu=30, rss=GiB) for t in range(330, 341, 10))],
                     Verdict.SILENT_PROGRESS, id="memory moved across the gap: silent progress"),
        pytest.param([*TO_COMPILE[1:5], _resumed(invocation="b"), *(procs(t, 10, cpu=30) for t in range(330, 341, 10))],
                     Verdict.UNKNOWN, id="saved for another start: ignored, not watched long enough"),
    ],
)
def test_a_restarted_agent_takes_over_what_it_had_watched(observations, want):
    observations = sorted(observations, key=lambda o: o.t)
    assert judge(fold(observations), 340, LIMITS) is want


NCCL_RAS = "gpu-node-1:2514:2702 [0] ras/client_support.cc:105 NCCL WARN Call to bind failed: Address already in use"


@pytest.mark.parametrize(
    ("tail", "reason", "outlived"),
    [
        pytest.param([line(30, NCCL_RAS)], None, False, id="NCCL's RAS socket warning is neither a failure nor a port in use"),
        pytest.param([line(30, NCCL_RAS), procs(31)], Reason.EXITED, False,
                     id="so a start that then dies did not die of NCCL"),
        pytest.param([line(30, OOM), line(40, "INFO 10-21 09:13:04 [monitor.py:33] torch.compile takes 12.40 s in total")],
                     Reason.CUDA_OOM, True, id="a later phase after the cause: the start outlived it"),
        pytest.param([line(30, OOM), line(31, "Traceback (most recent call last):")], Reason.CUDA_OOM, False,
                     id="a traceback says less than the OOM before it: the OOM stays"),
        pytest.param([line(30, "Traceback (most recent call last):"),
                      line(31, '  File "/usr/lib/python3/site-packages/vllm/worker/worker.py", line 179, in determine_num_available_blocks'),
                      line(32, "ValueError: something no rule names")],
                     Reason.CRASHED, False, id="a traceback's frame says where it failed, and outlives nothing"),
        pytest.param([line(30, "ERROR [core.py:708] EngineCore failed to start."), line(31, "Traceback (most recent call last):")],
                     Reason.CRASHED, False, id="a traceback says more than 'failed to start'"),
        pytest.param([line(30, "torch.compile takes 12.40 s in total"), line(31, OOM),
                      line(32, "INFO [monitor.py:33] Memory profiling takes 3.20 seconds")],
                     Reason.CUDA_OOM, False, id="a marker of a phase already reached does not outlive the cause"),
    ],
)
def test_causes_are_remembered_replaced_and_outlived(tail, reason, outlived):
    attempt = fold([*TO_COMPILE, *tail]).attempt
    assert (attempt.reason, attempt.outlived) == (reason, outlived)


def test_a_failure_that_says_where_it_happened_moves_the_start_there_first():
    kv_check = ("ERROR [core.py:708] ValueError: To serve at least one request with the models's max seq len (131072), "
                "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory")
    attempt = fold([*TO_COMPILE, line(30, kv_check)]).attempt
    assert (attempt.phase, attempt.reason, attempt.outlived) == (Phase.ALLOCATING_KV_CACHE, Reason.BAD_CONFIG, False)


def test_an_unknown_observation_is_refused_not_taken_for_a_gpu_sample():
    with pytest.raises(TypeError, match="XidError is no observation"):
        advance(UnitState(U), XidError(1.0, "0", 79, "kernel"), VLLM, LIMITS)


# Each liveness floor at its edge: the unit is silent and still from t=21 (TO_COMPILE's last line) on;
# at 400 and 402 one signal changes by a hair less, or a hair more, than its floor (Limits' defaults:
# 5% of a core, 64 KiB read or written, 64 MiB of GPU memory, 32 MiB of resident memory). Only the change
# at the floor is movement; CPU's alone proves nothing (unknown, without stacks), but it is movement.

def _still_then(cpu: float = 30.0, io: int = 0, gpu_bytes: int = 10 * GiB, rss: int = GiB) -> list:
    sampled = [x for t in (*range(30, 391, 10), 400) for x in (procs(t, 10, cpu=30, rss=GiB), _gpu_bytes(t, 10 * GiB))]
    return [*TO_COMPILE, *sampled, procs(402, 10, cpu=cpu, io=io, rss=rss), _gpu_bytes(402, gpu_bytes)]


def _gpu_bytes(t, used):
    return GpuSample(t, U, {"0": used})


@pytest.mark.parametrize(
    ("observations", "want"),
    [
        pytest.param(_still_then(cpu=30 + 0.098), Verdict.STALLED, id="CPU 4.9% of a core: not work"),
        pytest.param(_still_then(cpu=30 + 0.102), Verdict.UNKNOWN, id="CPU 5.1% of a core: it moves, and alone proves nothing"),
        pytest.param(_still_then(io=64 * 1024 - 1), Verdict.STALLED, id="I/O a byte under 64 KiB: not work"),
        pytest.param(_still_then(io=64 * 1024), Verdict.SILENT_PROGRESS, id="I/O of 64 KiB: work"),
        pytest.param(_still_then(gpu_bytes=10 * GiB + 64 * MiB - 1), Verdict.STALLED, id="GPU memory +64 MiB - 1 B: no movement"),
        pytest.param(_still_then(gpu_bytes=10 * GiB - 64 * MiB), Verdict.SILENT_PROGRESS, id="GPU memory -64 MiB: movement"),
        pytest.param(_still_then(rss=GiB + 32 * MiB - 1), Verdict.STALLED, id="resident memory +32 MiB - 1 B: no movement"),
        pytest.param(_still_then(rss=GiB - 32 * MiB), Verdict.SILENT_PROGRESS, id="resident memory -32 MiB: movement"),
    ],
)
def test_each_liveness_floor_at_its_edge(observations, want):
    assert judge(fold(observations), 402, LIMITS) is want


def test_lines_journald_suppressed_are_log_movement():
    """journald's 'Suppressed N messages' notice: the unit printed, even if none of it was kept."""
    quiet = [*TO_COMPILE, *(procs(t, 10, cpu=30) for t in range(30, 331, 10))]
    assert judge(fold(quiet), 330, LIMITS) is Verdict.STALLED
    state = fold([*quiet[:-3], Suppressed(305, U, 1200), *quiet[-3:]])
    assert judge(state, 330, LIMITS) is Verdict.PROGRESSING
    assert (state.suppressed_total, state.last_log, state.moved[Signal.LOG]) == (1200, 305, 305)




def look(t, *processes):
    """A look at the unit's processes: (pid, cpu seconds, frames or None when its stacks were not read)."""
    from exporter.core.model import Frame, ProcessStack, StackSample, ThreadStack

    return StackSample(t, U, tuple(
        ProcessStack(pid, "R", "", cpu, None if frames is None else (ThreadStack(pid, tuple(Frame(*f) for f in frames)),))
        for pid, cpu, frames in processes
    ))


SPIN = ("synchronize", "vllm/v1/worker/gpu_model_runner.py", 3480)
STACKS = Limits(silence=60, stall=300, stale=6, gpu=False, stacks=True, stack_every=60)
# A rank that spins on one core from t=21 on: nothing but CPU moves.
SPINNING = [*TO_COMPILE, *(procs(t, 10, cpu=30 + t) for t in range(30, 401, 10))]


def spinning_looks(frames_at=lambda t: [SPIN], cpu_of=lambda t: 30 + t, every=60):
    return [look(t, (10, cpu_of(t), frames_at(t))) for t in range(85, 401, every)]


@pytest.mark.parametrize(
    ("observations", "limits", "want", "why"),
    [
        pytest.param(SPINNING, LIMITS, Verdict.UNKNOWN, "--collector.stacks",
                     id="only CPU moves, stacks off: unknown, with the hint"),
        pytest.param([*SPINNING, *spinning_looks()], STACKS, Verdict.STALLED, "stacks stay the same",
                     id="only CPU moves and the stack stays in synchronize: stalled"),
        pytest.param([*SPINNING, *spinning_looks(lambda t: [("trace", "torch/_dynamo/convert_frame.py", t)])],
                     STACKS, Verdict.SILENT_PROGRESS, "", id="only CPU moves but the stack moves: silent work"),
        pytest.param([*SPINNING, *spinning_looks(lambda t: None)], STACKS, Verdict.UNKNOWN, "cannot be read",
                     id="the busy process's stack cannot be read (native): unknown"),
        pytest.param([*SPINNING, *spinning_looks()[:2]], STACKS, Verdict.UNKNOWN, "cannot be read",
                     id="the looks stopped (py-spy failing): unknown, never stalled on old looks"),
        pytest.param([*SPINNING, *spinning_looks()[:1]], STACKS, Verdict.UNKNOWN, "cannot be read",
                     id="one look is no comparison: unknown"),
        pytest.param([*SPINNING, *(look(t, (10, 30 + t, [SPIN]), (11, 5.0, None)) for t in range(85, 401, 60))],
                     STACKS, Verdict.STALLED, "stacks stay the same",
                     id="an idle process that cannot be read does not hide the spinning one"),
        pytest.param([*SPINNING, *(look(t, (10, 30 + t, [SPIN]), (11, t, None)) for t in range(85, 401, 60))],
                     STACKS, Verdict.UNKNOWN, "cannot be read",
                     id="a busy process that cannot be read: unknown"),
        pytest.param([*SPINNING, *(look(t, (10 if t < 300 else 12, 30 + t, [SPIN])) for t in range(85, 401, 60))],
                     STACKS, Verdict.STALLED, "stacks stay the same",
                     id="a process gone between looks is no movement of the stack"),
        pytest.param([*TO_COMPILE, *(procs(t, 10, cpu=30 + t, rss=GiB + t * 12 * MiB) for t in range(30, 401, 10))],
                     LIMITS, Verdict.SILENT_PROGRESS, "", id="a graph being traced: CPU and memory move, silent work"),
        pytest.param([*TO_COMPILE, *(procs(t, 10, cpu=30, rss=GiB + t * 8 * MiB) for t in range(30, 401, 10))],
                     LIMITS, Verdict.SILENT_PROGRESS, "", id="mmap from slow storage: only memory moves, silent work"),
        pytest.param([*TO_COMPILE, *(procs(t, 10, cpu=30, rss=GiB + t * MiB // 20) for t in range(30, 401, 10))],
                     LIMITS, Verdict.STALLED, "nothing moves", id="memory creeping below its floor is no movement"),
        pytest.param([*TO_COMPILE, *(procs(t, 10, cpu=30) for t in range(30, 401, 10)), *spinning_looks(cpu_of=lambda t: 30)],
                     STACKS, Verdict.STALLED, "nothing moves", id="an idle hang with stacks: stalled"),
    ],
)
def test_judge_with_memory_and_stacks(observations, limits, want, why):
    from exporter.core.tracker import assess

    observations = sorted(observations, key=lambda o: o.t)
    verdict, reason = assess(fold(observations, limits), 400, limits)
    assert (verdict, why in reason) == (want, True), reason


def test_where_a_silent_unit_is_stuck_groups_its_ranks():
    from exporter.core import stuck
    from exporter.core.model import Frame, ProcessStack, StackSample, ThreadStack

    idle = ThreadStack(7, (Frame("wait", "threading.py", 320),))
    spin = ThreadStack(8, (Frame("synchronize", "torch/cuda/__init__.py", 1040), Frame("capture", "vllm/worker.py", 9)))
    sample = StackSample(390, U, (
        ProcessStack(10, "R", "", 50.0, (spin, idle)),
        ProcessStack(11, "R", "", 50.0, (spin,)),
        ProcessStack(12, "D", "folio_wait_bit_common", 1.0, None),
        ProcessStack(13, "S", "futex_wait_queue", 0.0, (ThreadStack(13, ()),)),
    ))
    state = fold([*SPINNING, sample], STACKS)
    groups = stuck.where(state, Verdict.STALLED, 400, STACKS)
    assert [(g.pids, g.frames[:1], g.state, g.wchan) for g in groups] == [
        ((10, 11), (Frame("synchronize", "torch/cuda/__init__.py", 1040),), "R", ""),
        ((12,), (), "D", "folio_wait_bit_common"),
        ((13,), (), "S", "futex_wait_queue"),
    ]
    assert stuck.frame_labels(groups) == ("synchronize", "torch/cuda/__init__.py")
    assert stuck.frame_labels(groups[1:]) == ("folio_wait_bit_common", "[kernel]")
    assert "storage" in stuck.waiting_for("folio_wait_bit_common")
    # a process stopped (SIGSTOP: a frozen worker) holds the others: it comes first, busy as they are
    frozen = StackSample(390, U, (*sample.processes, ProcessStack(14, "T", "do_signal_stop", 0.0, None)))
    groups = stuck.where(fold([*SPINNING, frozen], STACKS), Verdict.STALLED, 400, STACKS)
    assert [(g.pids, g.state) for g in groups] == [((14,), "T"), ((10, 11), "R"), ((12,), "D"), ((13,), "S")]
    assert stuck.where(state, Verdict.PROGRESSING, 400, STACKS) == ()  # a unit that speaks is stuck nowhere
    assert stuck.where(state, Verdict.STALLED, 390 + 60 + 7, STACKS) == ()  # an old look says nothing


# A log that holds several starts with nothing between them (`docker logs` of a container that
# restarted, a plain file): the engine's first word after a start that settled begins the next one.
READY_LINE = "INFO:     Application startup complete."
FIRST_WORD = "INFO 10-21 09:20:04 [api_server.py:1839] vLLM API server version 0.11.0"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


@pytest.mark.parametrize(
    ("observations", "attempts", "phase", "startups"),
    [
        pytest.param([line(1, FIRST_WORD), line(30, READY_LINE), line(90, FIRST_WORD)], 2, Phase.LAUNCHING,
                     {Outcome.READY: 1}, id="ready, then the first word again: a second start, the first stays ready"),
        pytest.param([line(1, FIRST_WORD), line(20, OOM), line(21, "Traceback (most recent call last):"),
                      line(22, "RuntimeError: Engine core initialization failed. See root cause above."),
                      line(40, FIRST_WORD)], 2, Phase.LAUNCHING,
                     {Outcome.FAILED: 1}, id="failed, then the first word again: the restart is a start of its own"),
        pytest.param([line(1, FIRST_WORD), line(5, "Traceback (most recent call last):"),
                      line(6, "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                              "'namespace/repo_name': '/models/none'."),
                      line(9, FIRST_WORD)], 2, Phase.LAUNCHING, {Outcome.FAILED: 1},
                     id="failing, its exit unseen, then the first word again: it failed of its cause, then restarted"),
        pytest.param([line(1, FIRST_WORD), line(5, "Traceback (most recent call last):"),
                      line(8, "INFO 10-21 09:20:10 [gpu_model_runner.py:1] Starting to load model m..."),
                      line(9, FIRST_WORD)], 1, Phase.DOWNLOADING, {},
                     id="a cause the start went on past, then the first word: still the one start"),
        pytest.param([line(1, FIRST_WORD), line(2, FIRST_WORD), line(30, READY_LINE)], 1, Phase.READY,
                     {Outcome.READY: 1}, id="the first word twice before the start settled: one start"),
        pytest.param([line(1, FIRST_WORD), line(30, READY_LINE), line(31, "INFO 10-21 09:12:04 [api_server.py:1] "
                      "Starting vLLM API server 0 on http://0.0.0.0:8000")], 1, Phase.READY,
                     {Outcome.READY: 1}, id="any other launching line after ready: still the one start"),
    ],
)
def test_the_engines_first_word_after_a_settled_start_begins_the_next(observations, attempts, phase, startups):
    state = fold(observations)
    assert state.phase is phase
    assert (state.previous is not None) == (attempts == 2)
    assert state.startups == startups
    if state.previous and state.previous.reason:  # a failed start keeps its cause
        assert state.failures == {(state.previous.spans[-2][0], state.previous.reason): 1}


def test_a_runners_first_word_inside_a_daemon_begins_nothing():
    """Ollama's runner prints llama.cpp's `build:` as it loads a model: the daemon did not start again (that
    an embedded first word never begins a start is test_grammars' to check; this is the user's view of it)."""
    ollama = grammar.load("ollama")
    lines = ['time=2025-07-24T09:28:51.300Z level=INFO source=routes.go:1235 msg="server config" env="map[]"',
             'time=2025-07-24T09:28:51.310Z level=INFO source=routes.go:1288 msg="Listening on [::]:11434 (version 0.11.4)"',
             "build: 5505 (9065ca71) with cc (Debian 12.2.0-14+deb12u1) 12.2.0 for x86_64-linux-gnu"]
    state = functools.reduce(lambda s, obs: advance(s, obs, ollama, LIMITS),
                             [line(t, text) for t, text in enumerate(lines, 1)], UnitState(U))
    assert state.phase is Phase.READY and state.previous is None


# A phase the engine goes through without a line (vLLM's CUDA-graph capture: its bar redraws with \r, and the
# journal has it only when it ends) is inferred from the engine's order and the silence, and the next line of
# the start confirms it (the bar, dated back to when it began) or retracts it: a failure or a stop is counted
# where the start's own lines put it, as replay (which never infers) counts it.
TO_KV = [
    procs(0, 10, cpu=0),
    line(1, "INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0"),
    line(30, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:35 [gpu_worker.py:298] Available KV cache memory: 56.63 GiB"),
    line(31, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:35 [kv_cache_utils.py:1087] GPU KV cache size: 412,336 tokens"),
]
EAGER = "(EngineCore_DP0 pid=11) INFO 10-21 09:12:06 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='m', enforce_eager=True, kv_cache_dtype=auto"
BAR = "\r".join(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {n * 100 // 67:3d}%|#| {n}/67 [00:{n // 8:02d}<00:00, 8.0it/s]"
                for n in range(0, 68, 67))  # two redraws: 0/67, then 67/67 after 8 s


def bar(t):
    """The bar's record as the journal source hands it on: a line per redraw, each dated back by its elapsed time."""
    return log_lines(BAR, t, U, "a")


CAPTURED = "(EngineCore_DP0 pid=11) INFO 10-21 09:12:47 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, took 0.52 GiB"
INIT = "(EngineCore_DP0 pid=11) INFO 10-21 09:12:48 [core.py:210] init engine (profile, create kv cache, warmup model) took 41.20 seconds"
CAPTURE_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


@pytest.mark.parametrize(
    ("observations", "phase", "inferred", "timeline", "failures"),
    [
        pytest.param([*TO_KV, procs(34, 10, cpu=5)], Phase.ALLOCATING_KV_CACHE, False,
                     ["launching", "allocating_kv_cache"], {}, id="silent for less than infer_after: nothing inferred"),
        pytest.param([*TO_KV, procs(37, 10, cpu=5)], Phase.CAPTURING_GRAPHS, True,
                     ["launching", "allocating_kv_cache", "capturing_graphs"], {},
                     id="silent after the KV cache, alive: capturing, inferred"),
        pytest.param([*TO_KV, procs(37)], Phase.FAILED, False, ["launching", "allocating_kv_cache", "failed"],
                     {(Phase.ALLOCATING_KV_CACHE, Reason.EXITED): 1}, id="no process left: nothing inferred"),
        pytest.param([TO_KV[0], line(2, EAGER), *TO_KV[1:], procs(37, 10, cpu=5)], Phase.ALLOCATING_KV_CACHE, False,
                     ["launching", "allocating_kv_cache"], {}, id="eager mode said at launch: no capture to infer"),
        pytest.param([*TO_KV, procs(37, 10, cpu=5), *bar(47), line(47.5, CAPTURED)], Phase.CAPTURING_GRAPHS,
                     False, ["launching", "allocating_kv_cache", "capturing_graphs"], {},
                     id="the bar arrives: confirmed"),
        pytest.param([*TO_KV, procs(37, 10, cpu=5), line(38, INIT)], Phase.STARTING_API, False,
                     ["launching", "allocating_kv_cache", "starting_api"], {},
                     id="a later phase without the bar: retracted, no capture in the timeline"),
        pytest.param([*TO_KV, procs(37, 10, cpu=5), line(40, CAPTURE_OOM), procs(41)], Phase.FAILED, False,
                     ["launching", "allocating_kv_cache", "failed"], {(Phase.ALLOCATING_KV_CACHE, Reason.CUDA_OOM): 1},
                     id="a failure no line places: counted where the lines put the start"),
        pytest.param([*TO_KV, procs(37, 10, cpu=5), line(40, "Traceback (most recent call last):"),
                      line(40, '  File "/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 3400, in capture_model'),
                      line(40, CAPTURE_OOM), procs(41)], Phase.FAILED, False,
                     ["launching", "allocating_kv_cache", "capturing_graphs", "failed"],
                     {(Phase.CAPTURING_GRAPHS, Reason.CUDA_OOM): 1}, id="a failure its frames place in capture: there"),
    ],
)
def test_a_silent_phase_is_inferred_then_confirmed_or_retracted(observations, phase, inferred, timeline, failures):
    state = fold(sorted(observations, key=lambda o: o.t), Limits(silence=4, stall=8))
    assert state.phase is phase
    assert (state.attempt.inferred_from is not None) is inferred
    assert [str(p) for p, _ in state.attempt.spans] == timeline
    assert state.failures == failures


def test_a_confirmed_silent_phase_began_when_its_bar_did():
    """The bar's first redraw was drawn 8 s before it reached the journal: the phase began then, not at the
    inference, and the phase before it ended there."""
    state = fold([*TO_KV, procs(37, 10, cpu=5), *bar(47)], Limits(silence=4, stall=8))
    assert state.attempt.spans[-1] == (Phase.CAPTURING_GRAPHS, 39)  # 47 minus the bar's 8 s of redraws
    assert state.last_phase_durations[Phase.ALLOCATING_KV_CACHE] == 39 - 30
