"""Shared fixtures: a real private journald namespace, and scripted vLLM units logging into it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import pytest

from exporter.shell.demo import sandbox
from tests.container_runtime import CGROUP2, Node
from tests.fake_nvml.fixtures import fake_nvml, fake_nvml_lib, fake_nvml_lib_no_v3  # noqa: F401
from tests.scrape import INTERVAL, SILENCE, STALL, free_port, try_fetch, wait_for


@pytest.fixture(scope="session")
def journald() -> Iterator[sandbox.Journald]:
    """One `systemd-journald llmstartup-test-<random>` for the session; skipped where it cannot run."""
    try:
        sandbox.preflight()
    except RuntimeError as err:
        pytest.skip(f"no real journald sandbox on this machine: {err}")
    with sandbox.Journald(f"llmstartup-test-{secrets.token_hex(4)}") as instance:
        yield instance


@pytest.fixture
def units(journald: sandbox.Journald, tmp_path) -> Iterator[Callable[..., sandbox.Unit]]:
    """`start(name_suffix, steps, env=None) -> Unit`: run exporter.shell.demo.vllm_startup as a unit.

    The unit is `test-<random>-<name_suffix>.service`, the random part fixed per test, so starting
    the same suffix again (after stopping it) is a restart with a new invocation id. `steps` is a
    scenario step list, or the name of a built-in scenario ("demo"). Every unit started is stopped
    at teardown.
    """
    prefix = f"test-{secrets.token_hex(3)}"
    started: list[sandbox.Unit] = []

    def start(
        name_suffix: str, steps: list[dict[str, Any]] | str, env: dict[str, str] | None = None
    ) -> sandbox.Unit:
        if isinstance(steps, str):
            source = ["--scenario", steps]
        else:
            path = tmp_path / f"{name_suffix}-{len(started)}.json"
            path.write_text(json.dumps(steps))
            source = [str(path)]
        argv = [sys.executable, "-m", "exporter.shell.demo.vllm_startup", *source]
        unit = sandbox.start_unit(journald, f"{prefix}-{name_suffix}.service", argv, env)
        started.append(unit)
        return unit

    yield start
    for unit in reversed(started):
        unit.stop()


def _message(entry: dict[str, Any]) -> str:
    value = entry.get("MESSAGE", "")
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@pytest.fixture
def journal_records(journald: sandbox.Journald) -> Callable[..., list[dict[str, Any]]]:
    """`records(unit, until, timeout=15.0) -> entries`: poll the journal for the unit's entries.

    Returns every entry with `_SYSTEMD_UNIT=unit.name` (all invocations, oldest first) once
    `until(entries)` is true; fails the test with the messages seen when the deadline passes.
    """

    def records(
        unit: sandbox.Unit, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            reader = journald.reader(_SYSTEMD_UNIT=unit.name)
            try:
                entries = list(reader)
            finally:
                reader.close()
            if until(entries):
                return entries
            if time.monotonic() > deadline:
                seen = "\n".join(repr(_message(e)[:200]) for e in entries[-20:])
                pytest.fail(
                    f"{unit.name}: the journal did not reach the expected state in {timeout} s; "
                    f"last entries:\n{seen}"
                )
            time.sleep(0.05)

    return records


@pytest.fixture
def agent(journald: sandbox.Journald, tmp_path) -> Callable[..., int]:
    """`start(*units, env=None, gpu=False, args=()) -> port`: run the real `llmstartup serve` on the test
    journald with the end-to-end thresholds (and `args`); SIGTERM at teardown must stop it cleanly."""
    started: list[subprocess.Popen] = []

    def start(*units: str, env: dict[str, str] | None = None, gpu: bool = False, args: tuple[str, ...] = ()) -> int:
        port = free_port()
        argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
                "--web.listen-address", f"127.0.0.1:{port}", "--sample.interval", f"{INTERVAL:g}s",
                "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s",
                "--collector.gpu" if gpu else "--no-collector.gpu", "--state.path", str(tmp_path / "state.db")]
        for unit in units:
            argv += ["--unit", unit]
        argv += args
        log = open(tmp_path / f"agent-{len(started)}.log", "w")
        started.append(subprocess.Popen(argv, stderr=log, env=env))
        wait_for(lambda: try_fetch(port), 15, "the agent to serve /metrics")
        return port

    yield start
    for process in started:
        if process.poll() is None:  # a test may have killed it on purpose
            process.terminate()
            assert process.wait(timeout=10) == 0, "the agent did not stop cleanly on SIGTERM"


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    """A node's container runtimes faked at their files (kubelet's pod logs, Docker's data root, under
    tmp_path), their containers real processes in real cgroups (tests/container_runtime.py); all stopped after."""
    if os.geteuid() != 0 or CGROUP2 is None:
        pytest.skip("needs root and a cgroup2 mount, as the container runtimes do")
    runtimes = Node(tmp_path / "node")
    yield runtimes
    runtimes.close()
