"""2. Steady state and 3. /metrics latency: `llmstartup serve` on 8 busy units and 8 GPUs, beside node_exporter.

The rig: a private journald namespace (exporter.shell.demo.sandbox), 8 scripted vLLM units
(exporter.shell.demo.vllm_startup) that print their startup, then a weight-loading line every 2–3 s and
burn CPU in a forked worker now and then (0.25 s every ~10 s: torch.compile's workers); the fake
libnvidia-ml of the tests with 8 H200s, each unit's main pid holding memory on its own GPU (grown by
1 GiB every 10 s, as weights load); `llmstartup serve --sample.interval 2s --collector.gpu` on them;
and Debian's `prometheus-node-exporter` with its default collectors, on the same machine at the same
time. The benchmark scrapes both every 2 s, so both do comparable work.

2. Over a measured window (60 s) after a warm-up: CPU as % of one core, from utime+stime in
   /proc/<pid>/stat of the process and all its descendants (ours: serve and the journal reader child),
   RSS (the largest sum over the window, MiB) and PSS at its end.
3. Then a few hundred back-to-back scrapes of each /metrics, alternating, each on a new connection:
   p50/p99 latency seen by the client. Also, as the floor of an HTTP answer on loopback, a static
   file server (Python's http.server) serving a copy of our exposition.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    NODE_EXPORTER,
    MiB,
    Row,
    comm,
    cpu_seconds,
    descendants,
    find_binary,
    free_port,
    percentile,
    pss_bytes,
    rss_bytes,
    say,
    scrape,
    stop,
    wait_http,
)

UNITS = 8
GiB = 2**30
INTERVAL = 2.0

STARTUP = [
    {"sleep": 0.5},
    {"log": "vLLM API server version 0.11.0"},
    {"log": "non-default args: {'model_tag': 'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', 'tensor_parallel_size': 1}"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Using model weights format ['*.safetensors']"},
]


def busy_unit(index: int, seconds: float) -> list[dict[str, object]]:
    """A long weight load: a shard line every 2–3 s, a short CPU burst in a worker every 4th line."""
    steps: list[dict[str, object]] = [*STARTUP]
    every = 2.0 + 0.125 * index  # units out of step with each other
    total = int(seconds / every) + 1
    for n in range(1, total + 1):
        steps.append({"sleep": every})
        elapsed = n * every
        rate = elapsed / n
        steps.append({"raw": f"Loading safetensors checkpoint shards: {100 * n // total:3d}% Completed | "
                             f"{n}/{total} [{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}<"
                             f"{int(rate * (total - n)) // 60:02d}:{int(rate * (total - n)) % 60:02d}, "
                             f"{rate:5.2f}s/it]", "proc": "EngineCore_DP0", "stream": "stderr"})
        if n % 4 == index % 4:
            steps.append({"burn": 0.25, "workers": 1})
    steps.append({"hang": True})
    return steps


@dataclass
class Rig:
    namespace: str
    port: int
    node_port: int
    serve: subprocess.Popen  # type: ignore[type-arg]
    node: subprocess.Popen  # type: ignore[type-arg]
    units: list = field(default_factory=list)  # type: ignore[type-arg]
    nvml: object = None
    tmp: Path = Path()


def _fake_nvml(tmp: Path):  # type: ignore[no-untyped-def]
    from tests.fake_nvml.build import build
    from tests.fake_nvml.fixtures import Device, FakeNvml

    lib = tmp / "fake_nvml"
    build(lib)
    nvml = FakeNvml(tmp / "nvml.state", lib)
    nvml.devices = [Device() for _ in range(UNITS)]
    nvml.write()
    return nvml


@contextmanager
def rig(seconds: float) -> Iterator[Rig]:
    """Everything of items 2 and 3, running; all of it stopped and removed on the way out."""
    from exporter.shell.demo import sandbox

    node_binary = find_binary(NODE_EXPORTER, "prometheus-node-exporter")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmstartup-bench-")))
        nvml = _fake_nvml(tmp)
        journald = stack.enter_context(sandbox.Journald(f"llmstartup-bench-{secrets.token_hex(3)}"))
        prefix = f"bench-{secrets.token_hex(2)}"
        units = []
        for i in range(UNITS):
            path = tmp / f"unit{i}.json"
            path.write_text(json.dumps(busy_unit(i, seconds)))
            unit = sandbox.start_unit(journald, f"{prefix}-vllm{i}.service",
                                      [sys.executable, "-m", "exporter.shell.demo.vllm_startup", str(path)])
            stack.callback(unit.stop)
            units.append(unit)
            nvml.processes.append(_process(i, unit.pid, 4 * GiB))
        nvml.devices = [_device(i, 4 * GiB + 600 * MiB, 30) for i in range(UNITS)]
        nvml.write()

        port, node_port = free_port(), free_port()
        argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", journald.namespace,
                "--web.listen-address", f"127.0.0.1:{port}", "--sample.interval", f"{INTERVAL:g}s",
                "--collector.gpu", "--state.path", str(tmp / "history.db")]
        for unit in units:
            argv += ["--unit", f"{unit.name}=vllm"]
        serve_log = stack.enter_context(open(tmp / "serve.log", "w"))
        serve = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=serve_log, stderr=serve_log,
                                 env=nvml.env())
        stack.callback(stop, serve)
        node = subprocess.Popen([node_binary, f"--web.listen-address=127.0.0.1:{node_port}"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(stop, node)
        wait_http(port, 30, "llmstartup serve")
        wait_http(node_port, 30, "prometheus-node-exporter")
        yield Rig(journald.namespace, port, node_port, serve, node, units, nvml, tmp)


def _process(gpu: int, pid: int, used: int):  # type: ignore[no-untyped-def]
    from tests.fake_nvml.fixtures import Process

    return Process(gpu, pid, used)


def _device(index: int, used: int, utilization: int):  # type: ignore[no-untyped-def]
    from tests.fake_nvml.fixtures import Device

    return Device(memory_used=used, utilization=(utilization, utilization // 2))


def grow_memory(r: Rig, step: int) -> None:
    """Each unit's process holds 1 GiB more on its GPU: weights arriving."""
    nvml = r.nvml
    for p in nvml.processes:  # type: ignore[attr-defined]
        p.used = 4 * GiB + step * GiB
    for i, d in enumerate(nvml.devices):  # type: ignore[attr-defined]
        d.memory_used = 4 * GiB + step * GiB + 600 * MiB
        d.utilization = (30 + step % 50, 15)
    nvml.write()  # type: ignore[attr-defined]


def _units_followed(r: Rig) -> bool:
    text = scrape(r.port)[1].decode()
    on = [line for line in text.splitlines()
          if line.startswith("llmstartup_unit_phase{") and line.endswith(" 1.0") and 'phase="inactive"' not in line]
    gpu_up = 'llmstartup_source_up{source="gpu"} 1.0' in text
    return len(on) >= UNITS and gpu_up


@dataclass
class Usage:
    cpu_percent: float
    rss_mib: float  # the largest sum of RSS over the window
    pss_mib: float  # the sum of PSS at the end: shared pages counted once
    parts: dict[str, float]  # a line per process of the tree: its CPU over the window, its RSS at the end


class Meter:
    """CPU and RSS of a process tree over a window; the tree is read again at every sample."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.start_cpu = {p: cpu_seconds(p) for p in descendants(pid)}
        self.start = time.monotonic()

    def sample(self) -> None:
        self.peak = max(self.peak, sum(rss_bytes(p) for p in descendants(self.pid)))

    def usage(self) -> Usage:
        self.sample()
        elapsed = time.monotonic() - self.start
        tree = descendants(self.pid)
        cpu = {p: (cpu_seconds(p) - self.start_cpu.get(p, 0.0)) / elapsed * 100 for p in tree}
        parts = {f"CPU {cpu[p]:5.2f}%  RSS {rss_bytes(p) / MiB:5.1f} MiB  {p} {comm(p)}": 0.0 for p in tree}
        return Usage(sum(cpu.values()), self.peak / MiB, sum(pss_bytes(p) for p in tree) / MiB, parts)


def measure_steady(r: Rig, window: float) -> tuple[Usage, Usage, int]:
    """Scrape both every INTERVAL for `window` seconds; CPU and peak RSS of both trees."""
    ours, theirs = Meter(r.serve.pid), Meter(r.node.pid)
    deadline = time.monotonic() + window
    scrapes, step, next_tick = 0, 0, time.monotonic()
    while time.monotonic() < deadline:
        scrape(r.port)
        scrape(r.node_port)
        scrapes += 1
        ours.sample()
        theirs.sample()
        if scrapes % 5 == 0:
            step += 1
            grow_memory(r, step)
        next_tick += INTERVAL
        time.sleep(max(0.0, min(next_tick, deadline) - time.monotonic()))
    return ours.usage(), theirs.usage(), scrapes


def measure_latency(r: Rig, count: int) -> tuple[list[float], list[float], list[float], dict[str, int]]:
    """`count` scrapes of ours, node_exporter's and a static copy of ours, interleaved."""
    body = scrape(r.port)[1]
    static = r.tmp / "static"
    static.mkdir()
    (static / "metrics").write_bytes(body)
    static_port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                               str(static), str(static_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(static_port, 15, "the static file server")
        ours, node, floor = [], [], []
        sizes = {"ours": len(body)}
        for _ in range(count):
            took, _ = scrape(r.port)
            ours.append(took)
            took, nb = scrape(r.node_port)
            node.append(took)
            floor.append(scrape(static_port)[0])
        sizes["node_exporter"] = len(nb)
        return ours, node, floor, sizes
    finally:
        stop(server)


def run(window: float = 60.0, scrapes: int = 300, warmup: float = 10.0) -> list[Row]:
    say(f"== 2. steady state: {UNITS} busy units, {UNITS} fake GPUs, --sample.interval {INTERVAL:g}s, "
        f"beside prometheus-node-exporter, both scraped every {INTERVAL:g}s ==")
    rows: list[Row] = []
    with rig(window + warmup + 180) as r:
        deadline = time.monotonic() + 30
        while not _units_followed(r):
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve did not follow all {UNITS} units with GPU evidence within 30 s; "
                                   f"its log:\n{(r.tmp / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.5)
        # warm-up: both scraped, as in the window, before measuring
        measure_steady(r, warmup)
        load = os.getloadavg()[0]
        ours, node, n = measure_steady(r, window)
        load_after = os.getloadavg()[0]
        say(f"window {window:.0f} s, {n} scrapes of each; load average {load:.2f} before, {load_after:.2f} after")
        say(f"{'':28s}{'CPU % of a core':>16s}{'peak RSS MiB':>14s}{'PSS MiB':>9s}")
        say(f"{'llmstartup serve (tree)':28s}{ours.cpu_percent:16.2f}{ours.rss_mib:14.1f}{ours.pss_mib:9.1f}")
        for part in ours.parts:
            say(f"    {part[:100]}")
        say(f"{'prometheus-node-exporter':28s}{node.cpu_percent:16.2f}{node.rss_mib:14.1f}{node.pss_mib:9.1f}")
        cpu_ratio = ours.cpu_percent / node.cpu_percent if node.cpu_percent else float("inf")
        rss_ratio = ours.rss_mib / node.rss_mib if node.rss_mib else float("inf")
        say(f"ratio ours/node_exporter: CPU {cpu_ratio:.2f}x (goal: under 1% of a core), "
            f"RSS {rss_ratio:.2f}x (goal: under 40 MiB)")
        say()
        rows += [
            Row(f"steady CPU, % of one core ({UNITS} units, {UNITS} GPUs, 2 s)", f"{ours.cpu_percent:.2f}%",
                f"{node.cpu_percent:.2f}% (node_exporter)", f"{cpu_ratio:.2f}x", "< 1%", ours.cpu_percent < 1.0),
            Row("steady RSS, MiB (serve + reader child)", f"{ours.rss_mib:.1f} (PSS {ours.pss_mib:.1f})",
                f"{node.rss_mib:.1f} (node_exporter)", f"{rss_ratio:.2f}x", "< 40 MiB", ours.rss_mib < 40.0),
        ]

        say(f"== 3. /metrics latency at {UNITS} units: {scrapes} scrapes of each, alternating, new connection each ==")
        lat, node_lat, floor, sizes = measure_latency(r, scrapes)
        p = {name: (percentile(v, 0.5) * 1e3, percentile(v, 0.99) * 1e3) for name, v in
             (("ours", lat), ("node", node_lat), ("floor", floor))}
        say(f"{'':34s}{'p50 ms':>8s}{'p99 ms':>8s}{'max ms':>8s}{'bytes':>9s}")
        say(f"{'llmstartup serve /metrics':34s}{p['ours'][0]:8.2f}{p['ours'][1]:8.2f}{max(lat) * 1e3:8.2f}{sizes['ours']:9d}")
        say(f"{'prometheus-node-exporter /metrics':34s}{p['node'][0]:8.2f}{p['node'][1]:8.2f}{max(node_lat) * 1e3:8.2f}"
            f"{sizes['node_exporter']:9d}")
        say(f"{'static copy (python http.server)':34s}{p['floor'][0]:8.2f}{p['floor'][1]:8.2f}{max(floor) * 1e3:8.2f}"
            f"{sizes['ours']:9d}")
        r50, r99 = p["ours"][0] / p["node"][0], p["ours"][1] / p["node"][1]
        say(f"ratio ours/node_exporter: p50 {r50:.2f}x, p99 {r99:.2f}x (goal: p99 under 5 ms)")
        say()
        rows += [
            Row("/metrics latency p50, ms (8 units)", f"{p['ours'][0]:.2f}", f"{p['node'][0]:.2f} (node_exporter)",
                f"{r50:.2f}x", "< 5 ms", p["ours"][0] < 5.0),
            Row("/metrics latency p99, ms (8 units)", f"{p['ours'][1]:.2f}", f"{p['node'][1]:.2f} (node_exporter)",
                f"{r99:.2f}x", "< 5 ms", p["ours"][1] < 5.0),
        ]
        errors = [line for line in (r.tmp / "serve.log").read_text().splitlines() if "ERROR" in line or "Traceback" in line]
        if errors:
            say("serve logged errors during the run:\n  " + "\n  ".join(errors[:10]))
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
