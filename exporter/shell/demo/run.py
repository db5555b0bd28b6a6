"""`llmstartup demo`: a scripted vLLM startup in a private journal, followed live by an agent of its own.

The demo always shows its own start, whatever else runs on the host: its agent follows its one unit in its
own journald namespace, never the host's units or containers (watching those is `serve`, `status` and
`wait`'s job); it only says, in one line, which model servers it saw there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
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
LOCK = sandbox.RUN_SYSTEMD.parent / "llmstartup-demo.lock"


@contextlib.contextmanager
def _names() -> Iterator[tuple[str, str]]:
    """The demo's journald namespace and unit, for as long as it runs: the plain names, or with this process's
    id in them while another demo holds those, so that two demos on one host each show their own start. The
    plain names are held by a lock on LOCK, which two demos starting at once cannot both take and a demo that
    was killed lets go of; free, they may still be in use by what such a demo left running."""
    with open(LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = not (sandbox.namespace_running(NAMESPACE) or sandbox.unit_running(UNIT))
        except BlockingIOError:
            free = False
        pid = os.getpid()
        yield (NAMESPACE, UNIT) if free else (f"{NAMESPACE}-{pid}", f"{UNIT.removesuffix('.service')}-{pid}.service")


def _model_servers() -> dict[str, str]:
    """The host's model-server units (unit → engine), found as `serve` discovers them: by their processes'
    command lines."""
    root = find_cgroup2_root()
    if root is None:
        return {}
    try:
        found = ProcessSource(root).list_units()
    except OSError:
        return {}
    engines = EngineNames((), grammar.load_all())
    return {unit: engine for unit, cmdlines in found.items() if (engine := engines.of(cmdlines))}


def run_demo(listen: tuple[str, int]) -> int:
    try:
        sandbox.preflight()
    except RuntimeError as error:
        logger.error("the demo cannot run here: %s", error)
        return 1
    others = _model_servers()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with _names() as (namespace, unit_name), sandbox.Journald(namespace) as journald:
        # Thresholds scaled to the demo's minute-long startup, so the silent compile shows as such; its one
        # unit named, in its own namespace, and no containers: the agent follows nothing else.
        config = Config(units=((unit_name, "vllm"),), namespace=journald.namespace, listen=listen,
                        interval=1.0, silence=8.0, stall=60.0, state_path=None, pods=None, docker=None)
        try:
            runtime, agent_stop, thread = run_in_thread(config)
        except StartError as error:
            logger.error("%s", error)
            return 1
        argv = [sys.executable, "-m", "exporter.shell.demo.vllm_startup", "--scenario", "demo"]
        unit = sandbox.start_unit(journald, unit_name, argv)
        print(f"demo: {unit_name} prints a vLLM startup into journald namespace {namespace};"
              f" metrics on http://{listen[0]}:{listen[1]}/metrics; Ctrl-C stops it all", flush=True)
        if others:
            print(f"demo: this host also runs model servers ({', '.join(f'{u} ({e})' for u, e in others.items())}):"
                  " the demo shows only its own; `llmstartup serve`, `status` and `wait` follow those", flush=True)
        gpu = runtime.gpu
        try:
            _show(unit_name, lambda: runtime.agent.snapshot, stop, sys.stdout,
                  notes=lambda: (gpu.status.absent,) if gpu and gpu.status.absent else ())
        except KeyboardInterrupt:
            pass
        finally:
            print("\ndemo: stopping", flush=True)
            unit.stop()
            agent_stop.set()
            thread.join(timeout=5)
            runtime.close()
    return 0


def _show(unit: str, snapshot: Callable[[], Snapshot], stop: threading.Event, out: TextIO,
          notes: Callable[[], Iterable[str]] = tuple) -> None:
    """Print each phase or verdict change of `unit`, and each of the agent's `notes` once (no NVIDIA driver
    here); on a terminal, keep a live status line under them."""
    live = out.isatty()
    last: tuple[Phase, str] | None = None
    before: Snapshot | None = None
    said_ready = False
    said: set[str] = set()
    while not stop.wait(0.5):
        for note in notes():
            if note not in said:
                said.add(note)
                out.write(("\r\x1b[K" if live else "") + f"demo: {note}\n")
        snap = snapshot()
        view = next((v for v in snap.units if v.state.unit == unit), None)
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
