"""``bench.gate.blocker``: the one answer to "may the bandwidth test run now?"."""

from __future__ import annotations

import dataclasses

import pytest

from preflight.bench.gate import blocker
from preflight.probes.gpu import GpuSnapshot
from tests import topologies


def with_gpu(snap: GpuSnapshot, index: int, **changes: object) -> GpuSnapshot:
    gpus = list(snap.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(snap, gpus=tuple(gpus))


def test_idle_gpus_may_run() -> None:
    assert blocker(topologies.healthy_8x_h100()) is None
    assert blocker(topologies.healthy_8x_h100(), periodic=True) is None


def test_busy_gpus_name_the_pid() -> None:
    stop = blocker(with_gpu(topologies.healthy_8x_h100(), 2, compute_pids=(4242,)))
    assert stop is not None and stop.reason == "GpusBusy" and "GPU 2 (pid 4242)" in stop.why


@pytest.mark.parametrize(("mode", "one_shot", "periodic"), [
    ("PROHIBITED", "ComputeProhibited", "ComputeProhibited"),
    ("EXCLUSIVE_PROCESS", None, "GpusExclusive"),
])
def test_compute_modes(mode: str, one_shot: str | None, periodic: str) -> None:
    snap = with_gpu(topologies.healthy_8x_h100(), 0, compute_mode=mode)
    got = blocker(snap)
    assert (got.reason if got else None) == one_shot
    got = blocker(snap, periodic=True)
    assert got is not None and got.reason == periodic


def test_without_nvml_nothing_runs() -> None:
    stop = blocker(GpuSnapshot(available=False, error="libnvidia-ml.so.1 not found"))
    assert stop is not None and stop.reason == "NvmlUnavailable"
    assert "libnvidia-ml.so.1" in stop.why
