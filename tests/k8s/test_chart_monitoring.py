"""The chart's monitoring parts: every series labelled with its node (and pool), the PodMonitor
alternative, the rules bound to this release's DaemonSet and runbooks."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.conftest import by_kind, helm, objects, render


def relabelings(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    (endpoint,) = endpoints
    out: list[dict[str, Any]] = endpoint["relabelings"]
    return out


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_every_series_gets_the_node_name_and_the_pool(kind: str) -> None:
    extra = {"targetLabel": "cluster", "replacement": "eu-1", "action": "replace"}
    drop = {"sourceLabels": ["__name__"], "regex": "preflight_check_duration_seconds",
            "action": "drop"}
    monitor = by_kind(objects(render({kind: {"enabled": True, "relabelings": [extra],
                                             "metricRelabelings": [drop]}})),
                      "ServiceMonitor" if kind == "serviceMonitor" else "PodMonitor")
    rules = relabelings(monitor)
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in rules
    # the default pool: GPU feature discovery's product label, read from the node's metadata
    assert {"sourceLabels": ["__meta_kubernetes_node_label_nvidia_com_gpu_product"],
            "targetLabel": "pool", "action": "replace"} in rules
    assert monitor["spec"]["attachMetadata"] == {"node": True}
    assert rules[-1] == extra  # the user's come after the chart's
    endpoint = (monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"])[0]
    assert endpoint["metricRelabelings"] == [drop]
    if kind == "podMonitor":  # the job name the rules expect, not the operator's default
        assert rules[0] == {"targetLabel": "job", "replacement": "preflight", "action": "replace"}


def test_without_a_pool_label_no_node_metadata_is_asked_for() -> None:
    sm = by_kind(objects(render({"serviceMonitor": {"enabled": True},
                                 "pool": {"nodeLabel": ""}})), "ServiceMonitor")
    assert "attachMetadata" not in sm["spec"]
    assert [r["targetLabel"] for r in relabelings(sm)] == ["node"]


def test_a_custom_pool_label_is_sanitised_as_prometheus_does() -> None:
    sm = by_kind(objects(render({"serviceMonitor": {"enabled": True},
                                 "pool": {"nodeLabel": "cloud.google.com/gke-nodepool"}})),
                 "ServiceMonitor")
    assert relabelings(sm)[1]["sourceLabels"] == [
        "__meta_kubernetes_node_label_cloud_google_com_gke_nodepool"]


def test_both_monitors_at_once_is_refused() -> None:
    with pytest.raises(Exception, match="enable one of them"):
        render({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})


def test_rules_watch_this_releases_daemonset_and_link_absolute_runbooks() -> None:
    rule = by_kind(objects(render({"prometheusRule": {"enabled": True}}, name="gpu",
                                  namespace="gpu-monitoring")), "PrometheusRule")
    rules = {r.get("alert") or r["record"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    expr = rules["PreflightDaemonSetPodsNotReady"]["expr"]
    assert 'namespace="gpu-monitoring", daemonset="gpu-cluster-preflight"' in expr
    assert "=~" not in expr
    for name, r in rules.items():
        if "alert" in r:
            assert r["annotations"]["runbook_url"] == (
                f"https://github.com/cluster-preflight/cluster-preflight/blob/main/docs/runbooks/"
                f"{name}.md")


@pytest.mark.parametrize("values", [{"prometheusRule": {"runbookBaseURL": "docs/runbooks/"}},
                                    {"prometheusRule": {"runbookBaseURL": "https://x/runbooks"}},
                                    {"pool": {"nodeLabel": "bad label"}},
                                    {"podMonitor": {"relabelings": {"a": 1}}}])
def test_the_schema_rejects_a_relative_runbook_url_and_odd_labels(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(values)
