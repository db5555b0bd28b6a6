"""7. Restart catch-up: an agent restarted on a host whose model server has served a long time this boot.

One unit, `bench-vllm.service`, started once this boot (PID 1's `Started`, the demo's real-format
startup to `Application startup complete.`) and then serving: N access and stats lines, as a busy
server prints them (100 lines a second is 8.6 M a day). Its process sleeps in the unit's cgroup, so the
agent sees a live, ready server. The journal is written by systemd-journal-remote into a folder of its
own, dated so that the serving ends now, and read with `--journal.directory`.

Measured: the real `llmstartup serve` on that folder, from its start to the first scrape that shows the
unit ready with its start counted, twice: the first start (no checkpoint: the agent reads this boot's
journal for the unit, exporter.sources.journal_catchup) and a restart after a clean stop (what every upgrade
and crash costs). The reference is `journalctl --directory DIR -u UNIT -o cat > /dev/null`, the operator's
own way to read the same lines; ratio = journalctl's time / ours (goals: the first start ≥ 1.0x or under
1 s, the restart ≥ 1.0x and under 1 s). And the PSS of serve and its children once the first start has
read all, and 30 s later, beside the restart's, which read few lines: a catch-up's memory must be given
back (goal: under 40 MiB).
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
from dataclasses import dataclass
from pathlib import Path

from bench.common import MiB, Row, descendants, free_port, pss_bytes, say, scrape, write_journal
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


@dataclass
class Start:
    """One start of `serve` on the folder, as the benchmark saw it."""

    correct: float  # seconds from its start to a scrape showing the unit ready with its one start counted
    read: float  # seconds to the end of its reading of the journal (its journal source up)
    peak: int  # the largest PSS of serve and its children meanwhile (journal files they map included), bytes
    read_pss: int  # PSS once all is read
    later_pss: int  # PSS SETTLE seconds after that


SETTLE = 30.0  # seconds after the catch-up at which the memory it took should be given back
MEMORY_EVERY = 0.1  # seconds between looks at the memory: a look walks every mapping, which costs the reading


def serve_once(folder: Path, state: Path, log: Path, settle: float = SETTLE) -> Start:
    """`serve` on the folder, timed as Start says; then stopped cleanly: what it knows is saved."""
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "serve", "--journal.directory", str(folder), "--unit", UNIT,
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu", "--state.path", str(state)]
    started = time.perf_counter()
    with open(log, "a") as err:
        agent = subprocess.Popen(argv, stderr=err)
    peak, looked = 0, 0.0

    def pss() -> int:
        return sum(pss_bytes(p) for p in descendants(agent.pid))

    try:
        while True:
            if agent.poll() is not None:
                raise RuntimeError(f"serve exited ({agent.returncode}): {log.read_text()[-800:]}")
            if time.perf_counter() - looked >= MEMORY_EVERY:
                peak, looked = max(peak, pss()), time.perf_counter()
            try:
                _, body = scrape(port, timeout=2)
            except OSError:
                time.sleep(0.01)
                continue
            text = body.decode()
            if (f'llmstartup_unit_phase{{phase="ready",unit="{UNIT}"}} 1.0' in text
                    and f'llmstartup_startups_total{{outcome="ready",unit="{UNIT}"}} 1.0' in text):
                correct = time.perf_counter() - started
                while 'llmstartup_source_up{source="journal"} 1.0' not in scrape(port, timeout=2)[1].decode():
                    peak = max(peak, pss())
                    time.sleep(MEMORY_EVERY)
                read = time.perf_counter() - started
                read_pss = pss()
                time.sleep(settle)
                return Start(correct, read, max(peak, read_pss), read_pss, pss())
            time.sleep(0.01)
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)


def run(sizes: tuple[int, ...] = SIZES) -> list[Row]:
    say("7. first start and restart catch-up: one unit started once this boot, then N serving lines")
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
                first = serve_once(folder, state, log)  # no checkpoint: it reads the unit's lines of this boot
                again = serve_once(folder, state, log)  # the checkpoint the first one saved as it stopped
                name = f"{serving / 1e6:g} M serving lines"
                say(f"   journalctl -u: {reference:.2f} s; serve, first start: {first.correct:.2f} s, all read in "
                    f"{first.read:.2f} s; restart: {again.correct:.2f} s")
                say(f"   PSS of serve and its children, MiB: first start peak {first.peak / MiB:.0f} (the journal files "
                    f"it maps as it reads included), once read {first.read_pss / MiB:.1f}, {SETTLE:.0f} s later "
                    f"{first.later_pss / MiB:.1f}; restart peak {again.peak / MiB:.0f}, once read "
                    f"{again.read_pss / MiB:.1f}, {SETTLE:.0f} s later {again.later_pss / MiB:.1f}")
                rows += [
                    Row(f"first start (no checkpoint), {name}: first correct scrape", f"{first.correct:.2f} s "
                        f"(all read by {first.read:.2f} s)", f"{reference:.2f} s (`journalctl -u`)",
                        f"{reference / first.correct:.2f}x", "≥ 1.0x or < 1 s",
                        reference / first.correct >= 1.0 or first.correct < 1.0),
                    Row(f"restart catch-up, {name}: first correct scrape", f"{again.correct:.2f} s",
                        f"{reference:.2f} s (`journalctl -u`)", f"{reference / again.correct:.2f}x", "≥ 1.0x, < 1 s",
                        reference / again.correct >= 1.0 and again.correct < 1.0),
                    Row(f"PSS {SETTLE:.0f} s after a first start's catch-up of {name}, MiB (serve + reader)",
                        f"{first.later_pss / MiB:.1f}", f"{again.later_pss / MiB:.1f} (the restart, which read few)",
                        f"{first.later_pss / max(again.later_pss, 1):.2f}x", "≤ 40 MiB", first.later_pss <= 40 * MiB),
                ]
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
