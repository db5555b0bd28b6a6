"""Hostile and broken input through the pure code: nothing raises, and the tracker keeps its invariants.

Every property runs with hypothesis derandomized (the same examples on every run, no example
database), so a failure here is reproducible and the file takes a few seconds, not minutes:

- `lines.clean_records` and `redraw_ages` on arbitrary bytes and text, ANSI and `\\r` storms, 1 MiB lines;
- `grammar.match` for every engine on arbitrary text and on mutated real fixture lines (tests/grammars);
- `formats.detect` and `formats.entries` for every Format on arbitrary chunks and mutated samples
  (tests/formats: truncation, byte flips, inserted NULs, CRLF);
- `core.entries.to_observations` on arbitrary field dicts;
- `replay.Replay` with `document` and `text` on fuzzed entries, and from fuzzed bytes end to end;
- `tracker.advance` + `tracker.judge` on random observation sequences, with invariants checked
  after every step (phases only move forward within an attempt, counters never go down, one verdict);
- and every grammar regex against 4 KiB adversarial strings, to catch catastrophic backtracking.
"""

from __future__ import annotations

import io
import json
import math
import re
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.core import formats, grammar, replay, report, tracker
from exporter.shell.exposition import Exposition
from exporter.core.formats import Format, paste
from exporter.core.lines import MAX_RECORD, clean_records, redraw_ages
from exporter.core.model import (
    STARTUP_ORDER,
    Event,
    Fault,
    GpuSample,
    Lifecycle,
    Limits,
    LogLine,
    Phase,
    ProcessSample,
    ProcessState,
    Reason,
    Snapshot,
    UnitState,
    UnitView,
    Verdict,
    XidError,
    frozen_map,
)
from exporter.core.entries import FIELDS as JOURNAL_FIELDS
from exporter.core.entries import LIFECYCLE_IDS, to_observations

# derandomize: the same examples every run; database=None: no .hypothesis/ state that changes them;
# deadline=None: a slow CI machine must not turn into a flaky failure (time is checked on its own below).
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FEW = settings(FUZZ, max_examples=25)  # for examples that cost a megabyte each

ROOT = Path(__file__).parent
GRAMMARS = dict(grammar.load_all())
UNIT = "fuzz.service"
UNITS = frozenset({UNIT})
MiB = 2**20


# ---- corpora: the real lines and saved logs the other tests use --------------------------------


def _fixture_lines() -> dict[str, list[str]]:
    """Every raw line of tests/grammars/<engine>/*.log (after ` | `), with `\\r` and `\\x1b` decoded."""
    lines: dict[str, list[str]] = {}
    for path in sorted(ROOT.glob("grammars/*/*.log")):
        for line in path.read_text("utf-8").splitlines():
            if line.strip() and not line.startswith("#") and " | " in line:
                raw = line.partition(" | ")[2].replace("\\x1b", "\x1b").replace("\\r", "\r")
                lines.setdefault(path.parent.name, []).append(raw)
    return lines


FIXTURE_LINES = _fixture_lines()
ALL_LINES = [line for lines in FIXTURE_LINES.values() for line in lines]
# vllm.journal.gz is a binary journal file, read by libsystemd rather than by exporter.core.formats.
SAMPLES = {p.name: p.read_bytes() for p in sorted((ROOT / "formats").iterdir()) if p.is_file() and p.suffix != ".gz"}

# Pieces that have broken parsers before: number shapes a `[\d.]+` group accepts but float() does not,
# digit runs past float's range and int()'s 4300-digit limit, non-ASCII digits, control characters.
HOSTILE = [
    "1.2.3", ".", ",", "..", "1,", ",1", "9" * 400, "9" * 5000, "1e400", "nan", "inf", "-1", "٣٤.٥", "²",
    "\x00", "\r", "\r\n", "\n", "\x1b", "\x1b[", "\x1b[1;36m", "\x1b[0;0m", "\x1b[999999999", "\ufffd", "\u2028",
    "(", ")", "[", "]", " pid=", "[00:00<", "[" + "9" * 400 + ":00:00<", "{", "}", '"', "'", "\\",
    "=", ": ", "|", " " * 64, "\t",
]


def _ansi() -> st.SearchStrategy[str]:
    """Complete, broken and nested escape sequences."""
    params = st.text(alphabet="0123456789;?", max_size=12)
    final = st.sampled_from("mKHJABCDGhlsu")
    return st.one_of(
        st.builds(lambda p, f: f"\x1b[{p}{f}", params, final),
        st.sampled_from(["\x1b", "\x1b[", "\x1b[1;", "\x1b\x1b[0m[0m", "\x1b]0;title\x07", "\x1b[?25l", "\x9b31m"]),
    )


def _storm(piece: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(piece, st.text(max_size=8)), max_size=200).map("".join)


ANSI_STORMS = _storm(_ansi())
CR_STORMS = _storm(st.sampled_from(["\r", "\r\n", "\n", "\r\r\r", "\n\r", "[00:01<00:02, 1.00it/s]", " 42%|████ |"]))
TEXT = st.one_of(st.text(max_size=300), ANSI_STORMS, CR_STORMS, st.sampled_from(HOSTILE))


@st.composite
def mutated_line(draw: st.DrawFn, corpus: list[str]) -> str:
    """A real fixture line with a few edits: cuts, insertions of hostile pieces, duplications."""
    line = draw(st.sampled_from(corpus))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["cut", "insert", "hostile", "dup", "digits", "truncate", "swap"]))
        if op == "cut":
            line = line[:at] + line[at + draw(st.integers(1, 20)) :]
        elif op == "insert":
            line = line[:at] + draw(st.text(max_size=10)) + line[at:]
        elif op == "hostile":
            line = line[:at] + draw(st.sampled_from(HOSTILE)) + line[at:]
        elif op == "dup":
            end = draw(st.integers(at, min(len(line), at + 200)))
            line = line[:end] + line[at:end] * draw(st.integers(1, 20)) + line[end:]
        elif op == "digits":  # every number in the line becomes another number shape
            shape = draw(st.sampled_from(["1.2.3", ".", ",", "9" * 400, "١٢٣", "0", "1,234,567", "1e5"]))
            line = re.sub(r"\d+(?:[.,]\d+)*", shape, line)
        elif op == "truncate":
            line = line[:at]
        else:
            other = draw(st.sampled_from(corpus))
            line = line[:at] + other[draw(st.integers(0, len(other))) :]
    return line


# ---- (a) lines ----------------------------------------------------------------------------------


def _check_records(records: list[str]) -> None:
    assert isinstance(records, list)
    for record in records:
        assert isinstance(record, str)
        assert record.strip(), "an empty record"
        assert "\r" not in record
        assert len(record) <= MAX_RECORD
    ages = redraw_ages(records)
    assert len(ages) == len(records)
    for age in ages:
        assert math.isfinite(age) and age >= 0
        assert math.isfinite(1.8e9 - age), "an age that cannot be subtracted from a time"


@FUZZ
@given(st.one_of(st.binary(max_size=2000), TEXT))
@example("[00:00<\r[" + "9" * 400 + ":00:00<")  # an elapsed time past float's range
@example("[00:00<\r[" + "9" * 4000 + ":00:00<")  # and past int()'s digit limit
@example(b"\xff\xfe\x1b[31m\xc3(\r\x00\r\n")
def test_clean_records_take_anything(message: str | bytes) -> None:
    records = clean_records(message)
    _check_records(records)
    if isinstance(message, bytes):
        assert records == clean_records(message.decode("utf-8", "replace"))


@FUZZ
@given(st.lists(st.one_of(TEXT, st.sampled_from(["[00:01<", "[12:34<", "[1:00:00<", "[" + "9" * 400 + ":00:00<"])),
                max_size=50))
def test_redraw_ages_take_any_records(records: list[str]) -> None:
    # redraw_ages is only ever given what clean_records made: at most MAX_RECORD characters each
    ages = redraw_ages([r[:MAX_RECORD] for r in records])
    assert len(ages) == len(records)
    assert all(math.isfinite(a) and a >= 0 for a in ages)


@FEW
@given(
    st.text(min_size=1, max_size=16),
    st.sampled_from(["", "\r", "\x1b[1;36m", "\x1b[", "\n", "\r\n", "\xff"]),
    st.booleans(),
)
def test_one_mebibyte_lines(seed: str, separator: str, as_bytes: bool) -> None:
    unit = seed + separator
    line = (unit * (MiB // len(unit) + 1))[:MiB]
    records = clean_records(line.encode("utf-8", "surrogatepass") if as_bytes else line)
    _check_records(records)  # how fast: bench/lines.py


@FUZZ
@given(st.one_of(st.binary(max_size=2000), TEXT, st.text(alphabet="*`>│| [](:x#033^m\r\n", max_size=300)))
@example("**a " * 2000)  # strong emphasis that never closes, past MAX_RECORD
def test_paste_repair_takes_anything(message: str | bytes) -> None:
    repaired = paste.repaired({"MESSAGE": message})["MESSAGE"]
    assert isinstance(repaired, (str, bytes)) and len(repaired) <= len(message)
    _check_records(clean_records(repaired))


# ---- (b) grammars -------------------------------------------------------------------------------


def _check_match(found: grammar.Match | None) -> None:
    if found is None:
        return
    assert found.phase is None or isinstance(found.phase, Phase)
    assert found.reason is None or isinstance(found.reason, Reason)
    assert set(found.info) <= grammar.INFO and all(isinstance(v, str) for v in found.info.values())
    assert set(found.values) <= set(grammar.VALUES)
    assert all(isinstance(v, float) and not math.isnan(v) and v >= 0 for v in found.values.values())
    if found.progress is not None:  # what the ETA divides by and adds: finite, a total above zero
        report = found.progress
        assert math.isfinite(report.done) and report.done >= 0
        assert math.isfinite(report.total) and report.total > 0
        assert report.remaining is None or (math.isfinite(report.remaining) and report.remaining >= 0)


@FUZZ
@given(st.sampled_from(grammar.ENGINES), st.one_of(TEXT, st.text(min_size=3000, max_size=MAX_RECORD)))
def test_grammars_match_any_text(engine: str, text: str) -> None:
    _check_match(grammar.match(GRAMMARS[engine], text))


@settings(FUZZ, max_examples=400)
@given(st.sampled_from(grammar.ENGINES), mutated_line(ALL_LINES))
@example("vllm", "INFO 10-21 09:10:40 [default_loader.py:267] Model loading took 1.2.3 GiB and 2 seconds")
@example("vllm", "INFO 10-21 09:11:40 [kv_cache_utils.py:1087] GPU KV cache size: , tokens")
@example("sglang", "[2025-01-01 00:00:00] Load weight end. elapsed=. s, type=Qwen, mem usage=1.2.3 GB")
@example("llamacpp", "load_tensors:        CUDA0 model buffer size = . MiB")
def test_grammars_match_mutated_fixture_lines(engine: str, raw: str) -> None:
    """Each engine's grammar against every engine's lines: an engine is sometimes guessed wrong."""
    for record in clean_records(raw):
        _check_match(grammar.match(GRAMMARS[engine], record))


# ---- (c) saved-log formats ----------------------------------------------------------------------


@st.composite
def mutated_sample(draw: st.DrawFn) -> bytes:
    data = SAMPLES[draw(st.sampled_from(sorted(SAMPLES)))]
    for _ in range(draw(st.integers(0, 5))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["truncate", "flip", "nul", "crlf", "cut", "insert", "dup", "cr"]))
        if op == "truncate":
            data = data[:at]
        elif op == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
        elif op == "nul":
            data = data[:at] + b"\x00" * draw(st.integers(1, 8)) + data[at:]
        elif op == "crlf":
            data = data.replace(b"\n", b"\r\n")
        elif op == "cut":
            data = data[:at] + data[at + draw(st.integers(1, 64)) :]
        elif op == "insert":
            data = data[:at] + draw(st.binary(max_size=16)) + data[at:]
        elif op == "dup":
            end = draw(st.integers(at, min(len(data), at + 512)))
            data = data[:end] + data[at:end] * draw(st.integers(1, 8)) + data[end:]
        else:
            data = data.replace(b"\n", b"\r")
    return data


def _chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    """As a file iterates (lines), or fixed-size blocks when sizes are given (any chunking is allowed)."""
    if not sizes:
        return list(io.BytesIO(data))
    out, at, i = [], 0, 0
    while at < len(data):
        size = sizes[i % len(sizes)]
        out.append(data[at : at + size])
        at, i = at + size, i + 1
    return out


def _check_entries(chunks: list[bytes], fmt: Format) -> list[tuple[float | None, dict]]:
    got = list(formats.entries(iter(chunks), fmt, unit=UNIT, year=2026))
    for t, fields in got:
        # a time replay's timeline cannot print (past datetime's years 1 to 9999) is no time
        assert t is None or (isinstance(t, float) and report.iso(t - 86400) and report.iso(t + 86400)), t
        assert isinstance(fields, dict) and set(fields) <= set(JOURNAL_FIELDS)
        assert all(isinstance(v, (str, bytes)) for v in fields.values())
    return got


@FUZZ
@given(st.one_of(mutated_sample(), st.binary(max_size=4000)), st.lists(st.integers(1, 300), max_size=4))
@example(b'{"__REALTIME_TIMESTAMP":"\xc2\xb2","MESSAGE":"x"}\n', [])  # a superscript two isdigit()s
@example(b'{"__REALTIME_TIMESTAMP":"' + b"1" * 5000 + b'","MESSAGE":"x"}\n', [])
@example(b'{"__REALTIME_TIMESTAMP":"' + b"9" * 30 + b'","MESSAGE":"x"}\n', [])
@example(b"__CURSOR=x\n__REALTIME_TIMESTAMP=" + b"9" * 400 + b"\nMESSAGE=x\n\n", [])
@example(b"0001-01-01T00:00:00+23:59 host vllm[1]: x\n", [])
@example(b"9999-12-31T23:59:59-23:59 host vllm[1]: x\n", [])
@example(b'{"MESSAGE":' + b"[" * 900 + b"]" * 900 + b"}\n", [])
def test_formats_read_anything(data: bytes, sizes: list[int]) -> None:
    chunks = _chunks(data, sizes)
    detected = formats.detect(list(io.BytesIO(data))[:50])
    assert isinstance(detected, Format)
    for fmt in Format:
        _check_entries(chunks, fmt)


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=200), st.sampled_from([b"\n", b"\r\n", b"{", b"\x1e{", b"-- Boot --"])),
                max_size=60))
def test_detect_takes_any_lines(lines: list[bytes]) -> None:
    assert isinstance(formats.detect(lines), Format)


@FUZZ
@given(st.text(max_size=300))
def test_lifecycle_fields_take_any_text(message: str) -> None:
    found = formats.short.lifecycle_fields(message)
    assert found is None or all(isinstance(v, str) for v in found.values())


# ---- (d) journal entries -------------------------------------------------------------------------

FIELD_VALUES = st.one_of(
    st.text(max_size=60), st.binary(max_size=60), st.sampled_from([UNIT, "1", "kernel", "0", "", *LIFECYCLE_IDS]),
    st.sampled_from(["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
                     "NVRM: Xid (PCI:" + "f" * 5000 + "): 79, x", "NVRM: Xid (PCI:0000:3b:00): " + "9" * 400 + ", x"]),
    TEXT,
)
FIELD_DICTS = st.dictionaries(st.one_of(st.sampled_from(JOURNAL_FIELDS), st.text(max_size=10)), FIELD_VALUES, max_size=12)


@settings(FUZZ, max_examples=300)
@given(FIELD_DICTS, st.floats(0, 1e7), st.sampled_from([UNITS, frozenset(), frozenset({UNIT, "other.service"})]))
@example({"_SYSTEMD_UNIT": UNIT, "MESSAGE": "[00:00<\r[" + "9" * 400 + ":00:00<"}, 1.0, UNITS)
def test_to_observations_take_any_fields(fields: dict, t: float, units: frozenset[str]) -> None:
    for obs in to_observations(fields, t, units):
        assert isinstance(obs, (LogLine, Lifecycle, XidError))
        assert math.isfinite(obs.t)
        if isinstance(obs, LogLine):
            assert obs.unit in units and obs.t <= t
        elif isinstance(obs, Lifecycle):
            assert obs.unit in units
            # UNIT= is a field anyone may write: a lifecycle event only from PID 1, never from a unit's own line
            assert fields.get("_PID") in ("1", b"1")


@FUZZ
@given(st.dictionaries(st.sampled_from(JOURNAL_FIELDS), st.lists(FIELD_VALUES, min_size=1, max_size=3), min_size=1))
@example({"_SYSTEMD_UNIT": [UNIT, UNIT], "MESSAGE": ["x"]})
@example({"_SYSTEMD_UNIT": [UNIT, "other.service"], "MESSAGE": ["x", "y"]})
def test_to_observations_take_list_values(fields: dict) -> None:
    # a field given twice: journald keeps both, the first one counts
    assert to_observations(fields, 1.0, UNITS) == to_observations({k: v[0] for k, v in fields.items()}, 1.0, UNITS)


def test_to_observations_take_a_huge_xid() -> None:
    huge = {"_TRANSPORT": "kernel", "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): " + "9" * 5000 + ", x"}
    assert to_observations(huge, 1.0, UNITS) == [], "a number of 5000 digits is no Xid"


@pytest.mark.parametrize("dropped", ["²", "9" * 5000])
def test_to_observations_take_any_suppressed_count(dropped: str) -> None:
    notice = {"_TRANSPORT": "driver", "MESSAGE_ID": "a596d6fe7bfa4994828e72309e95d61e",
              "OBJECT_SYSTEMD_UNIT": UNIT, "N_DROPPED": dropped}
    assert to_observations(notice, 1.0, UNITS) == [], "a count that is not a plain number of lines is no count"


# ---- (e) replay ------------------------------------------------------------------------------------


@st.composite
def replay_fields(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["line", "line", "line", "pid1", "short", "noise"]))
    unit = draw(st.sampled_from([UNIT, "other.service", "vllm.service"]))
    if kind == "line":
        message = draw(st.one_of(mutated_line(ALL_LINES), st.sampled_from(ALL_LINES), TEXT))
        fields: dict[str, Any] = {"_SYSTEMD_UNIT": unit, "MESSAGE": message}
        if draw(st.booleans()):
            fields["_SYSTEMD_INVOCATION_ID"] = draw(st.sampled_from(["a" * 32, "b" * 32, ""]))
        if draw(st.booleans()):
            fields["MESSAGE"] = message.encode("utf-8", "surrogatepass") + draw(st.sampled_from([b"", b"\xff"]))
        return fields
    if kind == "pid1":
        return {
            "_PID": "1", "UNIT": unit, "MESSAGE_ID": draw(st.sampled_from(sorted(LIFECYCLE_IDS))),
            "MESSAGE": draw(st.sampled_from([
                "Main process exited, code=exited, status=0/SUCCESS", "Main process exited, code=killed, status=9/KILL",
                "Failed with result 'oom-kill'.", "Started x.", "", "Main process exited, code=dumped, status=11/SEGV",
            ])),
            "UNIT_RESULT": draw(st.sampled_from(["", "exit-code", "timeout", "signal"])),
            "INVOCATION_ID": draw(st.sampled_from(["a" * 32, "b" * 32, ""])),
        }
    if kind == "short":  # a short-format line: named by its identifier
        return {"SYSLOG_IDENTIFIER": draw(st.sampled_from(["vllm", "fuzz", ""])), "MESSAGE": draw(TEXT)}
    return draw(FIELD_DICTS)


TIMES = st.one_of(st.none(), st.floats(0, 4.1e9), st.floats(1.7e9, 1.7e9 + 7200))
ENTRIES = st.lists(st.tuples(TIMES, replay_fields()), max_size=60)


def _replay(entries: list, engine: str | None, only: tuple[str, ...], limits: Limits) -> None:
    run = replay.Replay(engine, limits, default_unit=UNIT, only=only)
    run.feed(entries)
    for result in run.results():
        doc = report.replay_document(result)
        json.dumps(doc)
        assert doc["outcome"] in ("ready", "failed", "stopped", "incomplete")
        assert doc["attempts"] >= 1
        lines = list(report.replay_text(result))
        assert lines and all(isinstance(line, str) for line in lines)


@settings(FUZZ, max_examples=200)
@given(ENTRIES, st.sampled_from([None, *grammar.ENGINES]), st.sampled_from([(), (UNIT,), ("nothing.service",)]),
       st.sampled_from([Limits(), Limits(silence=0.001), Limits(silence=1e12)]))
def test_replay_takes_any_entries(entries: list, engine: str | None, only: tuple[str, ...], limits: Limits) -> None:
    _replay(entries, engine, only, limits)


@settings(FUZZ, max_examples=100)
@given(st.one_of(mutated_sample(), st.binary(max_size=2000)), st.sampled_from([None, "vllm"]))
def test_replay_from_any_bytes(data: bytes, engine: str | None) -> None:
    """What `llmstartup replay FILE` does, from bytes to the printed timeline."""
    lines = list(io.BytesIO(data))
    fmt = formats.detect(lines[:50])
    _replay(list(formats.entries(lines, fmt, unit=UNIT, year=2026)), engine, (), Limits())


# A value group matches any number of digits: `Using max model len 999…9` (400 digits) would be
# float('inf'), which replay's JSON cannot hold; grammar.match drops non-finite values.
def test_replay_json_is_strict_json_with_huge_numbers() -> None:
    run = replay.Replay("vllm", Limits(), default_unit=UNIT)
    run.feed([(1.7e9, {"_SYSTEMD_UNIT": UNIT, "MESSAGE": "INFO 10-21 09:10:09 [model.py:1510] Using max model len "
                       + "9" * 400})])
    (result,) = run.results()
    json.dumps(report.replay_document(result), allow_nan=False)


# ---- (f) the pure tracker ----------------------------------------------------------------------------

INVOCATIONS = st.sampled_from(["", "", "inv-a", "inv-b", "inv-c"])
DETAILS = st.sampled_from(["", "exited/0/SUCCESS", "exited/1/FAILURE", "killed/9/KILL", "killed/15/TERM",
                           "killed/6/ABRT", "dumped/11/SEGV", "oom-kill", "timeout", "signal", "exit-code", "garbage"])
PIDS = st.frozensets(st.tuples(st.integers(1, 6), st.sampled_from([0.0, 1.0, 2.0])), max_size=4)


@st.composite
def observation_steps(draw: st.DrawFn, engine: str) -> list:
    """Observations of one unit at non-decreasing times (some equal), each kind as the sources make it."""
    lines = FIXTURE_LINES.get(engine) or ALL_LINES
    t = draw(st.floats(0, 1e6))
    cpu = read = written = 0.0
    out: list = []
    for _ in range(draw(st.integers(1, 60))):
        t += draw(st.one_of(st.just(0.0), st.floats(0, 5), st.floats(0, 1000)))
        kind = draw(st.sampled_from(["line", "line", "line", "lifecycle", "process", "process", "gpu", "fault"]))
        if kind == "line":
            raw = draw(st.one_of(st.sampled_from(lines), mutated_line(lines), st.sampled_from(ALL_LINES), TEXT))
            for record in clean_records(raw) or [raw]:
                out.append(LogLine(t=t, unit=UNIT, text=record, invocation=draw(INVOCATIONS)))
        elif kind == "lifecycle":
            out.append(Lifecycle(t=t, unit=UNIT, event=draw(st.sampled_from(Event)), detail=draw(DETAILS),
                                 invocation=draw(INVOCATIONS)))
        elif kind == "process":
            # the cgroup's counters only grow, except when systemd recreates it: back to near zero
            if draw(st.integers(0, 9)) == 0:
                cpu = read = written = 0.0
            cpu += draw(st.floats(0, 100))
            read += draw(st.integers(0, 10**9))
            written += draw(st.integers(0, 10**9))
            ids = draw(PIDS)
            states = draw(st.dictionaries(st.sampled_from(ProcessState), st.integers(0, 5)))
            started = draw(st.one_of(st.none(), st.floats(0, t))) if ids else None
            out.append(ProcessSample(t=t, unit=UNIT, ids=ids, cpu_seconds=cpu, read_bytes=int(read),
                                     written_bytes=int(written), rss_bytes=draw(st.integers(0, 10**11)),
                                     states=frozen_map(states), started_at=started))
        elif kind == "gpu":
            memory = draw(st.dictionaries(st.sampled_from(["0", "1", "2"]), st.one_of(st.none(), st.integers(0, 10**11))))
            out.append(GpuSample(t=t, unit=UNIT, memory=frozen_map(memory)))
        else:
            out.append(Fault(t=t, unit=UNIT, reason=draw(st.sampled_from(Reason))))
    return out


TERMINAL = frozenset({Phase.FAILED, Phase.STOPPING, Phase.INACTIVE})


def _check_step(before: UnitState, after: UnitState) -> None:
    # a new attempt is what _begin makes: `previous` takes the old attempt
    new_attempt = after.attempt is not None and (before.attempt is None or after.previous is not before.previous)
    if before.attempt is not None and after.attempt is not None and not new_attempt:
        old, new = before.attempt.phase, after.attempt.phase
        if before.attempt.inferred_from is not None:  # an inferred phase is tentative: a line may retract it
            old = before.attempt.inferred_from[0]
        assert after.attempt.started == before.attempt.started
        if old in TERMINAL:
            assert new in TERMINAL, f"{old} -> {new} within one attempt"
        elif new not in TERMINAL:
            assert STARTUP_ORDER.index(new) >= STARTUP_ORDER.index(old), f"{old} -> {new} within one attempt"
    if before.attempt is not None:
        assert after.attempt is not None, "an attempt vanished"
    for outcome, n in before.startups.items():
        assert after.startups.get(outcome, 0) >= n, "startups_total went down"
    for key, n in before.failures.items():
        assert after.failures.get(key, 0) >= n, "failures_total went down"
    for hists_before, hists_after in ((before.phase_durations, after.phase_durations),
                                      (before.startup_durations, after.startup_durations)):
        for key, hist in hists_before.items():
            now = hists_after[key]
            assert now.count >= hist.count and all(a >= b for a, b in zip(now.counts, hist.counts))
    assert after.cpu_total >= before.cpu_total
    assert after.read_total >= before.read_total
    assert after.written_total >= before.written_total
    for n in (after.cpu_total, after.read_total, after.written_total):
        assert math.isfinite(n) and n >= 0


def _check_verdict(state: UnitState, now: float, limits: Limits) -> Verdict:
    verdict = tracker.judge(state, now, limits)
    assert isinstance(verdict, Verdict)
    phase = state.phase
    if state.attempt is None:
        assert verdict is Verdict.INACTIVE
    assert (verdict is Verdict.FAILED) == (phase is Phase.FAILED)
    if verdict is Verdict.READY:
        assert phase is Phase.READY
    return verdict


def _render(state: UnitState, verdict: Verdict, now: float) -> str:
    snapshot = Snapshot(t=now, wall_offset=1.7e9, units=(UnitView(state, verdict),), stale_after=6.0)
    return Exposition(lambda: snapshot, process=False)().decode()


LIMITS = st.sampled_from([Limits(), Limits(silence=4, stall=8, stale=6), Limits(silence=4, stall=8, stale=6, gpu=False),
                          Limits(silence=0, stall=0, stale=0)])


@settings(FUZZ, max_examples=200)
@given(st.data(), st.sampled_from(grammar.ENGINES), LIMITS)
def test_tracker_keeps_its_invariants(data: st.DataObject, engine: str, limits: Limits) -> None:
    steps = data.draw(observation_steps(engine))
    rules = GRAMMARS[engine]
    state = UnitState(UNIT, engine)
    for obs in steps:
        after = tracker.advance(state, obs, rules, limits)
        _check_step(state, after)
        state = after
        for later in (obs.t, obs.t + limits.silence, obs.t + limits.stall + 1, obs.t + 1e6):
            _check_verdict(state, later, limits)
    now = steps[-1].t + data.draw(st.floats(0, 1000))
    verdict = _check_verdict(state, now, limits)
    # as a scrape shows it: one phase and one verdict series, the current ones, at 1
    families = {f.name: f for f in text_string_to_metric_families(_render(state, verdict, now))}
    phases = [(s.labels["phase"], s.value) for s in families["llmstartup_unit_phase"].samples]
    verdicts = [(s.labels["verdict"], s.value) for s in families["llmstartup_unit_verdict"].samples]
    assert phases == [(state.phase, 1)] and verdicts == [(verdict, 1)]


# ---- regex worst case --------------------------------------------------------------------------------

# A rule's time on a 4 KiB adversarial string is compared with its time on a 4 KiB plain line. Most rules
# skip a plain line in a microsecond (a literal prefix is found with memchr, or not at all), so the plain
# time is floored at one pass of the regex engine over the same 4 KiB (ONE_PASS): the ratio then counts
# "passes over the line", the same on a fast or a slow machine. Linear rules stay near 1; a rule that is
# quadratic in its near misses (`X.+?Y` searched over many X) takes some hundreds at 4 KiB (MAX_RECORD
# caps records there); catastrophic backtracking takes millions.
ADVERSARIAL_SIZE = MAX_RECORD
BLOW_UP = 1000
ONE_PASS = re.compile(r"(?s:.)*?\x00")  # match(): one lazy step per character, then fails at the end
SINGLE_MATCH_LIMIT = 2.0  # seconds: a match that still runs after this is stopped and reported


def _literals(pattern: re.Pattern[str]) -> list[str]:
    """The literal runs of a pattern (sequences of LITERAL nodes, wherever they are nested)."""
    from re import _parser as sre_parse  # type: ignore[attr-defined]

    runs: list[str] = []

    def walk(items: Any) -> None:
        current: list[str] = []
        for op, arg in items:
            if op is sre_parse.LITERAL:
                current.append(chr(arg))
                continue
            if len(current) > 0:
                runs.append("".join(current))
                current = []
            if op in (sre_parse.SUBPATTERN,):
                walk(arg[-1])
            elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT):
                walk(arg[2])
            elif op is sre_parse.BRANCH:
                for branch in arg[1]:
                    walk(branch)
            elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
                walk(arg[1])
        if current:
            runs.append("".join(current))

    walk(sre_parse.parse(pattern.pattern, pattern.flags))
    return [r for r in runs if r.strip()] or ["x"]


def _fill(piece: str) -> str:
    return (piece * (ADVERSARIAL_SIZE // max(len(piece), 1) + 1))[:ADVERSARIAL_SIZE]


def _adversarial(pattern: re.Pattern[str]) -> list[str]:
    """4 KiB strings made of the pattern's own literals: repeated prefixes of each literal run (near
    misses at every position), the literals in order without the last one, and runs of the characters
    that classes like `[\\d.]+`, `\\s+`, `\\S+` and `.*` take, between literals."""
    runs = _literals(pattern)
    out = []
    for run in runs:
        for cut in {1, len(run) // 2, len(run) - 1} - {0}:
            out.append(_fill(run[:cut]))
        out.append(_fill(run + " "))
    joined = " ".join(runs)
    out.append(_fill(joined[:-1] + " "))
    out.append(joined[:-1] + _fill("1"))
    for filler in ("1", "1.", " ", "a", "(", "[", "=", "\t", "1,"):
        out.append(_fill(runs[0] + filler * 64))
        out.append(runs[0] + _fill(filler))
        if len(runs) > 1:
            out.append(_fill(runs[0] + filler * 16 + runs[1][:-1]))
    return [s[:ADVERSARIAL_SIZE] for s in out]


PLAIN = _fill("the quick brown fox jumps over the lazy dog 0123456789 ")


@contextmanager
def _time_limit(seconds: float, what: str) -> Iterator[None]:
    """Interrupt a runaway match: the regex engine checks for signals while it backtracks."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} still running after {seconds} s: catastrophic backtracking")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _best_ns(pattern: re.Pattern[str], text: str, how: str, runs: int = 3) -> int:
    call = pattern.match if how == "match" else pattern.search
    best = None
    for _ in range(runs):
        started = time.perf_counter_ns()
        call(text)
        took = time.perf_counter_ns() - started
        best = took if best is None else min(best, took)
    assert best is not None
    return best


@dataclass(frozen=True)
class Pattern:
    where: str
    pattern: re.Pattern[str]
    how: str  # "search" (rules, command patterns) or "match" (the prefix)


def _patterns() -> list[Pattern]:
    out = []
    for engine, rules in GRAMMARS.items():
        if rules.prefix is not None:
            out.append(Pattern(f"{engine} prefix", rules.prefix, "match"))
        for n, rule in enumerate(rules.rules, 1):
            out.append(Pattern(f"{engine} rule {n} {rule.pattern.pattern[:50]!r}", rule.pattern, "search"))
        for n, command in enumerate(rules.commands, 1):
            out.append(Pattern(f"{engine} command {n}", command, "search"))
    return out


def test_no_grammar_regex_backtracks_catastrophically() -> None:
    one_pass = _best_ns(ONE_PASS, PLAIN, "match", runs=20)
    worst: list[tuple[float, str, str]] = []
    for item in _patterns():
        plain = max(_best_ns(item.pattern, PLAIN, item.how), one_pass)
        for text in _adversarial(item.pattern):
            with _time_limit(SINGLE_MATCH_LIMIT, item.where):
                took = _best_ns(item.pattern, text, item.how, runs=1)
            if took > BLOW_UP * plain:  # time it again before blaming it: one run can be a hiccup
                with _time_limit(SINGLE_MATCH_LIMIT, item.where):
                    took = _best_ns(item.pattern, text, item.how)
            worst.append((took / plain, item.where, text[:60]))
    worst.sort(reverse=True)
    bad = [w for w in worst if w[0] > BLOW_UP]
    assert not bad, "pathological regex times (ratio, rule, input):\n" + "\n".join(map(repr, bad[:10]))
