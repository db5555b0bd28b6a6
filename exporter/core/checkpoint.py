"""What an agent knows, saved for the agent after it: each caught-up unit's state and the journal
position it reflects; pure.

A restarted agent (a crash, an upgrade) that finds a checkpoint of this boot takes the states over and
reads the journal on from the checkpoint's cursor: its first scrape costs the lines written since the
last save, whatever the journal holds before (a server that has served a million lines this boot).
When the cursor cannot be used (the journal was vacuumed past it, or it is garbage), the states are
read again from the journal as a first start reads them, and only their process side is taken over
(`resumed`): what the agent before watched of each start still running, so that a stillness across
the gap is judged across it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.core import codec
from exporter.core.model import Resumed, UnitState, frozen_map


@dataclass(frozen=True, slots=True)
class Checkpoint:
    cursor: str | None  # the journal entry the states include, the last one
    states: Mapping[str, UnitState] = field(default_factory=frozen_map)


def dump(states: Iterable[UnitState], boot_id: str, cursor: str | None) -> str:
    return json.dumps({"boot_id": boot_id, "cursor": cursor, "states": [codec.encode(s) for s in states]})


def load(text: str | None, boot_id: str) -> Checkpoint | None:
    """The checkpoint saved in this boot (monotonic times mean nothing across boots); None for none,
    another boot's, or one that cannot be read (the agent then starts as a first start does)."""
    try:
        data = json.loads(text or "null")
        if not isinstance(data, dict) or data.get("boot_id") != boot_id:
            return None
        states = [codec.decode(UnitState, item) for item in data["states"]]
        cursor = data["cursor"]
        if cursor is not None and not isinstance(cursor, str):
            return None
    except (ValueError, KeyError, TypeError):
        return None
    return Checkpoint(cursor, frozen_map({s.unit: s for s in states}))


def resumed(checkpoint: Checkpoint) -> dict[str, Resumed]:
    """The process side of each start still running in the checkpoint's states."""
    out = {}
    for state in checkpoint.states.values():
        attempt, sample = state.attempt, state.last_process
        if attempt is None or attempt.ended is not None or sample is None or state.watched_since is None:
            continue
        out[state.unit] = Resumed(sample.t, state.unit, attempt.invocation, attempt.started, state.watched_since,
                                  state.moved, sample)
    return out
