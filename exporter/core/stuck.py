"""Where a silent unit is stuck: its processes grouped by their innermost Python frames or kernel wait; pure."""

from __future__ import annotations

from exporter.core.model import Limits, Stuck, UnitState, Verdict

FRAMES_SHOWN = 5  # innermost frames of the busiest thread kept per group
SILENT = frozenset({Verdict.SILENT_PROGRESS, Verdict.STALLED, Verdict.UNKNOWN})

# What a kernel wait channel (/proc/<pid>/wchan) says a process waits for, by a prefix of its name.
WAITS: tuple[tuple[str, str], ...] = (
    ("folio_wait_bit", "a page from storage: a slow or hung mount (NFS, FUSE) under mmap"),
    ("wait_on_page_bit", "a page from storage: a slow or hung mount (NFS, FUSE) under mmap"),
    ("fuse_", "a FUSE server"),
    ("request_wait_answer", "a FUSE server"),
    ("nfs", "an NFS server"),
    ("rpc_wait", "an NFS server"),
    ("futex", "a lock or a condition: another thread or process"),
    ("do_epoll_wait", "the network or a pipe"),
    ("ep_poll", "the network or a pipe"),
    ("do_select", "the network or a pipe"),
    ("do_sys_poll", "the network or a pipe"),
    ("pipe_read", "a pipe"),
    ("sock_alloc_send_pskb", "room to write to a socket: its output to journald, when journald does not read it"),
    ("unix_stream", "a local socket"),
    ("sk_wait_data", "the network"),
    ("inet_csk_accept", "a connection"),
    ("hrtimer_nanosleep", "nothing: it sleeps"),
    ("do_nanosleep", "nothing: it sleeps"),
    ("do_wait", "a child process to exit"),
)


# A stopped process (SIGSTOP, a tracer) holds whatever waits on it, busily or not: it comes before the busiest.
STOPPED = frozenset("Tt")


def where(state: UnitState, verdict: Verdict, now: float, limits: Limits) -> tuple[Stuck, ...]:
    """A silent unit's processes from its last fresh look, in groups that are in the same place: the stopped
    ones first, then the busiest; () when the unit is not silent or was not looked at lately."""
    sample = state.stacks
    if verdict not in SILENT or sample is None or now - sample.t > limits.stack_fresh:
        return ()
    groups: dict[tuple, list[int]] = {}
    first: dict[tuple, tuple[str, str]] = {}
    for process in sample.processes:
        frames = next((t.frames[:FRAMES_SHOWN] for t in process.threads or () if t.frames), ())
        key = (frames,) if frames else ((), process.state, process.wchan)
        groups.setdefault(key, []).append(process.pid)
        first.setdefault(key, (process.state, process.wchan))
    found = [Stuck(tuple(pids), key[0], *first[key]) for key, pids in groups.items()]
    return tuple(sorted(found, key=lambda group: group.state not in STOPPED))


def waiting_for(wchan: str) -> str:
    """What a wait channel means, in words; "" for one not in WAITS."""
    return next((meaning for prefix, meaning in WAITS if wchan.startswith(prefix)), "")


def frame_labels(stuck: tuple[Stuck, ...]) -> tuple[str, str] | None:
    """(function, file) for `llmstartup_unit_stuck_frame_info`: the busiest group's innermost Python frame,
    or, where no stack was read, its kernel wait with file `[kernel]`; None when neither is known."""
    if not stuck:
        return None
    top = stuck[0]
    if top.frames:
        return top.frames[0].function, top.frames[0].file
    return (top.wchan, "[kernel]") if top.wchan else None
