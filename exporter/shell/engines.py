"""Which engine each watched unit runs: named by a flag, or told from its processes' command lines."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from exporter.core import grammar
from exporter.core.grammar import Grammar

logger = logging.getLogger(__name__)

DEFAULT_ENGINE = "vllm"  # a unit named without its engine, until its command lines say which


class EngineNames:
    """The watched units and their engines.

    `--unit NAME=ENGINE` names both; `--unit NAME` names the unit and leaves its engine to its command
    lines; with no `--unit` at all, every unit whose command lines name an engine is watched.
    """

    def __init__(self, named: Iterable[tuple[str, str | None]], grammars: Mapping[str, Grammar]) -> None:
        self._engines: dict[str, str | None] = dict(named)  # None: not known yet
        self._named = frozenset(self._engines)
        self._discovering = not self._engines
        self._grammars = tuple(grammars.values())

    @property
    def units(self) -> list[str]:
        return sorted(self._engines)

    def __contains__(self, unit: str) -> bool:
        return unit in self._engines

    def forget(self, unit: str) -> bool:
        """No longer watch this discovered unit (a container that was removed); one named by a flag stays."""
        if unit in self._named or unit not in self._engines:
            return False
        del self._engines[unit]
        return True

    def engine(self, unit: str) -> str:
        return self._engines.get(unit) or DEFAULT_ENGINE

    def unknown(self, unit: str) -> bool:
        """Named by a flag, engine not known yet."""
        return unit in self._engines and self._engines[unit] is None

    def found(self, cmdlines: Mapping[str, Iterable[str]]) -> dict[str, str]:
        """Units newly named from these command lines (unit → its processes'), with their engines."""
        named = {}
        for unit, lines in cmdlines.items():
            engine = self.of(lines)
            if engine is None or not (self.unknown(unit) or (self._discovering and unit not in self._engines)):
                continue
            how = "detected from its command line" if unit in self._engines else "discovered"
            self._engines[unit] = named[unit] = engine
            logger.info("unit=%s engine=%s %s", unit, engine, how)
        return named

    def of(self, cmdlines: Iterable[str]) -> str | None:
        """The engine the first command line that names one names."""
        return next((e for c in cmdlines if (e := grammar.detect(self._grammars, c))), None)
