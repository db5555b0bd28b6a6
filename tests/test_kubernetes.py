"""deploy/kubernetes/: every manifest validates against the Kubernetes schemas, offline; the
PrometheusRule is up to date with deploy/prometheus/llmstartup.rules.yml.

Built-in kinds: the strict schemas bundled in the kubernetes-validate package (unknown fields are
errors). ServiceMonitor and PrometheusRule: the prometheus-operator CRD schemas vendored in
tests/schemas/ (see its README for where they come from), made strict the same way.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.needs import missing, module

jsonschema = module("jsonschema", "jsonschema (the test extra)")
kubernetes_validate = module("kubernetes_validate", "kubernetes-validate, with the Kubernetes schemas (the test extra)")

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "deploy" / "kubernetes"
RULES = ROOT / "deploy" / "prometheus" / "llmstartup.rules.yml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1.json",
}
# The oldest Kubernetes release still maintained when this was written, and the newest the package knows.
VERSIONS = ("1.32", kubernetes_validate.latest_version())


def _load_generator():
    spec = importlib.util.spec_from_file_location("llmstartup_k8s_generate", MANIFESTS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file#index, object) for every Kubernetes object under deploy/kubernetes/."""
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                found.append((f"{path.name}#{i}", doc))
    return found


def _strict(node: Any) -> Any:
    """additionalProperties: false on every object schema that lists its properties and keeps no
    unknown fields, as the API server's strict field validation rejects an unknown field."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    assert {"group": api_version.split("/")[0], "version": api_version.split("/")[1], "kind": kind} in schema[
        "x-kubernetes-group-version-kind"
    ]
    # The one $ref out of the CRD schema is ObjectMeta, in the API server's components; take it, and
    # what it refers to, from kubernetes-validate's strict definitions.
    definitions_file = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{kubernetes_validate.latest_version()}-local-strict"
        / "_definitions.json"
    )
    text = json.dumps(_strict(schema)).replace('"#/components/schemas/', '"#/$defs/')
    schema = json.loads(text)
    schema["$defs"] = json.loads(definitions_file.read_text())["$defs"]
    schema["properties"]["apiVersion"]["const"] = api_version
    schema["properties"]["kind"]["const"] = kind
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def validate(obj: dict[str, Any]) -> None:
    """Raises if obj is not a valid object of its kind (for every Kubernetes version in VERSIONS)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CRDS:
        crd_validator(*key).validate(obj)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("where, obj", manifests(), ids=[where for where, _ in manifests()])
def test_manifest_is_valid(where: str, obj: dict[str, Any]) -> None:
    if obj.get("kind") == "Kustomization":
        listed = set(obj["resources"])
        on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == on_disk, "kustomization.yaml lists every manifest and only them"
        return
    validate(obj)


def test_the_expected_objects_are_there() -> None:
    kinds = sorted(obj["kind"] for _, obj in manifests())
    expected = ["DaemonSet", "Kustomization", "Namespace", "Service", "ServiceAccount", "ServiceMonitor"]
    if RULES.exists():
        expected.append("PrometheusRule")
    assert kinds == sorted(expected)


@pytest.mark.parametrize(
    "mutate, why",
    [
        pytest.param(
            lambda o: o["spec"]["template"]["spec"].update(hostPid=True), "unknown field", id="typo"
        ),
        pytest.param(
            lambda o: o["spec"]["template"]["spec"]["containers"][0].update(ports="9847"),
            "wrong type",
            id="type",
        ),
        pytest.param(lambda o: o["spec"].pop("selector"), "required field", id="required"),
    ],
)
def test_validation_catches_a_broken_daemonset(mutate, why: str) -> None:
    (daemonset,) = [copy.deepcopy(o) for _, o in manifests() if o["kind"] == "DaemonSet"]
    mutate(daemonset)
    with pytest.raises(jsonschema.ValidationError):
        validate(daemonset)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda o: o["spec"]["endpoints"][0].update(intervall="15s"), id="typo"),
        pytest.param(
            lambda o: o["spec"]["endpoints"][0]["relabelings"][0].update(action="rename"), id="enum"
        ),
        pytest.param(lambda o: o.update(kind="PodMonitor"), id="kind"),
    ],
)
def test_validation_catches_a_broken_servicemonitor(mutate) -> None:
    (monitor,) = [copy.deepcopy(o) for _, o in manifests() if o["kind"] == "ServiceMonitor"]
    mutate(monitor)
    with pytest.raises(jsonschema.ValidationError):
        crd_validator("monitoring.coreos.com/v1", "ServiceMonitor").validate(monitor)


def test_daemonset_runs_the_agent_as_the_issue_asks() -> None:
    (ds,) = [o for _, o in manifests() if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["supplementalGroups"], "the journal's group"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "--path.cgroupfs=/host/sys/fs/cgroup" in container["args"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/metrics"
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in ("/var/log/journal", "/run/log/journal", "/etc/machine-id", "/host/sys/fs/cgroup", "/var/log/pods",
                 "/var/log/containers"):
        assert mounts[path]["readOnly"] is True, path
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path.removeprefix("/host"), path
    # Service → pods → ServiceMonitor line up on the same labels and port name.
    (service,) = [o for _, o in manifests() if o["kind"] == "Service"]
    (monitor,) = [o for _, o in manifests() if o["kind"] == "ServiceMonitor"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {p["name"] for p in service["spec"]["ports"]} >= {e["port"] for e in monitor["spec"]["endpoints"]}
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    # the agent pod's own namespace, pod and container are dropped: unit_info's, a model server's, stay as they are
    drops = [r for r in monitor["spec"]["endpoints"][0]["relabelings"] if r["action"] == "labeldrop"]
    assert any(all(re.fullmatch(r["regex"], label) for label in ("namespace", "pod", "container")) for r in drops)
    assert not any(re.fullmatch(r["regex"], "instance") or re.fullmatch(r["regex"], "job") for r in drops)


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902's add (to an object or the end of a list, `/-`) and replace, as kustomize applies them."""
    obj = copy.deepcopy(obj)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "add" and last == "-":
            node.append(op["value"])
        elif op["op"] in ("add", "replace"):
            assert op["op"] == "add" or last in node, op
            node[last] = op["value"]
        else:
            raise AssertionError(f"not an op kustomize is given here: {op}")
    return obj


def test_the_docker_overlay_mounts_dockers_containers_and_runs_as_root_without_capabilities() -> None:
    overlay = yaml.safe_load((MANIFESTS / "docker" / "kustomization.yaml").read_text())
    assert overlay["resources"] == [".."]
    [patch] = overlay["patches"]
    (ds,) = [o for _, o in manifests() if o["kind"] == patch["target"]["kind"] and o["metadata"]["name"] == patch["target"]["name"]]
    patched = _json_patch(ds, yaml.safe_load(patch["patch"]))
    validate(patched)
    pod = patched["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    docker = mounts["/var/lib/docker/containers"]
    assert docker["readOnly"] is True and volumes[docker["name"]]["hostPath"]["path"] == "/var/lib/docker/containers"
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsNonRoot"]) == (0, False)
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "add" not in container["securityContext"]["capabilities"]
    assert all(m.get("readOnly") for p, m in mounts.items() if p not in ("/var/lib/llmstartup", "/tmp"))


# --- The PrometheusRule, generated from the rules file --------------------------------------------

SAMPLE_RULES = """
groups:
  - name: sample
    rules:
      - record: instance_unit:llmstartup_stalled:max
        expr: max by (instance, unit) (llmstartup_unit_verdict{verdict="stalled"})
      - alert: Sample
        expr: |
          instance_unit:llmstartup_stalled:max
          == 1
        for: 5m
        labels: {severity: warning}
        annotations: &a
          summary: "{{ $labels.unit }} is stalled"
      - alert: Sample2
        expr: vector(1)
        annotations: *a
"""


def test_generator_embeds_a_rules_file_unchanged() -> None:
    text = generate.render(SAMPLE_RULES)
    (obj,) = list(yaml.safe_load_all(text))
    validate(obj)
    assert obj["spec"]["groups"] == yaml.safe_load(SAMPLE_RULES)["groups"]
    assert "&" not in text.split("---", 1)[1] and "*a" not in text, "no YAML anchors in the output"
    assert generate.render(SAMPLE_RULES) == text, "deterministic"


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param({"alert": "NoExpr", "for": "5m"}, id="no-expr"),
        pytest.param({"alert": "BadFor", "expr": "vector(1)", "for": "5 minutes"}, id="bad-duration"),
        pytest.param({"alert": "Typo", "expr": "vector(1)", "anotations": {}}, id="unknown-field"),
    ],
)
def test_validation_catches_a_broken_rule(rule: dict[str, Any]) -> None:
    (obj,) = list(
        yaml.safe_load_all(generate.render(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]})))
    )
    with pytest.raises(jsonschema.ValidationError):
        validate(obj)


def test_generator_refuses_a_file_without_groups() -> None:
    with pytest.raises(ValueError):
        generate.render("rules: []\n")


def test_prometheusrule_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(MANIFESTS / "generate.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    committed = (MANIFESTS / "prometheusrule.yaml").read_text()
    assert committed == generate.render(RULES.read_text())
    (obj,) = list(yaml.safe_load_all(committed))
    assert obj["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_prometheusrule_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool (Debian package prometheus)")
    path = MANIFESTS / "prometheusrule.yaml"
    (obj,) = list(yaml.safe_load_all(path.read_text()))
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, sort_keys=False))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
