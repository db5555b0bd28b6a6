"""5. /metrics under attack: a scrape's latency while hostile clients hold the server, against the same
server quiet.

The server is the agent's own (exporter.shell.http) in this process, rendering the exposition of the
tests' hand-made snapshot (tests/test_golden.py: five units, two GPUs), with basic auth whose bcrypt
hash has cost 11 (a tenth of a second or more a check, as htpasswd -B makes them). A scrape is a GET on
a new connection with the right password, which the server checked once and remembers, timed by the
client from connect to the last byte. Three runs of the same number of scrapes:

- quiet: nothing else (the reference);
- password guessing: another process keeps 50 connections sending wrong passwords for the same user, each
  answered (401) or refused (503) and sent again, so that the one bcrypt thread is always busy;
- held connections: 256 connections that never finish their request head (slowloris) and 256 that
  send nothing, all held open for the whole run (the server drops them only after 10 s, or past 512).

Figure: p50 and p99 of each attacked run; ratio = attacked p99 / quiet p99. Goal: p99 under 100 ms,
the bound the design sets for /metrics while NVML hangs.
"""

from __future__ import annotations

import base64
import multiprocessing
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path

import bcrypt

from bench.common import Row, percentile, say
from exporter.shell import webconfig
from exporter.shell.exposition import Exposition
from exporter.shell.http import Server, make_app, serve

PASSWORD = b"s3cret-scrape"
GUESSERS, HELD = 50, 256


def _server(folder: Path) -> Server:
    from tests.test_golden import SNAPSHOT  # the hand-made snapshot of the golden files

    config = folder / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: {bcrypt.hashpw(PASSWORD, bcrypt.gensalt(11)).decode()}\n")
    return serve("127.0.0.1", 0, make_app(Exposition(lambda: SNAPSHOT, process=False), lambda: SNAPSHOT), webconfig.load(config))


def _request(user: str, password: bytes) -> bytes:
    token = base64.b64encode(user.encode() + b":" + password).decode()
    return f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\nConnection: close\r\n\r\n".encode()


def _scrape(port: int) -> float:
    """One remembered scrape, whole, on a new connection: seconds."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_request("alice", PASSWORD))
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    if not reply.startswith(b"HTTP/1.1 200"):
        raise OSError(f"the scrape was answered {bytes(reply[:12])!r}")
    return time.perf_counter() - started


def _guess(port: int, stop: Event) -> None:
    """One guessing client, as long as `stop` is not set (in a process of its own: the attacker's)."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(_request("alice", b"guess"))
                while sock.recv(65536):
                    pass
        except OSError:
            pass


def _guessers(port: int, stop: Event) -> None:
    threads = [threading.Thread(target=_guess, args=(port, stop), daemon=True) for _ in range(GUESSERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@contextmanager
def _guessing(port: int) -> Iterator[None]:
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    attacker = context.Process(target=_guessers, args=(port, stop), daemon=True)
    attacker.start()
    try:
        time.sleep(2.0)  # started, and the bcrypt queue is full
        yield
    finally:
        stop.set()
        attacker.join(timeout=40)
        if attacker.is_alive():
            attacker.kill()


@contextmanager
def _held(port: int) -> Iterator[None]:
    sockets = []
    try:
        for i in range(2 * HELD):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
            sockets.append(sock)
        yield
    finally:
        for sock in sockets:
            sock.close()


def _measure(port: int, count: int, attack: Callable[[int], object] | None) -> list[float]:
    if attack is None:
        return [_scrape(port) for _ in range(count)]
    with attack(port):  # type: ignore[attr-defined]
        return [_scrape(port) for _ in range(count)]


def run(count: int = 200) -> list[Row]:
    say(f"== 5. /metrics under attack: {count} remembered scrapes, quiet, while {GUESSERS} clients guess "
        f"passwords, and while {2 * HELD} connections are held ==")
    with tempfile.TemporaryDirectory(prefix="llmstartup-bench-") as folder:
        server = _server(Path(folder))
        try:
            _scrape(server.port)  # bcrypt once: from now on the password is remembered
            quiet = _measure(server.port, count, None)
            runs = {"password guessing": _measure(server.port, count, _guessing),
                    "held connections": _measure(server.port, count, _held)}
        finally:
            server.close()
    q50, q99 = percentile(quiet, 0.5) * 1e3, percentile(quiet, 0.99) * 1e3
    say(f"{'':30s}{'p50 ms':>8s}{'p99 ms':>8s}{'max ms':>8s}")
    say(f"{'quiet':30s}{q50:8.2f}{q99:8.2f}{max(quiet) * 1e3:8.2f}")
    rows = []
    for name, took in runs.items():
        p50, p99 = percentile(took, 0.5) * 1e3, percentile(took, 0.99) * 1e3
        say(f"{name:30s}{p50:8.2f}{p99:8.2f}{max(took) * 1e3:8.2f}")
        rows.append(Row(f"/metrics p50 / p99, ms, during {name}", f"{p50:.2f} / {p99:.2f}",
                        f"{q50:.2f} / {q99:.2f} (quiet)", f"{p99 / q99:.2f}x", "p99 < 100 ms", p99 < 100.0))
    say()
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
