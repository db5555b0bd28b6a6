"""A node's container runtimes, faked at their files: kubelet's and Docker's directories at their real layouts
(under a test's directory), real processes in real cgroups at the paths containerd and Docker create with the
systemd cgroup driver, their output written by tests/container_shim.py in the runtime's format.

    node = Node(tmp_path)
    pod = node.run_pod("default", "vllm-0", "vllm", argv)     # /var/log/pods/default_vllm-0_<uid>/vllm/0.log
    node.rotate(pod)                                           # kubelet's log rotation
    again = node.restart(pod, argv)                            # restart 1: a new container id, 1.log
    docker = node.run_docker("vllm", argv)                     # /var/lib/docker/containers/<id>/…
    node.close()                                               # every process killed, every cgroup removed

Needs root and a cgroup2 mount, as the real runtimes do.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from exporter.sources.processes import find_cgroup2_root

ROOT = Path(__file__).resolve().parent.parent
CGROUP2 = find_cgroup2_root()
# vLLM's image runs `python3 -m vllm.entrypoints.openai.api_server`: the scripted startup, with that command line
VLLM = [sys.executable, "-c", "import sys; from exporter.shell.demo.vllm_startup import main; sys.exit(main(sys.argv[2:]))",
        "vllm.entrypoints.openai.api_server"]


def poll(check, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)
    return result


def _pids(cgroup: Path) -> set[int]:
    pids: set[int] = set()
    for directory, _, _ in os.walk(cgroup):
        try:
            pids.update(int(p) for p in Path(directory, "cgroup.procs").read_text().split())
        except OSError:
            pass
    return pids


@dataclass(eq=False)
class RunningContainer:
    """One start of a container: the shim, the container's cgroup and its log file."""

    id: str
    cgroup: Path
    log: Path
    shim: subprocess.Popen[bytes]
    restart: int = 0
    uid: str = ""  # a pod's
    directory: Path | None = None  # a Docker container's
    names: tuple[str, str, str] = ("", "", "")  # a pod's namespace, pod, container
    cgroups: list[Path] = field(default_factory=list)  # created for it: its scope and the slices above

    def pids(self) -> set[int]:
        return _pids(self.cgroup)

    def crash(self, sig: int = signal.SIGKILL) -> int:
        """Every process of the container killed by `sig` (SIGKILL: as the OOM killer would); the shim's status."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return self.shim.wait(timeout=15)

    def wait(self, timeout: float = 60) -> int:
        return self.shim.wait(timeout=timeout)

    def remove(self) -> None:
        if self.shim.poll() is None:
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
            except OSError:
                pass
            self.crash()
        deadline = time.monotonic() + 10
        while self.cgroup.exists():  # right after its last process exits, a cgroup may still be busy a moment
            try:
                self.cgroup.rmdir()
            except OSError as error:
                if error.errno == errno.ENOENT:
                    break
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class Node:
    """kubelet's /var/log/pods and /var/log/containers and Docker's /var/lib/docker under `root`."""

    def __init__(self, root: Path) -> None:
        if CGROUP2 is None:
            raise RuntimeError("no cgroup2 mount")
        self.pods = root / "var" / "log" / "pods"
        self.links = root / "var" / "log" / "containers"
        self.docker = root / "var" / "lib" / "docker"
        for directory in (self.pods, self.links, self.docker / "containers"):
            directory.mkdir(parents=True, exist_ok=True)
        self.started: list[RunningContainer] = []
        self._tag = secrets.token_hex(3)  # this node's cgroups, apart from another test's

    # --- kubelet and containerd ---

    def run_pod(self, namespace: str, pod: str, container: str, argv: list[str], *, uid: str | None = None,
                restart: int = 0, qos: str = "burstable") -> RunningContainer:
        """Start a pod's container as kubelet and containerd do: its log directory and file, kubelet's link,
        its cgroup (systemd driver: kubepods.slice/kubepods-QOS.slice/kubepods-QOS-podUID.slice/cri-containerd-ID.scope)."""
        uid = uid or str(uuid.uuid4())
        directory = self.pods / f"{namespace}_{pod}_{uid}" / container
        directory.mkdir(parents=True, exist_ok=True)
        container_id = secrets.token_hex(32)
        pod_slice = f"kubepods-{qos}-pod{uid.replace('-', '_')}.slice"
        slices = [CGROUP2 / "kubepods.slice", CGROUP2 / "kubepods.slice" / f"kubepods-{qos}.slice"]
        scope = slices[-1] / pod_slice / f"cri-containerd-{container_id}.scope"
        created = self._cgroup(scope)
        log = directory / f"{restart}.log"
        # kubelet links the log before it starts the container; containerd creates the file at the start
        (self.links / f"{pod}_{namespace}_{container}-{container_id}.log").symlink_to(log)
        shim = self._shim(["--cri", str(log)], scope, argv)
        running = RunningContainer(container_id, scope, log, shim, restart, uid, names=(namespace, pod, container),
                                   cgroups=created)
        self.started.append(running)
        # started: its processes are in the scope, or a container that ends at once has already ended
        poll(lambda: log.exists() and (_pids(scope) or shim.poll() is not None), 10, "the container to run")
        return running

    def restart(self, previous: RunningContainer, argv: list[str]) -> RunningContainer:
        """kubelet starts the container again: a new container, restart count + 1; the old one's link stays."""
        if previous.directory is not None:
            return self._restart_docker(previous, argv)
        previous.wait(timeout=15)
        namespace, pod, container = previous.names
        return self.run_pod(namespace, pod, container, argv, uid=previous.uid, restart=previous.restart + 1)

    def rotate(self, running: RunningContainer) -> Path:
        """kubelet's rotateLog: compress the rotated files not compressed yet, rename the log to
        LOG.YYYYMMDD-hhmmss, and ask the runtime to reopen it (ReopenContainerLog). Returns the rotated file."""
        import gzip

        for rotated in sorted(running.log.parent.glob(running.log.name + ".*")):
            if rotated.name.endswith((".gz", ".tmp")):
                continue
            temporary = Path(f"{rotated}.tmp")
            with open(rotated, "rb") as source, gzip.open(temporary, "wb") as target:
                target.write(source.read())
            os.rename(temporary, f"{rotated}.gz")
            rotated.unlink()
        # kubelet's stamp has whole seconds: two rotations within one second would collide
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        while Path(f"{running.log}.{stamp}").exists() or Path(f"{running.log}.{stamp}.gz").exists():
            time.sleep(0.05)
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        rotated = Path(f"{running.log}.{stamp}")
        os.rename(running.log, rotated)
        running.shim.send_signal(signal.SIGUSR1)
        poll(lambda: running.log.exists() or running.shim.poll() is not None, 10, "the runtime to reopen the log")
        return rotated

    # --- Docker ---

    def run_docker(self, name: str, argv: list[str], *, driver: str = "json-file", max_size: int = 0,
                   max_file: int = 1, journal_socket: Path | None = None) -> RunningContainer:
        """Start a container as dockerd does: /var/lib/docker/containers/ID/ with config.v2.json and
        hostconfig.json, its cgroup system.slice/docker-ID.scope, its output in ID-json.log (json-file) or
        sent to the journal by "dockerd" (journald)."""
        container_id = secrets.token_hex(32)
        directory = self.docker / "containers" / container_id
        directory.mkdir(mode=0o710)
        log = directory / f"{container_id}-json.log"
        now = datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        config = {
            "StreamConfig": {},
            "State": {"Running": False, "Paused": False, "Restarting": False, "OOMKilled": False,
                      "RemovalInProgress": False, "Dead": False, "Pid": 0, "ExitCode": 0, "Error": "",
                      "StartedAt": "0001-01-01T00:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z", "Health": None},
            "ID": container_id, "Created": now, "Managed": False, "Path": argv[0], "Args": argv[1:],
            "Config": {"Hostname": container_id[:12], "Image": "vllm/vllm-openai:v0.11.0", "Cmd": argv[1:]},
            "Image": "sha256:" + secrets.token_hex(32), "Name": f"/{name}", "RestartCount": 0,
            "Driver": "overlay2", "LogPath": str(log) if driver == "json-file" else "",
        }
        (directory / "config.v2.json").write_text(json.dumps(config))
        options = {"max-size": str(max_size), "max-file": str(max_file)} if max_size else {}
        (directory / "hostconfig.json").write_text(json.dumps({"LogConfig": {"Type": driver, "Config": options}}))
        return self._start_docker(container_id, directory, log, argv, driver, max_size, max_file, journal_socket, 0)

    def _restart_docker(self, previous: RunningContainer, argv: list[str]) -> RunningContainer:
        """`docker restart` (or a restart policy): the same container and log, a new run."""
        previous.wait(timeout=15)
        assert previous.directory is not None
        config = json.loads((previous.directory / "config.v2.json").read_text())
        host = json.loads((previous.directory / "hostconfig.json").read_text())["LogConfig"]
        config["RestartCount"] += 1
        (previous.directory / "config.v2.json").write_text(json.dumps(config))
        return self._start_docker(previous.id, previous.directory, previous.log, argv, host["Type"],
                                  int(host["Config"].get("max-size", 0)), int(host["Config"].get("max-file", 1)),
                                  None, previous.restart + 1)

    def _start_docker(self, container_id, directory, log, argv, driver, max_size, max_file, journal_socket, restart):
        scope = CGROUP2 / "system.slice" / f"docker-{container_id}.scope"
        created = self._cgroup(scope)
        if driver == "json-file":
            output = ["--json-file", str(log), "--max-size", str(max_size), "--max-file", str(max_file)]
        else:
            output = ["--journald", str(journal_socket), "--name", json.loads((directory / "config.v2.json").read_text())["Name"][1:],
                      "--id", container_id]
        started_before = self._docker_state(directory)["StartedAt"]
        shim = self._shim([*output, "--docker-config", str(directory)], scope, argv)
        running = RunningContainer(container_id, scope, log, shim, restart, directory=directory, cgroups=created)
        self.started.append(running)
        # dockerd's StartedAt of this run: "Running" alone may already be false again for a container that ends at once
        poll(lambda: self._docker_state(directory)["StartedAt"] != started_before, 10, "dockerd's state")
        return running

    @staticmethod
    def _docker_state(directory: Path) -> dict:
        return json.loads((directory / "config.v2.json").read_text())["State"]

    # --- both ---

    def _cgroup(self, scope: Path) -> list[Path]:
        created = [p for p in (scope, *scope.parents) if p != CGROUP2 and CGROUP2 in p.parents and not p.exists()]
        scope.mkdir(parents=True, exist_ok=True)
        return created  # deepest first

    def _shim(self, output: list[str], cgroup: Path, argv: list[str]) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "tests.container_shim", *output, "--cgroup", str(cgroup), "--", *argv]
        return subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def close(self) -> None:
        for running in reversed(self.started):
            running.remove()
        for cgroup in sorted({c for r in self.started for c in r.cgroups}, key=lambda p: len(p.parts), reverse=True):
            try:
                cgroup.rmdir()
            except OSError:
                pass  # gone already, or a slice another test's container still uses
