"""A container runtime's shim for the tests: runs a command in a cgroup and writes its output as the runtime would.

    python -m tests.container_shim --cri LOG --cgroup DIR -- ARGV...
    python -m tests.container_shim --json-file LOG --docker-config DIR --cgroup DIR [--max-size N --max-file K] -- ARGV...

`--cri`: containerd's CRI log file: `<RFC3339Nano> <stream> <P|F> <content>`, a line cut into P records of
16 KiB and an F record for its rest; the file is reopened at its path on SIGUSR1, as containerd does when
kubelet calls ReopenContainerLog after renaming it away (writes go to the renamed file until then).
`--journald SOCKET --name NAME --id ID`: Docker's journald driver: each line a journal entry sent by "dockerd"
(this process names itself so) with CONTAINER_NAME, CONTAINER_ID, CONTAINER_ID_FULL, PRIORITY.
`--json-file`: Docker's json-file driver, `{"log":"…\\n","stream":"stdout","time":"…"}` (a 16 KiB part of a
longer line without its newline), rotated by size as dockerd does (`-json.log` → `.1` → `.2` …), and the
container's state in DIR/config.v2.json (running, pid, StartedAt; at the end FinishedAt and ExitCode), as
dockerd keeps it. The command's stdout and stderr are pipes read here; its processes are in `--cgroup`.
The shim exits with the command's status once its output ends.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

MAX_LINE = 16 * 1024  # containerd's max_container_log_line_size and Docker's copier buffer


def rfc3339nano(ns: int, fixed: bool) -> str:
    """Go's time.RFC3339Nano in UTC (containerd: trailing zeros trimmed) or Docker's fixed nine digits."""
    seconds, fraction = divmod(ns, 10**9)
    base = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}"
    if not fixed:
        digits = digits.rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


class CriLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self.asked = False
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "asked", True))

    def reopen(self) -> None:
        """ReopenContainerLog: a new file at the path; the renamed one gets nothing more."""
        if self.asked:
            self.asked = False
            old, self.fd = self.fd, os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            os.close(old)

    def write(self, stream: str, content: bytes, partial: bool) -> None:
        head = f"{rfc3339nano(time.time_ns(), fixed=False)} {stream} {'P' if partial else 'F'} ".encode()
        os.write(self.fd, head + content + b"\n")  # one write per record, as containerd's writer


class JsonFileLog:
    def __init__(self, path: Path, max_size: int, max_file: int) -> None:
        self.path, self.max_size, self.max_file = path, max_size, max_file
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self.size = os.fstat(self.fd).st_size

    def write(self, stream: str, content: bytes, partial: bool) -> None:
        log = content.decode("utf-8", "replace") + ("" if partial else "\n")
        record = json.dumps({"log": log, "stream": stream, "time": rfc3339nano(time.time_ns(), fixed=True)},
                            separators=(",", ":")).encode() + b"\n"
        if self.max_size and self.size + len(record) > self.max_size:
            self._rotate()
        os.write(self.fd, record)
        self.size += len(record)

    def _rotate(self) -> None:
        """dockerd's loggerutils rotate: shift the numbered files up, the current one becomes .1."""
        os.close(self.fd)
        for n in range(self.max_file - 1, 1, -1):
            older = Path(f"{self.path}.{n - 1}")
            if older.exists():
                os.replace(older, f"{self.path}.{n}")
        os.replace(self.path, f"{self.path}.1")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)
        self.size = 0


class JournaldLog:
    """Docker's journald driver: one native-protocol datagram per line, from a process called dockerd."""

    def __init__(self, socket_path: Path, name: str, container_id: str) -> None:
        import ctypes
        import socket

        ctypes.CDLL(None, use_errno=True).prctl(15, b"dockerd", 0, 0, 0)  # PR_SET_NAME: journald's _COMM
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.connect(str(socket_path))
        self.fields = (f"CONTAINER_NAME={name}\nCONTAINER_ID={container_id[:12]}\nCONTAINER_ID_FULL={container_id}\n"
                       f"SYSLOG_IDENTIFIER={container_id[:12]}\n").encode()

    def write(self, stream: str, content: bytes, partial: bool) -> None:
        priority = b"PRIORITY=3\n" if stream == "stderr" else b"PRIORITY=6\n"
        message = b"MESSAGE\n" + len(content).to_bytes(8, "little") + content + b"\n"  # binary-safe form
        self.socket.send(self.fields + priority + message)


def write_state(directory: Path, **state: object) -> None:
    """dockerd's checkpoint of the container: config.v2.json, written whole and renamed into place."""
    config_path = directory / "config.v2.json"
    config = json.loads(config_path.read_text())
    config["State"].update(state)
    temporary = directory / ".config.v2.json.tmp"
    temporary.write_text(json.dumps(config))
    os.replace(temporary, config_path)


def main() -> int:
    parser = argparse.ArgumentParser()
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--cri", type=Path)
    kind.add_argument("--json-file", type=Path)
    kind.add_argument("--journald", type=Path)
    parser.add_argument("--name")
    parser.add_argument("--id")
    parser.add_argument("--cgroup", type=Path, required=True)
    parser.add_argument("--docker-config", type=Path)
    parser.add_argument("--max-size", type=int, default=0)
    parser.add_argument("--max-file", type=int, default=1)
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args()

    if args.cri:
        log = CriLog(args.cri)
    elif args.journald:
        log = JournaldLog(args.journald, args.name, args.id)
    else:
        log = JsonFileLog(args.json_file, args.max_size, args.max_file)
    procs = os.fsencode(args.cgroup / "cgroup.procs")

    def enter_cgroup() -> None:
        fd = os.open(procs, os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)

    child = subprocess.Popen(args.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             preexec_fn=enter_cgroup, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # the runtime stops the container
    if args.docker_config:
        write_state(args.docker_config, Running=True, Restarting=False, Pid=child.pid, ExitCode=0,
                    StartedAt=rfc3339nano(time.time_ns(), fixed=True))
    selector = selectors.DefaultSelector()
    # a signal wakes the loop (SIGUSR1: reopen the log now, not at the next write)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    selector.register(wake_read, selectors.EVENT_READ, None)
    buffers = {}
    for stream, pipe in (("stdout", child.stdout), ("stderr", child.stderr)):
        os.set_blocking(pipe.fileno(), False)
        selector.register(pipe, selectors.EVENT_READ, stream)
        buffers[stream] = b""
    open_streams = 2
    while open_streams:
        for key, _ in selector.select():
            stream = key.data
            if stream is None:
                os.read(wake_read, 64)
                if isinstance(log, CriLog):
                    log.reopen()
                continue
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                open_streams -= 1
                if buffers[stream]:  # the output ends inside a line: what there is, as its end
                    log.write(stream, buffers[stream], partial=False)
                continue
            buffer = buffers[stream] + chunk
            while True:
                end = buffer.find(b"\n")
                if end < 0 and len(buffer) < MAX_LINE:
                    break
                if end < 0 or end >= MAX_LINE:  # a long line: a 16 KiB part
                    log.write(stream, buffer[:MAX_LINE], partial=True)
                    buffer = buffer[MAX_LINE:]
                else:
                    log.write(stream, buffer[:end], partial=False)
                    buffer = buffer[end + 1 :]
            buffers[stream] = buffer
    status = child.wait()
    code = status if status >= 0 else 128 - status
    if args.docker_config:
        write_state(args.docker_config, Running=False, Pid=0, ExitCode=code,
                    FinishedAt=rfc3339nano(time.time_ns(), fixed=True))
    return code


if __name__ == "__main__":
    sys.exit(main())
