"""The /metrics body: prometheus_client's rendering of a snapshot, redone only for the part that changed."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from exporter.core.model import Snapshot
from exporter.shell.collector import HistoryCollector, SnapshotCollector, UnitRecord, unit_records


class Exposition:
    """What /metrics serves, called per scrape. Rendering costs milliseconds (prometheus_client escapes
    every label of every sample), so it is done once per snapshot: every scrape between two ticks gets the
    same bytes. Of that, the families of finished phases and starts (over half the lines) are rendered
    again only when a unit's record changed, that is when one of its phases or starts ended. `process`:
    with the agent's own process metrics (prometheus_client's ProcessCollector), read at each rendering."""

    def __init__(self, snapshot: Callable[[], Snapshot], process: bool = True) -> None:
        self._snapshot = snapshot
        self._snap: Snapshot | None = None
        self._records: tuple[UnitRecord, ...] | None = None
        self._live, self._history = CollectorRegistry(), CollectorRegistry()
        self._live.register(SnapshotCollector(lambda: self._snap))  # type: ignore[arg-type, return-value]
        if process:
            ProcessCollector(namespace="llmstartup_exporter", registry=self._live)
        self._history.register(HistoryCollector(lambda: self._records or ()))
        self._body = self._history_body = b""
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        snap = self._snapshot()
        with self._lock:
            if snap is not self._snap:
                self._snap = snap
                records = unit_records(snap)
                if records != self._records:
                    self._records = records
                    self._history_body = generate_latest(self._history)
                self._body = generate_latest(self._live) + self._history_body
            return self._body
