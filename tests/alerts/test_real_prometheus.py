"""A real Prometheus (Debian's ``prometheus``) scraping real ``preflight serve`` daemons on
replayed NVML snapshots, with the shipped rules (``for:`` cut to seconds: tests/alerts/realprom.py)
and the shipped Kubernetes scrape job's relabeling:

* the alerts API shows what the promtool tests promise: a healthy node raises nothing, a lost GPU
  one alert, an ERROR-only node the undecided warning and no critical, an Xid 79 one alert for
  its GPU, an RDMA port down and one at half rate one alert each; every alert names its node;
* every query of the dashboard (panels and the node variable) answers without error and with
  data, the variables substituted as Grafana would.

One process per daemon, one Prometheus; all stopped at the end. About 20-40 s on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.alerts.realprom import (
    Daemon,
    Prometheus,
    Replay,
    Target,
    fast_rules,
    firing,
    prometheus_config,
)
from tests.checks.sysfs_ib import add_port
from tests.checks.test_xid import FELL_OFF_GPU3, kmsg_root
from tests.helpers import REPO
from tests.serve.conftest import wait_for

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = REPO / "deploy" / "grafana" / "preflight-dashboard.json"
#: A run of the H200 with the bandwidth test and gpu_speed (docs/device-runs/).
H200_REPORT = (REPO / "docs" / "device-runs" / "2026-11-30-h200x2-merged" / "check_timing"
               / "check-full-1.json")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed "
                                 "(Debian: apt-get install prometheus)")]

#: node -> the alerts it must have firing, and nothing else anywhere.
EXPECTED = {
    "gpu-healthy": set(),
    "gpu-lost": {"PreflightGpuMissing"},
    "gpu-error": {"PreflightNodeUndecided"},
    "gpu-xid": {"PreflightGpuXidFault"},
    "gpu-rdma": {"PreflightIbPortDown", "PreflightIbPortRateLow"},
    "gpu-h200": set(),
}


def snapshot_file(path: Path, snap: GpuSnapshot) -> Path:
    # A job (pid 1) on GPU 0: the daemon defers its bandwidth test, no NCCL on this CPU machine.
    gpus = (dataclasses.replace(snap.gpus[0], compute_pids=(1,)), *snap.gpus[1:])
    path.write_text(json.dumps(dataclasses.replace(snap, gpus=gpus).to_json()))
    return path


@dataclasses.dataclass
class Fleet:
    prometheus: Prometheus
    daemons: list[Daemon]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    assert PROMETHEUS is not None
    work = tmp_path_factory.mktemp("realprom")
    healthy = snapshot_file(work / "healthy.json", topologies.healthy_8x_h100())
    lost = snapshot_file(work / "lost.json", topologies.lost_gpu())
    unusable = work / "unusable.json"
    unusable.write_text("{not json")  # every GPU check: ERROR (could not decide)
    xid_root = kmsg_root(work / "xid-root", (10.0, FELL_OFF_GPU3))
    (xid_root / "dev" / "shm").mkdir()
    rdma_root = kmsg_root(work / "rdma-root", (2.0, "nvidia: module loaded"))
    (rdma_root / "dev" / "shm").mkdir()
    add_port(rdma_root, "mlx5_0")
    add_port(rdma_root, "mlx5_1", state="DOWN", phys="Polling")
    add_port(rdma_root, "mlx5_2", rate="200 Gb/sec (2X NDR)")
    started: list[Daemon] = []
    replay: Replay | None = None
    prom: Prometheus | None = None
    try:
        started = [Daemon("gpu-healthy", work, healthy), Daemon("gpu-lost", work, lost),
                   Daemon("gpu-error", work, unusable),
                   Daemon("gpu-xid", work, healthy, root=xid_root),
                   Daemon("gpu-rdma", work, healthy, root=rdma_root)]
        replay = Replay(H200_REPORT)
        targets = [Target(d.address, d.name, "h100") for d in started]
        targets.append(Target(replay.address, "gpu-h200", "h200"))
        for d in started:
            wait_for(d.ran, timeout_s=40, what=f"a finished run of {d.name}:\n{d.log()}")
        prom = Prometheus(PROMETHEUS, prometheus_config(targets, fast_rules(work / "rules.yaml")),
                          work / "prometheus")
        # Two runs of each daemon scraped: counters have moved (the error counts' panel).
        wait_for(lambda: len(prom.query("increase(preflight_runs_total[1m]) > 0")) == len(
            started), timeout_s=40, what=f"two scraped runs of every daemon\n{prom.log()}")
        yield Fleet(prom, started)
    finally:
        if prom is not None:
            prom.stop()
        if replay is not None:
            replay.stop()
        for d in started:
            d.stop()
        assert all(d.proc.poll() is not None for d in started)


def by_node(alerts: list[Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {node: set() for node in EXPECTED}
    for a in alerts:
        out.setdefault(a.get("node", "<no node>"), set()).add(a["alertname"])
    return out


def test_alerts_api_shows_one_alert_per_cause_each_naming_its_node(fleet: Fleet) -> None:
    prom = fleet.prometheus
    seen: list[dict[str, set[str]]] = []

    def as_promised() -> bool:
        seen.append(by_node(firing(prom)))
        return seen[-1] == EXPECTED

    wait_for(as_promised, timeout_s=45, every_s=1.0,
               what=f"the promised alerts; last seen {seen[-1:]}\n{prom.log()}")
    alerts = firing(prom)
    assert not [a for a in alerts if a["severity"] == "critical"]
    assert {a["severity"] for a in alerts} == {"warning"}
    xid = [a for a in alerts if a["alertname"] == "PreflightGpuXidFault"]
    assert [(a["gpu"], a["xid"]) for a in xid] == [("3", "79")]
    lost = [a for a in alerts if a["alertname"] == "PreflightGpuMissing"]
    assert [a["reason"] for a in lost] == ["GpuLost"]
    for a in prom.api("alerts")["alerts"]:
        node = a["labels"]["node"]
        assert node in a["annotations"]["summary"] and node in a["annotations"]["description"]
        assert a["annotations"]["runbook_url"].startswith("https://")
    # The daemons' own verdicts, as Prometheus stored them through the shipped relabeling.
    healthy = {r["metric"]["node"]: r["value"][1] for r in prom.query("preflight_node_healthy")}
    assert healthy == {"gpu-healthy": "1", "gpu-lost": "0", "gpu-error": "1", "gpu-xid": "0",
                       "gpu-rdma": "0", "gpu-h200": "1"}
    undecided = prom.query("preflight_node_undecided == 1")
    assert [r["metric"]["node"] for r in undecided] == ["gpu-error"]
    pools = {r["metric"]["node"]: r["metric"].get("pool") for r in prom.query("up")}
    assert pools == {**{d.name: "h100" for d in fleet.daemons}, "gpu-h200": "h200"}


def dashboard_queries() -> list[tuple[str, str]]:
    data = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in data["panels"] for t in p.get("targets", [])]


def test_every_dashboard_query_answers_with_data(fleet: Fleet) -> None:
    prom = fleet.prometheus
    wait_for(lambda: by_node(firing(prom)) == EXPECTED, timeout_s=45, every_s=1.0,
               what="the alerts (the dashboard reads the same series)")
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    # The node variable as Grafana resolves it: label_values(<selector>, node), then "All" as
    # the regex alternation of every value (no allValue).
    selector = re.fullmatch(r"label_values\((.+), node\)", variables["node"]["query"]["query"])
    assert selector is not None
    match = {"match[]": str(selector.group(1)).replace("$job", "preflight")}
    nodes = prom.api("label/node/values", match)
    assert sorted(nodes) == sorted(EXPECTED)
    assert "allValue" not in variables["node"] and "allValue" not in variables["job"]
    empty = []
    for title, expr in dashboard_queries():
        text = (expr.replace("$job", "preflight").replace("$node", "(" + "|".join(nodes) + ")")
                .replace("$__rate_interval", "1m"))
        assert "$" not in text, (title, text)
        if not prom.query(text):
            empty.append(title)
    assert not empty, f"panels without data: {empty}"
