"""Xid errors: name the GPU a kernel line means, count each event once, find the units it hits; pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from exporter.core.model import Fault, Gpu, Reason, UnitState, XidError, frozen_map

# The kernel line and NVML's event report the same Xid within moments of each other.
SAME_EVENT = 5.0


def bus_key(bus_id: str) -> str:
    """`0000:3b:00`, `00000000:3B:00.0` → `3b:00`: bus and device, as both spellings carry them."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


def resolve(xid: XidError, gpus: Iterable[Gpu]) -> XidError:
    """The kernel names a GPU by PCI bus; give it NVML's index when one matches."""
    for gpu in gpus:
        if gpu.bus_id and bus_key(gpu.bus_id) == bus_key(xid.gpu):
            return replace(xid, gpu=gpu.index)
    return xid


def is_repeat(xid: XidError, recent: Iterable[XidError]) -> bool:
    return any(
        r.gpu == xid.gpu and r.xid == xid.xid and r.source != xid.source and abs(r.t - xid.t) <= SAME_EVENT
        for r in recent
    )


def faults(xid: XidError, states: Iterable[UnitState]) -> list[Fault]:
    """Every unit with memory on the GPU is hit; its attempt fails with reason gpu_xid if it dies."""
    return [
        Fault(xid.t, state.unit, Reason.GPU_XID)
        for state in states
        if state.last_gpu and state.last_gpu.memory.get(xid.gpu)
    ]


@dataclass(frozen=True, slots=True)
class XidTally:
    """Every Xid event counted once, per (GPU, Xid); and the recent ones, to know the other report of each."""

    counts: Mapping[tuple[str, int], int] = field(default_factory=frozen_map)
    recent: tuple[XidError, ...] = ()


def count(
    tally: XidTally, found: Iterable[XidError], gpus: Iterable[Gpu], states: Iterable[UnitState], now: float
) -> tuple[XidTally, list[XidError], list[Fault]]:
    """The tally after these reports, the events that were new, and the faults they are for the units hit."""
    gpus, states = tuple(gpus), tuple(states)
    recent = [x for x in tally.recent if now - x.t <= SAME_EVENT]
    counts = dict(tally.counts)
    new: list[XidError] = []
    hits: list[Fault] = []
    for xid in found:
        xid = resolve(xid, gpus)
        if is_repeat(xid, recent):
            continue
        recent.append(xid)
        new.append(xid)
        counts[(xid.gpu, xid.xid)] = counts.get((xid.gpu, xid.xid), 0) + 1
        hits += faults(xid, states)
    return XidTally(frozen_map(counts), tuple(recent)), new, hits
