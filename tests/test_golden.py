"""Golden files: the `/metrics` exposition and the landing page, rendered from one hand-made Snapshot.

And README.md's metrics table, rendered from the families' definitions (exporter/shell/collector.py).
A change to what any of them renders fails here with the diff. When the change is meant, write the files
again and commit them with it:

    LLMSTARTUP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py

The snapshot is built by hand, not folded from observations, so that only the renderers are under
test: six units (silent in a compile with a failed start before it, loading shards with its progress,
failed, ready, never started, and the second host of a start over two, its ranks spinning in a hung collective,
stalled and located by its stacks), two GPUs, an Xid, a source down and a restarted journal reader; every metric family has a series.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core import landing
from exporter.core.model import (
    Attempt,
    Expectation,
    Frame,
    Gpu,
    GpuSample,
    Group,
    Histogram,
    Outcome,
    Phase,
    ProcessSample,
    ProcessState,
    Progress,
    Reason,
    Signal,
    Snapshot,
    SourceHealth,
    Span,
    Stuck,
    UnitState,
    UnitView,
    Verdict,
    frozen_map,
)
from exporter.core.tracker import DURATION_BUCKETS
from exporter.shell.collector import FAMILIES
from exporter.shell.exposition import Exposition
from tests.needs import missing

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("LLMSTARTUP_UPDATE_GOLDEN") == "1"
README = Path(__file__).resolve().parent.parent / "README.md"
GiB, MiB = 2**30, 2**20
WALL = 1_767_225_000.0  # wall = monotonic + WALL: 2026-01-01, so that every timestamp reads plainly
NOW = 1000.0


def _hist(*seconds: float) -> Histogram:
    hist = Histogram.empty(tuple(float(b) for b in DURATION_BUCKETS))
    for value in seconds:
        hist = hist.observe(value)
    return hist


def _compiling() -> UnitView:
    """Silent in torch.compile for 5 minutes, its CPU turning, slower than ever before; its start before died of a CUDA OOM."""
    unit = "vllm-glm5.service"
    previous = Attempt(started=10.0, invocation="a" * 32, phase=Phase.FAILED, phase_since=60.0,
                       reason=Reason.CUDA_OOM, ended=61.0, outcome=Outcome.FAILED,
                       spans=((Phase.LAUNCHING, 10.0), (Phase.LOADING_WEIGHTS, 20.0), (Phase.FAILED, 60.0)))
    attempt = Attempt(started=100.0, invocation="b" * 32, phase=Phase.COMPILING, phase_since=400.0,
                      compile_cache="cold",
                      spans=((Phase.LAUNCHING, 100.0), (Phase.LOADING_WEIGHTS, 130.0), (Phase.COMPILING, 400.0)),
                      gaps=((150.0, 380.0, Phase.LOADING_WEIGHTS),))
    state = UnitState(
        unit, "vllm", frozen_map({"engine_version": "0.11.0", "model": "zai-org/GLM-4.5-Air"}),
        frozen_map({"model_weights_bytes": 15.27 * GiB, "engine_weights_load_seconds": 262.4}),
        attempt=attempt, previous=previous, last_log=700.0,
        moved=frozen_map({Signal.LOG: 700.0, Signal.CPU: 998.0, Signal.IO: 990.0, Signal.GPU_MEMORY: 900.0,
                          Signal.PROCESSES: 950.0}),
        watched_since=100.0,
        last_process=ProcessSample(998.0, unit, frozenset({(4242, 100.0), (4310, 401.5)}), 1234.5, 10 * GiB, MiB,
                                   21 * GiB, frozen_map({ProcessState.RUNNING: 2, ProcessState.SLEEPING: 1}), 100.0),
        last_gpu=GpuSample(998.0, unit, frozen_map({"0": 40 * GiB, "1": 38 * GiB})),
        startups=frozen_map({Outcome.FAILED: 1}),
        failures=frozen_map({(Phase.LOADING_WEIGHTS, Reason.CUDA_OOM): 1}),
        phase_durations=frozen_map({Phase.LAUNCHING: _hist(10.0, 30.0), Phase.LOADING_WEIGHTS: _hist(270.0)}),
        last_phase_durations=frozen_map({Phase.LAUNCHING: 30.0, Phase.LOADING_WEIGHTS: 270.0}),
        startup_durations=frozen_map({Outcome.FAILED: _hist(50.0)}),
        cpu_total=1234.5, suppressed_total=12, read_total=10 * GiB, written_total=MiB,
        cpu_rate=3.52, io_rate=1.5 * MiB, gpu_at_last_log=70 * GiB,
    )
    expected = Expectation(frozen_map({Phase.LOADING_WEIGHTS: Span(250.0, 300.0, 4),
                                       Phase.COMPILING: Span(420.0, 500.0, 4)}), Span(1000.0, 1300.0, 4))
    return UnitView(state, Verdict.SILENT_PROGRESS, expected)


def _failed() -> UnitView:
    unit = "sglang-qwen.service"
    attempt = Attempt(started=200.0, phase=Phase.FAILED, phase_since=260.0, reason=Reason.NCCL, ended=262.0,
                      outcome=Outcome.FAILED,
                      spans=((Phase.LAUNCHING, 200.0), (Phase.INITIALIZING_DISTRIBUTED, 210.0), (Phase.FAILED, 260.0)))
    state = UnitState(
        unit, "sglang", frozen_map({"engine_version": "0.5.2", "model": "Qwen/Qwen3-235B-A22B"}),
        attempt=attempt, last_log=259.5, moved=frozen_map({Signal.LOG: 259.5, Signal.PROCESSES: 262.0}),
        watched_since=200.0,
        last_process=ProcessSample(998.0, unit, frozenset(), 88.0, 5 * MiB, 0, 0,
                                   frozen_map(dict.fromkeys(ProcessState, 0))),
        startups=frozen_map({Outcome.FAILED: 1}),
        failures=frozen_map({(Phase.INITIALIZING_DISTRIBUTED, Reason.NCCL): 1}),
        phase_durations=frozen_map({Phase.LAUNCHING: _hist(10.0)}),
        last_phase_durations=frozen_map({Phase.LAUNCHING: 10.0}),
        startup_durations=frozen_map({Outcome.FAILED: _hist(60.0)}),
        cpu_total=88.0, read_total=5 * MiB,
    )
    return UnitView(state, Verdict.FAILED)


def _ready() -> UnitView:
    unit = "vllm-llama.service"
    attempt = Attempt(started=300.0, phase=Phase.READY, phase_since=400.0, ready_at=400.0, outcome=Outcome.READY,
                      spans=((Phase.LAUNCHING, 300.0), (Phase.LOADING_WEIGHTS, 305.0), (Phase.READY, 400.0)))
    state = UnitState(
        unit, "vllm", frozen_map({"engine_version": "0.10.2", "model": "meta-llama/Llama-3.1-8B-Instruct"}),
        frozen_map({"max_model_len_tokens": 8192.0, "kv_cache_tokens": 412336.0, "kv_cache_memory_bytes": 50.3 * GiB,
                    "graph_memory_bytes": 0.52 * GiB, "engine_compile_seconds": 12.4,
                    "engine_graph_capture_seconds": 1.0, "engine_init_seconds": 20.5}),
        attempt=attempt, last_log=990.0, moved=frozen_map({Signal.LOG: 990.0}), watched_since=300.0,
        last_process=ProcessSample(998.0, unit, frozenset({(5100, 300.0)}), 60.0, GiB, 0, 18 * GiB,
                                   frozen_map({ProcessState.SLEEPING: 1}), 300.0),
        last_gpu=GpuSample(998.0, unit, frozen_map({"1": None})),  # NVML cannot say: no series
        startups=frozen_map({Outcome.READY: 1}),
        phase_durations=frozen_map({Phase.LAUNCHING: _hist(5.0), Phase.LOADING_WEIGHTS: _hist(95.0)}),
        last_phase_durations=frozen_map({Phase.LAUNCHING: 5.0, Phase.LOADING_WEIGHTS: 95.0}),
        startup_durations=frozen_map({Outcome.READY: _hist(100.0)}),
        cpu_total=60.0, read_total=GiB,
    )
    return UnitView(state, Verdict.READY, Expectation(frozen_map({Phase.LOADING_WEIGHTS: Span(90.0, 120.0, 3)})))


def _loading() -> UnitView:
    """Loading its 163 shards, 61 read in the 90 s since the first: a first start, by its progress."""
    unit = "vllm-deepseek.service"
    shards = Progress(Phase.LOADING_WEIGHTS, "shard", total=163.0, done=61.0, at=990.0, remaining=None,
                      first_at=900.0, first_done=0.0, advanced=990.0, advances=61, longest_wait=3.0, reports=62)
    attempt = Attempt(started=880.0, invocation="c" * 32, phase=Phase.LOADING_WEIGHTS, phase_since=895.0,
                      spans=((Phase.LAUNCHING, 880.0), (Phase.LOADING_WEIGHTS, 895.0)), progress=shards)
    state = UnitState(
        unit, "vllm", frozen_map({"engine_version": "0.11.0", "model": "deepseek-ai/DeepSeek-V3.1"}),
        attempt=attempt, last_log=990.0, moved=frozen_map({Signal.LOG: 990.0, Signal.IO: 998.0}), watched_since=880.0,
        last_process=ProcessSample(998.0, unit, frozenset({(6100, 880.0)}), 40.0, 300 * GiB, 0, 30 * GiB,
                                   frozen_map({ProcessState.DISK_SLEEP: 1}), 880.0),
        startups=frozen_map(), phase_durations=frozen_map({Phase.LAUNCHING: _hist(15.0)}),
        last_phase_durations=frozen_map({Phase.LAUNCHING: 15.0}), cpu_total=40.0, read_total=300 * GiB,
        cpu_rate=0.4, io_rate=3.2 * GiB,
    )
    expected = Expectation(frozen_map({Phase.COMPILING: Span(400.0, 450.0, 2), Phase.CAPTURING_GRAPHS: Span(60.0, 80.0, 2)}),
                           Span(1500.0, 1600.0, 2))
    return UnitView(state, Verdict.PROGRESSING, expected)


def _spinning() -> UnitView:
    """The second host of a start over two: eight ranks spinning in synchronize() since 700, the last line: stalled,
    located by their stacks."""
    unit = "vllm-kimi.service"
    attempt = Attempt(started=500.0, phase=Phase.CAPTURING_GRAPHS, phase_since=700.0,
                      spans=((Phase.LAUNCHING, 500.0), (Phase.CAPTURING_GRAPHS, 700.0)),
                      group=Group("10.0.0.1:29501", nnodes=2, node_rank=1))
    ranks = frozenset((7000 + n, 500.0) for n in range(9))
    state = UnitState(
        unit, "vllm", frozen_map({"engine_version": "0.11.0", "model": "moonshotai/Kimi-K2-Instruct"}),
        attempt=attempt, last_log=700.0, moved=frozen_map({Signal.LOG: 700.0, Signal.CPU: 998.0}), watched_since=500.0,
        last_process=ProcessSample(998.0, unit, ranks, 4200.0, GiB, 0, 96 * GiB,
                                   frozen_map({ProcessState.RUNNING: 8, ProcessState.SLEEPING: 1}), 500.0),
        cpu_total=4200.0, read_total=GiB, cpu_rate=8.0,
    )
    spin = (Frame("synchronize", "torch/cuda/__init__.py", 1040), Frame("capture", "vllm/v1/worker/gpu_model_runner.py", 3480))
    stuck = (Stuck(tuple(range(7001, 7009)), spin, "R", ""), Stuck((7000,), (), "S", "futex_wait_queue"))
    return UnitView(state, Verdict.STALLED, why="only CPU moves, and the Python stacks stay the same", stuck=stuck)


SNAPSHOT = Snapshot(
    t=NOW,
    wall_offset=WALL,
    units=(_compiling(), _loading(), _failed(), _ready(), UnitView(UnitState("ollama.service", "ollama"), Verdict.INACTIVE),
           _spinning()),
    sources=frozen_map({"journal": SourceHealth(True, WALL + 999.5), "processes": SourceHealth(True, WALL + 998.0),
                        "gpu": SourceHealth(False, WALL + 980.0, "no word from it for 20 s"), "stacks": SourceHealth(True, WALL + 999.0)}),
    gpus=(Gpu("0", "GPU-0f3c9a64-1b2e-4d1a-9c55-6b0e7d4a2f10", "NVIDIA H200", "00000000:3B:00.0", 0.97),
          Gpu("1", "GPU-7e21b3d8-55c0-4e8f-a0d2-19f4c3b6e8a7", "NVIDIA H200", "00000000:5D:00.0", None)),
    xid_errors=frozen_map({("1", 79): 2}),
    stale_after=7.0,
    journal_reader_restarts=1,
)


def exposition(snapshot: Snapshot) -> str:
    """What /metrics serves for a snapshot, less the agent's own process metrics (they are the host's)."""
    return Exposition(lambda: snapshot, process=False)().decode()


def check_golden(name: str, rendered: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(rendered)
        return
    want = path.read_text() if path.exists() else ""
    if rendered != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), rendered.splitlines(True),
                                            f"tests/golden/{name} (committed)", f"{name} (rendered now)"))
        pytest.fail(f"{name} differs from its golden file; if the change is meant, run\n"
                    f"    LLMSTARTUP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py\n"
                    f"and commit tests/golden/{name}.\n\n{diff}", pytrace=False)


def test_metrics_exposition() -> None:
    check_golden("metrics.prom", exposition(SNAPSHOT))


def test_the_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool (Debian package prometheus)")
    lint = subprocess.run([promtool, "check", "metrics"], input=(GOLDEN / "metrics.prom").read_text(),
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_landing_page() -> None:
    check_golden("landing.html", landing.render(SNAPSHOT).replace("><", ">\n<"))  # a line per tag: readable diffs


# README.md's metrics table lies between these two lines; the test below renders it from the families.
TABLE_BEGIN = "<!-- The metrics table, rendered from exporter/shell/collector.py (tests/test_golden.py). -->\n"
TABLE_END = "<!-- The end of the metrics table. -->\n"


def metrics_table() -> str:
    """README.md's metrics table, rendered from the families' definitions: adjacent families of the same
    type, labels and words share a row."""
    rows: list[tuple[list[str], str, str, str]] = []
    for family in FAMILIES:
        labels = ", ".join(family.labels)
        if rows and rows[-1][1:] == (family.type, labels, family.doc):
            rows[-1][0].append(family.name)
        else:
            rows.append(([family.name], family.type, labels, family.doc))
    lines = ["| metric | type | labels | what |", "|---|---|---|---|"]
    lines += [f"| {', '.join(f'`{n}`' for n in names)} | {kind} | {labels} | {doc} |" for names, kind, labels, doc in rows]
    lines.append("| `exporter_process_*` | | | the agent's own CPU, memory and file descriptors (prometheus_client's) |")
    buckets = ", ".join(f"{bound:g}" for bound in DURATION_BUCKETS)
    return "\n".join(lines) + f"\n\nHistogram buckets: {buckets} seconds.\n"


def test_the_readme_metrics_table_is_rendered_from_the_families() -> None:
    text = README.read_text()
    assert text.count(TABLE_BEGIN) == text.count(TABLE_END) == 1, "README.md's metrics table lost its markers"
    before, rest = text.split(TABLE_BEGIN)
    table, after = rest.split(TABLE_END)
    if UPDATE:
        README.write_text(before + TABLE_BEGIN + metrics_table() + TABLE_END + after)
        return
    if table != metrics_table():
        diff = "".join(difflib.unified_diff(table.splitlines(True), metrics_table().splitlines(True),
                                            "README.md (committed)", "the families (rendered now)"))
        pytest.fail("README.md's metrics table differs from exporter/shell/collector.py's families; if the change "
                    "is meant, run\n    LLMSTARTUP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py\n"
                    f"and commit README.md.\n\n{diff}", pytrace=False)


def test_a_full_exposition_has_every_defined_family_and_no_created_pid_or_hostname() -> None:
    families = {f.name: f for f in text_string_to_metric_families(exposition(SNAPSHOT))}
    names = {f"{name}_total" if f.type == "counter" else name for name, f in families.items()}
    assert names == {f"llmstartup_{family.name}" for family in FAMILIES}, "every family defined is served"
    empty = [name for name, f in families.items() if not f.samples]
    assert not empty, f"the hand-made snapshot leaves these families without a series: {empty}"
    samples = [s for f in families.values() for s in f.samples]
    assert not [s.name for s in samples if s.name.endswith("_created")]
    labels = {label for s in samples for label in s.labels}
    assert not labels & {"pid", "hostname", "host", "instance", "message"}, labels
