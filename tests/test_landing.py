"""The landing page and the JSON API, as a browser and a script see them."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from PIL import Image

from exporter.core.landing import COLOURS
from exporter.core.model import Phase
from tests.needs import needs
from tests.scrape import Scrape, fetch, wait_for
from tests.test_operator import READY_QUICKLY, llmstartup
from tests.test_serve import HANG_AFTER_COMPILE

CHROMIUM = shutil.which("chromium")
# The probe's flags: no sandbox as root, and nothing that reaches for the network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


@pytest.fixture
def two_units(agent, units, journal_records):
    ready = units("ready", READY_QUICKLY)
    hang = units("hang", HANG_AFTER_COMPILE)
    port = agent(ready.name, hang.name)
    wait_for(lambda: (s := Scrape(fetch(port))).one_of("unit_phase", ready.name, "phase") == "ready"
             and s.one_of("unit_phase", hang.name, "phase") == "compiling", 20, "ready and compiling")
    return port, ready, hang


def test_api_units(two_units):
    port, ready, hang = two_units
    docs = {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}
    assert docs[ready.name]["verdict"] == "ready"
    assert docs[hang.name]["phase"] == "compiling"
    assert {"unit", "engine", "phase", "verdict", "phase_seconds", "startup_seconds", "last_log_age_seconds",
            "signals", "timeline"} <= docs[hang.name].keys()
    assert docs[ready.name]["timeline"][-1]["phase"] == "ready"


# What changes between two looks a second apart at a running unit: left out of the comparison (`stuck`:
# where the processes are at the instant of a look).
MOVING = {"phase_seconds", "startup_seconds", "last_log_age_seconds", "signals", "expected_remaining_seconds", "stuck"}


def test_the_api_is_status_json(two_units, journald):
    """/api/v1/units and `llmstartup status --format json` are one document per unit, field for field."""
    port, ready, hang = two_units
    done = llmstartup(journald, "status", ready.name, hang.name, "--format", "json")
    assert done.returncode == 0, done.stderr
    api = {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}
    status = {d["unit"]: d for d in json.loads(done.stdout)}
    assert api.keys() == status.keys() == {ready.name, hang.name}
    for unit in api:
        assert api[unit].keys() == status[unit].keys(), unit
        steady = {k: v for k, v in api[unit].items() if k not in MOVING | {"timeline", "startup_start"}}
        assert steady == {k: status[unit][k] for k in steady}, unit
        # the times of the agent's and status's folds of the same lines and samples agree
        assert [p["phase"] for p in api[unit]["timeline"]] == [p["phase"] for p in status[unit]["timeline"]]
        for key in ("startup_seconds", "phase_seconds"):
            assert api[unit][key] == pytest.approx(status[unit][key], abs=15), (unit, key)


def test_signals_and_the_previous_start_in_the_api(two_units, units):
    port, ready, hang = two_units
    doc = {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}
    signals = doc[hang.name]["signals"]
    assert signals.keys() == {"cpu_cores", "io_bytes_per_second", "gpu_memory_bytes",
                              "gpu_memory_change_since_last_log_bytes", "processes", "resident_memory_bytes"}
    assert signals["processes"] >= 1 and signals["cpu_cores"] >= 0 and signals["gpu_memory_bytes"] is None  # no GPU
    assert doc[hang.name]["previous_timeline"] == []
    before = doc[ready.name]["timeline"]

    ready.stop()
    again = units("ready", READY_QUICKLY)  # the same unit, started again

    def second_start_ready() -> dict | None:
        doc = {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}[again.name]
        return doc if doc["phase"] == "ready" and doc["timeline"][0]["start"] > before[-1]["start"] else None

    after = wait_for(second_start_ready, 30, "the second start ready")
    assert after["previous_timeline"][:-1] == before[:-1], "the start before, as it was shown"
    # ready is where it settled; the start before then ended when its processes did
    assert [p["phase"] for p in after["previous_timeline"]][-1] == "ready"
    assert after["signals"] is not None


class Bars(HTMLParser):
    """Each unit's timeline bars as the browser built them: unit → [[(phase, width %, colour), …], …]."""

    def __init__(self) -> None:
        super().__init__()
        self.units: dict[str, list[list[tuple[str, float, str]]]] = {}
        self._unit = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if "unit" in classes:
            self._unit = a["id"] or ""
            self.units[self._unit] = []
        elif "bar" in classes:
            self.units[self._unit].append([])
        elif "span" in classes:
            style = dict(part.split(":", 1) for part in (a.get("style") or "").split(";") if ":" in part)
            width = float(style["flex"].split()[-1].rstrip("%"))
            self.units[self._unit][-1].append(((a.get("title") or "").split()[0], width, style["background"]))


def _rgb(colour: str) -> tuple[int, int, int]:
    hexa = colour.lstrip("#")
    return tuple(int(hexa[i:i + 2], 16) for i in (0, 2, 4))  # type: ignore[return-value]


def _longest_runs(image: Image.Image) -> dict[tuple[int, int, int], int]:
    """The longest horizontal run of each colour, in pixels: a bar's span is long, the legend's squares are not."""
    width, height = image.size
    pixels = image.load()
    longest: dict[tuple[int, int, int], int] = {}
    for y in range(height):
        run, colour = 0, None
        for x in range(width):
            here = pixels[x, y]
            run = run + 1 if here == colour else 1
            colour = here
            if run > longest.get(here, 0):
                longest[here] = run
    return longest


@needs(CHROMIUM, "chromium (Debian package chromium)")
def test_landing_page_in_a_browser(two_units, tmp_path):
    port, ready, hang = two_units
    # The hang has been quiet past the silence threshold: the page shows a judged hang, not a fresh line.
    wait_for(lambda: {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}[hang.name]["verdict"]
             in ("silent_progress", "stalled"), 20, "the hang judged silent")
    url = f"http://127.0.0.1:{port}/"
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([CHROMIUM, *FLAGS, *profile, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    docs = {d["unit"]: d for d in json.loads(fetch(port, "/api/v1/units"))}
    bars = Bars()
    bars.feed(dom.stdout)

    # Each unit's bar of this start: the phases of its timeline, in order, each in its colour, each as
    # wide as its share of the start (an instant, like ready, at the least width).
    widest = {}
    for unit in (ready, hang):
        doc = docs[unit.name]
        [spans] = bars.units[unit.name]  # this start only: neither has had a start before
        assert [phase for phase, _, _ in spans] == [p["phase"] for p in doc["timeline"]], unit.name
        assert [colour for _, _, colour in spans] == [COLOURS[Phase(p["phase"])] for p in doc["timeline"]]
        for (phase, width, _), period in zip(spans, doc["timeline"]):
            share = period["duration_seconds"] / doc["startup_seconds"] * 100
            assert width == pytest.approx(max(share, 0.4), abs=3), (unit.name, phase)
        widest[unit.name] = max(spans, key=lambda span: span[1])
    assert [p["phase"] for p in docs[ready.name]["timeline"]][-1] == "ready"
    assert widest[hang.name][0] == "compiling", "the hang has spent its start compiling"
    assert docs[hang.name]["verdict"] in ("silent_progress", "stalled")

    shot = tmp_path / "landing.png"
    subprocess.run([CHROMIUM, *FLAGS, *profile, f"--screenshot={shot}", "--window-size=1280,900", url],
                   capture_output=True, timeout=60, check=True)
    runs = _longest_runs(Image.open(shot).convert("RGB"))
    # Drawn: the widest span of each bar is a long stretch of its phase's colour (a legend square is ~12 px).
    for unit, (phase, width, colour) in widest.items():
        assert runs.get(_rgb(colour), 0) >= 100, f"{unit}'s {phase} span ({width}%) is not drawn in {colour}"
