"""Where per-GPU speed figures come from: the real workers, or a fixture (tests, demos).

The same split as the NVML probe (:mod:`preflight.probes.gpu`): the check asks a
:class:`SpeedProbe` for a :class:`SpeedRun` and only judges it, so tests replace the measurement
with a JSON fixture (``PREFLIGHT_GPU_SPEED_FIXTURE``) and exercise every verdict on CPU.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from preflight.bench.options import SpeedOptions
    from preflight.bench.records import SpeedRecord

FIXTURE_ENV = "PREFLIGHT_GPU_SPEED_FIXTURE"


@dataclass(frozen=True)
class Target:
    """One GPU to measure: NVML's PCI bus id, the CUDA index the worker sees it at, a label."""

    bus_id: str
    cuda_index: int
    label: str


@dataclass(frozen=True)
class GpuMeasure:
    """One GPU's figures (``h2d``/``d2h``/``d2d`` GB/s, ``gemm`` TFLOP/s), facts from CUDA
    (``name``, ``capability``, ``sm_count``, ``bus_width_bits``) and from the worker that
    measured it (``engine``, ``dtype``, ``pid``)."""

    bus_id: str
    figures: Mapping[str, float]
    device: Mapping[str, Any] = field(default_factory=dict)
    phase_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SpeedFailure:
    """The run did not complete: ``kind`` stalled, slow_start, timeout, died, error, spawn,
    engine (the interpreter has no engine that runs here: ``message`` says what it lacks)."""

    kind: str
    message: str
    bus_ids: tuple[str, ...] = ()
    traceback: str = ""


@dataclass(frozen=True)
class SpeedRun:
    """What the workers measured; ``environment``: the interpreter and what it loaded, from where
    (``python``, ``torch``, ``cuda_bindings``, ``libcublas``, ...)."""

    measures: tuple[GpuMeasure, ...]
    failure: SpeedFailure | None = None
    elapsed_s: float = 0.0
    environment: Mapping[str, Any] = field(default_factory=dict)
    #: the workers' output, kept with ``preflight bench --gpu --debug``
    debug_log: str | None = None
    #: seconds from the last figure to the workers' exit (None: they went on to the all-reduce)
    teardown_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SpeedRun:
        fail = data.get("failure")
        return cls(
            measures=tuple(GpuMeasure(bus_id=str(m["bus_id"]),
                                      figures={str(k): float(v) for k, v in m["figures"].items()},
                                      device=dict(m.get("device", {})),
                                      phase_s=dict(m.get("phase_s", {})))
                           for m in data.get("measures", ())),
            failure=SpeedFailure(str(fail["kind"]), str(fail["message"]),
                                 tuple(fail.get("bus_ids", ())), str(fail.get("traceback", "")))
            if fail else None,
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            environment=dict(data.get("environment") or {}),
            debug_log=str(data["debug_log"]) if data.get("debug_log") else None,
            teardown_s=float(data["teardown_s"]) if data.get("teardown_s") is not None else None)


class SpeedProbe(Protocol):
    """Anything that measures the given GPUs (the workers, or a fixture in tests)."""

    def measure(self, targets: Sequence[Target]) -> SpeedRun: ...


class FixtureSpeedProbe:
    """Answers from a SpeedRun JSON file, read when asked (a bad file is that check's ERROR)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def measure(self, targets: Sequence[Target]) -> SpeedRun:
        try:
            return SpeedRun.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RuntimeError(f"GPU speed fixture {self.path} unusable: {exc}") from exc


class WorkerSpeedProbe:
    """Measures for real: one GPU worker per GPU (:mod:`preflight.bench.parent`); through
    ``run`` (this run's :class:`~preflight.bench.session.GpuTests`, which may let the workers go
    on into the all-reduce) when given."""

    def __init__(self, *, python: str | None = None, engine: str = "auto",
                 timeout_s: float = 30.0, env: Mapping[str, str] | None = None,
                 debug: bool = False, run: Any = None) -> None:
        self.python = python or sys.executable
        self.engine = engine
        self.timeout_s = timeout_s
        self.env = env
        self.debug = debug
        self.run = run

    def options(self, targets: Sequence[Target]) -> SpeedOptions:
        from preflight.bench.options import SpeedOptions

        return SpeedOptions(bus_ids=tuple(t.bus_id for t in targets),
                            cuda_indices=tuple(t.cuda_index for t in targets),
                            labels=tuple(t.label for t in targets), timeout_s=self.timeout_s,
                            engine=self.engine, env=self.env, python=self.python,
                            debug=self.debug)

    def measure(self, targets: Sequence[Target]) -> SpeedRun:
        from preflight.bench.parent import run_speed

        opts = self.options(targets)
        rec = self.run.speed(opts) if self.run is not None else run_speed(opts)
        return speed_run(rec)


def speed_run(rec: SpeedRecord) -> SpeedRun:
    """The workers' record as a :class:`SpeedRun`."""
    opts = rec.options
    measures = tuple(GpuMeasure(bus_id=st.bus_id or st.pci_bus_id or "",
                                figures=dict(st.figures),
                                device={**st.device, "engine": st.speed_engine,
                                        "dtype": st.dtype, "pid": st.pid},
                                phase_s={k: round(v, 4) for k, v in
                                         {**st.start_times, **st.speed_times}.items()})
                     for st in rec.workers if wire_done(st))
    failure = None
    if rec.failure is not None:
        f = rec.failure
        by_rank = {st.rank: st for st in rec.workers}
        tb = next((by_rank[i].traceback for i in f.ranks if i in by_rank
                   and by_rank[i].traceback), "")
        failure = SpeedFailure(f.kind, f.message, tuple(
            by_rank[i].bus_id or by_rank[i].pci_bus_id or "" for i in f.ranks if i in by_rank),
            tb)
    env = next((st.loaded for st in rec.workers if st.loaded), {})
    return SpeedRun(measures=measures, failure=failure, elapsed_s=rec.elapsed_s,
                    environment={"python": opts.python, **env}, debug_log=rec.log_dir,
                    teardown_s=rec.teardown_s)


def wire_done(st: Any) -> bool:
    """The worker reported its speed step done."""
    from preflight.bench.worker import wire

    return wire.SPEED in st.steps_done
