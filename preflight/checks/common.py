"""Facts several checks derive the same way (pure over the context)."""

from __future__ import annotations

from preflight.context import Context


def env_int(ctx: Context, name: str) -> int | None:
    """``int(env[name])`` or None when unset or not an integer (launcher_env reports that)."""
    raw = ctx.env.get(name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def slurm_job_gpus(ctx: Context) -> list[int] | None:
    """Physical GPU indices Slurm gave the job on this node (SLURM_JOB_GPUS="0,1,2,3")."""
    raw = ctx.env.get("SLURM_JOB_GPUS")
    if not raw:
        return None
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        return None


def job_gpu_count(ctx: Context) -> int:
    """GPUs the job will use on this node: LOCAL_WORLD_SIZE, SLURM_JOB_GPUS, expect_gpus, else
    every GPU NVML sees."""
    lws = env_int(ctx, "LOCAL_WORLD_SIZE")
    if lws is not None and lws > 0:
        return lws
    slurm = slurm_job_gpus(ctx)
    if slurm:
        return len(slurm)
    if ctx.config.expect_gpus is not None:
        return ctx.config.expect_gpus
    snap = ctx.gpus()
    return len(snap.gpus) if snap.available else 0
