"""The arithmetic against nccl-tests' definitions and nccl.md's figures."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.bench import method
from preflight.probes.gpu import PcieLink
from tests import topologies


def test_busbw_is_algbw_times_2_n_minus_1_over_n() -> None:
    # 1 GiB in 3.254 ms on 2 ranks: algbw = busbw = 330 GB/s (nccl.md section 2, 2x H200).
    assert method.algbw_gbps(1 << 30, 3.254e-3) == pytest.approx(330.0, rel=1e-3)
    assert method.busbw_gbps(1 << 30, 3.254e-3, 2) == pytest.approx(330.0, rel=1e-3)
    assert method.busbw_gbps(1 << 30, 1.0, 8) == pytest.approx((1 << 30) / 1e9 * 1.75)
    assert method.bus_factor(1) == 0.0
    with pytest.raises(ValueError, match="time must be > 0"):
        method.algbw_gbps(1, 0.0)


def test_sweep_doubles_and_keeps_both_ends() -> None:
    assert method.sweep(1 << 20, 1 << 30)[:3] == [1 << 20, 2 << 20, 4 << 20]
    assert len(method.sweep(1 << 20, 1 << 30)) == 11
    assert method.sweep(1 << 20, 3 << 20) == [1 << 20, 2 << 20, 3 << 20]
    assert method.sweep(6, 6) == [4]  # whole float32 elements
    with pytest.raises(ValueError, match="larger than --max-bytes"):
        method.sweep(8 << 20, 1 << 20)


@given(st.integers(4, 1 << 34), st.integers(4, 1 << 34))
def test_sweep_properties(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    sizes = method.sweep(lo, hi)
    assert sizes == sorted(set(sizes))
    assert all(s % 4 == 0 for s in sizes)
    assert sizes[-1] == hi - hi % 4


@pytest.mark.parametrize("text, value", [("1024", 1024), ("64M", 64 << 20), ("1G", 1 << 30),
                                         ("1GiB", 1 << 30), ("4k", 4096), (" 2 MB ", 2 << 20)])
def test_parse_size(text: str, value: int) -> None:
    assert method.parse_size(text) == value


@given(st.text(max_size=12))
def test_parse_size_never_raises_anything_but_value_error(text: str) -> None:
    try:
        assert method.parse_size(text) >= 0
    except ValueError as exc:
        assert "not a size" in str(exc)


def test_memory_cap_is_a_power_of_two_within_a_quarter_of_memory() -> None:
    snap = topologies.healthy_8x_h100()  # 80 GiB: a quarter is 19.9 GiB -> 16 GiB
    assert method.memory_cap_bytes(snap.gpus) == 16 << 30
    small = dataclasses.replace(snap.gpus[0], memory_total_bytes=6_000_000_000)
    assert method.memory_cap_bytes([small, snap.gpus[1]]) == 1 << 30
    assert method.memory_cap_bytes([dataclasses.replace(small, memory_total_bytes=None)]) is None


def test_reference_table() -> None:
    gpus = topologies.healthy_8x_h100().gpus
    ref = method.reference_for(gpus)
    assert ref is not None and ref.busbw_gbps == 365.0
    two = method.reference_for(gpus[:2])
    assert two is not None and two.busbw_gbps == 330.0
    assert method.reference_for(gpus[:6]) is None  # no source for 6 GPUs: WARN, not a guess
    pcie = [dataclasses.replace(g, nvlinks=()) for g in gpus[:2]]
    assert method.reference_for(pcie) is None  # an H100 PCIe card is not an SXM one
    assert method.reference_for(topologies.cuda_order_differs().gpus) is None  # mixed models


def test_link_bandwidth_from_nvml() -> None:
    link = method.link_bandwidth(topologies.healthy_8x_h100().gpus)
    assert link is not None
    assert link.bytes_per_second == 450e9
    assert link.basis.startswith("18 active NVLinks x 25 GB/s = 450 GB/s")
    assert link.degraded == ()


def test_one_nvlink_down_stands_out() -> None:
    link = method.link_bandwidth(topologies.nvlink_down(index=4, links=16).gpus)
    assert link is not None and link.bytes_per_second == 450e9  # yardstick: the healthy GPUs
    assert link.degraded == ("GPU 4 (0000:9a:00.0): 16 active NVLinks x 25 GB/s = 400 GB/s",)


def test_pcie_link_bandwidth() -> None:
    gpu = dataclasses.replace(topologies.h100(0, "0000:18:00.0", links=0),
                              pcie=PcieLink(gen=4, max_gen=5, width=16, max_width=16))
    link = method.link_bandwidth([gpu])
    assert link is not None
    assert link.bytes_per_second == pytest.approx(31.5e9, rel=1e-3)
    assert link.basis.startswith("PCIe gen4 x16 = 31.5 GB/s")
