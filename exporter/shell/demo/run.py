"""`llmstartup demo`: follow the host's model-server units, or a scripted vLLM startup in a private journal."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from exporter.core import grammar, progress
from exporter.core.config import Config
from exporter.core.model import Phase, Snapshot, UnitView
from exporter.core.report import progress_text
from exporter.shell.demo import sandbox
from exporter.shell.engines import EngineNames
from exporter.shell.runtime import StartError, run_in_thread
from exporter.sources.processes import ProcessSource, find_cgroup2_root

logger = logging.getLogger(__name__)

NAMESPACE = "llmstartup-demo"
UNIT = "llmstartup-demo-vllm.service"


def _model_servers() -> list[str]:
    root = find_cgroup2_root()
    if root is None:
        return []
    try:
        found = ProcessSource(root).list_units()
    except OSError:
        return []
    names = EngineNames((), grammar.load_all())
    return [u for u, cmdlines in found.items() if names.of(cmdlines)]


def run_demo(listen: tuple[str, int]) -> int:
    from exporter.shell.cli import run_serve

    if servers := _model_servers():
        logger.info("this host runs model servers (%s): following them instead of the demo", ", ".join(servers))
        return run_serve(Config(listen=listen))
    try:
        sandbox.preflight()
    except RuntimeError as error:
        logger.error("the demo cannot run here: %s", error)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with sandbox.Journald(NAMESPACE) as journald:
        # Thresholds scaled to the demo's minute-long startup, so the silent compile shows as such.
        config = Config(units=((UNIT, "vllm"),), namespace=journald.namespace, listen=listen,
                        interval=1.0, silence=8.0, stall=60.0, state_path=None)
        try:
            runtime, agent_stop, thread = run_in_thread(config)
        except StartError as error:
            logger.error("%s", error)
            return 1
        argv = [sys.executable, "-m", "exporter.shell.demo.vllm_startup", "--scenario", "demo"]
        unit = sandbox.start_unit(journald, UNIT, argv)
        # The live display below shows every transition; the agent's own INFO lines would repeat it.
        logging.getLogger("exporter").setLevel(logging.WARNING)
        print(f"demo: {UNIT} prints a vLLM startup into journald namespace {NAMESPACE};"
              f" metrics on http://{listen[0]}:{listen[1]}/metrics; Ctrl-C stops it all\n", flush=True)
        try:
            _show(lambda: runtime.agent.snapshot, stop, sys.stdout)
        except KeyboardInterrupt:
            pass
        finally:
            print("\ndemo: stopping", flush=True)
            unit.stop()
            agent_stop.set()
            thread.join(timeout=5)
            runtime.close()
    return 0


def _show(snapshot: Callable[[], Snapshot], stop: threading.Event, out: TextIO) -> None:
    """Print each phase or verdict change; on a terminal, keep a live status line under them."""
    live = out.isatty()
    last: tuple[Phase, str] | None = None
    before: Snapshot | None = None
    said_ready = False
    while not stop.wait(0.5):
        snap = snapshot()
        view = next((v for v in snap.units if v.state.unit == UNIT), None)
        if view is None or view.state.attempt is None:
            continue
        line = _status(view, snap, before)
        before = snap
        now = (view.state.phase, view.verdict)
        if now != last:
            out.write(("\r\x1b[K" if live else "") + line + "\n")
            last = now
        elif live:
            out.write("\r\x1b[K" + line)
        out.flush()
        if view.state.phase is Phase.READY and not said_ready:
            said_ready = True
            durations = "".join(f"  {p:<26}{s:6.1f}s\n" for p, s in view.state.last_phase_durations.items())
            out.write(("\r\x1b[K" if live else "") + f"ready; the phases took:\n{durations}")
            out.write("the demo unit now idles; Ctrl-C to stop\n")


def _status(view: UnitView, snap: Snapshot, before: Snapshot | None) -> str:
    state, attempt, t = view.state, view.state.attempt, snap.t
    assert attempt is not None
    parts = [f"{t - attempt.started:6.1f}s", f"{state.phase} {t - attempt.phase_since:.0f}s", str(view.verdict)]
    if (found := progress.current(attempt)) is not None:
        parts.append(progress_text(found, t, snap.stall_after))
    if state.last_log is not None:
        parts.append(f"last log {t - state.last_log:.0f}s ago")
    old = next((v.state for v in before.units if v.state.unit == state.unit), None) if before else None
    if old is not None and before is not None and snap.t > before.t:
        parts.append(f"CPU {(state.cpu_total - old.cpu_total) / (snap.t - before.t):.1f} cores")
    return "  ".join(parts)
