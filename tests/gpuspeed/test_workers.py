"""The real worker processes and their parent, on CPU (the ``cpu`` engine): phases, figures,
the go after ready, a frozen worker named, nothing left behind."""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest

from preflight.gpuspeed.parent import SpeedOptions, run_workers
from preflight.gpuspeed.probe import Target, WorkerSpeedProbe
from preflight.gpuspeed.worker import STALL_ENV, bf16_pattern

TARGETS = (Target("0000:00:06.0", 0, "GPU 0, 0000:00:06.0"),
           Target("0000:00:07.0", 1, "GPU 1, 0000:00:07.0"))


def _gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_two_cpu_workers_report_every_figure_and_phase_time() -> None:
    run = WorkerSpeedProbe(engine="cpu", timeout_s=30).measure(TARGETS)
    assert run.failure is None
    assert [m.bus_id for m in run.measures] == [t.bus_id for t in TARGETS]
    for m in run.measures:
        assert set(m.figures) == {"h2d", "d2h", "d2d", "gemm"}
        assert all(v > 0 for v in m.figures.values())
        assert {"import", "init", "h2d", "d2h", "d2d", "gemm"} <= set(m.phase_s)
        assert m.device["engine"] == "cpu"


def test_a_frozen_worker_is_named_with_its_gpu_and_phase_and_nothing_is_left() -> None:
    env = {**os.environ, STALL_ENV: "0000:00:07.0:d2d"}
    opts = SpeedOptions(bus_ids=tuple(t.bus_id for t in TARGETS), cuda_indices=(0, 1),
                        labels=tuple(t.label for t in TARGETS), timeout_s=8, engine="cpu",
                        env=env)
    started = time.monotonic()
    rec = run_workers(opts)
    took = time.monotonic() - started
    assert rec.failure is not None and rec.failure.kind == "stalled"
    assert rec.failure.message.startswith("the worker for GPU 1, 0000:00:07.0 stalled in d2d")
    assert "no heartbeat" in rec.failure.message and "frozen" in rec.failure.message
    assert rec.failure.ranks == (1,)
    assert took < opts.deadline("d2d") + 3
    assert all(_gone(st.pid) for st in rec.workers)


def test_the_measurement_waits_for_the_gpu_test_lock() -> None:
    gate = threading.Lock()
    gate.acquire()
    released_at: list[float] = []

    def release() -> None:
        time.sleep(3.0)  # cpu workers are ready within ~0.5 s, even on a loaded 2-core machine
        released_at.append(time.monotonic())
        gate.release()

    threading.Thread(target=release).start()
    t0 = time.monotonic()
    run = WorkerSpeedProbe(engine="cpu", timeout_s=30, gate=gate).measure(TARGETS)
    wall = time.monotonic() - t0
    assert run.failure is None and len(run.measures) == 2
    assert released_at and not gate.locked()  # taken for the measurement, then given back
    # The workers started at once; the wait for the lock is not counted as the run's time.
    assert wall >= 3.0 and run.elapsed_s < wall - 1.0


def test_a_lock_held_too_long_is_a_timeout_naming_the_other_test() -> None:
    gate = threading.Lock()
    gate.acquire()
    try:
        opts = SpeedOptions(bus_ids=("0000:00:06.0",), cuda_indices=(0,), labels=("GPU 0",),
                            timeout_s=10, engine="cpu", gate=gate, gate_wait_s=1.0)
        rec = run_workers(opts)
    finally:
        gate.release()
    assert rec.failure is not None and rec.failure.kind == "timeout"
    assert "another GPU test (the all-reduce) held the GPUs for more than 1 s" in \
        rec.failure.message
    assert all(_gone(st.pid) for st in rec.workers)


def test_an_interpreter_that_does_not_exist_is_a_spawn_failure() -> None:
    run = WorkerSpeedProbe(python="/nonexistent/python3", engine="cpu").measure(TARGETS[:1])
    assert run.failure is not None and run.failure.kind == "spawn"
    assert "cannot start the worker for GPU 0, 0000:00:06.0 (/nonexistent/python3)" in \
        run.failure.message


@pytest.mark.skipif(importlib.util.find_spec("cuda") is not None,
                    reason="cuda-bindings is installed here")
def test_the_cuda_engine_missing_is_reported_as_such() -> None:
    run = WorkerSpeedProbe(engine="cuda", timeout_s=30).measure(TARGETS[:1])
    assert run.failure is not None and run.failure.kind == "engine"
    assert "No module named 'cuda'" in run.failure.message


def test_the_bf16_pattern_stays_in_minus_one_to_one() -> None:
    raw = bf16_pattern(4096)
    assert len(raw) == 8192
    for i in range(0, len(raw), 2):
        bits = int.from_bytes(raw[i:i + 2], "little")
        assert 118 <= (bits >> 7) & 0xFF <= 126  # exponent: |x| in [2^-9, 1)
