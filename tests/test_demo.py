"""`llmstartup demo`: its private journald namespace and scripted vLLM unit reach ready under the agent,
and Ctrl-C or SIGTERM stops it all, with exit 0 and nothing left behind.

The demo follows the host's own model-server units instead when it finds any: run it where none runs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.shell.demo import run, sandbox
from tests.needs import needs
from tests.scrape import Scrape, fetch, free_port, try_fetch, wait_for


def _why_no_sandbox() -> str | None:
    try:
        sandbox.preflight()
    except RuntimeError as error:
        return str(error)
    return None


WHY_NOT = _why_no_sandbox()
pytestmark = needs(WHY_NOT is None, f"the demo's journald sandbox: {WHY_NOT}", root=True)


def _demo(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    port, out = free_port(), tmp_path / "demo.out"
    with open(out, "w") as sink:
        demo = subprocess.Popen([sys.executable, "-m", "exporter", "demo", "--web.listen-address", f"127.0.0.1:{port}"],
                                stdout=sink, stderr=subprocess.STDOUT)
    return demo, port, out


def _nothing_left() -> None:
    cgroup = sandbox.cgroup2_root() / sandbox.SLICE / run.UNIT
    runtime = sandbox.RUN_SYSTEMD / f"journal.{run.NAMESPACE}"
    assert not cgroup.exists(), f"the demo unit's cgroup {cgroup} was left"
    assert not runtime.exists(), f"the demo's journald namespace {runtime} was left"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_the_demo_reaches_ready_and_stops(stop, tmp_path):
    demo, port, out = _demo(tmp_path)
    try:
        if stop is signal.SIGINT:  # the whole startup, about a minute: silent compile, CUDA-graph bar, ready
            wait_for(lambda: "ready; the phases took:" in out.read_text() or demo.poll() is not None, 180,
                     "the demo unit to reach ready")
            assert demo.poll() is None, out.read_text()
            s = Scrape(fetch(port))
            assert (s.one_of("unit_phase", run.UNIT, "phase"), s.one_of("unit_verdict", run.UNIT, "verdict")) == \
                ("ready", "ready")
            text = out.read_text()
            assert "compiling" in text and "silent_progress" in text, text
        else:  # as soon as it serves: mid-startup
            wait_for(lambda: try_fetch(port) or demo.poll() is not None, 60, "the demo to serve /metrics")
            assert demo.poll() is None, out.read_text()
        demo.send_signal(stop)
        assert demo.wait(timeout=30) == 0, out.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert "demo: stopping" in out.read_text() and "Traceback" not in out.read_text(), out.read_text()
    _nothing_left()
