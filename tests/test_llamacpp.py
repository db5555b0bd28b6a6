"""A real model server under the agent: llama-cpp-python's server on the CPU, with a tiny random model.

Nobody here wrote its log lines: llama.cpp's loader and uvicorn print what they always print.
"""

from __future__ import annotations

import importlib.util
import sys

from exporter.shell.demo import sandbox
from tests.needs import needs
from tests.scrape import Scrape, fetch, free_port, wait_for
from tests.tiny_model import write_tiny_llama

pytestmark = needs(importlib.util.find_spec("llama_cpp"), "llama-cpp-python[server] (the test extra)")


def test_the_agent_follows_llama_cpp_to_ready(agent, journald, tmp_path):
    model = write_tiny_llama(tmp_path / "tiny-random-llama.gguf")
    port = free_port()
    name = "test-llamacpp-tiny.service"
    metrics = agent(name)  # no engine given: its command line names it, once it runs
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", "128"]
    with sandbox.start_unit(journald, name, argv):
        final = wait_for(lambda: (s := Scrape(fetch(metrics))).one_of("unit_verdict", name, "verdict") == "ready" and s,
                         120, "llama.cpp's server to be followed to ready")
        # It loads in a blink, so no scrape sees the phases; each one's duration was observed once.
        for phase in ("launching", "loading_weights", "allocating_kv_cache", "starting_api"):
            assert final.value("llmstartup_phase_duration_seconds_count", unit=name, phase=phase) == 1, phase
        info = final.all("llmstartup_unit_info", unit=name)[0].labels
        assert info["engine"] == "llamacpp"
        assert info["model"] == str(model)
        assert final.value("llmstartup_startups_total", unit=name, outcome="ready") == 1
        assert final.value("llmstartup_kv_cache_tokens", unit=name) >= 128  # llama.cpp rounds n_ctx up
        # and the server the agent called ready really answers
        assert "tiny-random-llama" in fetch(port, "/v1/models")


def test_the_agent_follows_a_llama_cpp_pod_to_ready(agent, node, tmp_path):
    """The same server as a pod's container: its output in containerd's CRI log file, its processes in the
    container's cgroup, found with no unit named."""
    model = write_tiny_llama(tmp_path / "tiny-random-llama.gguf")
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", "128"]
    metrics = agent(args=("--path.pods", str(node.pods), "--path.docker", str(node.docker)))
    node.run_pod("llm", "llama-7c9d8", "server", argv)
    unit = "llm/llama-7c9d8/server"
    # ready from its lines; its processes' evidence is folded once the unit's journal past is read too
    final = wait_for(lambda: (s := Scrape(fetch(metrics))).one_of("unit_verdict", unit, "verdict") == "ready"
                     and (s.value("llmstartup_process_resident_memory_bytes", unit=unit) or 0) > 0 and s,
                     120, "llama.cpp's pod to be followed to ready, with its processes")
    for phase in ("launching", "loading_weights", "allocating_kv_cache", "starting_api"):
        assert final.value("llmstartup_phase_duration_seconds_count", unit=unit, phase=phase) == 1, phase
    info = final.all("llmstartup_unit_info", unit=unit)[0].labels
    assert (info["engine"], info["model"], info["namespace"], info["pod"], info["container"]) == (
        "llamacpp", str(model), "llm", "llama-7c9d8", "server")
    assert "tiny-random-llama" in fetch(port, "/v1/models")


def test_a_missing_model_fails_with_its_cause(agent, journald, tmp_path):
    """llama.cpp's server pointed at a model file that is not there: failed, in loading, as bad_config (the
    setting names no file), not as the bare exit or the traceback that follows."""
    name = "test-llamacpp-missing.service"
    metrics = agent(f"{name}=llamacpp")  # it exits before a look at its command line could name its engine
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(tmp_path / "none.gguf"), "--host", "127.0.0.1",
            "--port", str(free_port())]
    with sandbox.start_unit(journald, name, argv) as unit:
        assert unit.wait(timeout=60) != 0
        final = wait_for(lambda: (s := Scrape(fetch(metrics))).one_of("unit_verdict", name, "verdict") == "failed" and s,
                         30, "the failed start to be followed")
        failures = [(s.labels["phase"], s.labels["reason"]) for s in final.all("llmstartup_failures_total", unit=name)]
        assert failures == [("loading_weights", "bad_config")]
        assert final.value("llmstartup_startups_total", unit=name, outcome="failed") == 1
