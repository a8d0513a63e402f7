"""Fixture nodes and speed runs for the gpu_speed tests (NVML facts as seen on 2x H200)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from preflight.gpuspeed.probe import GpuMeasure, SpeedFailure, SpeedRun
from preflight.probes.gpu import Gpu, GpuClocks, GpuSnapshot
from tests import topologies

BUS = ("0000:00:06.0", "0000:00:07.0")
IDLE = GpuClocks(sm_clock_mhz=345, max_sm_clock_mhz=1980, max_mem_clock_mhz=3201,
                 mem_bus_width_bits=6016, power_w=80.0, power_limit_w=700.0,
                 default_power_limit_w=700.0, temperature_c=37, clock_reasons=("GpuIdle",))
#: The figures the cuda engine measured on the lent H200s (docs/benchmarks.md).
H200 = {"d2d": 4224.0, "h2d": 55.3, "d2h": 55.3, "gemm": 787.0}
DEVICE = {"engine": "cuda", "dtype": "bf16", "name": "NVIDIA H200", "capability": [9, 0],
          "sm_count": 132, "bus_width_bits": 6016}


def h200(i: int, **changes: object) -> Gpu:
    gpu = topologies.h100(i, BUS[i] if i < len(BUS) else f"0000:00:{6 + i:02x}.0",
                          name="NVIDIA H200", clocks=IDLE)
    return dataclasses.replace(gpu, **changes)  # type: ignore[arg-type]


def node(count: int = 2, **changes: Mapping[int, object]) -> GpuSnapshot:
    gpus = [h200(i) for i in range(count)]
    for i, change in changes.get("per_gpu", {}).items():  # type: ignore[union-attr]
        gpus[i] = dataclasses.replace(gpus[i], **change)  # type: ignore[arg-type]
    return topologies.snapshot(gpus)


def run_of(figures: Sequence[Mapping[str, float]], failure: SpeedFailure | None = None,
           bus: Sequence[str] = BUS) -> SpeedRun:
    return SpeedRun(measures=tuple(
        GpuMeasure(bus_id=bus[i], figures=dict(f), device=DEVICE,
                   phase_s={"import": 0.08, "init": 1.5, "h2d": 0.03, "d2h": 0.03, "d2d": 0.003,
                            "gemm": 0.09})
        for i, f in enumerate(figures)), failure=failure, elapsed_s=1.9)


def write_run(path: Path, run: SpeedRun) -> Path:
    path.write_text(json.dumps(run.to_json()))
    return path
