"""The agents' protocol over a real TCPStore on 127.0.0.1, in one process: the real Agent code on
every node (threads), synthetic node checks and all-reduce figures (tests/cluster/sim.py), and
hand-written store values for the peers that misbehave. No root, no workers."""

from __future__ import annotations

import dataclasses
import datetime
import socket
import threading
import time
from typing import Any

import pytest

from tests.cluster.sim import Fabric, SyntheticRunner, arrival, open_rank, run_cluster

torch_dist = pytest.importorskip("torch.distributed")

from preflight.cluster import wire  # noqa: E402
from preflight.cluster.agent import Agent, Restarted  # noqa: E402
from preflight.cluster.options import ClusterUsageError  # noqa: E402
from preflight.cluster.store import BASE, MasterLost  # noqa: E402
from preflight.cluster.verdict import render  # noqa: E402
from tests.cluster.sim import SETTINGS, options  # noqa: E402


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    """A store client that writes what it likes, in the epoch node 0 opened."""

    def __init__(self, port: int, timeout_s: float = 20.0) -> None:
        self.raw = torch_dist.TCPStore("127.0.0.1", port, None, False,
                                       timeout=datetime.timedelta(seconds=timeout_s))
        base = torch_dist.PrefixStore(BASE, self.raw)
        base.wait(["started"])
        self.store = torch_dist.PrefixStore(f"e{base.add('epoch', 0)}/", base)

    def log(self, log: str, rank: int, nonce: str, raw: bytes | str) -> None:
        self.store.set(f"{log}/v/{rank}/{nonce}", raw)
        seq = self.store.add(f"{log}/n", 1)
        self.store.set(f"{log}/{seq}", wire.encode(f"{rank}:{nonce}"))


def same_everywhere(out: Any) -> dict[str, Any]:
    v = out.verdicts[0]
    for r, x in out.verdicts.items():
        assert (x["status"], x["slow_nodes"], x["failed_nodes"], x["findings"]) == (
            v["status"], v["slow_nodes"], v["failed_nodes"], v["findings"]), r
    return v


def test_the_slow_and_the_failed_node_are_named_and_nobody_else(port: int) -> None:
    out = run_cluster(16, Fabric(speed={4: 0.6}, failing={9}), port=port)
    assert not out.errors, out.errors
    v = same_everywhere(out)
    assert (v["slow_nodes"], v["failed_nodes"], v["exit_code"]) == ([4], [9], 1)
    reasons = [f["reason"] for f in v["findings"]]
    assert reasons == ["WorldAllreduceFailed", "NodeFailed", "SlowNode"], reasons
    failed = next(f for f in v["findings"] if f["reason"] == "NodeFailed")
    assert "node 9 (node9) failed (not slow)" in failed["message"]
    assert "Duplicate GPU detected" in failed["message"]  # what the workers said, quoted
    assert [r["round"] for r in v["localisation"]["rounds"]] == ["pairs", "confirm"]
    assert len(out.verdicts) == 16


def test_healthy_nodes_pass_with_no_floor_given(port: int) -> None:
    v = same_everywhere(run_cluster(12, Fabric(), port=port))
    assert (v["status"], v["slow_nodes"], v["failed_nodes"]) == ("pass", [], [])
    assert [r["round"] for r in v["localisation"]["rounds"]] == ["pairs"]


def test_a_failure_on_every_node_is_said_as_such_not_blamed_on_one(port: int) -> None:
    v = same_everywhere(run_cluster(6, Fabric(failing=set(range(6))), port=port))
    reasons = [f["reason"] for f in v["findings"]]
    assert reasons == ["WorldAllreduceFailed", "AllreduceFailedEverywhere"], reasons
    assert v["failed_nodes"] == [] and v["slow_nodes"] == []
    assert "NCCL said: Duplicate GPU detected" in v["findings"][0]["message"]


def test_two_nodes_one_failing_names_the_node_whose_workers_failed(port: int) -> None:
    v = same_everywhere(run_cluster(2, Fabric(failing={1}), port=port))
    assert (v["failed_nodes"], v["slow_nodes"]) == ([1], [])
    assert [f["reason"] for f in v["findings"]] == ["WorldAllreduceFailed", "NodeFailed"]


def nccl_node(rank: int, n: int, fabric: Fabric, gbps: float) -> SyntheticRunner:
    """A node whose NCCL runs over RDMA ports of ``gbps`` in all."""
    return SyntheticRunner(rank, fabric, nnodes=n, timeout_s=20.0, facts=lambda nonce: arrival(
        rank, nonce, nnodes=n, timeout_s=20.0, backend="nccl",
        link={"transport": "rdma", "gbps": gbps, "basis": f"RDMA mlx5_0:1 {gbps:g} Gb/s"}))


def test_with_nccl_two_nodes_get_a_verdict_from_their_links(port: int) -> None:
    nccl = dataclasses.replace(SETTINGS, backend="nccl")
    fabric = Fabric(base_gbps=10.0)  # 10 GB/s: 0.8 of a 100 Gb/s link, 0.2 of a 400 Gb/s one
    good = run_cluster(2, fabric, port=port, settings=nccl,
                       runners={r: nccl_node(r, 2, fabric, 100.0) for r in range(2)})
    ar = good.verdicts[0]["allreduce"]
    assert (good.verdicts[0]["status"], ar["reason"]) == ("pass", "AllreduceOk")
    assert 0.77 <= ar["link_efficiency"] <= 0.83
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other = int(s.getsockname()[1])
    low = run_cluster(2, fabric, port=other, settings=nccl,
                      runners={r: nccl_node(r, 2, fabric, 400.0 if r else 800.0)
                               for r in range(2)})
    v = low.verdicts[0]
    assert v["allreduce"]["reason"] == "BelowLink" and v["exit_code"] == 1
    assert "of the slowest node's link (RDMA mlx5_0:1 400 Gb/s)" in v["allreduce"]["message"]
    assert [f["reason"] for f in v["findings"]] == ["WorldAllreduceSlow"]


def test_each_malformed_store_value_names_its_node_and_the_run_goes_on(port: int) -> None:
    def peers(_store: Any) -> None:
        def misbehave() -> None:
            p = Peer(port)
            p.log("arrive", 1, "01" * 8, b"{not json")
            p.log("arrive", 2, "02" * 8, wire.encode({**arrival(2, "02" * 8, nnodes=5,
                                                                timeout_s=6.0), "nproc": [8]}))
            p.log("arrive", 3, "03" * 8, wire.encode(arrival(3, "03" * 8, nnodes=5, timeout_s=6.0,
                                                             host="h" * 7_000_000)))
            p.log("arrive", 4, "04" * 8, wire.encode(arrival(4, "04" * 8, nnodes=5,
                                                             timeout_s=6.0)))
            p.store.wait(["step/0"])
            p.log("res/0", 4, "04" * 8, wire.encode({"nonce": "04" * 8, "status": "pass",
                                                     "results": [], "fingerprint": "abc"}))

        threading.Thread(target=misbehave, daemon=True).start()

    out = run_cluster(5, Fabric(), port=port, timeout_s=6.0, ranks=[0],
                      before_followers=peers)
    v = out.verdicts[0]
    garbage = {g["node_rank"]: g for g in v["garbage"]}
    assert garbage[1]["why"] == "its arrival value is not JSON"
    assert garbage[2]["why"] == "nproc is a list, expected a whole number in 1..64"
    assert garbage[3]["why"].startswith("its arrival value is 7,000,")
    assert (garbage[4]["what"], garbage[4]["why"]) == ("node checks",
                                                       "fingerprint is text, expected an object")
    sent = [f["message"] for f in v["findings"] if f["reason"] == "NodeSentGarbage"]
    assert len(sent) == 4 and sent[0].startswith("node 1 sent an invalid arrival")
    assert v["missing_nodes"] == [1, 2, 3] and v["exit_code"] == 1
    row = {n["node_rank"]: n for n in v["nodes"]}[4]
    assert (row["status"], row["why"]) == ("fail", ["sent an invalid node checks"])


def test_ddp_over_every_node_is_one_step_and_a_garbled_answer_names_its_node(port: int) -> None:
    from tests.ddp.test_proofs import _facts

    def node(rank: int, answer: dict[str, Any]) -> SyntheticRunner:
        return SyntheticRunner(rank, Fabric(), nnodes=3, timeout_s=20.0,
                               ddp=lambda nodes: answer)

    def healthy(rank: int) -> dict[str, Any]:
        return {"status": "pass", "reason": "DdpWorldRan", "message": "",
                "ranks": [_facts(rank, world=3)], "failure": None,
                "device": {"status": "n/a", "message": ""}, "nccl_warnings": [],
                "seconds": 1.0}

    settings = dataclasses.replace(SETTINGS, bandwidth=False, ddp=True, ddp_deadline_s=10.0)
    v = same_everywhere(run_cluster(3, Fabric(), port=port, settings=settings, runners={
        r: node(r, healthy(r)) for r in range(3)}))
    assert v["ddp"]["status"] == "pass" and v["ddp"]["ranks"] == 3, v["ddp"]
    assert v["exit_code"] == 0
    # node 2's answer has a list where the failure's object goes: named, and the step fails
    # as not answered by it, instead of the run stopping.
    bad = {**healthy(2), "status": "fail", "failure": ["stalled"]}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        other = int(sock.getsockname()[1])
    out = run_cluster(3, Fabric(), port=other, settings=settings, runners={
        0: node(0, healthy(0)), 1: node(1, healthy(1)), 2: node(2, bad)})
    v = same_everywhere(out)
    assert [g["node_rank"] for g in v["garbage"]] == [2]
    assert v["garbage"][0]["why"] == "failure is a list, expected an object"
    assert v["ddp"]["status"] == "fail" and "2 did not answer" in v["ddp"]["message"]
    assert "DdpWorldFailed" in [f["reason"] for f in v["findings"]] and v["exit_code"] == 1


def test_a_stray_agent_with_another_nnodes_is_named_and_a_late_node_is_not_missing(port: int
                                                                                    ) -> None:
    fabric = Fabric()
    stray = SyntheticRunner(3, fabric, nnodes=5, timeout_s=8.0)
    late = SyntheticRunner(2, fabric, nnodes=3, timeout_s=8.0)
    late._facts = lambda nonce: (time.sleep(2.0), arrival(2, nonce, nnodes=3, timeout_s=8.0))[1]
    errors: dict[int, BaseException] = {}

    def start_stray(_store: Any) -> None:
        def go() -> None:
            try:
                Agent(options(3, 5, port, 8.0), SETTINGS, open_rank(3, 5, port, 8.0), stray,
                      host="stray").run()
            except BaseException as exc:
                errors[3] = exc

        threading.Thread(target=go, daemon=True).start()

    out = run_cluster(3, fabric, port=port, timeout_s=8.0, runners={2: late},
                      before_followers=start_stray)
    v = same_everywhere(out)
    assert v["exit_code"] == 2 and v["missing_nodes"] == []
    assert v["findings"][0]["reason"] == "ClusterUsage"
    assert v["findings"][0]["message"] == "node 3 (node3, pid 1003) has --nnodes 5"
    time.sleep(0.5)
    assert isinstance(errors.get(3), ClusterUsageError)
    assert "node 0 has --nnodes 3" in str(errors[3])


def test_nodes_with_another_timeout_are_a_usage_error_naming_them(port: int) -> None:
    fabric = Fabric()
    odd = SyntheticRunner(1, fabric, nnodes=3, timeout_s=9.0)
    out = run_cluster(3, fabric, port=port, timeout_s=6.0, runners={1: odd})
    assert isinstance(out.errors.get(1), ClusterUsageError)
    assert out.verdicts[0]["findings"][0]["message"] == "node 1 (node1, pid 1001) has --timeout 9"
    assert out.verdicts[2]["exit_code"] == 2


def test_a_follower_restarted_after_the_checks_began_is_accepted(port: int) -> None:
    fabric = Fabric()
    began = threading.Event()

    class Dies(SyntheticRunner):
        def checks(self) -> dict[str, Any]:
            began.set()
            raise SystemExit("killed")  # the agent process ends without answering

    def restart(_store: Any) -> None:
        def go() -> None:
            began.wait(20)
            again = Agent(options(2, 4, port, 8.0), SETTINGS, open_rank(2, 4, port, 8.0),
                          SyntheticRunner(2, fabric, nnodes=4, timeout_s=8.0), host="node2")
            restarted["verdict"] = again.run()

        threading.Thread(target=go, daemon=True).start()

    restarted: dict[str, Any] = {}
    out = run_cluster(4, fabric, port=port, timeout_s=8.0,
                      runners={2: Dies(2, fabric, nnodes=4, timeout_s=8.0)},
                      before_followers=restart)
    v = out.verdicts[0]
    assert (v["status"], v["restarted_nodes"], v["unresponsive_nodes"]) == ("pass", [2], [])
    time.sleep(0.5)
    assert restarted["verdict"]["status"] == "pass"


def test_a_follower_refuses_a_step_that_is_not_valid(port: int) -> None:
    server = open_rank(0, 2, port, 5.0)
    base = server  # node 0's side, written by hand
    base.add("epoch", 1)
    e = base.scoped("e1")
    e.set("lead", {"nonce": "00" * 8, "nnodes": 2, "timeout_s": 5.0, "host": "n0"})
    base.set("started", 1)
    agent = Agent(options(1, 2, port, 5.0), SETTINGS, open_rank(1, 2, port, 5.0),
                  SyntheticRunner(1, Fabric(), nnodes=2, timeout_s=5.0), host="node1",
                  nonce="11" * 8)
    e.set(f"ok/{'11' * 8}", {"nonce": "11" * 8, "from_step": 0, "refused": None})
    e.set("step/0", {"do": "allreduce", "groups": "everything"})
    with pytest.raises(MasterLost, match=r"the store's step/0 .* is not valid: deadline_s is null"):
        agent.run()
    assert Restarted  # the type a follower raises to join a new epoch exists


def test_node_0s_store_traffic_grows_with_the_nodes_not_faster(port: int) -> None:
    figures: dict[int, tuple[int, int]] = {}
    for n in (8, 32):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = int(s.getsockname()[1])
        v = run_cluster(n, Fabric(speed={3: 0.5}), port=p).verdicts[0]
        figures[n] = (v["store"]["ops"], v["store"]["bytes"])
    ratio_bytes = figures[32][1] / figures[8][1]
    assert ratio_bytes < 4 * 1.25, figures  # 4x the nodes: about 4x the bytes
    assert figures[32][0] < 4 * figures[8][0], figures  # requests: batched, less than linear


def test_render_of_a_follower_is_one_line(port: int) -> None:
    out = run_cluster(3, Fabric(speed={1: 0.4}), port=port)
    line = render(out.verdicts[2], full=True, node_rank=2)
    assert "\n" not in line and line.startswith("node 2: cluster FAIL: 3/3 nodes, slow: 1")



def test_a_store_that_gives_up_by_itself_still_says_why_the_master_is_silent(
        port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """TCPStore's connect retries end at a random moment, sometimes before our own wait does:
    its own "timed out" is then the answer, and the port is asked which silence it was."""
    from preflight.cluster import store

    def gives_up(*_a: Any, **_k: Any) -> Any:
        raise torch_dist.DistNetworkError(  # type: ignore[attr-defined]
            f"The client socket has timed out after 1988ms while trying to connect to "
            f"(127.0.0.1, {port}).")

    monkeypatch.setattr(torch_dist, "TCPStore", gives_up)
    with pytest.raises(MasterLost) as got:
        store.connect(options(1, 2, port, 1.0), hosting=False, until=time.monotonic() + 1.0)
    assert "nothing listens on that port: connection refused" in str(got.value)
    assert "did not answer within 1 s" in str(got.value)
