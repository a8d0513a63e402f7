"""What the parent knows of each worker while a run goes on, and what a run returns.

:class:`WorkerState` is filled from a worker's progress pipe and its exit status (by
:mod:`preflight.bench.protocol`); :class:`RunRecord` and :class:`SpeedRecord` are what
:mod:`preflight.bench.session` returns of the all-reduce step and the speed step;
:class:`Failure` is a worker's failure in words. The phase names (``PHASE_TIMES``,
``SPEED_TIMES``, ``DDP_TIMES``) are the keys of the JSON's phase times.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from preflight.bench.options import BenchOptions, SpeedOptions
from preflight.bench.worker import wire
from preflight.core.units import fmt_bytes

#: Phase durations of the all-reduce's record, in the order they happen (``bench --json``
#: ``phase_times_s``; ``waiting`` only for a worker started before its plan, ``speed`` only when
#: the speed step ran first in the same workers).
PHASE_TIMES = ("interpreter", "imports", "waiting", "cuda_context", "speed", "nccl_init",
               "allocation", "warmup", "sweep", "teardown")
#: Phase durations of the speed record (``bench --gpu --json`` ``gpus[].phase_s``).
SPEED_TIMES = ("interpreter", "imports", "waiting", "cuda_context", "setup", *wire.SPEED_KINDS,
               "close")
#: Phase durations of one DDP step (``preflight ddp --json`` ``steps[].phase_s``).
DDP_TIMES = ("setup", "init", "wrap", "train", "check", "teardown")
PHASE_WORDS = {"spawn": "spawn", "imports": "import", "context": "CUDA context creation",
               "warmup": "warm-up"}
#: Where a DDP worker is, in words: "backward of iteration 3 (step gloo)".
_DDP_WHERE = {"ready": "waiting for the go", "init": "init_process_group",
              "wrap": "DDP(...) (its broadcast)", "optimizer": "optimizer.step()",
              "teardown": "the barrier and teardown"}
_DONE_ORDER = 1 << 30


@dataclass
class WorkerState:
    """What the parent knows about one worker, from its progress pipe and its exit status.
    ``rank``: the worker's index, which is its all-reduce rank on this node."""

    rank: int
    label: str
    measures: bool = False
    reduces: bool = False
    #: the GPU the plan names (NVML's PCI bus id; None: by CUDA index, or the CPU)
    bus_id: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    step: str = wire.START
    phase: str = "spawn"
    size: int | None = None
    order: int = 0
    entered: float = 0.0
    last_beat: float = 0.0
    #: the worker has sent at least one line (its interpreter is running)
    heard: bool = False
    #: filled by the parent's loop before each diagnosis: exit status (None: running) and the
    #: kernel's state letter (``/proc/PID/stat``)
    exit_code: int | None = None
    kernel_state: str | None = None
    stopped_since: float | None = None
    error: str | None = None
    traceback: str = ""
    buffer: bytes = b""
    #: wall clock (time.time) when the parent started this worker
    spawned_wall: float = 0.0
    pci_bus_id: str | None = None
    device: dict[str, Any] = field(default_factory=dict)
    #: step -> what it needs that this interpreter lacks; what stopped an engine that imported
    missing: dict[str, str] = field(default_factory=dict)
    missing_why: dict[str, str] = field(default_factory=dict)
    steps_done: set[str] = field(default_factory=set)
    start_times: dict[str, float] = field(default_factory=dict)
    loaded: dict[str, Any] = field(default_factory=dict)
    # the all-reduce
    engine: str | None = None
    nccl_version: str | None = None
    times: dict[int, float] = field(default_factory=dict)
    verified: dict[int, dict[str, Any]] = field(default_factory=dict)
    first_allreduce_s: float | None = None
    allreduce_times: dict[str, float] = field(default_factory=dict)
    # the speed step
    speed_engine: str | None = None
    dtype: str | None = None
    figures: dict[str, float] = field(default_factory=dict)
    speed_times: dict[str, float] = field(default_factory=dict)
    # the DDP ladder: per step, what the rank showed (``ddp_facts``) and its phase seconds
    ddp: dict[str, dict[str, Any]] = field(default_factory=dict)
    ddp_times: dict[str, dict[str, float]] = field(default_factory=dict)
    #: NCCL's WARN lines in this worker's log, kept at the end of the run (the log may go)
    nccl_warnings: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return self.phase == wire.DONE_PHASE

    @property
    def libnccl(self) -> str | None:
        lib = self.loaded.get("libnccl")
        return str(lib["path"]) if isinstance(lib, dict) and lib.get("path") else None

    def where(self) -> str:
        if self.step in wire.DDP_STEPS and self.phase in wire.DDP_PHASES:
            word = _DDP_WHERE.get(self.phase, PHASE_WORDS.get(self.phase, self.phase))
            at = f" of iteration {self.size}" if self.size is not None else ""
            return f"{word}{at} (step {self.step})"
        word = PHASE_WORDS.get(self.phase, self.phase)
        return f"{word} of {fmt_bytes(self.size)}" if self.size is not None else word


def progress_order(step: str, phase: str, size: int | None, sizes: tuple[int, ...]) -> int:
    """How far a worker got, as one number (the lowest is behind the others)."""
    if phase == wire.DONE_PHASE:
        return _DONE_ORDER
    if step == wire.START:
        return wire.START_PHASES.index(phase) if phase in wire.START_PHASES else 0
    if step == wire.SPEED:
        return 10 + (wire.SPEED_PHASES.index(phase) if phase in wire.SPEED_PHASES else 9)
    if step in wire.DDP_STEPS:
        # Steps in ladder order; in a step, its phases, each iteration's three in turn.
        base = 1000 * (1 + wire.DDP_STEPS.index(step))
        phases = wire.DDP_PHASES
        if phase in wire.DDP_ITERATION_PHASES:
            return base + 10 + 3 * (size or 0) + wire.DDP_ITERATION_PHASES.index(phase)
        at = phases.index(phase) if phase in phases else 0
        return base + at if at < phases.index("forward") else base + 900 + at
    if phase == "init":
        return 100
    index = sizes.index(size) if size in sizes else 0
    return 101 + 3 * index + ("warmup", "measure", "verify").index(phase) \
        if phase in ("warmup", "measure", "verify") else 100


@dataclass(frozen=True)
class Failure:
    """Why the run did not complete. ``kind``: stalled, hung, died, error, timeout, spawn,
    slow_start, engine (the interpreter lacks every engine of a step). ``ranks``: workers."""

    kind: str
    message: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RunRecord:
    """The all-reduce as the workers reported it; judged by :mod:`preflight.bench.verdict`."""

    options: BenchOptions
    ranks: tuple[WorkerState, ...]
    failure: Failure | None
    store_port: int | None
    log_dir: str | None
    elapsed_s: float
    #: seconds from the last rank's "done" to every worker's exit (communicator and CUDA
    #: context torn down)
    teardown_s: float | None = None
    #: NCCL files the workers left in /dev/shm, removed by the parent (bench/leftovers.py)
    shm_removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpeedRecord:
    """The speed step as the workers reported it (:mod:`preflight.gpuspeed.probe` reads it)."""

    options: SpeedOptions
    workers: tuple[WorkerState, ...]
    failure: Failure | None
    elapsed_s: float
    log_dir: str | None = None
    #: seconds from the last figure to every worker's exit (None: they went on to the all-reduce)
    teardown_s: float | None = None
