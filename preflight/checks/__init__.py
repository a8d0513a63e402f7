"""The list of checks: one module each, one line here, nothing registers itself on import."""

from __future__ import annotations

from preflight.checks import (
    allreduce,
    cuda_devices,
    fabric,
    gpu_speed,
    gpu_visible,
    launcher_env,
    master_port,
    memlock,
    nccl_env,
    network,
    shm,
    versions,
    xid,
)
from preflight.core.check import Check

#: The tests that load the GPUs run one after the other (each would disturb the other's figures),
#: in this order: one worker per GPU measures it, then joins the all-reduce.
GPU_SERIAL = "gpu"

CHECKS: tuple[Check, ...] = (
    Check(gpu_visible.NAME, gpu_visible.run, "NVML sees the expected GPUs, each healthy"),
    Check(xid.NAME, xid.run, "no GPU-fault Xid in the kernel log; job-caused Xids reported"),
    Check(cuda_devices.NAME, cuda_devices.run, "CUDA_VISIBLE_DEVICES read as CUDA does; ranks fit"),
    Check(launcher_env.NAME, launcher_env.run, "torchrun / Slurm variables complete, consistent"),
    Check(shm.NAME, shm.run, "/dev/shm exists, is writable, big enough for NCCL"),
    Check(network.NAME, network.run, "NCCL/gloo NIC selection as NCCL does it; route to rank 0"),
    Check(fabric.NAME, fabric.run, "InfiniBand / RoCE ports up, at full rate, error-free"),
    Check(master_port.NAME, master_port.run, "MASTER_ADDR resolves; MASTER_PORT free on rank 0"),
    Check(nccl_env.NAME, nccl_env.run, "no NCCL_* / TORCH_NCCL_* setting that silently hurts"),
    Check(memlock.NAME, memlock.run, "with RDMA ports: locked-memory limit unlimited for NCCL"),
    Check(versions.NAME, versions.run, "environment fingerprint; equal to the golden one if given"),
    Check(gpu_speed.NAME, gpu_speed.run, "per-GPU copy and matmul speed vs limits and peers",
          timeout_s=gpu_speed.timeout_s, timeout_key="gpu_speed_timeout_s", serial=GPU_SERIAL,
          prepare=gpu_speed.prepare),
    Check(allreduce.NAME, allreduce.run, "timed NCCL all-reduce: busbw, exact sum, no hang",
          timeout_s=allreduce.timeout_s, timeout_key="bench_timeout_s", serial=GPU_SERIAL,
          prepare=allreduce.prepare),
)

#: The checks that load the GPUs (skipped by --no-bandwidth, run by the prolog only with
#: --bandwidth, by the daemon only in its bandwidth run on idle GPUs, never among cluster mode's
#: node checks): one list for every command.
GPU_LOAD_CHECKS: tuple[str, ...] = (allreduce.NAME, gpu_speed.NAME)
