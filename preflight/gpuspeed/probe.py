"""Where per-GPU speed figures come from: the real workers, or a fixture (tests, demos).

The same split as the NVML probe (:mod:`preflight.probes.gpu`): the check asks a
:class:`SpeedProbe` for a :class:`SpeedRun` and only judges it, so tests replace the measurement
with a JSON fixture (``PREFLIGHT_GPU_SPEED_FIXTURE``) and exercise every verdict on CPU.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

FIXTURE_ENV = "PREFLIGHT_GPU_SPEED_FIXTURE"


@dataclass(frozen=True)
class Target:
    """One GPU to measure: NVML's PCI bus id, the CUDA index the worker sees it at, a label."""

    bus_id: str
    cuda_index: int
    label: str


@dataclass(frozen=True)
class GpuMeasure:
    """One GPU's figures (``h2d``/``d2h``/``d2d`` GB/s, ``gemm`` TFLOP/s) and facts from CUDA
    (``name``, ``capability``, ``sm_count``, ``bus_width_bits``, ``engine``, ``dtype``)."""

    bus_id: str
    figures: Mapping[str, float]
    device: Mapping[str, Any] = field(default_factory=dict)
    phase_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SpeedFailure:
    """The run did not complete: ``kind`` stalled, timeout, died, error, spawn, engine."""

    kind: str
    message: str
    bus_ids: tuple[str, ...] = ()
    traceback: str = ""


@dataclass(frozen=True)
class SpeedRun:
    measures: tuple[GpuMeasure, ...]
    failure: SpeedFailure | None = None
    elapsed_s: float = 0.0

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
            elapsed_s=float(data.get("elapsed_s", 0.0)))


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
    """Measures for real: one worker process per GPU (:mod:`preflight.gpuspeed.parent`)."""

    def __init__(self, *, python: str | None = None, engine: str = "auto",
                 timeout_s: float = 30.0, env: Mapping[str, str] | None = None,
                 gate: threading.Lock | None = None) -> None:
        self.python = python or sys.executable
        self.gate = gate
        self.engine = engine
        self.timeout_s = timeout_s
        self.env = env

    def measure(self, targets: Sequence[Target]) -> SpeedRun:
        from preflight.gpuspeed.parent import SpeedOptions, run_workers

        opts = SpeedOptions(bus_ids=tuple(t.bus_id for t in targets),
                            cuda_indices=tuple(t.cuda_index for t in targets),
                            labels=tuple(t.label for t in targets), timeout_s=self.timeout_s,
                            engine=self.engine, env=self.env, python=self.python,
                            gate=self.gate)
        rec = run_workers(opts)
        measures = tuple(GpuMeasure(bus_id=opts.bus_ids[st.rank], figures=dict(st.figures),
                                    device=dict(st.device), phase_s=dict(st.phase_s))
                         for st in rec.workers if st.phase == "done")
        failure = None
        if rec.failure is not None:
            f = rec.failure
            tb = next((rec.workers[i].traceback for i in f.ranks if rec.workers[i].traceback),
                      "")
            kind = f.kind
            if kind == "error" and "No module named" in f.message:
                kind = "engine"
            failure = SpeedFailure(kind, f.message, tuple(opts.bus_ids[i] for i in f.ranks), tb)
        return SpeedRun(measures=measures, failure=failure, elapsed_s=rec.elapsed_s)
