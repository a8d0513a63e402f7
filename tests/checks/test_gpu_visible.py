from __future__ import annotations

import dataclasses

from preflight.checks import gpu_visible
from preflight.core.result import Status
from tests import topologies
from tests.conftest import MakeCtx


def test_healthy_8x_h100_passes_with_real_figures(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(expect_gpus=8))
    assert r.status is Status.PASS
    assert "8 GPUs (8 expected)" in r.message
    assert "NVLink 18/18 active" in r.message and "PCIe Gen5 x16" in r.message
    assert r.details["count"] == 8


def test_count_mismatch_against_expect_gpus(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(expect_gpus=4))
    assert (r.status, r.reason) == (Status.FAIL, "GpuCountMismatch")
    assert "sees 8 GPU(s), expected 4" in r.message


def test_lost_gpu_is_named_by_index(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.lost_gpu(3)))
    assert (r.status, r.reason) == (Status.FAIL, "GpuLost")
    assert "GPU 3 does not answer" in r.message and "GPU_IS_LOST" in r.message
    assert "nvidia-smi -r -i 3" in r.remedy


def test_gpu_missing_from_nvml_names_its_bus_id(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.fallen_off_bus(), expect_gpus=8))
    assert r.status is Status.FAIL
    assert "0000:ab:00.0" in r.message
    assert "8 NVIDIA GPUs on the PCI bus but NVML enumerates 7" in r.message


def test_row_remap_pending(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.row_remap_pending(2)))
    assert (r.status, r.reason) == (Status.FAIL, "RowRemapPending")
    assert "GPU 2" in r.message and topologies.uuid_for(2) in r.message


def test_pcie_width_degraded(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.pcie_degraded(5)))
    assert (r.status, r.reason) == (Status.FAIL, "PcieLinkDegraded")
    assert "GPU 5" in r.message and "x8, expected x16" in r.message


def test_pcie_generation_lowered_at_idle_is_only_a_warning(make_ctx: MakeCtx) -> None:
    snap = topologies.healthy_8x_h100()
    gpus = list(snap.gpus)
    gpus[1] = dataclasses.replace(gpus[1], pcie=dataclasses.replace(gpus[1].pcie, gen=1))
    r = gpu_visible.run(make_ctx(snapshot=dataclasses.replace(snap, gpus=tuple(gpus))))
    assert (r.status, r.reason) == (Status.WARN, "PcieGenDowngraded")


def test_one_gpu_with_nvlinks_down(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.nvlink_down(4, links=16)))
    assert (r.status, r.reason) == (Status.FAIL, "NvlinkDown")
    assert "GPU 4" in r.message and "16/18 NVLinks active" in r.message
    assert "down: 16, 17" in r.message


def test_lone_gpu_in_a_vm_without_peers_is_healthy(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.single_h200_vm()))
    assert r.status is Status.PASS
    assert "NVLink 0/18 active (no peer GPU)" in r.message


def test_lone_gpu_fails_when_config_expects_links(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.single_h200_vm(), expect_nvlinks=18))
    assert (r.status, r.reason) == (Status.FAIL, "NvlinkDown")


def test_all_links_inactive_on_a_multi_gpu_node_warns(make_ctx: MakeCtx) -> None:
    snap = topologies.snapshot([topologies.h100(i, b, links=0)
                                for i, b in enumerate(topologies.H100_BUS_IDS)])
    r = gpu_visible.run(make_ctx(snapshot=snap))
    assert (r.status, r.reason) == (Status.WARN, "NvlinkInactive")
    assert "nvidia-fabricmanager" in r.remedy


def test_no_driver_fails_unless_no_gpu_expected(make_ctx: MakeCtx) -> None:
    r = gpu_visible.run(make_ctx(snapshot=topologies.no_driver()))
    assert (r.status, r.reason) == (Status.FAIL, "NvmlUnavailable")
    assert "libnvidia-ml.so.1 not found" in r.message
    skipped = gpu_visible.run(make_ctx(snapshot=topologies.no_driver(), expect_gpus=0))
    assert skipped.status is Status.SKIP


def test_slurm_job_gpus_must_exist(make_ctx: MakeCtx) -> None:
    snap = topologies.snapshot([topologies.h100(i, b)
                                for i, b in enumerate(topologies.H100_BUS_IDS[:4])])
    r = gpu_visible.run(make_ctx(snapshot=snap, env={"SLURM_JOB_GPUS": "2,3,4,5"}))
    assert (r.status, r.reason) == (Status.FAIL, "GpuCountMismatch")
    assert "SLURM_JOB_GPUS" in r.message
    ok = gpu_visible.run(make_ctx(snapshot=snap, env={"SLURM_JOB_GPUS": "2,3"}))
    assert ok.status is Status.PASS


def test_local_world_size_is_judged_once_by_cuda_devices(make_ctx: MakeCtx) -> None:
    """One fault, one owner: more local processes than GPUs is the job's setting (#11 point 3),
    reported by cuda_devices against the GPUs CUDA exposes; the node's GPUs are fine."""
    from preflight.checks import cuda_devices
    from preflight.core.result import Scope

    ctx = make_ctx(snapshot=topologies.single_h200_vm(), env={"LOCAL_WORLD_SIZE": "4"})
    assert gpu_visible.run(ctx).status is Status.PASS
    r = cuda_devices.run(ctx)
    assert (r.status, r.reason, r.scope) == (Status.FAIL, "LocalWorldSizeTooBig", Scope.JOB)
    assert "LOCAL_WORLD_SIZE=4" in r.message


def test_several_problems_are_all_reported_worst_first(make_ctx: MakeCtx) -> None:
    snap = topologies.healthy_8x_h100()
    gpus = list(snap.gpus)
    gpus[0] = dataclasses.replace(gpus[0], throttle_reasons=("HwSlowdown",))
    gpus[7] = dataclasses.replace(gpus[7], ecc_uncorrectable_volatile=3)
    r = gpu_visible.run(make_ctx(snapshot=dataclasses.replace(snap, gpus=tuple(gpus))))
    assert (r.status, r.reason) == (Status.FAIL, "EccUncorrectable")
    assert r.message.index("uncorrectable ECC") < r.message.index("HwSlowdown")


def test_real_h200_vm_snapshot_passes(make_ctx: MakeCtx) -> None:
    """The NVML snapshot captured on the lent H200 VM (2026-11-29): NVML reports no NVLink there,
    compute mode DEFAULT (as nvidia-smi --query-gpu=compute_mode said)."""
    import json

    from preflight.probes.gpu import GpuSnapshot
    from tests.helpers import REPO

    snap = GpuSnapshot.from_json(json.loads(
        (REPO / "tests/fixtures/nvml_h200_vm.json").read_text()))
    r = gpu_visible.run(make_ctx(snapshot=snap))
    assert r.status is Status.PASS
    assert r.message == "1 GPU: NVIDIA H200; driver 580.159.04; PCIe Gen5 x16"
    assert r.details["gpus"][0]["compute_mode"] == "DEFAULT"


def test_compute_mode_prohibited_fails(make_ctx: MakeCtx) -> None:
    snap = topologies.healthy_8x_h100()
    gpus = list(snap.gpus)
    gpus[6] = dataclasses.replace(gpus[6], compute_mode="PROHIBITED")
    r = gpu_visible.run(make_ctx(snapshot=dataclasses.replace(snap, gpus=tuple(gpus))))
    assert (r.status, r.reason) == (Status.FAIL, "ComputeProhibited")
    assert "GPU 6" in r.message and "nvidia-smi -i 6 -c DEFAULT" in r.remedy
    exclusive = dataclasses.replace(gpus[6], compute_mode="EXCLUSIVE_PROCESS")
    gpus[6] = exclusive  # one process per GPU, as torchrun starts them: fine
    ok = gpu_visible.run(make_ctx(snapshot=dataclasses.replace(snap, gpus=tuple(gpus))))
    assert ok.status is Status.PASS
    assert ok.details["gpus"][6]["compute_mode"] == "EXCLUSIVE_PROCESS"
