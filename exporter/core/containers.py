"""Containers as units: what a container is called, and how runtimes name its cgroup and log files; pure.

A pod's container is the unit `namespace/pod/container` (one per container, across its restarts); a
Docker container is its name. The layouts below are the runtimes' own (kubelet, containerd, CRI-O,
Docker, Podman), read from paths and file names only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Container:
    """A container the agent can follow as a unit."""

    unit: str  # "namespace/pod/container", or the Docker container's name
    id: str  # the runtime's container id (64 hex digits): its cgroup is named after it
    namespace: str = ""  # a pod's: the `namespace`, `pod` and `container` labels of unit_info
    pod: str = ""
    name: str = ""  # the container's name in its pod, or Docker's name

    @property
    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.name}


def pod_unit(namespace: str, pod: str, container: str) -> str:
    return f"{namespace}/{pod}/{container}"


# The cgroup a runtime runs a container in, named after its id: under the systemd cgroup driver a scope
# (containerd `cri-containerd-ID.scope`, CRI-O `crio-ID.scope`, Docker `docker-ID.scope`, Podman
# `libpod-ID.scope`), under the cgroupfs driver a directory (containerd's and Docker's bare `ID`, CRI-O's
# `crio-ID`). CRI-O's and Podman's monitor (`crio-conmon-ID`, `libpod-conmon-ID`) is no container.
SCOPE = re.compile(r"(?:(?:cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?")


def scope_id(name: str) -> str | None:
    """The container id a cgroup directory's name carries; None for any other cgroup."""
    found = SCOPE.fullmatch(name)
    return found.group(1) if found else None


# kubelet's link to a container's current log file: /var/log/containers/POD_NAMESPACE_CONTAINER-ID.log
# (pod and namespace names hold no `_`; a container name holds no `_` either, but may hold `-`).
KUBELET_LINK = re.compile(
    r"(?P<pod>[^_/]+)_(?P<namespace>[^_/]+)_(?P<container>[^_/]+)-(?P<id>[0-9a-f]{64})\.log"
)
# kubelet's log files: /var/log/pods/NAMESPACE_POD_UID/CONTAINER/RESTART.log, rotated to
# RESTART.log.YYYYMMDD-hhmmss, and that compressed to .gz at the next rotation.
POD_LOG = re.compile(
    r"(?:^|/)(?P<namespace>[^/_]+)_(?P<pod>[^/_]+)_(?P<uid>[^/_]+)/(?P<container>[^/_]+)/(?P<restart>\d+)\.log"
    r"(?P<rotated>\.\d{8}-\d{6}(?:\.gz)?)?$"
)
# Docker's json-file log: /var/lib/docker/containers/ID/ID-json.log, rotated to ID-json.log.1, .2, … (.gz)
DOCKER_LOG = re.compile(r"(?:^|/)(?P<id>[0-9a-f]{64})-json\.log(?P<rotated>\.\d+(?:\.gz)?)?$")


@dataclass(frozen=True, slots=True)
class PodLog:
    """Where one start of a pod's container writes: its pod (by uid) and its restart count."""

    namespace: str
    pod: str
    uid: str
    container: str
    restart: int

    @property
    def unit(self) -> str:
        return pod_unit(self.namespace, self.pod, self.container)

    @property
    def directory(self) -> str:
        """The container's directory under the pods' log directory."""
        return f"{self.namespace}_{self.pod}_{self.uid}/{self.container}"

    @property
    def invocation(self) -> str:
        """One start of the container: a new pod (uid) or a restart is a new attempt."""
        return f"{self.uid}/{self.container}/{self.restart}"


def pod_log(path: str) -> PodLog | None:
    """What a kubelet log file's path says (its rotated names too); None for any other path."""
    found = POD_LOG.search(path)
    if not found:
        return None
    return PodLog(found["namespace"], found["pod"], found["uid"], found["container"], int(found["restart"]))


def kubelet_link(name: str) -> tuple[str, str, str, str] | None:
    """(namespace, pod, container, id) from the name of kubelet's link; None for any other name."""
    found = KUBELET_LINK.fullmatch(name)
    return (found["namespace"], found["pod"], found["container"], found["id"]) if found else None


def log_unit(path: str) -> str | None:
    """The unit a container log file belongs to, from its path: a pod's container, or a Docker container's
    short id (its name is not in the path); None for any other path."""
    if pod := pod_log(path):
        return pod.unit
    if found := DOCKER_LOG.search(path):
        return found["id"][:12]
    return None


def rotation_order(base: str, names: Iterable[str]) -> list[str]:
    """The rotated files of the log file `base` among `names`, oldest first.

    kubelet names them after the time they were rotated (`0.log.20261129-120001`, compressed `.gz`), so
    that their names sort oldest first; Docker numbers them from the newest (`-json.log.1` is the newest).
    Temporary files (kubelet's `.tmp` while it compresses) are none of them.
    """
    rotated: list[tuple[int, str | int, str]] = []
    for name in names:
        if not name.startswith(base + ".") or name.endswith(".tmp"):
            continue
        suffix = name[len(base) + 1 :].removesuffix(".gz")
        if re.fullmatch(r"\d{8}-\d{6}", suffix):
            rotated.append((0, suffix, name))
        elif suffix.isdigit():
            rotated.append((1, -int(suffix), name))  # higher numbers are older
    return [name for *_, name in sorted(rotated)]  # a directory holds one runtime's kind, never both


# Docker stamps a start's StartedAt once the process runs; its first lines can precede that by the time
# the runtime took to hand over (well under a second), so a start is taken to begin this much earlier.
START_SLACK = 1.0


def docker_run(t: float, boundaries: tuple[tuple[float, str], ...]) -> str:
    """Which start of a Docker container a line at `t` belongs to, as an invocation id.

    `boundaries` are (from when, start) of the starts known, oldest first: the previous start's end where
    it is known, else the start's own time less START_SLACK. A line older than all of them belongs to some
    earlier start, which the file alone cannot tell apart: `before <the first known start>`.
    """
    run = f"before {boundaries[0][1]}" if boundaries else ""
    for since, start in boundaries:
        if t > since:
            run = start
    return run
