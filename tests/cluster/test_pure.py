"""The pure parts of ``preflight cluster``: launcher variables, parity, localisation, the wire
format, the link expectation, merging and judging a group, the verdict's text."""

from __future__ import annotations

import contextlib
import json
import random
import socket
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.bench.options import BenchOptions
from preflight.bench.records import RunRecord, WorkerState
from preflight.cluster import localise, parity, wire
from preflight.cluster.facts import link_of
from preflight.cluster.groups import judge_across, merge, record_warnings
from preflight.cluster.localise import Localiser, Outcome
from preflight.cluster.options import ClusterUsageError, first_host, resolve
from preflight.cluster.roll import Entry, Roll, first_present
from preflight.cluster.verdict import Verdict, render
from preflight.probes.ib import IbPort, IbSnapshot
from preflight.probes.net import NetIf, make_snapshot, parse_speed
from tests.cluster.sim import arrival


@pytest.mark.parametrize(("text", "host"), [
    ("gpu[003-007,012],login1", "gpu003"),
    ("node7", "node7"),
    ("a[1-2]b,c", "a1b"),
    ("rack1-node[09-12]", "rack1-node09"),
    ("h1,h2", "h1"),
])
def test_first_host(text: str, host: str) -> None:
    assert first_host(text) == host


@given(prefix=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
       lo=st.integers(0, 999), width=st.integers(1, 4), more=st.integers(0, 5))
def test_first_host_of_a_range_is_its_low_end(prefix: str, lo: int, width: int, more: int) -> None:
    low = str(lo).zfill(width)
    assert first_host(f"{prefix}[{low}-{lo + more},{lo + more + 2}]") == prefix + low


@given(st.text(max_size=40))
def test_first_host_never_raises_anything_but_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        first_host(text)


def test_resolve_from_torchrun_and_slurm() -> None:
    o = resolve(nnodes=None, node_rank=None, master_addr=None, master_port=None, timeout_s=None,
                env={"GROUP_WORLD_SIZE": "4", "GROUP_RANK": "3", "MASTER_ADDR": "n0",
                     "MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert (o.nnodes, o.node_rank, o.master_addr, o.master_port, o.use_agent_store) == (
        4, 3, "n0", 29400, True)
    o = resolve(nnodes=None, node_rank=None, master_addr=None, master_port=None, timeout_s=5,
                env={"SLURM_NNODES": "16", "SLURM_NODEID": "2",
                     "SLURM_JOB_NODELIST": "gpu[010-025]"})
    assert (o.nnodes, o.node_rank, o.master_addr, o.master_port, o.use_agent_store) == (
        16, 2, "gpu010", 29500, False)
    o = resolve(nnodes=2, node_rank=1, master_addr="m", master_port=1234, timeout_s=None,
                env={"SLURM_NNODES": "16", "SLURM_NODEID": "9", "MASTER_ADDR": "x"})
    assert (o.nnodes, o.node_rank, o.master_addr, o.master_port) == (2, 1, "m", 1234)
    with pytest.raises(ClusterUsageError, match="master port 70000"):
        resolve(nnodes=1, node_rank=0, master_addr="m", master_port=70000, timeout_s=None, env={})


def test_parity_names_the_key_the_values_and_the_odd_node() -> None:
    fp = {"torch": "2.13.0", "nccl": "2.28.3", "packages": {"numpy": "2.1"}, "hashes": {}}
    facts = {"gpu_count": 8, "gpu_model": "H200", "mtu": 9000, "env": {"NCCL_IB_HCA": "mlx5"}}
    nodes = {r: parity.flatten(fp, facts) for r in range(4)}
    assert parity.compare(nodes) == []
    nodes[2] = parity.flatten({**fp, "packages": {"numpy": "1.26"}}, {**facts, "mtu": 1500})
    nodes[3] = parity.flatten(fp, {**facts, "env": {}})
    diffs = {d["key"]: d for d in parity.compare(nodes)}
    assert set(diffs) == {"package:numpy", "mtu", "env:NCCL_IB_HCA"}
    assert (diffs["mtu"]["majority"], diffs["mtu"]["odd_nodes"]) == ("9000", [2])
    assert parity.describe(diffs["env:NCCL_IB_HCA"]) == (
        "env:NCCL_IB_HCA differs: mlx5 on nodes 0, 1, 2 (majority); unset on node 3")


# ----------------------------------------------------------------------------- localisation


def localise_all(speed: dict[int, float], n: int, *, failing: set[int] = frozenset(),
                 noise: float = 0.03, seed: int = 0, floor: float | None = None
                 ) -> localise.Conclusion:
    """The rounds as the agent drives them, with figures = slowest node x (1 +- noise)."""
    rng = random.Random(seed)
    loc = Localiser(list(range(n)))
    groups, tag = loc.first_groups(), "pairs"
    while groups:
        out = {}
        for g in groups:
            fig = (None if set(g) & failing else
                   10 * min(speed.get(x, 1.0) for x in g) * (1 + rng.uniform(-noise, noise)))
            out[g] = Outcome(fig, why="boom" if fig is None else "", floor_gbps=floor)
        loc.observe(tag, out)
        groups, tag = loc.next_groups(), "confirm"
    assert loc.rounds <= localise.MAX_ROUNDS
    return loc.judge()


def test_a_pair_below_the_relative_floor_is_found_and_confirmed_against_a_good_node() -> None:
    c = localise_all({5: 0.6}, 8)
    assert c.slow.keys() == {5} and not c.failed and not c.suspects
    assert "with node" in c.slow[5] and "which passed" in c.slow[5]


def test_a_node_at_0_85_is_found_once_the_pairs_show_the_fabric_is_quiet() -> None:
    # 8 pairs and more: the bar rises from relative_floor (0.8) towards 0.9.
    assert localise_all({7: 0.85}, 16).slow.keys() == {7}
    assert localise_all({7: 0.85}, 8).slow == {}  # 4 pairs: only relative_floor judges


def test_a_failed_pair_names_the_node_that_fails_with_a_good_partner_as_failed() -> None:
    c = localise_all({}, 8, failing={3})
    assert c.failed.keys() == {3} and not c.slow
    assert "boom" in c.failed[3]


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_three_nodes_measure_all_three_pairs(bad: int) -> None:
    assert localise_all({bad: 0.5}, 3).slow.keys() == {bad}
    assert localise_all({}, 3, failing={bad}).failed.keys() == {bad}
    assert localise_all({}, 3).slow == {}


def test_a_whole_slow_network_convicts_nobody_and_is_seen_by_the_floor() -> None:
    c = localise_all({n: 0.3 for n in range(8)}, 8, floor=5.0)
    assert not c.slow and c.slow_by_floor_only()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(4, 40), seed=st.integers(0, 10_000), data=st.data())
def test_no_healthy_node_is_ever_named(n: int, seed: int, data: st.DataObject) -> None:
    bad = data.draw(st.sets(st.integers(0, n - 1), max_size=max(1, n // 10)))
    speed = {b: data.draw(st.floats(0.3, 0.75)) for b in bad}
    c = localise_all(speed, n, seed=seed)
    named = set(c.slow) | set(c.failed)
    assert named <= bad
    # Each bad node is in a pair with a healthy node at the latest in the confirm round.
    assert named == bad or c.suspects


# ----------------------------------------------------------------------------- wire format


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=20))
def test_every_validator_takes_any_json_and_raises_only_garbage(value: Any) -> None:
    for check in (wire.arrival, wire.checks_answer, wire.allreduce_answer, wire.ack, wire.lead,
                  wire.step):
        with contextlib.suppress(wire.Garbage):
            check(value)


@given(st.sets(st.integers(0, 5000), max_size=80))
def test_runs_round_trip(ranks: set[int]) -> None:
    assert wire.expand(wire.runs(ranks)) == sorted(ranks)
    assert len(wire.runs(range(1024))) == 1


@pytest.mark.parametrize(("change", "why"), [
    ({"nproc": [8]}, "nproc is a list, expected a whole number in 1..64"),
    ({"nproc": 100000}, "nproc is 100000"),
    ({"host": "h" * 7_000_000}, "bytes, more than"),
    ({"addr": "not-an-ip"}, "not an IP address"),
    ({"facts": "x"}, "facts is text, expected an object"),
])
def test_a_bad_arrival_says_what_is_wrong(change: dict[str, Any], why: str) -> None:
    value = {**arrival(1, "ab" * 8, nnodes=2, timeout_s=5.0), **change}
    with pytest.raises(wire.Garbage, match=why.replace("(", r"\(")):
        wire.arrival(wire.decode(wire.encode(value), "arrival"))


def test_decode_refuses_big_and_non_json_values() -> None:
    with pytest.raises(wire.Garbage, match="is not JSON"):
        wire.decode(b"{not json", "arrival")
    with pytest.raises(wire.Garbage, match="more than 65,536"):
        wire.decode(b"x" * 70_000, "arrival")


def test_roll_names_the_node_of_each_bad_value_and_refuses_strays() -> None:
    roll = Roll(4, 5.0, backend="gloo")
    roll.take(Entry(1, 1, "01" * 8, {"x": 1}), step=0, closed=False)
    roll.take(Entry(2, 2, "02" * 8, arrival(2, "02" * 8, nnodes=8, timeout_s=5.0)), step=0,
              closed=False)
    roll.take(Entry(3, 3, "03" * 8, arrival(3, "03" * 8, nnodes=4, timeout_s=9.0)), step=0,
              closed=False)
    roll.take(Entry(4, None, None, garbage="log entry 4 is not <rank>:<nonce>"), step=0,
              closed=False)
    assert [g["node_rank"] for g in roll.garbage] == [1, None]
    assert roll.usage == ["node 2 (node2, pid 1002) has --nnodes 8",
                          "node 3 (node3, pid 1003) has --timeout 9"]
    assert roll.acks["02" * 8]["refused"].startswith("node 2 (node2, pid 1002) has --nnodes 8")
    assert not roll.accepted


class _Keys:
    """The one store call first_present makes: whether every key named is set."""

    def __init__(self, present: set[str]) -> None:
        self.present, self.requests = present, 0

    def has(self, *keys: str) -> bool:
        self.requests += 1
        return set(keys) <= self.present


@given(st.integers(1, 1024), st.sets(st.integers(0, 1023), max_size=8))
def test_the_keys_set_are_found_in_few_requests_when_a_few_are_missing(
        n: int, missing: set[int]) -> None:
    keys = [f"log/{i}" for i in range(n)]
    store = _Keys({k for i, k in enumerate(keys) if i not in missing})
    got = first_present(store, keys)  # type: ignore[arg-type]
    assert got == [k for i, k in enumerate(keys) if i not in missing]
    gone = len(missing & set(range(n)))
    # One request when none is missing; else about 2 per missing key per halving, never ~n.
    assert store.requests <= 1 + 2 * gone * max(1, n.bit_length())


def test_a_restart_on_the_same_host_replaces_its_earlier_self() -> None:
    roll = Roll(2, 5.0)
    roll.take(Entry(1, 1, "aa" * 8, arrival(1, "aa" * 8, nnodes=2, timeout_s=5.0)), step=0,
              closed=False)
    roll.take(Entry(2, 1, "bb" * 8, arrival(1, "bb" * 8, nnodes=2, timeout_s=5.0, pid=7)), step=3,
              closed=True)
    assert roll.nonce_of(1) == "bb" * 8 and roll.restarts == {1: 1} and not roll.usage
    assert roll.acks["aa" * 8]["refused"].startswith("node rank 1 was taken over")
    assert roll.acks["bb" * 8] == {"nonce": "bb" * 8, "from_step": 3, "refused": None}
    roll.take(Entry(3, 1, "cc" * 8, arrival(1, "cc" * 8, nnodes=2, timeout_s=5.0, host="other")),
              step=3, closed=True)
    assert "claimed by two hosts: node1 (pid 7) and other (pid 1001)" in roll.usage[0]


# ----------------------------------------------------------------------------- the link


def eth(name: str, speed: int | None, *, physical: bool = True) -> NetIf:
    return NetIf(name, True, True, False, 1500, ((socket.AF_INET, "10.0.0.1", "255.255.255.0"),),
                 speed, physical)


NO_IB = IbSnapshot("/sys/class/infiniband", False, ())


def test_the_link_is_the_ports_nccl_selects_or_its_socket_interfaces() -> None:
    snap = make_snapshot([eth("eth0", 25000), eth("eth1", 100000)])
    ib = IbSnapshot("/x", True, (IbPort("mlx5_0", 1, "ACTIVE", "InfiniBand", "400 Gb/sec (4X NDR)"),
                                 IbPort("mlx5_1", 1, "ACTIVE", "InfiniBand", "400 Gb/sec (4X NDR)"),
                                 IbPort("mlx5_2", 1, "DOWN", "InfiniBand", "400 Gb/sec (4X NDR)")))
    rdma = link_of(snap, ib, {}, backend="nccl", route_iface="eth0")
    assert (rdma.transport, rdma.gbps) == ("rdma", 800.0)
    one = link_of(snap, ib, {"NCCL_IB_HCA": "=mlx5_1"}, backend="nccl", route_iface="eth0")
    assert one.gbps == 400.0 and "NCCL_IB_HCA==mlx5_1" in one.basis
    sock = link_of(snap, ib, {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1"},
                   backend="nccl", route_iface="eth0")
    assert (sock.transport, sock.gbps) == ("socket", 100.0)
    # NCCL splits the data equally over its sockets: the slowest sets the pace.
    both = link_of(snap, NO_IB, {}, backend="nccl", route_iface="eth0")
    assert both.gbps == 50.0 and "eth0 25000 Mb/s, eth1 100000 Mb/s" in both.basis
    gloo = link_of(snap, ib, {}, backend="gloo", route_iface="eth1")
    assert (gloo.transport, gloo.gbps) == ("socket", 100.0)


def test_an_unknown_or_virtual_speed_is_said_so() -> None:
    assert link_of(make_snapshot([eth("eth0", None)]), NO_IB, {}, backend="nccl",
                   route_iface=None).gbps is None
    veth = link_of(make_snapshot([eth("eth0", 10000, physical=False)]), NO_IB, {},
                   backend="nccl", route_iface=None)
    assert veth.virtual and veth.gbps == 10.0
    assert [parse_speed(t) for t in ("25000\n", "-1", "", "x", "0")] == [25000, None, None, None,
                                                                         None]


def test_across_nodes_a_run_is_judged_as_a_fraction_of_the_slowest_link() -> None:
    ok = {"status": "pass", "ok": True, "busbw_gbps": 40.0, "nodes": [0, 1], "message": ""}
    ib = wire.Link("rdma", 400.0, "RDMA mlx5_0:1 400 Gb/s")
    good = judge_across(ok, backend="nccl", link=ib, min_busbw_gbps=None, link_floor=0.5)
    assert (good["status"], good["link_efficiency"]) == ("pass", 0.8)
    low = judge_across({**ok, "busbw_gbps": 20.0}, backend="nccl", link=ib, min_busbw_gbps=None,
                       link_floor=0.5)
    assert (low["status"], low["reason"]) == ("fail", "BelowLink")
    sock = judge_across({**ok, "busbw_gbps": 2.0}, backend="nccl",
                        link=wire.Link("socket", 100.0, "eth0"), min_busbw_gbps=None,
                        link_floor=0.5)
    assert (sock["status"], sock["reason"]) == ("warn", "SocketLinkUnderused")
    gloo = judge_across({**ok, "busbw_gbps": 0.01}, backend="gloo", link=ib, min_busbw_gbps=None,
                        link_floor=0.5)
    assert gloo["status"] == "pass" and gloo["link_efficiency"] == 0.0002
    floor = judge_across(ok, backend="gloo", link=None, min_busbw_gbps=50.0, link_floor=0.5)
    assert (floor["status"], floor["reason"]) == ("fail", "BusbwLow")


# ----------------------------------------------------------------------------- failures


def test_nccls_warn_lines_are_kept_from_the_failed_ranks_logs() -> None:
    opts = BenchOptions(backend="nccl", nproc=2, sizes=(4,), timeout_s=1.0)
    dup = "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"
    ranks = (WorkerState(rank=0, label="cuda:0", error="ncclInvalidUsage", nccl_warnings=(dup,)),
             WorkerState(rank=1, label="cuda:1", nccl_warnings=(dup, "Bootstrap :  no socket "
                                                                     "interface found")))
    record = RunRecord(options=opts, ranks=ranks, failure=None, store_port=None, log_dir=None,
                       elapsed_s=0.1)
    assert record_warnings(record) == [dup, "Bootstrap : no socket interface found"]


def test_merge_names_the_node_whose_own_workers_failed_not_the_ones_that_waited() -> None:
    got = {0: {"status": "fail", "message": "all ranks alive but ...", "busbw_gbps": None,
               "failure_kind": "hung", "nccl_warnings": []},
           1: {"status": "error", "message": "rank 0 (node 1 cuda:0) failed in init",
               "busbw_gbps": None, "failure_kind": "error",
               "nccl_warnings": ["Duplicate GPU detected"]}}
    m = merge([0, 1, 2], got)
    assert m["status"] == "fail" and not m["ok"] and m["failed_nodes"] == [1]
    assert m["message"] == ("node 1: rank 0 (node 1 cuda:0) failed in init; node(s) 2 did not "
                            "report (agent stopped); NCCL said: Duplicate GPU detected")


# ----------------------------------------------------------------------------- the verdict


HOSTILE = "ev\x1b[2Jil;$(touch /tmp/pwned)\r\nFAKE: PASS"


def test_a_hostile_hostname_is_printable_in_the_table_and_quoted_in_the_remedy() -> None:
    roll = Roll(2, 5.0)
    for r, host in ((0, "node0"), (1, HOSTILE)):
        roll.take(Entry(r, r, f"{r:02x}" * 8, arrival(r, f"{r:02x}" * 8, nnodes=2, timeout_s=5.0,
                                                      host=host)), step=0, closed=False)
    v = Verdict(2, roll, missing=[])
    v.unresponsive[1] = "node checks"
    out = v.to_json()
    text = render(out, full=True, node_rank=0)
    assert "\x1b" not in text and "\r" not in text
    assert "ev\\e[2Jil;$(touch /tmp/pwned)\\r\\nFAKE: PASS" in text
    remedy = out["findings"][0]["remedy"]
    # Not a plain hostname: the remedy uses the address, never the name.
    assert "ssh 10.0.0.2 'ps -eo pid,stat,cmd | grep preflight'" in remedy
    assert "touch" not in remedy
    assert json.loads(json.dumps(out))["nodes"][1]["why"] == ["did not answer (node checks)"]


def test_verdict_json_fields_and_usage() -> None:
    roll = Roll(3, 5.0)
    roll.take(Entry(0, 0, "00" * 8, arrival(0, "00" * 8, nnodes=3, timeout_s=5.0)), step=0,
              closed=False)
    out = Verdict(3, roll, missing=[1, 2]).to_json()
    assert (out["schema_version"], out["mode"], out["status"], out["exit_code"]) == (
        1, "cluster", "fail", 1)
    assert out["missing_nodes"] == [1, 2] and out["slow_nodes"] == [] == out["failed_nodes"]
    roll.usage.append("node 1 (h, pid 1) has --nnodes 4")
    out = Verdict(3, roll, missing=[]).to_json(full=False)
    assert (out["exit_code"], out["findings"][0]["reason"], out["nodes"]) == (2, "ClusterUsage",
                                                                            [])
