"""What an agent has watched of the starts in progress, as JSON for the agent that follows it; pure."""

from __future__ import annotations

import json
from typing import Iterable

from exporter.core.model import ProcessSample, ProcessState, Resumed, Signal, UnitState, frozen_map


def dump(states: Iterable[UnitState], boot_id: str) -> str:
    units = {}
    for state in states:
        attempt, sample = state.attempt, state.last_process
        if attempt is None or attempt.ended is not None or sample is None or state.watched_since is None:
            continue
        units[state.unit] = {
            "invocation": attempt.invocation,
            "attempt_started": attempt.started,
            "watched_since": state.watched_since,
            "moved": {str(s): t for s, t in state.moved.items()},
            "sample": {
                "t": sample.t, "ids": sorted(sample.ids), "cpu_seconds": sample.cpu_seconds,
                "read_bytes": sample.read_bytes, "written_bytes": sample.written_bytes,
                "rss_bytes": sample.rss_bytes, "states": {str(k): v for k, v in sample.states.items()},
                "started_at": sample.started_at,
            },
        }
    return json.dumps({"boot_id": boot_id, "units": units})


def load(text: str | None, boot_id: str) -> dict[str, Resumed]:
    """The saved evidence, if it is from this boot (monotonic times mean nothing across boots).

    Anything unreadable is no evidence: the agent then watches from zero, as a first start would.
    """
    try:
        data = json.loads(text or "{}")
        if data.get("boot_id") != boot_id:
            return {}
        resumed = {}
        for unit, saved in data.get("units", {}).items():
            sample = saved["sample"]
            resumed[unit] = Resumed(
                t=float(sample["t"]),
                unit=unit,
                invocation=str(saved["invocation"]),
                attempt_started=float(saved["attempt_started"]),
                watched_since=float(saved["watched_since"]),
                moved=frozen_map({Signal(s): float(t) for s, t in saved["moved"].items()}),
                sample=ProcessSample(
                    t=float(sample["t"]),
                    unit=unit,
                    ids=frozenset((int(pid), float(start)) for pid, start in sample["ids"]),
                    cpu_seconds=float(sample["cpu_seconds"]),
                    read_bytes=int(sample["read_bytes"]),
                    written_bytes=int(sample["written_bytes"]),
                    rss_bytes=int(sample["rss_bytes"]),
                    states=frozen_map({ProcessState(k): int(v) for k, v in sample["states"].items()}),
                    started_at=None if sample["started_at"] is None else float(sample["started_at"]),
                ),
            )
        return resumed
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
