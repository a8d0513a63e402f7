"""``network`` and ``master_port`` run inside real network namespaces; verdicts asserted.

Topologies: management + data NIC; docker0 only; ib0 + eth0 (with a fake /sys/class/infiniband
under --root); a data NIC without carrier; IPv6 only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.net.conftest import Topology, needs_root

pytestmark = [needs_root, pytest.mark.root]

MULTI = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "8", "MASTER_PORT": "29500"}


def mgmt_data(netns: Any, *, default_route: bool = True) -> Topology:
    """lo; eth0 = management (default route); eth1 = data, on MASTER_ADDR 10.0.1.1's subnet."""
    t: Topology = netns()
    t.link("eth0", ["192.168.0.2/24"], ["192.168.0.1/24"])
    if default_route:
        t.route("add", "default", "via", "192.168.0.1")
    t.link("eth1", ["10.0.1.2/24"], ["10.0.1.1/24"])
    return t


# NCCL_SOCKET_IFNAME -> (status, reason, bootstrap interface, NCCL's interfaces)
MGMT_DATA_CASES: list[tuple[str | None, str, str, str | None, list[str]]] = [
    (None, "warn", "BootstrapNotOnRouteNic", "eth0", ["eth0", "eth1"]),
    ("eth1", "pass", "NetworkOk", "eth1", ["eth1"]),
    ("=eth1", "pass", "NetworkOk", "eth1", ["eth1"]),
    ("eth", "warn", "BootstrapNotOnRouteNic", "eth0", ["eth0", "eth1"]),
    ("^eth0", "fail", "LoopbackForMultiNode", "lo", ["lo", "eth1"]),  # lo is the first match
    ("^=eth0,lo", "pass", "NetworkOk", "eth1", ["eth1"]),
    ("=eth1,eth0", "warn", "BootstrapNotOnRouteNic", "eth0", ["eth0", "eth1"]),  # system order
    ("eth1, eth0", "warn", "IfnameWhitespace", "eth1", ["eth1"]),  # " eth0" never matches
    ("eth0, eth1", "warn", "IfnameWhitespace", "eth0", ["eth0"]),
    ("wlan0", "fail", "NoNcclInterface", None, []),
    ("=eth", "fail", "NoNcclInterface", None, []),
    ("e", "warn", "IfnameIgnored", "eth0", ["eth0", "eth1"]),  # length 1: auto-selection
]


def test_mgmt_and_data_nic(netns: Any) -> None:
    t = mgmt_data(netns)
    for value, status, reason, boot, ifaces in MGMT_DATA_CASES:
        env = {**MULTI, "MASTER_ADDR": "10.0.1.1"}
        if value is not None:
            env["NCCL_SOCKET_IFNAME"] = value
        rc, res = t.check(env, only="network")
        net = res["network"]
        case = f"NCCL_SOCKET_IFNAME={value!r}: {net['message']}"
        assert (net["status"], net["reason"]) == (status, reason), case
        assert net["details"]["bootstrap_interface"] == boot, case
        assert [i.split()[0] for i in net["details"]["nccl_interfaces"]] == ifaces, case
        assert rc == {"pass": 0, "warn": 0, "fail": 1}[status], case
        if reason in ("BootstrapNotOnRouteNic", "LoopbackForMultiNode"):
            assert "export NCCL_SOCKET_IFNAME=eth1" in net["remedy"], case
    # The MTU of the chosen interface is reported; the route's interface and source too.
    _, res = t.check({**MULTI, "MASTER_ADDR": "10.0.1.1", "NCCL_SOCKET_IFNAME": "eth1"},
                     only="network")
    d = res["network"]["details"]
    assert (d["route_interface"], d["route_source"], d["bootstrap_mtu"]) == ("eth1", "10.0.1.2",
                                                                             1500)
    # Single node: loopback is fine, nothing about routes.
    rc, res = t.check({"NCCL_SOCKET_IFNAME": "^eth0"}, only="network")
    assert (rc, res["network"]["status"]) == (0, "pass")
    # Rank 0's node: MASTER_ADDR is its own data address.
    _, res = t.check({**MULTI, "RANK": "0", "MASTER_ADDR": "10.0.1.2",
                      "NCCL_SOCKET_IFNAME": "eth1"})
    assert res["network"]["status"] == "pass"
    assert res["network"]["details"]["route_interface"] == "eth1"
    assert res["master_port"]["reason"] == "MasterPortFree"


def test_management_nic_without_route_to_master_fails(netns: Any) -> None:
    t = mgmt_data(netns, default_route=False)
    rc, res = t.check({**MULTI, "MASTER_ADDR": "10.0.1.1"}, only="network")
    net = res["network"]
    assert (rc, net["status"], net["reason"]) == (1, "fail", "BootstrapCannotReachMaster")
    assert "only eth1 can" in net["message"]
    assert net["remedy"] == "export NCCL_SOCKET_IFNAME=eth1"
    rc, res = t.check({**MULTI, "MASTER_ADDR": "203.0.113.9"}, only="network")
    assert (rc, res["network"]["reason"]) == (1, "NoRouteToMaster")
    assert "203.0.113.9" in res["network"]["message"]


def test_docker0_only(netns: Any) -> None:
    t: Topology = netns()
    t.link("docker0", ["172.17.0.2/16"], ["172.17.0.1/16"])
    rc, res = t.check({**MULTI, "MASTER_ADDR": "172.17.0.1"}, only="network")
    net = res["network"]
    assert (rc, net["status"], net["reason"]) == (1, "fail", "DockerForMultiNode")
    assert net["details"]["selection_rule"] == "docker"
    rc, res = t.check({}, only="network")
    assert (rc, res["network"]["details"]["bootstrap_interface"]) == (0, "docker0")


def fake_ib(root: Path, ports: dict[str, str]) -> None:
    for dev, state in ports.items():
        p = root / "sys/class/infiniband" / dev / "ports/1"
        p.mkdir(parents=True)
        (p / "state").write_text(state + "\n")
        (p / "link_layer").write_text("InfiniBand\n")


def test_ib0_eth0(netns: Any, tmp_path: Path) -> None:
    t: Topology = netns()
    t.link("eth0", ["192.168.0.2/24"], ["192.168.0.1/24"])
    t.route("add", "default", "via", "192.168.0.1")
    t.link("ib0", ["10.0.2.2/24"], ["10.0.2.1/24"])  # created after eth0: ib* still wins
    rc, res = t.check({**MULTI, "MASTER_ADDR": "10.0.2.1"}, only="network")
    assert (rc, res["network"]["status"], res["network"]["details"]["bootstrap_interface"]) == \
        (0, "pass", "ib0")
    assert res["network"]["details"]["selection_rule"] == "ib"
    rc, res = t.check({**MULTI, "MASTER_ADDR": "192.168.0.1"}, only="network")
    assert (rc, res["network"]["reason"]) == (1, "BootstrapCannotReachMaster")
    assert res["network"]["remedy"] == "export NCCL_SOCKET_IFNAME=eth0"

    fake_ib(tmp_path, {"mlx5_0": "4: ACTIVE", "mlx5_1": "1: DOWN", "mlx5_10": "4: ACTIVE"})
    env = {**MULTI, "MASTER_ADDR": "10.0.2.1"}
    root = ("--root", str(tmp_path))
    _, res = t.check({**env, "NCCL_IB_HCA": "mlx5_1"}, *root, only="network")
    net = res["network"]
    assert (net["status"], net["reason"]) == ("warn", "IbHcaAmbiguousPrefix")
    assert net["details"]["ib_selected"] == ["mlx5_10:1"]
    assert "export NCCL_IB_HCA='=mlx5_1'" in net["remedy"]
    _, res = t.check({**env, "NCCL_IB_HCA": "=mlx5_1"}, *root, only="network")
    assert res["network"]["reason"] == "IbHcaNoActivePort"
    assert "mlx5_1:1 DOWN" in res["network"]["message"]
    _, res = t.check({**env, "NCCL_IB_HCA": "=mlx5_0"}, *root, only="network")
    assert (res["network"]["status"], res["network"]["details"]["ib_selected"]) == \
        ("pass", ["mlx5_0:1"])
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, res = t.check({**env, "NCCL_IB_HCA": "mlx5_0"}, "--root", str(empty), only="network")
    assert (rc, res["network"]["reason"]) == (0, "IbMissing")
    assert "sys/class/infiniband does not exist" in res["network"]["message"]


def test_interface_without_carrier(netns: Any) -> None:
    t: Topology = netns()
    t.link("eth0", ["192.168.0.2/24"], ["192.168.0.1/24"])
    t.route("add", "default", "via", "192.168.0.1")
    t.link("eth1", ["10.0.1.2/24"], ["10.0.1.1/24"], carrier=False)  # UP, NO-CARRIER
    rc, res = t.check({**MULTI, "MASTER_ADDR": "10.0.1.1", "NCCL_SOCKET_IFNAME": "eth1"},
                      only="network")
    net = res["network"]
    assert (rc, net["reason"]) == (1, "NoNcclInterface")
    assert "eth1 match but are not RUNNING" in net["message"]
    rc, res = t.check({**MULTI, "MASTER_ADDR": "10.0.1.1"}, only="network")
    assert (rc, res["network"]["reason"]) == (1, "RouteNicDown")
    assert res["network"]["details"]["nccl_interfaces"] == ["eth0 192.168.0.2"]


def test_ipv6_only(netns: Any) -> None:
    t: Topology = netns()
    t.link("eth0", ["fd00::2/64"], ["fd00::1/64"])
    env = {**MULTI, "MASTER_ADDR": "fd00::1"}
    rc, res = t.check(env)
    net = res["network"]
    assert (rc, net["status"]) == (0, "pass"), net["message"]
    assert (net["details"]["bootstrap_address"], net["details"]["route_interface"]) == \
        ("fd00::2", "eth0")
    assert res["master_port"]["reason"] == "NotMasterNode"
    # Only lo has IPv4 here: NCCL_SOCKET_FAMILY=AF_INET leaves loopback.
    rc, res = t.check({**env, "NCCL_SOCKET_FAMILY": "AF_INET"}, only="network")
    assert (rc, res["network"]["reason"]) == (1, "LoopbackForMultiNode")
    _, res = t.check({**env, "NCCL_SOCKET_FAMILY": "inet6"}, only="network")
    assert res["network"]["reason"] == "SocketFamilyIgnored"
    # --probe-master: the peer answers with a reset (nothing listens yet): reachable.
    rc, res = t.check(env, "--probe-master", only="master_port")
    assert (rc, res["master_port"]["reason"]) == (0, "MasterReachableNotListening")
    # An address on the link that nobody holds: no answer within the short deadline.
    rc, res = t.check({**env, "MASTER_ADDR": "fd00::77"}, "--probe-master", "--timeout", "1.5",
                      only="master_port")
    assert (rc, res["master_port"]["status"]) == (1, "fail")
    assert res["master_port"]["reason"] == "MasterUnreachable"
    # Rank 0's node, IPv6: the port is listened on (dual-stack) and released.
    rc, res = t.check({**env, "RANK": "0", "MASTER_ADDR": "fd00::2"}, only="master_port")
    assert (rc, res["master_port"]["reason"]) == (0, "MasterPortFree")
