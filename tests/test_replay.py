"""`llmstartup replay`: saved logs in every format through the same core, as text and JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

FORMATS = Path(__file__).parent / "formats"


def replay(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "replay", *args], input=stdin,
                          capture_output=True, timeout=60)


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
          "values", "silent_gaps", "startup_seconds", "attempts"}


@pytest.mark.parametrize(
    ("sample", "unit", "outcome", "last_phase", "reason"),
    [
        pytest.param("vllm.json", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="journalctl -o json"),
        pytest.param("vllm.export", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="journalctl -o export"),
        pytest.param("vllm.short", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="journalctl -o short"),
        pytest.param("vllm.short-iso", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="-o short-iso"),
        pytest.param("vllm.short-precise", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="-o short-precise"),
        pytest.param("vllm.docker", "vllm.service", "ready", "ready", None, id="docker logs -t"),
        pytest.param("vllm.cri", "vllm.service", "ready", "ready", None, id="a CRI log file"),
        pytest.param("vllm.docker-json", "vllm.service", "ready", "ready", None, id="a json-file log"),
        pytest.param("vllm.log", "vllm.service", "failed", "capturing_graphs", "cuda_oom", id="vLLM's own output"),
        pytest.param("sglang.log", "sglang.service", "ready", "ready", None, id="SGLang's own output"),
        pytest.param("tgi.log", "tgi.service", "ready", "ready", None, id="TGI's own output"),
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
    assert text.splitlines()[0].startswith("vllm.service (vllm, 0.10.2, meta-llama/Llama-3.1-70B-Instruct): failed (cuda_oom)")
    assert "silent 3m36s in loading_weights" in text
    assert "  loading_weights" in text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(["/nonexistent/vllm.log"], "cannot read /nonexistent/vllm.log", id="a file that is not there"),
        pytest.param(["/dev/null"], "no model-server startup found", id="an empty file"),
        pytest.param(["-", "--engine", "nosuch"], "invalid choice", id="an unknown engine"),
    ],
)
def test_bad_input(args, says):
    done = replay(*args, stdin=b"")
    assert done.returncode != 0
    assert says in done.stderr.decode()


def test_binary_garbage_does_not_crash(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_bytes(bytes(range(256)) * 64 + b"\r\n\x1b[31m" * 100)
    done = replay(str(garbage))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr.decode()


UID = "8d2b7c3a-94c1-4a0e-9b36-2f4a1c6e7d10"
DOCKER_ID = "4f5e" * 16


@pytest.mark.parametrize(
    ("path", "fixture", "unit"),
    [
        pytest.param(f"llm_vllm-0_{UID}/vllm/0.log", "vllm.cri", "llm/vllm-0/vllm", id="kubelet's pod log"),
        pytest.param(f"llm_vllm-0_{UID}/vllm/0.log.20261129-120105.gz", "vllm.cri", "llm/vllm-0/vllm", id="rotated, compressed"),
        pytest.param(f"{DOCKER_ID}/{DOCKER_ID}-json.log.1", "vllm.docker-json", DOCKER_ID[:12], id="Docker's, rotated"),
        pytest.param("copied.log.gz", "vllm.docker", "copied.service", id="any text, compressed"),
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
