"""What a run of the GPU workers is asked to do: its steps, their options and deadlines.

A run is one worker process per GPU (or per gloo rank) with a plan of steps: the speed step
(:class:`SpeedOptions`), the all-reduce step (:class:`BenchOptions`), or both in that order
(:class:`RunOptions`). :meth:`RunOptions.plan` writes each worker's plan for
:mod:`preflight.bench.worker.main`. Deadlines (docs/bandwidth.md, docs/gpu-speed.md) come from
each step's ``timeout_s``: :class:`Limits`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from preflight.bench.worker import wire


@dataclass(frozen=True)
class Deadlines:
    """The all-reduce's deadlines, seconds, from its ``timeout_s``: spawn (start, imports) and
    init (rendezvous, communicator) half of it, at most 60 s; each warm-up / measure / verify of
    one size a quarter, between 2 and 30 s; the whole step ``timeout_s``."""

    total_s: float
    spawn_s: float
    init_s: float
    step_s: float

    @classmethod
    def from_timeout(cls, timeout_s: float) -> Deadlines:
        return cls(total_s=timeout_s, spawn_s=min(60.0, timeout_s / 2),
                   init_s=min(60.0, timeout_s / 2), step_s=min(30.0, max(2.0, timeout_s / 4)))


class StoreRelay(Protocol):
    """Publish / fetch with a deadline through the cluster's store (``preflight cluster`` passes
    its own client, scoped to the group's key prefix; nothing here imports torch)."""

    #: Where a value is published, for messages ("the store at HOST:PORT, key K").
    where: str

    def set(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key``; raises when the store does not answer."""

    def get(self, key: str, timeout_s: float) -> str | None:
        """The value of ``key`` once set, None when it is not set within ``timeout_s``; raises
        when the store does not answer."""


@dataclass(frozen=True)
class WorldSpec:
    """Multi-node only (``preflight cluster``): this node's workers are ranks ``rank_offset`` ..
    ``rank_offset + nproc - 1`` of a world of ``world_size`` ranks over several nodes, clients of
    the store the cluster agent reaches (``store_host:store_port``, keys under ``store_prefix``)
    instead of a store of rank 0 on 127.0.0.1. The nccl4py engine's unique id crosses nodes
    through ``relay`` (:mod:`preflight.bench.relay`); None: torch only."""

    store_host: str
    store_port: int
    store_prefix: str
    rank_offset: int
    world_size: int
    relay: StoreRelay | None = field(default=None, compare=False)


@dataclass(frozen=True)
class BenchOptions:
    """The all-reduce. ``labels`` names each rank's device in messages ("GPU 1, 0000:00:07.0");
    rank r uses cuda:r (CPU with gloo). ``iters`` / ``warmup``: :data:`wire.ITERATIONS`."""

    backend: str
    nproc: int
    sizes: tuple[int, ...]
    timeout_s: float
    iters: int = 20
    warmup: int = 5
    debug: bool = False
    labels: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    python: str = sys.executable
    #: "auto" (nccl4py when the interpreter has it, else torch), "torch" or "nccl4py".
    engine: str = "auto"
    #: nccl4py's buffer: "device" (cuMemAlloc) or "nccl" (ncclMemAlloc).
    alloc: str = "device"
    #: nccl4py: load this libnccl (the training environment's) before nccl4py looks for one.
    libnccl: str | None = None
    world: WorldSpec | None = None

    @property
    def world_size(self) -> int:
        """Ranks of the whole collective: ``nproc`` on one node, more with ``world``."""
        return self.world.world_size if self.world else self.nproc

    def label(self, rank: int) -> str:
        if rank < len(self.labels):
            return self.labels[rank]
        return "CPU" if self.backend == "gloo" else f"cuda:{rank}"

    @property
    def worker_engine(self) -> str:
        """The engine the workers are told: gloo is torch's; across nodes ``auto`` is torch,
        since every node must run the same engine, which one node cannot tell
        (``preflight cluster`` decides one for all and names it)."""
        if self.backend == "gloo" or (self.world is not None and self.engine == "auto"):
            return "torch"
        return self.engine

    def step(self, rank: int) -> dict[str, Any]:
        w = self.world
        return {"rank": rank + (w.rank_offset if w else 0), "world_size": self.world_size,
                "backend": self.backend, "engine": self.worker_engine,
                "sizes": list(self.sizes), "warmup": self.warmup,
                "iters": self.iters, "alloc": self.alloc, "libnccl": self.libnccl,
                "store": f"{w.store_host}:{w.store_port}" if w else None,
                "store_prefix": w.store_prefix if w else "",
                # torch's own deadline is a backstop behind the parent's, which names the rank.
                "timeout_s": self.timeout_s + 30}


@dataclass(frozen=True)
class SpeedOptions:
    """The speed step: one worker per ``bus_ids`` entry (CUDA index ``cuda_indices[i]``, label
    ``labels[i]``). Deadlines: setup (memory, cuBLAS) min(20, timeout / 2); each measurement
    min(10, max(2, timeout / 4)); the whole step (start-up included) ``timeout_s``."""

    bus_ids: tuple[str, ...]
    cuda_indices: tuple[int, ...]
    labels: tuple[str, ...]
    timeout_s: float
    engine: str = "auto"
    kinds: tuple[str, ...] = wire.SPEED_KINDS
    env: Mapping[str, str] | None = None
    python: str = sys.executable
    debug: bool = False

    def step(self) -> dict[str, Any]:
        return {"engine": self.engine, "kinds": list(self.kinds), "timeout_s": self.timeout_s}


@dataclass(frozen=True)
class DdpStep:
    """One step of the DDP ladder: ``name`` (:data:`wire.DDP_STEPS`), ``backend`` (gloo, nccl;
    None: no process group, each rank alone) and whether the model is on the rank's GPU."""

    name: str
    backend: str | None
    gpu: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "gpu": self.gpu}


#: The DDP workers' start-up deadline (the interpreter, torch's import, the CUDA context): torch's
#: import alone takes 2-6 s, more from a cold network filesystem.
DDP_START_S = 60.0


@dataclass(frozen=True)
class DdpOptions:
    """The DDP ladder (``preflight ddp``): ``nproc`` workers, one per local rank, each running
    ``steps`` in order on the parent's go (:mod:`preflight.bench.worker.ddp`).

    The workers get the job's environment (``env``) as torchrun would give it to a training script:
    ``LOCAL_RANK``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` set per rank, nothing else
    changed (no ``CUDA_DEVICE_ORDER``: the device mapping is the job's), plus ``NCCL_DEBUG=WARN``
    (``INFO`` with ``debug``) where NCCL_DEBUG is unset, so that NCCL's warnings reach the worker's
    log. Deadlines from ``timeout_s`` (each step): the process group and DDP's first broadcast half
    of it, at most 60 s; every other phase (set-up, each forward / backward / optimizer step of an
    iteration, the check, the teardown) a quarter, between 2 and 30 s; the step as a whole
    ``timeout_s``; the start-up :data:`DDP_START_S`."""

    steps: tuple[DdpStep, ...]
    nproc: int
    timeout_s: float
    labels: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    python: str = sys.executable
    debug: bool = False
    world: WorldSpec | None = None

    @property
    def init_s(self) -> float:
        return min(60.0, self.timeout_s / 2)

    @property
    def phase_s(self) -> float:
        return min(30.0, max(2.0, self.timeout_s / 4))

    @property
    def world_size(self) -> int:
        return self.world.world_size if self.world else self.nproc

    def label(self, rank: int) -> str:
        if rank < len(self.labels):
            return self.labels[rank]
        return f"cuda:{rank}" if any(s.gpu for s in self.steps) else "CPU"

    def env_for(self, rank: int) -> dict[str, str]:
        """Local rank ``rank``'s environment."""
        import os

        env = dict(os.environ if self.env is None else self.env)
        offset = self.world.rank_offset if self.world else 0
        env.update(LOCAL_RANK=str(rank), RANK=str(offset + rank), WORLD_SIZE=str(self.world_size),
                   LOCAL_WORLD_SIZE=str(self.nproc), PYTHONUNBUFFERED="1")
        env.setdefault("NCCL_DEBUG", "INFO" if self.debug else "WARN")
        if self.debug:
            env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET,GRAPH")
        return env

    def step(self) -> dict[str, Any]:
        w = self.world
        return {"steps": [s.to_json() for s in self.steps],
                "store": f"{w.store_host}:{w.store_port}" if w else None,
                "store_prefix": w.store_prefix if w else "",
                "timeout_s": self.timeout_s, "init_s": self.init_s, "phase_s": self.phase_s}


@dataclass(frozen=True)
class Limits:
    """Every deadline of one run, seconds (None: that step is not in the run)."""

    start_s: float
    speed_setup_s: float | None = None
    speed_measure_s: float | None = None
    speed_total_s: float | None = None
    init_s: float | None = None
    step_s: float | None = None
    allreduce_total_s: float | None = None
    #: the DDP ladder: its process group and first broadcast, every other phase, each step
    ddp_init_s: float | None = None
    ddp_phase_s: float | None = None
    ddp_total_s: float | None = None

    def for_phase(self, step: str, phase: str) -> float | None:
        """The deadline of one phase; None where none applies (``ready``: waiting for the
        others' setup, which has its own, or for the parent's go; ``done``)."""
        if step == wire.START:
            return self.start_s
        if step == wire.SPEED:
            return {"setup": self.speed_setup_s, "ready": None}.get(phase, self.speed_measure_s)
        if step == wire.ALLREDUCE:
            return self.init_s if phase == "init" else self.step_s
        if step in wire.DDP_STEPS and phase != "ready":
            return self.ddp_init_s if phase in ("init", "wrap") else self.ddp_phase_s
        return None


@dataclass(frozen=True)
class RunOptions:
    """One run: the speed step, the all-reduce, or both (one worker per rank of the all-reduce,
    which measures its GPU first when that GPU is one of ``speed``'s)."""

    speed: SpeedOptions | None = None
    allreduce: BenchOptions | None = None
    #: the DDP ladder, which runs alone (never with the other two)
    ddp: DdpOptions | None = None

    @classmethod
    def combine(cls, speed: SpeedOptions, allreduce: BenchOptions) -> RunOptions | None:
        """Both steps in one run, or None when they cannot share workers: another interpreter
        or environment, the CPU, a world across nodes, a GPU to measure that is no rank."""
        # gloo runs on the CPU: only the cpu engine's plumbing test can measure there.
        cpu_only = allreduce.backend == "gloo" and speed.engine == "cpu"
        if (speed.python != allreduce.python or dict(speed.env or {}) != dict(allreduce.env or {})
                or (allreduce.backend != "nccl" and not cpu_only) or allreduce.world is not None
                or any(i >= allreduce.nproc for i in speed.cuda_indices)):
            return None
        return cls(speed=speed, allreduce=allreduce)

    @property
    def python(self) -> str:
        step = self.allreduce or self.speed or self.ddp
        return step.python if step is not None else sys.executable

    @property
    def env(self) -> Mapping[str, str] | None:
        step = self.allreduce or self.speed or self.ddp
        return step.env if step is not None else None

    @property
    def debug(self) -> bool:
        return bool((self.allreduce and self.allreduce.debug) or (self.speed and self.speed.debug)
                    or (self.ddp and self.ddp.debug))

    @property
    def count(self) -> int:
        if self.ddp is not None:
            return self.ddp.nproc
        return self.allreduce.nproc if self.allreduce else len(self.speed.bus_ids) \
            if self.speed else 0

    def label(self, i: int) -> str:
        if self.ddp is not None:
            return self.ddp.label(i)
        if self.allreduce is not None:
            return self.allreduce.label(i)
        assert self.speed is not None
        return self.speed.labels[i]

    def measures(self, i: int) -> bool:
        return self.speed is not None and (self.allreduce is None or i in self.speed.cuda_indices)

    def plan(self, i: int) -> dict[str, Any]:
        """Worker ``i``'s plan (the JSON :mod:`preflight.bench.worker.main` reads)."""
        if self.ddp is not None:
            return {"label": self.label(i), "device": None, "bus_id": None,
                    "ddp": self.ddp.step()}
        ar, sp = self.allreduce, self.speed
        device: int | None = None if ar is not None and ar.backend == "gloo" else i
        bus_id = None
        if sp is not None and ar is None:
            device, bus_id = sp.cuda_indices[i], sp.bus_ids[i]
        elif sp is not None and i in sp.cuda_indices:
            bus_id = sp.bus_ids[sp.cuda_indices.index(i)]
        return {"label": self.label(i), "device": device, "bus_id": bus_id,
                "speed": sp.step() if self.measures(i) and sp is not None else None,
                "allreduce": ar.step(i) if ar is not None else None}

    def limits(self) -> Limits:
        if self.ddp is not None:
            return Limits(start_s=DDP_START_S, ddp_init_s=self.ddp.init_s,
                          ddp_phase_s=self.ddp.phase_s, ddp_total_s=self.ddp.timeout_s)
        sp, ar = self.speed, self.allreduce
        d = Deadlines.from_timeout(ar.timeout_s) if ar else None
        speed_start = min(20.0, sp.timeout_s / 2) if sp else 0.0
        return Limits(start_s=max(speed_start, d.spawn_s if d else 0.0),
                      speed_setup_s=min(20.0, sp.timeout_s / 2) if sp else None,
                      speed_measure_s=min(10.0, max(2.0, sp.timeout_s / 4)) if sp else None,
                      speed_total_s=sp.timeout_s if sp else None,
                      init_s=d.init_s if d else None, step_s=d.step_s if d else None,
                      allreduce_total_s=d.total_s if d else None)

