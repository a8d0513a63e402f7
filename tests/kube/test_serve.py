"""A real ``preflight serve`` process writing its node's status to the test API server, its
checks judging a replayed NVML snapshot (PREFLIGHT_NVML_FIXTURE, re-read by every check run)
whose GPU is lost, then healthy again."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from preflight.daemon.kube import CONDITION_TYPE, MARK_KEY
from tests import topologies
from tests.kube.apiserver import Cluster
from tests.kube.conftest import GPU_LABEL, GPU_NODES, NODE, OTHER_TAINT
from tests.serve.conftest import ServeProcess, get, serve, wait_for

__all__ = ["serve"]  # the fixture, shared with tests/serve

Serve = Callable[..., ServeProcess]


def replay(path: Path, *, lost: bool) -> None:
    """Write the snapshot the next check run reads (atomically: a run never sees half a file).
    A job holds GPU 0, so the daemon defers its bandwidth test on this CPU-only machine."""
    snap = topologies.lost_gpu(3) if lost else topologies.healthy_8x_h100()
    gpus = (dataclasses.replace(snap.gpus[0], compute_pids=(1,)), *snap.gpus[1:])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.replace(snap, gpus=gpus).to_json()))
    os.replace(tmp, path)


def start(serve: Serve, cluster: Cluster, fixture: Path, **settings: str) -> ServeProcess:
    env = {"KUBECONFIG": str(cluster.kubeconfig), "NODE_NAME": NODE,
           "PREFLIGHT_NVML_FIXTURE": str(fixture), "PREFLIGHT_KUBE_NODE_STATUS": "true",
           "PREFLIGHT_KUBE_FAIL_RUNS": "2", "PREFLIGHT_KUBE_PASS_RUNS": "2",
           "PREFLIGHT_KUBE_GUARD_SELECTOR": f"{GPU_LABEL}=true", "PREFLIGHT_KUBE_TIMEOUT_S": "2",
           "PREFLIGHT_CHECK_TIMEOUT_S": "5"}
    env.update({f"PREFLIGHT_{k.upper()}": v for k, v in settings.items()})
    # outside a pod: no in-cluster credentials may leak in from the machine running the tests
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    return serve("--listen", "127.0.0.1:0", "--interval", "0.3", env=env)


def condition(cluster: Cluster) -> dict[str, Any] | None:
    return cluster.server.condition(NODE, CONDITION_TYPE)


def runs(sp: ServeProcess) -> float:
    return sp.metrics()["preflight_runs_total"]


def test_serve_marks_after_the_threshold_clears_after_the_passes_and_outlives_a_503(
        serve: Serve, cluster: Cluster, tmp_path: Path) -> None:
    server = cluster.server
    others = {n: server.node(n) for n in [*GPU_NODES[1:], "cpu-1"]}
    fixture = tmp_path / "nvml.json"
    replay(fixture, lost=True)
    sp = start(serve, cluster, fixture)

    # the transition's last step is its Event: condition, label (and taint) are written by then
    wait_for(lambda: server.events, timeout_s=60, what="the node to be marked")
    m = sp.metrics()
    assert m["preflight_runs_total"] >= 2, "set only after kube_fail_runs runs"
    assert m['preflight_check_status{check="gpu_visible",status="fail"}'] == 1
    cond = condition(cluster)
    assert cond is not None and cond["reason"] == "GpuLost"
    assert "gpu_visible GpuLost" in cond["message"]
    node = server.node(NODE)
    assert node["spec"]["taints"] == [OTHER_TAINT], "no taint unless kube_node_taint"
    assert node["metadata"]["labels"][MARK_KEY] == "GpuLost", "the guard's label"
    assert [e["reason"] for e in server.events] == ["GpuLost"]

    # The API server goes away while the node recovers: the daemon goes on checking and serving.
    server.unavailable = 503
    replay(fixture, lost=False)
    at = runs(sp)
    wait_for(lambda: sp.metrics()["preflight_kube_write_success"] == 0, timeout_s=60,
             what="the failed write to show")
    wait_for(lambda: runs(sp) >= at + 3, timeout_s=60, what="runs during the outage")
    assert get(f"{sp.url}/healthz").status == 200
    assert get(f"{sp.url}/report").status == 200
    m = sp.metrics()
    assert m["preflight_node_healthy"] == 1
    assert m["preflight_kube_write_failures_total"] >= 1
    assert sp.proc.poll() is None
    assert condition(cluster)["status"] == "True", "nothing could be written"  # type: ignore[index]

    server.unavailable = None
    wait_for(lambda: len(server.events) == 2, timeout_s=60,
             what="the mark to clear once the API server is back")
    wait_for(lambda: sp.metrics()["preflight_kube_write_success"] == 1, timeout_s=30,
             what="the success metric")
    node = server.node(NODE)
    assert MARK_KEY not in node["metadata"]["labels"]
    assert node["spec"]["taints"] == [OTHER_TAINT]
    assert [e["reason"] for e in server.events] == ["GpuLost", "PreflightPassed"]
    assert sp.metrics()["preflight_kube_node_marked"] == 0
    for name, old in others.items():
        assert server.node(name) == old, f"the daemon wrote to {name}"
    assert {r.path for r in server.writes()} <= {f"/api/v1/nodes/{NODE}",
                                                 f"/api/v1/nodes/{NODE}/status",
                                                 "/api/v1/namespaces/default/events"}
    assert "PreflightFailed=True on node gpu-1" in sp.log()


def test_serve_with_the_taint_on_taints_and_untaints(serve: Serve, cluster: Cluster,
                                                     tmp_path: Path) -> None:
    fixture = tmp_path / "nvml.json"
    replay(fixture, lost=True)
    sp = start(serve, cluster, fixture, kube_node_taint="true")
    ours = {"key": MARK_KEY, "value": "GpuLost", "effect": "NoSchedule"}
    wait_for(lambda: ours in (cluster.server.node(NODE)["spec"].get("taints") or ()),
             timeout_s=60, what="the taint")
    replay(fixture, lost=False)
    wait_for(lambda: (c := condition(cluster)) is not None and c["status"] == "False",
             timeout_s=60, what="the condition to clear")
    assert cluster.server.node(NODE)["spec"]["taints"] == [OTHER_TAINT], "ours removed only"
    assert sp.proc.poll() is None


def test_serve_holds_its_mark_when_most_nodes_are_marked(serve: Serve, cluster: Cluster,
                                                         tmp_path: Path) -> None:
    for name in GPU_NODES[1:8]:  # 7 of 10 GPU nodes marked: a bad rollout, not 7 bad nodes
        cluster.server.nodes[name]["metadata"]["labels"][MARK_KEY] = "GpuLost"
    fixture = tmp_path / "nvml.json"
    replay(fixture, lost=True)
    sp = start(serve, cluster, fixture, kube_node_taint="true", kube_max_marked_fraction="0.5")
    wait_for(lambda: sp.metrics()["preflight_kube_guard_holding"] == 1, timeout_s=60,
             what="the guard to hold")
    at = runs(sp)
    wait_for(lambda: runs(sp) >= at + 3, timeout_s=60, what="more runs")
    cond = condition(cluster)
    assert cond is None or cond["status"] == "False"
    assert cluster.server.node(NODE)["spec"]["taints"] == [OTHER_TAINT]
    assert [e["reason"] for e in cluster.server.events] == ["PreflightMarkWithheld"]
    assert "7 of the 10 nodes compared with (70%)" in cluster.server.events[0]["message"]
    assert "fleet guard holds" in sp.log()


def test_serve_without_a_node_name_exits_2_naming_it(serve: Serve, cluster: Cluster,
                                                     tmp_path: Path) -> None:
    fixture = tmp_path / "nvml.json"
    replay(fixture, lost=False)
    sp = serve("--listen", "127.0.0.1:0", wait_listening=False,
               env={"KUBECONFIG": str(cluster.kubeconfig), "PREFLIGHT_KUBE_NODE_STATUS": "1",
                    "PREFLIGHT_NVML_FIXTURE": str(fixture)})
    assert sp.proc.wait(30) == 2
    assert "NODE_NAME is not set" in sp.log()
    assert not cluster.server.requests
