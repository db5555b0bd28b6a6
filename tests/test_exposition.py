"""The /metrics body an Exposition keeps is always what a fresh rendering of the same snapshot gives:
the part it renders again only when a phase or a start ends is never stale."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.model import Expectation, Group, Outcome, Phase, Snapshot, Span, frozen_map
from exporter.shell.exposition import Exposition
from tests.test_golden import SNAPSHOT

Change = Callable[[Snapshot], Snapshot]


def _view(snap: Snapshot, index: int, **changes: object) -> Snapshot:
    """The snapshot with its unit `index` published otherwise."""
    units = list(snap.units)
    units[index] = replace(units[index], **changes)
    return replace(snap, units=tuple(units))


def _unit(index: int, **changes: object) -> Change:
    """A change to the state of the snapshot's unit `index`."""
    return lambda snap: _view(snap, index, state=replace(snap.units[index].state, **changes))


def _later(snap: Snapshot) -> Snapshot:
    return replace(snap, t=snap.t + 2.0)


def _gpus_stale(snap: Snapshot) -> Snapshot:
    """Past the GPU samples' staleness: their series go, in the part rendered every snapshot."""
    return replace(snap, t=snap.t + 10.0)


def _phase_ended(snap: Snapshot) -> Snapshot:
    state = snap.units[3].state  # vllm-llama.service, ready
    loading = state.phase_durations[Phase.LOADING_WEIGHTS].observe(130.0)
    return _unit(3, phase_durations=frozen_map({**state.phase_durations, Phase.LOADING_WEIGHTS: loading}),
                 last_phase_durations=frozen_map({**state.last_phase_durations, Phase.LOADING_WEIGHTS: 130.0}))(snap)


def _start_ended(snap: Snapshot) -> Snapshot:
    state = snap.units[3].state
    return _unit(3, startups=frozen_map({Outcome.READY: 1, Outcome.FAILED: 1}),
                 startup_durations=frozen_map({**state.startup_durations,
                                               Outcome.FAILED: state.startup_durations[Outcome.READY].observe(40.0)}))(snap)


def _learned(snap: Snapshot) -> Snapshot:
    return _view(snap, 3, expected=Expectation(frozen_map({Phase.LOADING_WEIGHTS: Span(100.0, 130.0, 4)})))


def _unit_gone(snap: Snapshot) -> Snapshot:
    return replace(snap, units=snap.units[:3] + snap.units[4:])


def _unit_renamed(snap: Snapshot) -> Snapshot:
    return _unit(3, unit="vllm-llama-2.service")(snap)


@pytest.mark.parametrize("changes", [
    pytest.param([_later, _later, _gpus_stale], id="ticks with nothing finished"),
    pytest.param([_later, _phase_ended, _later], id="a phase ends"),
    pytest.param([_start_ended], id="a start ends"),
    pytest.param([_later, _learned], id="the history learns what a phase takes"),
    pytest.param([_unit_gone, _later], id="a unit goes"),
    pytest.param([_unit_renamed], id="a unit that is another one"),
    pytest.param([_phase_ended, _start_ended, _unit_gone, _later], id="one after another"),
])
def test_each_scrape_shows_what_a_fresh_rendering_shows(changes: list[Change]) -> None:
    current = SNAPSHOT
    exposition = Exposition(lambda: current, process=False)
    exposition()
    for change in changes:
        current = change(current)
        body = exposition()
        assert body == Exposition(lambda snap=current: snap, process=False)(), change.__name__
    assert exposition() is body, "a second scrape of the same snapshot renders nothing again"


def test_what_changes_shows() -> None:
    current = SNAPSHOT
    exposition = Exposition(lambda: current, process=False)
    count = 'llmstartup_phase_duration_seconds_count{phase="loading_weights",unit="vllm-llama.service"}'
    gpu = 'llmstartup_gpu_memory_used_bytes{gpu="0",unit="vllm-glm5.service"}'
    assert f"{count} 1.0" in (body := exposition().decode()) and gpu in body
    current = _phase_ended(_later(current))
    assert f"{count} 2.0" in (body := exposition().decode()) and gpu in body
    current = _gpus_stale(current)
    assert f"{count} 2.0" in (body := exposition().decode()) and gpu not in body


KIMI = 5  # vllm-kimi.service: the second host of a start over two, stalled in capturing_graphs


def _group_series(snap: Snapshot) -> list[dict[str, str]]:
    text = Exposition(lambda: snap, process=False)().decode()
    return [s.labels for f in text_string_to_metric_families(text) if f.name == "llmstartup_unit_group_info"
            for s in f.samples]


def _attempt(**changes: object) -> Change:
    return lambda snap: _unit(KIMI, attempt=replace(snap.units[KIMI].state.attempt, **changes))(snap)


@pytest.mark.parametrize(
    ("change", "want"),
    [
        pytest.param(lambda snap: snap, [{"unit": "vllm-kimi.service", "group": "10.0.0.1:29501", "node_rank": "1",
                                          "nnodes": "2"}], id="one host's part of a start over two"),
        pytest.param(_attempt(group=Group("10.0.0.1:29501", world_size=16, local_world_size=8)),
                     [{"unit": "vllm-kimi.service", "group": "10.0.0.1:29501", "node_rank": "", "nnodes": "2"}],
                     id="hosts from its ranks, node rank not said"),
        pytest.param(_attempt(group=Group("127.0.0.1:41227")), [], id="a rendezvous on one host: alone"),
        pytest.param(_attempt(group=None), [], id="nothing said"),
        pytest.param(_attempt(phase=Phase.FAILED, ended=900.0),
                     [{"unit": "vllm-kimi.service", "group": "10.0.0.1:29501", "node_rank": "1", "nnodes": "2"}],
                     id="failed: still the member that holds its group back"),
        pytest.param(_attempt(phase=Phase.INACTIVE, ended=900.0), [], id="stopped: it left its group"),
    ],
)
def test_group_info(change: Change, want: list[dict[str, str]]) -> None:
    assert _group_series(change(SNAPSHOT)) == want
