"""A real Prometheus and a real Alertmanager on loopback, with the project's rules and routes.

    from tests.prometheus_stack import prometheus_stack  # noqa: F401  (the fixture)

    def test_something(agent, units, prometheus_stack):
        port = agent(...)
        stack = prometheus_stack(f"127.0.0.1:{port}")          # Prometheus + Alertmanager + webhook
        stack.prometheus.query('llmstartup_unit_phase == 1')    # /api/v1/query: the result list
        stack.webhook.alerts()                                  # what Alertmanager delivered

`prometheus_stack(*targets, alerting=True, for_="2s", silence_seconds=None)` starts, all on 127.0.0.1:

- Prometheus (`prometheus`, Debian's 2.42) scraping the targets as job `llmstartup` every 1 s,
  evaluating every 1 s a copy of deploy/prometheus/llmstartup.rules.yml in which every `for:` is
  rewritten to `for_` (production `for:` durations are minutes) and, with `silence_seconds`,
  LLMStartupSilenceTooLong's 900 s threshold too; the other expressions, thresholds and labels are
  the file's own. `external_labels: {cluster: e2e}`;
- with `alerting=True`, Alertmanager (`prometheus-alertmanager`, 0.25, clustering off) running
  deploy/alertmanager/alertmanager.yml with its routes and inhibitions as they are, but every
  receiver sent to `webhook` (an http.server in the test that records the payloads; the URL path is
  the receiver's name) and `group_wait`/`group_interval` at 1 s.

Each waits for `/-/ready` by polling; everything started is stopped at the test's teardown. Tests
that only need to query a Prometheus (dashboard panel queries) call `prometheus_stack(target,
alerting=False)` and use `Prometheus.query` / `query_range` (or the module's `query(url, expr)`),
e.g. after `stack.prometheus.wait_for_targets_up()`. Without targets, only Alertmanager and the
webhook start (`Alertmanager.post` sends alerts as Prometheus does).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from tests.scrape import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "llmstartup.rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "llmstartup.rules.test.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
FOR_LINE = re.compile(r"^(\s+for:\s*)\S+[ \t]*$", re.MULTILINE)
SILENCE_THRESHOLD = re.compile(r"(instance_unit:llmstartup_log_silence_seconds > )900\b")


def binary(name: str) -> str:
    """The path of a Debian binary that .ci/setup installs; fails the test with the package if absent."""
    path = shutil.which(name)
    if not path:
        package = {"promtool": "prometheus", "amtool": "prometheus-alertmanager"}.get(name, name)
        pytest.fail(f"{name} not found: .ci/setup installs it (Debian package {package})")
    return path


def rules_with_short_for(dest: Path, for_: str = "2s", silence_seconds: float | None = None,
                         source: Path = RULES) -> Path:
    """Write a copy of the rules with every alert's `for:` set to `for_`; returns `dest`.

    Only the waiting changes: in production the alerts wait minutes (`for: 5m`, `10m`) before they
    fire, which an end-to-end test cannot sit through. With `silence_seconds`, the one other
    constant on that scale, LLMStartupSilenceTooLong's 900 s without a journal line, becomes that.
    Everything else is the file's own.
    """
    text = source.read_text()
    alerts = len(re.findall(r"^\s+- alert:", text, re.MULTILINE))
    shortened, n = FOR_LINE.subn(rf"\g<1>{for_}", text)
    assert n == alerts, f"{source}: {n} `for:` lines for {alerts} alerts; every alert has one"
    if silence_seconds is not None:
        shortened, n = SILENCE_THRESHOLD.subn(rf"\g<1>{silence_seconds:g}", shortened)
        assert n == 1, f"{source}: LLMStartupSilenceTooLong's threshold not found"
    dest.write_text(shortened)
    return dest


def _get_json(url: str, timeout: float = 10.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:  # Prometheus answers a bad query with 400 and a JSON error
        body = error.read().decode("utf-8", "replace")
        raise AssertionError(f"GET {url}: HTTP {error.code}: {body}") from None


def _api(base_url: str, path: str, params: dict[str, Any]) -> Any:
    answer = _get_json(f"{base_url}{path}?{urllib.parse.urlencode(params)}")
    if answer.get("status") != "success":
        raise AssertionError(f"{path} {params}: {answer}")
    return answer["data"]


def query(base_url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """Prometheus's /api/v1/query: the `result` list of an instant query (an AssertionError with
    Prometheus's message for a query it rejects). Vector results are `{"metric": {...}, "value":
    [t, "v"]}`; a scalar result is returned as a one-element list of it."""
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = _api(base_url, "/api/v1/query", params)
    return data["result"] if data["resultType"] in ("vector", "matrix") else [data["result"]]


def query_range(
    base_url: str, expr: str, start: float, end: float, step: float = 1.0
) -> list[dict[str, Any]]:
    """Prometheus's /api/v1/query_range: a list of `{"metric": {...}, "values": [[t, "v"], ...]}`."""
    data = _api(base_url, "/api/v1/query_range",
                {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    return data["result"]


class _Server:
    """A process serving HTTP on 127.0.0.1:port, ready when `/-/ready` answers 200."""

    name = "server"

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self._log_file = open(log, "wb")
        self.process = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            wait_for(self._ready, READY_TIMEOUT, f"{self.name} to answer {self.url}/-/ready")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        self._log_file.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


class Prometheus(_Server):
    name = "prometheus"

    def __init__(self, workdir: Path, targets: list[str], rule_files: list[Path],
                 alertmanager: str | None = None, external_labels: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s",
                       "external_labels": external_labels or {}},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "llmstartup", "static_configs": [{"targets": targets}]}],
        }
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        super().__init__(
            [binary("prometheus"), f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            port, workdir / "prometheus.log",
        )

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return query(self.url, expr, at)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        return query_range(self.url, expr, start, end, step)

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """/api/v1/alerts: the alerts pending or firing now (`labels`, `annotations`, `state`, `activeAt`,
        `value`), those with these label values."""
        found = _api(self.url, "/api/v1/alerts", {})["alerts"]
        return [a for a in found if all(a["labels"].get(k) == v for k, v in labels.items())]

    def wait_for(self, expr: str, timeout: float, what: str | None = None) -> list[dict[str, Any]]:
        """Poll an instant query until it returns something; its result."""
        return wait_for(lambda: self.query(expr), timeout, what or f"Prometheus to return {expr}", every=0.5)

    def wait_for_targets_up(self, timeout: float = 15.0) -> None:
        def all_up() -> bool:
            active = _api(self.url, "/api/v1/targets", {"state": "active"})["activeTargets"]
            return bool(active) and all(t["health"] == "up" for t in active)

        wait_for(all_up, timeout, "Prometheus to scrape every target successfully", every=0.5)


class Alertmanager(_Server):
    name = "alertmanager"

    def __init__(self, workdir: Path, webhook_url: str, source: Path = ALERTMANAGER_CONFIG) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(source.read_text())
        # Every receiver to the test's webhook, at /<receiver name>; the routes and inhibitions as shipped.
        config["receivers"] = [
            {"name": r["name"],
             "webhook_configs": [{"url": f"{webhook_url}/{r['name']}", "send_resolved": True}]}
            for r in config["receivers"]
        ]

        def shorten(route: dict[str, Any]) -> None:
            for key in ("group_wait", "group_interval"):
                if key in route or route is config["route"]:
                    route[key] = "1s"
            for child in route.get("routes", []):
                shorten(child)

        shorten(config["route"])
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        super().__init__(
            [binary("prometheus-alertmanager"), f"--config.file={self.config}",
             f"--storage.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--cluster.listen-address=", "--log.level=warn"],
            port, workdir / "alertmanager.log",
        )
        self.address = f"127.0.0.1:{port}"

    def post(self, alerts: list[dict[str, Any]]) -> None:
        """Send alerts as Prometheus does (POST /api/v2/alerts)."""
        request = urllib.request.Request(f"{self.url}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200, response.status

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: every alert Alertmanager holds, with `status.state` (active,
        suppressed) and `status.inhibitedBy`."""
        return _get_json(f"{self.url}/api/v2/alerts")


class Webhook:
    """An Alertmanager webhook receiver on 127.0.0.1: records every payload it is sent."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        recorded = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = json.loads(body)
                payload["_path"] = self.path
                with recorded._lock:
                    recorded.payloads.append(payload)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    def alerts(self, status: str | None = None, **labels: str) -> list[dict[str, Any]]:
        """Every alert delivered so far (each with `status`, `labels`, `annotations`, and the
        payload's `receiver`), optionally only those with this status ("firing", "resolved") and
        these label values."""
        with self._lock:
            payloads = list(self.payloads)
        return [
            {**alert, "receiver": p["receiver"]}
            for p in payloads
            for alert in p["alerts"]
            if (status is None or alert["status"] == status)
            and all(alert["labels"].get(k) == v for k, v in labels.items())
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@dataclass
class Stack:
    prometheus: Prometheus | None  # None when started without targets
    alertmanager: Alertmanager | None
    webhook: Webhook | None
    rules: Path  # the rules Prometheus loaded (the copy with short `for:`)


@pytest.fixture
def prometheus_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """`start(*targets, alerting=True, for_="2s", silence_seconds=None) -> Stack`; all of it is
    stopped at teardown (see the module's docstring and `rules_with_short_for`). Without targets
    it starts no Prometheus: Alertmanager and the webhook only."""
    stops: list[Callable[[], None]] = []

    def start(
        *targets: str, alerting: bool = True, for_: str = "2s", silence_seconds: float | None = None
    ) -> Stack:
        base = tmp_path / f"stack-{len(stops)}"
        base.mkdir()
        rules = rules_with_short_for(base / "llmstartup.rules.yml", for_, silence_seconds)
        webhook = alertmanager = None
        if alerting:
            webhook = Webhook()
            stops.append(webhook.close)
            alertmanager = Alertmanager(base / "alertmanager", webhook.url)
            stops.append(alertmanager.stop)
        prometheus = None
        if targets:
            prometheus = Prometheus(base / "prometheus", list(targets), [rules],
                                    alertmanager.address if alertmanager else None, {"cluster": "e2e"})
            stops.append(prometheus.stop)
        return Stack(prometheus, alertmanager, webhook, rules)

    yield start
    for stop in reversed(stops):
        stop()
