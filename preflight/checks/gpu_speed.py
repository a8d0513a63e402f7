"""``gpu_speed``: no GPU of the node is slower than its peers or far below its hardware's limits.

What: on every GPU CUDA exposes, at once, one worker each: device memory copy, pinned
host-to-device and device-to-host copies (GB/s) and a dense bf16 matrix multiply (TFLOP/s), each
against the limit read or derived from NVML (PCIe generation x width, memory bus width x clock,
SM count x clock x the architecture's rate) or a table per model. FAIL ``GpuSlow`` below
``gpu_speed_slow_fraction`` x the node's median, naming the GPU and NVML's why (clock event
reasons, power limit, PCIe width, temperature); WARN ``GpuBelowLimit`` below
``gpu_speed_warn_fraction`` of the limit.

Why: a job runs at the speed of its slowest GPU; one held at low clocks, power-braked, on a
degraded PCIe link or with a bad HBM stack passes every NVML health counter and slows every
collective (docs/gpu-speed.md; DCGM's level-3 diagnostic finds it in about 15 minutes).

When: on by default; SKIP without NVML, when a compute process uses a GPU (never load a running
job's GPUs), or when no engine runs in the workers' interpreter. Runs before the all-reduce,
never beside it (each would disturb the other's figures); with both selected the same workers
go on into the all-reduce. ``--no-bandwidth`` skips it with the all-reduce.

Knobs: ``gpu_speed_slow_fraction`` (0.8), ``gpu_speed_warn_fraction`` (0.5),
``gpu_speed_timeout_s`` (30 s), ``gpu_speed_engine`` (auto), ``python`` (the workers'
interpreter).
"""

from __future__ import annotations

from preflight.core.context import Context, activity
from preflight.core.result import Result

NAME = "gpu_speed"
DEADLINE_MARGIN_S = 10.0


def timeout_s(ctx: Context) -> float:
    """The speed test's own deadline, plus time to kill and judge."""
    return ctx.config.gpu_speed_timeout_s + DEADLINE_MARGIN_S


def prepare(ctx: Context) -> None:
    """Start the workers now: their start overlaps NVML and the all-reduce's planning."""
    from preflight.gpuspeed import prestart

    prestart(ctx)


def run(ctx: Context) -> Result:
    from preflight.gpuspeed import run_speed

    with activity("the GPU speed workers (preflight bench --gpu)"):
        verdict = run_speed(ctx, include_busy=False)
    return Result(NAME, verdict.status, verdict.reason, verdict.message, verdict.remedy,
                  details={"gpu_speed": verdict.to_json()})
