"""Wires one running agent: sources, agent loop, private registry and HTTP server; and stops it."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector

from exporter.agent import Agent
from exporter.collector import SnapshotCollector
from exporter.config import Config
from exporter.http import make_app, serve
from exporter.sources.gpu import GpuSource
from exporter.sources.journal import JournalPlace, JournalSource
from exporter.sources.processes import ProcessSource, find_cgroup2_root

logger = logging.getLogger(__name__)


class StartError(Exception):
    """The agent cannot start; the message says what to fix."""


@dataclass
class Runtime:
    agent: Agent
    journal: JournalSource
    gpu: GpuSource | None
    server: WSGIServer | None
    cgroup_root: Path

    @classmethod
    def start(cls, config: Config, http: bool = True) -> Runtime:
        """Start the sources (and /metrics when `http`); the caller runs the agent's loop."""
        if config.directory is not None and not config.directory.is_dir():
            raise StartError(f"--journal.directory {config.directory}: no such directory")
        cgroup_root = config.cgroup_root or find_cgroup2_root()
        if cgroup_root is None or not cgroup_root.is_dir():
            raise StartError(
                f"no cgroup v2 hierarchy at {cgroup_root or 'any mount in /proc/self/mountinfo'}; "
                "units are found by their cgroup (use --path.cgroupfs to point at it)"
            )
        journal = JournalSource(JournalPlace(config.namespace, config.directory))
        gpu = GpuSource(config.interval) if config.gpu else None
        agent = Agent(config, journal, ProcessSource(cgroup_root), gpu)
        registry = CollectorRegistry()
        registry.register(SnapshotCollector(lambda: agent.snapshot))
        ProcessCollector(namespace="llmstartup_exporter", registry=registry)
        server = None
        if http:
            try:
                server, _ = serve(*config.listen, make_app(registry, lambda: agent.snapshot))
            except OSError as error:
                raise StartError(f"cannot listen on {config.listen[0]}:{config.listen[1]}: {error.strerror}") from None
        journal.start()
        if gpu:
            gpu.start()
        return cls(agent, journal, gpu, server, cgroup_root)

    def close(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
        self.journal.stop()
        if self.gpu:
            self.gpu.stop()


def run_in_thread(config: Config) -> tuple[Runtime, threading.Event, threading.Thread]:
    """Start an agent whose loop runs on a thread: for the demo and the tests."""
    runtime = Runtime.start(config)
    stop = threading.Event()
    thread = threading.Thread(target=runtime.agent.run, args=(stop,), name="agent", daemon=True)
    thread.start()
    return runtime, stop, thread
