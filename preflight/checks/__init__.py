"""The list of checks: one module each, one line here, nothing registers itself on import."""

from __future__ import annotations

from preflight.checks import gpu_visible, nccl_env, shm, versions
from preflight.runner import Check

CHECKS: tuple[Check, ...] = (
    Check(gpu_visible.NAME, gpu_visible.run, "NVML sees the expected GPUs, each healthy"),
    Check(shm.NAME, shm.run, "/dev/shm exists, is writable, big enough for NCCL"),
    Check(nccl_env.NAME, nccl_env.run, "no NCCL_* / TORCH_NCCL_* setting that silently hurts"),
    Check(versions.NAME, versions.run, "environment fingerprint; equal to the golden one if given"),
)
