"""The node-status writer (preflight.daemon.kube) against the test API server, in process: the
hysteresis, what is written where and in which patch format, the guard, failures and RBAC."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from preflight.core.result import Report, Result, Scope, Status
from preflight.daemon import kube
from preflight.daemon.kube import (
    CONDITION_TYPE,
    MARK_KEY,
    Hysteresis,
    NodeStatus,
    Observation,
    Verdict,
    observe,
)
from preflight.daemon.kubeapi import Credentials, KubeClient
from tests.kube.apiserver import ApiServer, Cluster, iter_rules, node_object
from tests.kube.conftest import GPU_LABEL, GPU_NODES, NODE, OTHER_TAINT

FAULT = Report(results=(
    Result("gpu_visible", Status.FAIL, "GpuLost", "GPU 3: NVML_ERROR_GPU_IS_LOST"),
    Result("shm", Status.PASS, "ShmOk", "/dev/shm 64 GiB"),
))
HEALTHY = Report(results=(Result("gpu_visible", Status.PASS, "GpusOk", "8 GPUs"),
                          Result("xid", Status.WARN, "KernelLogUnreadable", "no journal")))
UNDECIDED = Report(results=(Result("gpu_visible", Status.ERROR, "CheckTimeout", "10 s"),))
ALL_SKIPPED = Report(results=(Result("gpu_visible", Status.SKIP, "NoGpus", "none"),))
JOB_FAULT = Report(results=(
    Result("cuda_devices", Status.FAIL, "DuplicateDevice", "0,0", scope=Scope.JOB),
    Result("gpu_visible", Status.PASS, "GpusOk", "8 GPUs")))


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def settle(server: ApiServer, seconds: float = 0.3) -> int:
    """Let the writer thread finish what the last observation asked; the number of writes."""
    before = -1
    while True:
        time.sleep(seconds)
        now = len(server.writes())
        if now == before:
            return now
        before = now


@pytest.fixture
def writer(cluster: Cluster) -> Iterator[Callable[..., NodeStatus]]:
    started: list[NodeStatus] = []

    def make(token: str | None = None, **options: Any) -> NodeStatus:
        creds = Credentials(server=cluster.server.url, token=token or cluster.token,
                            ca_file=str(cluster.server.ca), source="test")
        settings: dict[str, Any] = {"fail_runs": 3, "pass_runs": 2, "heartbeat_s": 300.0,
                                    "guard_selector": f"{GPU_LABEL}=true", "guard_recheck_s": 0.2}
        settings.update(options)
        ns = NodeStatus(KubeClient(creds, timeout_s=2.0), NODE, **settings)
        ns.start()
        started.append(ns)
        return ns

    yield make
    for ns in started:
        ns.stop()


def feed(ns: NodeStatus, server: ApiServer, *reports: Report) -> None:
    for r in reports:
        ns.observe(r)
        settle(server, 0.1)


def condition(server: ApiServer) -> dict[str, Any] | None:
    return server.condition(NODE, CONDITION_TYPE)


def metric(ns: NodeStatus, name: str) -> float:
    for family in ns.collect():
        if family.name == name.removesuffix("_total"):
            return float(family.samples[0].value)
    raise KeyError(name)


# ---- pure parts ------------------------------------------------------------------------------

def test_what_counts_as_a_node_fault() -> None:
    assert observe(FAULT).verdict is Verdict.FAULT
    assert observe(FAULT).reason == "GpuLost"
    assert "gpu_visible GpuLost: GPU 3" in observe(FAULT).message
    assert observe(HEALTHY).verdict is Verdict.HEALTHY, "a WARN is healthy"
    assert observe(JOB_FAULT).verdict is Verdict.HEALTHY, "the job's own mistake is not the node's"
    assert observe(UNDECIDED).verdict is Verdict.UNDECIDED
    assert observe(ALL_SKIPPED).verdict is Verdict.UNDECIDED
    both = Report(results=(*UNDECIDED.results, *FAULT.results))
    assert observe(both).verdict is Verdict.FAULT, "an ERROR beside a node FAIL"


def test_hysteresis_needs_runs_in_a_row_and_undecided_runs_break_them() -> None:
    h = Hysteresis(fail_runs=3, pass_runs=2)
    fault, ok, und = (Observation(Verdict.FAULT, "GpuLost", "m"), Observation(Verdict.HEALTHY),
                      Observation(Verdict.UNDECIDED))
    assert h.desired(on_node=False) is None, "nothing before the node's state is known"
    h.adopt(False)
    for obs in (fault, fault, und, fault, fault):
        h.feed(obs)
    assert h.marked is False, "an undecided run breaks the streak"
    h.feed(fault)
    assert h.marked is True
    h.feed(ok)
    h.feed(fault)
    h.feed(ok)
    assert h.marked is True, "one healthy run between faults does not clear it"
    h.feed(ok)
    assert h.marked is False
    desired = h.desired(on_node=True)
    assert desired is not None and desired.reason == "PreflightPassed"


@pytest.mark.parametrize(("reason", "value"), [("GpuLost", "GpuLost"), ("a b/c", "abc"),
                                               ("x" * 80, "x" * 63), ("-_.", "")])
def test_label_values_are_valid(reason: str, value: str) -> None:
    assert kube.label_value(reason) == value


# ---- against the API server ------------------------------------------------------------------

def test_condition_set_after_the_threshold_and_cleared_after_the_passes(
        cluster: Cluster, writer: Callable[..., NodeStatus]) -> None:
    server = cluster.server
    ns = writer()
    feed(ns, server, HEALTHY)
    cond = wait_for(lambda: condition(server), "the first condition")
    assert cond["status"] == "False" and cond["reason"] == "PreflightPassed"
    feed(ns, server, FAULT, FAULT)
    assert condition(server)["status"] == "False", "two faults are below kube_fail_runs 3"
    feed(ns, server, FAULT)
    cond = wait_for(lambda: (c := condition(server)) and c["status"] == "True" and c,
                    "the condition to turn True")
    assert cond["reason"] == "GpuLost"
    assert "gpu_visible GpuLost: GPU 3: NVML_ERROR_GPU_IS_LOST" in cond["message"]
    set_at = cond["lastTransitionTime"]
    feed(ns, server, HEALTHY)
    assert condition(server)["status"] == "True", "one healthy run is below kube_pass_runs 2"
    feed(ns, server, HEALTHY)
    wait_for(lambda: len(server.events) == 2, "the clear (its event is the last step)")
    cond = condition(server)
    assert cond["reason"] == "PreflightPassed"
    assert cond["lastTransitionTime"] >= set_at
    # the other conditions are untouched (merged by type), and one Event per transition
    assert server.condition(NODE, "Ready")["status"] == "True"
    reasons = [(e["reason"], e["type"]) for e in server.events]
    assert reasons == [("GpuLost", "Warning"), ("PreflightPassed", "Normal")]
    event = server.events[0]
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                       "uid": f"uid-{NODE}"}
    # the condition goes through the status subresource as a strategic merge patch of our
    # condition alone; with the guard on, the Node itself gets the label the guard counts by
    patches = [r for r in server.writes() if r.method == "PATCH"]
    status = [r for r in patches if r.path == f"/api/v1/nodes/{NODE}/status"]
    assert status and all(r.content_type == "application/strategic-merge-patch+json"
                          and [c["type"] for c in r.body["status"]["conditions"]] ==
                          [CONDITION_TYPE] for r in status)
    label = [r for r in patches if r not in status]
    assert [r.path for r in label] == [f"/api/v1/nodes/{NODE}"] * 2, "label set, then removed"
    assert MARK_KEY not in server.node(NODE)["metadata"]["labels"]
    assert server.node(NODE)["spec"]["taints"] == [OTHER_TAINT], "no taint unless asked"
    assert metric(ns, "preflight_kube_write_success") == 1.0
    assert metric(ns, "preflight_kube_node_marked") == 0.0


@pytest.mark.parametrize("report", [UNDECIDED, ALL_SKIPPED, JOB_FAULT],
                         ids=["error", "skip", "job-scope-fail"])
def test_an_error_a_skip_or_a_job_fault_never_sets_it(cluster: Cluster,
                                                      writer: Callable[..., NodeStatus],
                                                      report: Report) -> None:
    ns = writer(fail_runs=2)
    feed(ns, cluster.server, *[report] * 5)
    cond = condition(cluster.server)
    assert cond is None or cond["status"] == "False"
    assert not cluster.server.events


def test_no_taint_unless_asked_and_nothing_written_to_other_nodes(
        cluster: Cluster, writer: Callable[..., NodeStatus]) -> None:
    server = cluster.server
    before = {n: server.node(n) for n in [*GPU_NODES, "cpu-1"]}
    ns = writer(fail_runs=1, max_marked_fraction=1.0)  # the guard off: no label either
    feed(ns, server, FAULT)
    wait_for(lambda: (c := condition(server)) and c["status"] == "True", "the mark")
    node = server.node(NODE)
    assert node["spec"]["taints"] == [OTHER_TAINT], "no taint of ours, the other one kept"
    assert MARK_KEY not in node["metadata"]["labels"]
    assert {r.path for r in server.writes() if r.method == "PATCH"} == {
        f"/api/v1/nodes/{NODE}/status"}, "the taint off and the guard off: no nodes patch"
    for name, old in before.items():
        if name != NODE:
            assert server.node(name) == old, f"{name} was written"
    assert not [r for r in server.requests if r.path == "/api/v1/nodes"], "no list without guard"


def test_the_taint_is_added_and_removed_leaving_other_taints_and_the_cordon(
        cluster: Cluster, writer: Callable[..., NodeStatus]) -> None:
    server = cluster.server
    server.nodes[NODE]["spec"]["unschedulable"] = True  # an operator's cordon
    ns = writer(fail_runs=1, pass_runs=1, taint=True)
    feed(ns, server, FAULT)
    node = wait_for(lambda: (n := server.node(NODE)) and len(n["spec"]["taints"]) == 2 and n,
                    "the taint")
    ours = {"key": MARK_KEY, "value": "GpuLost", "effect": "NoSchedule"}
    assert node["spec"]["taints"] == [OTHER_TAINT, ours]
    assert node["metadata"]["labels"][MARK_KEY] == "GpuLost"
    assert condition(server)["status"] == "True"
    (mark_patch,) = [r for r in server.writes() if r.path == f"/api/v1/nodes/{NODE}"]
    assert mark_patch.content_type == "application/json-patch+json"
    assert mark_patch.body[0]["op"] == "test" and mark_patch.body[0]["path"] == \
        "/metadata/resourceVersion", "the add is guarded by the resourceVersion"
    # another tool adds a taint meanwhile; clearing removes ours only
    server.nodes[NODE]["spec"]["taints"].insert(0, {"key": "example.com/maintenance",
                                                    "effect": "NoExecute"})
    feed(ns, server, HEALTHY)
    wait_for(lambda: len(server.events) == 2, "the clear (its event is the last step)")
    node = server.node(NODE)
    assert MARK_KEY not in node["metadata"]["labels"]
    assert node["spec"]["taints"] == [{"key": "example.com/maintenance", "effect": "NoExecute"},
                                      OTHER_TAINT]
    assert node["spec"]["unschedulable"] is True, "the cordon is not ours to lift"
    assert condition(server)["status"] == "False"
    assert "taint cluster-preflight/node-fault:NoSchedule" in server.events[0]["message"]


def test_a_concurrent_change_between_read_and_patch_is_retried_not_lost(
        cluster: Cluster, writer: Callable[..., NodeStatus]) -> None:
    """Another writer changes the Node between our GET and our PATCH: the resourceVersion test
    fails (422), the writer reads again, and both taints end up on the node."""
    server = cluster.server
    raced: list[str] = []

    def other_writer(srv: ApiServer, name: str, status: bool) -> None:
        if not raced and name == NODE and not status:
            raced.append(name)
            srv.nodes[name]["spec"]["taints"].append({"key": "other.example/x",
                                                      "effect": "NoSchedule"})
            srv.nodes[name]["metadata"]["resourceVersion"] = srv.next_rv()

    ns = writer(fail_runs=1, taint=True)
    server.before_patch.append(other_writer)
    feed(ns, server, FAULT)
    node = wait_for(lambda: (n := server.node(NODE)) and len(n["spec"]["taints"]) == 3 and n,
                    "both taints")
    assert {t["key"] for t in node["spec"]["taints"]} == {"nvidia.com/gpu", "other.example/x",
                                                          MARK_KEY}
    assert 422 in [r.status for r in server.requests if r.path == f"/api/v1/nodes/{NODE}"]


def test_the_guard_holds_when_most_nodes_are_marked(cluster: Cluster,
                                                    writer: Callable[..., NodeStatus]) -> None:
    server = cluster.server
    for name in GPU_NODES[1:7]:  # 6 of the 10 GPU nodes already carry the mark
        server.nodes[name]["metadata"]["labels"][MARK_KEY] = "XidFault"
    ns = writer(fail_runs=1, taint=True, max_marked_fraction=0.5)
    feed(ns, server, FAULT, FAULT)
    wait_for(lambda: server.events, "the withheld event")
    assert metric(ns, "preflight_kube_guard_holding") == 1.0
    cond = condition(server)
    assert cond is None or cond["status"] == "False"
    assert server.node(NODE)["spec"]["taints"] == [OTHER_TAINT]
    (event,) = server.events
    assert event["reason"] == "PreflightMarkWithheld"
    assert "6 of the 10 nodes compared with (60%)" in event["message"]
    lists = [r for r in server.requests if r.path == "/api/v1/nodes"]
    assert lists and all(r.query["resourceVersion"] == "0" and
                         r.query["includeObject"] == "None" and
                         r.query["labelSelector"].startswith(f"{GPU_LABEL}=true")
                         for r in lists), [r.query for r in lists]
    # fewer marks elsewhere (the fleet recovers): the next look lets the mark through
    for name in GPU_NODES[1:5]:
        del server.nodes[name]["metadata"]["labels"][MARK_KEY]
    feed(ns, server, FAULT)
    wait_for(lambda: (c := condition(server)) and c["status"] == "True", "the mark")
    assert metric(ns, "preflight_kube_guard_holding") == 0.0


def test_the_api_server_answering_503_is_a_metric_and_a_retry(cluster: Cluster,
                                                             writer: Callable[..., NodeStatus]
                                                             ) -> None:
    server = cluster.server
    server.unavailable = 503
    ns = writer(fail_runs=1)
    started = time.monotonic()
    ns.observe(FAULT)  # returns at once: the writer thread does the talking
    assert time.monotonic() - started < 0.5
    wait_for(lambda: metric(ns, "preflight_kube_write_success") == 0.0, "a failed write")
    assert metric(ns, "preflight_kube_write_failures_total") >= 1
    server.unavailable = None
    wait_for(lambda: metric(ns, "preflight_kube_write_success") == 1.0, "the retry", 15)
    assert condition(server)["status"] == "True"
    assert metric(ns, "preflight_kube_last_write_success_timestamp_seconds") > time.time() - 60


def test_a_restarted_daemon_keeps_the_mark_until_the_passes(cluster: Cluster,
                                                           writer: Callable[..., NodeStatus]
                                                           ) -> None:
    server = cluster.server
    server.nodes[NODE]["status"]["conditions"].append(
        {"type": CONDITION_TYPE, "status": "True", "reason": "GpuLost", "message": "before",
         "lastHeartbeatTime": "2026-12-01T00:00:00Z",
         "lastTransitionTime": "2026-12-01T00:00:00Z"})
    ns = writer(pass_runs=3)
    feed(ns, server, HEALTHY, HEALTHY)
    cond = condition(server)
    assert cond["status"] == "True", "two healthy runs after a restart do not clear it"
    assert cond["lastTransitionTime"] == "2026-12-01T00:00:00Z", "the transition time is kept"
    feed(ns, server, HEALTHY)
    wait_for(lambda: server.events, "the clear's event")
    assert condition(server)["status"] == "False"
    assert [e["reason"] for e in server.events] == ["PreflightPassed"]


def test_writes_are_bounded_on_change_plus_heartbeat(cluster: Cluster,
                                                     writer: Callable[..., NodeStatus]) -> None:
    server = cluster.server
    ns = writer(heartbeat_s=0.5)
    for _ in range(10):  # ten unchanged healthy runs in about a second
        ns.observe(HEALTHY)
        time.sleep(0.1)
    settle(server)
    patches = [r for r in server.writes() if r.method == "PATCH"]
    assert 1 <= len(patches) <= 4, f"{len(patches)} writes for 10 unchanged runs"


def test_least_privilege_rbac_is_enough_with_the_taint_and_guard_off(
        cluster: Cluster, writer: Callable[..., NodeStatus]) -> None:
    """nodes get, nodes/status patch, events create in default: a full mark and clear."""
    server = cluster.server
    server.add_token("minimal", "system:serviceaccount:monitoring:minimal",
                     set(iter_rules(taint=False, guard=False)))
    ns = writer(token="minimal", fail_runs=1, pass_runs=1, max_marked_fraction=1.0)
    feed(ns, server, FAULT, HEALTHY)
    wait_for(lambda: len(server.events) == 2, "both events")
    assert condition(server)["status"] == "False"
    assert not [r for r in server.requests if r.status == 403]


def test_a_forbidden_write_is_reported_not_hidden(cluster: Cluster,
                                                 writer: Callable[..., NodeStatus]) -> None:
    """The taint asked for without nodes patch in the role (a chart values mix-up): the
    condition is written, the taint is refused, the metric says so."""
    server = cluster.server
    server.add_token("minimal", "system:serviceaccount:monitoring:minimal",
                     set(iter_rules(taint=False, guard=False)))
    ns = writer(token="minimal", fail_runs=1, taint=True, max_marked_fraction=1.0)
    ns.observe(FAULT)
    wait_for(lambda: metric(ns, "preflight_kube_write_success") == 0.0, "the failed write")
    assert condition(server)["status"] == "True"
    forbidden = [r for r in server.requests if r.status == 403]
    assert forbidden and forbidden[0].path == f"/api/v1/nodes/{NODE}"


def test_in_cluster_credentials_are_found_and_the_token_reread(tmp_path: Path,
                                                              cluster: Cluster) -> None:
    """The ServiceAccount files as the kubelet mounts them; a rotated token is used at once."""
    from preflight.daemon.kubeapi import find_credentials

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(cluster.token)
    (sa / "ca.crt").write_text(cluster.server.ca.read_text())
    port = cluster.server.url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port,
           "KUBECONFIG": "/nonexistent"}
    creds = find_credentials(env, account_dir=sa)
    assert creds.source.startswith("in-cluster")
    client = KubeClient(creds, timeout_s=2.0)
    assert client.request("GET", f"/api/v1/nodes/{NODE}")["metadata"]["name"] == NODE
    cluster.server.add_token("rotated", "system:serviceaccount:monitoring:pf",
                             {("get", "nodes")})
    (sa / "token").write_text("rotated")
    client.request("GET", f"/api/v1/nodes/{NODE}")
    assert cluster.server.requests[-1].user == "system:serviceaccount:monitoring:pf"


def test_the_server_certificate_is_checked(tmp_path: Path, cluster: Cluster) -> None:
    from preflight.daemon.kubeapi import KubeApiError

    client = KubeClient(Credentials(server=cluster.server.url, token=cluster.token,
                                    source="test"), timeout_s=2.0)  # the system CAs only
    with pytest.raises(KubeApiError, match="CERTIFICATE_VERIFY_FAILED"):
        client.request("GET", f"/api/v1/nodes/{NODE}")


def test_a_missing_node_is_an_error_never_another_node(cluster: Cluster) -> None:
    server = cluster.server
    creds = Credentials(server=server.url, token=cluster.token, ca_file=str(server.ca))
    ns = NodeStatus(KubeClient(creds, timeout_s=2.0), "gpu-99", fail_runs=1)
    ns.start()
    try:
        ns.observe(FAULT)
        wait_for(lambda: metric(ns, "preflight_kube_write_success") == 0.0, "the failure")
    finally:
        ns.stop()
    assert not server.writes()
    assert node_object("x")["kind"] == "Node"
