"""Workers started before the parent knows their plan, so that their start overlaps NVML.

The GPU tests may only load GPUs that no job uses, which the parent learns from NVML (0.1-0.2 s
on an H200 node). What a worker must do before it touches a GPU does not have to wait: the
interpreter's start, cuda-bindings' import and the driver's own initialisation (cuInit, which
creates no context and takes no GPU memory; 0.1-0.6 s) together are the longest part of a speed
run. :func:`prestart` starts one worker per GPU the driver lists under ``/proc/driver/nvidia/gpus``
with the plan ``{"pending": S}``; :class:`~preflight.bench.parent.WorkerRun` adopts them (each
gets its plan on stdin) and starts any more it needs; :meth:`Prestarted.release` tells the ones
not needed to exit, and whatever happens they are killed and reaped like any worker.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from preflight.bench import procs
from preflight.bench.options import RunOptions
from preflight.bench.records import WorkerState
from preflight.bench.worker import wire
from preflight.core import aborting

#: How long a started worker waits for its plan before it gives up and exits.
PENDING_S = 60.0


def gpu_count(proc_gpus: str | Path) -> int:
    """GPUs the driver lists (one directory each under ``/proc/driver/nvidia/gpus``); 0 when it
    cannot be read (no driver, no such mount)."""
    try:
        return sum(1 for entry in os.scandir(proc_gpus) if entry.is_dir())
    except OSError:
        return 0


class Prestarted:
    """Workers waiting for their plan; adopted by a run of the same interpreter and environment,
    else released."""

    def __init__(self, count: int, *, python: str, env: Mapping[str, str] | None) -> None:
        self.python, self.env = python, dict(env) if env is not None else None
        self.log_dir = tempfile.mkdtemp(prefix="preflight-gpu-")
        self.sel = selectors.DefaultSelector()
        self.logs: list[Any] = []
        self.workers: list[WorkerState] = []
        self.taken = False
        self.undo = aborting.register(lambda: procs.abandon(self.workers, self.log_dir))
        env_for = procs.worker_env(self.env)
        plan = json.dumps({"pending": PENDING_S})
        now = time.monotonic()
        for i in range(count):
            st = WorkerState(rank=i, label=f"GPU worker {i}", entered=now, last_beat=now)
            read_fd, write_fd = os.pipe()
            st.spawned_wall = time.time()
            argv = procs.argv_for(python, plan, write_fd)
            self.workers.append(st)  # before it starts: the undo above must see it
            if procs.launch(st, argv, pipe=(read_fd, write_fd), env=env_for, log_dir=self.log_dir,
                            sel=self.sel, logs=self.logs) is not None:
                self.workers.pop()
                break  # it cannot start: the run will say so when it starts its own

    def fits(self, opts: RunOptions) -> bool:
        return (not self.taken and opts.python == self.python
                and dict(opts.env or {}) == dict(self.env or {}))

    def release(self) -> None:
        """Not needed after all: each worker is told to exit, then all are reaped."""
        if self.taken:
            return
        self.taken = True
        procs.write(self.workers, wire.control_line(**{wire.PLAN: None}))
        procs.await_exits(self.workers, 2.0)
        procs.close_run(self.workers, self.sel, self.logs)
        shutil.rmtree(self.log_dir, ignore_errors=True)
        aborting.unregister(self.undo)


def prestart(proc_gpus: str | Path, *, python: str,
             env: Mapping[str, str] | None) -> Prestarted | None:
    """One pending worker per GPU the driver lists; None when it lists none."""
    count = gpu_count(proc_gpus)
    if count == 0:
        return None
    try:
        return Prestarted(count, python=python, env=env)
    except aborting.Aborted:
        return None
