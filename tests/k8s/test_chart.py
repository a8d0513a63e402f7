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
        expected += ["ConfigMap", "PrometheusRule", "ServiceMonitor", "ClusterRole",
                     "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                     # the identity the ServiceMonitor scrapes with through kube-rbac-proxy
                     "ServiceAccount", "Secret", "ClusterRoleBinding"]
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
    # the node's own IP (the Downward API's status.hostIP), never every address
    assert ctr["args"][ctr["args"].index("--listen") + 1] == "$(HOST_IP):9857"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # every taint, NoExecute included: nodes a health tool tainted keep their daemon
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    # no GPU request: the daemon must not take GPUs away from jobs
    assert "nvidia.com/gpu" not in json.dumps(ctr["resources"])
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all",
                   "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                   "HOST_IP": {"fieldRef": {"fieldPath": "status.hostIP"}},
                   "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert pod["automountServiceAccountToken"] is False, "no token unless something uses it"
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the journal, read-only, for the xid check's history; non-root with the adm group
    assert mounts["/host/var/log"]["readOnly"] is True
    assert volumes[mounts["/host/var/log"]["name"]]["hostPath"]["path"] == "/var/log"
    assert pod["securityContext"]["supplementalGroups"] == [4]
    assert "/dev/shm" not in mounts, "the bandwidth test is off: no worker /dev/shm"
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
    assert "kubectl get --raw /api/v1/namespaces/monitoring/pods/POD:9857/proxy/report" in notes
    assert "kubectl -n monitoring get pods" in notes
    assert "kubectl get nodes -l nvidia.com/gpu.present=true" in notes
    notes = render(ALL_ON)["cluster-preflight/templates/NOTES.txt"]
    assert "https://NODE_IP:9857/report" in notes
    assert "memory limit 4352Mi for 4 GPUs" in notes


def test_lint_is_clean_in_strict_mode() -> None:
    report = helm.lint(os.fspath(CHART), strict=True, kube_version="v1.37.0")
    errors = [m for m in report["messages"] if m["severity"] >= 2]
    assert not errors and not report["errors"], report


# ---- the headline checks, node status, RBAC, authenticated scrapes -------------------------

def pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(objects(render(values)), "DaemonSet")["spec"]["template"][
        "spec"]
    return spec


def container(spec: dict[str, Any], name: str = "preflight") -> dict[str, Any]:
    (found,) = [c for c in spec["containers"] if c["name"] == name]
    return found


def test_the_bandwidth_switch_picks_the_engine_image_shm_and_memory() -> None:
    spec = pod_spec({"bandwidthTest": {"enabled": True}})
    ctr = container(spec)
    assert ctr["image"] == "registry.example.com/cluster-preflight:nccl-0.1.0"
    (shm,) = [m for m in ctr["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == shm["name"]]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "1036Mi"}
    # 512 Mi base + 8 GPUs x 1024 Mi + the /dev/shm pages, which count against the limit
    assert ctr["resources"]["limits"]["memory"] == "9740Mi"
    assert ctr["resources"]["requests"]["memory"] == "96Mi", "the request stays small"
    one = container(pod_spec({"bandwidthTest": {"enabled": True, "gpusPerNode": 1}}))
    assert one["resources"]["limits"]["memory"] == f"{512 + 1024 + 1024}Mi"
    # what the chart's shm size promises is what the shm check asks of a node with 8 GPUs
    from preflight.checks.shm import need_bytes

    assert need_bytes(8, channels=16, floor_bytes=1 << 30) <= 1036 * (1 << 20)
    assert container(pod_spec({}))["image"].endswith(":node-0.1.0")


def test_kmsg_needs_and_gets_a_privileged_root_container() -> None:
    spec = pod_spec({"kernelLog": {"source": "kmsg"}})
    ctr = container(spec)
    assert spec["securityContext"]["runAsUser"] == 0
    assert ctr["securityContext"]["privileged"] is True
    (mount,) = [m for m in ctr["volumeMounts"] if m["mountPath"] == "/host/dev/kmsg"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert vol["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    spec = pod_spec({"kernelLog": {"source": "none"}})
    assert not [m for m in container(spec)["volumeMounts"] if "/var/log" in m["mountPath"] or
                "kmsg" in m["mountPath"]]
    assert "supplementalGroups" not in spec["securityContext"]


def test_every_extra_value_reaches_the_pod() -> None:
    spec = pod_spec(ALL_ON)
    ctr = container(spec)
    assert ctr["args"][-2:] == ["--bandwidth-interval", "7200"]
    assert {"name": "PREFLIGHT_LOG_LEVEL", "value": "info"} in ctr["env"]
    assert {"name": "golden", "mountPath": "/etc/preflight-golden", "readOnly": True} in ctr[
        "volumeMounts"]
    assert {"name": "golden", "configMap": {"name": "golden-fingerprint"}} in spec["volumes"]
    meta = by_kind(objects(render(ALL_ON)), "DaemonSet")["spec"]["template"]["metadata"]
    assert meta["labels"]["example.com/cost-centre"] == "gpu"
    assert meta["annotations"]["example.com/team"] == "ml-infra"
    assert spec["securityContext"]["supplementalGroups"] == [4, 101]
    (log,) = [v for v in spec["volumes"] if v["name"] == "host-log"]
    assert log["hostPath"]["path"] == "/run/log"
    assert spec["automountServiceAccountToken"] is True


def test_node_status_config_comes_from_its_values() -> None:
    (cm,) = [d for d in objects(render(ALL_ON)) if d["kind"] == "ConfigMap"
             and "preflight.yaml" in d["data"]]
    config = yaml.safe_load(cm["data"]["preflight.yaml"])
    assert {k: v for k, v in config.items() if k.startswith("kube_")} == {
        "kube_node_status": True, "kube_fail_runs": 2, "kube_pass_runs": 4,
        "kube_node_taint": True, "kube_max_marked_fraction": 0.2,
        "kube_guard_selector": "example.com/pool=a100", "kube_heartbeat_s": 120}
    default = yaml.safe_load(by_kind(objects(render({"nodeStatus": {"enabled": True}})),
                                     "ConfigMap")["data"]["preflight.yaml"])
    assert default["kube_guard_selector"] == "nvidia.com/gpu.present=true", "the nodeSelector"
    from preflight.core.config import from_mapping

    from_mapping(config, source="the chart's ConfigMap")  # preflight accepts every key
    with pytest.raises(Exception, match="set nodeStatus"):
        render({"config": {"kube_node_taint": True}})


def rbac_rules(values: dict[str, Any]) -> set[tuple[str, str]]:
    """(verb, resource) pairs the chart grants the daemon's ServiceAccount, as the test API
    server spells them (events@namespace for the namespaced Role)."""
    docs = objects(render(values))
    granted: set[tuple[str, str]] = set()
    for kind in ("ClusterRole", "Role"):
        for role in (d for d in docs if d["kind"] == kind and
                     not d["metadata"]["name"].endswith("-metrics-reader")):
            where = f"@{role['metadata']['namespace']}" if kind == "Role" else ""
            for rule in role["rules"]:
                if rule.get("apiGroups") != [""]:
                    continue
                granted |= {(v, f"{r}{where}") for r in rule["resources"] for v in rule["verbs"]}
    return granted


@pytest.mark.parametrize(("taint", "fraction"), [(False, 1.0), (True, 1.0), (False, 0.1),
                                                 (True, 0.1)])
def test_rbac_is_exactly_what_the_writer_uses(taint: bool, fraction: float) -> None:
    """The rules the writer's tests run with (tests/kube: iter_rules) are the chart's."""
    from tests.kube.apiserver import iter_rules

    values = {"nodeStatus": {"enabled": True, "taint": taint, "maxMarkedFraction": fraction}}
    assert rbac_rules(values) == set(iter_rules(taint=taint, guard=fraction < 1))
    docs = objects(render(values))
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == "default", "events about Nodes live there"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pf-cluster-preflight",
                                    "namespace": "monitoring"}]


def test_no_rbac_and_no_token_by_default() -> None:
    docs = objects(render())
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "Role", "ClusterRoleBinding",
                                                 "RoleBinding")]


def test_kube_rbac_proxy_fronts_the_daemon() -> None:
    spec = pod_spec({"kubeRbacProxy": {"enabled": True}})
    ctr, proxy = container(spec), container(spec, "kube-rbac-proxy")
    assert ctr["args"][ctr["args"].index("--listen") + 1] == "127.0.0.1:9858"
    assert "ports" not in ctr
    assert "--secure-listen-address=$(HOST_IP):9857" in proxy["args"]
    assert "--upstream=http://127.0.0.1:9858/" in proxy["args"]
    assert proxy["ports"][0]["name"] == "metrics", "the Service's targetPort"
    assert ctr["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    docs = objects(render({"kubeRbacProxy": {"enabled": True}}))
    (reader,) = [d for d in docs if d["metadata"]["name"].endswith("-metrics-reader")]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics", "/report"], "verbs": ["get"]}]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d is not reader]
    assert {r["resources"][0] for r in role["rules"]} == {"tokenreviews",
                                                         "subjectaccessreviews"}


@pytest.mark.parametrize(("values", "where"), [
    ({"kernelLog": {"source": "dmesg"}}, "/kernelLog/source"),
    ({"bandwidthTest": {"gpusPerNode": 0}}, "/bandwidthTest/gpusPerNode"),
    ({"nodeStatus": {"maxMarkedFraction": 1.5}}, "/nodeStatus/maxMarkedFraction"),
    ({"nodeStatus": {"heartbeatSeconds": 1}}, "/nodeStatus/heartbeatSeconds"),
    ({"extraVolumeMounts": [{"name": "x"}]}, "/extraVolumeMounts/0"),
])
def test_the_schema_rejects_a_wrong_new_value(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)
