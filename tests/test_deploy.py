"""deploy/llmstartup.service: `systemd-analyze verify` passes and `systemd-analyze security` rates its
exposure at most 3.0, both offline (no systemd as PID 1 needed).

`verify` checks that ExecStart's binary exists and is executable, and the unit's binary lives at
/opt/llmstartup/bin/llmstartup on a real host. The test verifies a copy of the unit, in a directory of
its own under the same name, whose ExecStart points at the `llmstartup` entry point installed next to
this Python (or, where there is none, at a stub script); everything else is the file as shipped. The
shipped file itself is verified too, and the only complaint allowed is that missing binary.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import needs

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "llmstartup.service"
SHIPPED_BINARY = "/opt/llmstartup/bin/llmstartup"
MAX_EXPOSURE = 3.0

ANALYZE = shutil.which("systemd-analyze")
pytestmark = needs(ANALYZE, "systemd-analyze (Debian package systemd)")


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ANALYZE, *args], check=False, capture_output=True, text=True, timeout=120)


@pytest.fixture
def runnable_unit(tmp_path: Path) -> Path:
    """A copy of the unit whose ExecStart binary exists here."""
    binary = Path(sys.executable).parent / "llmstartup"
    if not binary.exists():
        binary = tmp_path / "llmstartup"
        binary.write_text("#!/bin/sh\nexit 0\n")
        binary.chmod(0o755)
    text = UNIT.read_text()
    assert text.count(SHIPPED_BINARY) == 1
    copy = tmp_path / "unit" / UNIT.name
    copy.parent.mkdir()
    copy.write_text(text.replace(SHIPPED_BINARY, str(binary)))
    return copy


def test_verify_passes(runnable_unit: Path) -> None:
    result = _analyze("verify", "--man=no", str(runnable_unit))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr  # not even a warning


def test_verify_of_the_shipped_file_only_misses_the_binary() -> None:
    result = _analyze("verify", "--man=no", str(UNIT))
    complaints = [line for line in result.stderr.splitlines() if line.strip()]
    assert complaints == [
        f"{UNIT.name}: Command {SHIPPED_BINARY} is not executable: No such file or directory"
    ]


def exposure(unit: Path) -> float:
    result = _analyze("security", "--offline=yes", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    return float(match[1])


def test_exposure_is_at_most_3() -> None:
    level = exposure(UNIT)
    assert level <= MAX_EXPOSURE, (
        f"exposure {level} > {MAX_EXPOSURE}:\n" + _analyze("security", "--offline=yes", str(UNIT)).stdout
    )
    # systemd-analyze's own check agrees: --threshold is on its 0-100 scale (exposure × 10).
    result = _analyze("security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}", str(UNIT))
    assert result.returncode == 0, result.stdout + result.stderr


def test_threshold_check_is_not_vacuous(tmp_path: Path) -> None:
    """The same unit stripped of its hardening is rated far above 3.0, so the check above can fail."""
    bare = tmp_path / UNIT.name
    kept = ("[", "Description=", "ExecStart=", "    ", "Type=", "Restart", "WantedBy=")
    bare.write_text("".join(line for line in UNIT.read_text().splitlines(True) if line.startswith(kept)))
    assert exposure(bare) > 9.0
    result = _analyze("security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}", str(bare))
    assert result.returncode != 0


def settings() -> dict[str, list[str]]:
    """Key → values of the unit file (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", UNIT.read_text())
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_unit_says_what_the_issue_asks() -> None:
    s = settings()
    assert s["DynamicUser"] == ["yes"] and "User" not in s, "no root"
    assert s["SupplementaryGroups"] == ["systemd-journal"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["StateDirectory"] == ["llmstartup"]
    assert "--state.path /var/lib/llmstartup/history.db" in s["ExecStart"][0]
    assert s["Restart"] == ["on-failure"]
    assert s["MemoryMax"]
    assert "PrivateDevices" not in s, "PrivateDevices=yes hides /dev/nvidia*"
    assert s["DevicePolicy"] == ["closed"]
    assert any(v.startswith("char-nvidia") for v in s["DeviceAllow"])
    assert s["ProtectControlGroups"] == ["yes"], "the cgroup tree, read-only"
    assert s.get("ProtectProc", ["default"]) == ["default"], "other users' /proc/<pid> must stay visible"
    assert s.get("ProcSubset", ["all"]) == ["all"], "/proc/stat and /proc/driver/nvidia are needed"


def test_the_stacks_drop_in_grants_ptrace_alone_and_keeps_the_sandbox(runnable_unit: Path) -> None:
    """deploy/llmstartup-stacks.conf, the opt-in for --collector.stacks: it verifies beside the unit, adds
    CAP_SYS_PTRACE and nothing else, and the exposure stays under the bar."""
    drop_in = ROOT / "deploy" / "llmstartup-stacks.conf"
    lines = [line for line in drop_in.read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["[Service]", "CapabilityBoundingSet=CAP_SYS_PTRACE", "AmbientCapabilities=CAP_SYS_PTRACE"]
    (runnable_unit.parent / f"{UNIT.name}.d").mkdir()
    (runnable_unit.parent / f"{UNIT.name}.d" / "stacks.conf").write_text(drop_in.read_text())
    result = _analyze("verify", "--man=no", str(runnable_unit))
    assert result.returncode == 0 and result.stderr.strip() == "", result.stdout + result.stderr
    report = _analyze("security", "--offline=yes", str(runnable_unit)).stdout
    assert "✗ CapabilityBoundingSet=~CAP_SYS_PTRACE" in report  # the drop-in is read, and is all that changes
    assert exposure(runnable_unit) <= MAX_EXPOSURE
