"""The landing page and the JSON API, as a browser and a script see them."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from PIL import Image

from exporter.core.landing import COLOURS
from exporter.core.model import Phase
from tests.needs import needs
from tests.scrape import Scrape, fetch, wait_for
from tests.test_operator import READY_QUICKLY
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


@needs(CHROMIUM, "chromium (Debian package chromium)")
def test_landing_page_in_a_browser(two_units, tmp_path):
    port, ready, hang = two_units
    url = f"http://127.0.0.1:{port}/"
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([CHROMIUM, *FLAGS, *profile, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert ready.name in dom.stdout and hang.name in dom.stdout
    assert "compiling" in dom.stdout and "ready" in dom.stdout

    shot = tmp_path / "landing.png"
    subprocess.run([CHROMIUM, *FLAGS, *profile, f"--screenshot={shot}", "--window-size=1280,900", url],
                   capture_output=True, timeout=60, check=True)
    colours = {rgb for _, rgb in Image.open(shot).convert("RGB").getcolors(1280 * 900)}
    # Each unit's timeline shows the phases it went through, each in its own colour.
    for phase in (Phase.LOADING_WEIGHTS, Phase.COMPILING, Phase.READY):
        hexa = COLOURS[phase].lstrip("#")
        assert tuple(int(hexa[i:i + 2], 16) for i in (0, 2, 4)) in colours, f"{phase} is not on the page"
