"""Progress within a phase and the ETAs it gives: the engines' own progress records, folded by the core and
rendered as the operator reads them; pure tables."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core import grammar, progress
from exporter.core.entries import to_observations
from exporter.core.model import Expectation, Limits, LogLine, Phase, Snapshot, Span, UnitState, UnitView, Verdict
from exporter.core.report import status_line, unit_document
from exporter.core.tracker import advance
from exporter.shell.exposition import Exposition

U = "vllm.service"
LIMITS = Limits(silence=60, stall=300)
WALL = 1.7e9  # the snapshot's wall-clock offset: monotonic + WALL is the wall clock


def line(t: float, text: str) -> LogLine:
    return LogLine(t, U, text, "a")


def shard(t: float, done: int, total: int, elapsed: str, left: str) -> LogLine:
    """vLLM's shard bar record (weight_utils._BAR_FORMAT), as the EngineCore's worker prints it."""
    return line(t, f"(EngineCore_DP0 pid=11) Loading safetensors checkpoint shards: {100 * done / total:3.0f}% "
                   f"Completed | {done}/{total} [{elapsed}<{left},  2.00s/it]")


def fold(observations, engine: str = "vllm") -> UnitState:
    rules = grammar.load(engine)
    return functools.reduce(lambda s, o: advance(s, o, rules, LIMITS), observations, UnitState(U, engine))


LOAD = [
    line(0, "(APIServer pid=1) INFO 10-21 09:12:04 [api_server.py:1839] vLLM API server version 0.11.0"),
    line(5, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:09 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B..."),
]
# 10 shards, one every 2 s from t=10, each record with tqdm's own estimate of what is left
SHARDS = [shard(10, 0, 10, "00:00", "?"), *(shard(10 + 2 * n, n, 10, f"00:{2 * n:02d}", f"00:{2 * (10 - n):02d}")
                                          for n in range(1, 11))]
COMPILE = line(32, "(EngineCore_DP0 pid=11) INFO 10-21 09:12:36 [backends.py:548] Using cache directory: "
                   "/root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone for vLLM's torch.compile")


@pytest.mark.parametrize(
    ("observations", "ratio", "end"),
    [
        pytest.param(LOAD, None, None, id="downloading reports nothing: no ratio, no ETA"),
        pytest.param([*LOAD, *SHARDS[:1]], 0.0, None, id="one report: a ratio, but no ETA before two"),
        pytest.param([*LOAD, *SHARDS[:2]], 0.1, 12 + 18, id="two reports: the engine's own estimate of what is left"),
        pytest.param([*LOAD, *SHARDS[:4]], 0.3, 16 + 14, id="the third shard: the last report's estimate"),
        pytest.param([*LOAD, *SHARDS], 1.0, None, id="the bar is full: what is left of the phase is not counted"),
        pytest.param([*LOAD, *SHARDS, COMPILE], None, None, id="compiling reports nothing: no ratio, no ETA"),
        pytest.param(
            [*LOAD, *SHARDS[:4], COMPILE, SHARDS[4]], None, None,
            id="a late rank's shard record after the start moved on is not the current phase's",
        ),
        pytest.param(
            [*LOAD, *SHARDS[:4], shard(17, 0, 3, "00:00", "?"), shard(18, 1, 3, "00:01", "00:02")], 1 / 3, 18 + 2,
            id="another bar in the same phase (a draft model's shards) starts over",
        ),
    ],
)
def test_progress_and_phase_eta_from_vllm_shard_records(observations, ratio, end):
    found = progress.current(fold(observations).attempt)
    assert (found.ratio if found else None) == pytest.approx(ratio)
    assert progress.phase_end(found) == pytest.approx(end)


def ollama(t: float, text: str) -> LogLine:
    return line(t, f'time=2025-07-24T09:29:{t:06.3f}Z level=DEBUG source=server.go:643 msg="{text}"')


def test_a_fraction_without_an_estimate_gives_an_eta_from_its_rate():
    """Ollama's runner prints only how far it is: what is left at the rate since the first report."""
    start = [ollama(0, "starting llama server"), ollama(1, "model load progress 0.10")]
    assert progress.phase_end(progress.current(fold(start, "ollama").attempt)) is None
    found = progress.current(fold([*start, ollama(5, "model load progress 0.30")], "ollama").attempt)
    assert (found.item, found.done, found.total) == ("", 0.30, 1.0)
    assert progress.phase_end(found) == pytest.approx(5 + 0.70 / (0.20 / 4))


def test_a_bar_that_does_not_move_gives_no_eta():
    still = [ollama(0, "starting llama server"), ollama(1, "model load progress 0.10"), ollama(9, "model load progress 0.10")]
    assert progress.phase_end(progress.current(fold(still, "ollama").attempt)) is None


def test_a_bar_that_arrives_in_one_burst_is_dated_by_its_elapsed_field():
    """A \\r bar reaches the journal when it ends; each redraw is folded at the time it was drawn."""
    burst = ("\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/67 [00:00<?, ?it/s]"
             "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  49%|████▉     | 33/67 [00:02<00:02, 14.21it/s]"
             "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:04<00:00, 14.80it/s]")
    entry = {"MESSAGE": burst.encode(), "_SYSTEMD_UNIT": U, "_SYSTEMD_INVOCATION_ID": "a"}
    state = fold([*LOAD, *SHARDS, COMPILE, *to_observations(entry, 100.0, frozenset({U}))])
    found = progress.current(state.attempt)
    assert state.phase is Phase.CAPTURING_GRAPHS and found is not None
    assert (found.item, found.done, found.total, found.reports) == ("graph", 67, 67, 3)
    assert (found.first_at, found.at) == (96.0, 100.0)
    assert found.longest_wait == pytest.approx(2.0)


def _bar(advanced_at: list[float]) -> UnitState:
    """A 10-shard bar with one shard done at each time given, its first report at 0."""
    shards = [shard(0, 0, 10, "00:00", "?")]
    shards += [shard(t, n, 10, "00:00", "00:09") for n, t in enumerate(advanced_at, 1)]
    return fold([line(-1, "(EngineCore_DP0 pid=11) Loading model from scratch..."), *shards])


@pytest.mark.parametrize(
    ("advanced_at", "now", "stopped"),
    [
        pytest.param([2, 4, 6], 6 + 299, None, id="quiet for less than the stall threshold"),
        pytest.param([2, 4, 6], 6 + 300, 300, id="steady every 2s, then nothing for the stall threshold"),
        pytest.param([2], 2 + 900, None, id="one advance is no steady pace"),
        pytest.param([200, 400], 400 + 500, None, id="a shard every 200s: 500s is slow, not stopped"),
        pytest.param([200, 400], 400 + 600, 600, id="a shard every 200s: three times that is stopped"),
        pytest.param([2, 4, 6, 8, 10, 12, 14, 16, 18, 20], 20 + 900, None, id="a full bar has nothing left to stop on"),
    ],
)
def test_a_bar_that_stops_after_advancing_steadily(advanced_at, now, stopped):
    found = progress.current(_bar(advanced_at).attempt)
    assert progress.stopped_for(found, now, LIMITS.stall) == (None if stopped is None else pytest.approx(stopped))


# The unit's history: each phase's typical duration, and the whole start's.
HISTORY = Expectation(
    {Phase.DOWNLOADING: Span(5, 6, 3), Phase.LOADING_WEIGHTS: Span(40, 50, 3), Phase.COMPILING: Span(60, 70, 3),
     Phase.CAPTURING_GRAPHS: Span(10, 12, 3), Phase.STARTING_API: Span(5, 6, 3)},
    Span(130, 150, 3),
)


@pytest.mark.parametrize(
    ("observations", "expected", "now", "ready"),
    [
        pytest.param([*LOAD, *SHARDS[:4]], None, 17, None, id="no history: no whole-start ETA, however good the phase's"),
        pytest.param([*LOAD, *SHARDS[:4]], HISTORY, 17, 30 + 60 + 10 + 5, id="the phase's end, then the phases ahead as usual"),
        pytest.param([*LOAD, *SHARDS[:4]], HISTORY, 45, 45 + 60 + 10 + 5, id="the phase's end has passed: from now"),
        pytest.param([*LOAD, *SHARDS[:1]], HISTORY, 11, 0 + 130, id="no phase ETA yet: the typical start"),
        pytest.param([*LOAD, *SHARDS[:4]], Expectation({}, None), 17, None, id="history of failed starts only: none"),
    ],
)
def test_the_whole_start_eta(observations, expected, now, ready):
    attempt = fold(observations).attempt
    assert progress.ready_at(expected, attempt, now) == pytest.approx(ready)


def _snapshot(state: UnitState, now: float, expected: Expectation | None = None) -> Snapshot:
    view = UnitView(state, Verdict.PROGRESSING, expected)
    return Snapshot(t=now, wall_offset=WALL, units=(view,), stale_after=6.0, stall_after=LIMITS.stall)


@pytest.mark.parametrize(
    ("observations", "now", "says", "absent"),
    [
        pytest.param([*LOAD, *SHARDS[:4]], 17, "loading_weights 7.0s  3/10 shards (30%), ~13s left  startup", "no new",
                     id="how far, and how much longer"),
        pytest.param([*LOAD, *SHARDS[:4]], 33, "3/10 shards (30%), due 3.0s ago", "left", id="the ETA has passed"),
        pytest.param([*LOAD, *SHARDS[:4]], 16 + 300, "3/10 shards (30%), no new shard for 5m00s", "left",
                     id="the bar stopped: it says so, whatever the other signals"),
        pytest.param([*LOAD, *SHARDS[:1]], 11, "loading_weights 1.0s  0/10 shards (0%)  startup", "left",
                     id="one report: no ETA"),
        pytest.param([*LOAD, *SHARDS, COMPILE], 40, "compiling 8.0s  startup", "shards", id="a phase with no reports"),
    ],
)
def test_status_line(observations, now, says, absent):
    text = status_line(_snapshot(fold(observations), now).units[0], _snapshot(fold(observations), now))
    assert says in text and absent not in text, text


def test_json_document_and_metrics():
    state = fold([*LOAD, *SHARDS[:4]])
    snap = _snapshot(state, 17, HISTORY)
    doc = unit_document(snap.units[0], snap)
    assert doc["progress"] == {"item": "shard", "done": 3, "total": 10, "ratio": 0.3, "last_report": "2023-11-14T22:13:36.000Z",
                               "last_advance": "2023-11-14T22:13:36.000Z", "stopped_seconds": None}
    assert doc["phase_expected_end"] == "2023-11-14T22:13:50.000Z"  # the last report (16) + 14 s
    assert doc["expected_ready"] == "2023-11-14T22:15:05.000Z"  # 30 + 60 + 10 + 5
    assert doc["expected_remaining_seconds"] == pytest.approx(105 - 17)

    exposition = Exposition(lambda: snap, process=False)().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(exposition) for s in f.samples}
    unit = (("unit", U),)
    assert samples[("llmstartup_phase_progress_ratio", unit)] == pytest.approx(0.3)
    assert samples[("llmstartup_phase_progress_done", (("item", "shard"), *unit))] == 3
    assert samples[("llmstartup_phase_progress_target", (("item", "shard"), *unit))] == 10
    assert samples[("llmstartup_phase_expected_end_timestamp_seconds", unit)] == pytest.approx(WALL + 30)
    assert samples[("llmstartup_startup_expected_ready_timestamp_seconds", unit)] == pytest.approx(WALL + 105)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by .ci/setup (Debian package prometheus)"
    lint = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_no_progress_no_series():
    snap = _snapshot(fold([*LOAD, *SHARDS, COMPILE]), 40)
    doc = unit_document(snap.units[0], snap)
    assert (doc["progress"], doc["phase_expected_end"], doc["expected_ready"]) == (None, None, None)
    text = Exposition(lambda: snap, process=False)().decode()
    for name in ("phase_progress_ratio", "phase_progress_done", "phase_progress_target",
                 "phase_expected_end_timestamp_seconds", "startup_expected_ready_timestamp_seconds"):
        assert f"\nllmstartup_{name}{{" not in text, name
