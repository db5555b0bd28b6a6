"""A scripted vLLM V1 (0.11) startup: real-format output driven by a list of steps.

    python -m exporter.shell.demo.vllm_startup SCENARIO.json
    python -m exporter.shell.demo.vllm_startup --scenario demo

A scenario is a JSON list of steps, run in order:

    {"log": "text"}            a vLLM logger line: `(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:NN] text`.
                               The process, level and source come from MESSAGES (the real ones for
                               that message in 0.11.0) unless given: "proc", "level", "src" ("core.py:77").
                               uvicorn's messages print as uvicorn does: `(APIServer pid=N) INFO:     text`.
                               "{api_pid}" and "{engine_pid}" in the text become those pids.
    {"raw": "text"}            the text and a newline, unformatted ("proc" adds the process prefix only)
    {"sleep": s}               idle for s seconds
    {"burn": s, "workers": n}  n child processes burn CPU silently for s seconds, each writing what it
                               compiles to a cache file, 256 KiB a second (torch.compile's workers);
                               "cache": false writes nothing: only CPU turns, as in a spinning collective
    {"bar": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "steps": n, "seconds": s}
                               a tqdm bar redrawn with \\r and no newline until it ends, as tqdm does;
                               "per_line": true ends every redraw with \\n instead (vLLM's shard bar);
                               "until": k stops it after its k-th step, unfinished, as a load stuck on a shard
    {"traceback": "torch.OutOfMemoryError: …"}
                               an EngineCore failure as 0.11 prints it: `EngineCore failed to start.`
                               and the logged traceback, then the interpreter's, ending in that line
    {"color": true}            wrap process prefixes in ANSI cyan from now on, as vLLM 0.10–0.13 do
    {"hang": true}             idle forever
    {"exit": code}             exit with that status

The first line of an EngineCore process forks a real idle child whose pid the prefix carries, as
vLLM's EngineCore_DP0 is a child of the API server. SIGTERM, as vLLM's API server does, raises
KeyboardInterrupt("terminated"), whose traceback ends everything, and exits 0 (Ctrl-C the same, exiting 130);
once uvicorn serves (`Application startup complete.`), it shuts down as uvicorn does instead.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, TextIO

API = "APIServer"
KERNEL_BYTES, KERNEL_EVERY = 64 * 1024, 0.25  # what a compile worker writes to its cache, and how often
ENGINE = "EngineCore_DP0"

# Message prefix → (process, source file:line in vLLM 0.11.0 unless noted). The first match wins.
MESSAGES: tuple[tuple[str, str, str], ...] = (
    ("vLLM API server version", API, "api_server.py:1839"),
    ("non-default args:", API, "utils.py:233"),
    ("Automatically detected platform", API, "__init__.py:216"),
    ("Resolved architecture:", API, "model.py:547"),
    ("Using max model len", API, "model.py:1510"),
    ("Chunked prefill is enabled", API, "scheduler.py:205"),
    ("Waiting for init message from front-end.", ENGINE, "core.py:644"),
    ("Initializing a V1 LLM engine", ENGINE, "core.py:77"),
    ("world_size=", ENGINE, "parallel_state.py:1029"),
    ("vLLM is using nccl==", ENGINE, "pynccl.py:103"),
    ("rank ", ENGINE, "parallel_state.py:1208"),
    ("Starting to load model", ENGINE, "gpu_model_runner.py:2602"),
    ("Loading model from scratch...", ENGINE, "gpu_model_runner.py:2634"),
    ("Using Flash Attention backend", ENGINE, "cuda.py:366"),
    ("Using model weights format", ENGINE, "weight_utils.py:392"),
    ("Time spent downloading weights", ENGINE, "weight_utils.py:413"),
    ("Loading weights took", ENGINE, "default_loader.py:267"),
    ("Model loading took", ENGINE, "gpu_model_runner.py:2653"),
    ("Using cache directory:", ENGINE, "backends.py:548"),
    ("Dynamo bytecode transform time", ENGINE, "backends.py:559"),
    ("Cache the graph of", ENGINE, "backends.py:200"),
    ("Compiling a graph for", ENGINE, "backends.py:218"),
    ("Directly load the compiled graph", ENGINE, "backends.py:164"),
    ("torch.compile takes", ENGINE, "monitor.py:34"),
    ("No available shared memory broadcast block", ENGINE, "shm_broadcast.py:466"),
    ("Available KV cache memory", ENGINE, "gpu_worker.py:298"),
    ("GPU KV cache size", ENGINE, "kv_cache_utils.py:1087"),
    ("Maximum concurrency for", ENGINE, "kv_cache_utils.py:1091"),
    ("Compile and warming up model for size", ENGINE, "gpu_worker.py:332"),
    ("Warming up FlashInfer attention.", ENGINE, "kernel_warmup.py:52"),
    ("Registering", ENGINE, "custom_all_reduce.py:203"),
    ("Graph capturing finished", ENGINE, "gpu_model_runner.py:3480"),
    ("init engine (profile, create kv cache, warmup model)", ENGINE, "core.py:210"),
    ("EngineCore failed to start.", ENGINE, "core.py:708"),
    ("Engine 000: vllm cache_config_info", API, "loggers.py:147"),
    ("Supported_tasks:", API, "api_server.py:1634"),
    ("Using default chat sampling params", API, "serving_chat.py:139"),
    ("Starting vLLM API server", API, "api_server.py:1912"),
    ("Available routes are:", API, "launcher.py:34"),
    ("Route:", API, "launcher.py:42"),
)
DEFAULT_SOURCE = (API, "api_server.py:1")
# uvicorn formats its own records (`%(levelprefix)s %(message)s`, uvicorn/logging.py) on stderr.
UVICORN = (
    "Started server process",
    "Waiting for application startup.",
    "Application startup complete.",
    "Application startup failed. Exiting.",
    "Uvicorn running on",
    "Shutting down",
    "Finished server process",
    "error while attempting to bind",
)

CONFIG = (
    "model='Qwen/Qwen3-8B', speculative_config=None, tokenizer='Qwen/Qwen3-8B', skip_tokenizer_init=False, "
    "tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, "
    "dtype=torch.bfloat16, max_seq_len=32768, download_dir=None, load_format=auto, tensor_parallel_size=1, "
    "pipeline_parallel_size=1, data_parallel_size=1, disable_custom_all_reduce=False, quantization=None, "
    "enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, "
    "structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_fallback=False, "
    "disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser=''), "
    "observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, "
    "otlp_traces_endpoint=None, collect_detailed_traces=None), seed=0, served_model_name=Qwen/Qwen3-8B, "
    "enable_prefix_caching=True, chunked_prefill_enabled=True, pooler_config=None, "
    'compilation_config={"level":3,"debug_dump_path":"","cache_dir":"","backend":"","custom_ops":[],'
    '"splitting_ops":["vllm.unified_attention","vllm.unified_attention_with_output","vllm.mamba_mixer2",'
    '"vllm.mamba_mixer","vllm.short_conv","vllm.linear_attention","vllm.plamo2_mamba_mixer",'
    '"vllm.gdn_attention","vllm.sparse_attn_indexer"],"use_inductor":true,"compile_sizes":[],'
    '"inductor_compile_config":{"enable_auto_functionalized_v2":false},"inductor_passes":{},'
    '"cudagraph_mode":[2,1],"use_cudagraph":true,"cudagraph_num_of_warmups":1,'
    '"cudagraph_capture_sizes":[512,504,496,488,480,472,464,456,448,440,432,424,416,408,400,392,384,376,'
    "368,360,352,344,336,328,320,312,304,296,288,280,272,264,256,248,240,232,224,216,208,200,192,184,176,"
    '168,160,152,144,136,128,120,112,104,96,88,80,72,64,56,48,40,32,24,16,8,4,2,1],'
    '"cudagraph_copy_inputs":false,"full_cuda_graph":false,"use_inductor_graph_partition":false,'
    '"pass_config":{},"max_capture_size":512,"local_cache_dir":null}'
)

# The built-in demo: Qwen3-8B on one GPU, a cold torch.compile, about 55 s to ready.
DEMO: list[dict[str, Any]] = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "non-default args: {'model_tag': 'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', "
            "'max_model_len': 32768, 'gpu_memory_utilization': 0.9}"},
    {"sleep": 1.5},
    {"log": "Resolved architecture: Qwen3ForCausalLM"},
    {"log": "Using max model len 32768"},
    {"log": "Chunked prefill is enabled with max_num_batched_tokens=2048."},
    {"sleep": 1.0},
    {"log": "Waiting for init message from front-end."},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: " + CONFIG},
    {"sleep": 0.5},
    # TP=1: no pynccl communicator, so no "vLLM is using nccl==" line; the rank line ends distributed init.
    {"log": "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Loading model from scratch..."},
    {"log": "Using Flash Attention backend on V1 engine."},
    {"log": "Using model weights format ['*.safetensors']"},
    {"bar": "Loading safetensors checkpoint shards", "steps": 5, "seconds": 11.0, "per_line": True},
    {"log": "Loading weights took 11.02 seconds"},
    {"log": "Model loading took 15.2683 GiB and 12.301538 seconds"},
    {"sleep": 0.5},
    {"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7f2c1d9e4a/rank_0_0/backbone "
            "for vLLM's torch.compile"},
    {"log": "Dynamo bytecode transform time: 6.12 s"},
    {"burn": 20.0, "workers": 2},
    {"log": "Compiling a graph for dynamic shape takes 17.96 s"},
    {"log": "torch.compile takes 24.08 s in total"},
    {"sleep": 1.0},
    {"log": "Available KV cache memory: 56.63 GiB"},
    {"log": "GPU KV cache size: 412,336 tokens"},
    {"log": "Maximum concurrency for 32,768 tokens per request: 12.58x"},
    # silent for 12 s: the agent infers the capture from the silence after the KV cache lines, and the bar's
    # record, when it ends, confirms it
    {"bar": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "steps": 67, "seconds": 12.0},
    {"log": "Graph capturing finished in 12 secs, took 0.52 GiB"},
    {"log": "init engine (profile, create kv cache, warmup model) took 41.20 seconds"},
    {"log": "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 25771"},
    {"log": "Supported_tasks: ['generate']"},
    {"log": "Using default chat sampling params from model: "
            "{'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}"},
    {"log": "Starting vLLM API server 0 on http://0.0.0.0:8000"},
    {"log": "Available routes are:"},
    {"log": "Route: /openapi.json, Methods: GET, HEAD"},
    {"log": "Route: /docs, Methods: GET, HEAD"},
    {"log": "Route: /health, Methods: GET"},
    {"log": "Route: /v1/models, Methods: GET"},
    {"log": "Route: /v1/chat/completions, Methods: POST"},
    {"log": "Route: /v1/completions, Methods: POST"},
    {"log": "Route: /metrics, Methods: GET"},
    {"log": "Started server process [{api_pid}]"},
    {"log": "Waiting for application startup."},
    {"log": "Application startup complete."},
    {"hang": True},
]
SCENARIOS: dict[str, list[dict[str, Any]]] = {"demo": DEMO}

SITE = "/usr/local/lib/python3.12/dist-packages"
# The frames 0.11's EngineCore prints when initialisation fails, by where it failed.
FRAMES = {
    "profile": [
        ("vllm/v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        ("vllm/v1/engine/core.py", 498, "__init__",
         "super().__init__(vllm_config, executor_class, log_stats,"),
        ("vllm/v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
        ("vllm/v1/engine/core.py", 190, "_initialize_kv_caches",
         "self.model_executor.determine_available_memory())"),
        ("vllm/v1/executor/abstract.py", 85, "determine_available_memory",
         'return self.collective_rpc("determine_available_memory")'),
        ("vllm/executor/uniproc_executor.py", 83, "collective_rpc",
         "return [run_method(self.driver_worker, method, args, kwargs)]"),
        ("vllm/utils/__init__.py", 3122, "run_method", "return func(*args, **kwargs)"),
        ("torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
        ("vllm/v1/worker/gpu_worker.py", 263, "determine_available_memory",
         "self.model_runner.profile_run()"),
        ("vllm/v1/worker/gpu_model_runner.py", 3017, "profile_run",
         "= self._dummy_run(self.max_num_tokens, is_profile=True)"),
        ("torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
        ("vllm/v1/worker/gpu_model_runner.py", 2760, "_dummy_run", "outputs = self.model("),
        ("vllm/compilation/cuda_graph.py", 126, "__call__", "return self.runnable(*args, **kwargs)"),
        ("torch/nn/modules/module.py", 1773, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
        ("torch/nn/modules/module.py", 1784, "_call_impl", "return forward_call(*args, **kwargs)"),
        ("vllm/model_executor/models/qwen3.py", 316, "forward",
         "hidden_states = self.model(input_ids, positions, intermediate_tensors,"),
    ],
    "kv_cache": [
        ("vllm/v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        ("vllm/v1/engine/core.py", 498, "__init__",
         "super().__init__(vllm_config, executor_class, log_stats,"),
        ("vllm/v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
        ("vllm/v1/engine/core.py", 199, "_initialize_kv_caches",
         "kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs,"),
        ("vllm/v1/core/kv_cache_utils.py", 1243, "get_kv_cache_configs",
         "check_enough_kv_cache_memory(vllm_config, kv_cache_spec_one_worker,"),
        ("vllm/v1/core/kv_cache_utils.py", 699, "check_enough_kv_cache_memory", "raise ValueError("),
    ],
}


# --- output ------------------------------------------------------------------------------------


def _set_comm(name: str) -> None:
    """Best effort: name this process as ps and /proc/PID/comm show it (prctl PR_SET_NAME)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """Best effort: SIGKILL this child when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Console:
    """Writes as vLLM's processes do: each process's stdout/stderr prefixes `(Name pid=N) ` at line starts."""

    def __init__(self, stdout: TextIO, stderr: TextIO, engine_pid: Callable[[], int]) -> None:
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.engine_pid = engine_pid
        self.color = False
        self._new_line: dict[tuple[str, str], bool] = {}

    def pid(self, proc: str) -> int:
        return os.getpid() if proc == API else self.engine_pid()

    def write(self, text: str, proc: str | None = None, stream: str = "stdout") -> None:
        """vllm/utils _add_prefix(): the prefix before the first character after every newline."""
        out = self.streams[stream]
        if proc is not None and text:
            label = f"({proc} pid={self.pid(proc)})"
            prefix = f"\033[1;36m{label}\033[0m " if self.color else f"{label} "
            key = (proc, stream)
            new_line = self._new_line.get(key, True)
            pieces, start = [], 0
            while start < len(text):  # only "\n" starts a line: a "\r" redraw stays on it
                if new_line:
                    pieces.append(prefix)
                end = text.find("\n", start)
                if end == -1:
                    pieces.append(text[start:])
                    new_line = False
                    break
                pieces.append(text[start : end + 1])
                start, new_line = end + 1, True
            self._new_line[key] = new_line
            text = "".join(pieces)
        out.write(text)
        out.flush()

    def substitute(self, text: str) -> str:
        if "{api_pid}" in text:
            text = text.replace("{api_pid}", str(os.getpid()))
        if "{engine_pid}" in text:
            text = text.replace("{engine_pid}", str(self.engine_pid()))
        return text

    def log(self, message: str, proc: str | None = None, level: str = "INFO", src: str | None = None) -> None:
        message = self.substitute(message)
        if any(message.startswith(m) for m in UVICORN) and src is None:
            # uvicorn's DefaultFormatter: "INFO:" padded to 9 columns, then a space.
            self.write(f"{level + ':':<9} {message}\n", proc or API, "stderr")
            return
        default_proc, default_src = next(
            ((p, s) for prefix, p, s in MESSAGES if message.startswith(prefix)), DEFAULT_SOURCE
        )
        head = f"{level} {time.strftime('%m-%d %H:%M:%S')} [{src or default_src}] "
        # NewLineFormatter: every newline inside a message repeats the logging prefix after a \r.
        self.write(head + message.replace("\n", "\r\n" + head) + "\n", proc or default_proc, "stdout")


def _interval(seconds: float) -> str:
    """tqdm.format_interval."""
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _bar_text(desc: str, n: int, total: int, elapsed: float, per_line: bool) -> str:
    """One tqdm redraw: the default `{l_bar}{bar}{r_bar}` at 10 columns (no tty), or vLLM's shard format."""
    rate = n / elapsed if n and elapsed > 0 else None
    if rate is None:
        rate_fmt = "?it/s"
    elif rate < 1:
        rate_fmt = f"{1 / rate:5.2f}s/it"
    else:
        rate_fmt = f"{rate:5.2f}it/s"
    remaining = _interval((total - n) / rate) if rate else "?"
    times = f"[{_interval(elapsed)}<{remaining}, {rate_fmt}]"
    percentage = 100.0 * n / total if total else 100.0
    if per_line:  # vllm weight_utils._BAR_FORMAT
        return f"{desc}: {percentage:3.0f}% Completed | {n}/{total} {times}\n"
    charset = " ▏▎▍▌▋▊▉█"
    full, partial = divmod(int(n / total * 10 * 8) if total else 80, 8)
    bar = charset[-1] * full
    if full < 10:
        bar += charset[partial] + " " * (10 - full - 1)
    return f"{desc}: {percentage:3.0f}%|{bar}| {n}/{total} {times}"


# --- the program -------------------------------------------------------------------------------


class Startup:
    """Runs the steps; owns the EngineCore child and the compile workers, and ends them on exit."""

    def __init__(self, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> None:
        self.engine: int | None = None
        self.workers: list[int] = []
        self.console = Console(stdout, stderr, self._engine_pid)
        self.serving = False  # uvicorn has started: a signal is its graceful shutdown, not a traceback

    def run(self, steps: list[dict[str, Any]]) -> int:
        try:
            for step in steps:
                code = self.step(step)
                if code is not None:
                    return code
            return 0
        finally:
            self.cleanup()

    def step(self, step: dict[str, Any]) -> int | None:
        proc = step.get("proc")
        self.serving = self.serving or "Application startup complete." in str(step.get("log", step.get("raw", "")))
        if "log" in step:
            self.console.log(str(step["log"]), proc, step.get("level", "INFO"), step.get("src"))
        elif "raw" in step:
            raw = self.console.substitute(str(step["raw"]))
            self.console.write(raw + "\n", proc, step.get("stream", "stdout"))
        elif "sleep" in step:
            time.sleep(float(step["sleep"]))
        elif "burn" in step:
            self.burn(float(step["burn"]), int(step.get("workers", 2)), bool(step.get("cache", True)))
        elif "bar" in step:
            self.bar(str(step["bar"]), int(step.get("steps", 10)), float(step.get("seconds", 1.0)),
                     bool(step.get("per_line", False)), proc or ENGINE, None if step.get("until") is None else int(step["until"]))
        elif "traceback" in step:
            self.traceback(str(step["traceback"]), proc or ENGINE, step.get("frames"))
        elif "color" in step:
            self.console.color = bool(step["color"])
        elif "hang" in step:
            while True:
                signal.pause()
        elif "exit" in step:
            return int(step["exit"])
        else:
            raise ValueError(f"unknown step {step!r}")
        return None

    def bar(self, desc: str, steps: int, seconds: float, per_line: bool, proc: str, until: int | None = None) -> None:
        """tqdm's redraws on stderr: `\\r` + bar each time, then the final state again and `\\n` on close."""
        start = time.monotonic()
        last = 0
        for n in range(steps + 1 if until is None else until + 1):
            if n:
                time.sleep(max(0.0, start + seconds * n / steps - time.monotonic()))
            text = _bar_text(desc, n, steps, time.monotonic() - start, per_line)
            self.console.write("\r" + text + " " * max(last - len(text), 0), proc, "stderr")
            last = len(text)
        if until is not None:  # stuck: tqdm never closes the bar
            return
        text = _bar_text(desc, steps, steps, time.monotonic() - start, per_line)
        self.console.write("\r" + text + "\n", proc, "stderr")

    def traceback(self, exception: str, proc: str, frames: str | None) -> None:
        """logger.exception("EngineCore failed to start."), then the uncaught exception, as 0.11 prints."""
        if frames is None:
            frames = "kv_cache" if "KV cache" in exception or "cache blocks" in exception else "profile"
        lines = ["Traceback (most recent call last):"]
        for path, line, function, code in FRAMES[frames]:
            lines.append(f'  File "{SITE}/{path}", line {line}, in {function}')
            lines.append(f"    {code}")
        lines.append(exception)
        self.console.log("EngineCore failed to start.\n" + "\n".join(lines), proc, "ERROR")
        self.console.write(f"Process {proc}:\n", proc, "stderr")
        outer = [
            lines[0],
            '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
            "    self.run()",
            '  File "/usr/lib/python3.12/multiprocessing/process.py", line 108, in run',
            "    self._target(*self._args, **self._kwargs)",
            *lines[1:],
        ]
        self.console.write("\n".join(outer) + "\n", proc, "stderr")

    def interrupted(self, why: str) -> None:
        """uvicorn's graceful shutdown once it serves; before, the API server's uncaught KeyboardInterrupt, as
        the interpreter prints it."""
        if self.serving:
            for message in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                            f"Finished server process [{os.getpid()}]"):
                self.console.write(f"{'INFO:':<9} {message}\n", API, "stderr")
            return
        frames = [f'  File "{SITE}/vllm/entrypoints/openai/api_server.py", line 1953, in <module>',
                  "    uvloop.run(run_server(args))"]
        last = f"KeyboardInterrupt: {why}" if why else "KeyboardInterrupt"
        self.console.write("\n".join(["Traceback (most recent call last):", *frames, last]) + "\n", API, "stderr")

    def burn(self, seconds: float, workers: int, cache: bool = True) -> None:
        """Silent CPU work in child processes, as torch.compile's workers, which write the kernels they
        compile to its cache (a file unlinked at once: nothing is left behind) unless `cache` is off;
        they exit when done."""
        self._flush()
        parent = os.getpid()
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:
                self._child("compile_worker")
                kernel = os.urandom(KERNEL_BYTES)
                with tempfile.TemporaryFile(prefix="llmstartup-demo-kernel-") as kernels:
                    written = time.monotonic()
                    deadline = written + seconds
                    while time.monotonic() < deadline and os.getppid() == parent:
                        for _ in range(10000):
                            pass
                        if cache and time.monotonic() - written >= KERNEL_EVERY:
                            os.pwrite(kernels.fileno(), kernel, 0)
                            written = time.monotonic()
                os._exit(0)
            self.workers.append(pid)
        while self.workers:
            os.waitpid(self.workers[0], 0)
            self.workers.pop(0)

    def cleanup(self) -> None:
        children = [*self.workers, *([self.engine] if self.engine else [])]
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.workers, self.engine = [], None
        self._flush()

    def _engine_pid(self) -> int:
        """The EngineCore_DP0 process, forked idle at its first line (vLLM spawns it after parsing args)."""
        if self.engine is None:
            self._flush()
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                self._child("VLLM::EngineCore")
                while os.getppid() == parent:
                    time.sleep(0.5)
                os._exit(0)
            self.engine = pid
        return self.engine

    @staticmethod
    def _child(name: str) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _die_with_parent()
        _set_comm(name)

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("terminated")  # vLLM's API server's SIGTERM handler


def load(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.scenario is not None:
        return SCENARIOS[args.scenario]
    with open(args.file) as f:
        steps = json.load(f)
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ValueError(f"{args.file}: a scenario is a JSON list of step objects")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exporter.shell.demo.vllm_startup", description=__doc__.split("\n")[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("file", nargs="?", help="JSON list of steps")
    source.add_argument("--scenario", choices=sorted(SCENARIOS), help="a built-in scenario")
    args = parser.parse_args(argv)
    steps = load(args)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8", errors="replace")
    signal.signal(signal.SIGTERM, _terminate)
    startup = Startup()
    try:
        return startup.run(steps)
    except KeyboardInterrupt as stop:
        startup.interrupted(str(stop))
        return 0 if str(stop) else 130


if __name__ == "__main__":
    sys.exit(main())
