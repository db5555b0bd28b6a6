"""End to end: agent → Prometheus with the project's rules → Alertmanager with its routes → webhook.

The real `llmstartup serve` follows two scripted vLLM units in the test journald (thresholds of
tests/scrape.py: silence 4 s, stall 8 s); a real Prometheus scrapes it and evaluates
deploy/prometheus/llmstartup.rules.yml every second; a real Alertmanager routes the alerts, as
deploy/alertmanager/alertmanager.yml does, to a webhook inside the test. The rules are the file's
own but for their waiting, scaled to the test's agent (tests/prometheus_stack.py): every `for:` is
2 s instead of minutes, and LLMStartupSilenceTooLong's 900 s without a journal line is 10 s, less
than the compile's silence. The test takes about 30 s.

- the unit that hangs idle after announcing torch.compile is judged stalled, and its
  LLMStartupStalled alert reaches the pager receiver with its unit, phase and runbook; its
  LLMStartupSilenceTooLong fires too, and Alertmanager holds it inhibited by the stalled alert;
- the unit that compiles silently for 20 s, burning CPU in child processes, and reaches ready raises
  no alert at all, not even a pending one.
"""

from __future__ import annotations

from grafana.dashboards import panel_queries
from tests.prometheus_stack import prometheus_stack  # noqa: F401 (fixture)
from tests.scrape import wait_for
from tests.test_serve import HANG_AFTER_COMPILE, READY_AFTER_SILENT_COMPILE

# READY_AFTER_SILENT_COMPILE with a longer compile, so that Prometheus, started after the unit,
# scrapes it well inside its silence.
SILENT_COMPILE = [{"burn": 20, "workers": 2} if "burn" in step else step
                  for step in READY_AFTER_SILENT_COMPILE]
assert SILENT_COMPILE != READY_AFTER_SILENT_COMPILE


def test_hung_unit_pages_silent_compile_raises_nothing(agent, units, prometheus_stack):
    compiling = units("compile", SILENT_COMPILE)
    hang_name = compiling.name.replace("compile", "hang")
    port = agent(compiling.name, hang_name)
    stack = prometheus_stack(f"127.0.0.1:{port}", silence_seconds=10)
    prometheus, webhook, alertmanager = stack.prometheus, stack.webhook, stack.alertmanager
    prometheus.wait_for_targets_up()
    hang = units("hang", HANG_AFTER_COMPILE)
    assert hang.name == hang_name

    # The hang: stalled after the agent's stall threshold, then the alert after its (shortened) for:.
    delivered = wait_for(
        lambda: webhook.alerts(alertname="LLMStartupStalled", unit=hang.name, status="firing"),
        45, f"LLMStartupStalled for {hang.name} at the webhook",
    )
    alert = delivered[0]
    assert alert["receiver"] == "pager"  # severity critical
    assert alert["labels"] == {
        "alertname": "LLMStartupStalled", "severity": "critical", "cluster": "e2e",
        "instance": f"127.0.0.1:{port}", "unit": hang.name, "phase": "compiling",
    }
    summary = alert["annotations"]["summary"]
    assert summary.startswith(f"{hang.name} on 127.0.0.1:{port} is stalled in compiling"), summary
    assert f"journalctl -u {hang.name}" in alert["annotations"]["runbook"]

    # The silent compile reaches ready; Prometheus saw its silence (silent_progress) on the way.
    ready = f'llmstartup_unit_verdict{{unit="{compiling.name}",verdict="ready"}} == 1'
    prometheus.wait_for(ready, 45, f"{compiling.name} to reach ready")
    assert prometheus.query(
        f'max_over_time(llmstartup_unit_verdict{{unit="{compiling.name}",verdict="silent_progress"}}[10m]) == 1'
    ), "Prometheus never scraped the compile's silence"
    assert prometheus.query(
        f'max_over_time(instance_unit:llmstartup_log_silence_seconds{{unit="{compiling.name}"}}[10m]) > 10'
    ), "the rules never saw the compile's silence"
    # A few evaluations after ready, so that anything its start triggered has had time to show.
    prometheus.wait_for(f'time() - llmstartup_ready_timestamp_seconds{{unit="{compiling.name}"}} > 3', 15)

    # No alert for the compiling unit, pending or firing, at any time, although it was silent for
    # longer than the silence alert's threshold; the hang raised Stalled and SilenceTooLong; nothing
    # else fired (the agent and its sources were up throughout).
    assert prometheus.query(f'count_over_time(ALERTS{{unit="{compiling.name}"}}[10m])') == []
    assert webhook.alerts(unit=compiling.name) == []
    raised = prometheus.query("count by (alertname, unit) (count_over_time(ALERTS[10m]))")
    assert sorted((r["metric"]["alertname"], r["metric"].get("unit")) for r in raised) == [
        ("LLMStartupSilenceTooLong", hang.name), ("LLMStartupStalled", hang.name)]
    delivered_names = {a["labels"]["alertname"] for a in webhook.alerts()}
    assert delivered_names <= {"LLMStartupStalled", "LLMStartupSilenceTooLong"}, delivered_names

    # In Alertmanager the hang's silence alert is held back by its stalled alert (same unit).
    silence = wait_for(
        lambda: [a for a in alertmanager.alerts()
                 if a["labels"]["alertname"] == "LLMStartupSilenceTooLong"
                 and a["labels"].get("unit") == hang.name],
        15, "LLMStartupSilenceTooLong of the hang in Alertmanager",
    )[0]
    stalled = next(a for a in alertmanager.alerts() if a["labels"]["alertname"] == "LLMStartupStalled")
    assert silence["status"]["state"] == "suppressed"
    assert silence["status"]["inhibitedBy"] == [stalled["fingerprint"]]

    # Every dashboard panel's query is valid against this Prometheus, and shows this scenario's data:
    # all but what it has none of (no GPU here, no failure, no start that began in the last 2 minutes, no
    # phase that reports progress now, no history to expect a ready time from, no start over several hosts).
    # A panel shows data when any of its queries does (one query per phase: not every phase is passed).
    empty_by_design = ("gpu_", "failures_total", "changes(", "phase_progress_", "phase_expected_end_",
                       "startup_expected_ready_", "llmstartup_group_")  # no start over several hosts: tests/test_hosts.py
    shown: dict[str, bool] = {}
    for title, expr in panel_queries():
        result = prometheus.query(expr)  # an AssertionError with Prometheus's message if it is invalid
        if not any(part in expr for part in empty_by_design):
            shown[title] = shown.get(title, False) or bool(result)
    assert [title for title, data in shown.items() if not data] == []


def test_alertmanager_inhibits_a_down_agents_unit_alerts(prometheus_stack):
    """The shipped routes and inhibitions in the real Alertmanager: the agent down on one host
    silences that host's per-unit alerts; another host's alert still pages."""
    stack = prometheus_stack()  # no targets: Alertmanager and the webhook, no Prometheus
    am, webhook = stack.alertmanager, stack.webhook

    def alert(name: str, severity: str, **labels: str) -> dict:
        return {"labels": {"alertname": name, "severity": severity, "cluster": "c1", **labels},
                "annotations": {"summary": name}}

    am.post([
        alert("LLMStartupAgentDown", "warning", instance="gpu1:9847", job="llmstartup"),
        alert("LLMStartupStalled", "critical", instance="gpu1:9847", unit="vllm-a.service", phase="compiling"),
        alert("LLMStartupStalled", "critical", instance="gpu2:9847", unit="vllm-b.service", phase="compiling"),
    ])
    wait_for(lambda: webhook.alerts(alertname="LLMStartupAgentDown")
             and webhook.alerts(unit="vllm-b.service"),
             20, "the agent-down alert and the other host's alert at the webhook")
    assert [a["receiver"] for a in webhook.alerts(alertname="LLMStartupAgentDown")] == ["chat"]
    assert [a["receiver"] for a in webhook.alerts(unit="vllm-b.service")] == ["pager"]

    held = {a["labels"].get("unit", a["labels"]["alertname"]): a["status"] for a in am.alerts()}
    assert held["vllm-a.service"]["state"] == "suppressed" and held["vllm-a.service"]["inhibitedBy"]
    assert held["vllm-b.service"]["state"] == "active"
    assert webhook.alerts(unit="vllm-a.service") == []
