"""exporter.core.formats and exporter.sources.journal_file against real saved logs of every format.

The journal samples in tests/formats/ are real journalctl output (systemd 252), made once as root:
a private journald namespace (`exporter.shell.demo.sandbox`) ran a unit `vllm.service` that printed
vLLM lines, a `\\r` progress bar, invalid UTF-8, ANSI colour and a line over 4 KiB, plus one
native-protocol entry with newlines in MESSAGE. PID 1's lifecycle entries and a kernel Xid entry,
which only PID 1 and the kernel can write, were added to the namespace's entries with
systemd-journal-remote (export format in, journal file out). Then `TZ=UTC journalctl --file … -o`
json, export, short -a (vllm.short), short (vllm-noall.short), short-iso -a and short-precise -a.
vllm.journal.gz is the namespace's own journal file, copied while its journald was stopped.
rollover.short, vllm.docker and the engines' plain logs are written by hand in each engine's format;
vllm.cri (containerd's CRI log file) and vllm.docker-json (Docker's json-file log) hold vllm.docker's lines in
those runtimes' formats, plus a 40 KiB line cut into 16 KiB parts and a stderr line among the parts.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import secrets
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from exporter.core import formats
from exporter.core.entries import FIELDS, MessageId
from exporter.core.formats import Format, entries
from exporter.core.formats.short import lifecycle_fields
from exporter.core.lines import clean_records
from exporter.core.model import Lifecycle, LogLine, XidError
from exporter.core.entries import to_observations
from exporter.sources.journal_file import is_journal_file, read_journal_file
from tests.needs import missing

FIXTURES = Path(__file__).parent / "formats"
UTC = timezone.utc
UNIT = "vllm.service"
UNITS = frozenset({UNIT})
JOURNAL_SAMPLES = 22  # entries in vllm.json / vllm.export / the short samples
NAMESPACE_ENTRIES = 14  # entries in vllm.journal.gz


def split(data: bytes) -> list[bytes]:
    """Lines as iterating a binary file gives them: split at \\n only, terminators kept."""
    return list(io.BytesIO(data))


def sample(name: str) -> list[bytes]:
    return split((FIXTURES / name).read_bytes())


def parse(name: str, fmt: Format | None = None, *, year: int = 2026, unit: str = "") -> list[tuple]:
    lines = sample(name)
    return list(entries(lines, fmt or formats.detect(lines[:20]), unit=unit, year=year, tz=UTC))


def at(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def raw(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def reference() -> list[tuple]:
    """The export sample: every field complete (json shows a long binary MESSAGE as null)."""
    return parse("vllm.export")


# --- detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("vllm.json", Format.JOURNAL_JSON),
        ("vllm.export", Format.JOURNAL_EXPORT),
        ("vllm.short", Format.SHORT),
        ("vllm-noall.short", Format.SHORT),
        ("rollover.short", Format.SHORT),
        ("vllm.short-iso", Format.SHORT_ISO),
        ("vllm.short-precise", Format.SHORT_PRECISE),
        ("vllm.docker", Format.DOCKER),
        ("vllm.cri", Format.CRI),
        ("vllm.docker-json", Format.DOCKER_JSON),
        ("vllm.log", Format.PLAIN),
        ("sglang.log", Format.PLAIN),
        ("tgi.log", Format.PLAIN),
        ("ollama.log", Format.PLAIN),
        ("llamacpp.log", Format.PLAIN),
        ("triton.log", Format.PLAIN),
    ],
)
def test_detect_samples(name: str, fmt: Format) -> None:
    assert formats.detect(sample(name)[:10]) is fmt


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        pytest.param([], Format.PLAIN, id="empty"),
        pytest.param([b"\n", b"  \r\n"], Format.PLAIN, id="blank lines"),
        pytest.param([bytes(random.Random(1).randrange(256) for _ in range(300))], Format.PLAIN, id="binary"),
        pytest.param(
            [b"2026-11-29T12:00:01.118245123Z 2026-11-29T12:00:01.118245Z  INFO text_generation_launcher: Args {\n"],
            Format.DOCKER,
            id="docker logs -t of TGI (9 digits)",
        ),
        pytest.param(
            [b"2026-11-29T12:00:01.123456+00:00 gpu-node-7 vllm[4711]: INFO 11-29 12:00:01 [core.py:1] x\n"],
            Format.SHORT_ISO,
            id="rsyslog RFC 3339 file",
        ),
        pytest.param(
            [b"2026-11-29T12:00:01+00:00 gpu-node-7 systemd[1]: Started vllm.service - vLLM.\n"],
            Format.SHORT_ISO,
            id="newer journalctl short-iso",
        ),
        pytest.param(
            [b"-- Journal begins at Sun 2026-11-01 00:00:01 UTC. --\r\n", b"Nov 29 12:00:01 host vllm[2]: x\r\n"],
            Format.SHORT,
            id="short with CRLF and a header",
        ),
        pytest.param(
            [b"```\n", b"Feb 26 22:45:01 host systemd[1]: Started Ollama Service.\n",
             *[b"\xe2\x96\x91\xe2\x96\x91 Subject: A start job for unit ollama.service has finished successfully\n"] * 3,
             b"Feb 26 22:45:01 host ollama[1248]: time=2024-02-26T22:45:01.556+08:00 level=INFO msg=x\n"],
            Format.SHORT,
            id="journalctl -x in a fence: the catalog's lines and the fence do not vote",
        ),
        pytest.param(
            [b"Feb 25 17:49:00 host systemd[1]: ollama.service: Failed with result 'exit-code'.\n",
             b"-- Subject: Unit failed\n", b"-- Defined-By: systemd\n", b"-- \n",
             b"-- The unit ollama.service has entered the 'failed' state with result 'exit-code'.\n"],
            Format.SHORT,
            id="journalctl -x before systemd 246: its `-- ` catalog lines do not vote",
        ),
        pytest.param(
            [b"Jun 05 12:36:11 <ollama server> ollama[25973]: time=2025-06-05T12:36:11.452Z level=INFO msg=x\n"] * 2,
            Format.SHORT,
            id="a host a user hid behind a placeholder with a space",
        ),
        pytest.param(
            [b"2024-07-09T22:40:54.559291Z INFO text_generation_router: router/src/main.rs:352: Connected\n"] * 2,
            Format.PLAIN,
            id="TGI's line where a web page collapsed its two spaces is no short-iso `host ident:`",
        ),
        pytest.param([b"MODEL=x\n", b"PORT=8000\n"], Format.PLAIN, id="KEY=value lines are not export"),
        pytest.param(
            [b'{"timestamp":"2026-11-29T12:00:01.118245Z","level":"INFO","fields":{"message":"Args"},"target":"t"}\n'],
            Format.PLAIN,
            id="an engine's JSON log",
        ),
    ],
)
def test_detect_edges(head: list[bytes], fmt: Format) -> None:
    assert formats.detect(head) is fmt


# --- journalctl -o json / -o export ------------------------------------------------------------


def test_json_times_and_fields() -> None:
    got = parse("vllm.json")
    want = [json.loads(line) for line in sample("vllm.json")]
    assert len(got) == len(want) == JOURNAL_SAMPLES
    for (t, fields), entry in zip(got, want):
        assert t == int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        assert set(fields) == set(FIELDS) & set(entry)
        for name in ("_SYSTEMD_UNIT", "_PID", "UNIT", "MESSAGE_ID", "_SYSTEMD_INVOCATION_ID", "INVOCATION_ID"):
            assert fields.get(name) == entry.get(name)
    messages = [fields["MESSAGE"] for _, fields in got]
    binary = [m for m in messages if isinstance(m, bytes)]
    assert binary == [b"(EngineCore_DP0 pid=%d) weights: caf\xe9 \xff\xfe ok" % int(got[4][1]["_PID"])]  # not UTF-8
    texts = [m for m in messages if isinstance(m, str)]
    bar = next(m for m in texts if "Capturing CUDA graphs" in m)
    # json gives it as an array of bytes; it is valid UTF-8, so a str. Four redraws, each ending in
    # \r, but journald drops the \r just before the \n that ends the record.
    assert bar.count("\r") == 3 and not bar.endswith("\r")
    assert "Traceback (most recent call last):\n  File" in next(m for m in texts if "Traceback" in m)
    assert texts.count("") == 1  # the >4 KiB coloured config line: null without -a


def test_export_equals_json_except_nulls() -> None:
    from_json, from_export = parse("vllm.json"), reference()
    assert len(from_export) == JOURNAL_SAMPLES
    for (t1, f1), (t2, f2) in zip(from_json, from_export):
        assert t1 == t2
        if f1["MESSAGE"] == "":
            assert f2["MESSAGE"].startswith("\x1b[1;36m(EngineCore_DP0 pid=") and len(f2["MESSAGE"]) > 4096
            f2 = {**f2, "MESSAGE": ""}
        assert f1 == f2


@pytest.mark.parametrize("size", [1, 3, 8, 13, 4096, 1 << 20])
def test_export_in_any_chunks(size: int) -> None:
    data = (FIXTURES / "vllm.export").read_bytes()
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    assert list(entries(chunks, Format.JOURNAL_EXPORT, year=2026)) == reference()


def test_export_cut_anywhere() -> None:
    data = (FIXTURES / "vllm.export").read_bytes()
    full = reference()
    binary = data.index(b"\nMESSAGE\n") + 9  # inside a binary field's length, then its value
    for cut in [binary + 3, binary + 8, binary + 40, len(data) // 2, len(data) - 5, len(data) - 1]:
        got = list(entries(split(data[:cut]), Format.JOURNAL_EXPORT, year=2026))
        assert got[:-1] == full[: len(got) - 1]
        t, fields = got[-1]
        assert set(fields.items()) <= set(full[len(got) - 1][1].items())


def test_export_crlf_and_repeated_fields() -> None:
    text = (
        b"__CURSOR=s=1\r\n__REALTIME_TIMESTAMP=1795953601000000\r\nMESSAGE=first\r\nMESSAGE=second\r\n"
        b"_PID=42\r\n\r\n"
        b"__REALTIME_TIMESTAMP=1795953602500000\nMESSAGE\n" + (5).to_bytes(8, "little") + b"a\r\nb\xff\n\n"
    )
    assert list(entries(split(text), Format.JOURNAL_EXPORT, year=2026)) == [
        (1795953601.0, {"MESSAGE": "first", "_PID": "42"}),
        (1795953602.5, {"MESSAGE": b"a\r\nb\xff"}),
    ]


# --- journalctl short formats ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vllm.short", "vllm.short-iso", "vllm.short-precise"])
def test_short_formats_agree_with_export(name: str) -> None:
    got = parse(name)
    want = reference()
    assert len(got) == len(want) == JOURNAL_SAMPLES
    for (t, fields), (wt, wfields) in zip(got, want):
        # short formats print _SOURCE_REALTIME_TIMESTAMP when there is one: PID 1's is a few µs
        # before the journal's own time; short and short-iso print whole seconds.
        if name.endswith("precise"):
            assert abs(t - wt) < 1e-3
        else:
            assert t == int(t) and -1e-3 < wt - t < 1.0
        assert "_SYSTEMD_UNIT" not in fields
        assert fields["MESSAGE"] == wfields["MESSAGE"]  # \r, colour, invalid UTF-8, newlines: all kept
        assert fields["SYSLOG_IDENTIFIER"] == wfields["SYSLOG_IDENTIFIER"]
        assert fields.get("_PID") == (None if wfields["_TRANSPORT"] == "kernel" else wfields["_PID"])
        if fields.get("_PID") == "1":
            for key in ("MESSAGE_ID", "UNIT", "UNIT_RESULT"):
                assert fields.get(key) == wfields.get(key), key
        else:
            assert "MESSAGE_ID" not in fields
        assert (fields.get("_TRANSPORT") == "kernel") == (wfields["_TRANSPORT"] == "kernel")


def test_short_joins_continuation_lines() -> None:
    message = 'Traceback (most recent call last):\n  File "/app/serve.py", line 9, in <module>\nRuntimeError: CUDA error: out of memory'
    for name in ("vllm.short", "vllm.short-iso", "vllm.short-precise", "vllm-noall.short"):
        assert sum(fields["MESSAGE"] == message for _, fields in parse(name)) == 1, name


def test_short_without_all_loses_binary_messages() -> None:
    """Without -a, journalctl prints "[N blob data]" for a MESSAGE with \\r or invalid UTF-8."""
    got, want = parse("vllm-noall.short"), reference()
    blobs = [(f["MESSAGE"], w["MESSAGE"]) for (_, f), (_, w) in zip(got, want) if f["MESSAGE"] != w["MESSAGE"]]
    assert [b for b, _ in blobs][-2:] == ["[519B blob data]", "[46B blob data]"]
    assert all(re.fullmatch(r"\[\d+B blob data\]", b) or "\x1b" in w for b, w in blobs)


def _observations(pairs: list[tuple], units_by_identifier: bool) -> list:
    out = []
    for t, fields in pairs:
        if units_by_identifier and fields.get("SYSLOG_IDENTIFIER") == "vllm":
            fields = {**fields, "_SYSTEMD_UNIT": UNIT}  # the caller's job for the short formats
        for obs in to_observations(fields, t, UNITS):
            if isinstance(obs, LogLine):
                out.append(("line", obs.unit, obs.text))
            elif isinstance(obs, Lifecycle):
                out.append(("lifecycle", obs.unit, obs.event, obs.detail))
            else:
                assert isinstance(obs, XidError)
                out.append(("xid", obs.gpu, obs.xid))
    return out


def test_every_journal_format_gives_the_same_observations() -> None:
    want = _observations(reference(), units_by_identifier=False)
    kinds = [o[0] for o in want]
    assert kinds.count("lifecycle") == 5 and kinds.count("xid") == 1 and kinds.count("line") > 10
    for name in ("vllm.short", "vllm.short-iso", "vllm.short-precise"):
        assert _observations(parse(name), units_by_identifier=True) == want, name


def test_rollover_short() -> None:
    got = parse("rollover.short", year=2026)
    times = [t for t, _ in got]
    assert len(got) == 16  # the two "-- … --" lines are not entries
    assert times[0] == at(2026, 12, 31, 23, 58, 2)
    assert times[4] == at(2027, 1, 1, 0, 3, 17)
    assert times[-1] == at(2027, 1, 1, 0, 9, 40)
    assert times == sorted(times)
    by_message = {fields["MESSAGE"]: fields for _, fields in got}
    # old systemd names the unit by its Description only: the event is known, the unit is not
    assert by_message["Started vLLM OpenAI server."] == {
        "SYSLOG_IDENTIFIER": "systemd",
        "_PID": "1",
        "MESSAGE": "Started vLLM OpenAI server.",
        "MESSAGE_ID": MessageId.UNIT_STARTED,
    }
    assert by_message["vllm.service: Failed with result 'exit-code'."]["UNIT_RESULT"] == "exit-code"
    xid = next(f for _, f in got if f["SYSLOG_IDENTIFIER"] == "kernel")
    assert to_observations(xid, 1.0, UNITS) == [XidError(1.0, "0000:3b:00", 79, "kernel")]
    # with the unit named, PID 1's text lines become lifecycle observations
    events = [o for t, f in got for o in to_observations(f, t, UNITS)]
    assert [(o.event.name, o.detail) for o in events if isinstance(o, Lifecycle)] == [
        ("EXITED", "exited/1/FAILURE"),
        ("FAILED", "exit-code"),
        ("RESTART_SCHEDULED", ""),
    ]


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        pytest.param(
            ["Dec 31 23:59:59", "Jan 01 00:00:01"], [(2026, 12, 31, 23, 59, 59), (2027, 1, 1, 0, 0, 1)], id="new year"
        ),
        pytest.param(
            ["Jan 01 00:00:01", "Dec 31 23:59:58", "Jan 01 00:00:02"],
            [(2026, 1, 1, 0, 0, 1), (2025, 12, 31, 23, 59, 58), (2026, 1, 1, 0, 0, 2)],
            id="a late line from before New Year",
        ),
        pytest.param(
            ["Jan 05 10:00:00", "Dec 20 10:00:00"], [(2026, 1, 5, 10, 0, 0), (2026, 12, 20, 10, 0, 0)], id="long gap"
        ),
        pytest.param(
            ["Dec 30 10:00:00", "Mar 02 10:00:00", "Dec 30 10:00:00"],
            [(2026, 12, 30, 10, 0, 0), (2027, 3, 2, 10, 0, 0), (2027, 12, 30, 10, 0, 0)],
            id="over two years",
        ),
        pytest.param(["Feb 29 10:00:00", "Mar 01 10:00:00"], [None, (2026, 3, 1, 10, 0, 0)], id="no Feb 29"),
        pytest.param(["Nov  9 08:00:00"], [(2026, 11, 9, 8, 0, 0)], id="syslog's space-padded day"),
        pytest.param(["Nov 29 25:61:00"], [None], id="impossible time"),
    ],
)
def test_no_year_dates(lines: list[str], want: list[tuple | None]) -> None:
    data = [f"{line} host vllm[7]: x\n".encode() for line in lines]
    got = [t for t, _ in entries(data, Format.SHORT, year=2026, tz=UTC)]
    assert got == [at(*w) if w else None for w in want]


def test_naive_times_are_local_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "XYZ+05")  # POSIX: five hours behind UTC, no tzdata needed
    time.tzset()
    try:
        line = [b"Nov 29 12:00:01 host vllm[7]: INFO 11-29 12:00:01 [core.py:1] x\n"]
        assert [t for t, _ in entries(line, Format.SHORT, year=2026)] == [at(2026, 11, 29, 17, 0, 1)]
        assert [t for t, _ in entries([line[0][30:]], Format.PLAIN, year=2026)] == [at(2026, 11, 29, 17, 0, 1)]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_yearless_dates_take_the_year_the_log_prints_elsewhere() -> None:
    """SGLang's processes print vLLM's yearless `MM-DD` as they start, then their own full dates: one
    year for both, whatever the year the caller guessed (the file's), or the start lasts minus a year."""
    log = [b"INFO 03-07 09:19:58 __init__.py:190] Automatically detected platform cuda.\n",
           b"[2025-03-07 09:25:12 TP0] Capture cuda graph begin. This can take up to several minutes.\n"]
    assert [t for t, _ in entries(log, Format.PLAIN, year=2026, tz=UTC)] == [
        at(2025, 3, 7, 9, 19, 58), at(2025, 3, 7, 9, 25, 12)]


def test_naive_times_take_the_zone_the_log_prints_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ollama's Go `log` prints its first line without a zone, slog the rest with one: one clock, not six
    hours apart, on a machine in any zone. A zone given (`tz`) still wins."""
    monkeypatch.setenv("TZ", "XYZ+05")
    time.tzset()
    try:
        log = [b"2025/02/16 20:51:57 routes.go:1186: INFO server config env=\"map[]\"\n",
               b'time=2025-02-16T20:51:57.943-06:00 level=INFO source=routes.go:1237 msg="Listening on 127.0.0.1:11434"\n']
        assert [t for t, _ in entries(log, Format.PLAIN, year=2025)] == [
            at(2025, 2, 17, 2, 51, 57), at(2025, 2, 17, 2, 51, 57) + 0.943]
        [(given, _), _] = entries(log, Format.PLAIN, year=2025, tz=UTC)
        assert given == at(2025, 2, 16, 20, 51, 57)
    finally:
        monkeypatch.undo()
        time.tzset()


# --- docker logs -t ------------------------------------------------------------------------------


def test_docker() -> None:
    got = parse("vllm.docker", unit=UNIT)
    assert len(got) == 8  # the line with nothing after its timestamp is no entry
    assert got[0] == (
        pytest.approx(at(2026, 11, 29, 12, 0, 1) + 0.482913617, abs=1e-6),
        {"MESSAGE": "INFO 11-29 12:00:01 [__init__.py:216] Automatically detected platform cuda.", "_SYSTEMD_UNIT": UNIT},
    )
    assert [len(clean_records(f["MESSAGE"])) for _, f in got].count(2) == 1  # the \r bar, two redraws
    # `docker run -t` writes CRLF into the log; the result is the same
    crlf = [line.replace(b"\n", b"\r\n") for line in sample("vllm.docker")]
    assert list(entries(crlf, Format.DOCKER, unit=UNIT, year=2026)) == got


# --- plain engine output -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count", "untimed", "first", "last"),
    [
        ("vllm.log", 17, 7, (2026, 12, 31, 23, 58, 9), (2027, 1, 1, 0, 5, 4)),
        ("sglang.log", 21, 4, (2026, 11, 29, 12, 0, 1), (2026, 11, 29, 12, 0, 24)),
        ("tgi.log", 19, 5, (2026, 11, 29, 12, 0, 1, 118245), (2026, 11, 29, 12, 0, 27, 925232)),
        ("ollama.log", 10, 2, (2026, 11, 29, 12, 0, 1, 493000), (2026, 11, 29, 12, 0, 38, 129000)),
        ("llamacpp.log", 18, 18, None, None),
        ("triton.log", 9, 2, (2026, 11, 29, 12, 0, 1, 563733), (2026, 11, 29, 12, 0, 9, 160037)),
    ],
)
def test_plain_engines(name: str, count: int, untimed: int, first: tuple | None, last: tuple | None) -> None:
    got = parse(name, unit=UNIT)
    lines = [line.rstrip(b"\r\n") for line in sample(name) if line.strip()]
    assert len(got) == count == len(lines)
    assert [raw(f["MESSAGE"]) for _, f in got] == lines  # the whole line, as the journal would hold it
    assert all(f["_SYSTEMD_UNIT"] == UNIT for _, f in got)
    times = [t for t, _ in got]
    assert times.count(None) == untimed
    timed = [t for t in times if t is not None]
    if first:
        assert timed[0] == pytest.approx(at(*first), abs=1e-6)
        assert timed[-1] == pytest.approx(at(*last), abs=1e-6)
        assert timed == sorted(timed) or name == "sglang.log"  # SGLang's .msecs come and go


def test_plain_vllm_details() -> None:
    got = parse("vllm.log", unit=UNIT)
    coloured = got[3][1]["MESSAGE"]
    assert coloured.startswith("\x1b[1;36m(EngineCore_0 pid=48377)\x1b[0;0m INFO 12-31 23:58:31")
    assert got[3][0] == at(2026, 12, 31, 23, 58, 31)  # read through the colour
    bar = got[8][1]["MESSAGE"]
    assert bar.count("\r") == 2 and len(clean_records(bar)) == 3
    assert got[9][1]["MESSAGE"].endswith("EngineCore failed to start.")  # "\r\n" ends the line
    assert got[15][0] == at(2027, 1, 1, 0, 5, 3) + 0.112374421  # torch's c10 glog line


@pytest.mark.parametrize(
    ("line", "want"),
    [
        pytest.param(b"INFO 08-31 09:50:46 pynccl.py:63] vLLM is using nccl==2.20.5", (2026, 8, 31, 9, 50, 46), id="vllm<=0.6"),
        pytest.param(b"(RayWorkerWrapper pid=3131, ip=10.0.0.2) INFO 11-29 12:00:01 [worker.py:1] x", (2026, 11, 29, 12, 0, 1), id="vllm ray tag"),
        pytest.param(b"[rank1]: ERROR 11-29 12:00:01 [core.py:1] x", (2026, 11, 29, 12, 0, 1), id="vllm rank prefix"),
        pytest.param(b"WARNING 11-29 12:00:01.250 [core.py:1] x", (2026, 11, 29, 12, 0, 1, 250000), id="vllm msecs"),
        pytest.param(b"[2026-11-29 12:00:20 PP0 TP3 EP1] Load weight begin.", (2026, 11, 29, 12, 0, 20), id="sglang ranks"),
        pytest.param(b"[2026-11-29 12:00:20.5] INFO server_args.py:1565: x", (2026, 11, 29, 12, 0, 20, 500000), id="sglang msecs"),
        pytest.param(b"2026-11-29 12:00:01,123 - root - INFO - x", (2026, 11, 29, 12, 0, 1, 123000), id="python asctime"),
        pytest.param(b"time=2026-11-29T05:00:01.5-07:00 level=INFO msg=x", (2026, 11, 29, 12, 0, 1, 500000), id="ollama offset"),
        pytest.param(b"2023/12/15 15:33:10 routes.go:871: Listening on 127.0.0.1:11434", (2023, 12, 15, 15, 33, 10), id="old ollama"),
        pytest.param(b"[11/29/2026-12:00:01] [TRT-LLM] [I] max_seq_len=4096", (2026, 11, 29, 12, 0, 1), id="trtllm-serve"),
        pytest.param(b'{"timestamp":"2026-11-29T12:00:01.5Z","level":"INFO","fields":{"message":"x"}}', (2026, 11, 29, 12, 0, 1, 500000), id="tgi json"),
        pytest.param(b"E1129 12:00:01.000001 77 server.cc:1] x", (2026, 11, 29, 12, 0, 1, 1), id="glog"),
        pytest.param(b"0.00.035.060 I build: 6188 (21c17b5b)", None, id="llama.cpp uptime stamp"),
        pytest.param(b"  File \"/app/x.py\", line 1, in <module>", None, id="traceback"),
        pytest.param(b"INFO:     Application startup complete.", None, id="bare uvicorn"),
        pytest.param(b"INFO 13-45 12:00:01 [x.py:1] bad date", None, id="impossible date"),
        pytest.param(b"Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:40<00:00, 10.00s/it]\rINFO 11-29 "
                     b"12:00:50 [loader.py:447] Loading weights took 45.00 seconds", (2026, 11, 29, 12, 0, 50),
                     id="a dated line glued on after a bar's redraws"),
        pytest.param(b"Capturing batches (bs=1):   0%|          | 0/35 [00:00<?, ?it/s]\rCapturing batches (bs=1): 100%|"
                     b"##########| 35/35 [00:10<00:00]", None, id="a bar's redraws alone"),
        pytest.param(b"INFO 11-29 12:00:01 [x.py:1] first\rINFO 11-29 12:00:50 [x.py:1] second", (2026, 11, 29, 12, 0, 1),
                     id="a dated line's own time first"),
    ],
)
def test_plain_timestamps(line: bytes, want: tuple | None) -> None:
    [(t, fields)] = entries([line + b"\n"], Format.PLAIN, year=2026, tz=UTC)
    assert t == (pytest.approx(at(*want), abs=1e-6) if want else None)
    assert fields == {"MESSAGE": line.decode()}


def test_plain_invalid_utf8_stays_bytes() -> None:
    [(t, fields)] = entries([b"ggml \xe9\xff\r"], Format.PLAIN, unit=UNIT, year=2026)
    assert fields == {"MESSAGE": b"ggml \xe9\xff\r", "_SYSTEMD_UNIT": UNIT}


# --- damaged input -----------------------------------------------------------------------------

TEXT_SAMPLES = [
    "vllm.short",
    "vllm.short-iso",
    "vllm.short-precise",
    "rollover.short",
    "vllm.docker",
    "vllm.cri",
    "vllm.log",
    "sglang.log",
    "tgi.log",
    "ollama.log",
    "llamacpp.log",
    "triton.log",
]


@pytest.mark.parametrize("name", TEXT_SAMPLES)
def test_truncated_last_line(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    fmt = formats.detect(split(data)[:20])
    full = list(entries(split(data), fmt, year=2026, tz=UTC))
    last = split(data)[-1]
    cut = list(entries(split(data[: -len(last) // 2]), fmt, year=2026, tz=UTC))
    assert cut[:-1] == full[:-1]
    assert raw(full[-1][1]["MESSAGE"]).startswith(raw(cut[-1][1]["MESSAGE"]))


def test_truncated_json_line_is_dropped() -> None:
    data = (FIXTURES / "vllm.json").read_bytes()
    got = list(entries(split(data[:-100]), Format.JOURNAL_JSON, year=2026))
    assert got == parse("vllm.json")[:-1]


GARBAGE = [
    bytes(random.Random(seed).randrange(256) for _ in range(20000)) for seed in range(3)
] + [
    b"{" * 100000,
    b"[" * 100000 + b"\n",
    b'{"MESSAGE": [1, 2, 300], "__REALTIME_TIMESTAMP": "x"}\n{"MESSAGE": 5}\n[1]\n',
    b"__CURSOR=x\nMESSAGE\n\xff\xff\xff\xff\xff\xff\xff\x7f\nMESSAGE=after\n\n",
    b"__CURSOR=x\nMESSAGE\n\x05\x00",
    b"=\n==\nmessage=x\n\n\n",
    b"\x00" * 5000,
    b"x" * (1 << 20),
    b"Nov 29 12:00:01\nNov 29 12:00:01 \nDec 99 99:99:99 host a[1]: b\n   indented first\n",
    b"9999-99-99T99:99:99.9Z x\n2026-02-30T12:00:00Z y\n2026-11-29T12:00:01+99:99 z\n9999-12-31T23:59:59-23:59 w\n",
    b"2026-11-29T12:00:01+9999 host a[1]: b\ntime=2026-11-29T12:00:01+99:00 level=INFO\n",
    "\u2028Nov 29 12:00:01 h\u00e9 id\u00e9[1]: \ud800".encode("utf-8", "surrogatepass") + b"\n",
]


@pytest.mark.parametrize("data", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(data: bytes) -> None:
    formats.detect(split(data)[:20])
    for fmt in Format:
        for t, fields in entries(split(data), fmt, unit=UNIT, year=2026):
            assert t is None or isinstance(t, float)
            assert all(isinstance(v, (str, bytes)) for v in fields.values())
            to_observations(fields, t or 0.0, UNITS)


# --- PID 1's texts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "want"),
    [
        ("Starting vllm.service - vLLM OpenAI server...", {"MESSAGE_ID": MessageId.UNIT_STARTING, "UNIT": UNIT}),
        ("Starting vLLM OpenAI server...", {"MESSAGE_ID": MessageId.UNIT_STARTING}),
        ("Started vllm.service - vLLM OpenAI server.", {"MESSAGE_ID": MessageId.UNIT_STARTED, "UNIT": UNIT}),
        ("Started vllm.service.", {"MESSAGE_ID": MessageId.UNIT_STARTED, "UNIT": UNIT}),
        ("Started vLLM OpenAI server.", {"MESSAGE_ID": MessageId.UNIT_STARTED}),
        (
            r"Started vllm@qwen\x2d7b.service - vLLM qwen-7b.",
            {"MESSAGE_ID": MessageId.UNIT_STARTED, "UNIT": r"vllm@qwen\x2d7b.service"},
        ),
        (
            "vllm.service: Main process exited, code=killed, status=9/KILL",
            {"MESSAGE_ID": MessageId.UNIT_PROCESS_EXIT, "UNIT": UNIT},
        ),
        (
            "vllm.service: main process exited, code=dumped, status=11/SEGV",
            {"MESSAGE_ID": MessageId.UNIT_PROCESS_EXIT, "UNIT": UNIT},
        ),
        (
            "vllm.service: Failed with result 'oom-kill'.",
            {"MESSAGE_ID": MessageId.UNIT_FAILURE_RESULT, "UNIT": UNIT, "UNIT_RESULT": "oom-kill"},
        ),
        (
            "vllm.service: Scheduled restart job, restart counter is at 12.",
            {"MESSAGE_ID": MessageId.UNIT_RESTART_SCHEDULED, "UNIT": UNIT},
        ),
        ("vllm.service holdoff time over, scheduling restart.", {"MESSAGE_ID": MessageId.UNIT_RESTART_SCHEDULED, "UNIT": UNIT}),
        ("Stopping vllm.service - vLLM OpenAI server...", {"MESSAGE_ID": MessageId.UNIT_STOPPING, "UNIT": UNIT}),
        ("Stopped vllm.service - vLLM OpenAI server.", {"MESSAGE_ID": MessageId.UNIT_STOPPED, "UNIT": UNIT}),
        ("Stopped vLLM OpenAI server.", {"MESSAGE_ID": MessageId.UNIT_STOPPED}),
        ("vllm.service: Deactivated successfully.", {"MESSAGE_ID": MessageId.UNIT_SUCCESS, "UNIT": UNIT}),
        (
            "vllm.service: A process of this unit has been killed by the OOM killer.",
            {"MESSAGE_ID": MessageId.UNIT_OUT_OF_MEMORY, "UNIT": UNIT},
        ),
        (
            "Failed to start vllm.service - vLLM OpenAI server.",
            {"MESSAGE_ID": MessageId.UNIT_FAILED, "UNIT": UNIT},
        ),
        (
            "vllm.service: Consumed 1min 36.511s CPU time, 11.2G memory peak, 0B memory swap peak.",
            {"MESSAGE_ID": MessageId.UNIT_RESOURCES, "UNIT": UNIT},
        ),
        ("Unit vllm.service entered failed state.", {"MESSAGE_ID": MessageId.UNIT_FAILURE_RESULT, "UNIT": UNIT}),
        ("Reached target multi-user.target - Multi-User System.", None),
        ("vllm.service: Start request repeated too quickly.", None),
        ("INFO 11-29 12:00:01 [core.py:1] Started engine.", None),
        ("", None),
    ],
)
def test_lifecycle_fields(message: str, want: dict | None) -> None:
    assert lifecycle_fields(message) == want


@pytest.mark.parametrize(
    ("line", "want"),
    [
        pytest.param(b"Jan 10 22:38:08 host systemd[17836]: ollama.service: Failed at step EXEC spawning /usr/local/bin/ollama: "
                     b"Permission denied\n",
                     {"_PID": "17836", "_SYSTEMD_UNIT": "ollama.service", "MESSAGE_ID": MessageId.SPAWN_FAILED},
                     id="systemd's forked child: the step that failed, from the unit's cgroup"),
        pytest.param(b"Jan 10 22:38:08 host systemd[17836]: ollama.service: Failed to execute /usr/local/bin/ollama: "
                     b"Permission denied\n", {"_PID": "17836", "_SYSTEMD_UNIT": "ollama.service"},
                     id="its other words: the unit's own line"),
        pytest.param(b"Feb 22 06:55:53 host systemd[1643]: Started openclaw-vllm.service - OpenClaw local vLLM server.\n",
                     {"_PID": "1", "MESSAGE_ID": MessageId.UNIT_STARTED, "UNIT": "openclaw-vllm.service"},
                     id="a user manager's job line (journalctl --user): PID 1 to its units"),
        pytest.param(b"Feb 22 06:55:47 host systemd[1643]: openclaw-vllm.service: Main process exited, code=exited, "
                     b"status=1/FAILURE\n", {"_PID": "1", "MESSAGE_ID": MessageId.UNIT_PROCESS_EXIT, "UNIT": "openclaw-vllm.service"},
                     id="a user manager's unit line"),
    ],
)
def test_systemds_own_lines_besides_pid_1s(line: bytes, want: dict) -> None:
    """Who else speaks as systemd in a short format: the process it forks for a unit, in the unit's cgroup as it sets
    up the command (journald files its lines under the unit, which only the message's `unit: ` head shows), and a
    user manager, which is to its units what PID 1 is to the system's."""
    [(_, fields)] = entries([line], Format.SHORT, year=2026)
    assert {k: fields[k] for k in ("_PID", "_SYSTEMD_UNIT", "MESSAGE_ID", "UNIT") if k in fields} == want


@pytest.mark.parametrize(
    ("paste", "whole"),
    [
        pytest.param([b"> ```log\n", b"> Feb 25 17:49:00 host ollama[31]: Error: mkdir /srv: permission denied\n",
                      b">\n", b"> > Feb 25 17:49:00 host systemd[1]: ollama.service: Failed with result 'exit-code'.\n",
                      b"> ```\n"], True, id="quoted whole, a blank quoted line and a nested quote in it"),
        pytest.param([b"$ vllm serve Qwen/Qwen3-8B \\\n", b"> --tensor-parallel-size 2\n", b"INFO 11-29 12:00:01 x\n"],
                     False, id="a shell's continuation prompt is no quote of the whole"),
    ],
)
def test_a_paste_quoted_whole_reads_as_itself(paste: list[bytes], whole: bool) -> None:
    frame = formats.paste.frame(paste)
    assert (frame is not None) is whole
    if frame is not None:
        bare = [line.lstrip(b"> ") if line.strip() != b">" else b"\n" for line in paste]
        assert list(formats.paste.unframed(paste, frame)) == bare
        assert formats.detect(bare) is Format.SHORT


JOURNAL_PASTE = [b"Jun 18 10:21:37 host python[14750]: llama_context: graph nodes  = 2886\n",
                 b"  Stack trace of thread 14750:\n",
                 b"Jun 18 10:21:50 host systemd[1]: koboldai.service: Failed with result 'core-dump'.\n"]


@pytest.mark.parametrize(
    ("paste", "shared"),
    [
        pytest.param([b"    " + line for line in JOURNAL_PASTE], True, id="markdown's code block by indentation"),
        pytest.param([b">     " + line for line in JOURNAL_PASTE], True, id="a code block by indentation in a quote"),
        pytest.param([b"\t" + line for line in JOURNAL_PASTE], True, id="a tab"),
        pytest.param(JOURNAL_PASTE, False, id="a line of its own indented: no frame"),
    ],
)
def test_a_paste_indented_whole_reads_as_itself(paste: list[bytes], shared: bool) -> None:
    """The indent every line of a paste shares is the paste's, and comes off; a line's own indent beyond it stays."""
    frame = formats.paste.frame(paste)
    assert (frame is not None) is shared
    if frame is not None:
        assert list(formats.paste.unframed(paste, frame)) == JOURNAL_PASTE
        assert formats.detect(JOURNAL_PASTE) is Format.SHORT


@pytest.mark.parametrize(
    ("paste", "framed"),
    [
        pytest.param([b"9:Feb 26 17:41:22 host python3.12[409240]: ValueError: Free memory on device cuda:0\n",
                      b"67:Feb 26 17:41:24 host systemd[1669]: vllm.service: Main process exited, code=exited, status=1/FAILURE\n",
                      b"68-Feb 26 17:41:24 host systemd[1669]: vllm.service: Failed with result 'exit-code'.\n"],
                     True, id="grep -n, and its context lines"),
        pytest.param([b"     1\tFeb 26 17:41:22 host vllm[40]: INFO 02-26 17:41:22 [core.py:1] x\n"] * 2, True, id="cat -n"),
        pytest.param([b"  9. Feb 26 17:41:22 host ollama[40]: time=2024-02-26T17:41:22.5Z level=INFO msg=x\n",
                      b" 10.  \n", b" 11. Feb 26 17:41:23 host ollama[40]: time=2024-02-26T17:41:23.5Z level=INFO msg=y\n"],
                     True, id="a paste site's numbers, empty numbered lines among them"),
        pytest.param([b"12:00:01 INFO starting\n", b"12:00:02 INFO loading\n"], False, id="a time of day is no line number"),
        pytest.param([b"kserve-container Jan 26 17:41:22 host vllm[40]: x\n", b"  File \"/a.py\", line 1, in f\n",
                      b"kserve-container Jan 26 17:41:23 host vllm[40]: y\n", b"kserve-container Jan 26 17:41:24 host vllm[40]: z\n"],
                     True, id="a log viewer's column, the container's name, on every line but a traceback's frames"),
        pytest.param([b"slot launch_slot_: id  0\n", b"slot update_slots: id  0\n", b"INFO x\n"], False,
                     id="a word most lines start with is no column"),
        pytest.param([b"2026-02-26T17:41:22Z INFO x\n"] * 2, False, id="nor is a date"),
    ],
)
def test_a_pastes_line_numbers_are_its_frame(paste: list[bytes], framed: bool) -> None:
    frame = formats.paste.frame(paste)
    assert (frame is not None) is framed
    if frame is not None:
        assert formats.detect(list(formats.paste.unframed(paste, frame))) is Format.SHORT


# What a page, a terminal or a wrapper leaves around the line an engine printed (formats.paste.unframe), as
# (pasted, what the engine printed, why); replay repairs it, the live agent never does (test_journal_entries).
PASTED = [
    ('llm-api-ollama  | time=2024 level=INFO msg="Listening on [::]:11434"', 'time=2024 level=INFO msg="Listening on [::]:11434"',
     "docker compose's service prefix"),
    ("> main: couldn't bind HTTP server socket", "main: couldn't bind HTTP server socket", "a markdown quote"),
    (">   | [2024-09-05T00:38:34Z] INFO:     Application startup complete.",
     "[2024-09-05T00:38:34Z] INFO:     Application startup complete.", "a quoted table's pipe"),
    ("│ INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512      │",
     "INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512", "a terminal's box"),
    ("(RayWorkerWrapper pid=1, ip=10.2.0.6) INFO 03-27 [worker.py:267] Memory profiling takes 4.26 seconds [repeated 30x across cluster]",
     "(RayWorkerWrapper pid=1, ip=10.2.0.6) INFO 03-27 [worker.py:267] Memory profiling takes 4.26 seconds", "Ray's dedup suffix"),
    ("Graph capturing finished in **17 secs**, took **0.55** GiB", "Graph capturing finished in 17 secs, took 0.55 GiB",
     "markdown emphasis"),
    ("    await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
     "    await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)", "Python's own ** stays"),
    ("#033[2m2024-04-18T22:45:31Z#033[0m #033[32m INFO#033[0m router: Connected", "2024-04-18T22:45:31Z  INFO router: Connected",
     "CloudWatch's escaped colours"),
    ("[1;36m(VllmWorker rank=0 pid=226)[0;0m INFO loading", "(VllmWorker rank=0 pid=226) INFO loading",
     "colours that lost their ESC"),
    ("INFO text_generation_router: router/src/[main.rs:329:](http://main.rs/x) Connected",
     "INFO text_generation_router: router/src/main.rs:329: Connected", "a link a forum made of a file name"),
    ("[[2025-11-19 14](tel:2025-11-19 14):41:27] INFO:     Started server process [1]",
     "[2025-11-19 14:41:27] INFO:     Started server process [1]", "a phone's tel: link around a date and hour"),
    ("`2024-09-23T12:00:00Z INFO x`", "2024-09-23T12:00:00Z INFO x", "stray backticks"),
    ("(EngineCore_DP0 pid=2827) We recommend installing via `pip install torch-c-dlpack-ext`",
     "(EngineCore_DP0 pid=2827) We recommend installing via `pip install torch-c-dlpack-ext`", "a code span's pair stays"),
    ("| Model | Version | Status |", "| Model | Version | Status |", "Triton's own table stays"),
    ("Loading safetensors checkpoint shards:  16% Completed | 6/37 [00:01<00:07,  3.95it/s]",
     "Loading safetensors checkpoint shards:  16% Completed | 6/37 [00:01<00:07,  3.95it/s]", "a bar's own pipe stays"),
]


@pytest.mark.parametrize(("pasted", "printed"), [pytest.param(pasted, printed, id=why) for pasted, printed, why in PASTED])
def test_replay_repairs_what_a_paste_did_to_a_line(pasted: str, printed: str) -> None:
    [(_, fields)] = formats.read([], [pasted.encode() + b"\n"], unit=UNIT, year=2026)
    assert fields["MESSAGE"] == printed


def test_lifecycle_only_from_pid_1() -> None:
    line = b"Nov 29 12:00:01 host vllm[4242]: Started vllm.service - vLLM.\n"
    [(_, fields)] = entries([line], Format.SHORT, year=2026)
    assert "MESSAGE_ID" not in fields and "UNIT" not in fields


# --- journal files ----------------------------------------------------------------------------


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    path = tmp_path / "system.journal"
    path.write_bytes(gzip.decompress((FIXTURES / "vllm.journal.gz").read_bytes()))
    return path


def test_is_journal_file(journal_file: Path) -> None:
    assert is_journal_file(journal_file.read_bytes()[:8])
    assert not is_journal_file((FIXTURES / "vllm.export").read_bytes()[:8])
    assert not is_journal_file(b"")


def test_read_journal_file(journal_file: Path) -> None:
    got = list(read_journal_file(journal_file))
    assert len(got) == NAMESPACE_ENTRIES
    assert [t for t, _ in got] == sorted(t for t, _ in got)
    want = {t: fields for t, fields in reference()}  # the same entries, via journalctl -o export
    for t, fields in got:
        assert all(isinstance(v, bytes) for v in fields.values()) and set(fields) <= set(FIELDS)
        assert fields == {k: raw(v) for k, v in want[t].items()}
    assert sum(f.get("_SYSTEMD_UNIT") == b"vllm.service" for _, f in got) == 11  # and journald's own 3
    assert _observations(got, False) == [
        o for o in _observations(reference(), False) if o[0] == "line"
    ]


def test_read_journal_directory(journal_file: Path, tmp_path: Path) -> None:
    machine = tmp_path / "journal" / ("0123456789abcdef" * 2)
    machine.mkdir(parents=True)
    shutil.copy(journal_file, machine / "system.journal")
    assert list(read_journal_file(tmp_path / "journal")) == list(read_journal_file(journal_file))


def test_read_journal_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=re.escape(f"cannot read journal {tmp_path}/missing.journal: No such file")):
        list(read_journal_file(tmp_path / "missing.journal"))
    text = tmp_path / "saved.json"
    shutil.copy(FIXTURES / "vllm.json", text)
    with pytest.raises(OSError, match="is not a journal file"):
        list(read_journal_file(text))
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError, match="no journal files"):
        list(read_journal_file(tmp_path / "empty"))
    namespaced = tmp_path / "log" / (("0123456789abcdef" * 2) + ".llm")
    namespaced.mkdir(parents=True)
    with pytest.raises(OSError, match=r"namespace's journal has a directory of its own: 0123.*\.llm"):
        list(read_journal_file(tmp_path / "log"))


def test_read_live_namespace_directory(journald) -> None:
    """A directory journald is writing to right now: the online file reads as well."""
    from exporter.shell.demo import sandbox

    name = f"formats-{secrets.token_hex(3)}.service"
    unit = sandbox.start_unit(journald, name, ["/bin/sh", "-c", "printf 'a\\rb\\nc\\377\\n'"])
    try:
        unit.wait(10)
        directory = next(d for d in journald.journal_dirs if d.exists())
        deadline = time.monotonic() + 10
        while True:
            mine = [f for _, f in read_journal_file(directory) if f.get("_SYSTEMD_UNIT") == name.encode()]
            if len(mine) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [f["MESSAGE"] for f in mine] == [b"a\rb", b"c\xff"]
        assert mine[0]["_SYSTEMD_INVOCATION_ID"] == unit.invocation.encode()
    finally:
        unit.stop()


def test_journalctl_reads_the_fixture(journal_file: Path) -> None:
    """The fixture is a journal file journalctl itself accepts (where journalctl is installed)."""
    if shutil.which("journalctl") is None:
        missing("journalctl (Debian package systemd)")
    out = subprocess.run(
        ["journalctl", "--file", str(journal_file), "-o", "export"], capture_output=True, check=True
    ).stdout
    assert len(list(entries(split(out), Format.JOURNAL_EXPORT, year=2026))) == NAMESPACE_ENTRIES


# --- container runtimes' log files -------------------------------------------------------------


@pytest.mark.parametrize("name", ["vllm.cri", "vllm.docker-json"])
def test_container_log_files_give_docker_logs_lines_whole(name: str) -> None:
    got = parse(name, unit=UNIT)
    [args] = [f for _, f in got if "non-default args" in f["MESSAGE"]]
    [warning] = [f for _, f in got if "Flash Attention" in f["MESSAGE"]]
    # three parts, joined; the stderr line written between them apart
    assert len(args["MESSAGE"]) > 32 * 1024 and args["MESSAGE"].endswith("'alias-02499']}")
    assert warning["MESSAGE"].startswith("(EngineCore_0 pid=273) WARNING")
    others = [(t, f) for t, f in got if f is not args and f is not warning]
    assert others == parse("vllm.docker", unit=UNIT)  # the same lines, at the same times, as `docker logs -t`


@pytest.mark.parametrize(
    ("line", "want"),
    [
        pytest.param(b"2026-11-29T12:00:01.5Z stdout F x", (at(2026, 11, 29, 12, 0, 1) + 0.5, "stdout", b"x", False), id="F"),
        pytest.param(b"2026-11-29T12:00:01Z stderr P x", (at(2026, 11, 29, 12, 0, 1), "stderr", b"x", True), id="P, whole second"),
        pytest.param(b"2026-11-29T13:00:01.123456789+01:00 stdout F ", (at(2026, 11, 29, 12, 0, 1) + 0.123456789, "stdout", b"", False), id="a zone, empty line"),
        pytest.param(b"2026-11-29T12:00:01Z stdout F:x y", (at(2026, 11, 29, 12, 0, 1), "stdout", b"y", False), id="more tags"),
        pytest.param(b"2026-11-29T12:00:01Z stdin F x", None, id="no such stream"),
        pytest.param(b"INFO 11-29 12:00:01 x", None, id="not CRI"),
    ],
)
def test_cri_records(line: bytes, want: tuple | None) -> None:
    record = formats.containers.cri_record(line)
    assert (record and (pytest.approx(record.t, abs=1e-6), record.stream, record.text, record.partial)) == (
        want and (want[0], *want[1:])
    )


@pytest.mark.parametrize(
    ("line", "want"),
    [
        pytest.param(b'{"log":"x\\n","stream":"stdout","time":"2026-11-29T12:00:01.000000001Z"}', ("stdout", b"x", False), id="whole"),
        pytest.param(b'{"log":"x","stream":"stderr","time":"2026-11-29T12:00:01Z"}', ("stderr", b"x", True), id="a part"),
        pytest.param(b'{"log":"\\u00e9\\ud800\\n","stream":"stdout","time":"x"}', ("stdout", "\u00e9?".encode(), False), id="a lone surrogate, no time"),
        pytest.param(b'{"stream":"stdout"}', None, id="no log"),
        pytest.param(b'{"log":', None, id="cut"),
    ],
)
def test_docker_json_records(line: bytes, want: tuple | None) -> None:
    record = formats.containers.docker_json_record(line)
    assert (record and (record.stream, record.text, record.partial)) == want


def test_a_line_that_never_ends_is_cut_at_a_mebibyte() -> None:
    parts = [b"2026-11-29T12:00:01Z stdout P " + b"x" * 16384 + b"\n"] * 200 + [b"2026-11-29T12:00:02Z stdout F y\n"]
    got = list(entries(parts, Format.CRI, year=2026))
    assert [len(f["MESSAGE"]) for _, f in got] == [formats.containers.MAX_LINE] * 3 + [8 * 16384 + 1]
