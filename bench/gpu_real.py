"""On a real GPU: does the GPU source attribute what a process allocates, and how long do NVML calls take?

Run where a GPU and torch are at hand (a few minutes):  python bench/gpu_real.py [--steps 8] [--step-gib 2]
A child process allocates GPU memory in steps; after each step the agent's own GpuSource (real pynvml,
real driver) reads the child's memory, which is compared with what torch allocated. The difference is
the CUDA context (a few hundred MiB) and the caching allocator's rounding, so it should be constant.
Prints one line per step and NVML call latencies (p50/p99/max) as ratios to a plain nvmlDeviceGetCount.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import pynvml

from exporter.sources.gpu import GpuSource, by_unit

CHILD = """
import sys, torch
step = int(float(sys.argv[1]) * 2**30)
held = []
torch.cuda.init(); torch.empty(1, device="cuda"); print("ready", flush=True)
for line in sys.stdin:
    held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
    print(torch.cuda.memory_allocated(), flush=True)
"""


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(p * len(values)))]


def timed(call, repeat: int = 200) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step-gib", type=float, default=2.0)
    args = parser.parse_args()

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(args.step_gib)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    source = GpuSource(interval=0.2)
    source.start()
    try:
        start = time.monotonic()
        print("step  allocated_gib  nvml_gib  context_mib")
        for step in range(1, args.steps + 1):
            child.stdin.write("more\n")
            child.stdin.flush()
            allocated = int(child.stdout.readline())
            asked = time.monotonic()
            while source.latest is None or source.latest.t <= asked:
                time.sleep(0.05)
            memory = by_unit(source.latest, {"bench": frozenset({(child.pid, start)})})["bench"]
            seen = sum(v for v in memory.values() if v is not None)
            print(f"{step:4d}  {allocated / 2**30:13.2f}  {seen / 2**30:8.2f}  {(seen - allocated) / 2**20:11.0f}")
    finally:
        source.stop()
        child.kill()

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    reference = timed(pynvml.nvmlDeviceGetCount)
    calls = {
        "nvmlDeviceGetComputeRunningProcesses_v3": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle),
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
    }
    ref = statistics.median(reference)
    print(f"\nreference nvmlDeviceGetCount p50 {ref * 1e6:.1f} µs")
    for name, call in calls.items():
        t = timed(call)
        print(f"{name:42s} p50 {statistics.median(t) / ref:6.1f}x  p99 {percentile(t, 0.99) / ref:6.1f}x"
              f"  max {max(t) * 1e3:.2f} ms")
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
