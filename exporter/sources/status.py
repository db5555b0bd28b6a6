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

    @property
    def failing(self) -> bool:
        """Down after trying; False before the first report."""
        return self._failing is True

    def ok(self, detail: str = "") -> None:
        if self._failing is not False:
            self._logger.info("%s source up%s", self.name, f": {detail}" if detail else "")
        self._failing = False
        self.health = SourceHealth(up=True, last_success=self._wall())

    def down(self, why: str) -> None:
        if self._failing is not True:
            self._logger.warning("%s source down: %s", self.name, why)
        self._failing = True
        self.health = SourceHealth(up=False, last_success=self.health.last_success)
