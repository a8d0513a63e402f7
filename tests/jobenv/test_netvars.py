"""The pure parsers, on literal strings: NCCL's list syntax, its selection order, MASTER_*."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.jobenv.netvars import (
    ParseError,
    is_multi_node,
    nccl_flag,
    nccl_int,
    nccl_socket_selection,
    parse_comm_id,
    parse_if_list,
    parse_master_addr,
    parse_master_port,
    select_ib,
    socket_family,
)
from preflight.probes.ib import IbPort
from preflight.probes.net import IfAddr

V4, V6 = socket.AF_INET, socket.AF_INET6

# getifaddrs order: every IPv4 entry by interface index, then every IPv6 entry.
MGMT_DATA = (
    IfAddr("lo", V4, "127.0.0.1", netmask="255.0.0.0"),
    IfAddr("eth0", V4, "192.168.0.2", netmask="255.255.255.0"),
    IfAddr("eth1", V4, "10.0.1.2", netmask="255.255.255.0"),
    IfAddr("eth10", V4, "10.0.10.2", netmask="255.255.255.0"),
    IfAddr("docker0", V4, "172.17.0.1", netmask="255.255.0.0"),
    IfAddr("lo", V6, "::1", netmask="ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"),
    IfAddr("eth0", V6, "fe80::1", netmask="ffff:ffff:ffff:ffff::/64"),
)


def names(value: str | None, entries: tuple[IfAddr, ...] = MGMT_DATA, **kw: object) -> list[str]:
    return list(nccl_socket_selection(entries, value, **kw).names)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "expected"), [
    ("eth1", ["eth1", "eth10"]),          # a prefix: eth1 also takes eth10
    ("=eth1", ["eth1"]),                  # exact
    ("eth", ["eth0", "eth1", "eth10"]),
    ("^eth", ["lo", "docker0"]),          # exclude: lo comes first in the system's order
    ("^eth0", ["lo", "eth1", "eth10", "docker0"]),
    ("^=eth1,lo", ["eth0", "eth10", "docker0"]),
    ("^docker,lo", ["eth0", "eth1", "eth10"]),
    ("eth10,eth0", ["eth0", "eth10"]),    # system order, not list order
    ("eth0, eth1", ["eth0"]),             # " eth1" is kept with its blank and never matches
    ("eth0,,eth1", ["eth0", "eth1", "eth10"]),  # empty tokens are skipped
    ("=eth", []),
    ("ib", []),
    ("wlan0", []),
    ("eth1:3", ["eth1", "eth10"]),        # a port suffix is parsed and ignored for sockets
])
def test_user_value_selects_as_nccl(value: str, expected: list[str]) -> None:
    sel = nccl_socket_selection(MGMT_DATA, value)
    assert sel.mode == "user"
    assert list(sel.names) == expected
    assert sel.bootstrap == (sel.interfaces[0] if expected else None)


@pytest.mark.parametrize("value", [None, "", "e", "^"])
def test_unset_or_one_char_value_auto_selects(value: str | None) -> None:
    sel = nccl_socket_selection(MGMT_DATA, value)
    assert sel.mode == "auto"
    assert sel.rule == "^docker,lo,virbr"
    assert list(sel.names) == ["eth0", "eth1", "eth10"]
    assert sel.ignored_value == (value or None)


def test_auto_order_ib_then_other_then_docker_then_lo() -> None:
    ib = (IfAddr("eth0", V4, "192.168.0.2"), IfAddr("ib0", V4, "10.1.0.2"))
    assert names(None, ib) == ["ib0"]
    docker = (IfAddr("lo", V4, "127.0.0.1"), IfAddr("docker0", V4, "172.17.0.2"))
    assert names(None, docker) == ["docker0"]
    only_lo = (IfAddr("lo", V4, "127.0.0.1"), IfAddr("lo", V6, "::1"))
    assert names(None, only_lo) == ["lo"]
    virbr = (IfAddr("lo", V4, "127.0.0.1"), IfAddr("virbr0", V4, "192.168.122.1"))
    assert names(None, virbr) == ["lo"]  # virbr* is the very last resort


def test_not_running_and_ipv6_loopback_are_skipped() -> None:
    entries = (IfAddr("eth0", V4, "10.0.0.2", running=False), IfAddr("eth1", V4, "10.0.1.2"),
               IfAddr("lo", V6, "::1"))
    sel = nccl_socket_selection(entries, "eth0")
    assert sel.names == () and sel.not_running == ("eth0",)
    assert names("lo", entries) == []  # only ::1 on lo: NCCL skips IPv6 loopback


def test_family_filter_and_sixteen_interfaces_at_most() -> None:
    many = tuple(IfAddr(f"eth{i}", V4, f"10.0.{i}.2") for i in range(20))
    assert len(names("eth", many)) == 16
    v6 = (IfAddr("eth0", V4, "10.0.0.2"), IfAddr("eth1", V6, "fd00::2"))
    assert names(None, v6, family=V6) == ["eth1"]
    assert socket_family("AF_INET6") == (V6, True)
    assert socket_family("inet6") == (None, False)  # NCCL ignores anything else
    assert socket_family(None) == (None, True)


def test_comm_id_subnet_step() -> None:
    sel = nccl_socket_selection(MGMT_DATA, None, comm_id_host="10.0.10.7")
    assert sel.rule == "subnet" and sel.names == ("eth10",)
    assert parse_comm_id("10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert parse_comm_id("[fd00::1]:5000") == ("fd00::1", 5000)
    with pytest.raises(ParseError):
        parse_comm_id("10.0.0.1")


def test_list_syntax() -> None:
    spec = parse_if_list("^=mlx5_0:1,mlx5_1")
    assert spec.exclude and spec.exact
    assert [(t.name, t.port) for t in spec.tokens] == [("mlx5_0", 1), ("mlx5_1", -1)]
    assert parse_if_list("a, b").whitespace_tokens == (" b",)
    assert parse_if_list(",".join(f"e{i}" for i in range(20))).dropped == 4


IB_PORTS = (IbPort("mlx5_0", 1, "ACTIVE"), IbPort("mlx5_1", 1, "DOWN"),
            IbPort("mlx5_10", 1, "ACTIVE"), IbPort("mlx5_2", 1, "ACTIVE"),
            IbPort("mlx5_2", 2, "ACTIVE"))


def test_ib_hca_prefix_port_exact_exclude() -> None:
    sel = select_ib(IB_PORTS, "mlx5_1")
    assert [p.label for p in sel.active] == ["mlx5_10:1"]
    assert [p.label for p in sel.inactive] == ["mlx5_1:1"]
    assert sel.ambiguous == (("mlx5_1", ("mlx5_10",)),)
    exact = select_ib(IB_PORTS, "=mlx5_1")
    assert exact.active == () and exact.ambiguous == ()
    assert [p.label for p in select_ib(IB_PORTS, "mlx5_2:2").active] == ["mlx5_2:2"]
    assert [p.label for p in select_ib(IB_PORTS, "^mlx5_1").active] == ["mlx5_0:1", "mlx5_2:1",
                                                                        "mlx5_2:2"]
    assert select_ib(IB_PORTS, "mlx4").unmatched == ("mlx4",)
    assert len(select_ib(IB_PORTS, None).active) == 4  # unset: every ACTIVE port


@pytest.mark.parametrize(("value", "kind"), [
    ("10.0.1.1", "ipv4"), ("fd00::1", "ipv6"), ("fe80::1%eth0", "ipv6"),
    ("node-01.cluster", "hostname"), ("localhost", "hostname"),
])
def test_master_addr_valid(value: str, kind: str) -> None:
    assert parse_master_addr(value).kind == kind


@pytest.mark.parametrize(("value", "words"), [
    ("", "empty"), (" 10.0.0.1", "blanks"), ("[fd00::1]", "brackets"),
    ("10.0.0.1:29500", "MASTER_PORT=29500"), ("tcp://10.0.0.1", "no scheme"),
    ("bad_host!", "not a valid hostname"), ("1:2:3", "neither"),
])
def test_master_addr_invalid(value: str, words: str) -> None:
    with pytest.raises(ParseError, match="MASTER_ADDR") as info:
        parse_master_addr(value)
    assert words in str(info.value)


def test_master_port() -> None:
    assert parse_master_port(None) == 29500
    assert parse_master_port("29501") == 29501
    assert parse_master_port(" 29501\n") == 29501  # torch reads it with int(), which strips
    for bad in ("abc", "0", "65536", "-1", "", "29500.0"):
        with pytest.raises(ParseError, match="MASTER_PORT"):
            parse_master_port(bad)


def test_multi_node() -> None:
    assert is_multi_node(world_size=16, local_world_size=8, slurm_nodes=None, forced=False)[0]
    assert not is_multi_node(world_size=8, local_world_size=8, slurm_nodes=None,
                             forced=False)[0]
    assert is_multi_node(world_size=None, local_world_size=None, slurm_nodes=2, forced=False)[0]
    assert is_multi_node(world_size=None, local_world_size=None, slurm_nodes=None,
                         forced=True) == (True, "--multi-node")


# ---------------------------------------------------------------------------------------------
# No input gives a traceback: every parser returns or raises ParseError.

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.text(
    alphabet="^=,: eth0lo1ib[]%.", max_size=30)
entries = st.lists(st.builds(
    IfAddr, name=st.sampled_from(["lo", "eth0", "eth1", "ib0", "docker0", "virbr0", " eth1"]),
    family=st.sampled_from([V4, V6, 17]), address=st.sampled_from(
        ["10.0.0.2", "::1", "fe80::1", "garbage", "127.0.0.1"]),
    running=st.booleans(), netmask=st.sampled_from([None, "255.0.0.0", "x", "ffff::/64"])),
    max_size=8).map(tuple)


@settings(max_examples=300, deadline=None)
@given(value=st.none() | texts, ents=entries, comm=st.none() | texts)
def test_selection_never_raises(value: str | None, ents: tuple[IfAddr, ...],
                                comm: str | None) -> None:
    sel = nccl_socket_selection(ents, value, comm_id_host=comm)
    assert len(sel.interfaces) <= 16
    assert len(set(sel.names)) == len(sel.names)
    if value is not None and len(value) > 1:
        spec = parse_if_list(value)
        assert all(spec.matches(n) for n in sel.names)


@settings(max_examples=300, deadline=None)
@given(value=texts)
def test_value_parsers_raise_only_parse_error(value: str) -> None:
    for parse in (parse_master_addr, parse_master_port, parse_comm_id):
        try:
            parse(value)  # type: ignore[operator]
        except ParseError as exc:
            assert str(exc)
    select_ib(IB_PORTS, value)
    socket_family(value)


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_nccl_int_reads_decimal_hex_and_octal_as_strtoll(n: int) -> None:
    sign = "-" if n < 0 else ""
    assert nccl_int(str(n)) == n
    assert nccl_int(f"{sign}0x{abs(n):x}") == n
    assert nccl_int(f"{sign}0{abs(n):o}") == n
    assert nccl_int(f"  {n}") == n  # strtoll skips leading blanks
    assert nccl_flag(str(n)) is (n != 0)


@given(st.text(max_size=12))
def test_nccl_int_never_raises_and_rejects_what_strtoll_would_not_consume(text: str) -> None:
    value = nccl_int(text)
    if value is None:
        assert nccl_flag(text, default=True) is True  # NCCL keeps its default
    else:
        assert text.strip() != "" and not text.endswith((" ", "\t", "\n"))


@pytest.mark.parametrize("text", ["yes", "true", "on", "1 ", "1x", "08", "0x", "", "+", " "])
def test_nccl_flag_words_are_not_numbers(text: str) -> None:
    assert nccl_int(text) is None and nccl_flag(text) is False
