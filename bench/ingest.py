"""1. Journal ingest: the agent's per-entry path against `journalctl -o cat` over one 300k-entry journal file.

The file is built once per run by systemd-journal-remote from an export-format stream (deterministic:
a fixed seed, fixed timestamps, this boot's id so that `this_boot()` keeps every entry). It holds what
a GPU host's journal holds: four vLLM units (the watched ones) starting every few thousand lines
with the demo's real-format startup — banner, config, a `\\r` CUDA-graph bar, a shard bar — then
serving (uvicorn access lines and the engine's stats line), PID 1's lifecycle lines for each start,
and about 10% of other units' and the kernel's lines. Every watched line goes through the whole
vLLM grammar (38 rules); an access line matches none, so it is the worst case, and the most common.

(a) `journalctl --file FILE -o cat > /dev/null`, the reference: C, reading MESSAGE only.
(b) a first start's reading, in this process: exporter.sources.journal_catchup for the four units, up to the
    file's last entry (the agent runs it in a fork of its reader child), then the fold of what it hands
    over, which must come out as (c)'s does. Beside it, the floor: libsystemd's `next`, MESSAGE and time
    for each of the units' lines through the unit's match, and nothing else.
(c) the live path, in this process: a Reader on the file's folder with `this_boot()`, as the Follower opens
    it, then per entry `_entry(reader)`, `reader._get_realtime()`, `to_observations(fields, t,
    units)`, and `advance(state, obs, vllm_grammar, limits)` for each observation: the Follower's
    loop and the agent's fold, without the pipe between them (reported apart: pickling each
    1000-observation batch both ways, as the pipe does).
"""

from __future__ import annotations

import functools
import pickle
import random
import re
import statistics
import struct
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from bench.common import Row, demo_records, say, write_journal

ENTRIES = 300_000
UNITS = ("vllm-llama70b.service", "vllm-qwen3.service", "vllm-glm.service", "vllm-embed.service")
OTHERS = ("cron.service", "ssh.service", "systemd-logind.service", "containerd.service")
SERVING = 3000  # watched lines of serving between two starts of a unit
REALTIME0 = 1_764_400_000_000_000  # µs; fixed so that the file is the same every run
MONOTONIC0 = 5_000_000_000
MACHINE_ID = "0f3c5e8a9b2d4c6e8f1a2b3c4d5e6f70"
STARTED = "39f53479d3a045ac8e11786248231fbf"
STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
STOPPED = "7ad2d189f7e94e70a38c781354912448"


API_PID, ENGINE_PID = "<api-pid>", "<engine-pid>"
LOG_CLOCK = re.compile(r" \d\d-\d\d \d\d:\d\d:\d\d ")


@functools.lru_cache(maxsize=1)
def _startup_template() -> tuple[str, ...]:
    """The demo scenario's lines as vLLM 0.11 prints them, one journal entry each (split at \\n),
    with placeholders for the pids and a fixed clock."""
    return tuple(LOG_CLOCK.sub(" 11-29 07:06:40 ", line) for _, line in demo_records(API_PID, ENGINE_PID))


def _startup_records(api_pid: int, engine_pid: int) -> list[str]:
    api, engine = str(api_pid), str(engine_pid)
    return [line.replace(API_PID, api).replace(ENGINE_PID, engine) for line in _startup_template()]


def _serving_record(rng: random.Random, api_pid: int, clock: str) -> str:
    roll = rng.random()
    if roll < 0.85:
        path = rng.choice(("/v1/chat/completions", "/v1/completions", "/v1/chat/completions", "/health"))
        # from a gateway's pool of kept-alive connections: the same client address and port recur,
        # which keeps the file's distinct data objects under what one journal file's hash table takes
        return (f'(APIServer pid={api_pid}) INFO:     10.0.3.{rng.randrange(8)}:{41000 + rng.randrange(64)} - '
                f'"POST {path} HTTP/1.1" 200 OK')
    if roll < 0.97:
        return (f"(APIServer pid={api_pid}) INFO {clock} [loggers.py:127] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(0, 9000):.1f} tokens/s, Avg generation throughput: {rng.uniform(0, 2000):.1f} "
                f"tokens/s, Running: {rng.randrange(64)} reqs, Waiting: {rng.randrange(8)} reqs, GPU KV cache "
                f"usage: {rng.uniform(0, 90):.1f}%, Prefix cache hit rate: {rng.uniform(0, 80):.1f}%")
    return (f"(APIServer pid={api_pid}) WARNING {clock} [protocol.py:93] The following fields were present "
            f"in the request but ignored: {{'stream_options'}}")


def _other_record(rng: random.Random) -> tuple[str, str, str]:
    """(unit or "kernel", identifier, message) of the rest of the host."""
    unit = rng.choice((*OTHERS, "kernel"))
    if unit == "kernel":
        return unit, "kernel", rng.choice((
            (f"audit: type=1400 audit({rng.randrange(10**9)}.{rng.randrange(1000):03d}:{rng.randrange(10**5)}): "
             'apparmor="DENIED" operation="open" profile="snap.x" name="/proc/1/environ"'),
            f"nvidia-nvswitch{rng.randrange(4)}: open (major=510)",
            f"eth0: renamed from veth{rng.randrange(16**7):07x}",
        ))
    if unit == "cron.service":
        return unit, "CRON", f"(root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1) [{rng.randrange(99999)}]"
    if unit == "ssh.service":
        return unit, "sshd", f"Accepted publickey for ops from 10.1.{rng.randrange(256)}.{rng.randrange(256)} port {rng.randrange(65536)} ssh2"
    if unit == "systemd-logind.service":
        return unit, "systemd-logind", f"New session {rng.randrange(99999)} of user ops."
    return unit, "containerd", f'time="2025-11-29T20:01:02Z" level=info msg="loading plugin" id=io.containerd.{rng.randrange(99)}'


CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def _field(name: str, value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    if CONTROL.search(data):  # export format: binary-safe serialisation
        return name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return name.encode() + b"=" + data + b"\n"


def export_stream(entries: int = ENTRIES, seed: int = 8) -> Iterator[bytes]:
    """`journalctl -o export` of a busy GPU host's journal: `entries` entries, the same every time."""
    rng = random.Random(seed)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    pids = {unit: 4000 + 100 * i for i, unit in enumerate(UNITS)}
    pending: dict[str, list[str]] = {unit: [] for unit in UNITS}
    serving = {unit: SERVING for unit in UNITS}  # so that every unit starts at once
    invocation = {unit: "" for unit in UNITS}
    tick = 0

    statics: dict[tuple[str, str, int], bytes] = {}  # a unit's fields that only change with a start

    def entry(fields: dict[str, str | bytes], static: bytes = b"") -> bytes:
        nonlocal tick
        tick += 1
        realtime, monotonic = REALTIME0 + tick * 2000, MONOTONIC0 + tick * 2000  # 500 entries a second
        head = (f"__REALTIME_TIMESTAMP={realtime}\n__MONOTONIC_TIMESTAMP={monotonic}\n"
                f"_BOOT_ID={boot}\n_MACHINE_ID={MACHINE_ID}\n_HOSTNAME=gpu-node-17\n").encode()
        return head + static + b"".join(_field(k, v) for k, v in fields.items()) + b"\n"

    def pid1(unit: str, message_id: str, message: str, **extra: str) -> bytes:
        return entry({"PRIORITY": "6", "SYSLOG_FACILITY": "3", "SYSLOG_IDENTIFIER": "systemd", "_PID": "1",
                      "_UID": "0", "_GID": "0", "_COMM": "systemd", "_EXE": "/usr/lib/systemd/systemd",
                      "_CMDLINE": "/sbin/init", "_SYSTEMD_CGROUP": "/init.scope", "_SYSTEMD_UNIT": "init.scope",
                      "_SYSTEMD_SLICE": "-.slice", "_TRANSPORT": "journal", "CODE_FILE": "src/core/job.c",
                      "MESSAGE_ID": message_id, "UNIT": unit, "INVOCATION_ID": invocation[unit],
                      "MESSAGE": message, **extra})

    made = 0
    while made < entries:
        if rng.random() < 0.1:
            unit, identifier, message = _other_record(rng)
            fields: dict[str, str | bytes] = {"PRIORITY": "6", "SYSLOG_IDENTIFIER": identifier, "MESSAGE": message}
            if unit == "kernel":
                fields.update({"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "_SOURCE_MONOTONIC_TIMESTAMP": "1"})
            else:
                fields.update({"_PID": str(rng.randrange(300, 3000)), "_UID": "0", "_GID": "0",
                               "_COMM": identifier.lower(), "_TRANSPORT": "syslog",
                               "_SYSTEMD_CGROUP": f"/system.slice/{unit}", "_SYSTEMD_UNIT": unit,
                               "_SYSTEMD_SLICE": "system.slice", "_SYSTEMD_INVOCATION_ID": f"{zlib.crc32(unit.encode()):032x}"})
            yield entry(fields)
            made += 1
            continue
        unit = UNITS[rng.randrange(len(UNITS))]
        if not pending[unit]:
            if serving[unit] >= SERVING:  # stop and start again: a new invocation, a full startup
                if invocation[unit]:
                    yield pid1(unit, STOPPING, f"Stopping {unit} - vLLM...")
                    yield pid1(unit, STOPPED, f"{unit}: Deactivated successfully.")
                    made += 2
                invocation[unit] = f"{rng.getrandbits(128):032x}"
                pids[unit] += 7
                yield pid1(unit, STARTED, f"Started {unit} - vLLM.", JOB_TYPE="start", JOB_RESULT="done")
                made += 1
                serving[unit] = 0
                pending[unit] = _startup_records(pids[unit], pids[unit] + 1)
            else:
                clock = time.strftime("%m-%d %H:%M:%S", time.gmtime(REALTIME0 / 1e6 + tick / 500))
                pending[unit] = [_serving_record(rng, pids[unit], clock)]
                serving[unit] += 1
        pid = pids[unit] + (1 if pending[unit][0].startswith("(EngineCore") else 0)
        static = statics.get((unit, invocation[unit], pid))
        if static is None:
            fields = {"PRIORITY": "6", "SYSLOG_FACILITY": "3", "SYSLOG_IDENTIFIER": "vllm", "_PID": str(pid),
                      "_UID": "1000", "_GID": "1000", "_COMM": "vllm", "_EXE": "/usr/bin/python3.12",
                      "_CMDLINE": "/opt/vllm/bin/python3 /opt/vllm/bin/vllm serve",
                      "_SYSTEMD_CGROUP": f"/system.slice/{unit}", "_SYSTEMD_UNIT": unit,
                      "_SYSTEMD_SLICE": "system.slice", "_SYSTEMD_INVOCATION_ID": invocation[unit],
                      "_TRANSPORT": "stdout"}
            static = statics[(unit, invocation[unit], pid)] = b"".join(_field(k, v) for k, v in fields.items())
        yield entry({"MESSAGE": pending[unit].pop(0)}, static)
        made += 1


def build(folder: Path, entries: int = ENTRIES) -> list[Path]:
    """Write the journal into folder (alone, so that a Reader on the folder reads just it): one file,
    or more where journal-remote rotates."""
    write_journal(folder / "bench.journal", export_stream(entries))
    return sorted(folder.glob("*.journal"))


def journalctl(paths: list[Path]) -> float:
    started = time.perf_counter()
    argv = ["journalctl", *(f"--file={p}" for p in paths), "-o", "cat"]
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def ours(folder: Path, stage: str = "advance") -> tuple[float, int, dict[str, object], list[object]]:
    """The agent's per-entry path over the folder's journal: (seconds, entries, unit states, observations).

    stage "read": the Reader calls only; "observe": and to_observations (whose results are kept, for
    the pickling figure); "advance": the whole path, the headline figure.
    """
    from exporter.core import grammar
    from exporter.core.model import Limits, UnitState, XidError
    from exporter.core.entries import to_observations
    from exporter.sources.journal import JournalPlace, _entry, this_boot
    from exporter.core.tracker import advance

    vllm, limits, units = grammar.load("vllm"), Limits(), frozenset(UNITS)
    states: dict[str, UnitState] = {}
    kept: list[object] = []
    count = 0
    started = time.perf_counter()
    reader = JournalPlace(directory=folder).open()
    try:
        this_boot(reader)
        while reader._next():
            fields, t = _entry(reader)
            reader._get_realtime()
            count += 1
            if stage == "read":
                continue
            observations = to_observations(fields, t, units)
            if stage == "observe":
                kept += observations
                continue
            for obs in observations:
                if isinstance(obs, XidError):
                    continue
                state = states.get(obs.unit) or UnitState(obs.unit, "vllm")
                states[obs.unit] = advance(state, obs, vllm, limits)
    finally:
        reader.close()
    return time.perf_counter() - started, count, states, kept  # type: ignore[return-value]


def first_start(folder: Path) -> tuple[float, float, int, dict[str, object]]:
    """A first start's reading of the watched units' lines (exporter.sources.journal_catchup, in this process:
    the agent runs it in a fork of its reader child) up to the journal's last entry, and the fold of what it
    hands over: (seconds, of them folding, observations handed over, unit states)."""
    from exporter.core import grammar
    from exporter.core.model import Limits
    from exporter.sources.journal import JournalPlace, this_boot
    from exporter.sources.journal_catchup import CatchUp

    place = JournalPlace(directory=folder)
    handed: list[object] = []
    started = time.perf_counter()
    reader = place.open()
    try:
        this_boot(reader)
        reader.seek_tail()
        reader._previous()
        until = reader._get_cursor()  # where the live reader would stand
    finally:
        reader.close()
    catchup = CatchUp(place, grammar.worth_folding(), Limits().silence, lambda kind, payload: handed.extend(payload[0]))
    for unit in UNITS:
        catchup.read(unit, until)
    folding = time.perf_counter()
    states = fold(handed)
    done = time.perf_counter()
    return done - started, done - folding, len(handed), states


def fold(observations: list[object]) -> dict[str, object]:
    """The observations in the journal's order, as (c) folds them, each into its unit's state. (Not in time
    order, as the agent sorts a round's: this file's `\\r` bar, dated back by its 8 s elapsed, lands among
    starts printed milliseconds apart, which no real log does.)"""
    from exporter.core import grammar
    from exporter.core.model import Limits, UnitState, XidError
    from exporter.core.tracker import advance

    vllm, limits = grammar.load("vllm"), Limits()
    states: dict[str, UnitState] = {}
    for obs in observations:
        if not isinstance(obs, XidError):
            states[obs.unit] = advance(states.get(obs.unit) or UnitState(obs.unit, "vllm"), obs, vllm, limits)  # type: ignore[attr-defined]
    return states  # type: ignore[return-value]


def floor(folder: Path) -> tuple[float, int]:
    """What libsystemd itself costs the first start: each watched unit's lines through the unit's match, a
    `next`, the MESSAGE and the time of each, nothing else: (seconds, lines)."""
    from exporter.sources.journal import JournalPlace

    count = 0
    started = time.perf_counter()
    for unit in UNITS:
        reader = JournalPlace(directory=folder).open()
        try:
            reader.add_match(f"_SYSTEMD_UNIT={unit}")
            next_, get, monotonic = reader._next, reader._get, reader._get_monotonic
            while next_():
                monotonic()
                get("MESSAGE")
                count += 1
        finally:
            reader.close()
    return time.perf_counter() - started, count


def replay(paths: list[Path]) -> float:
    """`llmstartup replay FILE` end to end, as a user runs it: a fresh interpreter, the output discarded."""
    import sys

    started = time.perf_counter()
    for path in paths:
        subprocess.run([sys.executable, "-m", "exporter", "replay", str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def pipe_cost(observations: list[object]) -> float:
    """Seconds to pickle and unpickle the observations in batches of 1000, as the reader's pipe does."""
    started = time.perf_counter()
    for i in range(0, len(observations), 1000):
        pickle.loads(pickle.dumps(("lines", (observations[i:i + 1000], "s=0;i=1;b=0;m=0;t=0;x=0"))))
    return time.perf_counter() - started


def run(entries: int = ENTRIES, repeat: int = 3) -> list[Row]:
    say(f"== 1. journal ingest: {entries:,} entries, full vLLM grammar ==")
    with tempfile.TemporaryDirectory(prefix="llmstartup-bench-") as tmp:
        started = time.perf_counter()
        paths = build(Path(tmp), entries)
        say(f"built {len(paths)} journal file(s) with systemd-journal-remote in {time.perf_counter() - started:.1f} s "
            f"({sum(p.stat().st_size for p in paths) / 2**20:.0f} MiB)")
        for path in paths:
            path.read_bytes()  # into the page cache for both readers
        ref = statistics.median(journalctl(paths) for _ in range(repeat))
        replayed = statistics.median(replay(paths) for _ in range(repeat))
        first, folding, handed, first_states = min((first_start(Path(tmp)) for _ in range(repeat)),
                                                    key=lambda run: run[0])
        bare, watched = min((floor(Path(tmp)) for _ in range(repeat)), key=lambda run: run[0])
        took, count, states, _ = ours(Path(tmp))
        read, _, _, _ = ours(Path(tmp), "read")
        observe, _, _, observations = ours(Path(tmp), "observe")
        pickling = pipe_cost(observations)
    starts = sum(sum(s.startups.values()) for s in states.values())  # type: ignore[attr-defined]
    if count != entries:
        raise RuntimeError(f"read {count} entries of {entries}: this_boot() or the file lost some")
    if first_states != states:
        raise RuntimeError("a first start's reading folds to other states than reading every entry")
    lines = sum(1 for o in observations if type(o).__name__ == "LogLine")
    say(f"(a) journalctl --file FILE -o cat            {entries / ref:>10,.0f} entries/s  ({ref:.2f} s, median of {repeat})")
    say(f"(b) ours, a first start's reading            {entries / first:>10,.0f} entries/s  ({first:.2f} s, best of "
        f"{repeat}; {watched:,} watched lines, {handed:,} observations handed over and folded, {starts} starts; "
        "the same states as (c)'s)")
    say("    where the time goes:")
    say(f"      libsystemd: next, MESSAGE, time of each watched line {bare / entries * 1e6:6.2f} µs/entry  "
        f"({bare / watched * 1e6:.2f} µs a line, through the unit's match: the floor, best of {repeat})")
    say(f"      the rest: walk, screen, checks, Python               {(first - folding - bare) / entries * 1e6:6.2f} µs/entry")
    say(f"      folding what was handed over                         {folding / entries * 1e6:6.2f} µs/entry")
    first_ratio = ref / first
    say(f"ratio ours/journalctl: {first_ratio:.2f}x (goal ≥ 1.0x); the floor alone: {ref / bare:.2f}x")
    say(f"(c) live: _entry + to_observations + advance {entries / took:>10,.0f} entries/s  ({took:.2f} s; "
        f"{lines:,} watched lines): every entry, as the live reader and a restart after its checkpoint read")
    say("    where the time goes (separate passes):")
    say(f"      Reader: _next, _entry, _get_realtime             {read / entries * 1e6:6.2f} µs/entry")
    say(f"      to_observations                                  {(observe - read) / entries * 1e6:6.2f} µs/entry")
    say(f"      advance (grammar match + state update)           {(took - observe) / entries * 1e6:6.2f} µs/entry"
        f"  ({(took - observe) / max(lines, 1) * 1e6:.2f} µs per watched line)")
    say(f"      not in (c): the pipe's pickling, both ways       {pickling / entries * 1e6:6.2f} µs/entry")
    ratio = ref / took
    say(f"ratio ours/journalctl: {ratio:.2f}x")
    say(f"(d) llmstartup replay FILE, end to end       {replayed:.2f} s against journalctl's {ref:.2f} s: "
        f"{ref / replayed:.2f}x (goal ≥ 1.0x)")
    say()
    return [Row(f"journal ingest, a first start's reading, entries/s ({entries // 1000}k entries, full vLLM grammar)",
                f"{entries / first:,.0f}", f"{entries / ref:,.0f} (journalctl -o cat)", f"{first_ratio:.2f}x",
                "≥ 1.0x", first_ratio >= 1.0),
            Row("journal ingest, live (every entry made observations), entries/s", f"{entries / took:,.0f}",
                f"{entries / ref:,.0f} (journalctl -o cat)", f"{ratio:.2f}x", "", None),
            Row(f"`llmstartup replay` of that {entries // 1000}k-entry file", f"{replayed:.2f} s",
                f"{ref:.2f} s (`journalctl --file F -o cat`)", f"{ref / replayed:.2f}x", "≥ 1.0x", ref >= replayed)]
