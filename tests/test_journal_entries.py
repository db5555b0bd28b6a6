"""Journal entries → observations: which lines count, whose word is trusted, how bytes are read."""

import pytest

from exporter.core.model import Event, Lifecycle, LogLine, Suppressed, XidError
from exporter.core.entries import to_observations

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


@pytest.mark.parametrize(
    ("record", "engine_printed"),
    [
        pytest.param('llm-api-ollama  | time=2024 level=INFO msg="Listening on [::]:11434"', 'time=2024 level=INFO msg="Listening on [::]:11434"',
                     id="docker compose's service prefix"),
        pytest.param("> main: couldn't bind HTTP server socket", "main: couldn't bind HTTP server socket", id="a markdown quote"),
        pytest.param(">   | [2024-09-05T00:38:34Z] INFO:     Application startup complete.",
                     "[2024-09-05T00:38:34Z] INFO:     Application startup complete.", id="a quoted table's pipe"),
        pytest.param("│ INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512      │",
                     "INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512", id="a terminal's box"),
        pytest.param("(RayWorkerWrapper pid=1, ip=10.2.0.6) INFO 03-27 [worker.py:267] Memory profiling takes 4.26 seconds [repeated 30x across cluster]",
                     "(RayWorkerWrapper pid=1, ip=10.2.0.6) INFO 03-27 [worker.py:267] Memory profiling takes 4.26 seconds", id="Ray's dedup suffix"),
        pytest.param("Graph capturing finished in **17 secs**, took **0.55** GiB", "Graph capturing finished in 17 secs, took 0.55 GiB",
                     id="markdown emphasis"),
        pytest.param("#033[2m2024-04-18T22:45:31Z#033[0m #033[32m INFO#033[0m router: Connected", "2024-04-18T22:45:31Z  INFO router: Connected",
                     id="CloudWatch's escaped colours"),
        pytest.param("[1;36m(VllmWorker rank=0 pid=226)[0;0m INFO loading", "(VllmWorker rank=0 pid=226) INFO loading",
                     id="colours that lost their ESC"),
        pytest.param("INFO text_generation_router: router/src/[main.rs:329:](http://main.rs/x) Connected",
                     "INFO text_generation_router: router/src/main.rs:329: Connected", id="a link a forum made of a file name"),
        pytest.param("[[2025-11-19 14](tel:2025-11-19 14):41:27] INFO:     Started server process [1]",
                     "[2025-11-19 14:41:27] INFO:     Started server process [1]", id="a phone's tel: link around a date and hour"),
        pytest.param("`2024-09-23T12:00:00Z INFO x`", "2024-09-23T12:00:00Z INFO x", id="stray backticks"),
        pytest.param("| Model | Version | Status |", "| Model | Version | Status |", id="Triton's own table stays"),
        pytest.param("Loading safetensors checkpoint shards:  16% Completed | 6/37 [00:01<00:07,  3.95it/s]",
                     "Loading safetensors checkpoint shards:  16% Completed | 6/37 [00:01<00:07,  3.95it/s]", id="a bar's own pipe stays"),
    ],
)
def test_the_framing_around_a_line_is_not_the_engines(record, engine_printed):
    [line] = to_observations({"_SYSTEMD_UNIT": U, "MESSAGE": record.encode()}, 1.0, UNITS)
    assert line.text == engine_printed
