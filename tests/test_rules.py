"""The shipped Prometheus rules and configs: checked and unit-tested with the real promtool and amtool.

deploy/prometheus/llmstartup.rules.test.yml holds the promtool unit tests themselves (each alert
firing, and not firing for a silent compile, a ready unit, a brief stall, a clean stop, an agent
restart); this module runs them, and checks the example Prometheus and Alertmanager configurations.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.prometheus_stack import (
    ALERTMANAGER_CONFIG,
    PROMETHEUS_CONFIG,
    RULES,
    RULES_TEST,
    binary,
    rules_with_short_for,
)

ALERTS = {
    "LLMStartupStalled", "LLMStartupSilenceTooLong", "LLMStartupSlowerThanUsual", "LLMStartupFailed",
    "LLMStartupCrashLooping", "LLMStartupGpuXid", "LLMStartupAgentDown", "LLMStartupSourceDown",
    "LLMStartupGroupHeldBack",
}


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert result.returncode == 0, \
        f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return result


def test_promtool_check_rules():
    out = run(binary("promtool"), "check", "rules", str(RULES)).stdout
    assert "SUCCESS" in out


def test_promtool_unit_tests_pass():
    out = run(binary("promtool"), "test", "rules", str(RULES_TEST)).stdout
    assert "SUCCESS" in out


def test_every_alert_has_for_severity_summary_runbook_and_a_firing_test():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == ALERTS
    for a in alerts:
        assert "for" in a, a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning"), a["alert"]
        assert a["annotations"]["summary"] and a["annotations"]["runbook"], a["alert"]
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [case for group in tests for case in group.get("alert_rule_test", [])]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fired == ALERTS and quiet == ALERTS


def test_the_end_to_end_copy_changes_only_the_for_durations(tmp_path):
    copy = rules_with_short_for(tmp_path / "rules.yml", "2s")
    original, short = yaml.safe_load(RULES.read_text()), yaml.safe_load(copy.read_text())
    for g_orig, g_short in zip(original["groups"], short["groups"]):
        for r_orig, r_short in zip(g_orig["rules"], g_short["rules"]):
            if "alert" in r_orig:
                assert r_short["for"] == "2s"
                r_orig, r_short = {**r_orig, "for": None}, {**r_short, "for": None}
            assert r_orig == r_short
    run(binary("promtool"), "check", "rules", str(copy))


def test_promtool_check_config_with_the_rules():
    # rule_files is relative to the config; check the example where it lies, next to the rules.
    out = run(binary("promtool"), "check", "config", str(PROMETHEUS_CONFIG)).stdout
    assert "SUCCESS: 1 rule files found" in out
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == ["llmstartup"]
    targets = [t for sc in config["scrape_configs"][0]["static_configs"] for t in sc["targets"]]
    assert targets and all(t.endswith(":9847") for t in targets)
    assert "cluster" in config["global"]["external_labels"]


def test_amtool_check_config():
    out = run(binary("amtool"), "check-config", str(ALERTMANAGER_CONFIG)).stdout
    assert "SUCCESS" in out and "4 inhibit rules" in out


def test_alertmanager_routes_by_severity():
    amtool = binary("amtool")
    for labels, receiver in ((["alertname=LLMStartupStalled", "severity=critical"], "pager"),
                             (["alertname=LLMStartupFailed", "severity=warning"], "chat"),
                             (["alertname=Other"], "chat")):
        out = run(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
                  f"--verify.receivers={receiver}", *labels).stdout
        assert out.split() == [receiver]


def test_alertmanager_groups_and_inhibits_on_the_rules_labels():
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    assert config["route"]["group_by"] == ["alertname", "cluster", "instance", "unit", "group"]
    agent_down = next(r for r in config["inhibit_rules"]
                      if r["source_matchers"] == ['alertname="LLMStartupAgentDown"'])
    assert agent_down["equal"] == ["cluster", "instance"]
    named = set(re.findall(r"LLMStartup\w+", ALERTMANAGER_CONFIG.read_text()))
    assert named <= ALERTS, named - ALERTS


def test_setup_installs_alertmanager():
    setup = (Path(__file__).resolve().parent.parent / ".ci" / "setup").read_text()
    assert re.search(r"^packages=\(.*\bprometheus-alertmanager\b", setup, re.MULTILINE)
    assert shutil.which("prometheus-alertmanager")
