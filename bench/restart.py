"""7. Restart catch-up: an agent restarted on a host whose model server has served a long time this boot.

One unit, `bench-vllm.service`, started once this boot (PID 1's `Started`, the demo's real-format
startup to `Application startup complete.`) and then serving: N access and stats lines, as a busy
server prints them (100 lines a second is 8.6 M a day). Its process sleeps in the unit's cgroup, so the
agent sees a live, ready server. The journal is written by systemd-journal-remote into a folder of its
own, dated so that the serving ends now, and read with `--journal.directory`.

Measured: the real `llmstartup serve` on that folder, from its start to the first scrape that shows the
unit ready with its start counted, twice: the first start (no history: the agent reads this boot's
journal for the unit) and a restart after a clean stop (what every upgrade and crash costs). The
reference is `journalctl --directory DIR -u UNIT -o cat > /dev/null`, the operator's own way to read
the same lines; ratio = journalctl's time / ours (goal: the restart ≥ 1.0x and under 1 s).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import MiB, Row, free_port, say, scrape, write_journal
from bench.ingest import MACHINE_ID, STARTED, _field, _serving_record, _startup_records

UNIT = "bench-vllm.service"
SIZES = (1_000_000, 10_000_000)
LINES_A_SECOND = 100


def export_stream(serving: int, invocation: str = "5e7d" * 8) -> Iterator[bytes]:
    """`journalctl -o export` of the unit's one start and `serving` lines after it, ending now."""
    import random

    rng = random.Random(15)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    startup = _startup_records(7001, 7002)
    total = 1 + len(startup) + serving
    step = 1_000_000 // LINES_A_SECOND  # µs between entries
    mono_now = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
    real_now = int(time.time() * 1e6)
    first = min(total * step, mono_now - 10_000_000)  # never before this boot began
    static = b"".join(_field(k, v) for k, v in {
        "PRIORITY": "6", "SYSLOG_FACILITY": "3", "SYSLOG_IDENTIFIER": "vllm", "_PID": "7001", "_UID": "1000",
        "_GID": "1000", "_COMM": "vllm", "_EXE": "/usr/bin/python3.12", "_CMDLINE": "/opt/vllm/bin/vllm serve",
        "_SYSTEMD_CGROUP": f"/system.slice/{UNIT}", "_SYSTEMD_UNIT": UNIT, "_SYSTEMD_SLICE": "system.slice",
        "_SYSTEMD_INVOCATION_ID": invocation, "_TRANSPORT": "stdout"}.items())

    def entry(n: int, body: bytes) -> bytes:
        back = first - n * first // total  # evenly from `first` µs ago to now
        return (f"__REALTIME_TIMESTAMP={real_now - back}\n__MONOTONIC_TIMESTAMP={mono_now - back}\n"
                f"_BOOT_ID={boot}\n_MACHINE_ID={MACHINE_ID}\n_HOSTNAME=gpu-node-17\n").encode() + body + b"\n"

    yield entry(0, b"".join(_field(k, v) for k, v in {
        "SYSLOG_IDENTIFIER": "systemd", "_PID": "1", "_UID": "0", "_COMM": "systemd", "_SYSTEMD_UNIT": "init.scope",
        "_TRANSPORT": "journal", "MESSAGE_ID": STARTED, "UNIT": UNIT, "INVOCATION_ID": invocation,
        "MESSAGE": f"Started {UNIT} - vLLM."}.items()))
    clock = time.strftime("%m-%d %H:%M:%S")
    for n, line in enumerate([*startup, *(_serving_record(rng, 7001, clock) for _ in range(serving))], 1):
        yield entry(n, static + _field("MESSAGE", line))


def journalctl(folder: Path, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(["journalctl", "--directory", str(folder), "-u", UNIT, "-o", "cat"],
                       stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class Server:
    """A sleeping process in the unit's cgroup: a live, ready vLLM server as far as the agent sees."""

    def __init__(self) -> None:
        from exporter.sources.processes import find_cgroup2_root

        root = find_cgroup2_root()
        assert root is not None, "no cgroup v2 hierarchy"
        self.cgroup = root / "system.slice" / UNIT
        self.cgroup.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(["sleep", "infinity"])
        (self.cgroup / "cgroup.procs").write_text(str(self.process.pid))

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for _ in range(50):
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.05)


def first_correct_scrape(folder: Path, state: Path, log: Path) -> tuple[float, float, int, int]:
    """Seconds from `serve`'s start to a scrape showing the unit ready with its one start counted; seconds
    to the end of its reading of the journal (its journal source up); the agent's peak RSS (its own and its
    children's) meanwhile, and that RSS once it has read all, in bytes. The agent is then stopped cleanly:
    what it knows is saved."""
    from bench.common import descendants, rss_bytes

    port = free_port()
    argv = [sys.executable, "-m", "exporter", "serve", "--journal.directory", str(folder), "--unit", UNIT,
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu", "--state.path", str(state)]
    started = time.perf_counter()
    with open(log, "a") as err:
        agent = subprocess.Popen(argv, stderr=err)
    peak = 0
    try:
        while True:
            if agent.poll() is not None:
                raise RuntimeError(f"serve exited ({agent.returncode}): {log.read_text()[-800:]}")
            peak = max(peak, sum(rss_bytes(p) for p in descendants(agent.pid)))
            try:
                _, body = scrape(port, timeout=2)
            except OSError:
                time.sleep(0.01)
                continue
            text = body.decode()
            if (f'llmstartup_unit_phase{{phase="ready",unit="{UNIT}"}} 1.0' in text
                    and f'llmstartup_startups_total{{outcome="ready",unit="{UNIT}"}} 1.0' in text):
                took = time.perf_counter() - started
                while 'llmstartup_source_up{source="journal"} 1.0' not in scrape(port, timeout=2)[1].decode():
                    peak = max(peak, sum(rss_bytes(p) for p in descendants(agent.pid)))
                    time.sleep(0.2)
                read_in = time.perf_counter() - started
                return took, read_in, peak, sum(rss_bytes(p) for p in descendants(agent.pid))
            time.sleep(0.01)
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)


def run(sizes: tuple[int, ...] = SIZES) -> list[Row]:
    say("7. restart catch-up: one unit started once this boot, then N serving lines")
    rows = []
    server = Server()
    try:
        for serving in sizes:
            with tempfile.TemporaryDirectory(prefix="llmstartup-restart-") as tmp:
                folder, state, log = Path(tmp) / "journal", Path(tmp) / "state.db", Path(tmp) / "serve.log"
                folder.mkdir()
                made = time.perf_counter()
                write_journal(folder / "bench.journal", export_stream(serving))
                size = sum(f.stat().st_size for f in folder.iterdir()) / MiB
                say(f"   {serving:,} serving lines: journal built in {time.perf_counter() - made:.0f} s ({size:.0f} MiB)")
                reference = journalctl(folder)
                first, first_read, first_peak, first_rest = first_correct_scrape(folder, state, log)  # then stopped
                again, _, again_peak, again_rest = first_correct_scrape(folder, state, log)
                say(f"   journalctl -u: {reference:.2f} s; serve, first start: {first:.2f} s, all read in {first_read:.1f} s "
                    f"(RSS peak {first_peak / MiB:.0f} MiB, once read {first_rest / MiB:.0f} MiB); restart: {again:.2f} s "
                    f"(RSS peak {again_peak / MiB:.0f} MiB, once read {again_rest / MiB:.0f} MiB)")
                rows.append(Row(f"restart catch-up, {serving / 1e6:g} M serving lines: first correct scrape",
                                f"{again:.2f} s (first start {first:.2f} s)", f"{reference:.2f} s (`journalctl -u`)",
                                f"{reference / again:.2f}x", "≥ 1.0x, < 1 s", reference / again >= 1.0 and again < 1.0))
    finally:
        server.close()
    say()
    return rows


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run as root: the unit's process is put in a cgroup")
    sizes = tuple(int(a) for a in sys.argv[1:]) or SIZES
    for row in run(sizes):
        print(row)
