"""Hostile and broken input against the real agent, in the tests' real journald namespace.

- A local user forging PID 1's lifecycle entries (native protocol, `UNIT=` + systemd's MESSAGE_IDs,
  even `_PID=1`) changes nothing: journald stamps the trusted fields itself, the agent believes them only.
- A unit printing 1 MiB lines, binary and invalid UTF-8, ANSI and `\\r` storms, and lines that once
  broke the parsers: the agent follows the real markers after them and /metrics stays valid.
- A flood past journald's rate limit: the agent still reaches the marker printed after it, and counts
  the lines journald's `Suppressed N messages` notices say it dropped.
- Thousands of short-lived processes and reused pids in a unit's cgroup: no exception, sane counts,
  and the churn counts as movement (silent_progress, never stalled).
- The agent run as `nobody`: the journal source is down with a clear log line, the process source is
  up, I/O counters are unreadable, and /metrics keeps answering.

Waiting is always polling with a deadline; everything started is stopped at teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from exporter.shell.demo import sandbox
from exporter.core.entries import LIFECYCLE_IDS
from tests.needs import missing
from tests.scrape import INTERVAL, SILENCE, STALL, Scrape, fetch, free_port, try_fetch, wait_for

NOBODY = 65534
SUPPRESSED = "a596d6fe7bfa4994828e72309e95d61e"  # SD_MESSAGE_JOURNAL_DROPPED: "Suppressed N messages from UNIT"

# The vLLM markers the units print after the hostile part, bare (vLLM's prefix is optional in the grammar).
LAUNCH = "vLLM API server version 0.11.0"
LOAD = "Starting to load model Qwen/Qwen3-8B..."
LOADED = "Model loading took 15.27 GiB and 2.10 seconds"
COMPILE = "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone for vLLM's torch.compile"
COMPILED = "torch.compile takes 12.40 s in total"
KV_CACHE = "GPU KV cache size: 412,336 tokens"

# A unit program driven by a JSON plan, writing raw bytes to its stdout (the journal stream): the
# scripted vLLM unit (exporter.shell.demo.vllm_startup) writes text only, through a UTF-8 TextIO.
PROGRAM = r'''
import json, os, random, signal, sys, time

def out(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]

def flood(rate, seconds):
    start, sent = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        out(b"".join(b"flood line %d of a unit that logs far too much\n" % (sent + k) for k in range(500)))
        sent += 500
        ahead = start + sent / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    return sent

def churn(total, seconds, report):
    """`total` children that exit at once, spread over `seconds`; meanwhile, a longer-lived child
    (1.1 s, so that samples see it) whose pid is taken again at once by the next one, through
    /proc/sys/kernel/ns_last_pid: the same pid, another process."""
    start, forked, reused, tries, long_child = time.monotonic(), 0, 0, 0, None

    def spawn_long(want=None):
        nonlocal reused, tries
        if want is not None:
            tries += 1
            try:
                with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                    f.write(str(want - 1))
            except OSError:
                pass
        pid = os.fork()
        if pid == 0:
            time.sleep(1.1)
            os._exit(0)
        reused += pid == want
        return pid

    long_child = spawn_long()
    while forked < total:
        due = start + seconds * forked / total
        if time.monotonic() >= due:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            forked += 1
        else:
            time.sleep(max(0.0, min(0.002, due - time.monotonic())))
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == long_child:
                long_child = spawn_long(want=pid)
    os.waitpid(long_child, 0)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    with open(report + ".tmp", "w") as f:
        json.dump({"forked": forked, "reused": reused, "tries": tries}, f)
    os.rename(report + ".tmp", report)

def busy(seconds):
    """CPU and reads (rchar) for `seconds`, silently."""
    end = time.monotonic() + seconds
    with open("/dev/zero", "rb", buffering=0) as zero:
        while time.monotonic() < end:
            zero.read(1 << 20)

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
for step in json.load(open(sys.argv[1])):
    if "line" in step:
        out(step["line"].encode() + b"\n")
    elif "hex" in step:
        out(bytes.fromhex(step["hex"]))
    elif "fill" in step:  # `size` bytes of the piece repeated, then a newline
        piece = bytes.fromhex(step["fill"])
        out((piece * (step["size"] // len(piece) + 1))[: step["size"]] + b"\n")
    elif "sleep" in step:
        time.sleep(step["sleep"])
    elif "flood" in step:
        flood(step["flood"], step["seconds"])
    elif "every" in step:  # forever
        while True:
            out(step["every"].encode() + b"\n")
            time.sleep(step["seconds"])
    elif "churn" in step:
        churn(step["churn"], step["seconds"], step["report"])
    elif "busy" in step:
        busy(step["busy"])
    elif "hang" in step:
        while True:
            signal.pause()
'''


def _line(text: str) -> dict[str, Any]:
    """A step of PROGRAM: the text as one line, bare."""
    return {"line": text}


def _log(text: str) -> dict[str, Any]:
    """A step of exporter.shell.demo.vllm_startup (the `units` fixture): logged with vLLM's own prefix."""
    return {"log": text}


@pytest.fixture
def program_units(journald: sandbox.Journald, tmp_path: Path) -> Iterator[Callable[..., sandbox.Unit]]:
    """`start(suffix, plan) -> Unit`: run PROGRAM with a plan as a unit; stopped at teardown.
    `start.name(suffix)` is the unit's name, known before it starts (for an agent started first)."""
    program = tmp_path / "unit_program.py"
    program.write_text(PROGRAM)
    prefix = f"hostile-{uuid.uuid4().hex[:6]}"
    started: list[sandbox.Unit] = []

    def start(suffix: str, plan: list[dict[str, Any]]) -> sandbox.Unit:
        path = tmp_path / f"plan-{suffix}-{len(started)}.json"
        path.write_text(json.dumps(plan))
        unit = sandbox.start_unit(journald, name(suffix), [sys.executable, str(program), str(path)])
        started.append(unit)
        return unit

    def name(suffix: str) -> str:
        return f"{prefix}-{suffix}.service"

    start.name = name  # type: ignore[attr-defined]
    yield start
    for unit in reversed(started):
        unit.stop()


def _scrape(port: int) -> Scrape:
    return Scrape(fetch(port))


def _phase_reaches(port: int, unit: str, phase: str) -> Callable[[], Scrape | None]:
    def check() -> Scrape | None:
        s = _scrape(port)
        return s if s.one_of("unit_phase", unit, "phase") == phase else None

    return check


def _promtool(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by .ci/setup (Debian package prometheus)"
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _agent_log(tmp_path: Path, n: int = 0) -> str:
    return (tmp_path / f"agent-{n}.log").read_text(errors="replace")


def _state(journald: sandbox.Journald, unit: sandbox.Unit) -> str:
    """What a stuck test needs to know: is journald up (a namespace's journald exits after 30 s with no
    stream connected), is the unit alive, and what it said last."""
    said = [str(e.get("MESSAGE", ""))[:200] for e in unit.records()][-10:]
    return (f"journald running: {journald.running}; unit exit status: {unit.process.poll()}; "
            f"the unit's last lines: {said}")


def _no_traceback(log: str) -> None:
    assert "Traceback" not in log, "the agent logged an exception:\n" + log[-4000:]
    assert "journal reader died" not in log, "the journal reader process died:\n" + log[-4000:]


# ---- forged lifecycle entries -----------------------------------------------------------------------


def _native(fields: dict[str, str]) -> bytes:
    """journald's native protocol: `KEY=value\\n` per field (single-line values)."""
    return "".join(f"{k}={v}\n" for k, v in fields.items()).encode()


def _forgeries(unit: str) -> list[dict[str, str]]:
    """Every lifecycle MESSAGE_ID the agent believes from PID 1, about `unit`, with a text and result
    that would fail it, a new invocation that would restart it, and the trusted fields forged too."""
    messages = {
        "Main process exited, code=killed, status=9/KILL": "",
        "Failed with result 'oom-kill'.": "oom-kill",
    }
    out = []
    for message_id in LIFECYCLE_IDS:
        for message, result in messages.items():
            out.append({
                "MESSAGE_ID": message_id, "UNIT": unit, "MESSAGE": message, "UNIT_RESULT": result,
                "INVOCATION_ID": uuid.uuid4().hex, "SYSLOG_IDENTIFIER": "systemd",
                # trusted fields: journald drops what a client sends for them and writes its own
                "_PID": "1", "_SYSTEMD_UNIT": unit, "_TRANSPORT": "kernel", "_UID": "0",
            })
    # and a kernel Xid line, which the agent believes only with _TRANSPORT=kernel
    out.append({"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
                "_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel"})
    return out


SEND = r'''
import socket, sys
path = sys.argv[1]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for datagram in sys.stdin.buffer.read().split(b"\0\0"):
        if datagram:
            s.sendto(datagram, path)
'''


def test_forged_lifecycle_entries_from_a_local_user_change_nothing(agent, units, journald, tmp_path) -> None:
    victim = units("victim", [*map(_log, (LAUNCH, LOAD, LOADED, COMPILE)), {"hang": True}])
    sentinel_name = victim.name.replace("victim", "sentinel")
    port = agent(victim.name, sentinel_name)
    before = wait_for(_phase_reaches(port, victim.name, "compiling"), 20, "the victim to reach compiling")
    started = before.value("llmstartup_startup_start_timestamp_seconds", unit=victim.name)

    socket_path = str(journald.runtime_dir / "socket")
    forged = _forgeries(victim.name)
    # from this process (root, not PID 1) ...
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for fields in forged:
            s.sendto(_native(fields), socket_path)
    # ... and from an unprivileged local user
    python, env = _nobody_python()
    nobody = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", SEND, socket_path],
        input=b"\0\0".join(_native(f) for f in forged), env=env, capture_output=True, timeout=30,
    )
    assert nobody.returncode == 0, nobody.stderr.decode(errors="replace")

    # journald took them all, and stamped its own trusted fields
    def stored() -> list[dict[str, Any]] | None:
        reader = journald.reader(UNIT=victim.name)
        try:
            entries = [e for e in reader if "MESSAGE_ID" in e]
        finally:
            reader.close()
        return entries if len(entries) >= 2 * (len(forged) - 1) else None

    entries = wait_for(stored, 15, "journald to store the forged entries")
    assert {str(e.get("_PID")) for e in entries}.isdisjoint({"1"})
    assert {e.get("_UID") for e in entries} == {0, NOBODY}
    assert all(e.get("_TRANSPORT") == "journal" for e in entries)

    # A marker of another unit, written after the forgeries: once the agent shows it, the journal
    # reader has read past them, and the round that folded them is over.
    units("sentinel", [_log(LAUNCH), {"hang": True}])
    after = wait_for(_phase_reaches(port, sentinel_name, "launching"), 20, "the agent to read past the forgeries")
    assert after.one_of("unit_phase", victim.name, "phase") == "compiling"
    assert after.one_of("unit_verdict", victim.name, "verdict") not in ("failed", "inactive", "ready")
    # the same start (the wall-clock offset the agent adds is re-read every round: sub-millisecond drift)
    assert after.value("llmstartup_startup_start_timestamp_seconds", unit=victim.name) == pytest.approx(started, abs=0.2)
    for outcome in ("ready", "failed", "stopped"):
        assert after.value("llmstartup_startups_total", unit=victim.name, outcome=outcome) == 0
    assert after.all("llmstartup_failures_total", unit=victim.name) == []
    assert after.all("llmstartup_gpu_xid_errors_total") == []
    _no_traceback(_agent_log(tmp_path))


# ---- hostile output -----------------------------------------------------------------------------------

MiB = 2**20


def _hostile_output() -> list[dict[str, Any]]:
    ansi = "".join(f"\x1b[{i % 108};{i % 7}m{chr(0x41 + i % 26)}" for i in range(20000)) + "\x1b[0m\x1b[" * 1000
    return [
        {"fill": b"A".hex(), "size": MiB},  # 1 MiB in one line: journald cuts it at LineMax (48 KiB)
        {"fill": bytes(range(256)).hex(), "size": MiB},  # binary: NULs, invalid UTF-8, every control
        {"hex": b"\xff\xfe\xc3\x28 invalid \xa0\xa1 UTF-8 \xed\xa0\x80 surrogate \xf8\x88\x80\x80\x80\n".hex()},
        {"hex": ("\x1b[31m" * 5000 + "colour storm\n").encode().hex()},
        {"hex": (ansi + "\n").encode().hex()},
        {"hex": ("\r" * 100000 + "carriage storm\n").encode().hex()},
        {"hex": ("".join(f"\rLoading: {i % 100:3d}%|{'#' * (i % 10):<10}| {i}/100000 [00:{i % 60:02d}<00:01, 9.99it/s]"
                         for i in range(20000)) + "\n").encode().hex()},
        # lines that broke the parsers before (tests/test_fuzz.py): an elapsed time past float's range
        # (killed the journal reader on every restart), value groups float() refuses (an agent round
        # raised), a value past float's range (+Inf)
        {"hex": ("Loading: [00:00<\r[" + "9" * 400 + ":00:00<\n").encode().hex()},
        {"line": "Model loading took 1.2.3 GiB and . seconds"},
        {"line": "GPU KV cache size: , tokens"},
        {"line": "Using max model len " + "9" * 400},
        {"hex": b"\x00\x00\x00 NUL-led line\n".hex()},
    ]


def test_hostile_output_is_followed_and_metrics_stay_valid(agent, program_units, journal_records, tmp_path) -> None:
    plan = [_line(LAUNCH), *_hostile_output(), _line(LOAD), _line(LOADED), _line(COMPILE), _line(COMPILED),
            _line(KV_CACHE), {"hang": True}]
    port = agent(program_units.name("out"))  # following live, as the unit writes
    unit = program_units("out", plan)
    journal_records(unit, until=lambda es: any(KV_CACHE in str(e.get("MESSAGE", "")) for e in es), timeout=60)
    final = wait_for(_phase_reaches(port, unit.name, "allocating_kv_cache"), 60,
                     "the agent to follow the markers printed after the hostile output")
    assert final.value("llmstartup_kv_cache_tokens", unit=unit.name) == 412336
    assert final.value("llmstartup_model_weights_bytes", unit=unit.name) == pytest.approx(15.27 * 2**30)
    assert final.value("llmstartup_engine_weights_load_seconds", unit=unit.name) == pytest.approx(2.10)
    assert final.value("llmstartup_source_up", source="journal") == 1
    assert final.value("llmstartup_startups_total", unit=unit.name, outcome="failed") == 0
    _promtool(final.text)
    _no_traceback(_agent_log(tmp_path))


# ---- flood ----------------------------------------------------------------------------------------------

FLOOD_RATE, FLOOD_SECONDS = 100_000, 3.0
# The unit gets LogRateLimitIntervalSec=2s and LogRateLimitBurst=1000 the way systemd hands them to
# journald (symlinks in /run/systemd/units/, like the invocation id; journald scales the burst up with
# the free disk space). journald's default interval is 30 s, and a marker printed inside the interval
# after the burst is spent is dropped like the flood, so with the default the test would wait 30 s.
RATE_LIMIT_INTERVAL_USEC, RATE_LIMIT_BURST = 2_000_000, 1000
FLOOD_DEADLINE = 20.0  # seconds from the marker after the flood being in the journal to the agent showing it


@pytest.fixture
def rate_limited() -> Iterator[Callable[[str], None]]:
    links: list[Path] = []

    def limit(unit: str) -> None:
        sandbox.UNITS_DIR.mkdir(parents=True, exist_ok=True)
        for key, value in (("interval", RATE_LIMIT_INTERVAL_USEC), ("burst", RATE_LIMIT_BURST)):
            link = sandbox.UNITS_DIR / f"log-rate-limit-{key}:{unit}"
            link.unlink(missing_ok=True)
            link.symlink_to(str(value))
            links.append(link)

    yield limit
    for link in links:
        link.unlink(missing_ok=True)


def _flood(agent, program_units, rate_limited, journal_records, seconds: float) -> tuple[sandbox.Unit, int]:
    """A unit at loading_weights floods for `seconds`, then prints the compile marker every 0.5 s;
    returns once the journal holds that marker, with the unit and the agent's port."""
    name = program_units.name("flood")
    rate_limited(name)
    port = agent(name)
    unit = program_units("flood", [_line(LAUNCH), _line(LOAD), _line(LOADED), {"flood": FLOOD_RATE, "seconds": seconds},
                                   {"every": COMPILE, "seconds": 0.5}])
    wait_for(_phase_reaches(port, name, "loading_weights"), 20, "the unit to reach loading_weights before its flood")
    journal_records(unit, until=lambda es: any(COMPILE in str(e.get("MESSAGE", "")) for e in es), timeout=seconds + 30)
    return unit, port


def _suppressed(journald: sandbox.Journald, unit: str) -> list[dict[str, Any]]:
    reader = journald.reader(MESSAGE_ID=SUPPRESSED)
    try:
        return [e for e in reader if e.get("OBJECT_SYSTEMD_UNIT") == unit]
    finally:
        reader.close()


def test_a_flood_past_the_rate_limit_is_kept_up_with(agent, program_units, rate_limited, journal_records, journald,
                                                      tmp_path) -> None:
    unit, port = _flood(agent, program_units, rate_limited, journal_records, FLOOD_SECONDS)
    final = wait_for(_phase_reaches(port, unit.name, "compiling"), FLOOD_DEADLINE,
                     "the agent to reach the marker printed after the flood")
    assert final.value("llmstartup_source_up", source="journal") == 1
    assert final.value("llmstartup_startups_total", unit=unit.name, outcome="failed") == 0
    _promtool(final.text)
    _no_traceback(_agent_log(tmp_path))

    # journald's notice, as it is in a namespace: a driver message of journald itself, naming the unit
    # in OBJECT_SYSTEMD_UNIT (never _SYSTEMD_UNIT, so the agent does not take it for the unit's line).
    notices = wait_for(lambda: _suppressed(journald, unit.name), 10, "journald's 'Suppressed N messages' notice")
    for notice in notices:
        dropped = int(notice["N_DROPPED"])
        assert dropped > 0
        assert notice["MESSAGE"] == f"Suppressed {dropped} messages from {unit.name}"
        assert notice["_TRANSPORT"] == "driver"
        assert notice["SYSLOG_IDENTIFIER"] == "systemd-journald"
        assert notice["OBJECT_SYSTEMD_INVOCATION_ID"] == unit.invocation
        assert notice.get("_SYSTEMD_UNIT") != unit.name
    assert sum(int(n["N_DROPPED"]) for n in notices) > FLOOD_RATE * FLOOD_SECONDS / 2


def test_suppressed_lines_are_counted(agent, program_units, rate_limited, journal_records, journald) -> None:
    """journald's `Suppressed N messages from UNIT` notices (MESSAGE_ID a596d6fe…, _TRANSPORT=driver,
    N_DROPPED=N, OBJECT_SYSTEMD_UNIT=UNIT), summed per unit. (Written as a strict xfail before the
    counting existed; it passes since llmstartup_journal_suppressed_lines_total was added.)"""
    unit, port = _flood(agent, program_units, rate_limited, journal_records, 2.0)
    wait_for(lambda: _suppressed(journald, unit.name), 10, "journald's 'Suppressed N messages' notice")

    def counted() -> bool:
        dropped = sum(int(n["N_DROPPED"]) for n in _suppressed(journald, unit.name))
        return _scrape(port).value("llmstartup_journal_suppressed_lines_total", unit=unit.name) == dropped

    wait_for(counted, 10, "llmstartup_journal_suppressed_lines_total to count journald's N_DROPPED")


# ---- process churn and pid reuse ------------------------------------------------------------------------

CHURN_CHILDREN, CHURN_SECONDS = 2000, 14.0  # longer than the silence and stall thresholds together


def test_process_churn_and_pid_reuse_count_as_movement(agent, program_units, journald, tmp_path) -> None:
    report = tmp_path / "churn.json"
    name = program_units.name("churn")
    port = agent(name)
    unit = program_units("churn", [_line(LAUNCH), _line(LOAD), _line(LOADED), _line(COMPILE),
                                   {"churn": CHURN_CHILDREN, "seconds": CHURN_SECONDS, "report": str(report)}, {"hang": True}])
    first = wait_for(_phase_reaches(port, name, "compiling"), 20, "the unit to reach compiling before its churn")
    started = first.value("llmstartup_startup_start_timestamp_seconds", unit=name)
    seen: list[tuple[float, Scrape]] = []
    deadline = time.monotonic() + CHURN_SECONDS + 40
    while not report.exists():  # the unit writes it when the churn is over
        assert unit.process.poll() is None and time.monotonic() < deadline, f"the churn did not end: {_state(journald, unit)}"
        seen.append((time.time(), _scrape(port)))
        time.sleep(0.25)
    churn = json.loads(report.read_text())
    assert churn["forked"] == CHURN_CHILDREN
    if churn["tries"]:
        assert churn["reused"] >= 1, f"no pid was reused: {churn}"

    verdicts = [s.one_of("unit_verdict", name, "verdict") for _, s in seen]
    assert "stalled" not in verdicts, verdicts
    assert "silent_progress" in verdicts, verdicts
    # the processes signal is what moved: within the stall threshold of every silent_progress scrape
    for wall, s in seen:
        if s.one_of("unit_verdict", name, "verdict") == "silent_progress":
            moved = s.value("llmstartup_last_progress_timestamp_seconds", unit=name, signal="processes")
            assert moved is not None and wall - moved < STALL, (wall, moved)
    totals = []
    for _, s in seen:
        assert s.one_of("unit_phase", name, "phase") == "compiling", "the churn was taken for a restart"
        assert s.value("llmstartup_startup_start_timestamp_seconds", unit=name) == pytest.approx(started, abs=0.2)
        counts = {x.labels["state"]: x.value for x in s.all("llmstartup_processes", unit=name)}
        assert counts.keys() == {"running", "sleeping", "disk_sleep", "zombie", "stopped"}, counts
        assert all(c == int(c) for c in counts.values()), counts
        totals.append(sum(counts.values()))
        for outcome in ("ready", "failed", "stopped"):
            assert s.value("llmstartup_startups_total", unit=name, outcome=outcome) == 0
    # the churning parent is always there, children that exit at once are few at a time, and the 1.1 s
    # child is seen beside the parent
    assert min(totals) >= 1 and max(totals) <= 100 and max(totals) >= 2, totals
    _promtool(seen[-1][1].text)
    _no_traceback(_agent_log(tmp_path))


# ---- the agent as an unprivileged user -------------------------------------------------------------------


def _nobody_python() -> tuple[str, dict[str, str]]:
    """An interpreter `nobody` can run the exporter with, and its environment.

    This interpreter first; on hosts where it lives in a directory nobody may enter (pyenv under
    /root, 0700), the system's python of the same version (same ABI, so the venv's compiled
    packages load) with the checkout and the venv's site-packages on PYTHONPATH. Both read the
    checkout in place: it is world-readable. Skips with the reasons when neither works.
    """
    import site

    repo = str(Path(__file__).resolve().parent.parent)
    base = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/nonexistent"}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [(sys.executable, base)]
    system = shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin:/bin")
    if system:
        candidates.append((system, {**base, "PYTHONPATH": os.pathsep.join([repo, *site.getsitepackages()])}))
    if not shutil.which("setpriv"):
        missing("setpriv (Debian package util-linux), to run the agent as nobody")
    # The agent starts its journal reader by running sys.executable again, now as nobody: the probe does
    # too. (setpriv execs its command before it drops every capability, so a path nobody may not resolve
    # can start once, and then its child dies with status 255.)
    probe_code = (
        "import subprocess, sys; import exporter.shell.runtime, systemd.journal, psutil; "
        "sys.exit(subprocess.call([sys.executable, '-c', 'import exporter.shell.runtime, systemd.journal, psutil']))"
    )
    why = []
    for python, env in candidates:
        probe = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", probe_code],
            cwd=repo, env=env, capture_output=True, text=True, timeout=60,
        )
        if probe.returncode == 0:
            return python, env
        why.append(f"{python}: {probe.stderr.strip().splitlines()[-1:] or probe.returncode}")
    pytest.skip("nobody cannot run the exporter: " + "; ".join(map(str, why)))


@pytest.fixture
def nobody_agent(journald: sandbox.Journald, tmp_path: Path) -> Iterator[Callable[[str], tuple[int, Path]]]:
    """`start(unit) -> (port, log)`: `llmstartup serve` as nobody (uid and gid 65534, no groups), with
    --state.path in a directory nobody may not write. SIGTERM at teardown must stop it cleanly."""
    python, env = _nobody_python()
    private = Path(tempfile.mkdtemp(prefix="llmstartup-root-only-"))  # 0700, root's
    started: list[subprocess.Popen] = []

    def start(unit: str) -> tuple[int, Path]:
        port = free_port()
        log = tmp_path / f"nobody-agent-{len(started)}.log"
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                python, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
                "--web.listen-address", f"127.0.0.1:{port}", "--sample.interval", f"{INTERVAL:g}s",
                "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s", "--no-collector.gpu",
                "--state.path", str(private / "state.db"), "--unit", unit]
        with open(log, "w") as out:
            started.append(subprocess.Popen(argv, stdout=out, stderr=out, env=env,
                                            cwd=Path(__file__).resolve().parent.parent))
        wait_for(lambda: try_fetch(port) or started[-1].poll() is not None, 30, "the agent (as nobody) to serve /metrics")
        assert started[-1].poll() is None, "the agent run as nobody exited:\n" + log.read_text()
        return port, log

    yield start
    try:
        for process in started:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0, "the agent run as nobody did not stop cleanly on SIGTERM"
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(private, ignore_errors=True)


def test_the_agent_as_nobody_reports_what_it_cannot_read(nobody_agent, program_units) -> None:
    name = program_units.name("watched")
    unit = program_units("watched", [_line(LAUNCH), {"busy": 120}])
    port, log = nobody_agent(name)

    def settled() -> Scrape | None:
        s = _scrape(port)
        ok = (s.value("llmstartup_source_up", source="journal") == 0
              and s.value("llmstartup_source_up", source="processes") == 1
              and (s.value("llmstartup_process_cpu_seconds_total", unit=name) or 0) > 0.5
              and "journal source down" in log.read_text())
        return s if ok else None

    final = wait_for(settled, 30, "journal down, processes up, the unit's CPU read, and the agent saying why")
    text = log.read_text()
    down = [line for line in text.splitlines() if "journal source down" in line]
    assert len(down) == 1, "a source going down is logged once, not every retry:\n" + text
    assert "no journal files can be read" in down[0] and "systemd-journal" in down[0], down[0]
    assert "Traceback" not in text, text
    # the process side works from the cgroup (world-readable): the unit is seen starting
    assert final.one_of("unit_phase", name, "phase") == "launching"
    assert sum(x.value for x in final.all("llmstartup_processes", unit=name)) >= 1
    # /proc/<pid>/io of root's processes is not nobody's to read: no bytes are claimed
    assert final.value("llmstartup_process_read_bytes_total", unit=name) == 0
    # the agent's own process metrics, read from its /proc/self as nobody
    assert 3 <= final.value("llmstartup_exporter_process_open_fds") < final.value("llmstartup_exporter_process_max_fds")
    assert final.value("llmstartup_exporter_process_resident_memory_bytes") > 0
    _promtool(final.text)
    assert unit.running


def test_the_agent_as_nobody_says_io_counters_are_unavailable(nobody_agent, program_units) -> None:
    name = program_units.name("reader")
    program_units("reader", [_line(LAUNCH), {"busy": 120}])
    port, log = nobody_agent(name)
    wait_for(lambda: (_scrape(port).value("llmstartup_process_cpu_seconds_total", unit=name) or 0) > 0.5, 30,
             "the unit's CPU to be read")
    s = _scrape(port)
    # /proc/<pid>/io of root's processes is not nobody's to read: no bytes are claimed, and the log says so once
    assert s.value("llmstartup_process_read_bytes_total", unit=name) == 0
    assert s.value("llmstartup_process_written_bytes_total", unit=name) == 0
    said = [line for line in log.read_text().splitlines() if "cannot read /proc/<pid>/io" in line]
    assert len(said) == 1 and name in said[0] and "CAP_SYS_PTRACE" in said[0], log.read_text()
