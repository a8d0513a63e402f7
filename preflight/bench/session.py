"""The GPU tests of one run of the checks: ``gpu_speed`` and ``allreduce`` share their workers.

The runner runs the two checks one after the other (they share ``serial``, checks/__init__.py),
``gpu_speed`` first. Before either runs, the ``allreduce`` check says it will follow
(:meth:`GpuTests.expect_allreduce`, from its ``prepare``); the speed test then starts one worker
per GPU whose plan is the speed step and then the all-reduce, in one process and one CUDA context
each (interpreter start, imports and the context are paid once), and returns as soon as every
GPU is measured, while the workers go on into the all-reduce. The ``allreduce`` check then
follows the same workers to their end. When they cannot share (another interpreter, a GPU to
measure that is no rank) or the speed step ended the run (a worker stalled or died), the
all-reduce starts workers of its own, as it does when it runs alone: its verdict never depends
on the speed test's. The speed test's workers may be started before NVML is read
(:meth:`GpuTests.prestart`): their interpreter and the driver's initialisation overlap it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from preflight.bench.options import BenchOptions, RunOptions, SpeedOptions
from preflight.bench.parent import WorkerRun, run_workers
from preflight.bench.prestart import Prestarted, prestart
from preflight.bench.records import RunRecord, SpeedRecord
from preflight.core.context import Context


class GpuTests:
    """This run's GPU tests (one per Context: :func:`gpu_tests`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allreduce: BenchOptions | None = None
        self._run: WorkerRun | None = None
        self._early: Prestarted | None = None

    def expect_allreduce(self, opts: BenchOptions) -> None:
        with self._lock:
            self._allreduce = opts

    def prestart(self, proc_gpus: str | Path, *, python: str,
                 env: Mapping[str, str] | None) -> None:
        """Start one worker per GPU the driver lists, before NVML says which GPUs to measure
        (:mod:`preflight.bench.prestart`); the speed test adopts them."""
        with self._lock:
            if self._early is None and self._run is None:
                self._early = prestart(proc_gpus, python=python, env=env)

    def release(self) -> None:
        """The speed test does not run after all: the workers started for it exit."""
        with self._lock:
            early, self._early = self._early, None
        if early is not None:
            early.release()

    def speed(self, opts: SpeedOptions) -> SpeedRecord:
        """Measure every GPU of ``opts``; with the all-reduce expected, in workers that run it
        next."""
        with self._lock:
            ar, self._allreduce = self._allreduce, None
            early, self._early = self._early, None
            both = self._combine(opts, ar) if ar is not None else None
            self._run = WorkerRun(both or RunOptions(speed=opts), prestarted=early)
            if both is None:
                run, self._run = self._run, None
                return run.speed()
            return self._run.speed()

    def allreduce(self, opts: BenchOptions) -> RunRecord:
        """The all-reduce of ``opts``: in the workers the speed test left running into it, or
        in workers of its own."""
        with self._lock:
            run, self._run = self._run, None
        if run is not None and run.opts.allreduce == opts and not run.failed_before_allreduce:
            return run.allreduce()
        return run_workers(opts)

    @staticmethod
    def _combine(speed: SpeedOptions, ar: BenchOptions) -> RunOptions | None:
        both = RunOptions.combine(speed, ar)
        if both is None and speed.engine == "auto" and ar.python == sys.executable:
            # The all-reduce borrows this interpreter's nccl4py for the training environment's
            # NCCL: its cuda-bindings measure the GPUs as well as any interpreter's would.
            both = RunOptions.combine(dataclasses.replace(speed, python=ar.python), ar)
        return both


def gpu_tests(ctx: Context) -> GpuTests:
    return ctx.cached("bench.gpu-tests", GpuTests)
