"""Faults over a long run, as bench/soak.py finds them: a quiet new start, a small state volume, journald itself
stopped, and a minute of the soak: each with real units in a real journald namespace and the real agent."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time

from bench import soak
from exporter.shell.demo import sandbox
from exporter.shell.history import History
from tests.scrape import INTERVAL, SILENCE, Scrape, fetch, wait_for
from tests.test_journal_faults import _agents
from tests.test_operator import llmstartup
from tests.test_serve import CUDA_OOM, LOAD


def test_a_new_start_is_not_silent_for_the_start_befores_silence(agent, units, journal_records):
    """A start that prints nothing for 6 s (Python importing the engine), begun 10 s after the start before it said
    its last word: its silence counts from its own beginning, so its first silence threshold is no silence at all."""
    crashed = units("quiet", [*LOAD, {"exit": 1}])
    port = agent(crashed.name)
    crashed.wait(20)
    last = journal_records(crashed, until=lambda es: any("torch_compile_cache" in str(e.get("MESSAGE")) for e in es))
    said = last[-1]["__MONOTONIC_TIMESTAMP"].timestamp.total_seconds()
    crashed.stop()
    time.sleep(max(0.0, said + 10 - time.monotonic()))
    again = units("quiet", [{"sleep": 6}, *LOAD, {"hang": True}])
    seen = []
    while time.monotonic() < again.started + 6:
        scrape = Scrape(fetch(port))
        seen.append((round(time.monotonic() - again.started, 1), scrape.one_of("unit_verdict", again.name, "verdict")))
        time.sleep(0.2)
    early = [verdict for t, verdict in seen if t < SILENCE]
    assert "stalled" not in {v for _, v in seen}, seen
    assert "silent_progress" not in early, f"silent_progress in the start's first {SILENCE:g} s: {seen}"
    assert "progressing" in early, seen  # the new start, seen: its own silence has just begun


def _kind(steps, again_after: float = 0.5) -> soak.Kind:
    return soak.Kind(steps, again_after=again_after)


def test_the_state_fits_a_small_volume_and_keeps_every_start(agent, journald, tmp_path, small_disk):
    """Crash loops for a minute, the state on a 1 MiB tmpfs: the state stays under 0.9 MiB, every start that ended
    is in the history, and a new agent on the same state counts what the first one counted."""
    state = small_disk / "state.db"
    loops = []
    for name, steps in (("oom", CUDA_OOM), ("kv", [*soak.FIRST, {"traceback": soak.KV}, {"exit": 1}])):
        scenario = tmp_path / f"{name}.json"
        scenario.write_text(json.dumps(steps))
        loops.append(soak.Supervisor(journald, f"test-{secrets.token_hex(3)}-{name}.service", _kind(steps), scenario))
    port = agent(*(f"{loop.unit_name}=vllm" for loop in loops), args=("--state.path", str(state)))
    for loop in loops:
        loop.start()
    biggest = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        biggest = max(biggest, soak.used(small_disk))
        time.sleep(1)
    for loop in loops:
        loop.finishing.set()
    for loop in loops:
        loop.join(30)
    made = sum(len(loop.starts) for loop in loops)

    def counted(port: int) -> dict[str, float]:
        scrape = Scrape(fetch(port))
        return {loop.unit_name: scrape.value("llmstartup_startups_total", unit=loop.unit_name, outcome="failed")
                for loop in loops}

    first = wait_for(lambda: (c := counted(port)) and sum(c.values()) == made and c, 30, f"all {made} starts counted")
    assert biggest < 0.9 * 2**20, f"the state took {biggest / 1024:.0f} KiB on a 1 MiB volume"
    [serve] = [p for p in _agents() if str(port) in " ".join(p.cmdline())]
    serve.terminate()
    serve.wait(15)
    history = History(state, readonly=True)
    try:
        stored = {loop.unit_name: len(history.recent(loop.unit_name, limit=1000)) for loop in loops}
    finally:
        history.close()
    assert stored == first, "a start that ended is missing from the history (or is in it twice)"
    second = agent(*(f"{loop.unit_name}=vllm" for loop in loops), args=("--state.path", str(state)))
    assert counted(second) == first
    done = llmstartup(journald, "status", *(loop.unit_name for loop in loops), "--format", "json",
                      "--state.path", str(state))
    assert {d["unit"]: d["verdict"] for d in json.loads(done.stdout)} == dict.fromkeys(stored, "failed"), done.stderr
    assert soak.used(small_disk) < 0.9 * 2**20


FLOOD = """import os, socket, sys, time
print("INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0", flush=True)
# Its stream's buffer made small, so that it fills within a second of journald not reading, not after 8 MiB.
socket.socket(fileno=os.dup(1)).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
for n in range(100_000):
    print(f"(EngineCore_DP0 pid={os.getpid()}) INFO " + "x" * 200, flush=True)
time.sleep(3600)
"""
CHATTY = """import sys, time
print("INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0", flush=True)
for n in range(1_000_000):
    print(f"(EngineCore_DP0 pid=7) INFO 10-21 09:12:09 [gpu_model_runner.py:2602] Starting to load model {n}", flush=True)
    time.sleep(0.2)
"""


def test_journald_stopped_is_told_and_blames_no_unit(agent, journald, tmp_path):
    """journald SIGSTOPped for 30 s while a unit prints five lines a second: the journal source says so within 5 s;
    the unit is not stalled; a unit then blocked writing its output is located in that write."""
    flag = tmp_path / "flood"
    chatty = sandbox.start_unit(journald, f"test-{secrets.token_hex(3)}-chatty.service", [sys.executable, "-c", CHATTY])
    flood = sandbox.start_unit(journald, f"test-{secrets.token_hex(3)}-flood.service",
                               [sys.executable, "-c", FLOOD, str(flag)])
    try:
        port = agent(f"{chatty.name}=vllm", f"{flood.name}=vllm")
        wait_for(lambda: Scrape(fetch(port)).one_of("unit_verdict", chatty.name, "verdict") == "progressing", 20,
                 "the chatty unit progressing")
        stopped = time.monotonic()
        os.kill(journald.process.pid, signal.SIGSTOP)
        try:
            flag.touch()
            wait_for(lambda: Scrape(fetch(port)).value("llmstartup_source_up", source="journal") == 0, 5,
                     "source_up{source=\"journal\"} 0 within 5 s of journald stopping")
            verdicts, stuck = [], None
            while time.monotonic() < stopped + 30:
                scrape = Scrape(fetch(port))
                verdicts.append(scrape.one_of("unit_verdict", chatty.name, "verdict"))
                doc = {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}[flood.name]
                stuck = stuck or next((g for g in doc["stuck"] if g["wchan"] == "sock_alloc_send_pskb"), None)
                time.sleep(0.5)
            landing = fetch(port, "/")
        finally:
            os.kill(journald.process.pid, signal.SIGCONT)
        assert not {"stalled", "silent_progress"} & set(verdicts), verdicts
        assert "unknown" in verdicts, verdicts
        assert stuck is not None and "journald" in stuck["waiting_for"], "the blocked writer is not located in its write"
        assert "Source down: <b>journal</b>: journald (pid" in landing and "is stopped" in landing
        wait_for(lambda: Scrape(fetch(port)).value("llmstartup_source_up", source="journal") == 1, 15,
                 "the journal source up again once journald reads")
        log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
        assert f"journal source down: journald (pid {journald.process.pid}) is stopped" in log
    finally:
        chatty.stop()
        flood.stop()


LAST_WORDS = """import os, sys, time
print("INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0", flush=True)
print("INFO 10-21 09:12:09 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B...", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print("Traceback (most recent call last):", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.", flush=True)
sys.exit(1)
"""


def test_a_crash_while_journald_is_stopped_keeps_the_reason_its_lines_give(agent, journald, tmp_path):
    """A start that dies of a CUDA OOM while journald is stopped: its last words wait in journald's stream, the exit
    does not, and the failure is counted with the reason those words give once journald reads them, never as a bare
    exit (the principle of issue 29's first part: an exit settles a start only after the lines written before it)."""
    flag = tmp_path / "die"
    unit = sandbox.start_unit(journald, f"test-{secrets.token_hex(3)}-dies.service",
                              [sys.executable, "-c", LAST_WORDS, str(flag)])
    try:
        port = agent(f"{unit.name}=vllm")
        wait_for(lambda: Scrape(fetch(port)).one_of("unit_phase", unit.name, "phase") == "downloading", 20,
                 "the unit about to load its weights")
        os.kill(journald.process.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: Scrape(fetch(port)).value("llmstartup_source_up", source="journal") == 0, 5,
                     "the journal source down")
            flag.touch()
            unit.wait(10)
            gone = time.time()
            # rounds that see no process while its last words wait in journald's stream: the agent has looked since
            wait_for(lambda: Scrape(fetch(port)).value("llmstartup_source_last_success_timestamp_seconds",
                                                       source="processes") >= gone + 3 * INTERVAL, 20,
                     "three looks at the unit's processes after its exit")
        finally:
            os.kill(journald.process.pid, signal.SIGCONT)
        counted = wait_for(lambda: (s := Scrape(fetch(port))).value("llmstartup_startups_total", unit=unit.name,
                                                                    outcome="failed") == 1 and s, 20,
                           "the failed start counted once journald reads again")
        assert [(f.labels["phase"], f.labels["reason"]) for f in counted.all("llmstartup_failures_total", unit=unit.name)
                if f.value] == [("downloading", "cuda_oom")]
    finally:
        unit.stop()


def test_a_minute_of_the_soak(journald):
    """bench/soak.py for a minute: a pause with crash loops running, a kill, journald stopped, a burst, a full disk;
    every start counted once and stored, every failure with the reason its lines give, every scrape answered."""
    report = soak.run(minutes=1.0, journald=journald)
    assert report.ok, report.text()
