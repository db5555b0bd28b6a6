"""The agent's settings as one frozen value, and the parsing of durations and unit flags; pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from exporter.core.model import Limits

DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
STATE_PATH = Path("/var/lib/llmstartup/history.db")  # the systemd unit's StateDirectory=llmstartup
UNIT_NAME = re.compile(r"[\w@:.\\-]+")
# A pod's container: NAMESPACE/POD/CONTAINER (DNS labels, a pod's name a DNS subdomain)
POD_UNIT = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?/[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-z0-9]([a-z0-9-]*[a-z0-9])?")
PODS = Path("/var/log/pods")  # kubelet's pod logs; its links to them are in /var/log/containers beside it
DOCKER = Path("/var/lib/docker")  # Docker's data root


def parse_duration(text: str) -> float:
    """Seconds from a Prometheus duration (`90s`, `5m`, `1h30m`, `500ms`) or plain seconds (`2.5`)."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 5m, 1h30m or plain seconds") from None
        seconds = sum(float(n) * SECONDS[u] for n, u in parts)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{text!r}: a duration must be more than zero")
    return seconds


def parse_unit(text: str) -> tuple[str, str | None]:
    """`NAME[=ENGINE]` → (NAME with `.service` added when it has no suffix, ENGINE or None); a pod's
    container `NAMESPACE/POD/CONTAINER` is its own name."""
    name, _, engine = text.partition("=")
    if POD_UNIT.fullmatch(name):
        return name, engine or None
    if not UNIT_NAME.fullmatch(name):
        raise ValueError(f"{text!r} is not a unit name")
    if "." not in name:
        name += ".service"
    return name, engine or None


def parse_pattern(text: str) -> re.Pattern[str]:
    """A regular expression a whole unit name must match (as node_exporter's --collector.*.unit-include)."""
    try:
        return re.compile(text)
    except re.error as error:
        raise ValueError(f"{text!r} is not a regular expression: {error}") from None


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT` → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True, slots=True)
class Config:
    units: tuple[tuple[str, str | None], ...] = ()  # empty: discover model-server units
    namespace: str | None = None
    directory: Path | None = None
    listen: tuple[str, int] = ("127.0.0.1", 9847)
    interval: float = 2.0
    silence: float = 60.0
    stall: float = 300.0
    state_path: Path | None = STATE_PATH  # None: keep no history
    history_writes: bool = True  # serve keeps the history; status and wait only read the agent's
    gpu: bool = True
    stacks: bool = False  # --collector.stacks: Python stacks of silent units through py-spy
    cgroup_root: Path | None = None  # None: found from /proc/self/mountinfo
    web_config: Path | None = None  # --web.config.file: TLS, basic auth and headers (exporter-toolkit format)
    pods: Path | None = PODS  # None: no Kubernetes pods (--no-collector.containers)
    docker: Path | None = DOCKER  # None: no Docker containers
    container_include: re.Pattern[str] | None = None  # containers whose unit matches (whole), default all
    container_exclude: re.Pattern[str] | None = None

    @property
    def limits(self) -> Limits:
        # Three missed samples make evidence stale: one late sample is jitter, three is a failing source.
        return Limits(silence=self.silence, stall=self.stall, stale=3 * self.interval + 1, gpu=self.gpu,
                      stacks=self.stacks, stack_every=self.stack_every)

    @property
    def stack_every(self) -> float:
        """Seconds between two looks at a silent unit's processes: a quarter of the time between silence
        and stall, so that unchanged stacks are seen several times before a stall is called; never more
        often than the processes are sampled, and at least once a minute, so that where a unit is stuck
        stays fresh (a py-spy dump costs about 10 ms of CPU, the reason not to look more often)."""
        return min(60.0, max(self.interval, (self.stall - self.silence) / 4))
