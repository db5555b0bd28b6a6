"""Up or down for one source, logged on transitions only (never on every tick)."""

from __future__ import annotations

import logging
import time
from typing import Callable

from exporter.core.model import SourceHealth


class SourceStatus:
    def __init__(self, name: str, logger: logging.Logger, wall: Callable[[], float] = time.time) -> None:
        self.name = name
        self._logger = logger
        self._wall = wall
        self._failing: bool | None = None  # None until the first report
        self.health = SourceHealth(up=False)
        self.absent: str | None = None  # why it is down, when what it reads is not on this host at all

    @property
    def failing(self) -> bool:
        """Down after trying; False before the first report."""
        return self._failing is True

    def ok(self, detail: str = "") -> None:
        if self._failing is not False:
            self._logger.info("%s source up%s", self.name, f": {detail}" if detail else "")
        self._failing = False
        self.absent = None
        self.health = SourceHealth(up=True, last_success=self._wall())

    def down(self, why: str, absent: bool = False) -> None:
        """Down, with the reason; `absent`: what the source reads is not on this host (no NVIDIA driver), which
        is no fault: said once as information, in the reason's own words."""
        if self._failing is not True:
            if absent:
                self._logger.info("%s", why)
            else:
                self._logger.warning("%s source down: %s", self.name, why)
        self._failing = True
        self.absent = why if absent else None
        self.health = SourceHealth(up=False, last_success=self.health.last_success, why=why)
