"""Hardware limits from NVML's facts, else the model table (pure)."""

from __future__ import annotations

import pytest

from preflight.gpuspeed import limits


def test_h200_limits_from_what_nvml_reported_there() -> None:
    got = limits.limits_for(name="NVIDIA H200", pcie_gen=5, pcie_width=16, bus_width_bits=6016,
                            max_mem_clock_mhz=3201, sm_count=132, max_sm_clock_mhz=1980,
                            capability=(9, 0))
    assert got["h2d"].value == pytest.approx(63.0, abs=0.01)
    assert got["h2d"].source == "PCIe Gen5 x16" and got["d2h"] == got["h2d"]
    assert got["d2d"].value == pytest.approx(4814.4, abs=0.1)  # HBM3e datasheet: 4.8 TB/s
    assert got["gemm"].value == pytest.approx(1070.6, abs=0.1)  # 989 at the brief's 1,830 MHz
    assert "sm_90" in got["gemm"].source


def test_a_degraded_link_lowers_the_pcie_limit_only_when_its_maximum_is_lower() -> None:
    assert limits.pcie_limit(4, 16) is not None
    assert limits.pcie_limit(4, 16).value == pytest.approx(31.5, abs=0.01)  # type: ignore[union-attr]
    assert limits.pcie_limit(5, 8).value == pytest.approx(31.5, abs=0.01)  # type: ignore[union-attr]
    assert limits.pcie_limit(None, 16) is None and limits.pcie_limit(9, 16) is None


def test_without_nvml_facts_the_model_table_answers_and_says_so() -> None:
    got = limits.limits_for(name="NVIDIA A100-SXM4-80GB", pcie_gen=None, pcie_width=None,
                            bus_width_bits=None, max_mem_clock_mhz=None, sm_count=None,
                            max_sm_clock_mhz=None, capability=None)
    assert got["d2d"].value == 2039.0 and got["gemm"].value == 312.0
    assert got["h2d"].source == "table: NVIDIA A100-SXM4-80GB"


def test_an_unknown_gpu_without_facts_has_no_limit() -> None:
    got = limits.limits_for(name="Some Future GPU", pcie_gen=None, pcie_width=None,
                            bus_width_bits=None, max_mem_clock_mhz=None, sm_count=100,
                            max_sm_clock_mhz=2000, capability=(12, 0))
    assert got == {}


def test_a100_rate_matches_its_datasheet() -> None:
    lim = limits.matmul_limit(108, 1410, (8, 0))
    assert lim is not None and lim.value == pytest.approx(311.9, abs=0.1)
