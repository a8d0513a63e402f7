"""The alert rules, their promtool tests, runbooks, the Alertmanager example and the dashboard, as
files: valid, consistent with each other and with what the daemon exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from preflight.core.result import Report, Result, Scope, Status
from preflight.outputs.prom import DaemonStats, MetricsSnapshot, render
from tests.alerts import gen_rules_test
from tests.helpers import REPO

RULES = REPO / "deploy" / "prometheus" / "preflight-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "preflight-rules.test.yaml"
SCRAPE_CONFIGS = [REPO / "deploy" / "prometheus" / n
                  for n in ("scrape-config.yaml", "scrape-config-hosts.yaml",
                            "scrape-config-rbac-proxy.yaml")]
INHIBIT = REPO / "deploy" / "alertmanager" / "inhibit-rules.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "preflight-dashboard.json"
RUNBOOKS = REPO / "docs" / "runbooks"
VALUES = REPO / "helm" / "cluster-preflight" / "values.yaml"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
#: Series made by Prometheus itself or by kube-state-metrics; everything else must be ours.
FOREIGN_SERIES = {"up", "ALERTS"}
KSM_SERIES = {"kube_daemonset_status_desired_number_scheduled",
              "kube_daemonset_status_number_ready"}


def exported_names() -> set[str]:
    """Every series name a daemon can export, from a snapshot that fills every family."""
    report = Report(results=(
        Result("shm", Status.PASS, "ShmOk", "ok"),
        Result("gpu_visible", Status.ERROR, "CheckTimeout", "?", scope=Scope.UNDECIDED),
        Result("allreduce", Status.PASS, "BusbwOk", "ok"),
        Result("xid", Status.PASS, "NoXid", "ok", details={"xids": [
            {"gpu": "0", "xid": 13, "count": 1}]}),
        Result("fabric", Status.PASS, "FabricOk", "ok", details={"ports": [
            {"port": "mlx5_0:1", "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0,
             "expected_rate_gbps": 400.0, "link_layer": "InfiniBand"}]}),
        Result("gpu_speed", Status.PASS, "GpuSpeedOk", "ok", details={"gpu_speed": {"gpus": [
            {"index": 0, "figures": {k: {"value": 1.0, "median_ratio": 1.0, "limit_fraction": 0.5}
                                     for k in ("d2d", "gemm")}}]}}),
    ), fingerprint={"sha256": "ab" * 32, "packages": {"torch": "2.13.0"}},
        bandwidth={"busbw_gbps": 1.0, "link_efficiency": 0.5})
    text = render(MetricsSnapshot(report, ("shm",), DaemonStats())).decode()
    return {re.split(r"[{ ]", line)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (not label names, strings or recording-rule names)."""
    without_labels = re.sub(r"\{[^}]*\}", "{}", expr)
    without_strings = re.sub(r'"[^"]*"', '""', without_labels)
    return set(re.findall(r"\b(preflight_[a-z0-9_]+|up|ALERTS|kube_[a-z_]+)\b", without_strings))


def groups() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return out


def alerts() -> list[dict[str, Any]]:
    return [r for g in groups() for r in g["rules"] if "alert" in r]


def duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def test_metric_name_extraction_sees_through_labels() -> None:
    assert metric_names('count by (package) (preflight_package_info{job=~"x", a="preflight_y"})'
                        ) == {"preflight_package_info"}
    assert "preflight_nope_total" in metric_names("rate(preflight_nope_total[5m])")
    assert metric_names("preflight:nodes_reporting:count > 1") == set()


def test_the_promtool_test_file_is_what_its_script_writes() -> None:
    assert gen_rules_test.main(["--check"]) == 0, "run: python -m tests.alerts.gen_rules_test"


@needs_promtool
def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([PROMTOOL, "test", "rules", str(RULES_TEST)], capture_output=True,
                          text=True, timeout=180, check=False)
    assert test.returncode == 0, test.stdout[-4000:] + test.stderr[-4000:]


def test_the_fleet_of_the_unit_tests_is_hundreds_of_series() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    sizes = [len(t["input_series"]) for t in tests]
    assert min(sizes) >= 200 and max(sizes) >= 1000, sizes


def test_every_alert_is_described_tested_timed_and_has_a_runbook() -> None:
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    base = yaml.safe_load(VALUES.read_text())["prometheusRule"]["runbookBaseURL"]
    runbooks = {p.stem for p in RUNBOOKS.glob("Preflight*.md")}
    names = []
    for rule in alerts():
        name = rule["alert"]
        names.append(name)
        assert name.startswith("Preflight"), name
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"] == f"{base}{name}.md", name
        assert name in tested, f"{name} has no promtool test case"
        assert duration_s(rule.get("for", "")) > 0, f"{name} has no for:"
        assert metric_names(rule["expr"]) <= exported_names() | FOREIGN_SERIES | KSM_SERIES, name
        runbook = (RUNBOOKS / f"{name}.md").read_text()
        assert f"`for: {rule['for']}`" in runbook, f"{name}'s runbook does not explain its for:"
    assert runbooks == set(names), "one runbook per alert, no orphan runbook"
    assert base.startswith("https://") and base.endswith("/")


def test_only_a_fleet_wide_cause_pages() -> None:
    critical = [r["alert"] for r in alerts() if r["labels"]["severity"] == "critical"]
    assert critical == ["PreflightFleetFailing"]
    by_group = {g["name"]: [r for r in g["rules"] if "alert" in r] for g in groups()}
    for rule in by_group["preflight.node"]:
        # every per-node alert names the node, in its summary and its description
        for key in ("summary", "description"):
            assert "{{ $labels.node }}" in rule["annotations"][key], (rule["alert"], key)


def test_no_range_of_days_is_evaluated_on_every_cycle() -> None:
    for group in groups():
        for rule in group["rules"]:
            longest = max((duration_s(r) for r in re.findall(r"\[(\w+)\]", rule["expr"])),
                          default=0)
            if longest > 6 * 3600:
                assert duration_s(group.get("interval", "1m")) >= 3600, rule


def test_node_faults_alert_errors_do_not() -> None:
    """The per-node FAIL alerts read node-scope FAILs; ERROR is the undecided alert's alone."""
    for rule in alerts():
        if rule["alert"] in ("PreflightNodeUndecided", "PreflightFleetUndecided"):
            continue
        assert 'status="error"' not in rule["expr"], rule["alert"]
    assert "preflight_node_healthy == 0" not in RULES.read_text()


def test_the_xid_codes_of_the_alert_and_of_the_covered_rule_agree() -> None:
    codes = {m for r in (alerts() + [r for g in groups() for r in g["rules"]])
             for m in re.findall(r'xid=~"([0-9|]+)"', r["expr"])}
    assert len(codes) == 1, codes


def test_scrape_configs_set_the_labels_the_rules_read() -> None:
    for path in SCRAPE_CONFIGS:
        (job,) = yaml.safe_load(path.read_text())["scrape_configs"]
        assert job["job_name"] == "preflight"
        targets = {r.get("target_label") for r in job["relabel_configs"]}
        assert "node" in targets, path
    if PROMTOOL is not None:  # Debian's build has no Kubernetes discovery: the hosts file only
        check = subprocess.run([PROMTOOL, "check", "config", str(SCRAPE_CONFIGS[1])],
                               capture_output=True, text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stdout + check.stderr


def test_the_rbac_proxy_scrape_config_is_the_pod_job_over_https_with_a_token(
        tmp_path: Path) -> None:
    """scrape-config-rbac-proxy.yaml: scrape-config.yaml's job (discovery, relabeling) plus
    HTTPS, the ServiceAccount token and a tls_config; promtool accepts it (discovery replaced
    by a static target, which Debian's promtool lacks, and the token file by one here)."""
    (plain,) = yaml.safe_load(SCRAPE_CONFIGS[0].read_text())["scrape_configs"]
    (proxy,) = yaml.safe_load(SCRAPE_CONFIGS[2].read_text())["scrape_configs"]
    assert proxy["scheme"] == "https"
    assert proxy["authorization"] == {
        "credentials_file": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
    assert proxy["tls_config"] == {"insecure_skip_verify": True}
    rest = {k: v for k, v in proxy.items() if k not in ("scheme", "authorization", "tls_config")}
    assert rest == plain
    if PROMTOOL is None:
        return
    token = tmp_path / "token"
    token.write_text("x")
    del proxy["kubernetes_sd_configs"]
    proxy["static_configs"] = [{"targets": ["127.0.0.1:9857"]}]
    proxy["authorization"]["credentials_file"] = str(token)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [proxy]}))
    check = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_inhibit_rules_name_real_alerts_and_labels() -> None:
    data = yaml.safe_load(INHIBIT.read_text())
    names = {r["alert"] for r in alerts()} | {"KubeNodeNotReady", "KubeNodeUnreachable"}
    labels = {"node", "reason", "check", "alertname"}
    for rule in data["inhibit_rules"]:
        for key in ("source_matchers", "target_matchers"):
            for matcher in rule[key]:
                m = re.fullmatch(r'(\w+)\s*(=~|!=|=)\s*"?([^"]*)"?', matcher)
                assert m is not None, matcher
                if m.group(1) == "alertname":  # names a real alert, or a regex matching one
                    matched = {n for n in names if re.fullmatch(m.group(3), n)}
                    assert matched if m.group(2) == "=~" else m.group(3) in names, matcher
        assert set(rule["equal"]) <= labels, rule
    if AMTOOL is not None:
        proc = subprocess.run([AMTOOL, "check-config", str(INHIBIT)], capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_is_valid_json_that_only_queries_our_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    used: set[str] = set()
    for expr in exprs:
        used |= metric_names(expr)
    unknown = used - exported_names() - FOREIGN_SERIES - KSM_SERIES
    assert not unknown, f"dashboard queries metrics we do not export: {sorted(unknown)}"
    titles = " ".join(p["title"].lower() for p in panels)
    for needed in ("unhealthy", "undecided", "reason", "busbw", "efficiency", "gpu_speed",
                   "skew", "last-run age", "xid", "rdma"):
        assert needed in titles, needed
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "node" in variables and "allValue" not in json.dumps(dashboard)
    assert variables["job"]["includeAll"] is False
    # one line per node nowhere: every per-node series is cut to the worst ten, or aggregated
    for p in panels:
        for t in p.get("targets", []):
            if p["type"] == "timeseries":
                assert re.match(r"(count|min|quantile|sum)\b", t["expr"]), p["title"]
    down = next(p for p in panels if p["title"] == "Daemons down")
    assert down["targets"][0]["expr"].startswith('count(up{job="$job"')
    # the table of what is wrong, WARN included, with links to /report and the runbooks
    table = next(p for p in panels if p["title"].startswith("Checks not passing"))
    assert 'status=~"warn|error|fail"' in table["targets"][0]["expr"]
    links = json.dumps(table["fieldConfig"]["overrides"])
    assert "/report" in links and "${runbook_base}" in links
    assert variables["runbook_base"]["query"] == yaml.safe_load(VALUES.read_text())[
        "prometheusRule"]["runbookBaseURL"]
