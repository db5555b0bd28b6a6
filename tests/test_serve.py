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
import subprocess
import sys
import time

import pytest

from exporter.shell import cli, runtime
from exporter.core.config import Config
from exporter.shell.demo import sandbox
from tests.scrape import INTERVAL, STALL, Scrape, fetch, wait_for

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

    # Every phase and verdict series is present for each unit, and exactly one of each is 1.
    for unit in (ready.name, hang.name, oom.name):
        assert len(final.all("llmstartup_unit_phase", unit=unit)) == 14
        assert len(final.all("llmstartup_unit_verdict", unit=unit)) == 7
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
    assert final.value("llmstartup_process_cpu_seconds_total", unit=ready.name) >= 10

    # The hang is judged stalled within the stall threshold plus two sample intervals of its last line.
    last_line = final.value("llmstartup_last_log_timestamp_seconds", unit=hang.name)
    stalled_at = next(t for t, s in seen if s.one_of("unit_verdict", hang.name, "verdict") == "stalled")
    offset = time.time() - time.monotonic()
    assert stalled_at + offset - last_line <= STALL + 2 * INTERVAL + 0.5  # + one scrape poll
    assert final.one_of("unit_phase", hang.name, "phase") == "compiling"

    # The OOM: failed in the phase it was in, for the reason it printed.
    assert final.value("llmstartup_failures_total", unit=oom.name, phase="compiling", reason="cuda_oom") == 1
    assert final.value("llmstartup_startups_total", unit=oom.name, outcome="failed") == 1
    assert final.value("llmstartup_startup_duration_seconds_count", unit=oom.name, outcome="failed") == 1

    assert final.value("llmstartup_source_up", source="journal") == 1
    assert final.value("llmstartup_source_up", source="processes") == 1
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


def test_a_stop_signal_while_the_agent_starts_is_not_lost(monkeypatch):
    """Starting reads the units' history first (seconds, on a big journal): a SIGTERM or Ctrl-C
    then must stop the agent once it has started, not kill it unsaved or be dropped."""
    handlers: dict[signal.Signals, object] = {}

    def start(cls, config, http=True):
        handlers.update({s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)})
        raise runtime.StartError("started far enough")

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(runtime.Runtime, "start", classmethod(start))
    try:
        assert cli.run_serve(Config()) == 1
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert all(callable(h) and h not in saved.values() for h in handlers.values()), handlers


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
