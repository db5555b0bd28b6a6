"""What each of the agent's two processes loads: a library only where its feature is on. Every module a process
imports is memory it holds for as long as it runs (docs/performance.md), and the agent's goal is 40 MiB."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The agent's process as `serve` starts it, no collector or web config given: its imports and its grammars.
SERVE = ("import exporter.shell.runtime; from exporter.core import grammar; grammar.load_all(); "
         "grammar.load('vllm').screen")
# The reader child as it follows the journal: its imports and an open Reader.
READER = ("import exporter.sources.journal_child, exporter.sources.journal_pages; "
          "from exporter.sources.journal import JournalPlace; JournalPlace().open().close()")

CASES = [
    # (the process, a module it must not load, what loads it)
    (SERVE, "pynvml", "the GPU collector (GpuSource)"),
    (SERVE, "ctypes", "the GPU collector, through pynvml"),
    (SERVE, "yaml", "a --web.config.file"),
    (SERVE, "bcrypt", "basic auth in the web config"),
    (SERVE, "sysconfig", "--collector.stacks, looking for py-spy"),
    (SERVE, "statistics", "nothing: expectations take their median themselves"),
    (SERVE, "zipfile", "nothing: the grammars are read by their path, not importlib.resources"),
    (SERVE, "exporter.core.replay", "`replay`: the agent's reports name its result's type only"),
    (SERVE, "systemd", "the reader child alone"),
    (READER, "systemd.journal", "nothing: the child reads through systemd-python's C reader"),
    (READER, "logging", "systemd.journal"),
    (READER, "typing", "nothing: TYPE_CHECKING is a constant of the modules it runs"),
    (READER, "re2", "the catch-up, in the process the child forks for it"),
    (READER, "exporter.core.grammar", "nothing: the child gets its screen as bytes"),
    (READER, "prometheus_client", "the agent's process alone"),
]


@pytest.mark.parametrize(("process", "module", "loaded_by"), CASES,
                         ids=[f"{'serve' if p is SERVE else 'reader'}-{m}" for p, m, _ in CASES])
def test_a_process_loads_a_library_only_for_its_feature(process: str, module: str, loaded_by: str) -> None:
    loaded = subprocess.run([sys.executable, "-c", f"{process}; import sys; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert module not in loaded, f"{module} is loaded where only {loaded_by} should load it"


def test_the_features_still_load_what_they_need() -> None:
    """The other side: a feature that is on imports its library where it is first used."""
    script = ("import sys; from pathlib import Path; import tempfile; "
              "from exporter.sources.gpu import GpuSource; GpuSource(1.0); "
              "from exporter.shell import webconfig; p = Path(tempfile.mkdtemp()) / 'web.yml'; "
              "p.write_text('basic_auth_users: {}\\n'); webconfig.load(p); "
              "print(' '.join(sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert {"pynvml", "yaml"} <= set(loaded)
