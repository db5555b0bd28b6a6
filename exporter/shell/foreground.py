"""`status` and `wait`: the agent run in the foreground for one operator, without HTTP."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TextIO

from exporter.core.config import Config
from exporter.core.model import Snapshot, UnitView, Verdict
from exporter.core.report import duration, status_line, unit_document
from exporter.shell.runtime import Runtime
from exporter.sources.units import unit_exists

# wait's exit codes, as documented in the README
READY, FAILED, STALLED, TIMED_OUT, NO_SUCH_UNIT = 0, 1, 2, 3, 4
VERDICT_EXIT = {Verdict.READY: READY, Verdict.FAILED: FAILED, Verdict.STALLED: STALLED}


class NoSuchUnit(Exception):
    pass


def _first_look(runtime: Runtime, units: list[str], sleep: Callable[[float], None]) -> Snapshot:
    """The units' history is read (Runtime.start warmed the agent up); a second later, once more for rates."""
    journal = runtime.journal
    missing = [u for u in units if not unit_exists(u, runtime.cgroup_root, journal.seen_units) and u not in runtime.agent.present]
    if missing:
        raise NoSuchUnit(", ".join(missing))
    sleep(1.0)  # two process samples a second apart: CPU and I/O rates
    return runtime.agent.tick()


def run_status(
    config: Config, fmt: str, out: TextIO, err: TextIO = sys.stderr, sleep: Callable[[float], None] = time.sleep
) -> int:
    units = [u for u, _ in config.units]
    runtime = Runtime.start(config, http=False)
    try:
        snap = _first_look(runtime, units, sleep)
    except NoSuchUnit as error:
        err.write(f"llmstartup status: no such unit: {error} (no unit file, no cgroup, no journal lines this boot)\n")
        return NO_SUCH_UNIT
    finally:
        runtime.close()
    views = [v for v in snap.units if not units or v.state.unit in units]
    if fmt == "json":
        json.dump([unit_document(v, snap) for v in views], out, indent=2)
        out.write("\n")
    elif not views:
        out.write("no model-server units found; name one, or see --unit\n")
    else:
        out.writelines(status_line(v, snap) + "\n" for v in views)
    return 0


def run_wait(
    config: Config,
    timeout: float,
    heartbeat: float,
    out: TextIO,
    err: TextIO = sys.stderr,
    sleep: Callable[[float], None] = time.sleep,
    fmt: str = "text",
) -> int:
    """Block until the unit is ready, failed or stalled, or the timeout passes; print as it goes.

    `fmt` json: one JSON object a line, for scripts: `status --format json`'s document with an `event`
    (`change` of phase or verdict, `heartbeat`, and last `end` with the `exit` status), never a live line.
    """
    [unit] = [u for u, _ in config.units]
    json_lines = fmt == "json"
    live = out.isatty() and not json_lines

    def say(view: UnitView, snap: Snapshot, event: str, text: str, **extra: object) -> None:
        if json_lines:
            out.write(json.dumps({"event": event, **extra, **unit_document(view, snap)}) + "\n")
        else:
            out.write(("\r\x1b[K" if live else "") + text + "\n")
    started = time.monotonic()
    runtime = Runtime.start(config, http=False)
    try:
        try:
            snap = _first_look(runtime, [unit], sleep)
        except NoSuchUnit:
            err.write(f"llmstartup wait: no such unit: {unit} (no unit file, no cgroup, no journal lines this boot)\n")
            return NO_SUCH_UNIT
        last: UnitView | None = None
        said = 0.0
        while True:
            view = next(v for v in snap.units if v.state.unit == unit)
            line = status_line(view, snap)
            changed = last is None or view.state.phase is not last.state.phase or view.verdict is not last.verdict
            if changed or (not live and time.monotonic() - said >= heartbeat):
                say(view, snap, "change" if changed else "heartbeat", line)
                said = time.monotonic()
            elif live:
                out.write("\r\x1b[K" + line)
            last = view
            if view.verdict in VERDICT_EXIT:
                if json_lines:
                    say(view, snap, "end", line, exit=VERDICT_EXIT[view.verdict])
                out.flush()
                return VERDICT_EXIT[view.verdict]
            if time.monotonic() - started >= timeout:
                say(view, snap, "end", f"{unit}: timed out after {duration(timeout)}: {line}", exit=TIMED_OUT,
                    timed_out_after_seconds=timeout)
                out.flush()
                return TIMED_OUT
            out.flush()
            sleep(config.interval)
            snap = runtime.agent.tick()
    finally:
        runtime.close()
