"""The landing page: every unit with its phase, verdict and a timeline of its current and last start; pure HTML."""

from __future__ import annotations

from html import escape

from exporter import __version__
from exporter.core import progress
from exporter.core.model import Attempt, Phase, Snapshot, UnitView
from exporter.core.report import duration, progress_text, status_line, stuck_text
from exporter.core.stuck import FRAMES_SHOWN

# One colour per phase, so that a glance at the bar says where the time went.
COLOURS = {
    Phase.LAUNCHING: "#9aa5b1",
    Phase.INITIALIZING_DISTRIBUTED: "#b38cd9",
    Phase.DOWNLOADING: "#5fa8d3",
    Phase.LOADING_WEIGHTS: "#3d7dca",
    Phase.COMPILING: "#e3a33b",
    Phase.PROFILING: "#d98b5f",
    Phase.ALLOCATING_KV_CACHE: "#6cb88a",
    Phase.WARMING_UP: "#c9b037",
    Phase.CAPTURING_GRAPHS: "#d9705f",
    Phase.STARTING_API: "#4fb3b3",
    Phase.READY: "#2e9e4f",
    Phase.FAILED: "#c0392b",
    Phase.STOPPING: "#7f8c8d",
}
VERDICT_COLOURS = {
    "progressing": "#2e7dca", "silent_progress": "#c98a12", "stalled": "#c0392b", "ready": "#2e9e4f",
    "failed": "#c0392b", "unknown": "#7f8c8d", "inactive": "#9aa5b1",
}

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin: 0 0 .3em; }
.unit { border: 1px solid #ddd; border-radius: 6px; padding: 1em; margin: 0 0 1.2em; max-width: 70em; }
.verdict { color: #fff; border-radius: 4px; padding: .1em .5em; font-weight: 600; }
.status { font-family: ui-monospace, monospace; font-size: 13px; margin: .4em 0 .8em; }
.bar { position: relative; display: flex; height: 2.2em; border-radius: 4px; overflow: hidden; margin: .2em 0 .1em; }
.bar.previous { opacity: .55; height: 1.6em; }
.span { color: #fff; font-size: 12px; white-space: nowrap; overflow: hidden; padding: .35em .3em 0; min-width: 3px; }
.gap { position: absolute; top: 0; bottom: 0; background: repeating-linear-gradient(45deg, rgba(0,0,0,.35) 0 4px, transparent 4px 9px); border-left: 2px solid #000; }
.label { font-size: 12px; color: #555; }
.stuck { font-family: ui-monospace, monospace; font-size: 12px; margin: -.4em 0 .8em; color: #7a2a1f; }
.down { color: #7a2a1f; max-width: 70em; }
.legend span { display: inline-block; margin-right: 1em; font-size: 12px; }
.legend i { display: inline-block; width: .9em; height: .9em; margin-right: .3em; vertical-align: -1px; border-radius: 2px; }
"""


def render(snapshot: Snapshot) -> str:
    units = "".join(_unit(view, snapshot) for view in snapshot.units) or "<p>No model-server units yet.</p>"
    legend = "".join(f"<span><i style='background:{c}'></i>{p}</span>" for p, c in COLOURS.items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='5'>"
        f"<title>llmstartup</title><style>{STYLE}</style></head><body>"
        f"<h1>llmstartup {escape(__version__)}</h1>"
        "<p><a href='/metrics'>Metrics</a> · <a href='/api/v1/units'>/api/v1/units</a> · refreshes every 5 s</p>"
        f"{_down(snapshot)}{units}<p class='legend'>{legend}<span><i class='gap' style='position:static'></i>silent gap</span></p>"
        "</body></html>"
    )


def _down(snap: Snapshot) -> str:
    """The sources that are down, with why: the evidence the verdicts below lack."""
    down = [f"<b>{escape(name)}</b>" + (f": {escape(health.why)}" if health.why else "")
            for name, health in sorted(snap.sources.items()) if not health.up]
    return f"<p class='down'>Source down: {'; '.join(down)}</p>" if down else ""


def _unit(view: UnitView, snap: Snapshot) -> str:
    state = view.state
    colour = VERDICT_COLOURS.get(str(view.verdict), "#555")
    about = " · ".join(escape(x) for x in (state.engine, state.info.get("engine_version", ""), state.info.get("model", "")) if x)
    html = (
        f"<div class='unit' id='{escape(state.unit)}'><h2>{escape(state.unit)} "
        f"<span class='verdict' style='background:{colour}'>{view.verdict}</span></h2>"
        f"<div class='label'>{about}</div><div class='status'>{escape(status_line(view, snap))}</div>"
    )
    if view.stuck:  # where a silent unit's processes are: innermost frame first
        html += "<div class='stuck'>" + "<br>".join(
            "at " + escape(stuck_text(group, FRAMES_SHOWN)) for group in view.stuck) + "</div>"
    if state.attempt:
        html += "<div class='label'>this start</div>" + _bar(state.attempt, snap, "bar")
    if state.previous:
        html += "<div class='label'>the start before</div>" + _bar(state.previous, snap, "bar previous")
    return html + "</div>"


def _bar(attempt: Attempt, snap: Snapshot, css: str) -> str:
    # The bar is the startup: it ends where the start settled or ended.
    now = snap.t
    end = attempt.startup_end(now)
    total = max(end - attempt.started, 1e-9)
    found = progress.current(attempt)
    periods = attempt.periods(now)
    spans = []
    for index, (phase, start, stop) in enumerate(periods):
        seconds = max(0.0, min(stop, end) - start)
        width = max(seconds / total * 100, 0.4)
        text = f"{phase} {duration(seconds)}"
        colour = COLOURS.get(phase, "#555")
        background = colour
        if attempt.inferred_from is not None and index == len(periods) - 1:  # no line has said so yet
            text += " (inferred)"
            background = f"repeating-linear-gradient(135deg,{colour} 0 6px,{colour}99 6px 12px)"
        if found is not None and index == len(periods) - 1:
            # The current phase's span, filled as far as the engine says the phase is; the rest paler.
            text += f" · {progress_text(found, now, snap.stall_after)}"
            filled = f"{found.ratio * 100:.1f}%"
            background = f"linear-gradient(90deg,{colour} {filled},{colour}66 {filled})"
        spans.append(
            f"<div class='span' title='{escape(text)}' style='flex:0 0 {width:.2f}%;background:{background}'>"
            f"{escape(text)}</div>"
        )
    gaps = "".join(
        f"<div class='gap' title='silent {duration(stop - start)} in {phase}' "
        f"style='left:{(start - attempt.started) / total * 100:.2f}%;width:{(stop - start) / total * 100:.2f}%'></div>"
        for start, stop, phase in attempt.gaps
    )
    return f"<div class='{css}'>{''.join(spans)}{gaps}</div>"
