"""exporter.sources.journal_skim: replay of a journal file, skimmed and in slices, gives what reading it all gives.

Journal files are written by systemd-journal-remote from export streams made here: model-server
units starting again and again, with PID 1's lifecycle lines, silences, `\\r` bars, colour, blank
and non-ASCII lines, lines without an invocation id, a straggler of an old invocation, other
units and the kernel. Each is replayed twice, through the skim (forced into parallel slices) and
through `read_journal_file`, and the two replays' documents must be equal.
"""

from __future__ import annotations

import random
import struct
import subprocess
from pathlib import Path

import pytest

from bench.common import JOURNAL_REMOTE, find_binary
from bench.ingest import export_stream
from exporter.core import replay
from exporter.core.model import Limits
from exporter.sources import journal_skim
from exporter.sources.journal_file import read_journal_file

STARTED, STOPPED = "39f53479d3a045ac8e11786248231fbf", "7ad2d189f7e94e70a38c781354912448"
BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
VLLM = [
    "INFO 11-29 07:06:40 [api_server.py:1] vLLM API server version 0.11.0",
    "INFO 11-29 07:06:41 [core.py:1] Starting to load model Qwen/Qwen3-8B...",
    "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:12<00:00,  3.00s/it]",
    "INFO 11-29 07:06:55 [gpu_model_runner.py:1] Model loading took 15.26 GiB and 12.30 seconds",
    "INFO 11-29 07:07:20 [backends.py:1] Compiling a graph for dynamic shape takes 24.08 s",
    "INFO 11-29 07:07:30 [gpu_worker.py:1] Available KV cache memory: 56.60 GiB",
    "INFO 11-29 07:07:40 [gpu_model_runner.py:1] Graph capturing finished in 8 secs, took 0.52 GiB",
    "INFO:     Application startup complete.",
]
NOISE = [  # what an engine prints while starting that no rule reads
    "WARNING 11-29 07:06:42 [config.py:1] some setting is deprecated",
    "",
    " " * 4100 + "text past the first record's end",  # a blank record: its first 4096 characters are
]
SERVING = [
    'INFO:     10.0.3.4:41000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "INFO 11-29 07:08:00 [loggers.py:127] Engine 000: Avg prompt throughput: 10.0 tokens/s, Running: 1 reqs",
    "",  # blank: no record at all
    "   \t ",
    "\x1b[32mINFO\x1b[0m:     colour only around a plain line",
    "\x1b[0m",  # colour only: no record either
    "Modèle chargé: ébauche",  # non-ASCII
    "Capturing CUDA graphs: 50%|█████     | 33/67 [00:04<00:04, 8.0it/s]\rCapturing CUDA graphs: 100%|██████████| 67/67 [00:08<00:00, 8.0it/s]",
    "x" * 5000,  # longer than a record
    "CUDA error: an illegal memory access was encountered",  # a failure after ready
]


def _field(name: str, value: str) -> bytes:
    data = value.encode()
    if any(b < 0x20 and b not in (9,) for b in data):  # the export format's binary-safe form
        return name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return name.encode() + b"=" + data + b"\n"


def _entry(t: int, **fields: str) -> bytes:
    head = {"__REALTIME_TIMESTAMP": str(t), "__MONOTONIC_TIMESTAMP": str(t - 1_700_000_000_000_000),
            "_BOOT_ID": BOOT, "_HOSTNAME": "gpu-node"}
    return b"".join(_field(k, v) for k, v in {**head, **fields}.items()) + b"\n"


def scenario(seed: int, count: int = 4000) -> bytes:
    """An export stream of two model-server units and the rest of a host; the same for a seed."""
    rng = random.Random(seed)
    t = 1_764_400_000_000_000
    units = {"vllm-a.service": None, "vllm-b.service": None}
    startup = {unit: 0 for unit in units}
    out = []
    for _ in range(count):
        t += rng.choice((1_000, 20_000, 400_000, 3_000_000, 90_000_000)) if rng.random() < 0.2 else 1_000
        unit = rng.choice(list(units))
        roll = rng.random()
        own = {"_SYSTEMD_UNIT": unit, "_TRANSPORT": "stdout", "_PID": "4000"}
        if units[unit] is None or roll < 0.0015:  # (re)start
            old = units[unit]
            if old and rng.random() < 0.5:
                out.append(_entry(t, _PID="1", _SYSTEMD_UNIT="init.scope", _TRANSPORT="journal", UNIT=unit,
                                  MESSAGE_ID=STOPPED, MESSAGE=f"{unit}: Deactivated successfully."))
            units[unit], startup[unit] = f"{rng.getrandbits(128):032x}", 0
            out.append(_entry(t, _PID="1", _SYSTEMD_UNIT="init.scope", _TRANSPORT="journal", UNIT=unit,
                              MESSAGE_ID=STARTED, INVOCATION_ID=units[unit], MESSAGE=f"Started {unit}."))
            if old and rng.random() < 0.5:  # processes of the old start, still talking after the new one began
                for late in range(1, rng.randint(2, 4)):
                    out.append(_entry(t + late, **own, _SYSTEMD_INVOCATION_ID=old, MESSAGE=SERVING[0]))
            continue
        if roll < 0.01:  # journald could not tell the invocation
            out.append(_entry(t, **own, MESSAGE=rng.choice(SERVING[:2])))
        elif roll < 0.02:  # a process left over from some start long gone, still talking
            out.append(_entry(t, **own, _SYSTEMD_INVOCATION_ID=unit[5] * 32, MESSAGE=SERVING[0]))
        elif roll < 0.1:
            kind = rng.choice(("kernel", "cron"))
            if kind == "kernel":
                out.append(_entry(t, _TRANSPORT="kernel", MESSAGE="NVRM: Xid (PCI:0000:3b:00): 79, pid=1"))
            else:
                out.append(_entry(t, _SYSTEMD_UNIT="cron.service", _TRANSPORT="syslog", _PID="77",
                                  _SYSTEMD_INVOCATION_ID="c" * 32, MESSAGE="(root) CMD (true)"))
        else:
            if startup[unit] < len(VLLM):
                if rng.random() < 0.6:
                    message = rng.choice(NOISE)
                else:
                    message, startup[unit] = VLLM[startup[unit]], startup[unit] + 1
            else:
                message = rng.choice(SERVING) if rng.random() < 0.2 else SERVING[rng.randrange(2)]
            out.append(_entry(t, **own, _SYSTEMD_INVOCATION_ID=units[unit], MESSAGE=message))
    return b"".join(out)


def build(folder: Path, stream: bytes) -> Path:
    path = folder / "host.journal"
    subprocess.run([find_binary(JOURNAL_REMOTE, "systemd-journal-remote"), f"--output={path}", "--split-mode=none",
                    "-"], input=stream, check=True, capture_output=True)
    return path


def replayed(chosen, entries, silence: float, only=()) -> list[replay.Replayed]:
    """Every unit's whole fold: every start's phases, silences and counters, not just the last start's."""
    run = replay.Replay(None, Limits(silence=silence), only=only, chosen=chosen)
    run.feed(entries)
    return run.results()


@pytest.fixture
def parallel(monkeypatch):
    """Slices and a pool even for a small file; reading it all in order instead is a failure."""
    monkeypatch.setattr(journal_skim, "PARALLEL_FROM", 0)
    monkeypatch.setattr(journal_skim.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(journal_skim, "read_journal_file", _no_fallback)


def _no_fallback(path):
    raise AssertionError(f"the skim gave up on {path} and read it in order")


@pytest.mark.parametrize("seed", range(5))
def test_a_skimmed_replay_is_the_whole_replay(tmp_path, parallel, seed):
    path = build(tmp_path, scenario(seed))
    silence = 60.0
    whole = replayed({}, read_journal_file(path), silence)
    skimmed = replayed(*journal_skim.skim(path, silence), silence)
    assert [r.unit for r in whole] == ["vllm-a.service", "vllm-b.service"]
    assert skimmed == whole
    # what the scenario is there to hold: silences, restarts, failures
    assert all(r.attempts > 2 and r.state.failures for r in whole) and any(r.state.attempt.gaps for r in whole)


def test_only_some_units(tmp_path, parallel):
    path = build(tmp_path, scenario(7))
    whole = replayed({}, read_journal_file(path), 60.0, ["vllm-b.service"])
    chosen, entries = journal_skim.skim(path, 60.0, frozenset({"vllm-b.service"}))
    assert [r.unit for r in whole] == ["vllm-b.service"]
    assert replayed(chosen, entries, 60.0, ["vllm-b.service"]) == whole


def test_most_of_a_serving_journal_is_skipped(tmp_path, parallel):
    """What makes it fast: of a host serving (bench/ingest.py's journal), little reaches the fold."""
    path = build(tmp_path, b"".join(export_stream(30_000)))
    chosen, entries = journal_skim.skim(path, 60.0)
    handed = list(entries)
    assert len(handed) < 30_000 // 10
    assert replayed(chosen, handed, 60.0) == replayed({}, read_journal_file(path), 60.0)


def test_a_long_serving_run_is_no_silence(tmp_path, parallel):
    """A server that answers a request every 10 ms for 40 s is never silent for 5 s: the skim, which drops
    nearly every one of those lines, hands over enough of them that the fold sees no silence in its start
    (it saw one from the start's last phase marker to the line before the next line handed over)."""
    t, own = 1_764_400_000_000_000, {"_SYSTEMD_UNIT": "vllm-a.service", "_TRANSPORT": "stdout", "_PID": "4000",
                                     "_SYSTEMD_INVOCATION_ID": "a" * 32}
    stream = []
    for at, message in enumerate([*VLLM, *[SERVING[0]] * 4000]):
        stream.append(_entry(t + at * (500_000 if at < len(VLLM) else 10_000), **own, MESSAGE=message))
    path = build(tmp_path, b"".join(stream))
    whole = replayed({}, read_journal_file(path), 5.0)
    assert replayed(*journal_skim.skim(path, 5.0), 5.0) == whole
    assert whole[0].state.attempt.phase == "ready" and not whole[0].state.attempt.gaps


def test_a_clock_that_went_back_is_read_in_order(tmp_path, parallel, monkeypatch):
    """Slices are realtime ranges; from the first that does not start where the one before it
    stopped, the rest of the file is read whole and in order."""
    resumed = []

    def spy(path, start=None):
        resumed.append(start)
        return read_journal_file(path, start)

    monkeypatch.setattr(journal_skim, "read_journal_file", spy)
    stream = scenario(3, 3000)
    entries = stream.split(b"\n\n")
    late = [e.replace(b"__REALTIME_TIMESTAMP=1764", b"__REALTIME_TIMESTAMP=1763", 1) for e in entries[1000:1500]]
    path = build(tmp_path, b"\n\n".join(entries[:1000] + late + entries[1500:]))
    whole = replayed({}, read_journal_file(path), 60.0)
    chosen, skimmed = journal_skim.skim(path, 60.0)
    assert replayed(chosen, skimmed, 60.0) == whole
    assert len(resumed) == 1 and resumed[0] is not None  # the slices before the break were kept


def test_an_invocation_two_units_claim_is_read_in_order(tmp_path, parallel, monkeypatch):
    """A skimmed line is taken to be its invocation's unit's; from a slice that finds otherwise, the
    file is read in order."""
    monkeypatch.setattr(journal_skim, "read_journal_file", read_journal_file)
    stream = scenario(4, 2000).replace(b"_SYSTEMD_UNIT=cron.service", b"_SYSTEMD_UNIT=vllm-a.service", 5)
    path = build(tmp_path, stream)
    chosen, skimmed = journal_skim.skim(path, 60.0)
    assert replayed(chosen, skimmed, 60.0) == replayed({}, read_journal_file(path), 60.0)
