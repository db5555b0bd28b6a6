"""What `status`, `wait` and the landing page say of a unit (exporter/core/report.py): its status line."""

from __future__ import annotations

import pytest

from exporter.core.model import (
    Attempt,
    Expectation,
    Phase,
    Snapshot,
    Span,
    UnitState,
    UnitView,
    Verdict,
    frozen_map,
)
from exporter.core.report import status_line

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
