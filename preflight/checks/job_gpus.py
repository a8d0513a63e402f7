"""How many GPUs the job expects on this node: one answer for ``gpu_visible`` and ``shm``."""

from __future__ import annotations

from dataclasses import dataclass

from preflight.core.context import Context
from preflight.jobenv.launcher import env_int, slurm_job_gpus


@dataclass(frozen=True)
class ExpectedGpus:
    """How many GPUs this node must give the job, and who says so.

    Attributes:
        count: the number, or None when nobody says (then the job takes every GPU NVML sees).
        source: ``expect_gpus``, ``SLURM_JOB_GPUS``, ``LOCAL_WORLD_SIZE`` or ``""``.
        slurm_indices: the physical indices Slurm gave the job (source ``SLURM_JOB_GPUS``).
    """

    count: int | None
    source: str
    slurm_indices: tuple[int, ...] = ()


def expected_gpus(ctx: Context) -> ExpectedGpus:
    """"How many GPUs does this job expect?", answered one way for every check: the configured
    ``expect_gpus``, else Slurm's SLURM_JOB_GPUS, else LOCAL_WORLD_SIZE, else nobody says."""
    if ctx.config.expect_gpus is not None:
        return ExpectedGpus(ctx.config.expect_gpus, "expect_gpus")
    slurm = slurm_job_gpus(ctx.env)
    if slurm:
        return ExpectedGpus(len(slurm), "SLURM_JOB_GPUS", tuple(slurm))
    lws = env_int(ctx.env, "LOCAL_WORLD_SIZE")
    if lws is not None and lws > 0:
        return ExpectedGpus(lws, "LOCAL_WORLD_SIZE")
    return ExpectedGpus(None, "")


def job_gpu_count(ctx: Context) -> int:
    """GPUs the job will use on this node: :func:`expected_gpus`, else every GPU NVML sees."""
    expected = expected_gpus(ctx).count
    if expected is not None:
        return expected
    snap = ctx.gpus()
    return len(snap.gpus) if snap.available else 0
