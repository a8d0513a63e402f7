"""Issue 14 point 1: NVML's NVLink version enum read as NVML defines it, and a link efficiency
above 1 never printed (2x H200: 329 GB/s over 18 NVLink 4.0 links)."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace
from typing import Any

import pytest

from preflight.bench import method
from preflight.bench.options import BenchOptions
from preflight.bench.records import RunRecord, WorkerState
from preflight.bench.verdict import judge
from preflight.probes.nvml import (
    FI_NVLINK_GET_SPEED,
    NVLINK_VERSIONS,
    NvmlGpuProbe,
    nvlink_link_bytes_per_second,
)
from tests import topologies

GiB = 1 << 30
#: What a driver can return for nvmlDeviceGetNvLinkVersion (nvml.h nvmlNvlinkVersion_t), with the
#: per-link figure preflight must use (None: unknown, never PCIe).
ENUM_EXPECTED: dict[int, float | None] = {0: None, 1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 25e9,
                                          6: 25e9, 7: 50e9, 8: None}


def test_enum_table_is_nvmls() -> None:
    assert NVLINK_VERSIONS == {0: "invalid", 1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1",
                               6: "4.0", 7: "5.0", 8: "6.0"}


@pytest.mark.parametrize("enum", [*range(0, 9), 9, 255])
def test_every_enum_value(enum: int) -> None:
    speed, basis = nvlink_link_bytes_per_second(enum)
    assert speed == ENUM_EXPECTED.get(enum)
    assert "PCIe" not in basis
    if enum == 6:
        assert basis == "NVLink 4.0 nominal 25 GB/s"


def test_speed_field_wins_over_the_enum() -> None:
    speed, basis = nvlink_link_bytes_per_second(6, 26562)
    assert speed == 26.562e9 and basis == "NVML link speed 26.562 GB/s"
    assert nvlink_link_bytes_per_second(None, 0) == (None, "NVLink version unknown")


def _record(busbw: float, size: int = GiB) -> RunRecord:
    t = size / (busbw * 1e9)  # 2 ranks: busbw = algbw
    opts = BenchOptions(backend="nccl", nproc=2, sizes=(size,), timeout_s=60)
    ranks = []
    for r in range(2):
        st = WorkerState(rank=r, label=f"GPU {r}", reduces=True)
        st.times = {size: t}
        st.verified = {size: {"ok": True, "mismatches": 0}}
        ranks.append(st)
    return RunRecord(opts, tuple(ranks), None, None, None, 1.0)


def _h200s(version: int | None, speed_mbps: int | None = None) -> tuple[Any, ...]:
    link, _ = nvlink_link_bytes_per_second(version, speed_mbps)
    return tuple(dataclasses.replace(topologies.h100(i, f"0000:00:0{7 + i}.0", name="NVIDIA H200"),
                                     nvlink_link_bytes_per_second=link) for i in range(2))


@pytest.mark.parametrize("enum", [*range(0, 9), 42])
def test_no_efficiency_above_one_for_any_enum(enum: int) -> None:
    res = judge(_record(329.2), gpus=_h200s(enum))
    shown = [float(x) for x in re.findall(r"link efficiency (\d+\.\d+)", res.message)]
    assert all(e <= 1.0 for e in shown), res.message
    assert res.link_efficiency is None or res.link_efficiency <= 1.0
    assert "PCIe" not in res.message  # NVLinked GPUs are never measured against PCIe
    if enum == 6:
        assert res.link_efficiency == round(329.2 / 450, 4)
        assert "link efficiency 0.73 of 18 active NVLinks x 25 GB/s = 450 GB/s" in res.message
    if ENUM_EXPECTED.get(enum) is None:
        assert res.link_efficiency is None
        assert "link bandwidth unknown" in res.message


def test_measured_speed_field_gives_069_on_h200() -> None:
    res = judge(_record(329.2), gpus=_h200s(6, 26562))
    assert res.link_efficiency == round(329.2 / (18 * 26.562), 4)
    assert "18 active NVLinks x 26.562 GB/s = 478.116 GB/s" in res.message


def test_busbw_above_the_link_figure_is_not_an_efficiency() -> None:
    # One link of 25 GB/s claimed, 329 GB/s measured: the figure is wrong, not the GPU fast.
    gpus = tuple(dataclasses.replace(g, nvlinks=g.nvlinks[:1]) for g in _h200s(6))
    res = judge(_record(329.2), gpus=gpus)
    assert res.link_efficiency is None
    assert "link efficiency not shown: busbw is above the link figure" in res.message
    assert method.link_efficiency(329.2, None) is None


class _FakeNvml:
    """Just the NVML calls NvmlGpuProbe._nvlinks makes, answering as the 2x H200 driver did."""

    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def __init__(self, version: int, speed: int | None) -> None:
        self.version, self.speed = version, speed

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> Any:
        return SimpleNamespace(busId=b"00000000:00:08.0")

    def nvmlDeviceGetNvLinkVersion(self, handle: object, link: int) -> int:
        return self.version

    def nvmlDeviceGetFieldValues(self, handle: object, fields: list[tuple[int, int]]) -> Any:
        assert fields[0][0] == FI_NVLINK_GET_SPEED
        if self.speed is None:
            return [SimpleNamespace(nvmlReturn=3, value=None)]  # NVML_ERROR_NOT_SUPPORTED
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=self.speed))]


@pytest.mark.parametrize(("version", "speed", "want"),
                         [(6, 26562, 26.562e9), (6, None, 25e9), (7, None, 50e9), (8, None, None)])
def test_probe_reads_enum_and_field(version: int, speed: int | None,
                                    want: float | None) -> None:
    nv = _FakeNvml(version, speed)

    def opt(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    links, per_link = NvmlGpuProbe._nvlinks(nv, opt, object())
    assert len(links) == 18 and all(link.active for link in links)
    assert per_link == want
