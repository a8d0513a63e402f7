"""The pure parts of ``preflight cluster``: launcher variables, parity, localisation, merging."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.cluster import localise, parity
from preflight.cluster.agent import Verdict, merge_group
from preflight.cluster.options import ClusterUsageError, first_host, resolve


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
    # Options win over the environment.
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
    assert diffs["mtu"]["values"] == {"0": "9000", "1": "9000", "2": "1500", "3": "9000"}
    assert (diffs["mtu"]["majority"], diffs["mtu"]["odd_nodes"]) == ("9000", [2])
    assert parity.describe(diffs["env:NCCL_IB_HCA"]) == (
        "env:NCCL_IB_HCA differs: mlx5 on nodes 0, 1, 2 (majority); unset on node 3")


def test_parity_tie_has_no_majority() -> None:
    diffs = parity.compare({0: {"torch": "a"}, 1: {"torch": "b"}})
    assert diffs[0]["majority"] is None and diffs[0]["odd_nodes"] == [0, 1]


@given(st.lists(st.integers(0, 2000), unique=True, max_size=60))
def test_pairs_are_disjoint_and_cover_every_node(nodes: list[int]) -> None:
    pairs, odd = localise.pairs(nodes)
    flat = [n for p in pairs for n in p] + odd
    assert sorted(flat) == sorted(nodes) and len(odd) <= 1


def test_floor_and_bad_groups() -> None:
    figures = {(0, 1): 10.0, (2, 3): 1.0, (4, 5): 9.0, (6, 7): None}
    assert localise.floor_of(figures, None) == 4.5  # half the median of 10, 1, 9
    assert localise.bad_groups(figures, 4.5) == [(2, 3), (6, 7)]
    assert localise.floor_of(figures, 20.0) == 20.0
    assert localise.match([2, 3, 6], [0, 1]) == ([(2, 0), (3, 1)], [6])


def test_merge_group_names_the_node_that_stalled_not_the_ones_that_waited() -> None:
    got = {0: {"status": "fail", "message": "all 1 ranks are alive but ...", "busbw_gbps": None,
               "failure_kind": "hung"},
           1: {"status": "fail", "message": "rank 0 (node 1 CPU 0) stopped in measure",
               "busbw_gbps": None, "failure_kind": "stalled"}}
    m = merge_group([0, 1, 2], got)
    assert m["status"] == "fail" and not m["ok"]
    assert m["message"] == ("node 1: rank 0 (node 1 CPU 0) stopped in measure; node(s) 2 did "
                            "not report (agent stopped)")


def test_verdict_json_fields() -> None:
    v = Verdict(3, {0: {"host": "a", "addr": "10.0.0.1"}, 1: {"host": "b", "addr": "10.0.0.2"}},
                [2])
    out = v.to_json()
    assert (out["schema_version"], out["mode"], out["status"], out["exit_code"]) == (
        1, "cluster", "fail", 1)
    assert out["missing_nodes"] == [2] and out["slow_nodes"] == []
    for key in ("nnodes", "nodes", "parity", "allreduce", "localisation"):
        assert key in out
    v.usage = "the nodes disagree"
    assert v.to_json()["exit_code"] == 2


@given(st.dictionaries(st.integers(0, 50),
                       st.dictionaries(st.sampled_from(["torch", "nccl", "mtu"]),
                                       st.sampled_from(["a", "b", "c"]), max_size=3),
                       min_size=1, max_size=12))
def test_parity_differences_are_exactly_the_keys_that_differ(nodes: dict[int, dict[str, str]]
                                                             ) -> None:
    diffs = {d["key"]: d for d in parity.compare(nodes)}
    for key in {k for flat in nodes.values() for k in flat}:
        values = {r: flat.get(key) for r, flat in nodes.items()}
        assert (key in diffs) == (len(set(values.values())) > 1)
        if key in diffs:
            d = diffs[key]
            assert d["values"] == {str(r): v for r, v in sorted(values.items())}
            if d["majority"] is not None:
                assert all(values[r] != d["majority"] for r in d["odd_nodes"])
                assert all(v == d["majority"] for r, v in values.items()
                           if r not in d["odd_nodes"])
