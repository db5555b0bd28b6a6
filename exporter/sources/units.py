"""Does a unit exist on this host: a unit file, a cgroup, or lines in this boot's journal."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

# Where systemd looks for unit files (systemd.unit(5), system manager), most specific first.
UNIT_DIRS = (
    Path("/etc/systemd/system"),
    Path("/run/systemd/system"),
    Path("/usr/local/lib/systemd/system"),
    Path("/lib/systemd/system"),
    Path("/usr/lib/systemd/system"),
)


def unit_exists(unit: str, cgroup_root: Path, journal_units: Iterable[str], unit_dirs: Iterable[Path] = UNIT_DIRS) -> bool:
    if unit in set(journal_units):
        return True
    if (cgroup_root / "system.slice" / unit).is_dir():
        return True
    template = unit.split("@")[0] + "@.service" if "@" in unit else None  # vllm@0.service ← vllm@.service
    return any((d / unit).exists() or (template and (d / template).exists()) for d in unit_dirs)
