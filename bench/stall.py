"""4. From a hang's last sign of life to the `stalled` verdict, against the stall threshold.

`llmstartup serve --sample.interval 1s --silence.threshold 5s --stall.threshold 10s` watches three
units from before they start. Each prints its startup (which forks its EngineCore child), waits 2.5 s
so that the fork and the interpreter's start are behind it, prints one last line at its own offset
within the second, and then hangs: no line, no CPU, no I/O, no process change. The last sign of life
is that line's journal receive time (`__REALTIME_TIMESTAMP`); the benchmark polls /metrics every
50 ms and notes when the unit's verdict turns `stalled`. The figure is
(time to stalled − threshold) / interval; the agent decides at its next sample, so 0–1 is ideal.
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


def run() -> list[Row]:
    from exporter.shell.demo import sandbox

    say(f"== 4. last sign of life → stalled: --stall.threshold {STALL:g}s --sample.interval {INTERVAL:g}s "
        f"--silence.threshold {SILENCE:g}s, {len(OFFSETS)} units ==")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmstartup-bench-")))
        journald = stack.enter_context(sandbox.Journald(f"llmstartup-bench-{secrets.token_hex(3)}"))
        names = [f"bench-{secrets.token_hex(2)}-hang{i}.service" for i in range(len(OFFSETS))]
        port = free_port()
        argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
                "--web.listen-address", f"127.0.0.1:{port}", "--sample.interval", f"{INTERVAL:g}s",
                "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s",
                "--no-collector.gpu", "--state.path", str(tmp / "history.db")]
        for name in names:
            argv += ["--unit", f"{name}=vllm"]
        log = stack.enter_context(open(tmp / "serve.log", "w"))
        serve = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        stack.callback(stop, serve)
        wait_http(port, 30, "llmstartup serve")
        time.sleep(2 * INTERVAL)  # it has sampled the empty cgroups: it watches from before the start

        units = []
        for name, offset in zip(names, OFFSETS):
            path = tmp / f"{name}.json"
            path.write_text(json.dumps(hang_unit(offset)))
            unit = sandbox.start_unit(journald, name, [sys.executable, "-m", "exporter.shell.demo.vllm_startup", str(path)])
            stack.callback(unit.stop)
            units.append(unit)

        seen: dict[str, float] = {}
        verdicts: dict[str, list[str]] = {u.name: [] for u in units}
        deadline = time.monotonic() + 4.5 + max(OFFSETS) + STALL + 6 * INTERVAL
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
        rows = []
        delays = []
        for unit in units:
            last = _last_line_time(journald, unit)
            if unit.name not in seen:
                say(f"{unit.name}: never stalled within the deadline; verdicts {' → '.join(verdicts[unit.name])}")
                delays.append(float("inf"))
                continue
            took = seen[unit.name] - last
            delays.append((took - STALL) / INTERVAL)
            say(f"{unit.name}: stalled {took:5.2f} s after its last line; past the threshold by "
                f"{took - STALL:5.2f} s = {delays[-1]:.2f} intervals  ({' → '.join(verdicts[unit.name])})")
    worst, mean = max(delays), sum(delays) / len(delays)
    say(f"(time to stalled − threshold) / interval: mean {mean:.2f}, worst {worst:.2f} (goal ≤ 2)")
    say()
    rows.append(Row(f"last sign of life → stalled, past the {STALL:g} s threshold, in {INTERVAL:g} s intervals "
                    f"(worst of {len(OFFSETS)})", f"{worst:.2f}", f"threshold {STALL:g} s", f"{(STALL + worst * INTERVAL) / STALL:.2f}x",
                    "≤ 2 intervals", worst <= 2.0))
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
