"""Helpers for tests that run the agent: free ports, scraping /metrics, waiting with a deadline."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Any, Callable, TypeVar

from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

# The thresholds every end-to-end test runs the agent with: short, so that a test takes seconds.
INTERVAL, SILENCE, STALL = 1.0, 4.0, 8.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


class Scrape:
    """One exposition, looked up by metric name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float | None:
        for s in self.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None

    def all(self, name: str, **labels: str) -> list:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def one_of(self, family: str, unit: str, label: str) -> str | None:
        """The label value of the series set to 1 (phase or verdict) for a unit."""
        on = [s.labels[label] for s in self.all(f"llmstartup_{family}", unit=unit) if s.value == 1]
        return on[0] if len(on) == 1 else None


def try_fetch(port: int, path: str = "/metrics") -> str | None:
    try:
        return fetch(port, path)
    except OSError:
        return None


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Watch:
    """A unit as the agent's API says, poll by poll, every document kept with the time it was read."""

    def __init__(self, port: int, unit: str) -> None:
        self.port, self.unit = port, unit
        self.seen: list[tuple[float, dict[str, Any]]] = []

    def poll(self) -> dict[str, Any]:
        doc = next(d for d in json.loads(fetch(self.port, "/api/v1/units")) if d["unit"] == self.unit)
        self.seen.append((time.monotonic(), doc))
        return doc

    def until(self, check: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        return wait_for(lambda: doc if check(doc := self.poll()) else None, timeout,
                        f"{what}; the agent said {self.said()}", every=0.25)

    def said(self, after: float = 0.0) -> list[tuple[str, str, str]]:
        """(phase, verdict, what the verdict rests on), once per change: what a failed assertion shows."""
        said = [(d["phase"], d["verdict"], d.get("verdict_reason") or "") for t, d in self.seen if t >= after]
        return [s for i, s in enumerate(said) if i == 0 or s != said[i - 1]]

    def phases(self, after: float = 0.0) -> list[str]:
        return list(dict.fromkeys(phase for phase, _, _ in self.said(after)))

    def verdicts(self, after: float = 0.0) -> set[str]:
        return {verdict for _, verdict, _ in self.said(after)}
