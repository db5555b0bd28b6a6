"""Wires one running agent: sources, agent loop, its exposition and HTTP server; and stops it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from exporter.core.config import Config
from exporter.shell import webconfig
from exporter.shell.agent import Agent, boot_id
from exporter.shell.exposition import Exposition
from exporter.shell.history import History, HistoryError
from exporter.shell.http import Server, make_app, serve
from exporter.shell.recorder import HistoryRecorder
from exporter.sources.containers import ContainerSource
from exporter.sources.gpu import GpuSource
from exporter.sources.journal import JournalPlace
from exporter.sources.journal_process import JournalSource
from exporter.sources.journald import JournaldWatch
from exporter.sources.processes import ProcessSource, find_cgroup2_root
from exporter.sources.stacks import StackSource

logger = logging.getLogger(__name__)


class StartError(Exception):
    """The agent cannot start; the message says what to fix."""


@dataclass
class Runtime:
    agent: Agent
    journal: JournalSource
    gpu: GpuSource | None
    server: Server | None
    cgroup_root: Path
    stacks: StackSource

    @classmethod
    def start(cls, config: Config, http: bool = True) -> Runtime:
        """Start the sources (and /metrics when `http`); the caller runs the agent's loop."""
        if config.directory is not None and not config.directory.is_dir():
            raise StartError(f"--journal.directory {config.directory}: no such directory")
        cgroup_root = config.cgroup_root or find_cgroup2_root()
        # cgroup.controllers is in every cgroup v2 directory and in no v1 or plain one
        if cgroup_root is None or not (cgroup_root / "cgroup.controllers").is_file():
            raise StartError(
                f"no cgroup v2 hierarchy at {cgroup_root or 'any mount in /proc/self/mountinfo'}; "
                "units are found by their cgroup (use --path.cgroupfs to point at it)"
            )
        try:  # a bad web config stops the start before anything else is touched
            web = webconfig.load(config.web_config) if http and config.web_config else None
        except webconfig.WebConfigError as error:
            raise StartError(f"--web.config.file {error}") from None
        gpu = GpuSource(config.interval) if config.gpu else None
        history = _history(config.state_path, readonly=not config.history_writes)
        recorder = HistoryRecorder(history, boot_id(), time.monotonic) if history else None
        known = recorder.checkpoint() if recorder else None  # what the agent before this one knew
        resume = (known.cursor, frozenset(known.states)) if known and known.cursor else None
        place = JournalPlace(config.namespace, config.directory)
        journal = JournalSource(place, resume=resume, silence=config.silence)
        containers = ContainerSource(config.pods, config.docker) if config.pods or config.docker else None
        # always there: where a silent unit's processes wait is read from /proc even without stacks
        stacks = StackSource(config.interval, config.stack_every, python=config.stacks)
        agent = Agent(config, journal, ProcessSource(cgroup_root), gpu, recorder, restored=known if resume else None,
                      containers=containers, stacks=stacks, journald=JournaldWatch(place))
        journal.start()
        if gpu:
            gpu.start()
        stacks.start()
        server = None
        try:
            # Serve only once the units' history is read: the first scrape after a (re)start
            # already says where each unit is.
            agent.warm_up()
            if http:
                server = serve(*config.listen, make_app(Exposition(lambda: agent.snapshot), lambda: agent.snapshot), web)
                scheme = "https" if web and web.tls else "http"
                logger.info("serving on %s://%s:%d/metrics", scheme, *config.listen)
        except (OSError, webconfig.WebConfigError) as error:
            journal.stop()
            if gpu:
                gpu.stop()
            stacks.stop()
            if isinstance(error, webconfig.WebConfigError):  # a certificate and key that do not fit
                raise StartError(f"--web.config.file {error}") from None
            raise StartError(f"cannot listen on {config.listen[0]}:{config.listen[1]}: {error.strerror}") from None
        return cls(agent, journal, gpu, server, cgroup_root, stacks)

    def close(self) -> None:
        if self.server:
            self.server.close()
        self.agent.close()
        self.journal.stop()
        if self.gpu:
            self.gpu.stop()
        self.stacks.stop()


def _history(path: Path | None, readonly: bool) -> History | None:
    """The history, or none when it cannot be kept (or, read only, read): the agent works on, without
    expectations. `status` and `wait` say nothing of a history the agent never wrote."""
    if path is None or (readonly and not path.exists()):
        return None
    try:
        return History(path, readonly=readonly)
    except (HistoryError, OSError) as error:
        logger.error("no history: %s (expectations and 'slower than usual' are off)", error)
        return None


def run_in_thread(config: Config) -> tuple[Runtime, threading.Event, threading.Thread]:
    """Start an agent whose loop runs on a thread: for the demo and the tests."""
    runtime = Runtime.start(config)
    stop = threading.Event()
    thread = threading.Thread(target=runtime.agent.run, args=(stop,), name="agent", daemon=True)
    thread.start()
    return runtime, stop, thread
