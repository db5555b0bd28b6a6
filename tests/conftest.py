"""Shared fixtures: a real private journald namespace, and scripted vLLM units logging into it; the
`system` mark (tests that need root), the `needs` mark (tests/needs.py), and the run's closing lines."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exporter.shell.demo import sandbox
from tests.container_runtime import CGROUP2, Node
from tests.fake_nvml.fixtures import fake_nvml, fake_nvml_lib, fake_nvml_lib_no_v3  # noqa: F401
from tests.needs import UNDER_CI, missing
from tests.scrape import INTERVAL, SILENCE, STALL, free_port, try_fetch, wait_for

# A test that uses one of these fixtures, itself or through another, needs root and a real journald.
SYSTEM_FIXTURES = frozenset({"journald"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "system: needs root: a real journald, cgroups (set by tests/conftest.py)")
    config.addinivalue_line("markers", "needs(found, what, root=False): see tests/needs.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `system` every test that needs root, so that `-m "not system"` runs the others; skip (outside
    CI) the tests whose `needs` mark is not met."""
    for item in items:
        needs = list(item.iter_markers("needs"))
        if any(mark.kwargs.get("root") for mark in needs) or SYSTEM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.system)
        for found, what in (mark.args for mark in needs):
            if not found and not UNDER_CI:
                item.add_marker(pytest.mark.skip(reason=what))


def pytest_runtest_setup(item: pytest.Item) -> None:
    for found, what in (mark.args for mark in item.iter_markers("needs")):
        if not found:
            missing(what)  # under CI: a failure


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The lines every run ends with, passed or not: one call per section (add yours here)."""
    _skips(terminalreporter)


def _skips(reporter: Any) -> None:
    reasons = Counter(_skip_reason(report) for report in reporter.stats.get("skipped", ()))
    reporter.section("skips")
    for reason, n in reasons.most_common():
        reporter.write_line(f"{n:5d} skipped: {reason}")
    if deselected := len(reporter.stats.get("deselected", ())):
        reporter.write_line(f"{deselected:5d} deselected (-m or -k)")
    reporter.write_line(f"{sum(reasons.values()):5d} skipped in all; " + (
        "under CI (CI=true) a missing set-up step fails instead" if UNDER_CI
        else "set CI=true to make a missing set-up step (.ci/setup) fail instead of skip"))


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.fixture(scope="session")
def journald() -> Iterator[sandbox.Journald]:
    """One `systemd-journald llmstartup-test-<random>` for the session; skipped where it cannot run (failed under CI)."""
    try:
        sandbox.preflight()
    except RuntimeError as err:
        missing(f"no real journald sandbox on this machine: {err}")
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


@pytest.fixture
def small_disk(tmp_path) -> Iterator:
    """A 1 MiB tmpfs: a small state volume (an emptyDir with a sizeLimit), to fill."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True)
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=True)
