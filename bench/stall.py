"""4. From a hang's last sign of life to the `stalled` verdict, against the stall threshold.

`llmstartup serve --sample.interval 1s --silence.threshold 5s --stall.threshold 10s` watches three
units from before they start. Each prints its startup (which forks its EngineCore child), waits 2.5 s
so that the fork and the interpreter's start are behind it, prints one last line at its own offset
within the second, and then hangs: no line, no CPU, no I/O, no process change. The last sign of life
is that line's journal receive time (`__REALTIME_TIMESTAMP`); the benchmark polls /metrics every
50 ms and notes when the unit's verdict turns `stalled`. The figure is
(time to stalled − threshold) / interval; the agent decides at its next sample, so 0–1 is ideal.

Measured three times: as described; while a fourth unit burns both cores in two workers (a silent
compile beside the hangs, as tests/test_serve.py runs them); and with GPUs (the tests' fake NVML),
each unit's memory growing 128 MiB every 0.5 s for 3 s past its last line, so that the last sign of
life is the last memory change (the time the benchmark wrote it; the agent reads NVML once a sample).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.common import Row, free_port, say, scrape, stop, wait_http

INTERVAL, SILENCE, STALL = 1.0, 5.0, 10.0
OFFSETS = (0.0, 0.33, 0.67)  # where in the agent's second each unit falls silent


def hang_unit(offset: float) -> list[dict[str, object]]:
    return [
        {"sleep": 1.0},
        {"log": "vLLM API server version 0.11.0"},
        {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
        {"log": "Starting to load model Qwen/Qwen3-8B..."},
        {"log": "Model loading took 15.27 GiB and 2.10 seconds"},
        {"sleep": 2.5 + offset},
        {"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone "
                "for vLLM's torch.compile"},
        {"hang": True},
    ]


def _verdict(text: str, unit: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("llmstartup_unit_verdict{") and f'unit="{unit}"' in line and line.endswith(" 1.0"):
            return line.split('verdict="', 1)[1].split('"', 1)[0]
    return None


def _last_line_time(journald, unit) -> float:  # type: ignore[no-untyped-def]
    """Wall-clock seconds at which journald received the unit's last line."""
    reader = journald.reader(_SYSTEMD_UNIT=unit.name)
    try:
        reader.seek_tail()
        entry = reader.get_previous()
        return entry["__REALTIME_TIMESTAMP"].timestamp()
    finally:
        reader.close()


GiB, MiB = 2**30, 2**20
# Each situation: its row's name, whether another unit burns both cores meanwhile, whether the last sign
# of life is GPU memory (the fake NVML of the tests) rather than a line.
SITUATIONS = (
    ("last line → stalled", False, False),
    ("last line → stalled, while a unit burns both cores", True, False),
    ("last GPU memory change → stalled", False, True),
)
BURNER = [{"log": "vLLM API server version 0.11.0"}, {"burn": 120, "workers": 2}, {"hang": True}]


def run() -> list[Row]:
    return [_measure(*situation) for situation in SITUATIONS]


def _fake_nvml(tmp: Path, devices: int):  # type: ignore[no-untyped-def]
    from tests.fake_nvml.build import build
    from tests.fake_nvml.fixtures import Device, FakeNvml

    build(tmp / "fake_nvml")
    nvml = FakeNvml(tmp / "nvml.state", tmp / "fake_nvml")
    nvml.devices = [Device() for _ in range(devices)]
    nvml.write()
    return nvml


def _grow_until(nvml, units, stops: list[float]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Each unit's GPU memory grows by 128 MiB every 0.5 s (the floor is 64 MiB) until its own stop time
    (monotonic); returns when each last changed (wall clock): its last sign of life."""
    from tests.fake_nvml.fixtures import Process

    used = {unit.name: GiB for unit in units}
    changed: dict[str, float] = {}
    while any(time.monotonic() < stop_at for stop_at in stops):
        for unit, stop_at in zip(units, stops):
            if time.monotonic() < stop_at:
                used[unit.name] += 128 * MiB
                changed[unit.name] = time.time()
        nvml.processes = [Process(i, unit.pid, used[unit.name]) for i, unit in enumerate(units)]
        nvml.write()
        time.sleep(0.5)
    return changed


def _measure(situation: str, burn: bool, gpu: bool) -> Row:
    from exporter.shell.demo import sandbox

    say(f"== 4. {situation}: --stall.threshold {STALL:g}s --sample.interval {INTERVAL:g}s "
        f"--silence.threshold {SILENCE:g}s, {len(OFFSETS)} units ==")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmstartup-bench-")))
        nvml = _fake_nvml(tmp, len(OFFSETS)) if gpu else None
        journald = stack.enter_context(sandbox.Journald(f"llmstartup-bench-{secrets.token_hex(3)}"))
        names = [f"bench-{secrets.token_hex(2)}-hang{i}.service" for i in range(len(OFFSETS))]
        port = free_port()
        argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
                "--web.listen-address", f"127.0.0.1:{port}", "--sample.interval", f"{INTERVAL:g}s",
                "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s",
                "--collector.gpu" if gpu else "--no-collector.gpu", "--state.path", str(tmp / "history.db")]
        for name in names:
            argv += ["--unit", f"{name}=vllm"]
        log = stack.enter_context(open(tmp / "serve.log", "w"))
        serve = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 env=nvml.env() if nvml else None)
        stack.callback(stop, serve)
        wait_http(port, 30, "llmstartup serve")
        time.sleep(2 * INTERVAL)  # it has sampled the empty cgroups: it watches from before the start

        def start(name: str, steps: list[dict[str, object]]) -> sandbox.Unit:
            path = tmp / f"{name}.json"
            path.write_text(json.dumps(steps))
            unit = sandbox.start_unit(journald, name, [sys.executable, "-m", "exporter.shell.demo.vllm_startup", str(path)])
            stack.callback(unit.stop)
            return unit

        if burn:
            start(f"bench-{secrets.token_hex(2)}-burner.service", BURNER)
        began = time.monotonic()
        units = [start(name, hang_unit(offset)) for name, offset in zip(names, OFFSETS)]
        if nvml is not None:  # memory moves on for 3 s past each unit's last line, then stops
            last_signs = _grow_until(nvml, units, [began + 4.5 + 3.0 + offset for offset in OFFSETS])

        seen: dict[str, float] = {}
        verdicts: dict[str, list[str]] = {u.name: [] for u in units}
        deadline = time.monotonic() + 4.5 + max(OFFSETS) + STALL + 6 * INTERVAL + (4 if gpu else 0)
        while len(seen) < len(units) and time.monotonic() < deadline:
            text = scrape(port)[1].decode()
            now = time.time()
            for unit in units:
                v = _verdict(text, unit.name)
                if v and (not verdicts[unit.name] or verdicts[unit.name][-1] != v):
                    verdicts[unit.name].append(v)
                if v == "stalled" and unit.name not in seen:
                    seen[unit.name] = now
            time.sleep(0.05)
        delays = []
        for unit in units:
            last = last_signs[unit.name] if nvml is not None else _last_line_time(journald, unit)
            if unit.name not in seen:
                say(f"{unit.name}: never stalled within the deadline; verdicts {' → '.join(verdicts[unit.name])}")
                delays.append(float("inf"))
                continue
            took = seen[unit.name] - last
            delays.append((took - STALL) / INTERVAL)
            say(f"{unit.name}: stalled {took:5.2f} s after its last sign of life; past the threshold by "
                f"{took - STALL:5.2f} s = {delays[-1]:.2f} intervals  ({' → '.join(verdicts[unit.name])})")
    worst, mean = max(delays), sum(delays) / len(delays)
    say(f"(time to stalled − threshold) / interval: mean {mean:.2f}, worst {worst:.2f} (goal ≤ 2)")
    say()
    return Row(f"{situation}, past the {STALL:g} s threshold, in {INTERVAL:g} s intervals (worst of {len(OFFSETS)})",
               f"{worst:.2f}", f"threshold {STALL:g} s", f"{(STALL + worst * INTERVAL) / STALL:.2f}x",
               "≤ 2 intervals", worst <= 2.0)


if __name__ == "__main__":
    for row in run():
        print(row)
