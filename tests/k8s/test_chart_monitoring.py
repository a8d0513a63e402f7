"""The chart's monitoring parts: every series labelled with its node (and pool), the PodMonitor
alternative, the rules bound to this release's DaemonSet and runbooks, and scraping through
kube-rbac-proxy (HTTPS, a ServiceAccount's token, a tlsConfig)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import (
    KUBE_VERSIONS,
    OPERATOR_KINDS,
    by_kind,
    helm,
    kubernetes_validate,
    objects,
    render,
    write_docs,
)


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


# -- scraping through kube-rbac-proxy ---------------------------------------------------------

#: Fields of an endpoint in the Prometheus operator's CRDs (monitoring.coreos.com/v1, v0.8x):
#: a PodMonitor's endpoint has no file-based fields (no bearerTokenFile, no caFile).
ENDPOINT_FIELDS = {
    "ServiceMonitor": {"authorization", "basicAuth", "bearerTokenFile", "bearerTokenSecret",
                       "enableHttp2", "filterRunning", "followRedirects", "honorLabels",
                       "honorTimestamps", "interval", "metricRelabelings", "noProxy", "oauth2",
                       "params", "path", "port", "proxyConnectHeader", "proxyFromEnvironment",
                       "proxyUrl", "relabelings", "scheme", "scrapeTimeout", "targetPort",
                       "tlsConfig", "trackTimestampsStaleness"},
    "PodMonitor": {"authorization", "basicAuth", "bearerTokenSecret", "enableHttp2",
                   "filterRunning", "followRedirects", "honorLabels", "honorTimestamps",
                   "interval", "metricRelabelings", "noProxy", "oauth2", "params", "path",
                   "port", "portNumber", "proxyConnectHeader", "proxyFromEnvironment",
                   "proxyUrl", "relabelings", "scheme", "scrapeTimeout", "targetPort",
                   "tlsConfig", "trackTimestampsStaleness"},
}
#: A PodMonitor's tlsConfig (SafeTLSConfig) and a ServiceMonitor's (which adds the file fields).
TLS_FIELDS = {"ca", "cert", "insecureSkipVerify", "keySecret", "maxVersion", "minVersion",
              "serverName"}
KIND = {"serviceMonitor": "ServiceMonitor", "podMonitor": "PodMonitor"}


def endpoint(monitor: dict[str, Any]) -> dict[str, Any]:
    (ep,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    out: dict[str, Any] = ep
    return out


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_without_the_proxy_the_monitor_scrapes_plain_http(kind: str) -> None:
    docs = objects(render({kind: {"enabled": True}}))
    ep = endpoint(by_kind(docs, KIND[kind]))
    assert not {"scheme", "authorization", "tlsConfig"} & ep.keys()
    assert not [d for d in docs if d["kind"] == "Secret"]


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_behind_the_proxy_the_monitor_scrapes_https_with_a_token_it_may_use(
        tmp_path: Path, kind: str, version: str) -> None:
    docs = objects(render({kind: {"enabled": True}, "kubeRbacProxy": {"enabled": True}},
                          name="gpu", namespace="gpu-monitoring"))
    ep = endpoint(by_kind(docs, KIND[kind]))
    assert set(ep) <= ENDPOINT_FIELDS[KIND[kind]], set(ep) - ENDPOINT_FIELDS[KIND[kind]]
    assert set(ep["tlsConfig"]) <= TLS_FIELDS
    assert ep["scheme"] == "https"
    assert ep["tlsConfig"] == {"insecureSkipVerify": True}  # the proxy's self-signed cert
    assert ep["authorization"] == {"type": "Bearer", "credentials": {
        "name": "gpu-cluster-preflight-scraper-token", "key": "token"}}
    # The Secret holds the token of a ServiceAccount bound to the reader role, which may get
    # /metrics: what kube-rbac-proxy's SubjectAccessReview asks.
    secret = by_kind(docs, "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["namespace"] == "gpu-monitoring"  # the monitor's: the operator's
    sa_name = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert {"kind": "ServiceAccount", "name": sa_name} in [
        {"kind": d["kind"], "name": d["metadata"]["name"]} for d in docs]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"
                  and d["subjects"][0]["name"] == sa_name]
    reader = next(d for d in docs if d["kind"] == "ClusterRole"
                  and d["metadata"]["name"] == binding["roleRef"]["name"])
    assert {"nonResourceURLs": ["/metrics", "/report"], "verbs": ["get"]} in reader["rules"]
    assert binding["subjects"][0]["namespace"] == "gpu-monitoring"
    core = [d for d in docs if d["kind"] not in OPERATOR_KINDS | {"PodMonitor"}]
    files = [write_docs(tmp_path / f"{i}-{d['kind']}.yaml", [d]) for i, d in enumerate(core)]
    proc = kubernetes_validate(files, version)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_a_verified_certificate_and_an_own_token_secret(kind: str) -> None:
    ca = {"secret": {"name": "proxy-ca", "key": "ca.crt"}}
    docs = objects(render({kind: {"enabled": True}, "kubeRbacProxy": {
        "enabled": True, "tlsSecret": "proxy-tls", "scrape": {
            "insecureSkipVerify": False, "ca": ca, "serverName": "preflight.gpu.internal",
            "tokenSecret": {"name": "my-scraper", "key": "jwt"}}}}))
    ep = endpoint(by_kind(docs, KIND[kind]))
    assert ep["tlsConfig"] == {"insecureSkipVerify": False, "ca": ca,
                               "serverName": "preflight.gpu.internal"}
    assert ep["authorization"]["credentials"] == {"name": "my-scraper", "key": "jwt"}
    assert not [d for d in docs if d["metadata"]["name"].endswith("-scraper")
                or d["kind"] == "Secret"]


def test_without_a_monitor_no_scraper_identity_is_made() -> None:
    docs = objects(render({"kubeRbacProxy": {"enabled": True}}))
    assert not [d for d in docs if "scraper" in d["metadata"]["name"]]


@pytest.mark.parametrize(("scrape", "tls_secret", "message"), [
    ({"ca": {"secret": {"name": "c", "key": "ca.crt"}}}, "t", "verifies nothing"),
    ({"insecureSkipVerify": False}, "t", "needs kubeRbacProxy.scrape.ca"),
    ({"insecureSkipVerify": False, "ca": {"secret": {"name": "c", "key": "ca.crt"}}}, "",
     "self-signed certificate cannot be verified"),
])
def test_a_tls_setting_that_cannot_work_fails_the_install(scrape: dict[str, Any],
                                                          tls_secret: str, message: str) -> None:
    with pytest.raises(Exception, match=message):
        render({"serviceMonitor": {"enabled": True}, "kubeRbacProxy": {
            "enabled": True, "tlsSecret": tls_secret, "scrape": scrape}})


@pytest.mark.parametrize("scrape", [{"ca": {"file": "/etc/ca.crt"}},
                                    {"ca": {"secret": {"name": "c"}}},
                                    {"tokenSecret": {"key": ""}},
                                    {"insecureSkipVerify": "yes"}])
def test_the_schema_rejects_odd_scrape_settings(scrape: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render({"kubeRbacProxy": {"enabled": True, "scrape": scrape}})
