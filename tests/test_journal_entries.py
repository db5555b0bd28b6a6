"""Journal entries → observations: which lines count, whose word is trusted, how bytes are read."""

import pytest

from exporter.core.entries import to_observations
from exporter.core.model import Event, Lifecycle, LogLine, Suppressed, XidError
from tests.test_formats import PASTED

U = "vllm.service"
UNITS = frozenset({U})
STARTED = "39f53479d3a045ac8e11786248231fbf"
EXITED = "98e322203f7a4ed290d09fe03c09fe15"
FAILED = "d9b373ed55a64feb8242e02dbe79a49c"
SPAWN_FAILED = "641257651c1b4ec9a8624d7a40a9e1e7"


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        pytest.param(
            {"_SYSTEMD_UNIT": b"vllm.service", "MESSAGE": b"INFO hello", "_SYSTEMD_INVOCATION_ID": b"ab12"},
            [LogLine(5.0, U, "INFO hello", "ab12")],
            id="the unit's own line",
        ),
        pytest.param({"_SYSTEMD_UNIT": b"other.service", "MESSAGE": b"x"}, [], id="another unit's line"),
        pytest.param(
            {"_SYSTEMD_UNIT": U, "MESSAGE": b"\x1b[1;36m(EngineCore_DP0 pid=9)\x1b[0m bad \xff byte"},
            [LogLine(5.0, U, "(EngineCore_DP0 pid=9) bad \ufffd byte")],
            id="binary message: colour stripped, invalid UTF-8 replaced",
        ),
        pytest.param(
            {"_SYSTEMD_UNIT": U, "MESSAGE": b"Capturing: 0%|  | 0/3\rCapturing: 67%|# | 2/3\rCapturing: 100%|##| 3/3"},
            [LogLine(5.0, U, f"Capturing: {p}") for p in ("0%|  | 0/3", "67%|# | 2/3", "100%|##| 3/3")],
            id="a \\r progress bar becomes one record per redraw",
        ),
        pytest.param({"_SYSTEMD_UNIT": U, "MESSAGE": b"\r\r  \r"}, [], id="only carriage returns: nothing"),
        pytest.param(
            {"_PID": b"1", "UNIT": U, "MESSAGE_ID": STARTED, "MESSAGE": b"Started vllm.service - vLLM.", "INVOCATION_ID": b"cd34"},
            [Lifecycle(5.0, U, Event.STARTED, "", "cd34")],
            id="PID 1 started the unit",
        ),
        pytest.param(
            {"_PID": b"1", "UNIT": U, "MESSAGE_ID": EXITED,
             "MESSAGE": b"vllm.service: Main process exited, code=killed, status=9/KILL"},
            [Lifecycle(5.0, U, Event.EXITED, "killed/9/KILL")],
            id="PID 1: main process killed",
        ),
        pytest.param(
            {"_PID": b"1", "UNIT": U, "MESSAGE_ID": FAILED, "UNIT_RESULT": b"oom-kill",
             "MESSAGE": b"vllm.service: Failed with result 'oom-kill'."},
            [Lifecycle(5.0, U, Event.FAILED, "oom-kill")],
            id="PID 1: failed with a result",
        ),
        pytest.param(
            {"_PID": b"4242", "UNIT": U, "MESSAGE_ID": STARTED, "MESSAGE": b"Started vllm.service."},
            [],
            id="a local user faking PID 1's lifecycle line is ignored",
        ),
        pytest.param(
            {"_PID": b"1", "UNIT": U, "MESSAGE_ID": b"7d4958e842da4a758f6c1cdc7b36dcc5", "MESSAGE": b"Starting vllm.service..."},
            [],
            id="lifecycle lines that change nothing are skipped",
        ),
        pytest.param({"_PID": b"1", "UNIT": b"sshd.service", "MESSAGE_ID": STARTED}, [], id="PID 1 about an unwatched unit"),
        pytest.param(
            {"_PID": b"17836", "_SYSTEMD_UNIT": U, "UNIT": U, "MESSAGE_ID": SPAWN_FAILED, "_SYSTEMD_INVOCATION_ID": b"ef56",
             "MESSAGE": b"vllm.service: Failed at step EXEC spawning /opt/vllm/bin/vllm: Permission denied"},
            [Lifecycle(5.0, U, Event.SPAWN_FAILED, "EXEC", "ef56")],
            id="systemd's child, in the unit's cgroup, could not run its command",
        ),
        pytest.param(
            {"_PID": b"17836", "_SYSTEMD_UNIT": U, "MESSAGE_ID": SPAWN_FAILED,
             "MESSAGE": b"vllm.service: Executable /opt/vllm/bin/warm-cache missing, skipping: No such file or directory"},
            [LogLine(5.0, U, "vllm.service: Executable /opt/vllm/bin/warm-cache missing, skipping: No such file or directory")],
            id="the same id for an ignored command (ExecStartPre=-) that is missing: no failure",
        ),
        pytest.param(
            {"_PID": b"666", "_SYSTEMD_UNIT": b"evil.service", "UNIT": U, "MESSAGE_ID": SPAWN_FAILED,
             "MESSAGE": b"vllm.service: Failed at step EXEC spawning /opt/vllm/bin/vllm: Permission denied"},
            [],
            id="another unit's process saying so of the unit is ignored",
        ),
        pytest.param(
            {"_TRANSPORT": b"driver", "MESSAGE_ID": b"a596d6fe7bfa4994828e72309e95d61e", "N_DROPPED": b"4242",
             "OBJECT_SYSTEMD_UNIT": U, "MESSAGE": b"Suppressed 4242 messages from vllm.service"},
            [Suppressed(5.0, U, 4242)],
            id="journald dropped the unit's lines: counted",
        ),
        pytest.param(
            {"_TRANSPORT": b"journal", "MESSAGE_ID": b"a596d6fe7bfa4994828e72309e95d61e", "N_DROPPED": b"9",
             "OBJECT_SYSTEMD_UNIT": U, "MESSAGE": b"Suppressed 9 messages from vllm.service"},
            [],
            id="a suppression notice not from journald itself is ignored",
        ),
        pytest.param(
            {"_TRANSPORT": b"kernel", "MESSAGE": b"NVRM: Xid (PCI:0000:3B:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."},
            [XidError(5.0, "0000:3b:00", 79, "kernel")],
            id="the kernel's Xid line",
        ),
        pytest.param(
            {"_TRANSPORT": b"kernel", "MESSAGE": b"NVRM: Xid (0000:b3:00): 31, pid=1234, name=python3, Ch 00000008, intr 10000000. MMU Fault"},
            [XidError(5.0, "0000:b3:00", 31, "kernel")],
            id="Xid line without PCI:",
        ),
        pytest.param(
            {"_TRANSPORT": b"stdout", "_SYSTEMD_UNIT": b"evil.service", "MESSAGE": b"NVRM: Xid (PCI:0000:3b:00): 79, x"},
            [],
            id="an Xid line printed by a service is no Xid",
        ),
    ],
)
def test_to_observations(fields, want):
    assert to_observations(fields, 5.0, UNITS) == want


def test_a_burst_of_bar_redraws_is_dated_back_to_when_each_was_drawn():
    bar = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {p:3d}%|#| {n}/67 [{e}<00:00, 8.37it/s]"
    message = "\r".join(bar.format(p=p, n=n, e=e) for p, n, e in [(0, 0, "00:00"), (49, 33, "00:04"), (100, 67, "01:08")])
    lines = to_observations({"_SYSTEMD_UNIT": U, "MESSAGE": message.encode()}, 100.0, UNITS)
    assert [line.t for line in lines] == [32.0, 36.0, 100.0]


def test_a_huge_line_is_cut_before_matching():
    [line] = to_observations({"_SYSTEMD_UNIT": U, "MESSAGE": b"x" * (1 << 20)}, 1.0, UNITS)
    assert len(line.text) == 4096


# What a paste does to a line (tests/test_formats.py: PASTED), which the live agent never repairs: a unit's own
# record is read as its source gives it, colour and \r redraws aside.
@pytest.mark.parametrize("record", [pytest.param(pasted, id=why) for pasted, _, why in PASTED])
def test_the_live_path_takes_a_record_as_the_source_gives_it(record):
    [line] = to_observations({"_SYSTEMD_UNIT": U, "MESSAGE": record.encode()}, 1.0, UNITS)
    assert line.text == record
