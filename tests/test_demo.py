"""`llmstartup demo`: its private journald namespace and scripted vLLM unit reach ready under the agent,
whatever else runs on the host, and Ctrl-C or SIGTERM stops it all, with exit 0 and nothing left behind.

The demo follows only its own unit: a real model server starting beside it (llama.cpp's, a unit that `serve`
would discover) is named in one line, never followed.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.shell.demo import sandbox
from tests.needs import missing, needs
from tests.scrape import Scrape, fetch, free_port, try_fetch, wait_for
from tests.tiny_model import write_tiny_llama


def _why_no_sandbox() -> str | None:
    try:
        sandbox.preflight()
    except RuntimeError as error:
        return str(error)
    return None


WHY_NOT = _why_no_sandbox()
pytestmark = needs(WHY_NOT is None, f"the demo's journald sandbox: {WHY_NOT}", root=True)
INTRO = re.compile(r"demo: (\S+\.service) prints a vLLM startup into journald namespace (\S+);")


@pytest.fixture
def model_server_beside(journald: sandbox.Journald, tmp_path: Path) -> Iterator[str]:
    """A real model server starting on the same host: llama.cpp's server with a tiny model, as a unit (of the
    tests' journald namespace) that `serve` discovers by its command line."""
    if importlib.util.find_spec("llama_cpp") is None:
        missing("llama-cpp-python[server] (the test extra)")
    model = write_tiny_llama(tmp_path / "tiny-random-llama.gguf")
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(free_port()), "--n_ctx", "128"]
    with sandbox.start_unit(journald, "test-beside-the-demo.service", argv) as unit:
        yield unit.name


def _demo(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    port, out = free_port(), tmp_path / "demo.out"
    with open(out, "w") as sink:
        demo = subprocess.Popen([sys.executable, "-m", "exporter", "demo", "--web.listen-address", f"127.0.0.1:{port}"],
                                stdout=sink, stderr=subprocess.STDOUT)
    return demo, port, out


def _intro(demo: subprocess.Popen, out: Path) -> tuple[str, str]:
    """The demo's unit and journald namespace, as its first line names them."""
    intro = wait_for(lambda: INTRO.search(out.read_text()) or demo.poll() is not None, 60, "the demo's first line")
    assert demo.poll() is None, out.read_text()
    return intro.group(1), intro.group(2)


def _started(port: int, unit: str) -> None:
    wait_for(lambda: Scrape(fetch(port)).one_of("unit_phase", unit, "phase") not in (None, "inactive"), 60,
             f"{unit} to start under its demo's agent")


def _end(demo: subprocess.Popen) -> None:
    """A demo a failed test leaves running: SIGTERM, so that it stops its journald and unit (SIGKILL would
    leave them to the host), then SIGKILL."""
    if demo.poll() is None:
        demo.terminate()
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()


def _nothing_left(unit: str, namespace: str) -> None:
    cgroup = sandbox.cgroup2_root() / sandbox.SLICE / unit
    runtime = sandbox.RUN_SYSTEMD / f"journal.{namespace}"
    assert not cgroup.exists(), f"the demo unit's cgroup {cgroup} was left"
    assert not runtime.exists(), f"the demo's journald namespace {runtime} was left"


@pytest.mark.parametrize(
    ("stop", "beside"),
    [
        pytest.param(signal.SIGINT, True, id="Ctrl-C once ready, a real model server starting beside it"),
        pytest.param(signal.SIGTERM, False, id="SIGTERM mid-startup"),
    ],
)
def test_the_demo_shows_its_own_start_and_stops(stop, beside, request, tmp_path):
    other = request.getfixturevalue("model_server_beside") if beside else None
    demo, port, out = _demo(tmp_path)
    try:
        unit, namespace = _intro(demo, out)
        if stop is signal.SIGINT:  # the whole startup, about a minute: silent compile, CUDA-graph bar, ready
            wait_for(lambda: "ready; the phases took:" in out.read_text() or demo.poll() is not None, 180,
                     "the demo unit to reach ready")
            assert demo.poll() is None, out.read_text()
            s = Scrape(fetch(port))
            assert (s.one_of("unit_phase", unit, "phase"), s.one_of("unit_verdict", unit, "verdict")) == \
                ("ready", "ready")
            assert [i.labels["unit"] for i in s.all("llmstartup_unit_info")] == [unit], "the demo follows its own"
            text = out.read_text()
            assert "compiling" in text and "silent_progress" in text, text
            said = [line for line in text.splitlines() if "this host also runs model servers" in line]
            assert len(said) == 1 and f"{other} (llamacpp)" in said[0], text
            if ctypes.util.find_library("nvidia-ml") is None:  # said once, as information, not as a warning
                assert text.count("demo: no NVIDIA driver here: GPU memory will not be sampled\n") == 1, text
        else:  # as soon as it serves: mid-startup
            wait_for(lambda: try_fetch(port) or demo.poll() is not None, 60, "the demo to serve /metrics")
            assert demo.poll() is None, out.read_text()
        demo.send_signal(stop)
        assert demo.wait(timeout=30) == 0, out.read_text()
    finally:
        _end(demo)
    text = out.read_text()
    assert "demo: stopping" in text and "Traceback" not in text and "WARNING" not in text, text
    _nothing_left(unit, namespace)


def test_two_demos_at_once_each_show_their_own_start(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    demos = [_demo(tmp_path / "a"), _demo(tmp_path / "b")]
    try:
        names = [_intro(demo, out) for demo, _, out in demos]
        assert len({unit for unit, _ in names}) == len({ns for _, ns in names}) == 2, names
        for (demo, port, _), (unit, _) in zip(demos, names):
            _started(port, unit)
            demo.send_signal(signal.SIGTERM)
        assert [demo.wait(timeout=30) for demo, _, _ in demos] == [0, 0]
    finally:
        for demo, _, _ in demos:
            _end(demo)
    for unit, namespace in names:
        _nothing_left(unit, namespace)
