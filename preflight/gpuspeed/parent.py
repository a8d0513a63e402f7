"""Starts one speed worker per GPU, all at once, follows them, kills them on a deadline.

Never imports torch or the CUDA bindings. The workers are independent (no rendezvous): each is
judged against its own phase deadlines, and the first to miss one is named with its GPU, its
phase and whether it still sends heartbeats. Process handling, exit texts and the final kill of
every worker's process group are the all-reduce parent's (:mod:`preflight.bench.parent`).

The workers start, import and set up CUDA at once, report ``ready``, and get the ``go`` only
while the parent holds ``gate`` (the run's GPU-test lock, shared with the all-reduce): start-up
overlaps with the all-reduce, the measurements never do. Waiting for the gate has its own limit
(``gate_wait_s``) and does not count against ``timeout_s``.

Deadlines: ``import`` (interpreter start + engine import) and ``init`` (CUDA context, memory,
cuBLAS handle) each ``min(20, timeout_s / 2)``; each measurement ``min(10, max(2, timeout_s /
4))``; the whole run ``timeout_s``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preflight.bench.parent import (
    GRACE_S,
    HEARTBEAT_SILENT_S,
    Failure,
    RankState,
    _collect_tracebacks,
    _exit_text,
    abandon,
    await_exits,
    close_run,
    launch,
    messages,
    read_ready,
)
from preflight.core import aborting

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
PHASES = ("spawn", "import", "init", "ready", "h2d", "d2h", "d2d", "gemm", "close", "done")


@dataclass(frozen=True)
class SpeedOptions:
    """One worker per entry of ``bus_ids`` (CUDA index ``cuda_indices[i]``, label ``labels[i]``)."""

    bus_ids: tuple[str, ...]
    cuda_indices: tuple[int, ...]
    labels: tuple[str, ...]
    timeout_s: float
    engine: str = "auto"
    kinds: tuple[str, ...] = ("h2d", "d2h", "d2d", "gemm")
    env: Mapping[str, str] | None = None
    python: str = sys.executable
    #: Held while the workers measure; taken once every worker is ready (None: go at once).
    gate: threading.Lock | None = None
    #: How long the ready workers may wait for the gate (another GPU test running), seconds.
    gate_wait_s: float = 150.0

    def deadline(self, phase: str) -> float:
        if phase in ("spawn", "import", "init"):
            return min(20.0, self.timeout_s / 2)
        return min(10.0, max(2.0, self.timeout_s / 4))


@dataclass
class WorkerState(RankState):
    """A RankState (so the bench's kill and traceback helpers apply) plus what a speed worker
    reports: its device facts, figures and phase times."""

    device: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)

    def where(self) -> str:
        return self.phase


@dataclass(frozen=True)
class SpeedRecord:
    workers: tuple[WorkerState, ...]
    failure: Failure | None
    elapsed_s: float


def _env(opts: SpeedOptions) -> dict[str, str]:
    env = dict(os.environ if opts.env is None else opts.env)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_workers(opts: SpeedOptions) -> SpeedRecord:
    """Run every worker to the end or to a deadline; never raises for a worker's failure and
    always leaves no worker process behind."""
    started = time.monotonic()
    log_dir = tempfile.mkdtemp(prefix="preflight-gpuspeed-")
    workers = tuple(WorkerState(rank=i, label=opts.labels[i], entered=started,
                                last_beat=started) for i in range(len(opts.bus_ids)))
    env = _env(opts)
    sel = selectors.DefaultSelector()
    logs: list[Any] = []
    failure: Failure | None = None
    held = released = False
    # A signal that ends preflight while this runs in a check's thread: see core/aborting.py.
    undo = aborting.register(lambda: abandon(workers, log_dir))
    try:
        for st in workers:
            failure = _spawn(st, opts, env=env, log_dir=log_dir, sel=sel, logs=logs)
            if failure:
                break
        failing_since: float | None = None
        gate_since: float | None = None
        while failure is None:
            for st, chunk in read_ready(sel, 0.05):
                _consume(st, chunk, time.monotonic())
            now = time.monotonic()
            if all(st.phase == "done" for st in workers):
                # Reported: wake when the exits are reaped, not at the next 50 ms poll.
                await_exits(workers, opts.deadline("close"))
            if all(st.phase == "done" and st.proc and st.proc.poll() == 0 for st in workers):
                break
            if any(st.error or (st.proc and st.proc.poll() not in (None, 0)) for st in workers):
                failing_since = failing_since or now
                if now - failing_since >= GRACE_S:
                    failure = _broken(workers)
                continue
            if gate_since is None and all(st.phase == "ready" for st in workers):
                gate_since = now
            if gate_since is not None and not released:
                if opts.gate is None or opts.gate.acquire(blocking=False):
                    held, released = opts.gate is not None, True
                    _go(workers)
                    # Waiting for the other test is not this run's time.
                    started += now - gate_since
                    for st in workers:
                        st.entered = now
                elif now - gate_since > opts.gate_wait_s:
                    failure = Failure("timeout", "another GPU test (the all-reduce) held "
                                            f"the GPUs for more than {opts.gate_wait_s:g} s",
                                            tuple(st.rank for st in workers))
                continue
            failure = _late(workers, opts, now, started)
    finally:
        if held and opts.gate is not None:
            opts.gate.release()
        close_run(workers, sel, logs)
        aborting.unregister(undo)
    _collect_tracebacks(workers, log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    return SpeedRecord(workers, failure, time.monotonic() - started)


def _spawn(st: WorkerState, opts: SpeedOptions, *, env: dict[str, str], log_dir: str,
           sel: selectors.BaseSelector, logs: list[Any]) -> Failure | None:
    read_fd, write_fd = os.pipe()
    argv = [opts.python, str(WORKER_SCRIPT), "--pci-bus-id", opts.bus_ids[st.rank],
            "--cuda-index", str(opts.cuda_indices[st.rank]), "--engine", opts.engine,
            "--kinds", ",".join(opts.kinds), "--progress-fd", str(write_fd),
            "--parent-pid", str(os.getpid())]
    exc = launch(st, argv, pipe=(read_fd, write_fd), env=env, log_dir=log_dir, sel=sel,
                 logs=logs)
    if exc is not None:
        return Failure("spawn", f"cannot start the worker for {st.label} ({opts.python}): "
                            f"{exc}", (st.rank,))
    return None


def _go(workers: Sequence[WorkerState]) -> None:
    for st in workers:
        if st.proc and st.proc.stdin:
            with contextlib.suppress(OSError):
                st.proc.stdin.write(b"go\n")
                st.proc.stdin.flush()


def _consume(st: WorkerState, chunk: bytes, now: float) -> None:
    for msg in messages(st, chunk, now):
        ev = msg.get("ev")
        if ev == "phase" and msg.get("phase") in PHASES:
            st.phase, st.entered = str(msg["phase"]), now
        elif ev == "device":
            st.device = {k: v for k, v in msg.items() if k not in ("ev", "t")}
        elif ev == "measured":
            st.figures[str(msg["kind"])] = float(msg["value"])
        elif ev == "done":
            st.phase, st.entered = "done", now
            st.phase_s = {str(k): float(v) for k, v in dict(msg.get("phase_s", {})).items()}
        elif ev == "error":
            st.error = str(msg.get("error"))
            st.traceback = str(msg.get("traceback", ""))


def _late(workers: Sequence[WorkerState], opts: SpeedOptions, now: float,
          started: float) -> Failure | None:
    late = [st for st in workers if st.phase not in ("done", "ready")
            and now - st.entered > opts.deadline(st.phase)]
    if late:
        st = late[0]
        silent = now - st.last_beat > HEARTBEAT_SILENT_S
        beat = (f" (no heartbeat for {now - st.last_beat:.0f} s: the process is frozen)" if silent
                else " (heartbeats still arrive: the GPU or driver does not finish the work)")
        return Failure("stalled", f"the worker for {st.label} stalled in {st.phase} after "
                            f"{now - st.entered:.1f} s (deadline {opts.deadline(st.phase):g} s)"
                            f"{beat}{_others(workers, late)}", tuple(s.rank for s in late))
    if now - started > opts.timeout_s:
        slow = [st for st in workers if st.phase != "done"]
        return Failure("timeout", f"the run did not finish within {opts.timeout_s:g} s; "
                            + ", ".join(f"{st.label} in {st.phase}" for st in slow),
                            tuple(st.rank for st in slow))
    return None


def _others(workers: Sequence[WorkerState], skip: Sequence[WorkerState]) -> str:
    rest = [f"{st.label} reached {st.phase}" for st in workers if st not in skip]
    return "; " + "; ".join(rest) if rest else ""


def _broken(workers: Sequence[WorkerState]) -> Failure:
    errs = [st for st in workers if st.error]
    if errs:
        st = errs[0]
        return Failure("error", f"the worker for {st.label} failed in {st.phase}: "
                            f"{st.error}", tuple(s.rank for s in errs))
    dead = [st for st in workers if st.proc and st.proc.poll() not in (None, 0)]
    st = dead[0]
    how = _exit_text(st.proc.poll() if st.proc else None)
    return Failure("died", f"the worker for {st.label} {how} in {st.phase} without a report",
                        tuple(s.rank for s in dead))
