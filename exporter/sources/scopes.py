"""Where each container's processes are: the cgroup named after its id, found in the cgroup v2 tree."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from exporter.core.containers import scope_id

# A container's cgroup can appear a moment after its log file and kubelet's link (the runtime creates it
# when it starts the task): an id not found is looked for again after 1 round, then 2, 4, … up to a minute.
RETRY_MAX = 60.0
# An id not found for this long is a container that ended (or never started): it has no processes.
GONE_AFTER = 10.0


class ContainerScopes:
    """Container id → its cgroup directory. The tree is walked only when an id never looked for is asked
    for, or a missing one is due to be looked for again; a container's cgroup keeps its name for its life."""

    def __init__(self, cgroup_root: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.cgroup_root = Path(cgroup_root)
        self._clock = clock
        self._found: dict[str, Path] = {}
        self._missing: dict[str, tuple[float, float, float]] = {}  # id → (first asked, next look, delay)
        self.walks = 0

    def find(self, ids: Iterable[str]) -> None:
        """Look for these containers' cgroups (walking the tree if one is new or due); forget the rest."""
        wanted = set(ids)
        now = self._clock()
        new = wanted - self._found.keys() - self._missing.keys()
        due = {i for i in wanted & self._missing.keys() if self._missing[i][1] <= now}
        if new or due:
            self.walks += 1
            self._found.update({i: p for i, p in walk(self.cgroup_root).items() if i in wanted})
        self._found = {i: p for i, p in self._found.items() if i in wanted}
        missing = {}
        for i in sorted(wanted - self._found.keys()):
            first, next_look, delay = self._missing.get(i, (now, now, 0.0))
            if next_look <= now:  # looked for just now: next time, twice as late
                delay = min(max(2 * delay, 1.0), RETRY_MAX)
                next_look = now + delay
            missing[i] = (first, next_look, delay)
        self._missing = missing

    def cgroup(self, container_id: str) -> Path | None:
        """The container's cgroup directory (which no longer exists once it ended); None while not found."""
        return self._found.get(container_id)

    def gone(self, container_id: str) -> bool:
        """Looked for long enough and not found: the container has no processes."""
        missing = self._missing.get(container_id)
        return missing is not None and self._clock() - missing[0] >= GONE_AFTER


def walk(root: Path) -> dict[str, Path]:
    """Every container cgroup under `root`, by container id.

    Below a container's cgroup is the container's own business; a systemd service or a session scope holds
    no container, so neither is entered (on a host, most of the tree).
    """
    found: dict[str, Path] = {}
    stack = [os.fspath(root)]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:  # removed meanwhile, or not ours to read
            continue
        with entries:
            for entry in entries:
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                if container := scope_id(entry.name):
                    found[container] = Path(entry.path)
                elif not entry.name.endswith((".service", ".scope", ".mount", ".socket")):
                    stack.append(entry.path)
    return found
