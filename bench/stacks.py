"""8. What --collector.stacks costs: two agents watch the same 8 silent units, one with stacks, one without.

Each unit prints a vLLM startup and then hangs (its API server and its EngineCore child: two Python
processes, 16 in all). Both agents run `serve --sample.interval 2s --silence.threshold 10s
--no-collector.gpu` (stall threshold at its default, 5m: each silent unit is looked at once a minute),
one with `--collector.stacks`. Once every unit is silent and has been looked at, both are measured
over the same window (default 150 s): CPU = growth of utime+stime of each agent's process tree, plus
the CPU of the children it reaped meanwhile (cutime+cstime: the py-spy dumps, which live 50 ms each),
÷ wall time, in % of one core. The reference is the agent without stacks; the figure's goal is under
1% of a core. Also printed: the CPU of one look at a unit, from the difference. A process that has not
run since its last dump is not dumped again, so of each unit's two processes only the EngineCore child
(it wakes twice a second) is dumped at every look, as a busy rank would be; the API server, asleep, once.
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

from bench.common import CLOCK_TICKS, Row, descendants, free_port, say, scrape, stop, wait_http
from exporter.core.config import Config

UNITS = 8
INTERVAL, SILENCE = 2.0, 10.0
EVERY = Config(interval=INTERVAL, silence=SILENCE).stack_every  # how often a silent unit is looked at: 60 s
HANG = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Model loading took 15.27 GiB and 2.10 seconds"},
    {"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone "
            "for vLLM's torch.compile"},
    {"hang": True},
]


def tree_cpu(pid: int) -> float:
    """utime+stime of the process and its live descendants, plus what the process's reaped children used."""
    total = 0.0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields 14-15 (utime, stime) and, for the agent itself, 16-17 (cutime, cstime) of proc(5)
        ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if p == pid else 0)
        total += ticks / CLOCK_TICKS
    return total


def _verdicts(port: int) -> list[str]:
    return [d["verdict"] for d in json.loads(scrape(port, "/api/v1/units")[1])]


def _looked_at(port: int) -> int:
    return sum(1 for d in json.loads(scrape(port, "/api/v1/units")[1]) if d["stuck"])


def run(window: float = 150.0) -> list[Row]:
    from exporter.shell.demo import sandbox

    say(f"== 8. --collector.stacks: {UNITS} silent units (2 Python processes each), two agents side by side, "
        f"--sample.interval {INTERVAL:g}s --silence.threshold {SILENCE:g}s, {window:.0f} s window ==")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmstartup-bench-")))
        journald = stack.enter_context(sandbox.Journald(f"llmstartup-bench-{secrets.token_hex(3)}"))
        steps = tmp / "hang.json"
        steps.write_text(json.dumps(HANG))
        prefix = f"bench-{secrets.token_hex(2)}"
        units = []
        for i in range(UNITS):
            unit = sandbox.start_unit(journald, f"{prefix}-vllm{i}.service",
                                      [sys.executable, "-m", "exporter.shell.demo.vllm_startup", str(steps)])
            stack.callback(unit.stop)
            units.append(unit)
        agents = {}
        for which, flags in (("stacks", ["--collector.stacks"]), ("plain", [])):
            port = free_port()
            argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
                    "--web.listen-address", f"127.0.0.1:{port}", "--sample.interval", f"{INTERVAL:g}s",
                    "--silence.threshold", f"{SILENCE:g}s", "--no-collector.gpu",
                    "--state.path", str(tmp / f"{which}.db"), *flags]
            for unit in units:
                argv += ["--unit", unit.name]
            log = stack.enter_context(open(tmp / f"{which}.log", "w"))
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            stack.callback(stop, process)
            wait_http(port, 30, f"llmstartup serve ({which})")
            agents[which] = (process, port)

        deadline = time.monotonic() + SILENCE + 60
        while _looked_at(agents["stacks"][1]) < UNITS or "progressing" in _verdicts(agents["plain"][1]):
            if time.monotonic() > deadline:
                raise RuntimeError("the units did not all fall silent and get looked at within a minute; the "
                                   f"agent's log:\n{(tmp / 'stacks.log').read_text()[-2000:]}")
            time.sleep(0.5)
        start = {which: tree_cpu(process.pid) for which, (process, _) in agents.items()}
        began = time.monotonic()
        while time.monotonic() - began < window:
            for _, port in agents.values():
                scrape(port)
            time.sleep(INTERVAL)
        elapsed = time.monotonic() - began
        cpu = {which: (tree_cpu(process.pid) - start[which]) / elapsed * 100 for which, (process, _) in agents.items()}
        looks = UNITS * elapsed / EVERY
        per_look = (cpu["stacks"] - cpu["plain"]) / 100 * elapsed / looks * 1000
        ratio = cpu["stacks"] / cpu["plain"] if cpu["plain"] else float("inf")
        say(f"{'':40s}{'CPU % of a core':>16s}")
        say(f"{'llmstartup serve --collector.stacks':40s}{cpu['stacks']:16.2f}")
        say(f"{'llmstartup serve (reference)':40s}{cpu['plain']:16.2f}")
        say(f"about {looks:.0f} looks at a unit in the window: {per_look:.1f} ms of CPU each (py-spy dumps the "
            "EngineCore, which wakes twice a second; the API server, asleep since, keeps its first dump)")
        say(f"ratio {ratio:.2f}x (goal: under 1% of a core)")
        say()
        return [Row(f"steady CPU with --collector.stacks, % of one core ({UNITS} silent units, 2 s)",
                    f"{cpu['stacks']:.2f}%", f"{cpu['plain']:.2f}% (the same agent without stacks)",
                    f"{ratio:.2f}x", "< 1%", cpu["stacks"] < 1.0)]


if __name__ == "__main__":
    for row in run():
        print(row)
