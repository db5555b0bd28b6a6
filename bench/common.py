"""What every benchmark shares: the machine line, /proc readings, scraping, percentiles, a result row."""

from __future__ import annotations

import http.client
import math
import os
import platform
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from exporter.shell.demo.sandbox import end

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 2**20
NODE_EXPORTER = ("/usr/bin/prometheus-node-exporter", "/usr/bin/node_exporter")
JOURNAL_REMOTE = ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")


@dataclass
class Row:
    """One figure of the summary table: ours against the reference measured in the same run."""

    figure: str
    ours: str
    reference: str
    ratio: str
    goal: str
    met: bool | None  # None: no goal could be judged (the measurement failed)


def demo_records(api_pid: str, engine_pid: str) -> list[tuple[float, str]]:
    """The demo's real-format vLLM 0.11 start (exporter/shell/demo/vllm_startup.py) as (seconds from its first line,
    journal record), each record when vLLM ends its line (a \\r bar's redraws in one), with these pids."""
    import io

    from exporter.shell.demo import vllm_startup as demo

    out = io.StringIO()
    console = demo.Console(out, out, lambda: 0)
    console.pid = lambda proc: api_pid if proc == demo.API else engine_pid  # type: ignore[assignment,return-value]
    console.substitute = lambda text: text.replace("{api_pid}", api_pid).replace("{engine_pid}", engine_pid)  # type: ignore[method-assign]
    t, timed, seen = 0.0, [], 0
    for step in demo.DEMO:
        if "log" in step:
            console.log(str(step["log"]))
        elif "bar" in step:
            steps, per_line = int(step["steps"]), bool(step.get("per_line", False))
            for n in range(steps + 1):
                console.write("\r" + demo._bar_text(step["bar"], n, steps, float(step["seconds"]) * n / steps, per_line),
                              demo.ENGINE, "stderr")
            console.write("\n", demo.ENGINE, "stderr")
            t += float(step["seconds"])
        elif "sleep" in step or "burn" in step:
            t += float(step.get("sleep", step.get("burn", 0.0)))
        text = out.getvalue()
        timed += [(t, record) for record in text[seen:].split("\n") if record]
        seen = len(text)
    return timed


def say(text: str = "") -> None:
    print(text, flush=True)


# ---- the machine ----------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def libsystemd_version() -> str:
    """The libsystemd the reader links (sd_journal_* come from it), as its package or systemd names it."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libsystemd0"], check=False, capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0 and out.stdout:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out = subprocess.run(["journalctl", "--version"], check=False, capture_output=True, text=True, timeout=10)
        return out.stdout.split("\n")[0].split()[1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine() -> str:
    try:
        from importlib.metadata import version

        python_systemd = version("systemd-python")
    except Exception:  # noqa: BLE001 - only a label
        python_systemd = "?"
    return (f"{cpu_model()}, {os.cpu_count()} cores, Linux {platform.release()}, "
            f"Python {platform.python_version()}, libsystemd {libsystemd_version()} "
            f"(systemd-python {python_systemd})")


def load_average() -> float:
    return os.getloadavg()[0]


# ---- processes ----------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """pid and every process below it, from /proc/<pid>/task/*/children."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its threads included), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages divided among the processes sharing them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in argv if a)
        return text[:60]
    except OSError:
        return "?"


def stop(process: subprocess.Popen, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    end(process, timeout)


def find_binary(candidates: tuple[str, ...], package: str) -> str:
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    name = shutil.which(os.path.basename(candidates[0]))
    if name:
        return name
    raise RuntimeError(f"{candidates[0]} not found: apt-get install {package} (bash .ci/setup does)")


# ---- HTTP ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, path: str = "/metrics", timeout: float = 5.0) -> tuple[float, bytes]:
    """One GET on a fresh connection, as Prometheus does after a failure: (seconds, body)."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise OSError(f"GET :{port}{path} answered {response.status}")
    finally:
        conn.close()
    return time.perf_counter() - started, body


def wait_http(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            scrape(port, timeout=2.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer on 127.0.0.1:{port} within {timeout:.0f} s") from None
            time.sleep(0.1)


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (p in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]


def write_journal(path: Path, stream: Iterable[bytes]) -> None:
    """Write `journalctl -o export` entries into the journal file `path` with systemd-journal-remote,
    which keeps the trusted fields (`_PID`, `_SYSTEMD_UNIT`) as given; it may rotate into more files
    beside it (a file stops at 128 MiB, less on a small filesystem)."""
    binary = find_binary(JOURNAL_REMOTE, "systemd-journal-remote")
    process = subprocess.Popen([binary, f"--output={path}", "--split-mode=none", "-"], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stdin is not None
    chunk: list[bytes] = []
    for item in stream:
        chunk.append(item)
        if len(chunk) >= 5000:
            process.stdin.write(b"".join(chunk))
            chunk = []
    process.stdin.write(b"".join(chunk))
    process.stdin.close()
    error = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.wait() != 0:
        raise RuntimeError(f"systemd-journal-remote failed ({process.returncode}): {error.strip()[-500:]}")
