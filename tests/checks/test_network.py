"""``network`` on made-up interfaces through the fixture probe: no root, no namespaces (the
namespace suites in this folder are the end-to-end tests). What each case asserts is what a person
reads: the verdict, the reason, whose fault it is, the interface named."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from preflight.checks import CHECKS, network
from preflight.core.result import Scope, Status
from preflight.core.runner import run_checks, select
from preflight.probes.ib import probe_ib
from preflight.probes.net import FixtureNetProbe, NetIf, make_snapshot
from tests.checks.sysfs_ib import add_port
from tests.conftest import MakeCtx

V4 = socket.AF_INET
LO = NetIf("lo", True, True, True, 65536, ((V4, "127.0.0.1", "255.0.0.0"),))
MGMT = NetIf("eth0", True, True, False, 1500, ((V4, "10.0.0.5", "255.255.255.0"),))
DATA = NetIf("eth1", True, True, False, 9000, ((V4, "10.0.1.5", "255.255.255.0"),))
DATA_DOWN = NetIf("eth1", True, False, False, 9000, ((V4, "10.0.1.5", "255.255.255.0"),))
MULTI = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "8", "MASTER_ADDR": "10.0.1.1"}


def probe(*ifs: NetIf, routes: dict[str, str] | None = None) -> FixtureNetProbe:
    return FixtureNetProbe(make_snapshot(ifs, {V4: ("eth0",)}), routes=routes or {})


def test_single_node_passes_and_names_the_interface(make_ctx: MakeCtx) -> None:
    r = network.run(make_ctx(env={}, net=probe(LO, MGMT, DATA)))
    assert (r.status, r.reason) == (Status.PASS, "NetworkOk")
    assert "NCCL will use eth0, eth1" in r.message


def test_a_named_interface_that_does_not_exist_is_the_jobs_fault(make_ctx: MakeCtx) -> None:
    r = network.run(make_ctx(env={"NCCL_SOCKET_IFNAME": "ib0"}, net=probe(LO, MGMT, DATA)))
    assert (r.status, r.reason, r.scope) == (Status.FAIL, "NoNcclInterface", Scope.JOB)
    assert "export NCCL_SOCKET_IFNAME=eth0" in r.remedy


def test_a_named_interface_that_is_down_is_the_nodes_fault(make_ctx: MakeCtx) -> None:
    r = network.run(make_ctx(env={"NCCL_SOCKET_IFNAME": "eth1"},
                             net=probe(LO, MGMT, DATA_DOWN)))
    assert (r.status, r.reason, r.scope) == (Status.FAIL, "NoNcclInterface", Scope.NODE)
    assert "eth1 match but are not RUNNING" in r.message


def test_blanks_in_ifname_warn_once_here(make_ctx: MakeCtx) -> None:
    r = network.run(make_ctx(env={"NCCL_SOCKET_IFNAME": "eth1, eth0"},
                             net=probe(LO, MGMT, DATA)))
    assert (r.status, r.reason, r.scope) == (Status.WARN, "IfnameWhitespace", Scope.JOB)
    assert r.remedy == "export NCCL_SOCKET_IFNAME=eth1,eth0"


@pytest.mark.parametrize(("source", "status", "reason"), [
    ("10.0.1.5", Status.WARN, "BootstrapNotOnRouteNic"),  # NCCL picks eth0, the route is eth1
    (None, Status.FAIL, "NoRouteToMaster"),
])
def test_multi_node_route_to_rank_0(make_ctx: MakeCtx, source: str | None, status: Status,
                                    reason: str) -> None:
    routes = {"10.0.1.1": source} if source else {}
    r = network.run(make_ctx(env=MULTI, net=probe(LO, MGMT, DATA, routes=routes)))
    assert (r.status, r.reason, r.scope) == (status, reason, Scope.NODE)
    assert r.details["reasons"][0] == reason


def test_an_unresolvable_master_addr_is_left_to_master_port(make_ctx: MakeCtx) -> None:
    env = {**MULTI, "MASTER_ADDR": "rank0.invalid"}
    r = network.run(make_ctx(env=env, net=probe(LO, MGMT, DATA)))
    assert r.status is Status.PASS
    assert "route to MASTER_ADDR='rank0.invalid' not judged" in r.message


def test_no_active_rdma_port_is_one_fault_the_fabric_checks(make_ctx: MakeCtx,
                                                            tmp_path: Path) -> None:
    """Every RDMA port down on a multi-node job: fabric reports the ports (FAIL IbNoActivePort,
    the node fault and its alert); network only says what NCCL will select (sockets) and
    points at fabric, under its own reason, so the one cause is not reported twice."""
    for i in range(2):
        add_port(tmp_path, f"mlx5_{i}", state="DOWN", phys="Polling")
    ports = probe_ib(tmp_path / "sys" / "class" / "infiniband")
    net = FixtureNetProbe(make_snapshot((LO, MGMT, DATA), {V4: ("eth0",)}),
                          ib_ports=ports, routes={"10.0.1.1": "10.0.1.5"})
    ctx = make_ctx(env={**MULTI, "NCCL_SOCKET_IFNAME": "=eth1"}, net=net, root=tmp_path,
                   fabric_counter_interval_s=0)
    report = run_checks(ctx, select(CHECKS, only=["network", "fabric"]))
    by = {r.check: r for r in report.results}
    assert (by["fabric"].status, by["fabric"].reason, by["fabric"].scope) == (
        Status.FAIL, "IbNoActivePort", Scope.NODE)
    assert (by["network"].status, by["network"].reason) == (Status.WARN, "NcclSocketFallback")
    assert "NCCL will run between nodes over TCP sockets" in by["network"].message
    assert "fabric" in by["network"].message and "fabric" in by["network"].remedy
    reasons = [reason for r in report.results for reason in r.details.get("reasons", [r.reason])]
    assert reasons.count("IbNoActivePort") == 1, reasons
