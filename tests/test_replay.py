"""`llmstartup replay`: saved logs in every format through the same core, as text and JSON."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

FORMATS = Path(__file__).parent / "formats"


def replay(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "replay", *args], input=stdin,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})


def documents(*args: str, stdin: bytes | None = None) -> list[dict]:
    done = replay(*args, "--format", "json", stdin=stdin)
    assert done.returncode == 0, done.stderr.decode()
    docs = json.loads(done.stdout)
    return docs if isinstance(docs, list) else [docs]


@pytest.fixture(scope="module")
def journal_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("journal") / "vllm.journal"
    path.write_bytes(gzip.decompress((FORMATS / "vllm.journal.gz").read_bytes()))
    return path


SCHEMA = {"unit", "engine", "engine_version", "model", "outcome", "last_phase", "failure_reason", "phases",
          "values", "silent_gaps", "startup_seconds", "attempts", "from_start", "earlier_starts", "basis"}


@pytest.mark.parametrize(
    ("sample", "unit", "outcome", "last_phase", "reason"),
    [
        pytest.param("vllm.json", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="journalctl -o json"),
        pytest.param("vllm.export", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="journalctl -o export"),
        pytest.param("vllm.short", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="journalctl -o short"),
        pytest.param("vllm.short-iso", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="-o short-iso"),
        pytest.param("vllm.short-precise", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="-o short-precise"),
        # a log that names no unit: the unit is the file
        pytest.param("vllm.docker", "vllm.docker", "ready", "ready", None, id="docker logs -t"),
        pytest.param("vllm.cri", "vllm.cri", "ready", "ready", None, id="a CRI log file"),
        pytest.param("vllm.docker-json", "vllm.docker-json", "ready", "ready", None, id="a json-file log"),
        pytest.param("vllm.log", "vllm.log", "failed", "capturing_graphs", "cuda_oom", id="vLLM's own output"),
        pytest.param("sglang.log", "sglang.log", "ready", "ready", None, id="SGLang's own output"),
        pytest.param("tgi.log", "tgi.log", "ready", "ready", None, id="TGI's own output"),
    ],
)
def test_every_format(sample, unit, outcome, last_phase, reason):
    [doc] = documents(str(FORMATS / sample))
    assert SCHEMA <= doc.keys()
    assert (doc["unit"], doc["outcome"], doc["last_phase"], doc["failure_reason"]) == (unit, outcome, last_phase, reason)
    assert doc["phases"][0]["phase"] == "launching"
    assert all(p["duration_seconds"] >= 0 for p in doc["phases"])


def test_a_journal_file_is_read_natively(journal_file):
    [doc] = documents(str(journal_file))
    assert (doc["unit"], doc["engine"], doc["engine_version"]) == ("vllm.service", "vllm", "0.11.0")
    assert doc["failure_reason"] == "cuda_oom"


def test_stdin_and_the_unit_name_for_a_plain_log():
    [doc] = documents("-", "--unit", "vllm-70b", stdin=(FORMATS / "vllm.log").read_bytes())
    assert doc["unit"] == "vllm-70b.service"
    assert doc["model"] == "meta-llama/Llama-3.1-70B-Instruct"
    assert [g["phase"] for g in doc["silent_gaps"]] == ["launching", "loading_weights", "capturing_graphs"]
    assert all(g["duration_seconds"] >= 60 for g in doc["silent_gaps"])


RESTARTS = """\
(APIServer pid=11) INFO 03-14 10:00:00 [api_server.py:1839] vLLM API server version 0.11.0
(EngineCore_DP0 pid=12) INFO 03-14 10:00:05 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B...
(EngineCore_DP0 pid=12) ERROR 03-14 10:00:40 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
(APIServer pid=21) INFO 03-14 10:01:00 [api_server.py:1839] vLLM API server version 0.11.0
(EngineCore_DP0 pid=22) INFO 03-14 10:01:05 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B...
(EngineCore_DP0 pid=22) ERROR 03-14 10:01:50 [core.py:708] ValueError: To serve at least one request with the models's \
max seq len (131072), (18.00 GiB KV cache is needed, which is larger than the available KV cache memory (6.00 GiB).
(APIServer pid=31) INFO 03-14 10:02:00 [api_server.py:1839] vLLM API server version 0.11.0
(EngineCore_DP0 pid=32) INFO 03-14 10:02:05 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B...
(APIServer pid=31) INFO:     Application startup complete.
"""


def test_a_log_of_several_starts_says_how_each_earlier_one_ended(tmp_path):
    log = tmp_path / "restarts.log"
    log.write_text(RESTARTS)
    text = replay(str(log), "--year", "2026", env={"TZ": "UTC"}).stdout.decode().splitlines()
    assert text[:3] == [
        "restarts.log (vllm, 0.11.0, Qwen/Qwen3-8B): ready after 5.0s  [start 3 of 3 in this log]",
        "  start 1 of 3 at 10:00:00: failed (cuda_oom) in downloading after 1m00s",
        "  start 2 of 3 at 10:01:00: failed (bad_config) in allocating_kv_cache after 1m00s",
    ]
    [doc] = documents(str(log), "--year", "2026")
    assert [(e["outcome"], e["failure_reason"], e["last_phase"]) for e in doc["earlier_starts"]] == [
        ("failed", "cuda_oom", "downloading"), ("failed", "bad_config", "allocating_kv_cache")]


def test_a_log_without_times_still_gives_the_phases():
    [doc] = documents(str(FORMATS / "llamacpp.log"))
    assert doc["outcome"] == "ready"
    assert doc["startup_seconds"] is None
    assert [p["duration_seconds"] for p in doc["phases"]] == [None] * len(doc["phases"])


def test_several_units_in_one_file(tmp_path):
    both = tmp_path / "two.json"
    one = (FORMATS / "vllm.json").read_text()
    other = one.replace('"vllm.service"', '"vllm-b.service"')
    both.write_text(one + other)
    docs = documents(str(both))
    assert [d["unit"] for d in docs] == ["vllm-b.service", "vllm.service"]
    [only] = documents(str(both), "--unit", "vllm-b.service")
    assert only["unit"] == "vllm-b.service"


def _pid1(t: int, message: str, message_id: str, **extra: str) -> dict:
    """One of PID 1's lines about vllm.service as `journalctl -o json` prints it: filed under init.scope."""
    return {"__REALTIME_TIMESTAMP": str(t), "_PID": "1", "_SYSTEMD_UNIT": "init.scope", "_TRANSPORT": "journal",
            "UNIT": "vllm.service", "MESSAGE_ID": message_id, "MESSAGE": message, **extra}


def test_pid1_says_how_the_start_ended(tmp_path):
    """journald files PID 1's lines under init.scope; they are about the unit their UNIT names."""
    line = {"_SYSTEMD_UNIT": "vllm.service", "_TRANSPORT": "stdout", "_SYSTEMD_INVOCATION_ID": "a" * 32}
    log = [
        _pid1(1_000_000, "Started vllm.service.", "39f53479d3a045ac8e11786248231fbf"),
        {**line, "__REALTIME_TIMESTAMP": "2000000", "MESSAGE": "INFO 11-29 20:24:40 [api_server.py:1] vLLM API server version 0.11.0"},
        {**line, "__REALTIME_TIMESTAMP": "3000000", "MESSAGE": "INFO 11-29 20:24:41 [core.py:1] Starting to load model m..."},
        _pid1(9_000_000, "vllm.service: Main process exited, code=killed, status=9/KILL", "98e322203f7a4ed290d09fe03c09fe15"),
    ]
    path = tmp_path / "killed.json"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in log))
    [doc] = documents(str(path))
    assert (doc["outcome"], doc["failure_reason"], doc["last_phase"]) == ("failed", "killed", "downloading")
    assert doc["startup_seconds"] == 8.0  # from PID 1's Started to its word on the exit


def test_a_log_that_starts_mid_startup_and_ends_early(tmp_path):
    lines = (FORMATS / "vllm.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "Starting to load model" in line)
    end = next(i for i, line in enumerate(lines) if " ERROR " in line)
    cut = tmp_path / "middle.log"
    cut.write_text("\n".join(lines[start:end]) + "\n" + lines[end][:17])  # the last line truncated
    [doc] = documents(str(cut))
    assert doc["outcome"] == "incomplete"
    assert doc["last_phase"] == "capturing_graphs"


def test_text_output(journal_file):
    done = replay(str(FORMATS / "vllm.log"))
    text = done.stdout.decode()
    assert done.returncode == 0
    assert text.splitlines()[0].startswith("vllm.log (vllm, 0.10.2, meta-llama/Llama-3.1-70B-Instruct): failed (cuda_oom)")
    assert "silent 3m36s in loading_weights" in text
    assert "  loading_weights" in text
    assert "\n  basis: vllm's own rules\n" in text


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        pytest.param(["/nonexistent/vllm.log"], 1, "cannot read /nonexistent/vllm.log", id="a file that is not there: 1"),
        pytest.param(["/dev/null"], 1, "no model-server startup found", id="an empty file: 1"),
        pytest.param(["-", "--engine", "nosuch"], 2, "invalid choice", id="an unknown engine: 2"),
    ],
)
def test_bad_input(args, code, says):
    done = replay(*args, stdin=b"")
    assert done.returncode == code, done.stderr.decode()
    assert says in done.stderr.decode()


def test_binary_garbage_does_not_crash(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_bytes(bytes(range(256)) * 64 + b"\r\n\x1b[31m" * 100)
    done = replay(str(garbage))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr.decode()


# ---- the world's shapes (tests/corpus has them whole): each rule of replay, alone, in the pure core ----


def replayed(text: str, unit: str = "pasted.service", year: int = 2025) -> list[dict]:
    """The documents `replay --format json` gives for this text, through the pure core."""
    from exporter.core import formats
    from exporter.core.model import Limits
    from exporter.core.replay import Replay
    from exporter.core.report import replay_document

    lines = io.BytesIO(text.encode()).readlines()  # lines end at \n only, as replay reads a file: a \r is a redraw
    run = Replay(None, Limits(silence=60.0))
    run.feed(formats.read(lines[:50], lines, unit=unit, year=year))
    return [replay_document(r) for r in run.results()]


# A unit that runs vLLM through a launcher, which names its lines in a short format: PID 1 starts it, then it is ready.
LAUNCHED = ("Feb 22 06:34:42 host systemd[1]: Started vllm-assistant.service - vLLM OpenAI Server.\n"
            "Feb 22 06:34:50 host {launcher}[2827]: (APIServer pid=2827) INFO 02-22 06:34:50 [api_server.py:1] "
            "vLLM API server version 0.15.1\n"
            "Feb 22 06:35:40 host {launcher}[2827]: (APIServer pid=2827) INFO:     Application startup complete.\n")


VLLM_OOM_TAIL = """\
(VllmWorker rank=5 pid=3073)   File "/opt/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 1167, in load_model
(VllmWorker rank=5 pid=3073)     self.model = get_model(vllm_config=self.vllm_config)
(VllmWorker rank=5 pid=3073) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB.
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(VLLM_OOM_TAIL, {"engine": "vllm", "outcome": "failed", "failure_reason": "cuda_oom",
                                     "last_phase": "loading_weights", "from_start": False},
                     id="a traceback's tail: a start already under way, failed where its frames say"),
        pytest.param("Jun 09 10:29:22 gpu-1 llama-server[1020589]: main: server is listening on http://0.0.0.0:8080 - starting the main loop\n",
                     {"unit": "llama-server.service", "engine": "llamacpp", "outcome": "ready"},
                     id="journalctl's syslog identifier names the unit and the engine"),
        pytest.param('llm-api-ollama  | time=2024-05-01T10:00:00.000Z level=INFO source=routes.go:1054 msg="Listening on [::]:11434 (version 0.1.41)"\n',
                     {"unit": "llm-api-ollama.service", "engine": "ollama", "outcome": "ready", "engine_version": "0.1.41"},
                     id="a docker compose service is the unit"),
        pytest.param("авг 18 14:15:04 llm python3[28059]: (APIServer pid=27876) INFO 08-18 14:15:04 [api_server.py:592] Supported tasks: ['generate']\n",
                     {"engine": "vllm", "last_phase": "starting_api"},
                     id="journalctl in a Russian locale"),
        pytest.param("gpu-1:2514:2702 [0] ras/client_support.cc:105 NCCL WARN Call to bind failed: Address already in use\n"
                     "INFO 05-06 08:12:25 [parallel_state.py:1004] rank 0 in world size 2 is assigned as DP rank 0\n",
                     {"outcome": "incomplete", "failure_reason": None, "last_phase": "initializing_distributed"},
                     id="NCCL's warning is no failure, and the start that hangs after it is incomplete"),
        pytest.param("$ ./llama-server -m m.gguf\nllama_model_loader: loaded meta data with 25 key-value pairs and 579 tensors from m.gguf\n$\n",
                     {"outcome": "failed", "failure_reason": "exited", "from_start": True},
                     id="a pasted terminal: the prompt came back mid-load"),
        pytest.param("(sglang) root@gpu-3:~/sglang# python3 -m sglang.launch_server --model Qwen/Qwen3.5-4B\n"
                     "[2026-05-22 15:58:14] Warning: You are sending unauthenticated requests to the HF Hub.\n",
                     {"engine": "sglang", "outcome": "incomplete", "last_phase": "launching", "from_start": True},
                     id="a pasted command (after a conda env's prompt) that runs the engine is its start"),
        pytest.param("[2025-11-19 14:41:27] INFO:     Started server process [1]\n"
                     "[2025-11-19 14:41:27] Using default chat sampling params from model generation config: {'top_k': 20}\n"
                     "[2025-11-19 14:41:27] INFO:     Application startup complete.\n",
                     {"engine": "sglang", "outcome": "incomplete", "last_phase": "starting_api"},
                     id="uvicorn's lines after SGLang's own words are SGLang's: not ready before its warm-up"),
        pytest.param("(Worker pid=7) (Worker_DP0_EP0 pid=7) 2026-03-13 12:01:42,816 - WARNING - autotuner.py:490 - flashinfer.jit: "
                     "[Autotuner]: Skipping tactic at /opt/flashinfer/trtllm_fused_moe_routing_renormalize.cu:1\n"
                     "(Worker pid=7) (Worker_DP0_EP0 pid=7) 2026-03-13 12:01:42,820 - INFO - autotuner.py:262 - flashinfer.jit: "
                     "[Autotuner]: Autotuning process ends\n",
                     {"engine": "vllm", "last_phase": "warming_up"},
                     id="vLLM's worker tags name vLLM; FlashInfer's trtllm_ kernels are not TensorRT-LLM's server"),
        pytest.param('time=2026-05-13T15:18:55.900-04:00 level=INFO source=server.go:433 msg="starting runner" cmd="ollama runner"\n'
                     "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 4697620480\n"
                     'time=2026-05-13T15:18:55.984-04:00 level=INFO source=server.go:914 msg="model layout did not fit, applying backoff" backoff=0.10\n',
                     {"engine": "ollama", "outcome": "incomplete", "failure_reason": None, "last_phase": "loading_weights"},
                     id="Ollama fits a model by trying: an allocation it backs off from is no failure"),
        pytest.param('time=2026-05-13T15:18:55.900-04:00 level=INFO source=server.go:433 msg="starting runner" cmd="ollama runner"\n'
                     "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 4697620480\n",
                     {"engine": "ollama", "outcome": "failed", "failure_reason": "cuda_oom"},
                     id="the same allocation, where the log ends on it, is the failure"),
        pytest.param("$ vllm serve Qwen/Qwen3-8B\nINFO 05-08 00:41:40 [gpu_model_runner.py:1] Starting to load model Qwen/Qwen3-8B...\n"
                     "^C\n[rank0]: Traceback (most recent call last):\n",
                     {"engine": "vllm", "outcome": "stopped", "failure_reason": None, "last_phase": "downloading"},
                     id="a pasted terminal: Ctrl-C's echo mid-load is a stop, and its traceback no failure"),
        pytest.param("main: server is listening on http://127.0.0.1:8080 - starting the main loop\n^C^C\n",
                     {"engine": "llamacpp", "outcome": "ready"},
                     id="Ctrl-C after ready: the start was ready"),
        pytest.param("Jan 10 22:38:05 host systemd[1]: ollama.service: Main process exited, code=exited, status=203/EXEC\n"
                     "Jan 10 22:38:05 host systemd[1]: ollama.service: Failed with result 'exit-code'.\n"
                     "Jan 10 22:38:08 host systemd[1]: ollama.service: Scheduled restart job, restart counter is at 3.\n"
                     "Jan 10 22:38:08 host systemd[1]: Stopped Ollama Service.\n"
                     "Jan 10 22:38:08 host systemd[1]: Started Session 3 of User root.\n"
                     "Jan 10 22:38:08 host systemd[1]: Started Ollama Service.\n"
                     "Jan 10 22:38:08 host systemd[17836]: ollama.service: Failed at step EXEC spawning /usr/local/bin/ollama: "
                     "Permission denied\n",
                     {"unit": "ollama.service", "engine": "ollama", "outcome": "failed", "failure_reason": "bad_config",
                      "attempts": 2, "from_start": True},
                     id="a restart loop that never runs the engine: systemd's lines alone, about a unit named after it"),
        pytest.param("Feb 22 06:34:40 host env[2700]: (APIServer pid=2700) ERROR 02-22 06:34:40 [serving.py:1] bad request\n"
                     "Feb 22 06:34:41 host systemd[1]: Stopped vllm-assistant.service - vLLM OpenAI Server.\n"
                     + LAUNCHED.format(launcher="env"),
                     {"unit": "vllm-assistant.service", "engine": "vllm", "outcome": "ready", "startup_seconds": 58.0},
                     id="a unit that runs its engine through env: env's lines are the unit's PID 1 speaks of"),
        pytest.param(LAUNCHED.format(launcher="python3.12"),
                     {"unit": "vllm-assistant.service", "engine": "vllm", "outcome": "ready", "startup_seconds": 58.0},
                     id="the launcher's lines after PID 1's first word: the same"),
        pytest.param(LAUNCHED.format(launcher="docker"),
                     {"unit": "vllm-assistant.service", "engine": "vllm", "outcome": "ready", "startup_seconds": 58.0},
                     id="a unit that runs `docker run` in the foreground: the container's output under docker's name"),
        pytest.param("\u25cf ollama.service - Ollama Service\n"
                     "     Loaded: loaded (/etc/systemd/system/ollama.service; enabled; vendor preset: enabled)\n"
                     "     Active: active (running) since Sat 2025-02-15 23:56:25 CST; 9h ago\n"
                     "   Main PID: 1403868 (ollama)\n"
                     "     CGroup: /system.slice/ollama.service\n"
                     "             \u2514\u25001403868 /usr/bin/ollama serve\n\n"
                     "Feb 15 23:56:26 gpuws ollama[1403868]: CUDA driver version: 12.4\n",
                     {"unit": "ollama.service", "engine": "ollama", "outcome": "incomplete", "from_start": True,
                      "startup_seconds": 1.0},
                     id="systemctl status: its head says since when the unit runs"),
        pytest.param("\u25cf ollama3.service - ollama3\n"
                     "   Active: failed (Result: exit-code) since Thu 2025-10-02 11:22:18 CEST; 24min ago\n"
                     " Main PID: 536622 (code=exited, status=2)\n\n"
                     "Okt 02 11:22:18 srv-4 ollama[536622]: github.com/ollama/ollama/envconfig.Models()\n",
                     {"unit": "ollama3.service", "engine": "ollama", "outcome": "failed", "failure_reason": "crashed",
                      "from_start": False},
                     id="systemctl status of a unit that failed: the lines below its head are its, whatever they are called"),
        pytest.param("INFO 07-16 05:15:18 [gpu_model_runner.py:2] Graph capturing finished in **17 secs**, took **0.55** GiB\n",
                     {"values": {"engine_graph_capture_seconds": 17.0, "graph_memory_bytes": 0.55 * 2**30}},
                     id="markdown around the numbers"),
        # an answer for every log: the shared vocabulary under the engine's rules, the basis it rests on
        pytest.param("build: 4567 (e0b3d1a2) with cc (GCC) 13.2.0 for x86_64-linux-gnu\n"
                     "main: loading model\nllama_model_loader: loaded meta data with 29 key-value pairs\n"
                     "llama_kv_cache_unified: size = 2720.00 MiB ( 32768 cells,  40 layers,  1 seqs)\n"
                     "Segmentation fault (core dumped)\n",
                     {"engine": "llamacpp", "outcome": "failed", "failure_reason": "crashed",
                      "last_phase": "allocating_kv_cache", "basis": "vocabulary"},
                     id="the engine's rules say nothing of a later phase: the vocabulary places the failure in it"),
        pytest.param("2026-01-03 10:00:01,118 INFO my_service: Downloading model weights from s3://models/m\n"
                     "2026-01-03 10:00:09,001 INFO my_service: Loading model weights onto cuda:0\n"
                     "2026-01-03 10:00:30,502 ERROR my_service: KV cache of 2.1 GiB is larger than the available 1.4 GiB\n",
                     {"engine": "generic", "outcome": "failed", "failure_reason": "bad_config",
                      "last_phase": "allocating_kv_cache", "basis": "vocabulary"},
                     id="no engine named: the shared words alone give an answer"),
        pytest.param("/usr/src/server/text_generation_server/cli.py:12: UserWarning: a deprecated option\n"
                     "  warnings.warn(\n",
                     {"engine": "tgi", "outcome": "incomplete", "last_phase": "launching", "basis": "engine_name"},
                     id="a log that only names its engine: a start, resting on the name"),
        pytest.param("Traceback (most recent call last):\n"
                     '  File "/app/serve.py", line 9, in <module>\n'
                     "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                     "# the engine was still warming up the kernels when this appeared\n",
                     {"outcome": "failed", "failure_reason": "cuda_error", "last_phase": "launching"},
                     id="shared words after a failure (a note pasted under it) move nothing"),
        pytest.param("ggml_cuda_init: found 1 CUDA devices\nload_tensors: loading model tensors\n"
                     "main: error: cudaErrorMemoryAllocation: failed to allocate the KV buffer\n",
                     {"engine": "llamacpp", "failure_reason": "cuda_oom"},
                     id="an engine's vaguer reason yields to the vocabulary's root cause on the same line"),
        pytest.param("error while handling argument \"--flash-attn\": error: unkown value for --flash-attn: '--numa'\n"
                     "11:41:32-305704 ERROR    Error loading the model with llama.cpp: Server process terminated "
                     "unexpectedly with exit code: 1\n",
                     {"outcome": "failed", "failure_reason": "bad_config", "last_phase": "launching"},
                     id="a wrapper's vaguer report after the engine's own refusal does not move the failure"),
        pytest.param("Capturing CUDA graphs (decode, FULL):   0%|          | 0/70 [00:00<?, ?it/s]\n"
                     "vllm2-1  | (Worker_TP0 pid=81) ERROR 01-02 11:29:30 [multiproc_executor.py:824] WorkerProc hit an exception.\n",
                     {"unit": "vllm2-1.service", "last_phase": "capturing_graphs", "outcome": "failed"},
                     id="docker compose output of one service: a line that lost its prefix is the service's"),
    ],
)
def test_pasted_shapes(text, want):
    [doc] = replayed(text)
    assert {key: doc[key] for key in want} == want


def test_only_a_log_with_no_engine_and_no_phase_word_has_no_start():
    assert replayed("hello\nnothing a grammar knows\n") == []
    host = ("Jan 10 22:38:08 host sshd[77]: Warming up the host key cache\n"
            "Jan 10 22:38:09 host vllm[88]: INFO 01-10 22:38:09 [api_server.py:1] vLLM API server version 0.11.0\n")
    assert [doc["unit"] for doc in replayed(host)] == ["vllm.service"]  # another unit's shared words: no start beside it


def test_systemds_lines_about_units_named_after_no_engine_are_no_start():
    text = ("Jan 10 22:38:08 host systemd[1]: Started Session 3 of User root.\n"
            "Jan 10 22:38:09 host systemd[1]: sshd.service: Main process exited, code=exited, status=255/EXCEPTION\n"
            "Jan 10 22:38:09 host systemd[1]: Started OpenBSD Secure Shell server.\n")
    assert replayed(text) == []


def test_kubectl_logs_prefix_makes_each_pods_container_a_unit():
    # `kubectl logs -l app=vllm --prefix --timestamps`: two replicas' lines interleaved, each `[pod/NAME/CONTAINER] `
    text = ("[pod/vllm-0/vllm] 2026-01-11T01:40:02Z (APIServer pid=1) INFO 01-11 01:40:02 [api_server.py:1] vLLM API server version 0.13.0\n"
            "[pod/vllm-1/vllm] 2026-01-11T01:40:03Z (APIServer pid=1) INFO 01-11 01:40:03 [api_server.py:1] vLLM API server version 0.13.0\n"
            "[pod/vllm-0/vllm] 2026-01-11T01:41:10Z (Worker_TP0 pid=7) INFO 01-11 01:41:10 [loader.py:1] Loading weights took 60.00 seconds\n"
            "[pod/vllm-1/vllm] 2026-01-11T01:41:12Z (APIServer pid=1) INFO:     Application startup complete.\n")
    docs = {doc["unit"]: doc for doc in replayed(text)}
    assert {unit: (doc["engine"], doc["outcome"], doc["last_phase"], doc["startup_seconds"]) for unit, doc in docs.items()} == {
        "vllm-0/vllm.service": ("vllm", "incomplete", "loading_weights", 68.0),
        "vllm-1/vllm.service": ("vllm", "ready", "ready", 69.0),
    }


def test_lines_without_a_time_take_their_neighbours():
    text = ("```\n"  # before any time: the first line that has one
            "INFO 03-27 10:29:00 [api_server.py:1] vLLM API server version 0.8.5\n"
            "INFO:     Started server process [7]\n"  # uvicorn's lines carry none: the last time before them
            "INFO 03-27 10:29:10 [launcher.py:28] Available routes are:\n"
            "INFO:     Application startup complete.\n")
    [doc] = replayed(text)
    assert doc["outcome"] == "ready"
    assert doc["startup_seconds"] == 10.0
    assert [(p["phase"], p["duration_seconds"]) for p in doc["phases"]] == [
        ("launching", 0.0), ("starting_api", 10.0), ("ready", 0.0)]


def test_a_log_without_any_time_has_no_durations():
    [doc] = replayed("Loading safetensors checkpoint shards: 100% Completed | 5/5\nINFO:     Application startup complete.\n")
    assert doc["startup_seconds"] is None
    assert {p["duration_seconds"] for p in doc["phases"]} == {None}


def test_a_line_glued_on_after_a_bar_dates_the_bar():
    # a paste of a terminal: the bar's last redraw and the next line on one line; that line's time is when
    # the bar ended, and its redraws are dated back from it, so loading began 40 s before that
    text = ("INFO 03-27 10:29:00 [loader.py:1] Starting to load model Qwen/Qwen2-7B...\n"
            "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
            "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:40<00:00, 10.00s/it]\r"
            "INFO 03-27 10:29:45 [loader.py:447] Loading weights took 45.00 seconds\n"
            "INFO 03-27 10:30:30 [gpu_model_runner.py:1] Graph capturing finished in 5 secs\n")
    [doc] = replayed(text)
    assert [(p["phase"], p["duration_seconds"]) for p in doc["phases"]] == [
        ("launching", 0.0), ("downloading", 5.0), ("loading_weights", 85.0), ("capturing_graphs", 0.0)]
    assert doc["silent_gaps"] == []  # before, the bar and the glued line took the time before them: 90 s of silence


def test_a_bar_dated_back_does_not_start_before_the_log():
    # the redraws of a \r bar are dated back by their elapsed field: never before the log's first line
    text = ("INFO 03-27 10:29:00 [weight_utils.py:1] Using model weights format ['*.safetensors']\n"
            "Loading safetensors checkpoint shards:  50% Completed | 1/2 [05:00<05:00]\r"
            "Loading safetensors checkpoint shards: 100% Completed | 2/2 [10:00<00:00]\n"
            "INFO 03-27 10:29:02 [gpu_model_runner.py:1] Model loading took 1.00 GiB and 2.0 seconds\n")
    [doc] = replayed(text)
    assert all(p["start"] >= "2025-03-27" for p in doc["phases"])
    assert doc["startup_seconds"] <= 2.0


@pytest.mark.parametrize(
    ("records", "names", "engine"),
    [
        pytest.param(["llm_load_tensors: offloaded 33/33 layers to GPU"] * 3, [], "llamacpp",
                     id="llama.cpp's lines, unnamed: llama.cpp"),
        pytest.param(["llm_load_tensors: offloaded 33/33 layers to GPU"] * 3, ["ollama"], "ollama",
                     id="the same lines under an ollama identifier: Ollama, which runs llama.cpp"),
        pytest.param(["Error: listen tcp 0.0.0.0:11434: bind: address already in use"], [], "ollama",
                     id="a line only Ollama prints"),
        pytest.param(["INFO:     Application startup complete."], [], "vllm", id="uvicorn alone: the first engine"),
        pytest.param(["kubectl logs -f -l app = llama-server", "INFO: Application startup complete.",
                      "INFO 04-07 13:36:29 [async_llm.py:228] Added request chatcmpl-4149ea4cf35e."], [], "vllm",
                     id="vLLM's own line format outweighs a deployment named llama-server"),
        pytest.param(["INFO:     Application startup complete.", "llama_print_timings:        load time =    1491.98 ms"], [],
                     "llamacpp", id="uvicorn and a llama.cpp mention"),
        pytest.param(["INFO 11-15 02:58:48 llm_engine.py:205] # GPU blocks: 2361, # CPU blocks: 512",
                      "I1115 02:58:49.477216 1 pb_stub.cc:325] Failed to initialize Python stub"], [], "triton",
                     id="vLLM as a Triton backend: Triton"),
        pytest.param(["Traceback (most recent call last):",
                      '  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/executor/proxy.py", line 332, in _start_executor_workers',
                      "RuntimeError: Executor worker returned error"], [], "triton",
                     id="a traceback through TensorRT-LLM's package: trtllm-serve's, though every engine reads a traceback"),
        pytest.param(["nothing a model server says"], [], "generic", id="no evidence at all"),
    ],
)
def test_the_engine_is_told_from_the_log(records, names, engine):
    from exporter.core import grammar
    from exporter.core.replay import choose_engine

    assert choose_engine(records, grammar.load_all().values(), names)[0] == engine


def _first_start(path: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "exporter", "replay", str(path), "--format", "json", *args],
                          capture_output=True, timeout=60, env={**os.environ, "TZ": "UTC"})
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)["phases"][0]["start"]


def test_a_log_without_years_takes_the_files_year_or_year(tmp_path):
    """vLLM prints `MM-DD HH:MM:SS`: the year is the file's (its modification time), or --year's."""
    log = tmp_path / "vllm.log"
    log.write_bytes((FORMATS / "vllm.log").read_bytes())
    summer_2023 = datetime(2023, 6, 1, tzinfo=timezone.utc).timestamp()
    os.utime(log, (summer_2023, summer_2023))
    assert _first_start(log).startswith("2023-12-31T23:58:09")
    assert _first_start(log, "--year", "2021").startswith("2021-12-31T23:58:09")


@pytest.mark.parametrize(
    ("args", "engine", "last_phase", "basis"),
    [
        pytest.param([], "vllm", "capturing_graphs", "engine_rules", id="told from the lines"),
        # none of TGI's rules reads vLLM's lines: the shared vocabulary under them still places the start
        pytest.param(["--engine", "tgi"], "tgi", "capturing_graphs", "vocabulary",
                     id="--engine forces another: its grammar reads it"),
    ],
)
def test_the_engine_is_told_from_the_lines_or_forced(args, engine, last_phase, basis):
    [doc] = documents(str(FORMATS / "vllm.log"), *args)
    assert (doc["engine"], doc["last_phase"], doc["basis"]) == (engine, last_phase, basis)


def test_a_start_asked_to_stop_before_ready_is_stopped(tmp_path):
    line = {"_SYSTEMD_UNIT": "vllm.service", "_TRANSPORT": "stdout", "_SYSTEMD_INVOCATION_ID": "a" * 32}
    log = [
        _pid1(1_000_000, "Started vllm.service.", "39f53479d3a045ac8e11786248231fbf"),
        {**line, "__REALTIME_TIMESTAMP": "2000000", "MESSAGE": "INFO 11-29 20:24:40 [api_server.py:1] vLLM API server version 0.11.0"},
        {**line, "__REALTIME_TIMESTAMP": "3000000", "MESSAGE": "INFO 11-29 20:24:41 [core.py:1] Starting to load model m..."},
        _pid1(9_000_000, "Stopping vllm.service...", "de5b426a63be47a7b6ac3eaac82e2f6f"),
        _pid1(9_500_000, "vllm.service: Deactivated successfully.", "7ad2d189f7e94e70a38c781354912448"),
    ]
    path = tmp_path / "stopped.json"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in log))
    [doc] = documents(str(path))
    assert (doc["outcome"], doc["failure_reason"], doc["last_phase"]) == ("stopped", None, "downloading")
    assert doc["startup_seconds"] == 8.0  # from PID 1's Started to its Stopping
UID = "8d2b7c3a-94c1-4a0e-9b36-2f4a1c6e7d10"
DOCKER_ID = "4f5e" * 16


@pytest.mark.parametrize(
    ("path", "fixture", "unit"),
    [
        pytest.param(f"llm_vllm-0_{UID}/vllm/0.log", "vllm.cri", "llm/vllm-0/vllm", id="kubelet's pod log"),
        pytest.param(f"llm_vllm-0_{UID}/vllm/0.log.20261129-120105.gz", "vllm.cri", "llm/vllm-0/vllm", id="rotated, compressed"),
        pytest.param(f"{DOCKER_ID}/{DOCKER_ID}-json.log.1", "vllm.docker-json", DOCKER_ID[:12], id="Docker's, rotated"),
        pytest.param("copied.log.gz", "vllm.docker", "copied.log", id="any text, compressed: the unit is the file"),
    ],
)
def test_a_container_log_where_the_runtime_keeps_it(tmp_path, path, fixture, unit):
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    data = (FORMATS / fixture).read_bytes()
    target.write_bytes(gzip.compress(data) if path.endswith(".gz") else data)
    [doc] = documents(str(target))
    assert (doc["unit"], doc["outcome"], doc["last_phase"]) == (unit, "ready", "ready")


def test_a_compressed_log_cut_short_gives_what_it_holds(tmp_path):
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress((FORMATS / "vllm.cri").read_bytes())[:-40])
    done = replay(str(cut), "--format", "json")
    assert done.returncode == 0 and "cut short" in done.stderr.decode()
    assert json.loads(done.stdout)["last_phase"] != "launching"


def test_a_compressed_journal_file_says_what_to_do(tmp_path, journal_file):
    packed = tmp_path / "vllm.journal.gz"
    packed.write_bytes(gzip.compress(journal_file.read_bytes()))
    done = replay(str(packed))
    assert done.returncode == 1 and "decompress it" in done.stderr.decode()
