"""Generate deploy/prometheus/preflight-rules.test.yaml: the alert rules against a synthetic fleet.

Usage: ``python -m tests.alerts.gen_rules_test [--check]`` (``--check`` exits 1 when the committed
file differs from what this script writes; tests/alerts/test_rules.py runs that check).

Every scenario is a fleet of :data:`FLEET` nodes in two pools, each node exporting the series a
``preflight serve`` exports (one-hot verdicts as ``preflight_check_result_info``, the health and
undecided gauges, GPU counts, an RDMA port, bandwidth and gpu_speed figures, versions), healthy
unless the scenario says otherwise. Each scenario asserts, besides its own alert, how many alerts
the whole rule set has firing (``ALERTS``), so "one cause, one alert" is what is tested, not only
that the right alert exists.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "deploy" / "prometheus" / "preflight-rules.test.yaml"
RUNBOOK_BASE = "https://github.com/cluster-preflight/cluster-preflight/blob/main/docs/runbooks/"

#: Nodes of the fleet scenarios: pool "h100" holds the first 36, "h200" the rest; the scenarios
#: of one alert use the first :data:`SMALL_FLEET`. (12 to 22 series a node: hundreds per
#: scenario, and the file stays about a megabyte, promtool about ten seconds.)
FLEET = 60
POOL_SPLIT = 36
SMALL_FLEET = 16
#: The checks every node reports; allreduce, gpu_speed and fabric come with ``rich=True``.
CHECKS = ("gpu_visible", "xid", "shm")
RICH_CHECKS = ("fabric", "allreduce", "gpu_speed")
OK_REASON = {"gpu_visible": "GpusHealthy", "xid": "NoXid", "shm": "ShmOk", "fabric": "FabricOk",
             "allreduce": "AllreduceOk", "gpu_speed": "GpuSpeedOk", "network": "NetworkOk"}
DRIVER = {"h100": "570.124.06", "h200": "575.57.08"}
NEW_DRIVER = "580.95.05"

#: One value per step: a number, or None for no sample.
Samples = list[float | None]


def node_name(i: int) -> str:
    return f"gpu-{i:03d}"


def pool_of(i: int) -> str:
    return "h100" if i < POOL_SPLIT else "h200"


def target(i: int) -> dict[str, str]:
    """The target labels the scrape config gives node ``i``."""
    return {"job": "preflight", "instance": f"10.0.{i // 200}.{i % 200 + 10}:9857",
            "node": node_name(i), "pool": pool_of(i)}


def selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def compress(samples: Samples | str) -> str:
    """promtool's notation: a run of L equal values is ``vx(L-1)``, L missing ones ``_xL``; a
    string is already in that notation."""
    if isinstance(samples, str):
        return samples
    parts: list[str] = []
    i = 0
    while i < len(samples):
        j = i
        while j < len(samples) and samples[j] == samples[i]:
            j += 1
        run, value = j - i, samples[i]
        if value is None:
            parts.append("_" if run == 1 else f"_x{run}")
        else:
            text = f"{value:g}"
            parts.append(text if run == 1 else f"{text}x{run - 1}")
        i = j
    return " ".join(parts)


@dataclass
class Fleet:
    """The input series of one scenario: ``{series selector: samples}``."""

    steps: int
    interval_min: int = 1
    series: dict[str, Samples | str] = field(default_factory=dict)

    def const(self, value: float | None) -> Samples:
        return [value] * self.steps

    def set(self, name: str, labels: dict[str, str], samples: Samples | str) -> None:
        self.series[selector(name, labels)] = samples

    def drop(self, name: str, labels: dict[str, str]) -> None:
        del self.series[selector(name, labels)]

    def verdict(self, i: int, check: str, status: str, reason: str, scope: str = "node",
                *, from_step: int = 0, until_step: int | None = None) -> None:
        """Node ``i``'s ``check`` says ``status``/``reason`` from ``from_step`` to
        ``until_step`` (exclusive; None = the end), its healthy verdict before and after."""
        ok = {**target(i), "check": check, "status": "pass", "reason": OK_REASON[check],
              "scope": "node"}
        bad = {**target(i), "check": check, "status": status, "reason": reason, "scope": scope}
        end = self.steps if until_step is None else until_step
        span = range(from_step, end)
        self.set("preflight_check_result_info", ok,
                 [None if s in span else 1.0 for s in range(self.steps)])
        self.set("preflight_check_result_info", bad,
                 [1.0 if s in span else None for s in range(self.steps)])
        if status == "fail" and scope == "node":
            self.set("preflight_node_healthy", target(i),
                     [0.0 if s in span else 1.0 for s in range(self.steps)])
        if status == "error":
            self.set("preflight_node_undecided", target(i),
                     [1.0 if s in span else 0.0 for s in range(self.steps)])

    def to_yaml(self) -> list[dict[str, str]]:
        return [{"series": k, "values": compress(v)} for k, v in self.series.items()]


def healthy_fleet(steps: int, *, interval_min: int = 1, nodes: int = FLEET,
                  rich: bool = False) -> Fleet:
    """Every node healthy; ``rich`` adds the bandwidth, gpu_speed and RDMA series."""
    fleet = Fleet(steps, interval_min)
    minute = 60 * interval_min
    for i in range(nodes):
        t = target(i)
        fleet.set("up", t, fleet.const(1))
        # A run finished every interval: the timestamp keeps up with time() (promtool starts at 0).
        fleet.set("preflight_last_run_timestamp_seconds", t, f"1+{minute}x{steps - 1}")
        fleet.set("preflight_check_interval_seconds", t, fleet.const(60))
        fleet.set("preflight_node_healthy", t, fleet.const(1))
        fleet.set("preflight_node_undecided", t, fleet.const(0))
        fleet.set("preflight_config_reload_success", t, fleet.const(1))
        for check in (*CHECKS, *(RICH_CHECKS if rich else ())):
            fleet.set("preflight_check_result_info", {**t, "check": check, "status": "pass",
                                                      "reason": OK_REASON[check],
                                                      "scope": "node"}, fleet.const(1))
        fleet.set("preflight_gpu_visible", t, fleet.const(8))
        fleet.set("preflight_gpu_expected", t, fleet.const(8))
        fleet.set("preflight_package_info", {**t, "package": "driver", "source": "node",
                                             "version": DRIVER[pool_of(i)]}, fleet.const(1))
        if not rich:
            continue
        fleet.set("preflight_allreduce_bus_bandwidth_bytes_per_second", t, fleet.const(3.6e11))
        fleet.set("preflight_allreduce_link_efficiency_ratio", t, fleet.const(0.82))
        fleet.set("preflight_gpu_speed_ratio", {**t, "gpu": "0", "kind": "gemm"},
                  fleet.const(1))
        fleet.set("preflight_gpu_speed_ratio", {**t, "gpu": "1", "kind": "gemm"},
                  fleet.const(0.98))
        port = {**t, "device": "mlx5_0", "port": "1"}
        fleet.set("preflight_ib_port_active", {**port, "link_layer": "InfiniBand"},
                  fleet.const(1))
        fleet.set("preflight_ib_port_rate_bytes_per_second", port, fleet.const(5e10))
        fleet.set("preflight_ib_port_expected_rate_bytes_per_second", port, fleet.const(5e10))
        fleet.set("preflight_package_info", {**t, "package": "torch", "source": "training",
                                             "version": "2.13.0"}, fleet.const(1))
    return fleet


# --------------------------------------------------------------------------- expectations


def alert(name: str, eval_min: int, *expected: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": f"{eval_min}m", "alertname": name, "exp_alerts": list(expected)}


def firing(eval_min: int, count: int) -> dict[str, Any]:
    """promql test: how many alerts of the whole rule set are firing at ``eval_min``."""
    return {"expr": 'count(ALERTS{alertstate="firing"}) or vector(0)',
            "eval_time": f"{eval_min}m", "exp_samples": [{"labels": "{}", "value": count}]}


def annotations_of(name: str, summary: str, description: str) -> dict[str, str]:
    return {"summary": summary, "description": description,
            "runbook_url": f"{RUNBOOK_BASE}{name}.md"}


def node_labels(i: int, **extra: str) -> dict[str, str]:
    return {**target(i), **extra}


@dataclass
class Scenario:
    name: str
    fleet: Fleet
    alerts: list[dict[str, Any]]
    promql: list[dict[str, Any]]

    def to_yaml(self) -> dict[str, Any]:
        return {"name": self.name, "interval": f"{self.fleet.interval_min}m",
                "input_series": self.fleet.to_yaml(), "alert_rule_test": self.alerts,
                "promql_expr_test": self.promql}


# --------------------------------------------------------------------------- scenarios


def quiet_fleet() -> Scenario:
    fleet = healthy_fleet(31, rich=True)
    return Scenario(f"a healthy fleet of {FLEET} nodes in two pools on two drivers: no alert",
                    fleet, [], [firing(m, 0) for m in (0, 5, 15, 30)])


def xid_79() -> Scenario:
    """GPU 3 of one node falls off the bus (NVML loses it too); 30 minutes later the xid check
    passes again (an acknowledged Xid, a reset GPU): the counter stays, the alert clears 15
    minutes later."""
    i = 17
    fleet = healthy_fleet(61)
    fleet.verdict(i, "xid", "fail", "XidNodeFault", until_step=30)
    fleet.verdict(i, "gpu_visible", "fail", "GpuLost", until_step=30)
    fleet.set("preflight_gpu_visible", target(i), [7.0 if s < 30 else 8.0 for s in range(61)])
    fleet.set("preflight_xid_errors_total", node_labels(i, gpu="3", xid="79"), fleet.const(1))
    fleet.set("preflight_xid_errors_total", node_labels(i + 1, gpu="0", xid="31"),
              fleet.const(4))  # a job's own Xid on another node: never an alert
    expected = {
        "exp_labels": node_labels(i, gpu="3", xid="79", check="xid", reason="XidNodeFault",
                                  severity="warning"),
        "exp_annotations": annotations_of(
            "PreflightGpuXidFault", f"GPU 3 on {node_name(i)} logged Xid 79",
            f"GPU 3 on {node_name(i)} has logged Xid 79 1 time(s) since boot and preflight's xid "
            "check fails on it: a GPU fault (ECC, row remapping, NVLink, fallen off the bus, "
            "GSP). Jobs placed there crash or hang. The xid check's message in the node's "
            "/report names the action (reset, reboot, RMA). Clears 15 minutes after the check "
            "passes again."),
    }
    return Scenario(
        "one Xid 79 on one node: exactly one alert, for that node; it clears after the check "
        "passes again", fleet,
        [alert("PreflightGpuXidFault", 2, expected),
         alert("PreflightCheckFailing", 12), alert("PreflightGpuMissing", 12),
         alert("PreflightGpuXidFault", 43, expected),
         alert("PreflightGpuXidFault", 45)],
        [firing(0, 0), firing(2, 1), firing(12, 1), firing(43, 1), firing(45, 0)])


def lost_gpu() -> Scenario:
    i = 42
    fleet = healthy_fleet(31)
    fleet.verdict(i, "gpu_visible", "fail", "GpuLost")
    fleet.set("preflight_gpu_visible", target(i), fleet.const(7))
    expected = {
        "exp_labels": node_labels(i, check="gpu_visible", reason="GpuLost", severity="warning"),
        "exp_annotations": annotations_of(
            "PreflightGpuMissing",
            f"GPU node {node_name(i)} has only 7 working GPUs (GpuLost)",
            f"7 GPUs answer NVML on {node_name(i)}, fewer than its expect_gpus, for 10 minutes "
            "(GpuLost: lost, fallen off the bus, not bound to the driver). A job that asks for "
            "every GPU of the node fails to start or gets fewer ranks. The gpu_visible message "
            "in /report names the GPU."),
    }
    return Scenario(
        "a lost GPU: exactly one alert, the specific one, not also the generic check failing",
        fleet,
        [alert("PreflightGpuMissing", 8), alert("PreflightGpuMissing", 12, expected),
         alert("PreflightCheckFailing", 12)],
        [firing(8, 0), firing(12, 1), firing(30, 1)])


def error_only() -> Scenario:
    """One node's check process keeps dying (the daemon's RunFailed marks every check ERROR)."""
    i = 49
    fleet = healthy_fleet(31)
    for check in CHECKS:
        fleet.verdict(i, check, "error", "RunFailed", scope="undecided")
    expected = {
        "exp_labels": node_labels(i, severity="warning"),
        "exp_annotations": annotations_of(
            "PreflightNodeUndecided", f"preflight cannot decide on {node_name(i)}",
            f"A check on {node_name(i)} has ended in ERROR for 15 minutes (crashed, passed its "
            "deadline, or the check process failed): something on the node does not answer (a "
            "hung GPU or driver, NVML), or preflight has a bug. The node is not counted "
            "unhealthy. Which checks and why: "
            f'preflight_check_result_info{{node="{node_name(i)}", status="error"}}, or /report.'),
    }
    return Scenario(
        "an ERROR-only node: the undecided warning, never a critical or an unhealthy node",
        fleet,
        [alert("PreflightNodeUndecided", 14), alert("PreflightNodeUndecided", 16, expected),
         alert("PreflightCheckFailing", 16), alert("PreflightFleetFailing", 30)],
        [firing(16, 1), firing(30, 1),
         {"expr": 'count(ALERTS{severity="critical"}) or vector(0)', "eval_time": "30m",
          "exp_samples": [{"labels": "{}", "value": 0}]}])


def fleet_undecided() -> Scenario:
    """A preflight regression: every node's check process fails (RunFailed) at once."""
    fleet = healthy_fleet(31)
    for i in range(FLEET):
        for check in CHECKS:
            fleet.verdict(i, check, "error", "RunFailed", scope="undecided")
    expected = {
        "exp_labels": {"status": "error", "reason": "RunFailed", "severity": "warning"},
        "exp_annotations": annotations_of(
            "PreflightFleetUndecided", f"preflight cannot decide on {FLEET} GPU nodes (RunFailed)",
            f"A check ends in ERROR RunFailed on {FLEET} of {FLEET} reporting GPU nodes for 15 "
            "minutes: preflight's own trouble (a regression, a config or image change, a "
            "missing container runtime or driver library), not node faults. Nothing is drained "
            "or marked for it. The per-node alerts of this reason are held back while this "
            "fires."),
    }
    return Scenario(
        "preflight fails on every node at once: one fleet warning, no page, no per-node alerts",
        fleet,
        [alert("PreflightFleetUndecided", 16, expected), alert("PreflightNodeUndecided", 30),
         alert("PreflightFleetFailing", 30)],
        [firing(16, 1), firing(30, 1)])


def fleet_reason(reason: str = "ShmTooSmall") -> Scenario:
    """A bad image or config: 30 % of the nodes fail shm with the same reason."""
    bad_nodes = sorted({*range(0, FLEET, 10), *range(3, FLEET, 10), *range(5, FLEET, 10)})
    fleet = healthy_fleet(31)
    for i in bad_nodes:
        fleet.verdict(i, "shm", "fail", reason)
    n = len(bad_nodes)
    expected = {
        "exp_labels": {"status": "fail", "reason": reason, "severity": "critical"},
        "exp_annotations": annotations_of(
            "PreflightFleetFailing", f"{reason} fails on {n} GPU nodes at once",
            f"{n} of {FLEET} reporting GPU nodes fail with {reason} (a node fault) for 10 "
            "minutes: one cause across the fleet (a driver or firmware rollout, a bad image, a "
            "fabric or storage outage), not that many broken nodes. The per-node alerts of this "
            "reason are held back while this fires. The nodes: the dashboard's table, or "
            f'preflight_check_result_info{{reason="{reason}"}}.'),
    }
    return Scenario(
        f"the same reason on {n * 100 // FLEET} % of the nodes: one fleet alert naming it, the "
        "per-node warnings held back once it fires", fleet,
        [alert("PreflightFleetFailing", 9), alert("PreflightFleetFailing", 12, expected),
         alert("PreflightCheckFailing", 12), alert("PreflightFleetFailing", 30, expected)],
        # Before the fleet alert fires the nodes' own warnings do (no page).
        [firing(7, n), firing(12, 1), firing(30, 1)])


def rolling_driver_upgrade() -> Scenario:
    """Pool h100 moves to a new driver, 3 nodes every 30 minutes (6 hours); pool h200 stays on
    its own driver throughout (a mixed fleet). Steps of 5 minutes, 8 hours."""
    steps = 8 * 12 + 1
    fleet = healthy_fleet(steps, interval_min=5, nodes=FLEET)
    for i in range(POOL_SPLIT):
        moves_at = (i // 3 + 1) * 6  # step: every 30 minutes, 3 nodes
        old = {**target(i), "package": "driver", "source": "node", "version": DRIVER["h100"]}
        new = {**old, "version": NEW_DRIVER}
        fleet.set("preflight_package_info", old,
                  [1.0 if s < moves_at else None for s in range(steps)])
        fleet.set("preflight_package_info", new,
                  [None if s < moves_at else 1.0 for s in range(steps)])
    return Scenario(
        "a rolling driver upgrade inside one pool, and another pool on its own driver: quiet",
        fleet, [alert("PreflightLibraryVersionSkew", m) for m in range(0, 8 * 60 + 1, 30)],
        [firing(m, 0) for m in range(0, 8 * 60 + 1, 60)])


def stalled_upgrade() -> Scenario:
    """Pool h100's upgrade stops after 18 nodes (the last ones at 1 h): quiet until no node has
    moved for 3 hours, then fires an hour later (about 5 h), naming the pool."""
    steps = 7 * 12 + 1
    fleet = healthy_fleet(steps, interval_min=5, nodes=FLEET)
    for i in range(18):
        moves_at = (i // 6 + 1) * 4  # 20, 40, 60 minutes
        old = {**target(i), "package": "driver", "source": "node", "version": DRIVER["h100"]}
        fleet.set("preflight_package_info", old,
                  [1.0 if s < moves_at else None for s in range(steps)])
        fleet.set("preflight_package_info", {**old, "version": NEW_DRIVER},
                  [None if s < moves_at else 1.0 for s in range(steps)])
    expected = {
        "exp_labels": {"pool": "h100", "source": "node", "package": "driver",
                       "severity": "warning"},
        "exp_annotations": annotations_of(
            "PreflightLibraryVersionSkew",
            "Nodes of pool h100 disagree on driver (node)",
            '2 versions of driver (source node) run in pool "h100", and no node has changed '
            "version for 4 hours: a stalled rollout or a node left behind. Ranks with different "
            "NCCL, torch, driver or numerical libraries hang or compute differently. Nodes per "
            'version: preflight:package_version_nodes:count{pool="h100", package="driver"}'),
    }
    return Scenario(
        "a rolling upgrade that stalls: the skew alert once no node has moved for 4 hours",
        fleet,
        [alert("PreflightLibraryVersionSkew", 4 * 60 + 50),
         alert("PreflightLibraryVersionSkew", 5 * 60 + 10, expected)],
        [firing(5 * 60 + 10, 1)])


def one_node(name: str, i: int, steps: int, change: Callable[[Fleet], None], alertname: str,
             eval_before: int, eval_after: int, labels: dict[str, str],
             summary: str, description: str) -> Scenario:
    fleet = healthy_fleet(steps, nodes=SMALL_FLEET, rich=True)
    change(fleet)
    expected = {"exp_labels": {**labels, "severity": "warning"},
                "exp_annotations": annotations_of(alertname, summary, description)}
    return Scenario(name, fleet,
                    [alert(alertname, eval_before), alert(alertname, eval_after, expected)],
                    [firing(eval_before, 0), firing(eval_after, 1)])


def per_node_scenarios() -> Iterable[Scenario]:
    n = node_name

    def slow(f: Fleet) -> None:
        f.verdict(5, "gpu_speed", "fail", "GpuSlow")
        f.set("preflight_gpu_speed_ratio", node_labels(5, gpu="1", kind="gemm"), f.const(0.61))

    yield one_node("one slow GPU: one alert naming the GPU and the figure", 5, 16, slow,
                   "PreflightGpuSlow", 4, 6,
                   node_labels(5, gpu="1", kind="gemm", check="gpu_speed", reason="GpuSlow"),
                   f"GPU 1 on {n(5)} is slow (gemm)",
                   f"The gemm figure of GPU 1 on {n(5)} was 0.61 of the node's median in the last "
                   "gpu_speed run (clocks or power held down, a degraded PCIe link, a bad HBM "
                   "stack): one slow GPU holds back every collective of a job placed there. "
                   "NVML's why is in the gpu_speed message of the node's /report.")

    def busbw(f: Fleet) -> None:
        f.verdict(6, "allreduce", "fail", "BusbwLow")
        f.set("preflight_allreduce_bus_bandwidth_bytes_per_second", target(6), f.const(1.2e11))

    yield one_node("all-reduce below its floor: one alert with the figure", 6, 16, busbw,
                   "PreflightAllreduceBandwidthLow", 4, 6,
                   node_labels(6, check="allreduce", status="fail", reason="BusbwLow",
                               scope="node"),
                   f"All-reduce on {n(6)} fails its floor (BusbwLow)",
                   f"The last local NCCL all-reduce on {n(6)} failed with BusbwLow (bus bandwidth "
                   "120GB/s; NaN = no figure). A multi-node job runs at the speed of its slowest "
                   "node.")

    def port_down(f: Fleet) -> None:
        f.verdict(7, "fabric", "warn", "IbPortDown")
        f.set("preflight_ib_port_active",
              node_labels(7, device="mlx5_0", port="1", link_layer="InfiniBand"), f.const(0))
        # A port switched off on purpose on a node whose fabric check passes: no alert.
        f.set("preflight_ib_port_active",
              node_labels(8, device="mlx5_9", port="1", link_layer="Ethernet"), f.const(0))

    yield one_node("an RDMA port down: one alert per node, a disabled port never", 7, 16,
                   port_down, "PreflightIbPortDown", 4, 6,
                   node_labels(7, check="fabric", status="warn", reason="IbPortDown"),
                   f"1 RDMA port(s) down on {n(7)}",
                   f"1 InfiniBand / RoCE port(s) of {n(7)} have not been ACTIVE / LinkUp for 5 "
                   "minutes (IbPortDown); NCCL runs on the remaining rails, or on TCP when none "
                   f'is left. Which ports: preflight_ib_port_active{{node="{n(7)}"}} == 0, or the '
                   "fabric message in /report.")

    def no_port(f: Fleet) -> None:
        # Every port down: fabric owns the fault; network only says NCCL falls back to sockets.
        f.verdict(10, "fabric", "fail", "IbNoActivePort")
        f.verdict(10, "network", "warn", "NcclSocketFallback")
        f.set("preflight_ib_port_active",
              node_labels(10, device="mlx5_0", port="1", link_layer="InfiniBand"), f.const(0))

    yield one_node("no RDMA port up: one alert (fabric's), not also network's", 10, 16,
                   no_port, "PreflightIbPortDown", 4, 6,
                   node_labels(10, check="fabric", status="fail", reason="IbNoActivePort"),
                   f"1 RDMA port(s) down on {n(10)}",
                   f"1 InfiniBand / RoCE port(s) of {n(10)} have not been ACTIVE / LinkUp for 5 "
                   "minutes (IbNoActivePort); NCCL runs on the remaining rails, or on TCP when "
                   f'none is left. Which ports: preflight_ib_port_active{{node="{n(10)}"}} == 0, '
                   "or the fabric message in /report.")

    def rate_low(f: Fleet) -> None:
        f.verdict(9, "fabric", "fail", "IbRateLow")
        f.set("preflight_ib_port_rate_bytes_per_second",
              node_labels(9, device="mlx5_0", port="1"), f.const(2.5e10))

    yield one_node("an RDMA port below its rate: one alert, not also the generic one", 9, 21,
                   rate_low, "PreflightIbPortRateLow", 14, 16,
                   node_labels(9, check="fabric", status="fail", reason="IbRateLow"),
                   f"1 RDMA port(s) below their rate on {n(9)}",
                   f"1 port(s) of {n(9)} trained below the rate expected of them "
                   "(fabric_expected_rate_gbps, else the node's best port of the same link "
                   "layer) for 15 minutes: every multi-node collective runs at the pace of the "
                   "slowest rail. Which ports: the fabric message in /report.")

    def shm(f: Fleet) -> None:
        f.verdict(11, "shm", "fail", "ShmTooSmall")
        f.verdict(12, "shm", "fail", "ShmTooSmall", scope="job")  # never: a job's own setting

    yield one_node("a node fault no specific alert covers: the generic one, never a job's own",
                   11, 16, shm, "PreflightCheckFailing", 4, 6,
                   node_labels(11, check="shm", status="fail", reason="ShmTooSmall",
                               scope="node"),
                   f"preflight check shm fails on {n(11)} (ShmTooSmall)",
                   f"The shm check has been FAIL (ShmTooSmall, a node fault) on {n(11)} for 5 "
                   "minutes; distributed jobs placed there are likely to hang, crash or run slow. "
                   "The message and the remedy are in the node's /report.")

    def stale(f: Fleet) -> None:
        f.set("preflight_last_run_timestamp_seconds", target(13),
              [float(min(s, 2) * 60 + 1) for s in range(f.steps)])

    yield one_node("a daemon whose loop stopped: stale results", 13, 16, stale,
                   "PreflightResultsStale", 9, 12, target(13),
                   f"preflight results on {n(13)} are stale",
                   f"No check run has finished on {n(13)} for more than three intervals; its "
                   "verdict cannot be trusted. The daemon answers but its loop does not "
                   "progress.")

    def down(f: Fleet) -> None:
        f.set("up", target(14), f.const(0))
        for key in [k for k in f.series if f'node="{n(14)}"' in k and not k.startswith("up{")]:
            del f.series[key]

    yield one_node("a daemon that does not answer scrapes", 14, 16, down, "PreflightDaemonDown",
                   4, 6, target(14),
                   f"preflight daemon on {n(14)} does not answer scrapes",
                   f"Prometheus has not been able to scrape preflight on {n(14)} "
                   f"({target(14)['instance']}) for 5 minutes, so that node's health is unknown.")

    def reload(f: Fleet) -> None:
        f.set("preflight_config_reload_success", target(15), f.const(0))

    yield one_node("a failed config reload", 15, 16, reload, "PreflightConfigReloadFailed", 9,
                   11, target(15), f"preflight on {n(15)} runs with an old config",
                   f"The last SIGHUP reload on {n(15)} failed (file missing or invalid); the "
                   "daemon keeps judging with its previous config. The reason is in its log "
                   "(journalctl -u preflight, or the pod's log).")

    def pods(f: Fleet) -> None:
        ds = {"job": "kube-state-metrics", "namespace": "gpu-monitoring",
              "daemonset": "preflight-cluster-preflight"}
        f.set("kube_daemonset_status_desired_number_scheduled", ds, f.const(SMALL_FLEET + 3))
        f.set("kube_daemonset_status_number_ready", ds, f.const(SMALL_FLEET))
        other = {**ds, "daemonset": "some-other-daemonset"}
        f.set("kube_daemonset_status_desired_number_scheduled", other, f.const(10))
        f.set("kube_daemonset_status_number_ready", other, f.const(2))

    ns_ds = "gpu-monitoring/preflight-cluster-preflight"
    yield one_node("DaemonSet pods desired but not ready (kube-state-metrics), ours only", 0, 21,
                   pods, "PreflightDaemonSetPodsNotReady", 14, 16,
                   {"job": "kube-state-metrics", "namespace": "gpu-monitoring",
                    "daemonset": "preflight-cluster-preflight"},
                   f"3 preflight daemon pod(s) of {ns_ds} not ready",
                   f"The DaemonSet {ns_ds} wants a pod on 3 more node(s) than are ready, for 15 "
                   "minutes: those GPU nodes are not checked at all. Which ones: kubectl -n "
                   "gpu-monitoring get pods -o wide -l app.kubernetes.io/name=cluster-preflight | "
                   "grep -v Running")


def link_efficiency() -> Scenario:
    """Node 20's efficiency drops from 0.82 to 0.65 at 3 h: fires after 70 minutes, i.e. two
    hourly bandwidth runs; node 21 was always at 0.6 (its own best: quiet). A small fleet: the
    scenario is 5 hours long."""
    steps = 5 * 60 + 1
    fleet = healthy_fleet(steps, nodes=SMALL_FLEET + 2, rich=True)
    fleet.set("preflight_allreduce_link_efficiency_ratio", target(20),
              [0.82 if s < 180 else 0.65 for s in range(steps)])
    fleet.set("preflight_allreduce_link_efficiency_ratio", target(21), fleet.const(0.6))
    expected = {
        "exp_labels": {**target(20), "severity": "warning"},
        "exp_annotations": annotations_of(
            "PreflightLinkEfficiencyDropped",
            f"All-reduce link efficiency dropped on {node_name(20)}",
            f"busbw / theoretical link bandwidth on {node_name(20)} is 0.65, more than 15 % "
            "below its best of the last 7 days, in two bandwidth runs in a row: an NVLink down, "
            "a PCIe link trained below its maximum, or a throttled GPU."),
    }
    return Scenario(
        "link efficiency below the node's own 7-day best (recorded hourly), confirmed by a "
        "second bandwidth run", fleet,
        [alert("PreflightLinkEfficiencyDropped", 4 * 60 + 5),
         alert("PreflightLinkEfficiencyDropped", 4 * 60 + 15, expected)],
        [firing(4 * 60 + 15, 1)])


def scenarios() -> list[Scenario]:
    return [quiet_fleet(), xid_79(), lost_gpu(), error_only(), fleet_undecided(), fleet_reason(),
            rolling_driver_upgrade(), stalled_upgrade(), link_efficiency(),
            *per_node_scenarios()]


def render(items: Sequence[Scenario]) -> str:
    header = ("# GENERATED by tests/alerts/gen_rules_test.py: edit that script, then run\n"
              "#   python -m tests.alerts.gen_rules_test\n"
              "# promtool test rules deploy/prometheus/preflight-rules.test.yaml\n")
    body = {"rule_files": ["preflight-rules.yaml"], "evaluation_interval": "1m",
            "tests": [s.to_yaml() for s in items]}
    return header + yaml.safe_dump(body, sort_keys=False, width=200)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the committed file is not what this script writes")
    args = parser.parse_args(argv)
    text = render(scenarios())
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python -m tests.alerts.gen_rules_test", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
