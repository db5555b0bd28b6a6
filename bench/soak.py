"""The soak: the agent under faults for N minutes against real journald units; what it held and what it lost.

    python -m bench.soak --minutes 15        (as root)

Not one of `python -m bench`'s items: it runs as long as it is told. tests/test_long_run.py runs a minute of it.

A private journald namespace, and four scripted vLLM units that this script starts again after each exit, as
PID 1 would with Restart=:

    oom    a crash loop: the EngineCore runs out of CUDA memory (its lines give reason cuda_oom); again after 1 s
    kv     a crash loop: the KV cache does not fit (bad_config); again after 2 s
    serve  ready, then five serving lines a second; stopped (SIGTERM) and started again now and then
    quiet  nothing for its first 6 s (Python importing the engine), then ready; stopped, and started again 10 s
           after its last line: a new start's silence must not be the start before's

One `llmstartup serve` follows them (`--sample.interval 1s --silence.threshold 4s --stall.threshold 8s`), its state
on a 1 MiB tmpfs, scraped every 0.5 s, under a cycle of faults:

    pause     SIGSTOP the agent (its reader child reads on, until the pipe to the agent is full), SIGCONT later
    kill      SIGKILL the agent; a new one starts on the same state
    disk      the state's filesystem filled for a while, then freed
    burst     50 concurrent scrapers
    journald  SIGSTOP journald for 10 s, while `serve` prints; starts and stops are held meanwhile (journald stamps a
              line when it reads it, and names its start by the unit's invocation then: the lines of a start that
              ended while journald was stopped come after its exit under the next start's id, journald's loss)

Ten bursts in a row end it, with the agent's resident memory after each. Then what the agent says is compared with
what happened: the starts counted (`startups_total`, and the history `status` reads) with the starts made, the
failure reasons (`failures_total`, the history) with the lines the units printed (read back from the journal), the
scrapes answered outside pauses and restarts and their p99, tracebacks in the agent's log, the verdicts of each
quiet start in its first silence threshold, and how soon `source_up{source="journal"}` said journald had stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import MiB, descendants, free_port, percentile, pss_bytes, rss_bytes, say, scrape

INTERVAL, SILENCE, STALL = 1.0, 4.0, 8.0
SCRAPE_EVERY = 0.5
BURST = 50
STATE_SIZE = "1m"  # the state volume: a tmpfs this big
ROOT = Path(__file__).resolve().parent.parent

FIRST = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Model loading took 15.27 GiB and 2.10 seconds"},
]
READY = [
    {"log": "GPU KV cache size: 412,336 tokens"},
    {"log": "Graph capturing finished in 1 secs, took 0.52 GiB"},
    {"raw": "INFO:     Application startup complete."},
]
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
       "79.19 GiB of which 1.25 GiB is free.")
KV = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
      "initializing the engine.")
SERVED = '(APIServer pid=1) INFO:     127.0.0.1:50312 - "POST /v1/chat/completions HTTP/1.1" 200 OK'

# What each start printed, read back from the journal: the outcome and reason its lines give.
PRINTED = (("Application startup complete.", "ready", None), ("CUDA out of memory", "failed", "cuda_oom"),
           ("No available memory for the cache blocks", "failed", "bad_config"))


@dataclass(frozen=True)
class Kind:
    steps: list[dict[str, Any]]
    again_after: float  # seconds between an exit and the next start
    stop_after: float | None = None  # a server that runs on is stopped this long after it started


def kinds(serving_seconds: float) -> dict[str, Kind]:
    serving = [step for _ in range(int(serving_seconds * 5) + 10) for step in ({"raw": SERVED}, {"sleep": 0.2})]
    return {
        "oom": Kind([*FIRST, {"traceback": OOM}, {"exit": 1}], again_after=1.0),
        "kv": Kind([*FIRST, {"log": "Available KV cache memory: -2.31 GiB"}, {"traceback": KV}, {"exit": 1}], 2.0),
        "serve": Kind([*FIRST, *READY, *serving, {"hang": True}], again_after=1.0, stop_after=serving_seconds),
        "quiet": Kind([{"sleep": 6}, *FIRST, *READY, {"hang": True}], again_after=10.0, stop_after=12.0),
    }


@dataclass
class Start:
    invocation: str
    launched: float  # monotonic, just before the fork
    ended: float | None = None
    stopped: bool = False  # asked to stop (SIGTERM), rather than ended by itself


class Supervisor(threading.Thread):
    """Starts one unit again after each exit, as PID 1 does with Restart=; a server that runs on is stopped after a
    while. `hold()` starts and stops nothing until `release()`; for a crash loop, it waits until its start ends."""

    def __init__(self, journald: Any, name: str, kind: Kind, scenario: Path) -> None:
        super().__init__(name=f"soak-{name}", daemon=True)
        self.journald, self.unit_name, self.kind, self.scenario = journald, name, kind, scenario
        self.starts: list[Start] = []
        self.finishing = threading.Event()
        self._held = threading.Event()
        self._idle = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from exporter.shell.demo.sandbox import start_unit

        try:
            while not self.finishing.is_set():
                if self._held.is_set():
                    self._idle.set()
                    time.sleep(0.1)
                    continue
                self._idle.clear()
                argv = [sys.executable, "-m", "exporter.shell.demo.vllm_startup", str(self.scenario)]
                unit = start_unit(self.journald, self.unit_name, argv, {"PYTHONPATH": str(ROOT)})
                start = Start(unit.invocation, unit.started)
                self.starts.append(start)
                while unit.process.poll() is None:
                    ran = time.monotonic() - unit.started
                    stop = self.kind.stop_after is not None and ran >= self.kind.stop_after and not self._held.is_set()
                    if stop or self.finishing.is_set() and self.kind.stop_after is not None:
                        start.stopped = True
                        break
                    time.sleep(0.05)
                unit.stop()  # SIGTERM to one still running; the cgroup removed either way
                start.ended = time.monotonic()
                self._idle.set()
                self.finishing.wait(self.kind.again_after)
        except BaseException as error:  # noqa: BLE001 - said in the report
            self.error = error
        finally:
            self._idle.set()

    def hold(self, timeout: float = 30.0) -> None:
        self._held.set()
        if self.kind.stop_after is None:
            self._idle.clear()
            self._idle.wait(timeout)

    def release(self) -> None:
        self._held.clear()


class Agent:
    """`llmstartup serve` on the namespace, restarted (killed, paused) by the faults."""

    def __init__(self, namespace: str, units: list[str], state: Path, logs: Path) -> None:
        self.port = free_port()
        self.argv = [sys.executable, "-m", "exporter", "serve", "--journal.namespace", namespace,
                     "--web.listen-address", f"127.0.0.1:{self.port}", "--sample.interval", f"{INTERVAL:g}s",
                     "--silence.threshold", f"{SILENCE:g}s", "--stall.threshold", f"{STALL:g}s", "--no-collector.gpu",
                     "--state.path", str(state), *(a for u in units for a in ("--unit", u))]
        self.logs = logs
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.logs / f"agent-{self.started}.log", "wb") as log:
            self.process = subprocess.Popen(self.argv, stderr=log, stdout=log, env=env, cwd=ROOT)
        self.started += 1
        deadline = time.monotonic() + timeout
        while True:
            try:
                scrape(self.port, timeout=2.0)
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the agent did not serve within {timeout:.0f} s: {self.log_text()[-2000:]}")
                time.sleep(0.2)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, sig: int) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("agent-*.log")))


@dataclass
class Look:
    """One scrape: when, whether it was answered and how fast, and the verdicts and sources it showed."""

    began: float
    took: float | None  # None: not answered
    verdicts: dict[str, str] = field(default_factory=dict)
    sources: dict[str, float] = field(default_factory=dict)


VERDICT = re.compile(r'^llmstartup_unit_verdict\{unit="([^"]+)",verdict="([^"]+)"\} 1(?:\.0)?$', re.MULTILINE)
SOURCE = re.compile(r'^llmstartup_source_up\{source="([^"]+)"\} (\S+)$', re.MULTILINE)


def read(body: str) -> tuple[dict[str, str], dict[str, float]]:
    return dict(VERDICT.findall(body)), {k: float(v) for k, v in SOURCE.findall(body)}


class Scraper(threading.Thread):
    def __init__(self, agent: Agent) -> None:
        super().__init__(name="soak-scraper", daemon=True)
        self.agent, self.looks, self.stop = agent, [], threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SCRAPE_EVERY):
            began = time.monotonic()
            try:
                took, body = scrape(self.agent.port, timeout=5.0)
            except OSError:
                self.looks.append(Look(began, None))
                continue
            self.looks.append(Look(began, took, *read(body.decode(errors="replace"))))


@dataclass
class Window:
    fault: str
    began: float
    ended: float = float("inf")
    note: str = ""


@contextmanager
def small_volume(size: str) -> Iterator[Path]:
    """A tmpfs of `size`, for the agent's state: a small state volume (an emptyDir with a sizeLimit)."""
    folder = Path(tempfile.mkdtemp(prefix="llmstartup-soak-state-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        with suppress(OSError):
            folder.rmdir()


def used(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


class Soak:
    def __init__(self, minutes: float, journald: Any, state: Path, logs: Path) -> None:
        self.minutes, self.journald, self.state, self.logs = minutes, journald, state, logs
        prefix = f"soak-{secrets.token_hex(3)}"
        serving = max(20.0, min(40.0, minutes * 60 / 4))
        self.kinds = kinds(serving)
        self.supervisors: dict[str, Supervisor] = {}
        for name, kind in self.kinds.items():
            scenario = logs / f"{name}.json"
            scenario.write_text(json.dumps(kind.steps))
            self.supervisors[name] = Supervisor(journald, f"{prefix}-{name}.service", kind, scenario)
        self.agent = Agent(journald.namespace, [s.unit_name for s in self.supervisors.values()],
                           state / "state.db", logs)
        self.scraper = Scraper(self.agent)
        self.windows: list[Window] = []
        self.bursts: list[tuple[int, int, int]] = []  # the ten at the end: (answered, of, RSS after in bytes)
        self.first_bursts: dict[int, tuple[int, int]] = {}  # agent pid → RSS before and after its first burst
        self.burst_latencies: list[float] = []
        self.memory_before = 0
        self.pss_after = 0

    # ---- faults ----

    def pause(self, seconds: float) -> None:
        window = Window("pause", time.monotonic(), note=f"{seconds:.0f} s")
        self.windows.append(window)
        self.agent.signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.agent.signal(signal.SIGCONT)
        window.ended = time.monotonic() + 1.0  # the scrapes queued during the pause are answered now

    def kill(self) -> None:
        window = Window("kill", time.monotonic())
        self.windows.append(window)
        self.agent.signal(signal.SIGKILL)
        assert self.agent.process is not None
        self.agent.process.wait()
        self.agent.start()
        window.ended = time.monotonic()

    def disk(self, seconds: float) -> None:
        window = Window("disk", time.monotonic(), note=f"{seconds:.0f} s")
        self.windows.append(window)
        filler = self.state / "filler"
        with open(filler, "wb") as f, suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        time.sleep(seconds)
        filler.unlink()
        window.ended = time.monotonic()

    def burst(self) -> tuple[int, int]:
        pid, before = self.agent.pid, rss_bytes(self.agent.pid)
        barrier = threading.Barrier(BURST)
        answered: list[float] = []

        def one() -> None:
            barrier.wait()
            with suppress(OSError):
                answered.append(scrape(self.agent.port, timeout=10.0)[0])

        threads = [threading.Thread(target=one, daemon=True) for _ in range(BURST)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        self.burst_latencies += answered
        if pid not in self.first_bursts:
            time.sleep(1.0)
            self.first_bursts[pid] = (before, rss_bytes(pid))
        return len(answered), BURST

    def stop_journald(self, seconds: float) -> None:
        for supervisor in self.supervisors.values():
            supervisor.hold()
        window = Window("journald", time.monotonic(), note=f"{seconds:.0f} s")
        self.windows.append(window)
        pid = self.journald.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        window.ended = time.monotonic()
        time.sleep(2.0)  # journald reads what it was sent meanwhile before anything starts or stops again
        for supervisor in self.supervisors.values():
            supervisor.release()

    def cycle(self, short: bool) -> Iterator[tuple[str, Any]]:
        """The faults in turn, each with the seconds of quiet before it; the short cycle fits a minute."""
        if short:
            yield from [("pause", 14.0), ("kill", None), ("journald", 8.0), ("burst", None), ("disk", 10.0)]
            return
        pauses = [20.0, 8.0, 25.0, 5.0, 15.0]
        n = 0
        while True:
            yield from [("pause", pauses[n % len(pauses)]), ("burst", None), ("kill", None), ("disk", 20.0),
                        ("journald", 10.0), ("burst", None)]
            n += 1

    # ---- the run ----

    def run(self) -> Report:
        began = time.monotonic()
        short = self.minutes <= 1.5
        for supervisor in self.supervisors.values():
            supervisor.start()
        self.agent.start()
        self.scraper.start()
        gap = 3.0 if short else 10.0
        ends = began + self.minutes * 60
        try:
            for fault, arg in self.cycle(short):
                if time.monotonic() + gap > ends:
                    break
                time.sleep(gap)
                say(f"  {time.monotonic() - began:6.0f} s  {fault}{'' if arg is None else f' {arg:.0f} s'}")
                if fault == "pause":
                    self.pause(arg)
                elif fault == "kill":
                    self.kill()
                elif fault == "disk":
                    self.disk(arg)
                elif fault == "journald":
                    self.stop_journald(arg)
                elif fault == "burst":
                    self.burst()
            time.sleep(max(0.0, ends - time.monotonic()))
            self.memory_before = rss_bytes(self.agent.pid)
            for _ in range(10):
                answered, of = self.burst()
                time.sleep(1.0)
                self.bursts.append((answered, of, rss_bytes(self.agent.pid)))
            self.pss_after = sum(pss_bytes(p) for p in descendants(self.agent.pid))
            self.finish()
            final = self.settled()
        finally:
            self.scraper.stop.set()
            for supervisor in self.supervisors.values():
                supervisor.finishing.set()
            self.agent.stop()
            for supervisor in self.supervisors.values():
                supervisor.join(30)
        return Report(self, final, time.monotonic() - began)

    def finish(self) -> None:
        """No more starts; the crash loops' last start crashes, the servers are stopped."""
        for supervisor in self.supervisors.values():
            supervisor.finishing.set()
        for supervisor in self.supervisors.values():
            supervisor.join(60)

    def settled(self, timeout: float = 60.0) -> str:
        """The agent's exposition once it has folded every end: the same counts twice, 3 s apart, no start running."""
        deadline = time.monotonic() + timeout
        before = ""
        while True:
            time.sleep(3.0)
            body = scrape(self.agent.port, timeout=5.0)[1].decode(errors="replace")
            counts = "\n".join(line for line in body.splitlines() if line.startswith("llmstartup_startups_total{"))
            verdicts, _ = read(body)
            if counts == before and all(v in ("inactive", "failed") for v in verdicts.values()):
                return body
            if time.monotonic() > deadline:
                return body
            before = counts


class Report:
    """What was held and what was lost: `held` and `lost` are lines for people; `ok` when nothing was lost."""

    def __init__(self, soak: Soak, final: str, took: float) -> None:
        self.held: list[str] = []
        self.lost: list[str] = []
        self.took = took
        self.figures: dict[str, Any] = {}
        self._compare(soak, final)

    @property
    def ok(self) -> bool:
        return not self.lost

    def _check(self, fine: bool, what: str) -> None:
        (self.held if fine else self.lost).append(what)

    def _compare(self, soak: Soak, final: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        from exporter.shell.history import KEEP_PER_UNIT, History

        samples = [s for family in text_string_to_metric_families(final) for s in family.samples]
        truth = printed(soak)
        history = History(soak.state / "state.db", readonly=True)
        try:
            for name, supervisor in soak.supervisors.items():
                unit = supervisor.unit_name
                made = truth[unit]
                if supervisor.error is not None:
                    self.lost.append(f"{name}: its supervisor failed: {supervisor.error!r}")
                outcomes = Counter(outcome for outcome, _ in made)
                counted = Counter({s.labels["outcome"]: int(s.value) for s in samples
                                   if s.name == "llmstartup_startups_total" and s.labels.get("unit") == unit and s.value})
                self._check(counted == outcomes, f"{name}: {len(made)} starts; startups_total {dict(counted)}, "
                                                 f"made {dict(outcomes)}")
                reasons = Counter(reason for outcome, reason in made if outcome == "failed")
                failures: Counter[str] = Counter()
                for s in samples:
                    if s.name == "llmstartup_failures_total" and s.labels.get("unit") == unit and s.value:
                        failures[s.labels["reason"]] += int(s.value)
                if reasons or failures:
                    self._check(failures == reasons, f"{name}: failures_total by reason {dict(failures)}, "
                                                     f"printed {dict(reasons)}")
                stored = Counter((r.outcome, r.failure_reason) for r in history.recent(unit, limit=10_000))
                kept = Counter(made[-KEEP_PER_UNIT:])  # the history keeps a unit's latest starts
                self._check(stored == kept, f"{name}: history {_pairs(stored)}, made {_pairs(kept)}"
                                            + (f" (the latest {KEEP_PER_UNIT} of {len(made)})" if len(made) > KEEP_PER_UNIT else ""))
        finally:
            history.close()
        self._scrapes(soak)
        self._quiet_starts(soak)
        self._journald(soak)
        self._memory(soak)
        tracebacks = soak.agent.log_text().count("Traceback")
        self._check(tracebacks == 0, f"tracebacks in the agent's log: {tracebacks}")
        size = used(soak.state)
        self.figures["state_bytes"] = size
        self._check(size < 0.9 * MiB, f"state at the end: {size / 1024:.0f} KiB on a {STATE_SIZE} volume "
                                      f"(goal under {0.9 * 1024:.0f} KiB)")
        history_down = any(look.sources.get("history") == 0 for look in soak.scraper.looks)
        if any(w.fault == "disk" for w in soak.windows):
            self._check(history_down, "source_up{source=\"history\"} 0 while the state's disk was full")

    def _scrapes(self, soak: Soak) -> None:
        excused = [w for w in soak.windows if w.fault in ("pause", "kill")]
        outside = [look for look in soak.scraper.looks
                   if not any(w.began - 5.0 <= look.began <= w.ended for w in excused)]
        answered = [look.took for look in outside if look.took is not None]
        p99 = percentile(answered, 0.99) * 1000 if answered else float("nan")
        self.figures.update(scrapes=len(outside), answered=len(answered), p99_ms=p99)
        self._check(len(answered) == len(outside),
                    f"scrapes outside pauses and restarts answered: {len(answered)} of {len(outside)}; p99 {p99:.1f} ms")
        bursts = len(soak.burst_latencies)
        burst_p99 = percentile(soak.burst_latencies, 0.99) * 1000 if bursts else float("nan")
        self.figures["burst_p99_ms"] = burst_p99
        self.held.append(f"burst scrapes answered: {bursts}, p99 {burst_p99:.1f} ms")

    def _quiet_starts(self, soak: Soak) -> None:
        supervisor = soak.supervisors["quiet"]
        unit = supervisor.unit_name
        early = [(look, start) for start in supervisor.starts for look in soak.scraper.looks
                 if look.took is not None and start.launched <= look.began and look.began + look.took < start.launched + SILENCE]
        wrong = [look.verdicts.get(unit) for look, _ in early if look.verdicts.get(unit) in ("silent_progress", "stalled")]
        self._check(not wrong, f"quiet starts: {len(supervisor.starts)}, scrapes in their first {SILENCE:g} s: "
                               f"{len(early)}, of which silent_progress or stalled: {len(wrong)}")

    def _journald(self, soak: Soak) -> None:
        serve = soak.supervisors["serve"].unit_name
        for window in (w for w in soak.windows if w.fault == "journald"):
            during = [look for look in soak.scraper.looks if window.began <= look.began <= window.ended and look.took]
            down = [look.began for look in during if look.sources.get("journal") == 0]
            told = f"{down[0] - window.began:.1f} s" if down else "never"
            self._check(bool(down) and down[0] - window.began <= 5.0,
                        f"journald stopped {window.note}: source_up{{source=\"journal\"}} 0 after {told}")
            stalled = [look for look in during if look.verdicts.get(serve) == "stalled"]
            self._check(not stalled, f"journald stopped: the serving unit read stalled in {len(stalled)} of "
                                     f"{len(during)} scrapes")

    def _memory(self, soak: Soak) -> None:
        if not soak.bursts:
            return
        rss = [after for _, _, after in soak.bursts]
        growth = (rss[-1] - rss[0]) / MiB
        self.figures.update(rss_before_mib=soak.memory_before / MiB, rss_after_bursts_mib=[r / MiB for r in rss],
                            pss_after_mib=soak.pss_after / MiB)
        series = " ".join(f"{r / MiB:.1f}" for r in rss)
        for before, after in soak.first_bursts.values():
            self.held.append(f"an agent's first burst: RSS {before / MiB:.1f} → {after / MiB:.1f} MiB "
                             f"({(after - before) / MiB:+.1f})")
        self.held.append(f"RSS before the ten bursts {soak.memory_before / MiB:.1f} MiB, after each: {series} MiB; "
                         f"PSS of the agent and its child after them {soak.pss_after / MiB:.1f} MiB (goal 40)")
        # the first burst may grow the allocator's arenas once; the nine after it must not keep growing them
        self._check(growth < 1.0, f"RSS growth from the first burst to the tenth: {growth:.2f} MiB (under 1 MiB)")
        unanswered = sum(of - answered for answered, of, _ in soak.bursts)
        self._check(unanswered == 0, f"burst scrapes not answered: {unanswered} of {BURST * len(soak.bursts)}")

    def text(self) -> str:
        lines = [f"soak: {self.took:.0f} s", "held:"]
        lines += [f"  {line}" for line in self.held]
        lines += ["lost:" if self.lost else "lost: nothing"]
        lines += [f"  {line}" for line in self.lost]
        return "\n".join(lines)


def _pairs(counts: Counter) -> str:
    return "{" + ", ".join(f"{o}{'/' + r if r else ''}: {n}" for (o, r), n in sorted(counts.items(), key=str)) + "}"


def printed(soak: Soak) -> dict[str, list[tuple[str, str | None]]]:
    """Each unit's starts as their own lines tell them, read back from the journal: (outcome, failure reason)."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for supervisor in soak.supervisors.values():
        reader = soak.journald.reader(_SYSTEMD_UNIT=supervisor.unit_name)
        try:
            text: dict[str, str] = {}
            for entry in reader:
                invocation = str(entry.get("_SYSTEMD_INVOCATION_ID", "")).replace("-", "")
                message = entry.get("MESSAGE", "")
                text[invocation] = text.get(invocation, "") + (message.decode(errors="replace") if isinstance(message, bytes) else str(message)) + "\n"
        finally:
            reader.close()
        said = []
        for start in supervisor.starts:
            lines = text.get(start.invocation, "")
            otherwise = ("stopped", None) if start.stopped else ("failed", "exited")
            said.append(next(((o, r) for marker, o, r in PRINTED if marker in lines), otherwise))
        out[supervisor.unit_name] = said
    return out


def run(minutes: float, journald: Any = None) -> Report:
    """The soak, as root, in `journald` (a sandbox.Journald) or a namespace of its own; raises RuntimeError when it
    cannot run here."""
    from exporter.shell.demo import sandbox

    with tempfile.TemporaryDirectory(prefix="llmstartup-soak-") as logs_dir, small_volume(STATE_SIZE) as state:
        if journald is None:
            sandbox.preflight()
            with sandbox.Journald(f"llmstartup-soak-{secrets.token_hex(3)}") as own:
                return _run(Soak(minutes, own, state, Path(logs_dir)))
        return _run(Soak(minutes, journald, state, Path(logs_dir)))


def _run(soak: Soak) -> Report:
    report = soak.run()
    if not report.ok:
        report.lost.append("the agent's log (last 3000 characters):\n" + soak.agent.log_text()[-3000:])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="how long the faults go on (15)")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    if os.geteuid() != 0:
        say("the soak runs units in a private journald namespace and mounts a tmpfs: run it as root")
        return 1
    say(f"soak: {args.minutes:g} minutes of faults")
    report = run(args.minutes)
    say(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
