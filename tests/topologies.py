"""Fixture GPU topologies for the fake NVML probe (FixtureGpuProbe).

Built in code so each test states the one thing that differs from a healthy node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from preflight.probes.gpu import Gpu, GpuSnapshot, MigInstance, NvLink, PcieLink

H100_BUS_IDS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")


def uuid_for(i: int) -> str:
    return f"GPU-{i:x}{i:x}a0c1f2-7d3e-4b5a-9c8d-0e1f2a3b4c{i:02x}"


def h100(i: int, bus_id: str, *, links: int = 18, **changes: object) -> Gpu:
    gpu = Gpu(
        index=i, uuid=uuid_for(i), pci_bus_id=bus_id, name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=85_520_809_984, remap_pending=False, remap_failure=False,
        ecc_uncorrectable_volatile=0, throttle_reasons=(),
        pcie=PcieLink(gen=5, max_gen=5, width=16, max_width=16),
        nvlinks=tuple(NvLink(link=n, active=n < links) for n in range(18)),
        nvlink_link_bytes_per_second=25e9,
    )
    return dataclasses.replace(gpu, **changes)  # type: ignore[arg-type]


def snapshot(gpus: Sequence[Gpu], **changes: object) -> GpuSnapshot:
    snap = GpuSnapshot(available=True, driver_version="570.124.06", cuda_driver_version=12080,
                       nvml_version="12.570.124.06", gpus=tuple(gpus),
                       pci_gpu_bus_ids=tuple(g.pci_bus_id for g in gpus if g.pci_bus_id))
    return dataclasses.replace(snap, **changes)  # type: ignore[arg-type]


def healthy_8x_h100() -> GpuSnapshot:
    return snapshot([h100(i, b) for i, b in enumerate(H100_BUS_IDS)])


def lost_gpu(index: int = 3) -> GpuSnapshot:
    """NVML answers for 7 GPUs; GPU ``index`` is lost (GPU_IS_LOST) but still on the PCI bus."""
    gpus = [h100(i, b) for i, b in enumerate(H100_BUS_IDS)]
    gpus[index] = Gpu(index=index, uuid="", pci_bus_id="",
                      error="NVML: GPU is lost (NVML_ERROR_GPU_IS_LOST)")
    return snapshot(gpus, pci_gpu_bus_ids=H100_BUS_IDS)


def fallen_off_bus() -> GpuSnapshot:
    """PCI shows 8 NVIDIA GPUs, NVML enumerates only 7 (one not bound / fell off the bus)."""
    gpus = [h100(i, b) for i, b in enumerate(H100_BUS_IDS[:5] + H100_BUS_IDS[6:])]
    return snapshot(gpus, pci_gpu_bus_ids=H100_BUS_IDS)


def row_remap_pending(index: int = 2) -> GpuSnapshot:
    gpus = [h100(i, b, remap_pending=(i == index)) for i, b in enumerate(H100_BUS_IDS)]
    return snapshot(gpus)


def pcie_degraded(index: int = 5) -> GpuSnapshot:
    gpus = [h100(i, b) for i, b in enumerate(H100_BUS_IDS)]
    gpus[index] = dataclasses.replace(gpus[index],
                                      pcie=PcieLink(gen=5, max_gen=5, width=8, max_width=16))
    return snapshot(gpus)


def nvlink_down(index: int = 4, links: int = 16) -> GpuSnapshot:
    gpus = [h100(i, b, links=links if i == index else 18) for i, b in enumerate(H100_BUS_IDS)]
    return snapshot(gpus)


def mig(instances: int = 2) -> GpuSnapshot:
    """GPU 0 in MIG mode with ``instances`` MIG devices, GPU 1 plain."""
    g0 = h100(0, H100_BUS_IDS[0], mig_enabled=True, mig_instances=tuple(
        MigInstance(uuid=f"MIG-4f1c2b3a-9d8e-5f6a-b7c8-d9e0f1a2b3{n:02x}", gpu_instance=n + 1,
                    compute_instance=0) for n in range(instances)))
    return snapshot([g0, h100(1, H100_BUS_IDS[1])])


def cuda_order_differs() -> GpuSnapshot:
    """A mixed node: an H100 at the higher bus id and a slower card at the lower one, so CUDA's
    default FASTEST_FIRST order differs from NVML's PCI order."""
    slow = dataclasses.replace(
        h100(0, "0000:18:00.0"), name="NVIDIA RTX A2000", memory_total_bytes=6_000_000_000,
        nvlinks=(), nvlink_link_bytes_per_second=None,
        pcie=PcieLink(gen=4, max_gen=4, width=16, max_width=16))
    return snapshot([slow, h100(1, "0000:3a:00.0", links=0)])


def single_h200_vm() -> GpuSnapshot:
    """One H200 in a VM: its NVLinks exist but have no peer, so none is active."""
    g = h100(0, "0000:00:07.0", links=0, name="NVIDIA H200", memory_total_bytes=150_754_820_096)
    return snapshot([g])


def no_driver() -> GpuSnapshot:
    return GpuSnapshot(available=False, error="NVML not available: libnvidia-ml.so.1 not found, "
                       "no NVIDIA driver on this node")


def shared_uuid_prefix() -> GpuSnapshot:
    """Two H100 whose UUIDs share the prefix GPU-8932f9 (unique only from GPU-8932f93 on), for
    CUDA_VISIBLE_DEVICES prefix ambiguity."""
    return snapshot([h100(0, H100_BUS_IDS[0], uuid="GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"),
                     h100(1, H100_BUS_IDS[1], uuid="GPU-8932f9ab-0c1d-4e2f-a3b4-c5d6e7f8a9b0")])
