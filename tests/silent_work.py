"""Real silent work and real busy hangs, each a unit's program: `python -m tests.silent_work KIND [ARG]`.

Each prints a real-format vLLM startup (exporter.shell.demo.vllm_startup) up to its silent step, does the
real thing in its API server process, and, if that ends, prints the rest of the startup to ready:

    spin            "Capturing CUDA graphs …: 0%", then the host thread spins in `synchronize()` forever,
                    as a rank does in CUDA's spin-wait on a collective that never completes: a core, nothing else
    dynamo S        torch.compile(backend="eager") of a model deep enough that Dynamo traces it in-process,
                    silently, for about S seconds
    inductor S      torch.compile with Inductor on the CPU for S seconds: small models of new shapes, from an
                    empty cache (TORCHINDUCTOR_CACHE_DIR): worker processes, g++, cache files
    gloo PORT       rank 0 of a gloo group of two whose rank 1 joined and never calls the collective:
                    all_reduce waits forever
    gloo-peer PORT  that rank 1, started apart from the unit
    host FLAGS      one host's rank of a start over several, with vLLM's multi-node flags (--nnodes N --node-rank R
                    --master-addr A --master-port P): its banner, vLLM's world line, a real gloo rendezvous of the
                    N ranks at A:P and an all_reduce, then the rest of its start to ready; with
                    --stop-before-rendezvous it stops itself (SIGSTOP) after its banner, as a rank that never joins
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from exporter.shell.demo.vllm_startup import ENGINE, Startup

LOAD = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Model loading took 15.27 GiB and 2.10 seconds"},
]
COMPILE = [{"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone "
                   "for vLLM's torch.compile"}]
CAPTURE = [
    {"log": "GPU KV cache size: 412,336 tokens"},
    # tqdm's first draw of the bar, as it reaches the journal once a newline follows it
    {"raw": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/67 [00:00<?, ?it/s]",
     "proc": ENGINE, "stream": "stderr"},
]
READY = [
    {"log": "GPU KV cache size: 412,336 tokens"},
    {"log": "Graph capturing finished in 1 secs, took 0.52 GiB"},
    {"raw": "INFO:     Application startup complete."},
]
PEER_PORT = 29533


def synchronize() -> None:
    while True: pass  # one line: every dump finds the same frame, as a spin inside a C call would


def deep_model(blocks: int, width: int = 16):  # type: ignore[no-untyped-def]
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(width, width)
            self.norm = torch.nn.LayerNorm(width)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return x + torch.relu(self.norm(self.linear(x)))

    return torch.nn.Sequential(*[Block() for _ in range(blocks)])


def compile_once(blocks: int, backend: str, width: int = 16) -> float:
    import torch

    started = time.monotonic()
    torch.compile(deep_model(blocks, width), backend=backend)(torch.randn(4, width))
    return time.monotonic() - started


def trace(seconds: float) -> None:
    """Dynamo traces one model deep enough to take about `seconds`, sized by two smaller traces first."""
    started = time.monotonic()
    compile_once(10, "eager")  # Dynamo's first-use cost
    per_block = compile_once(60, "eager") / 60
    left = seconds - (time.monotonic() - started)
    compile_once(max(60, int(left / per_block)), "eager")


def inductor(seconds: float) -> None:
    """Inductor compiles small models of new shapes (new kernels each, built with g++) for `seconds`."""
    started, width = time.monotonic(), 8
    while time.monotonic() - started < seconds:
        compile_once(3, "inductor", width)
        width += 8


def gloo(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 0:
        dist.all_reduce(torch.ones(4))  # rank 1 never joins it
    else:
        while True:
            time.sleep(60)


def host(argv: list[str]) -> int:
    flags = argparse.ArgumentParser(prog="host")
    flags.add_argument("--nnodes", type=int, required=True)
    flags.add_argument("--node-rank", type=int, required=True)
    flags.add_argument("--master-addr", required=True)
    flags.add_argument("--master-port", type=int, required=True)
    flags.add_argument("--stop-before-rendezvous", action="store_true")
    args = flags.parse_args(argv)
    startup = Startup()
    try:
        startup.step(LOAD[0])
        if args.stop_before_rendezvous:
            os.kill(os.getpid(), signal.SIGSTOP)
        import torch
        import torch.distributed as dist

        method = f"tcp://{args.master_addr}:{args.master_port}"
        startup.step({"log": f"world_size={args.nnodes} rank={args.node_rank} local_rank=0 "
                             f"distributed_init_method={method} backend=gloo"})
        dist.init_process_group("gloo", init_method=method, rank=args.node_rank, world_size=args.nnodes)
        dist.all_reduce(torch.ones(4))
        for step in (*LOAD[1:], *READY):
            startup.step(step)
        startup.step({"hang": True})
        return 0
    finally:
        startup.cleanup()


def main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "gloo-peer":
        gloo(1, int(argv[1]))
        return 0
    if kind == "host":
        return host(argv[1:])
    startup = Startup()
    try:
        for step in LOAD:
            startup.step(step)
        if kind == "spin":
            for step in CAPTURE:
                startup.step(step)
            synchronize()
        if kind == "gloo":
            startup.step({"log": "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:"
                                 f"{argv[1]} backend=gloo"})
            gloo(0, int(argv[1]))
        for step in COMPILE:
            startup.step(step)
        started = time.monotonic()
        if kind == "dynamo":
            trace(float(argv[1]))
        elif kind == "inductor":
            inductor(float(argv[1]))
        else:
            raise SystemExit(f"unknown kind {kind!r}")
        took = time.monotonic() - started
        startup.step({"log": f"torch.compile takes {took:.2f} s in total"})
        for step in READY:
            startup.step(step)
        startup.step({"hang": True})
        return 0
    finally:
        startup.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
