"""The llmstartup Grafana dashboards, as code (grafana-foundation-sdk).

    python grafana/dashboards.py          # writes grafana/llmstartup-fleet.json and grafana/llmstartup-unit.json
    python grafana/dashboards.py --check  # exit 1 if they are out of date

Two dashboards over the `llmstartup_*` metrics (README.md, "Metrics"):

- fleet (uid llmstartup-fleet): across every host, from recording rules only (a fleet of thousands of hosts is
  never scanned raw): starts in progress by phase, the starts that span hosts with the host holding each back,
  the slowest starts of the day by engine and model; then every unit on every host — phase, verdict, time in
  phase, time to ready, failures — and their phase and verdict timelines;
- unit (uid llmstartup-unit): one unit — how far its phase is and when it should end, its phase and verdict timelines, the silence and each
  liveness signal, GPU memory per GPU, CPU, I/O, the last start phase by phase, and phase durations
  over past starts against the expected ones.

Phases, verdicts and signals come from exporter.core.model, and their colours from the landing page, so a
new phase shows up here once the dashboards are regenerated (tests/test_dashboards.py checks that
the committed JSON is what this file writes). Every query selects on the template variables
`cluster`, `instance` and `unit` with regex matchers; `panel_queries()` gives every query with them
(and Grafana's `$__range`-style variables) substituted, for running against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The SDK nudges towards its dashboard v2 schema (Grafana 12's resource format); the classic JSON model
# is what Grafana's Import (10, 11 and 12) and file provisioning take, so the v1 builders are used.
warnings.filterwarnings("ignore", message="Prefer using dashboardv2", category=DeprecationWarning)

from grafana_foundation_sdk.builders import (
    bargauge,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from exporter.core.grammar import VALUES
from exporter.core.landing import COLOURS, VERDICT_COLOURS
from exporter.core.model import Phase, Verdict

HERE = Path(__file__).resolve().parent
FLEET_FILE = HERE / "llmstartup-fleet.json"
UNIT_FILE = HERE / "llmstartup-unit.json"
FLEET_UID = "llmstartup-fleet"
UNIT_UID = "llmstartup-unit"
TAGS = ["llmstartup"]

DATASOURCE = common.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every series of a unit, on the hosts and clusters picked. `cluster` is the external label a global
# view (Thanos, Mimir, federation) adds; on a Prometheus without it the variable is "All" (.*), which
# also matches a missing label.
SEL = 'cluster=~"$cluster", instance=~"$instance", unit=~"$unit"'
HOST_SEL = 'cluster=~"$cluster", instance=~"$instance"'
KEYS = "cluster, instance, unit"

# The phases of a start, in order (what a phase breakdown shows), and the ones a unit is "starting" in.
STARTUP_PHASES = [p for p in Phase if p not in (Phase.INACTIVE, Phase.READY, Phase.FAILED, Phase.STOPPING)]
NOT_STARTING = "|".join(p.value for p in (Phase.INACTIVE, Phase.READY, Phase.FAILED, Phase.STOPPING))
PHASE_COLOURS = {Phase.INACTIVE: "#d5dbe0", **COLOURS}
SILENCE_THRESHOLD = 60  # the agent's --silence.threshold and --stall.threshold defaults, in seconds
STALL_THRESHOLD = 300


# --- Building blocks ------------------------------------------------------------------------------------


def query(
    expr: str, legend: str | None = None, ref: str = "A", instant: bool = False, table_format: bool = False
):
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend is not None:
        q = q.legend_format(legend)
    if instant:
        q = q.instant()
    else:
        q = q.range()
    if table_format:
        q = q.format(PromQueryFormat.TABLE)
    return q


def coded(metric: str, label: str, values: Iterable[str], selector: str, by: str = KEYS) -> str:
    """One series per unit whose value is the index of its current state (the label of its series at 1).

    `llmstartup_unit_phase` and `llmstartup_unit_verdict` name the state in a label (one series, for the current
    member, at 1); a state timeline wants one series per unit with the state as its value.
    """
    parts = [f'({metric}{{{selector}, {label}="{v}"}} == 1) * {i}' for i, v in enumerate(values)]
    return f"max by ({by}) (\n  " + "\n  or ".join(parts) + "\n)"


def code_mappings(values: Iterable[str], colours: dict[Any, str]) -> list[model.ValueMap]:
    return [
        model.ValueMap(
            options={
                str(i): model.ValueMappingResult(text=v, color=colours[v], index=i)
                for i, v in enumerate(values)
            }
        )
    ]


def text_mappings(values: Iterable[str], colours: dict[Any, str]) -> list[model.ValueMap]:
    return [
        model.ValueMap(
            options={
                v: model.ValueMappingResult(text=v, color=colours[v], index=i) for i, v in enumerate(values)
            }
        )
    ]


PHASES = [p.value for p in Phase]
VERDICTS = [v.value for v in Verdict]
PHASE_MAPPINGS = code_mappings(PHASES, PHASE_COLOURS)
VERDICT_MAPPINGS = code_mappings(VERDICTS, VERDICT_COLOURS)


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=v, color=c) for v, c in steps])
    )


SILENCE_STEPS = thresholds((None, "green"), (SILENCE_THRESHOLD, "orange"), (STALL_THRESHOLD, "red"))


def fixed_colour(colour: str) -> model.DynamicConfigValue:
    return model.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colour})


def merge_table(
    renames: dict[str, str], hide: Iterable[str], order: Iterable[str]
) -> list[model.DataTransformerConfig]:
    """Several instant queries in table format, joined on their common labels into one row per key."""
    return [
        model.DataTransformerConfig(id_val="merge", options={}),
        model.DataTransformerConfig(
            id_val="organize",
            options={
                "excludeByName": {name: True for name in ["Time", *hide]},
                "renameByName": renames,
                "indexByName": {name: i for i, name in enumerate(order)},
            },
        ),
    ]


def legend_bottom() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
    )


def legend_table(*calcs: str) -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.RIGHT)
        .show_legend(True)
        .calcs(list(calcs))
    )


def last_value() -> common_builders.ReduceDataOptions:
    return common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


class Ids:
    """Panel ids in the order panels are made: stable across runs, unique within a dashboard."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def state_timeline(ids: Ids, title: str, description: str, expr: str, legend: str, mappings, height: int):
    return (
        statetimeline.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, legend))
        .mappings(mappings)
        .color_scheme(dashboard.FieldColor().mode(model.FieldColorModeId.FIXED).fixed_color("transparent"))
        .show_value(common.VisibilityMode.AUTO)
        .merge_values(True)
        .row_height(0.85)
        .fill_opacity(85)
        .line_width(0)
        .legend(legend_bottom().show_legend(False))
        .span(24)
        .height(height)
    )


def stacked_bars(ids: Ids, title: str, description: str, target: Any) -> timeseries.Panel:
    """Counts over time as stacked bars, one colour per series, half a row wide."""
    return (
        timeseries.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(target)
        .draw_style(common.GraphDrawStyle.BARS)
        .fill_opacity(80)
        .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
        .unit("none")
        .decimals(0)
        .legend(legend_bottom())
        .span(12)
        .height(8)
    )


def count_stat(ids: Ids, title: str, description: str, verdicts: str, colour: str, alert: bool):
    expr = f'count(llmstartup_unit_verdict{{{SEL}, verdict=~"{verdicts}"}} == 1) or vector(0)'
    steps = thresholds((None, "green"), (1, colour)) if alert else thresholds((None, colour))
    return (
        stat.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, instant=True))
        .thresholds(steps)
        .color_mode(common.BigValueColorMode.BACKGROUND if alert else common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(last_value())
        .unit("none")
        .decimals(0)
        .span(4)
        .height(4)
    )


def now_stat(ids: Ids, title: str, description: str, expr: str, **kw):
    """A stat panel of the unit view's top rows: one value, coloured by mappings or thresholds."""
    panel = (
        stat.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, kw.get("legend"), instant=True))
        .reduce_options(last_value())
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(
            common.BigValueColorMode.BACKGROUND if "mappings" in kw else common.BigValueColorMode.VALUE
        )
        .text_mode(kw.get("text_mode", common.BigValueTextMode.VALUE))
        .span(4)
        .height(4)
    )
    if "mappings" in kw:
        panel = panel.mappings(kw["mappings"])
    if "unit" in kw:
        panel = panel.unit(kw["unit"]).decimals(0)
    if "thresholds" in kw:
        panel = panel.thresholds(kw["thresholds"])
    return panel


def variables(fleet: bool) -> list[Any]:
    """datasource, cluster, instance, unit; the fleet view takes several hosts and units, the unit view one."""

    def label_values(name: str, source: str) -> dashboard.QueryVariable:
        definition = f"label_values({source}, {name})"
        return (
            dashboard.QueryVariable(name)
            .label(name)
            .datasource(DATASOURCE)
            .query({"query": definition, "refId": f"{name}-values", "qryType": 1})
            .definition(definition)
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
        )

    cluster = (
        label_values("cluster", "llmstartup_build_info")
        .description(
            "The cluster external label of a global view (Thanos, Mimir, federation); All where there is none."
        )
        .include_all(True)
        .all_value(".*")
        .multi(fleet)
    )
    instance = (
        label_values("instance", 'llmstartup_build_info{cluster=~"$cluster"}')
        .description("The agents' hosts (the scrape target's instance label).")
        .include_all(fleet)
        .multi(fleet)
    )
    unit = (
        label_values("unit", 'llmstartup_unit_info{cluster=~"$cluster", instance=~"$instance"}')
        .description(
            "The model-server units the agents follow: systemd units, pods' containers (namespace/pod/container) "
            "and Docker containers (their names)."
        )
        .include_all(fleet)
        .multi(fleet)
    )
    if fleet:
        instance = instance.all_value(".+")
        unit = unit.all_value(".+")
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        cluster,
        instance,
        unit,
    ]


def links() -> list[dashboard.DashboardLink]:
    """A link to each llmstartup dashboard, keeping the time range and the variables."""
    return [
        dashboard.DashboardLink("llmstartup")
        .type(model.DashboardLinkType.DASHBOARDS)
        .tags(TAGS)
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
    ]


def annotations() -> list[dashboard.AnnotationQuery]:
    """Grafana's own annotations, and a marker where a unit's start began."""
    return [
        dashboard.AnnotationQuery()
        .name("Annotations & Alerts")
        .datasource(common.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .built_in(1)
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .type("dashboard"),
        dashboard.AnnotationQuery()
        .name("Starts")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color(PHASE_COLOURS[Phase.LAUNCHING])
        .expr(f"changes(llmstartup_startup_start_timestamp_seconds{{{SEL}}}[2m]) > 0")
        .step("1m")
        .title_format("{{unit}} started")
        .text_format("{{instance}}"),
    ]


# --- Fleet view -----------------------------------------------------------------------------------------


def _dashboard(title: str, uid: str, description: str, since: str, refresh: str, fleet: bool) -> dashboard.Dashboard:
    """What both dashboards share: tags, time, cursor, variables, annotations and links."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .timezone("browser")
        .time(since, "now")
        .refresh(refresh)
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .variables(variables(fleet=fleet))
        .annotations(annotations())
        .links(links())
    )


def fleet() -> dashboard.Dashboard:
    """Every unit on every host, row by row."""
    ids = Ids()
    d = _dashboard(
        "llmstartup / fleet", FLEET_UID,
        "Every LLM model-server unit on every host: which startup phase it is in, and whether it is still making progress.",
        "now-6h", "30s", fleet=True,
    )
    for row in (fleet_across_hosts, fleet_now, fleet_timelines, fleet_starts_and_failures, fleet_agents):
        d = row(d, ids)
    return d


ACROSS_HOSTS = "Across hosts"  # the fleet row built from recording rules alone (deploy/prometheus/llmstartup.rules.yml)
# llmstartup:phase_order's numbers, for a group's furthest phase (a failed member is behind every other)
PHASE_ORDER = ["failed", *(p.value for p in STARTUP_PHASES), "ready"]
CLUSTER_SEL = 'cluster=~"$cluster"'


def fleet_across_hosts(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Across hosts: the whole fleet from the rules' recorded series, a handful of series whatever its size."""
    d = d.with_row(dashboard.Row(ACROSS_HOSTS).id(ids()))
    by_phase = stacked_bars(
        ids,
        "Starts in progress, by phase",
        "How many units are starting on every host of the clusters picked, by the phase they are in "
        "(cluster_phase_verdict:llmstartup_units_starting:count, a recording rule: no unit's own series is read).",
        query(f"sum by (phase) (cluster_phase_verdict:llmstartup_units_starting:count{{{CLUSTER_SEL}}})", "{{phase}}"),
    )
    for p in STARTUP_PHASES:
        by_phase = by_phase.override_by_name(p.value, [fixed_colour(PHASE_COLOURS[p])])
    d = d.with_panel(by_phase)
    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("Slowest starts of the day, by engine and model")
        .description(
            "For each engine and model, the longest a start took to become ready in the last 24 hours, on any host "
            "(the day's highest cluster_engine_model:llmstartup_time_to_ready_seconds:max)."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"topk(20, max by (cluster, engine, model) (max_over_time("
                f"cluster_engine_model:llmstartup_time_to_ready_seconds:max{{{CLUSTER_SEL}}}[1d])))",
                instant=True,
                table_format=True,
            )
        )
        .transformations(
            merge_table(renames={"Value": "Slowest time to ready"}, hide=[], order=["cluster", "engine", "model", "Value"])
        )
        .override_by_name("Slowest time to ready", [model.DynamicConfigValue(id_val="unit", value="s"),
                                                    model.DynamicConfigValue(id_val="decimals", value=0)])
        .sort_by([common_builders.TableSortByFieldState().display_name("Slowest time to ready").desc(True)])
        .span(12)
        .height(8)
    )
    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("Starts that span hosts, and the host holding each back")
        .description(
            "One row per start that runs as one engine on several hosts (its group: where the hosts meet): how many "
            "hosts it spans and how many report it, its furthest phase, and its laggard: of the hosts in its earliest "
            "phase (a failed one first), the one quiet for longest, which the others wait for. LLMStartupGroupHeldBack "
            "fires when the laggard is stalled or failed, or behind while the others wait, and when hosts are missing."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    "max by (cluster, group, nnodes, instance, unit, node_rank, phase) "
                    f'(instance_unit_group:llmstartup_group_laggard_quiet_seconds{{{CLUSTER_SEL}, instance=~"$instance"}})',
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by (cluster, group) (group:llmstartup_group_hosts:count{{{CLUSTER_SEL}}})",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by (cluster, group) (group:llmstartup_group_phase:max{{{CLUSTER_SEL}}})",
                    ref="C",
                    instant=True,
                    table_format=True,
                ),
            ]
        )
        .transformations(
            merge_table(
                renames={"Value #A": "Quiet for", "Value #B": "Hosts reporting", "Value #C": "Furthest phase",
                         "instance": "laggard", "unit": "its unit", "node_rank": "its node", "phase": "its phase"},
                hide=[],
                order=["cluster", "group", "nnodes", "Value #B", "Value #C", "instance", "unit", "node_rank", "phase",
                       "Value #A"],
            )
        )
        .override_by_name(
            "Furthest phase",
            [
                model.DynamicConfigValue(id_val="mappings", value=[model.ValueMap(options={
                    str(i): model.ValueMappingResult(text=p, color=PHASE_COLOURS[Phase(p)], index=i)
                    for i, p in enumerate(PHASE_ORDER)})]),
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
            ],
        )
        .override_by_name(
            "its phase",
            [
                model.DynamicConfigValue(id_val="mappings", value=text_mappings(PHASES, PHASE_COLOURS)),
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
            ],
        )
        .override_by_name("Quiet for", [model.DynamicConfigValue(id_val="unit", value="s"),
                                        model.DynamicConfigValue(id_val="decimals", value=0),
                                        model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                                        model.DynamicConfigValue(id_val="thresholds", value=SILENCE_STEPS.build())])
        .sort_by([common_builders.TableSortByFieldState().display_name("Quiet for").desc(True)])
        .filterable(True)
        .span(24)
        .height(8)
    )
    return d


def fleet_now(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Now: how many units are starting, silent, stalled, unknown, failed and ready, and a table of every unit."""
    d = d.with_row(dashboard.Row("Now").id(ids()))
    for title, description, verdicts, colour, alert in [
        (
            "Starting",
            "Units in a start, making progress (they wrote a log line lately, or a liveness signal moved).",
            "progressing|silent_progress",
            "blue",
            False,
        ),
        (
            "Silent but working",
            (
                "Starting units that have printed nothing for the silence threshold (60s by default), but whose "
                "CPU, I/O, GPU memory or processes still move: a torch.compile, a CUDA-graph capture, a slow disk."
            ),
            "silent_progress",
            VERDICT_COLOURS["silent_progress"],
            False,
        ),
        (
            "Stalled",
            (
                "Starting units where nothing has moved for the stall threshold (5m by default): no log line, no "
                "CPU, no I/O, no GPU memory change, no process coming or going. Most likely a hang."
            ),
            "stalled",
            "red",
            True,
        ),
        (
            "Unknown",
            (
                "Units the agent cannot judge: its evidence is stale (a source is failing) or it has not watched "
                "them long enough to call a stall."
            ),
            "unknown",
            "orange",
            True,
        ),
        (
            "Failed",
            "Units whose last start failed (see the failures table for the phase and the reason).",
            "failed",
            "red",
            True,
        ),
        ("Ready", "Units whose current start reached ready.", "ready", "green", False),
    ]:
        d = d.with_panel(count_stat(ids, title, description, verdicts, colour, alert))

    unit_link = (
        f"/d/{UNIT_UID}/llmstartup-unit?${{datasource:queryparam}}&${{cluster:queryparam}}"
        "&var-instance=${__data.fields.instance}&var-unit=${__data.fields.unit}&${__url_time_range}"
    )
    units = (
        table.Panel()
        .id(ids())
        .title("Units")
        .description(
            "One row per unit and host. Phase and verdict are the agent's current judgement; 'In phase' is how long "
            "the unit has been in that phase; 'Starting for' how long the current start has been going (starting "
            "units only); 'Time to ready' what the current start took to become ready; 'Median time to ready' over "
            "the starts the agent has seen; 'Failures' failed starts since the agent started. Click a unit for its "
            "own dashboard."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    f"max by ({KEYS}, engine, model) (llmstartup_unit_info{{{SEL}}})",
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by ({KEYS}, phase) (llmstartup_unit_phase{{{SEL}}} == 1)",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by ({KEYS}, verdict) (llmstartup_unit_verdict{{{SEL}}} == 1)",
                    ref="C",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by ({KEYS}) (time() - llmstartup_phase_start_timestamp_seconds{{{SEL}}})",
                    ref="D",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by ({KEYS}) (time() - llmstartup_startup_start_timestamp_seconds{{{SEL}}})\n"
                    f'and on ({KEYS}) max by ({KEYS}) (llmstartup_unit_phase{{{SEL}, phase!~"{NOT_STARTING}"}} == 1)',
                    ref="E",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by ({KEYS}) (llmstartup_ready_timestamp_seconds{{{SEL}}} - llmstartup_startup_start_timestamp_seconds{{{SEL}}})",
                    ref="F",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f'histogram_quantile(0.5, sum by ({KEYS}, le) (llmstartup_startup_duration_seconds_bucket{{{SEL}, outcome="ready"}}))',
                    ref="G",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"sum by ({KEYS}) (llmstartup_failures_total{{{SEL}}})",
                    ref="H",
                    instant=True,
                    table_format=True,
                ),
            ]
        )
        .transformations(
            merge_table(
                renames={
                    "Value #D": "In phase",
                    "Value #E": "Starting for",
                    "Value #F": "Time to ready",
                    "Value #G": "Median time to ready",
                    "Value #H": "Failures",
                },
                hide=["Value #A", "Value #B", "Value #C"],
                order=[
                    "cluster",
                    "instance",
                    "unit",
                    "engine",
                    "model",
                    "phase",
                    "verdict",
                    "Value #D",
                    "Value #E",
                    "Value #F",
                    "Value #G",
                    "Value #H",
                ],
            )
        )
        .override_by_name(
            "phase",
            [
                model.DynamicConfigValue(id_val="mappings", value=text_mappings(PHASES, PHASE_COLOURS)),
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
            ],
        )
        .override_by_name(
            "verdict",
            [
                model.DynamicConfigValue(id_val="mappings", value=text_mappings(VERDICTS, VERDICT_COLOURS)),
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
            ],
        )
        .override_by_regexp(
            "In phase|Starting for|Time to ready|Median time to ready",
            [
                model.DynamicConfigValue(id_val="unit", value="s"),
                model.DynamicConfigValue(id_val="decimals", value=0),
            ],
        )
        .override_by_name(
            "Failures",
            [
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                model.DynamicConfigValue(
                    id_val="thresholds", value=thresholds((None, "green"), (1, "red")).build()
                ),
            ],
        )
        .override_by_name(
            "unit",
            [
                model.DynamicConfigValue(
                    id_val="links", value=[{"title": "This unit's dashboard", "url": unit_link}]
                ),
            ],
        )
        .sort_by([common_builders.TableSortByFieldState().display_name("verdict")])
        .filterable(True)
        .span(24)
        .height(10)
    )
    d = d.with_panel(units)
    return d


def fleet_timelines(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Timelines: every unit's phase and verdict over time."""
    d = d.with_row(dashboard.Row("Timelines").id(ids()))
    d = d.with_panel(
        state_timeline(
            ids,
            "Phase of every unit",
            "Each unit's startup phase over time, one row per unit and host. A wide band is where a start spends its "
            "time; a band that stops short of the right edge means the unit (or its agent) went away.",
            coded("llmstartup_unit_phase", "phase", PHASES, SEL),
            "{{instance}} {{unit}}",
            PHASE_MAPPINGS,
            10,
        )
    )
    d = d.with_panel(
        state_timeline(
            ids,
            "Verdict of every unit",
            "The agent's verdict over time: progressing (writing logs), silent_progress (quiet but I/O, GPU memory, "
            "processes, resident memory or Python stacks move), stalled (nothing moves, or only CPU with unchanged "
            "stacks), unknown (stale evidence, or only CPU moves without stacks), ready, failed, inactive.",
            coded("llmstartup_unit_verdict", "verdict", VERDICTS, SEL),
            "{{instance}} {{unit}}",
            VERDICT_MAPPINGS,
            10,
        )
    )
    return d


def fleet_starts_and_failures(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Starts and failures: starts by outcome, failures by phase and reason."""
    d = d.with_row(dashboard.Row("Starts and failures").id(ids()))
    d = d.with_panel(
        stacked_bars(
            ids,
            "Starts by outcome",
            "How many starts ended ready, failed or stopped (asked to stop before ready), per interval, over the units picked.",
            query(f"sum by (outcome) (increase(llmstartup_startups_total{{{SEL}}}[$__interval]))", "{{outcome}}"),
        )
        .interval("1m")
        .override_by_name("ready", [fixed_colour(VERDICT_COLOURS["ready"])])
        .override_by_name("failed", [fixed_colour(VERDICT_COLOURS["failed"])])
        .override_by_name("stopped", [fixed_colour(PHASE_COLOURS[Phase.STOPPING])])
    )
    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("Failures by phase and reason")
        .description(
            "Failed starts since the agent started, by the phase they failed in and the first specific cause the unit "
            "printed (CUDA OOM, NCCL, bad config, port in use, …), else what systemd said (killed, crashed, exited)."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"sum by ({KEYS}, phase, reason) (llmstartup_failures_total{{{SEL}}}) > 0",
                instant=True,
                table_format=True,
            )
        )
        .transformations(
            merge_table(
                renames={"Value": "Failures"},
                hide=[],
                order=["cluster", "instance", "unit", "phase", "reason", "Value"],
            )
        )
        .override_by_name(
            "phase",
            [
                model.DynamicConfigValue(id_val="mappings", value=text_mappings(PHASES, PHASE_COLOURS)),
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
            ],
        )
        .sort_by([common_builders.TableSortByFieldState().display_name("Failures").desc(True)])
        .span(12)
        .height(8)
    )
    return d


def fleet_agents(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Agents: whether each agent can read its sources."""
    d = d.with_row(dashboard.Row("Agents").id(ids()))
    d = d.with_panel(
        state_timeline(
            ids,
            "Agent sources",
            "Whether each agent can read its sources: the journal, the processes (cgroups and /proc) and the GPUs (NVML). "
            "A source that is down makes the agent's verdicts 'unknown' rather than wrong.",
            f"max by (cluster, instance, source) (llmstartup_source_up{{{HOST_SEL}}})",
            "{{instance}} {{source}}",
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="down", color="red", index=0),
                        "1": model.ValueMappingResult(text="up", color="green", index=1),
                    }
                )
            ],
            8,
        )
    )
    return d


# --- Unit view ------------------------------------------------------------------------------------------


def unit() -> dashboard.Dashboard:
    """One unit on one host, row by row."""
    ids = Ids()
    d = _dashboard(
        "llmstartup / unit", UNIT_UID,
        "One LLM model-server unit on one host: where its start is, where the time went, and the evidence the agent judges it by.",
        "now-3h", "15s", fleet=False,
    )
    for row in (unit_now, unit_how_much_longer, unit_timeline, unit_progress_evidence, unit_where_the_time_goes, unit_outcomes_values_gpus):
        d = row(d, ids)
    return d


def unit_now(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Now: phase, verdict, time in phase, the start's duration, the silence, engine and model."""
    d = d.with_row(dashboard.Row("Now").id(ids()))

    d = d.with_panel(
        now_stat(
            ids,
            "Phase",
            "The startup phase the unit is in now.",
            coded("llmstartup_unit_phase", "phase", PHASES, SEL),
            mappings=PHASE_MAPPINGS,
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "Verdict",
            "progressing: it wrote a log line lately. silent_progress: no line for the silence threshold, but I/O, GPU "
            "memory, its processes, its resident memory or its Python stacks moved. stalled: nothing but CPU moved for "
            "the stall threshold (and its stacks did not). unknown: the evidence is stale, or only CPU moves and no "
            "stacks were read.",
            coded("llmstartup_unit_verdict", "verdict", VERDICTS, SEL),
            mappings=VERDICT_MAPPINGS,
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "In phase for",
            "How long the unit has been in its current phase.",
            f"max by ({KEYS}) (time() - llmstartup_phase_start_timestamp_seconds{{{SEL}}})",
            unit="s",
            thresholds=thresholds((None, "text")),
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "Start: running for / took",
            "While it starts: how long the current start has been going. Once ready: how long it took to become ready.",
            f"max by ({KEYS}) (time() - llmstartup_startup_start_timestamp_seconds{{{SEL}}})\n"
            f'and on ({KEYS}) max by ({KEYS}) (llmstartup_unit_phase{{{SEL}, phase!~"{NOT_STARTING}"}} == 1)\n'
            f"or max by ({KEYS}) (llmstartup_ready_timestamp_seconds{{{SEL}}} - llmstartup_startup_start_timestamp_seconds{{{SEL}}})",
            unit="s",
            thresholds=thresholds((None, "text")),
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "No log line for",
            "Time since the unit's last journal line. Orange past the silence threshold (60s by default), red past the "
            "stall threshold (5m): silence alone is not a hang; the verdict weighs it against the other signals.",
            f"max by ({KEYS}) (time() - llmstartup_last_log_timestamp_seconds{{{SEL}}})",
            unit="s",
            thresholds=SILENCE_STEPS,
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "Engine and model",
            "The model server the unit runs, as its command line and logs say.",
            f"max by ({KEYS}, engine, engine_version, model) (llmstartup_unit_info{{{SEL}}})",
            legend="{{engine}} {{engine_version}} {{model}}",
            text_mode=common.BigValueTextMode.NAME,
        )
    )
    return d


def unit_how_much_longer(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """How much longer?: the phase's progress, when it and the start should end."""
    d = d.with_row(dashboard.Row("How much longer?").id(ids()))
    d = d.with_panel(
        now_stat(
            ids,
            "Phase progress",
            "How far the current phase is by the engine's own progress reports (vLLM's and SGLang's shard bar, TGI's "
            "downloaded files, Ollama's load fraction, tqdm bars). No value while the phase reports none.",
            f"max by ({KEYS}) (llmstartup_phase_progress_ratio{{{SEL}}})",
            unit="percentunit",
            thresholds=thresholds((None, "text")),
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "Phase ends in",
            "When the current phase should end, by the rate of its progress reports (the engine's own estimate of the "
            "time left when it prints one). None before two reports, nor for a phase that reports nothing; negative "
            "once that time has passed.",
            f"max by ({KEYS}) (llmstartup_phase_expected_end_timestamp_seconds{{{SEL}}}) - time()",
            unit="s",
            thresholds=thresholds((None, "text")),
        )
    )
    d = d.with_panel(
        now_stat(
            ids,
            "Ready in, as usual",
            "When the start should be ready, from the unit's history: the current phase's expected end plus the "
            "typical duration of each phase ahead; without progress, the typical start. None without history.",
            f"max by ({KEYS}) (llmstartup_startup_expected_ready_timestamp_seconds{{{SEL}}}) - time()",
            unit="s",
            thresholds=thresholds((None, "text")),
        )
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("Progress of each phase")
        .description(
            "How far each phase got by the engine's own progress reports, over time, by phase. A line that stops "
            "rising in the middle of a phase is a bar that stopped (`llmstartup status` says for how long)."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"max by ({KEYS}) (llmstartup_phase_progress_ratio{{{SEL}}})\n"
                f"* on ({KEYS}) group_right () max by ({KEYS}, phase) (llmstartup_unit_phase{{{SEL}}} == 1)",
                "{{phase}}",
            )
        )
        .unit("percentunit")
        .min(0)
        .max(1)
        .legend(legend_bottom())
        .span(12)
        .height(6)
    )
    return d


def unit_timeline(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Timeline: the unit's phase and verdict over time."""
    d = d.with_row(dashboard.Row("Timeline").id(ids()))
    d = d.with_panel(
        state_timeline(
            ids,
            "Phase timeline",
            "The unit's startup phases over time, from llmstartup_unit_phase == 1. Hover a band for the phase and its span.",
            coded("llmstartup_unit_phase", "phase", PHASES, SEL),
            "phase",
            PHASE_MAPPINGS,
            4,
        )
    )
    d = d.with_panel(
        state_timeline(
            ids,
            "Verdict timeline",
            "The agent's verdict on the unit over time.",
            coded("llmstartup_unit_verdict", "verdict", VERDICTS, SEL),
            "verdict",
            VERDICT_MAPPINGS,
            4,
        )
    )
    return d


def unit_progress_evidence(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Is it still making progress?: the silence and each liveness signal, GPU memory, CPU, I/O, processes."""
    d = d.with_row(dashboard.Row("Is it still making progress?").id(ids()))
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("Silence and liveness signals")
        .description(
            "How long ago each piece of evidence last moved: the last log line, and each liveness signal (log, cpu, "
            "io, gpu_memory, processes, memory, stack; a signal moves when it changes by more than its floor). A line "
            "that keeps climbing is a signal that stopped. The dashed lines are the default silence (60s) and stall "
            "(5m) thresholds: stalled means every signal but cpu is above the second."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    f"max by ({KEYS}) (time() - llmstartup_last_log_timestamp_seconds{{{SEL}}})",
                    "no log line",
                    ref="A",
                ),
                query(
                    f"max by ({KEYS}, signal) (time() - llmstartup_last_progress_timestamp_seconds{{{SEL}}})",
                    "{{signal}} last moved",
                    ref="B",
                ),
            ]
        )
        .unit("s")
        .thresholds(SILENCE_STEPS)
        .thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
        .scale_distribution(
            common_builders.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)
        )
        .legend(legend_table("lastNotNull"))
        .span(12)
        .height(9)
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("GPU memory per GPU")
        .description(
            "GPU memory the unit's processes use on each GPU (NVML, per process, summed over the unit). Weights "
            "loading, KV-cache allocation and CUDA-graph capture show as steps; a change of 64 MiB counts as progress. "
            "No line where NVML cannot say (never a false 0)."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(f"max by ({KEYS}, gpu) (llmstartup_gpu_memory_used_bytes{{{SEL}}})", "GPU {{gpu}}")
        )
        .unit("bytes")
        .min(0)
        .legend(legend_table("lastNotNull", "max"))
        .span(12)
        .height(9)
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("CPU")
        .description(
            "CPU cores the unit's processes use, exited children included (the cgroup's counter): a silent "
            "torch.compile shows here. 5% of a core between samples counts as progress."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"sum by ({KEYS}) (rate(llmstartup_process_cpu_seconds_total{{{SEL}}}[$__rate_interval]))",
                "cores",
            )
        )
        .unit("short")
        .axis_label("cores")
        .min(0)
        .legend(legend_bottom())
        .span(6)
        .height(8)
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("Read and written")
        .description(
            "Bytes per second the unit's processes read and write (rchar/wchar: disk, pipes and network, so a download "
            "shows). 64 KiB between samples counts as progress. Zero when the agent may not read /proc/<pid>/io of "
            "processes of another user (no CAP_SYS_PTRACE)."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    f"sum by ({KEYS}) (rate(llmstartup_process_read_bytes_total{{{SEL}}}[$__rate_interval]))",
                    "read",
                    ref="A",
                ),
                query(
                    f"sum by ({KEYS}) (rate(llmstartup_process_written_bytes_total{{{SEL}}}[$__rate_interval]))",
                    "written",
                    ref="B",
                ),
            ]
        )
        .unit("binBps")
        .min(0)
        .legend(legend_bottom())
        .span(6)
        .height(8)
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("Processes")
        .description(
            "The unit's processes by state. Compile workers coming and going count as progress; many in disk_sleep "
            "means they wait on storage."
        )
        .datasource(DATASOURCE)
        .with_target(query(f"sum by ({KEYS}, state) (llmstartup_processes{{{SEL}}})", "{{state}}"))
        .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
        .fill_opacity(40)
        .unit("none")
        .decimals(0)
        .min(0)
        .legend(legend_bottom())
        .span(6)
        .height(8)
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("Resident memory")
        .description(
            "Host memory (RSS) of the unit's processes, summed: weights staged in host memory show here."
        )
        .datasource(DATASOURCE)
        .with_target(query(f"sum by ({KEYS}) (llmstartup_process_resident_memory_bytes{{{SEL}}})", "RSS"))
        .unit("bytes")
        .min(0)
        .legend(legend_bottom())
        .span(6)
        .height(8)
    )
    return d


def unit_where_the_time_goes(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Where the time goes: the last start phase by phase, phase durations against the expected ones."""
    d = d.with_row(dashboard.Row("Where the time goes").id(ids()))
    breakdown = (
        bargauge.Panel()
        .id(ids())
        .title("Last start, phase by phase")
        .description(
            "How long each phase took the last time the unit passed through it, in startup order. After a failed "
            "start, the phases it never reached keep their time from an earlier start."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    f'max by ({KEYS}) (llmstartup_last_phase_duration_seconds{{{SEL}, phase="{p}"}})',
                    p.value,
                    ref=chr(ord("A") + i),
                    instant=True,
                )
                for i, p in enumerate(STARTUP_PHASES)
            ]
        )
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .value_mode(common.BarGaugeValueMode.TEXT)
        .reduce_options(last_value())
        .unit("s")
        .min(0)
        .span(8)
        .height(10)
    )
    for p in STARTUP_PHASES:
        breakdown = breakdown.override_by_name(p.value, [fixed_colour(PHASE_COLOURS[p])])
    d = d.with_panel(breakdown)

    history = (
        timeseries.Panel()
        .id(ids())
        .title("Phase durations over past starts, against the expected")
        .description(
            "Solid: how long each phase took, start after start (the line steps when a start passes through the "
            "phase again). Dashed: the duration the agent expects for the phase from the unit's history "
            "(llmstartup_expected_phase_duration_seconds; no dashed line until the agent keeps history)."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    f"max by ({KEYS}, phase) (llmstartup_last_phase_duration_seconds{{{SEL}}})",
                    "{{phase}}",
                    ref="A",
                ),
                query(
                    f"max by ({KEYS}, phase) (llmstartup_expected_phase_duration_seconds{{{SEL}}})",
                    "{{phase}} expected",
                    ref="B",
                ),
            ]
        )
        .line_interpolation(common.LineInterpolation.STEP_AFTER)
        .unit("s")
        .min(0)
        .legend(legend_table("lastNotNull", "max"))
        .span(16)
        .height(10)
    )
    for p in STARTUP_PHASES:
        history = history.override_by_name(p.value, [fixed_colour(PHASE_COLOURS[p])])
        history = history.override_by_name(
            f"{p.value} expected",
            [
                fixed_colour(PHASE_COLOURS[p]),
                model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            ],
        )
    d = d.with_panel(history)

    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("Phase durations: last, mean, expected")
        .description(
            "Per phase: the last time through it; the mean over every start the agent has counted "
            "(phase_duration_seconds, a count and a sum); what the agent expects from history (the median of its "
            "recent ready starts); and how many starts passed through it."
        )
        .datasource(DATASOURCE)
        .targets(
            [
                query(
                    f"max by (phase) (llmstartup_last_phase_duration_seconds{{{SEL}}})",
                    ref="A",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"sum by (phase) (llmstartup_phase_duration_seconds_sum{{{SEL}}})\n"
                    f"  / sum by (phase) (llmstartup_phase_duration_seconds_count{{{SEL}}})",
                    ref="B",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"max by (phase) (llmstartup_expected_phase_duration_seconds{{{SEL}}})",
                    ref="D",
                    instant=True,
                    table_format=True,
                ),
                query(
                    f"sum by (phase) (llmstartup_phase_duration_seconds_count{{{SEL}}})",
                    ref="E",
                    instant=True,
                    table_format=True,
                ),
            ]
        )
        .transformations(
            merge_table(
                renames={
                    "Value #A": "Last",
                    "Value #B": "Mean",
                    "Value #D": "Expected",
                    "Value #E": "Starts",
                },
                hide=[],
                order=["phase", "Value #A", "Value #B", "Value #D", "Value #E"],
            )
        )
        .override_by_regexp(
            "Last|Mean|Expected",
            [
                model.DynamicConfigValue(id_val="unit", value="s"),
                model.DynamicConfigValue(id_val="decimals", value=0),
            ],
        )
        .override_by_name(
            "phase",
            [
                model.DynamicConfigValue(id_val="mappings", value=text_mappings(PHASES, PHASE_COLOURS)),
                model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
            ],
        )
        .span(24)
        .height(8)
    )
    return d


def unit_outcomes_values_gpus(d: dashboard.Dashboard, ids: Ids) -> dashboard.Dashboard:
    """Outcomes, engine values, GPUs: failures, starts, what the engine reported, GPU busy, Xids."""
    d = d.with_row(dashboard.Row("Outcomes, engine values, GPUs").id(ids()))
    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("Failures by phase and reason")
        .description("The unit's failed starts since the agent started, by phase and reason.")
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"sum by (phase, reason) (llmstartup_failures_total{{{SEL}}}) > 0",
                instant=True,
                table_format=True,
            )
        )
        .transformations(
            merge_table(renames={"Value": "Failures"}, hide=[], order=["phase", "reason", "Value"])
        )
        .span(8)
        .height(8)
    )
    d = d.with_panel(
        bargauge.Panel()
        .id(ids())
        .title("Starts by outcome")
        .description("The unit's starts since the agent started: ready, failed, or stopped before ready.")
        .datasource(DATASOURCE)
        .with_target(
            query(f"sum by (outcome) (llmstartup_startups_total{{{SEL}}})", "{{outcome}}", instant=True)
        )
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .reduce_options(last_value())
        .unit("none")
        .decimals(0)
        .min(0)
        .override_by_name("ready", [fixed_colour(VERDICT_COLOURS["ready"])])
        .override_by_name("failed", [fixed_colour(VERDICT_COLOURS["failed"])])
        .override_by_name("stopped", [fixed_colour(PHASE_COLOURS[Phase.STOPPING])])
        .span(8)
        .height(8)
    )
    values = "|".join(sorted(VALUES))
    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("What the engine reported")
        .description(
            "Values the engine printed while starting, in base units: weights and KV-cache memory in bytes, the KV "
            "cache in tokens, and the durations the engine itself measured, in seconds."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f'label_replace(max by (__name__) ({{__name__=~"llmstartup_({values})", {SEL}}}), "value", "$1", "__name__", "llmstartup_(.*)")',
                "{{value}}",
                instant=True,
            )
        )
        .transformations(
            [model.DataTransformerConfig(id_val="reduce", options={"reducers": ["lastNotNull"]})]
        )
        .span(8)
        .height(8)
    )
    d = d.with_panel(
        timeseries.Panel()
        .id(ids())
        .title("GPU busy (recorded, not a progress signal)")
        .description(
            "Each GPU's busy time on the unit's host. Not used as evidence of progress: a hung NCCL collective keeps a "
            "GPU at 100%."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"max by (cluster, instance, gpu) (llmstartup_gpu_utilization_ratio{{{HOST_SEL}}})",
                "GPU {{gpu}}",
            )
        )
        .unit("percentunit")
        .min(0)
        .max(1)
        .legend(legend_bottom())
        .span(12)
        .height(8)
    )
    d = d.with_panel(
        table.Panel()
        .id(ids())
        .title("Xid errors on this host")
        .description(
            "Xid errors the driver reported on the host's GPUs since the agent started (from the kernel's NVRM lines "
            "and NVML's events). An Xid on a GPU the unit uses is a likely cause of its failure."
        )
        .datasource(DATASOURCE)
        .with_target(
            query(
                f"sum by (gpu, xid) (llmstartup_gpu_xid_errors_total{{{HOST_SEL}}}) > 0",
                instant=True,
                table_format=True,
            )
        )
        .transformations(merge_table(renames={"Value": "Errors"}, hide=[], order=["gpu", "xid", "Value"]))
        .span(12)
        .height(8)
    )
    return d


# --- Output ---------------------------------------------------------------------------------------------


def render(board: dashboard.Dashboard) -> str:
    """Commit-ready JSON: sorted keys, two-space indent, a final newline."""
    return json.dumps(board.build(), cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[Path, str]:
    return {FLEET_FILE: render(fleet()), UNIT_FILE: render(unit())}


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard JSON document, those inside collapsed rows included; rows themselves not."""
    found = []
    for panel in document.get("panels", []):
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def row_panels(document: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels of one row of a dashboard JSON document: those after the row, up to the next one."""
    found: list[dict[str, Any]] | None = None
    for panel in document.get("panels", []):
        if panel.get("type") == "row":
            if found is not None:
                break
            if panel.get("title") == title:
                found = list(panel.get("panels", []))
        elif found is not None:
            found.append(panel)
    return found or []


GRAFANA_VARIABLES = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def panel_queries(
    unit: str = ".+",
    instance: str = ".+",
    cluster: str = ".*",
    range_: str = "1h",
    rate_interval: str = "1m",
    interval: str = "1m",
) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of both dashboards, runnable as they are against Prometheus.

    The template variables become the given values; they all land in regex matchers (`=~`), so pass
    regexes: `.+` for any, or a unit's name. Grafana's own `$__range`, `$__rate_interval` and
    `$__interval` become the given durations.
    """
    values = {
        "unit": unit,
        "instance": instance,
        "cluster": cluster,
        "__range": range_,
        "__rate_interval": rate_interval,
        "__interval": interval,
    }

    def substitute(expr: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match[1] or match[2]
            if name not in values:
                raise KeyError(f"no value for ${name} in {expr!r}")
            return values[name]

        # label_replace's "$1" is a regex group reference, not a variable
        return GRAFANA_VARIABLES.sub(lambda m: m[0] if (m[2] or "").isdigit() else one(m), expr)

    found = []
    for text in outputs().values():
        document = json.loads(text)
        for panel in panels(document):
            for target in panel.get("targets", []):
                found.append((panel["title"], substitute(target["expr"])))
        for annotation in document["annotations"]["list"]:
            if "expr" in annotation:
                found.append((f"annotation: {annotation['name']}", substitute(annotation["expr"])))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"dashboards: wrote {path.relative_to(HERE.parent)}", file=sys.stderr)
    if stale:
        print(
            f"dashboards: {', '.join(stale)} out of date: run python grafana/dashboards.py", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
