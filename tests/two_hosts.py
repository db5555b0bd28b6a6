"""Two hosts on this machine: two network namespaces joined by a veth pair, each with its own journald namespace
and its own `llmstartup serve`, for a start that spans them (tests/test_hosts.py).

    from tests.two_hosts import two_hosts  # noqa: F401  (the fixture)

    def test_something(two_hosts):
        a, b = two_hosts()                     # each host's agent follows its own unit, a.unit and b.unit
        a.start([sys.executable, ...])         # a.unit: in a's network namespace, logging to a's journald
        a.address, a.port                      # 10.213.0.1, where a's agent serves on 127.0.0.1

A unit's processes see only their host's network: the veth pair (10.213.0.1, 10.213.0.2) and loopback, and
GLOO_SOCKET_IFNAME names the veth, as a real multi-host start names its interface. What the two hosts share is
the kernel: one cgroup tree, so their units have names of their own (real hosts would both run `vllm.service`),
and each agent follows its own. The agents run in the root network namespace, so that a Prometheus there
scrapes both (`instance` tells them apart by port). Needs root, `ip` and `nsenter`; everything is removed at the
test's end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from exporter.shell.demo import sandbox
from tests.needs import missing
from tests.scrape import INTERVAL, SILENCE, STALL, free_port, try_fetch, wait_for

SUBNET = "10.213.0"


@dataclass(eq=False)
class Host:
    namespace: str  # the network namespace, /run/netns/<namespace>
    interface: str  # its end of the veth pair
    address: str
    journald: sandbox.Journald
    unit: str  # the model server's unit, which its agent follows
    port: int = 0  # its agent's, on 127.0.0.1
    started: list[sandbox.Unit] = field(default_factory=list)

    @property
    def instance(self) -> str:
        """The host as Prometheus names it."""
        return f"127.0.0.1:{self.port}"

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> sandbox.Unit:
        """`argv` as this host's unit: in its network namespace, logging to its journald."""
        unit = sandbox.start_unit(self.journald, self.unit, ["nsenter", f"--net=/run/netns/{self.namespace}", *argv],
                                  {"GLOO_SOCKET_IFNAME": self.interface, **(env or {})})
        self.started.append(unit)
        return unit


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _end(unit: sandbox.Unit) -> None:
    """At once: a rank waiting in a rendezvous, or stopped, answers SIGTERM late or never."""
    try:
        (unit.cgroup / "cgroup.kill").write_text("1")
    except OSError:
        pass
    unit.stop()


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Callable[..., tuple[Host, Host]]]:
    """`start(args=()) -> (a, b)`: the two hosts, each with its agent following its unit at the end-to-end
    thresholds of tests/scrape.py (and `args`)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
        missing("two hosts need root, `ip` (iproute2) and `nsenter` (util-linux)")
    tag = secrets.token_hex(3)
    hosts: list[Host] = []
    agents: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    made: list[str] = []

    def start(args: tuple[str, ...] = ()) -> tuple[Host, Host]:
        for n, side in enumerate("ab", start=1):
            namespace = f"llms-{tag}-{side}"
            _ip("netns", "add", namespace)
            made.append(namespace)
            journald = sandbox.Journald(f"llmstartup-test-{tag}-{side}").start()
            hosts.append(Host(namespace, f"llms{tag}{side}", f"{SUBNET}.{n}", journald, f"test-{tag}-{side}-vllm.service"))
        a, b = hosts
        _ip("link", "add", a.interface, "type", "veth", "peer", "name", b.interface)
        for host in hosts:
            _ip("link", "set", host.interface, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        for host in hosts:
            host.port = free_port()
            argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", host.journald.namespace,
                    "--web.listen-address", f"127.0.0.1:{host.port}", "--sample.interval", f"{INTERVAL:g}s",
                    "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s", "--no-collector.gpu",
                    "--state.path", str(tmp_path / f"{host.namespace}.db"), "--unit", host.unit, *args]
            logs.append(open(tmp_path / f"agent-{host.namespace}.log", "wb"))  # noqa: SIM115 (closed at teardown)
            agents.append(subprocess.Popen(argv, stderr=logs[-1]))
        for host in hosts:
            wait_for(lambda port=host.port: try_fetch(port), 15, f"{host.namespace}'s agent to serve /metrics")
        return a, b

    yield start
    for host in hosts:
        for unit in host.started:
            _end(unit)
    for process in agents:
        process.terminate()
        assert process.wait(timeout=10) == 0, "an agent did not stop cleanly on SIGTERM"
    for log in logs:
        log.close()
    for host in hosts:
        host.journald.stop()
    for namespace in made:  # its end of the veth pair goes with it, and the other end with that
        _ip("netns", "delete", namespace)
