"""The Helm chart: rendered by Helm's engine, every manifest valid for Kubernetes (strict), the
alert rules and dashboard exactly those of deploy/, the values typed by the schema."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import run_cli, write_fixture
from tests.k8s.conftest import (
    ALL_ON,
    CHART,
    DASHBOARD,
    KUBE_VERSIONS,
    OPERATOR_KINDS,
    PROMTOOL,
    RULES,
    RULES_TEST,
    by_kind,
    helm,
    kubernetes_validate,
    needs_promtool,
    objects,
    render,
    write_docs,
)
from tests.topologies import healthy_8x_h100


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "all-optional-parts-on"])
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_rendered_manifest_is_valid_kubernetes(tmp_path: Path, values: dict[str, Any],
                                                     version: str) -> None:
    docs = objects(render(values))
    core = [d for d in docs if d["kind"] not in OPERATOR_KINDS]
    files = [write_docs(tmp_path / f"{i}-{d['kind']}.yaml", [d]) for i, d in enumerate(core)]
    proc = kubernetes_validate(files, version)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "DaemonSet", "Service", "ServiceAccount"]
    if values:
        expected += ["ConfigMap", "PrometheusRule", "ServiceMonitor"]
    assert kinds == sorted(expected)


def test_the_strict_validation_rejects_a_misspelled_field(tmp_path: Path) -> None:
    """The validation above can fail: a typo in the pod spec is an error, not ignored."""
    ds = by_kind(objects(render()), "DaemonSet")
    ds["spec"]["template"]["spec"]["tolerationz"] = ds["spec"]["template"]["spec"].pop(
        "tolerations")
    proc = kubernetes_validate([write_docs(tmp_path / "ds.yaml", [ds])], KUBE_VERSIONS[-1])
    assert proc.returncode != 0
    assert "tolerationz" in proc.stdout + proc.stderr


def test_daemonset_runs_serve_non_root_read_only_on_every_gpu_node() -> None:
    docs = objects(render({"runtimeClassName": "nvidia"}))
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert ctr["args"][0] == "serve"
    assert ctr["args"][ctr["args"].index("--root") + 1] == "/host"
    assert ctr["args"][ctr["args"].index("--listen") + 1] == "0.0.0.0:9857"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # GPU nodes and nodes a health tool tainted keep their daemon
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # no GPU request: the daemon must not take GPUs away from jobs
    assert "nvidia.com/gpu" not in json.dumps(ctr["resources"])
    env = {e["name"]: e["value"] for e in ctr["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/host/sys"]["readOnly"] is True
    assert volumes[mounts["/host/sys"]["name"]]["hostPath"]["path"] == "/sys"
    assert volumes[mounts["/host/dev/shm"]["name"]]["hostPath"]["path"] == "/dev/shm"
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "runtimeClassName" not in by_kind(objects(render()), "DaemonSet")["spec"]["template"][
        "spec"], "runtimeClassName is an option, off by default"


def test_the_daemonsets_config_and_root_are_accepted_by_preflight(tmp_path: Path) -> None:
    """The ConfigMap the chart writes is a config preflight loads (an unknown key would exit 2),
    and --root /host finds /dev/shm under it as the mounts lay it out."""
    config = by_kind(objects(render({"config": {"interval_s": 30, "shm_min_bytes": 4096}})),
                     "ConfigMap")["data"]["preflight.yaml"]
    (tmp_path / "preflight.yaml").write_text(config)
    host = tmp_path / "host"
    (host / "dev" / "shm").mkdir(parents=True)
    (host / "sys").mkdir()
    fixture = write_fixture(tmp_path / "nvml.json", healthy_8x_h100())
    proc = run_cli(["check", "--json", "--no-bandwidth", "--only", "shm,gpu_visible",
                    "--config", str(tmp_path / "preflight.yaml"), "--root", str(host)],
                   fixture=fixture)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["shm"]["status"] == "pass"
    assert results["shm"]["details"]["path"] == str(host / "dev" / "shm")

    bad = objects(render({"config": {"intervall_s": 30}}))
    (tmp_path / "bad.yaml").write_text(by_kind(bad, "ConfigMap")["data"]["preflight.yaml"])
    proc = run_cli(["check", "--no-bandwidth", "--config", str(tmp_path / "bad.yaml")],
                   fixture=fixture)
    assert proc.returncode == 2
    assert "intervall_s" in proc.stderr + proc.stdout


def test_prometheus_rule_is_the_deploy_rule_file_itself() -> None:
    """One source: the chart's files/ entry is a symlink into deploy/, and what Helm renders
    equals deploy/prometheus/preflight-rules.yaml group for group, but for the DaemonSet the
    kube-state-metrics rule watches (this release's; tests/k8s/test_chart_monitoring.py)."""
    link = CHART / "files" / "preflight-rules.yaml"
    assert link.is_symlink()
    assert link.resolve() == RULES.resolve()
    rule = by_kind(objects(render({"prometheusRule": {"enabled": True}})), "PrometheusRule")
    text = RULES.read_text().replace('daemonset=~".*cluster-preflight.*"',
                                     'namespace="monitoring", daemonset="pf-cluster-preflight"')
    assert rule["spec"]["groups"] == yaml.safe_load(text)["groups"]


def test_dashboard_configmap_is_the_deploy_dashboard_itself() -> None:
    link = CHART / "files" / "preflight-dashboard.json"
    assert link.is_symlink()
    assert link.resolve() == DASHBOARD.resolve()
    (cm,) = [d for d in objects(render({"dashboard": {"enabled": True}}))
             if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["preflight-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_a_packaged_chart_carries_the_rules_not_a_link(tmp_path: Path) -> None:
    """`helm package` (what a chart repository serves) follows the link: the archive renders the
    same rules with deploy/ far away."""
    archive = helm.package(str(CHART), destination=str(tmp_path))
    with tarfile.open(archive) as tar:
        member = tar.getmember("cluster-preflight/files/preflight-rules.yaml")
        assert member.isfile(), "the archive holds the file, not the link"
    chart = helm.Chart.load_archive(Path(archive).read_bytes())
    out = chart.render({"prometheusRule": {"enabled": True}}, name="pf", namespace="m")
    rule = by_kind(objects(out), "PrometheusRule")
    text = RULES.read_text().replace('daemonset=~".*cluster-preflight.*"',
                                     'namespace="m", daemonset="pf-cluster-preflight"')
    assert rule["spec"]["groups"] == yaml.safe_load(text)["groups"]


@needs_promtool
@pytest.mark.parametrize("base", ["https://git.example.com/ops/runbooks/"])
def test_rendered_rules_pass_promtool_check_and_the_rule_unit_tests(tmp_path: Path,
                                                                    base: str | None) -> None:
    """(The default base is the deploy/ file's own: tests/alerts runs those unit tests.)"""
    assert PROMTOOL is not None
    values: dict[str, Any] = {"enabled": True}
    if base:
        values["runbookBaseURL"] = base
    # the DaemonSet the unit tests' kube-state-metrics series name
    rule = by_kind(objects(render({"prometheusRule": values}, name="preflight",
                                  namespace="gpu-monitoring")), "PrometheusRule")
    rules_file = tmp_path / "rendered-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    # the unit tests of deploy/, pointed at the rendered rules and expecting their runbook_url
    default = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"][
        "runbookBaseURL"]
    tests = yaml.safe_load(RULES_TEST.read_text())
    tests["rule_files"] = [str(rules_file)]
    text = yaml.safe_dump(tests).replace(f"runbook_url: {default}", f"runbook_url: {base}") \
        if base else yaml.safe_dump(tests)
    (tmp_path / "rendered-rules.test.yaml").write_text(text)
    test = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "rendered-rules.test.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert test.returncode == 0, test.stdout + test.stderr
    urls = {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]
            if "alert" in r}
    assert all(u.startswith(base or default) and u.endswith(".md") for u in urls), urls


def test_service_monitor_scrapes_as_the_job_the_alerts_expect() -> None:
    docs = objects(render(ALL_ON))
    sm, svc = by_kind(docs, "ServiceMonitor"), by_kind(docs, "Service")
    # Prometheus names the job after the Service label that jobLabel points at
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "preflight"
    assert 'up{job="preflight"}' in RULES.read_text()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize(("values", "where"), [
    ({"port": "9857"}, "/port"),
    ({"hostNetwork": "yes"}, "/hostNetwork"),
    ({"serviceMonitor": {"enabled": 1}}, "/serviceMonitor/enabled"),
    ({"tolerations": {"key": "nvidia.com/gpu"}}, "/tolerations"),
    ({"serviceMonitr": {"enabled": True}}, "serviceMonitr"),
])
def test_the_schema_rejects_a_wrong_value(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)


def test_every_value_is_in_the_schema_and_the_readme() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()

    def leaves(tree: dict[str, Any], sch: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, value in tree.items():
            assert key in sch["properties"], f"{prefix}{key} missing from values.schema.json"
            sub = sch["properties"][key]
            if isinstance(value, dict) and "properties" in sub:
                out += leaves(value, sub, f"{prefix}{key}.")
            else:
                out.append(f"{prefix}{key}")
        return out

    for key in leaves(defaults, schema):
        assert f"`{key}`" in readme, f"{key} is not described in helm/cluster-preflight/README.md"
    helm.Chart.load(str(CHART)).validate_schema(defaults)


def test_notes_tell_where_the_report_is() -> None:
    notes = render({"serviceMonitor": {"enabled": True}})["cluster-preflight/templates/NOTES.txt"]
    assert "curl -s localhost:9857/report" in notes
    assert "kubectl -n monitoring get pods" in notes


def test_lint_is_clean_in_strict_mode() -> None:
    report = helm.lint(os.fspath(CHART), strict=True, kube_version="v1.37.0")
    errors = [m for m in report["messages"] if m["severity"] >= 2]
    assert not errors and not report["errors"], report
