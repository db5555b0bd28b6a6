"""grafana/: the committed dashboards are what grafana/dashboards.py writes, and every panel queries
the exporter's metrics through the datasource variable.

`panel_queries()` (in grafana/dashboards.py) lists every query with its template variables filled
in, ready to be run against a real Prometheus; here each is checked to parse (promtool) and to name
only metrics the exporter exposes.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.core.model import Phase, Signal, Verdict
from exporter.shell import collector
from tests.needs import missing, module

module("grafana_foundation_sdk", "grafana-foundation-sdk (the test extra)")

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
RULES = ROOT / "deploy" / "prometheus" / "llmstartup.rules.yml"
RAW = re.compile(r"(?<![:\w])llmstartup_\w+")  # an exporter's metric, not a recording rule's `level:metric:ops`
RECORDED = re.compile(r"\b[a-z_]+:[a-z_]+(?::[a-z0-9_]+)?\b")


def _load():
    spec = importlib.util.spec_from_file_location("llmstartup_dashboards", GRAFANA / "dashboards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dashboards = _load()
panel_queries = dashboards.panel_queries
DOCUMENTS = {path.name: json.loads(text) for path, text in dashboards.outputs().items()}


def test_committed_json_is_up_to_date() -> None:
    for path, text in dashboards.outputs().items():
        assert path.exists(), f"{path.name} is missing: run python grafana/dashboards.py"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.name} is out of date: run python grafana/dashboards.py"
        )
    result = subprocess.run(
        [sys.executable, str(GRAFANA / "dashboards.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_output_is_deterministic_and_sorted() -> None:
    first, second = dashboards.outputs(), dashboards.outputs()
    assert first == second
    for text in first.values():
        assert json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n" == text


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_every_panel_queries_through_the_datasource_variable(name: str) -> None:
    document = DOCUMENTS[name]
    panels = dashboards.panels(document)
    assert panels
    for panel in panels:
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel.get("targets"), f"{title}: no target"
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
            assert target["expr"].strip(), title
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), f"{title}: refIds repeat"
        assert len(panel.get("description", "")) > 20, f"{title}: say in plain words what it shows"


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_ids_layout_and_variables(name: str) -> None:
    document = DOCUMENTS[name]
    ids = [p["id"] for p in document["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    assert ids == sorted(ids), "and stable: in the order panels are made"
    for panel in document["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel.get("title")
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert list(variables) == ["datasource", "cluster", "instance", "unit"]
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for variable in ("cluster", "instance", "unit"):
        assert variables[variable]["datasource"]["uid"] == "${datasource}"
    assert document["uid"] in ("llmstartup-fleet", "llmstartup-unit")
    assert document["tags"] == ["llmstartup"]


def test_uids_are_distinct() -> None:
    assert len({d["uid"] for d in DOCUMENTS.values()}) == len(DOCUMENTS)


def _exprs(name: str) -> str:
    return "\n".join(t["expr"] for p in dashboards.panels(DOCUMENTS[name]) for t in p["targets"])


def test_unit_view_shows_what_the_issue_asks() -> None:
    exprs = _exprs("llmstartup-unit.json")
    timelines = [
        p for p in dashboards.panels(DOCUMENTS["llmstartup-unit.json"]) if p["type"] == "state-timeline"
    ]
    assert any(
        "llmstartup_unit_phase{" in t["expr"] and "== 1" in t["expr"] for p in timelines for t in p["targets"]
    )
    for needle in (
        "time() - llmstartup_last_log_timestamp_seconds",
        "llmstartup_last_progress_timestamp_seconds",
        "llmstartup_gpu_memory_used_bytes",
        "rate(llmstartup_process_cpu_seconds_total",
        "llmstartup_last_phase_duration_seconds",
        "llmstartup_phase_duration_seconds_sum",
        "llmstartup_expected_phase_duration_seconds",
        "llmstartup_unit_verdict",
        "llmstartup_phase_progress_ratio",
        "llmstartup_phase_expected_end_timestamp_seconds",
        "llmstartup_startup_expected_ready_timestamp_seconds",
    ):
        assert needle in exprs, needle


def test_the_fleet_row_across_hosts_reads_recorded_series_alone() -> None:
    """A fleet of thousands of hosts: the row over all of it reads a handful of recorded series, never a unit's own
    (issue 27): starts in progress by phase, the starts that span hosts and their laggard, the day's slowest starts."""
    row = dashboards.row_panels(DOCUMENTS["llmstartup-fleet.json"], dashboards.ACROSS_HOSTS)
    exprs = [t["expr"] for p in row for t in p["targets"]]
    assert len(row) == 3 and all(RECORDED.search(e) for e in exprs)
    assert not [RAW.findall(e) for e in exprs if RAW.findall(e)]
    joined = "\n".join(exprs)
    for needle in ("cluster_phase_verdict:llmstartup_units_starting:count", "instance_unit_group:llmstartup_group_laggard",
                   "group:llmstartup_group_hosts:count", "max_over_time(cluster_engine_model:llmstartup_time_to_ready"):
        assert needle in joined, needle


def test_fleet_view_shows_what_the_issue_asks() -> None:
    exprs = _exprs("llmstartup-fleet.json")
    for needle in (
        "llmstartup_unit_phase",
        "llmstartup_unit_verdict",
        "time() - llmstartup_phase_start_timestamp_seconds",
        "llmstartup_ready_timestamp_seconds{",
        "- llmstartup_startup_start_timestamp_seconds{",
        "llmstartup_failures_total",
    ):
        assert needle in exprs, needle


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_every_phase_and_verdict_has_a_colour(name: str) -> None:
    text = json.dumps(DOCUMENTS[name])
    for member in [*Phase, *Verdict]:
        assert f'"text": "{member.value}"' in text, member


def exported_metrics() -> set[str]:
    """The metric names the collector's families render (histograms and summaries with their series suffixes)."""
    names = set()
    for family in (*collector.LIVE, *collector.HISTORY):
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}.get(family.type, ("",))
        names |= {f"llmstartup_{family.name}{suffix}" for suffix in suffixes}
    return names


def recorded_series() -> set[str]:
    """The series deploy/prometheus/llmstartup.rules.yml records."""
    return {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}


def test_queries_name_only_exported_metrics() -> None:
    known, recorded = exported_metrics(), recorded_series()
    assert "llmstartup_unit_phase" in known and "llmstartup_gpu_memory_used_bytes" in known
    for title, expr in panel_queries():
        for metric in RAW.findall(expr):
            assert metric in known or metric == "llmstartup_", (title, metric)
        for name in RECORDED.findall(expr):
            assert name in recorded, (title, name)
        for pattern in re.findall(r'__name__=~"llmstartup_\(([^)]*)\)"', expr):
            for value in pattern.split("|"):
                assert f"llmstartup_{value}" in known, (title, value)


def test_panel_queries_fill_in_the_variables() -> None:
    queries = panel_queries()
    assert len(queries) >= 30
    for title, expr in queries:
        leftover = [m for m in re.findall(r"\$\{?\w+", expr) if not re.fullmatch(r"\$\d+", m)]
        assert not leftover, (title, leftover)
        assert 'instance=~".+"' in expr or "llmstartup_build_info" in expr or "instance" not in expr, (
            title,
            expr,
        )
    one = panel_queries(unit="vllm-glm5\\.service", instance="gpu-1:9847")
    assert any('unit=~"vllm-glm5\\.service"' in expr for _, expr in one)
    assert all("$__" not in expr for _, expr in one)
    # the signals panel draws a line per liveness signal, whichever there are: grouped by `signal`, none filtered
    progress = [e for t, e in one if t == "Silence and liveness signals" and "last_progress_timestamp_seconds" in e]
    assert progress and all(re.search(r"by \([^)]*\bsignal\b", e) and "signal=" not in e for e in progress), progress
    [panel] = [p for d in DOCUMENTS.values() for p in dashboards.panels(d) if p["title"] == "Silence and liveness signals"]
    assert all(str(signal) in panel["description"] for signal in Signal), "its description names every signal"


def test_every_query_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool (Debian package prometheus)")
    rules = {
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"panel:query_{i}", "expr": e} for i, (_, e) in enumerate(panel_queries())
                ],
            }
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_pods_unit_selects_its_own_series_and_no_other(tmp_path: Path) -> None:
    """Grafana puts the unit variable's value into the queries as it is: a pod's container
    (`namespace/pod/container`) selects its own series in every panel of the unit view, and never another's."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    queries = panel_queries(unit="llm/vllm-0/vllm", instance="n1:9847")
    rules = {"groups": [{"name": "panels", "rules": [{"record": f"panel:query_{i}", "expr": e} for i, (_, e) in enumerate(queries)]}]}
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    series = []
    for unit in ("llm/vllm-0/vllm", "llm/vllm-01/vllm", "vllm-0.service"):
        labels = f'instance="n1:9847",job="llmstartup",unit="{unit}"'
        series += [
            {"series": f'llmstartup_unit_info{{{labels},engine="vllm",model="m",namespace="llm",pod="vllm-0",container="vllm"}}', "values": "1x30"},
            {"series": f'llmstartup_unit_phase{{{labels},phase="compiling"}}', "values": "1x30"},
            {"series": f'llmstartup_unit_verdict{{{labels},verdict="silent_progress"}}', "values": "1x30"},
            {"series": f'llmstartup_phase_start_timestamp_seconds{{{labels}}}', "values": "0x30"},
        ]

    def recorded(unit: str) -> str:
        return f'{{__name__=~"panel:query_.*", unit="{unit}"}}'

    test = {
        "rule_files": ["panels.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": f"clamp_max(count({recorded('llm/vllm-0/vllm')}), 1)", "eval_time": "20m",
                 "exp_samples": [{"labels": "{}", "value": 1}]},
                {"expr": f"count({recorded('llm/vllm-01/vllm')})", "eval_time": "20m", "exp_samples": []},
                {"expr": f"count({recorded('vllm-0.service')})", "eval_time": "20m", "exp_samples": []},
            ],
        }],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
