"""How much longer: progress and ETA on a first start, from scripted vLLM units loading shards in the test
journald, as `wait`, `status`, the API, the landing page and /metrics give them."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

from tests.scrape import INTERVAL, SILENCE, STALL, Scrape, fetch, wait_for
from tests.test_operator import llmstartup

SHARDS, EVERY = 12, 1.5  # a steady load: a shard every 1.5 s
START = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
]
STEADY = [
    *START,
    {"bar": "Loading safetensors checkpoint shards", "steps": SHARDS, "seconds": SHARDS * EVERY, "per_line": True},
    {"log": f"Loading weights took {SHARDS * EVERY:.2f} seconds"},
    {"log": f"Model loading took 15.27 GiB and {SHARDS * EVERY + 0.3:.2f} seconds"},
    {"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone for vLLM's torch.compile"},
    {"sleep": 4},
    {"log": "torch.compile takes 4.00 s in total"},
    {"raw": "INFO:     Application startup complete."},
    {"hang": True},
]
# Four shards of ten, then nothing more of the bar; the engine core goes on logging (vLLM's broadcast
# warning), so the unit is never silent: only the bar says it stopped.
STUCK = [
    *START,
    {"bar": "Loading safetensors checkpoint shards", "steps": 10, "seconds": 10, "per_line": True, "until": 4},
    # the unit still logs (huggingface_hub retrying a read, not a heartbeat: vLLM's broadcast wait would be one)
    *[step for _ in range(20) for step in ({"log": "Retrying in 1s [Retry 1/5]."}, {"sleep": 2})],
    {"hang": True},
]


def _wall(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _shard_record_time(entries: list, done: int) -> float:
    """When journald received the shard bar record that says `done` shards are loaded."""
    said = [e for e in entries if f"| {done}/{SHARDS} [" in str(e.get("MESSAGE", ""))]
    return said[0]["__REALTIME_TIMESTAMP"].timestamp()


def test_a_first_start_shows_the_weights_progress_and_an_honest_eta(agent, units, journald, journal_records):
    unit = units("steady", STEADY)
    port = agent(unit.name)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "exporter", "wait", unit.name, "--heartbeat", "1s", "--journal.namespace", journald.namespace,
         "--sample.interval", f"{INTERVAL:g}s", "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s",
         "--no-collector.gpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        def document():
            return next(d for d in json.loads(fetch(port, "/api/v1/units")) if d["unit"] == unit.name)

        # By the third shard the API's ETA for the phase is within 20% of the truth; none before two reports.
        seen: list[dict] = []
        third = wait_for(lambda: (seen.append(d := document()) or (d["progress"] or {}).get("done", 0) >= 3) and d,
                         30, "the third shard")
        early = [d for d in seen if d["progress"] and d["progress"]["done"] == 0]
        assert all(d["phase_expected_end"] is None for d in early), "an ETA before two progress reports"
        assert third["phase"] == "loading_weights" and third["progress"]["item"] == "shard"
        assert third["progress"]["total"] == SHARDS and third["expected_ready"] is None, "no history: no ready ETA"

        compiling = wait_for(lambda: (d := document())["phase"] == "compiling" and d, 30, "compiling")
        assert compiling["progress"] is None and compiling["phase_expected_end"] is None, "compiling reports nothing"
        metrics = Scrape(fetch(port))
        assert metrics.all("llmstartup_phase_progress_ratio", unit=unit.name) == []
        assert metrics.all("llmstartup_phase_expected_end_timestamp_seconds", unit=unit.name) == []

        entries = journal_records(unit, until=lambda es: any(f"| {SHARDS}/{SHARDS} [" in str(e.get("MESSAGE")) for e in es))
        truth = _shard_record_time(entries, SHARDS)
        reported = _wall(third["progress"]["last_report"])
        error = abs(_wall(third["phase_expected_end"]) - truth)
        assert error <= 0.2 * (truth - reported), (third, truth)

        # `wait` showed the load's progress and its ETA on the way, and returned at ready.
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, out + err
        loading = [line for line in out.splitlines() if " loading_weights " in line]
        assert any(f"/{SHARDS} shards (" in line and "s left" in line for line in loading), out
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


def test_shards_that_stop_say_so_whatever_the_other_signals(agent, units, journald):
    unit = units("stuck", STUCK)
    port = agent(unit.name)

    def stuck() -> dict | None:
        done = llmstartup(journald, "status", unit.name, "--format", "json")
        [doc] = json.loads(done.stdout)
        return doc if (doc["progress"] or {}).get("stopped_seconds") else None

    doc = wait_for(stuck, 40, "the shard bar to count as stopped", every=0.5)
    assert doc["phase"] == "loading_weights" and doc["verdict"] == "progressing", "the unit still logs"
    assert (doc["progress"]["done"], doc["progress"]["total"]) == (4, 10)
    assert doc["progress"]["stopped_seconds"] >= STALL

    text = llmstartup(journald, "status", unit.name)
    assert "4/10 shards (40%), no new shard for" in text.stdout, text.stdout
    page = fetch(port, "/")
    assert "4/10 shards (40%)" in page and "linear-gradient(90deg,#3d7dca 40.0%" in page, "the span filled to 40%"
    assert Scrape(fetch(port)).value("llmstartup_phase_progress_ratio", unit=unit.name) == 0.4
