"""``gpu_visible``: NVML sees the GPUs the job needs, and each of them is healthy.

Why: a GPU that fell off the bus, a pending row remap or an uncorrectable ECC error makes NCCL or
CUDA fail minutes into a job ("unhandled cuda error", Xid 79/48/63); a PCIe link trained at x8 or an
NVLink down halves the all-reduce and turns one node into the straggler of the whole job.

Verifies:
- the GPU count against the expectation: ``expect_gpus`` (exact), else the job's ``SLURM_JOB_GPUS``
  (those physical indices must exist), else >= 1 (``LOCAL_WORLD_SIZE`` against the GPUs is the
  job's setting: ``cuda_devices`` judges it against what CUDA will expose);
- every NVIDIA GPU on the PCI bus is enumerated by NVML (one missing has fallen off the bus);
- NVML answers in time: a driver known to be initialised that does not answer within
  ``gpu_probe_timeout_s`` is a node fault (``NvmlNotAnswering``); without that knowledge a slow
  first initialisation is undecided (ERROR);
- per GPU: answers at all, no pending row remap or remap failure, no uncorrectable volatile ECC
  error, compute mode not PROHIBITED (no CUDA context possible), no hardware slowdown, PCIe link
  at its maximum width (and generation: WARN only, since an idle GPU lowers its link generation
  to save power), NVLinks up.

Knobs: ``expect_gpus`` (None), ``expect_nvlinks`` (None = GPUs of one node must agree; a lone GPU
without peers, e.g. one H200 in a VM, is fine).
"""

from __future__ import annotations

from preflight.checks.job_gpus import expected_gpus
from preflight.core.context import Context
from preflight.core.result import Finding, Result, Status, fold
from preflight.probes.gpu import Gpu, GpuSnapshot

NAME = "gpu_visible"


def _gpu_name(gpu: Gpu) -> str:
    ids = ", ".join(x for x in (gpu.uuid, gpu.pci_bus_id) if x)
    return f"GPU {gpu.index}" + (f" ({ids})" if ids else "")


def gpu_problems(gpu: Gpu) -> list[Finding]:
    """Health problems of one GPU, worst first."""
    name = _gpu_name(gpu)
    out: list[Finding] = []
    if gpu.error:
        out.append(Finding(
            Status.FAIL, "GpuLost", f"{name} does not answer: {gpu.error}",
            f"Drain the node; look for Xid 79 / 48 in `dmesg | grep -i xid`; reset the GPU "
            f"(nvidia-smi -r -i {gpu.index}) or reboot; RMA the card if it recurs."))
        return out
    if gpu.remap_failure:
        out.append(Finding(Status.FAIL, "RowRemapFailure",
                           f"{name} had a row-remapping failure (no spare rows left)",
                           "Drain the node and RMA the GPU: its memory can no longer be repaired."))
    if gpu.remap_pending:
        out.append(Finding(Status.FAIL, "RowRemapPending",
                           f"{name} has a row remap pending; it applies only after a GPU reset",
                           f"Drain the node, then reset the GPU when idle (nvidia-smi -r -i "
                           f"{gpu.index}) or reboot."))
    if gpu.ecc_uncorrectable_volatile:
        out.append(Finding(
            Status.FAIL, "EccUncorrectable",
            f"{name} has {gpu.ecc_uncorrectable_volatile} uncorrectable ECC error(s) since the "
            "last reset",
            f"Drain the node; reset the GPU (nvidia-smi -r -i {gpu.index}); check "
            "`nvidia-smi -q -d ROW_REMAPPER,ECC`; RMA if errors return."))
    if gpu.compute_mode == "PROHIBITED":
        out.append(Finding(
            Status.FAIL, "ComputeProhibited",
            f"{name} is in compute mode PROHIBITED: no process can create a CUDA context on it",
            f"Set the default compute mode: nvidia-smi -i {gpu.index} -c DEFAULT (as root)."))
    if gpu.pcie and gpu.pcie.width < gpu.pcie.max_width:
        out.append(Finding(
            Status.FAIL, "PcieLinkDegraded",
            f"{name} PCIe link is x{gpu.pcie.width}, expected x{gpu.pcie.max_width}",
            "Reseat the GPU / riser or check the slot (nvidia-smi -q -d PCIE); host<->GPU and "
            "inter-node traffic run at a fraction of their speed until then."))
    if gpu.throttle_reasons:
        out.append(Finding(
            Status.WARN, "GpuThrottled",
            f"{name} is slowed down by the hardware: {', '.join(gpu.throttle_reasons)}",
            "Check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER); a throttled "
            "GPU makes its rank the straggler of every collective."))
    if gpu.pcie and gpu.pcie.gen < gpu.pcie.max_gen:
        out.append(Finding(
            Status.WARN, "PcieGenDowngraded",
            f"{name} PCIe link runs at Gen{gpu.pcie.gen}, maximum Gen{gpu.pcie.max_gen} (normal "
            "while idle: GPUs lower the generation to save power)",
            "Re-check under load (nvidia-smi -q -d PCIE); if it stays low, check BIOS PCIe "
            "settings and the riser."))
    return out


def nvlink_problems(gpus: list[Gpu], expect: int | None) -> list[Finding]:
    """NVLink verdict over the GPUs of one node (see module doc for the auto rule)."""
    with_links = [g for g in gpus if g.nvlinks]
    if not with_links:
        return []
    want = expect
    if want is None:
        most = max(g.active_nvlinks for g in with_links)
        if most == 0:
            if len(with_links) > 1:
                return [Finding(
                    Status.WARN, "NvlinkInactive",
                    f"{len(with_links)} GPUs have NVLinks but none is active; all-reduce falls "
                    "back to PCIe",
                    "On NVSwitch systems start the fabric manager (systemctl start "
                    "nvidia-fabricmanager); check `nvidia-smi nvlink -s`. If this node has no "
                    "NVLink bridges, set expect_nvlinks: 0.")]
            return []  # a lone GPU (e.g. in a VM) has nobody to link to
        want = most
    out = []
    for g in with_links:
        if g.active_nvlinks < want:
            down = [link.link for link in g.nvlinks if not link.active]
            out.append(Finding(
                Status.FAIL, "NvlinkDown",
                f"{_gpu_name(g)} has {g.active_nvlinks}/{want} NVLinks active (down: "
                f"{', '.join(map(str, down[:18]))})",
                f"Check `nvidia-smi nvlink -s -i {g.index}` and the fabric manager; reset the "
                "GPU or reboot; RMA if links stay down."))
    return out


def _expected(ctx: Context, snap: GpuSnapshot) -> tuple[list[Finding], str]:
    """Count problems and a words-only statement of the expectation."""
    count = len(snap.gpus)
    want = expected_gpus(ctx)
    n = want.count
    if want.source == "expect_gpus" and n is not None:
        if count != n:
            return [Finding(Status.FAIL, "GpuCountMismatch",
                            f"NVML sees {count} GPU(s), expected {n} (expect_gpus)",
                            _count_remedy())], f"{n} expected"
        return [], f"{n} expected"
    if want.source == "SLURM_JOB_GPUS":
        slurm = want.slurm_indices
        missing = [i for i in slurm if i >= count]
        if missing:
            return [Finding(Status.FAIL, "GpuCountMismatch",
                            f"the job was given GPUs {','.join(map(str, slurm))} (SLURM_JOB_GPUS) "
                            f"but NVML sees only {count}", _count_remedy())], "SLURM_JOB_GPUS"
        return [], f"{len(slurm)} given by Slurm"
    # LOCAL_WORLD_SIZE against the GPUs is the job's setting, judged once, by cuda_devices
    # (LocalWorldSizeTooBig, scope job) against the GPUs CUDA will really expose.
    if count == 0:
        return [Finding(Status.FAIL, "NoGpu", "NVML sees no GPU",
                        _count_remedy() + " On a CPU-only node pass --expect-gpus 0.")], ">= 1"
    return [], ""


def _count_remedy() -> str:
    return ("Look for GPUs that fell off the bus (`nvidia-smi`, `lspci -d 10de:`, "
            "`dmesg | grep -i xid`); drain the node and reset or reboot it.")


def run(ctx: Context) -> Result:
    if ctx.config.expect_gpus == 0:
        return Result(NAME, Status.SKIP, "NoGpuExpected", "expect_gpus is 0: CPU-only node")
    snap = ctx.gpus()
    if snap.unanswered == "hung":
        return Result(NAME, Status.FAIL, "NvmlNotAnswering", snap.error or "NVML did not answer",
                      "Drain the node: the driver does not answer (as a hung nvidia-smi). Look "
                      "for Xid and NVRM lines in `dmesg`, then reset the GPUs (nvidia-smi -r) or "
                      "reboot the node.", details={"pci_gpus": len(snap.pci_gpu_bus_ids)})
    if snap.unanswered is not None:
        raise TimeoutError(snap.error or "NVML did not answer")
    if not snap.available:
        return Result(NAME, Status.FAIL, "NvmlUnavailable", snap.error or "NVML not available",
                      "Install or load the NVIDIA driver (nvidia-smi must work); in a container "
                      "use the NVIDIA runtime with NVIDIA_DRIVER_CAPABILITIES=compute,utility. On "
                      "a CPU-only node pass --expect-gpus 0.",
                      details={"pci_gpus": len(snap.pci_gpu_bus_ids)})
    problems, expectation = _expected(ctx, snap)
    seen = {g.pci_bus_id for g in snap.gpus if g.pci_bus_id}
    off_bus = [b for b in snap.pci_gpu_bus_ids if b not in seen]
    if off_bus and len(snap.pci_gpu_bus_ids) > len(snap.gpus):
        problems.append(Finding(
            Status.FAIL, "GpuMissingFromNvml",
            f"{len(snap.pci_gpu_bus_ids)} NVIDIA GPUs on the PCI bus but NVML enumerates "
            f"{len(snap.gpus)}; not seen by NVML: {', '.join(off_bus)}",
            "The GPU fell off the bus or is not bound to the nvidia driver: check "
            "`dmesg | grep -i -e xid -e nvrm`; drain and reboot the node."))
    for g in snap.gpus:
        problems.extend(gpu_problems(g))
    problems.extend(nvlink_problems([g for g in snap.gpus if not g.error],
                                    ctx.config.expect_nvlinks))
    details = {
        "count": len(snap.gpus),
        "expected": ctx.config.expect_gpus,
        "driver_version": snap.driver_version,
        "gpus": [_gpu_details(g) for g in snap.gpus],
    }
    return fold(NAME, problems, ok_reason="GpusHealthy", summary=_summary(snap, expectation),
                details=details, summary_up_to=Status.PASS)


def _gpu_details(g: Gpu) -> dict[str, object]:
    return {
        "index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "name": g.name,
        "error": g.error,
        "pcie": f"Gen{g.pcie.gen} x{g.pcie.width} (max Gen{g.pcie.max_gen} x{g.pcie.max_width})"
        if g.pcie else None,
        "nvlinks_active": g.active_nvlinks, "nvlinks": len(g.nvlinks),
        "compute_pids": list(g.compute_pids), "compute_mode": g.compute_mode,
    }


def _summary(snap: GpuSnapshot, expectation: str) -> str:
    names = sorted({g.name for g in snap.gpus if g.name})
    parts = [f"{len(snap.gpus)} GPU{'s' if len(snap.gpus) != 1 else ''}"
             + (f" ({expectation})" if expectation else "")
             + (f": {', '.join(names)}" if names else "")]
    if snap.driver_version:
        parts.append(f"driver {snap.driver_version}")
    links = sorted({(g.active_nvlinks, len(g.nvlinks)) for g in snap.gpus if g.nvlinks})
    if links:
        parts.append("NVLink " + ", ".join(f"{a}/{n} active" for a, n in links)
                     + (" (no peer GPU)" if len(snap.gpus) == 1 and links[0][0] == 0 else ""))
    pcie = sorted({(g.pcie.gen, g.pcie.width) for g in snap.gpus if g.pcie})
    if pcie:
        parts.append("PCIe " + ", ".join(f"Gen{gen} x{w}" for gen, w in pcie))
    return "; ".join(parts)
