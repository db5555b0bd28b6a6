"""What `status`, `wait` and the landing page say of a unit (exporter/core/report.py): its status line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.core.model import (
    Attempt,
    Expectation,
    Group,
    Phase,
    Snapshot,
    Span,
    UnitState,
    UnitView,
    Verdict,
    frozen_map,
)
from exporter.core.report import status_line, unit_document

# A start 15 minutes in, compiling for the last 10 of them.
COMPILING = UnitState("vllm.service", "vllm", attempt=Attempt(
    started=100.0, phase=Phase.COMPILING, phase_since=400.0,
    spans=((Phase.LAUNCHING, 100.0), (Phase.LOADING_WEIGHTS, 130.0), (Phase.COMPILING, 400.0))), last_log=700.0)
NOW = Snapshot(t=1000.0, wall_offset=0.0)


def _expect(compiling_longest: float, startup_typical: float) -> Expectation:
    return Expectation(frozen_map({Phase.COMPILING: Span(compiling_longest / 2, compiling_longest, 5)}),
                       Span(startup_typical, startup_typical * 1.2, 5))


@pytest.mark.parametrize(
    ("expected", "says", "never"),
    [
        pytest.param(None, [], ["expected ready", "slower than usual"], id="no history: no promise"),
        pytest.param(_expect(900.0, 1500.0), ["expected ready in ~10m00s"], ["slower than usual"],
                     id="on time: the typical start's rest"),
        pytest.param(_expect(500.0, 1500.0), ["expected ready in ~10m00s",
                                              "slower than usual (longest compiling before: 8m20s)"], [],
                     id="past the longest compile it ever took: slower than usual"),
        pytest.param(_expect(500.0, 600.0), ["expected ready in ~0.0s", "slower than usual"], [],
                     id="past the typical start: ready any moment, never a negative wait"),
    ],
)
def test_what_the_history_promises(expected, says, never):
    line = status_line(UnitView(COMPILING, Verdict.SILENT_PROGRESS, expected), NOW)
    assert line.startswith("vllm.service  compiling 10m00s  startup 15m00s  no log for 5m00s")
    assert line.endswith(": silent_progress")
    for text in says:
        assert text in line, line
    for text in never:
        assert text not in line, line


def test_a_settled_start_promises_nothing():
    ready = Attempt(started=100.0, phase=Phase.READY, phase_since=400.0, ready_at=400.0,
                    spans=((Phase.LAUNCHING, 100.0), (Phase.READY, 400.0)))
    view = UnitView(UnitState("vllm.service", "vllm", attempt=ready), Verdict.READY, _expect(10.0, 20.0))
    assert status_line(view, NOW) == "vllm.service  ready 10m00s  ready after 5m00s: ready"


@pytest.mark.parametrize(
    ("group", "says"),
    [
        pytest.param(Group("10.0.0.1:29501", 2, 1), "node 1 of 2 hosts at 10.0.0.1:29501", id="one host of a start over two"),
        pytest.param(Group("10.0.0.1:29501", world_size=16, local_world_size=8), "of 2 hosts at 10.0.0.1:29501",
                     id="its node rank not said"),
        pytest.param(Group("127.0.0.1:41227"), None, id="alone"),
    ],
)
def test_a_start_over_several_hosts_says_which_host_this_is(group: Group, says: str | None) -> None:
    view = UnitView(replace(COMPILING, attempt=replace(COMPILING.attempt, group=group)), Verdict.SILENT_PROGRESS)
    line, document = status_line(view, NOW), unit_document(view, NOW)
    if says is None:
        assert " hosts at " not in line and document["group"] is None
    else:
        assert f"  {says}  " in line
        assert document["group"] == {"address": group.address, "nnodes": 2, "node_rank": group.node_rank}
