"""What ships next to the daemon: alert rules (promtool), runbooks, the Grafana dashboard, the
systemd unit (systemd-analyze)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from preflight.core.result import Report, Result, Status
from preflight.outputs.prom import DaemonStats, MetricsSnapshot, render
from tests.serve.conftest import REPO

RULES = REPO / "deploy" / "prometheus" / "preflight-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "preflight-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "preflight-dashboard.json"
UNIT = REPO / "systemd" / "preflight.service"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
#: Series Prometheus itself makes; everything else must be ours.
PROMETHEUS_SERIES = {"up"}


def exported_names() -> set[str]:
    """Every series name a daemon can export, from a snapshot that fills every family."""
    report = Report(results=(
        Result("shm", Status.PASS, "ShmOk", "ok"),
        Result("allreduce", Status.PASS, "BusbwOk", "ok", details={"busbw_gbps": 1.0}),
        Result("xid", Status.PASS, "NoXid", "ok", details={"xids": [
            {"gpu": "0", "xid": 13, "count": 1}]}),
        Result("fabric", Status.PASS, "FabricOk", "ok", details={"ports": [
            {"port": "mlx5_0:1", "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0,
             "expected_rate_gbps": 400.0, "link_layer": "InfiniBand"}]}),
        Result("gpu_speed", Status.PASS, "GpuSpeedOk", "ok", details={"gpu_speed": {"gpus": [
            {"index": 0, "figures": {k: {"value": 1.0, "median_ratio": 1.0, "limit_fraction": 0.5}
                                     for k in ("d2d", "gemm")}}]}}),
    ), fingerprint={"sha256": "ab" * 32, "packages": {"torch": "2.13.0"}})
    text = render(MetricsSnapshot(report, ("shm",), DaemonStats())).decode()
    return {re.split(r"[{ ]", line)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def metric_names(expr: str) -> set[str]:
    # identifiers followed by { ( [ space or end, not label names inside braces or functions
    without_labels = re.sub(r"\{[^}]*\}", "{}", expr)
    without_strings = re.sub(r'"[^"]*"', '""', without_labels)
    return {n for n in re.findall(r"\b(preflight_[a-z0-9_]+|up)\b", without_strings)}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [r for g in data["groups"] for r in g["rules"]]


@needs_promtool
def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([str(PROMTOOL), "test", "rules", str(RULES_TEST)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_alert_is_described_tested_and_has_a_runbook() -> None:
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    runbooks = {p.stem for p in (REPO / "docs" / "runbooks").glob("*.md")}
    names = []
    for rule in rules():
        name = rule["alert"]
        names.append(name)
        assert name.startswith("Preflight"), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
        assert name in tested, f"{name} has no promtool test case"
        assert metric_names(rule["expr"]) <= exported_names() | PROMETHEUS_SERIES, name
    assert runbooks == set(names), "one runbook per alert, no orphan runbook"
    must = {"PreflightNodeUnhealthy", "PreflightCheckFailing", "PreflightAllreduceBandwidthLow",
            "PreflightLinkEfficiencyDropped", "PreflightLibraryVersionSkew",
            "PreflightResultsStale", "PreflightDaemonDown"}
    assert must <= set(names)


def test_dashboard_is_valid_json_that_only_queries_our_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    assert len(exprs) >= 8
    used: set[str] = set()
    for expr in exprs:
        used |= metric_names(expr)
    unknown = used - exported_names() - PROMETHEUS_SERIES
    assert not unknown, f"dashboard queries metrics we do not export: {sorted(unknown)}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for needed in ("unhealthy", "reason", "busbw", "efficiency", "skew", "last-run age"):
        assert needed in titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_metric_name_extraction_sees_through_labels() -> None:
    assert metric_names('count by (package) (preflight_package_info{job=~"x", a="preflight_y"})'
                        ) == {"preflight_package_info"}
    assert "preflight_nope_total" in metric_names("rate(preflight_nope_total[5m])")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_unit_verifies_without_any_warning(tmp_path: Path) -> None:
    """systemd-analyze verify exits 0 on unknown keys (it only warns), so any stderr fails.
    verify wants ExecStart's file to exist: an executable stand-in takes its place."""
    preflight = tmp_path / "preflight"
    preflight.write_text("#!/bin/sh\nexit 0\n")
    preflight.chmod(0o755)
    text = UNIT.read_text()
    assert "Type=notify" in text and "WatchdogSec=" in text and "Restart=on-failure" in text
    assert "DeviceAllow=char-nvidia-frontend rw" in text
    assert not re.search(r"^PrivateDevices=", text, re.M)  # it would hide the GPUs
    unit = tmp_path / "preflight.service"
    unit.write_text(text.replace("/usr/local/bin/preflight", str(preflight)))
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    # --threshold is on the 0..100 scale of the printed 0..10 exposure: 40 = "4.0 OK" at most.
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                               "--threshold=40", str(unit)], capture_output=True, text=True,
                              timeout=60, check=False)
    assert security.returncode == 0, security.stdout[-2000:] + security.stderr
