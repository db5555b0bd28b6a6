"""End to end: `llmstartup serve` following scripted vLLM units in a real journald namespace.

Three units under one agent, as the operator story has them: one reaches ready after a silent
torch.compile that burns CPU in child processes, one hangs idle after announcing torch.compile,
one dies of a CUDA OOM. The agent is the real command, scraped over HTTP.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import socket
import subprocess
import os
import sys
import threading
import time

import psutil
import pytest

from exporter.shell import cli, runtime
from exporter.shell.agent import Agent
from exporter.core.config import Config
from exporter.shell.demo import sandbox
from exporter.shell.demo.vllm_startup import CONFIG
from tests.scrape import Scrape, Watch, fetch, free_port, try_fetch, wait_for

LOAD = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Model loading took 15.27 GiB and 2.10 seconds"},
    {"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone for vLLM's torch.compile"},
]
READY_AFTER_SILENT_COMPILE = [
    *LOAD,
    {"burn": 12, "workers": 2},
    {"log": "torch.compile takes 12.40 s in total"},
    {"log": "GPU KV cache size: 412,336 tokens"},
    {"bar": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "steps": 10, "seconds": 1},
    {"log": "Graph capturing finished in 1 secs, took 0.52 GiB"},
    {"raw": "INFO:     Application startup complete."},
    {"hang": True},
]
HANG_AFTER_COMPILE = [*LOAD, {"hang": True}]
CUDA_OOM = [
    *LOAD,
    {"traceback": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.25 GiB is free."},
    {"exit": 1},
]


def _said(text: str):
    def check(entries: list) -> bool:
        return any(text in str(e.get("MESSAGE", "")) for e in entries)

    return check


def test_three_units_under_one_agent(agent, units, journal_records):
    ready = units("ready", READY_AFTER_SILENT_COMPILE)
    journal_records(ready, until=_said("for vLLM's torch.compile"), timeout=20)

    # Started mid-startup, the agent knows the phase at once from the unit's earlier lines.
    hang_name, oom_name = ready.name.replace("ready", "hang"), ready.name.replace("ready", "oom")
    port = agent(ready.name, hang_name, oom_name)
    seen: list[tuple[float, Scrape]] = []

    def scrape() -> Scrape:
        s = Scrape(fetch(port))
        seen.append((time.monotonic(), s))
        return s

    first = wait_for(lambda: (s := scrape()).one_of("unit_phase", ready.name, "phase") != "inactive" and s, 10,
                     "the first phase of the unit started before the agent")
    assert first.one_of("unit_phase", ready.name, "phase") == "compiling"

    # The other two start after the agent.
    hang = units("hang", HANG_AFTER_COMPILE)
    oom = units("oom", CUDA_OOM)
    assert (hang.name, oom.name) == (hang_name, oom_name)

    final = wait_for(
        lambda: (s := scrape()).one_of("unit_verdict", ready.name, "verdict") == "ready"
        and s.one_of("unit_verdict", hang.name, "verdict") == "stalled"
        and s.one_of("unit_verdict", oom.name, "verdict") == "failed"
        and s,
        60,
        "ready, stalled and failed",
    )

    # Each unit has one phase and one verdict series, the current one, at 1.
    for unit in (ready.name, hang.name, oom.name):
        assert len(final.all("llmstartup_unit_phase", unit=unit)) == 1
        assert len(final.all("llmstartup_unit_verdict", unit=unit)) == 1
        assert final.one_of("unit_phase", unit, "phase") and final.one_of("unit_verdict", unit, "verdict")

    # The silent compile was seen as silent progress, and never as stalled.
    ready_verdicts = [s.one_of("unit_verdict", ready.name, "verdict") for _, s in seen]
    assert "silent_progress" in ready_verdicts
    assert "stalled" not in ready_verdicts
    assert final.value("llmstartup_startups_total", unit=ready.name, outcome="ready") == 1
    for phase in ("loading_weights", "compiling", "profiling", "allocating_kv_cache", "capturing_graphs"):
        assert final.value("llmstartup_phase_duration_seconds_count", unit=ready.name, phase=phase) == 1, phase
    compiling = final.value("llmstartup_last_phase_duration_seconds", unit=ready.name, phase="compiling")
    assert compiling >= 12, "compile burned 12 s of CPU"
    assert final.value("llmstartup_model_weights_bytes", unit=ready.name) == pytest.approx(15.27 * 2**30)
    assert final.value("llmstartup_kv_cache_tokens", unit=ready.name) == 412336
    # The compile workers' CPU stays counted once they exit (the cgroup's own counter), however much of
    # the cores they got: the counter never goes back.
    cpu = [v for _, s in seen if (v := s.value("llmstartup_process_cpu_seconds_total", unit=ready.name))]
    assert cpu == sorted(cpu) and cpu[-1] - cpu[0] >= 1, f"CPU seconds went back or did not grow: {cpu}"

    # The hang: progressing while it prints, silent but alive while its start settles, then stalled for
    # good (how soon after its last line is bench/stall.py's figure, also while other units burn the CPUs).
    hang_verdicts = [v for _, s in seen if (v := s.one_of("unit_verdict", hang.name, "verdict"))]
    changes = [v for v, before in zip(hang_verdicts, [None, *hang_verdicts]) if v != before]
    assert changes[-1] == "stalled" and changes.count("stalled") == 1, changes
    assert changes.index("progressing") < changes.index("stalled"), changes
    assert final.one_of("unit_phase", hang.name, "phase") == "compiling"

    # The OOM: failed in the phase it was in, for the reason it printed.
    assert final.value("llmstartup_failures_total", unit=oom.name, phase="compiling", reason="cuda_oom") == 1
    assert final.value("llmstartup_startups_total", unit=oom.name, outcome="failed") == 1
    assert final.value("llmstartup_startup_duration_seconds_count", unit=oom.name, outcome="failed") == 1

    assert final.value("llmstartup_source_up", source="journal") == 1
    assert final.value("llmstartup_source_up", source="processes") == 1
    # the whole exposition, the agent's own process metrics included: no _created series, no pid or hostname
    assert not [x.name for x in final.samples if x.name.endswith("_created")]
    assert not {"pid", "hostname"} & {label for x in final.samples for label in x.labels}
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by .ci/setup (Debian package prometheus)"
    lint = subprocess.run([promtool, "check", "metrics"], input=final.text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_without_units_the_agent_discovers_model_servers(agent, journald, tmp_path):
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([*LOAD, {"hang": True}]))
    # argv[0] "vllm", as `vllm serve …` shows in a real unit's command line
    argv = ["bash", "-c", f'exec -a vllm {sys.executable} -m exporter.shell.demo.vllm_startup "$0"', str(steps)]
    name = f"test-{secrets.token_hex(3)}-discovered.service"
    port = agent()
    with sandbox.start_unit(journald, name, argv):
        found = wait_for(lambda: (s := Scrape(fetch(port))).one_of("unit_phase", name, "phase") == "compiling" and s,
                         30, "the agent to discover the unit and follow it to compiling")
    info = found.all("llmstartup_unit_info", unit=name)
    assert [s.labels["engine"] for s in info] == ["vllm"]
    assert found.all("llmstartup_unit_info", unit="ssh.service") == []


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stop_signal_while_the_agent_reads_the_history_stops_it_cleanly(stop, monkeypatch, tmp_path):
    """Starting reads the units' history first (seconds, on a big journal): a SIGTERM or Ctrl-C then
    stops the agent once it has started, with exit 0 and everything closed; not killed unsaved, not dropped."""
    port = free_port()
    config = Config(units=(("history-read.service", "vllm"),), directory=tmp_path, listen=("127.0.0.1", port),
                    interval=0.5, gpu=False, state_path=tmp_path / "state.db")
    read_history, close = Agent.warm_up, runtime.Runtime.close
    closed: list[runtime.Runtime] = []

    def read_history_and_get_stopped(agent: Agent, timeout: float = 10.0):
        os.kill(os.getpid(), stop)  # handled on this thread, in the middle of the read
        return read_history(agent, timeout)

    def close_and_note(rt: runtime.Runtime) -> None:
        close(rt)
        closed.append(rt)

    monkeypatch.setattr(Agent, "warm_up", read_history_and_get_stopped)
    monkeypatch.setattr(runtime.Runtime, "close", close_and_note)
    stopped, gave_up = threading.Event(), threading.Event()
    # A deadline, should the signal be lost: the agent would otherwise run on for ever.
    guard = threading.Timer(30, lambda: (gave_up.set(), stopped.set()))
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    missed: list[int] = []  # a signal that reached this handler, not the agent's (the default would kill pytest)
    for sig in saved:
        signal.signal(sig, lambda signum, _: (missed.append(signum), stopped.set()))
    guard.start()
    try:
        assert cli.run_serve(config, stopped) == 0
    finally:
        guard.cancel()
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert not missed, f"{stop.name} came before the agent had its own handler: it would have died unsaved"
    assert not gave_up.is_set(), f"{stop.name} during the history read was lost: the agent ran on"
    [rt] = closed
    assert not rt.journal._thread.is_alive() and not psutil.pid_exists(rt.journal.child_pid), "the reader was left"
    assert try_fetch(port) is None, "the HTTP server was left listening"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        pytest.param(["--web.listen-address", "127.0.0.1:{busy}"], "cannot listen on 127.0.0.1:{busy}: Address already in use",
                     id="address in use"),
        pytest.param(["--path.cgroupfs", "{tmp}/nowhere"], "no cgroup v2 hierarchy at {tmp}/nowhere",
                     id="no cgroup v2 there"),
        pytest.param(["--path.cgroupfs", "{tmp}"], "no cgroup v2 hierarchy at {tmp}", id="a folder that is no cgroup v2"),
        pytest.param(["--journal.directory", "{tmp}/no-journal"], "--journal.directory {tmp}/no-journal: no such directory",
                     id="missing journal directory"),
    ],
)
def test_serve_that_cannot_start_says_why_and_exits_1(flags, says, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        names = {"busy": busy.getsockname()[1], "tmp": tmp_path}
        argv = ["--journal.directory", str(tmp_path), "--web.listen-address", f"127.0.0.1:{free_port()}",
                "--no-collector.gpu", "--state.path", str(tmp_path / "state.db"), *(f.format(**names) for f in flags)]
        done = subprocess.run([sys.executable, "-m", "exporter", "serve", *argv], capture_output=True, text=True,
                              timeout=30)
    assert done.returncode == 1, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("level=ERROR ")]
    assert says.format(**names) in error and "Traceback" not in done.stderr, done.stderr


def test_a_journal_directory_anywhere_is_read(units, journald, journal_records, tmp_path):
    """libsystemd tells persistent from runtime files by the path (/var, /run): a journal copied to /srv,
    or a host's mounted at /host/var/log/journal in a container, is read all the same."""
    from tests.scrape import free_port, try_fetch

    quick = [*LOAD, {"raw": "INFO:     Application startup complete."}, {"hang": True}]
    ready = units("ready", quick)
    journal_records(ready, until=lambda es: any("startup complete" in str(e.get("MESSAGE")) for e in es))
    copy = tmp_path / "srv" / "journal"
    shutil.copytree(next(d for d in journald.journal_dirs if d.exists()), copy)
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "serve", "--journal.directory", str(copy), "--unit", ready.name,
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu", "--state.path", str(tmp_path / "s.db")]
    with open(tmp_path / "serve.log", "w") as log:
        agent = subprocess.Popen(argv, stderr=log)
    try:
        wait_for(lambda: try_fetch(port), 15, "the agent to serve")
        scrape = wait_for(lambda: (s := Scrape(fetch(port))).one_of("unit_phase", ready.name, "phase") == "ready" and s,
                          15, "the unit read from the copied journal")
        assert scrape.value("llmstartup_source_up", source="journal") == 1
        assert "no journal files" not in (tmp_path / "serve.log").read_text()
    finally:
        agent.terminate()
        agent.wait(10)


def test_a_capture_the_journal_cannot_show_yet_is_inferred_then_confirmed(agent, units):
    """vLLM's capture bar redraws with \\r, so journald passes it on only when it ends: the agent enters
    capture from the engine's order and the silence after the KV-cache lines, marked inferred, and the bar's
    record, when it comes, confirms it, the phase dated from the bar's first redraw."""
    steps = [
        {"log": "vLLM API server version 0.11.0"},
        {"log": "Initializing a V1 LLM engine (v0.11.0) with config: " + CONFIG},
        {"log": "Available KV cache memory: 56.63 GiB"},
        {"log": "GPU KV cache size: 412,336 tokens"},
        {"bar": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "steps": 40, "seconds": 12.0},
        {"log": "Graph capturing finished in 12 secs, took 0.52 GiB"},
        {"log": "Application startup complete."},
        {"hang": True},
    ]
    unit = units("capture", steps)
    watch = Watch(agent(unit.name), unit.name)
    inferred = watch.until(lambda d: d["phase_inferred"] or d["phase"] == "ready", 30, "capture to be inferred")
    assert (inferred["phase"], inferred["phase_inferred"]) == ("capturing_graphs", True), watch.said()
    assert "capturing_graphs (inferred)" in fetch(watch.port, "/")  # the landing page's status line says so
    ready = watch.until(lambda d: d["phase"] == "ready", 30, "the start to be ready")
    capture = next(p for p in ready["timeline"] if p["phase"] == "capturing_graphs")
    assert 11 <= capture["duration_seconds"] <= 14, ready["timeline"]  # the bar's own 12 s, not since the inference
    assert not any(d["phase_inferred"] for _, d in watch.seen if d["phase"] == "ready")
