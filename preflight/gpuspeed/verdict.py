"""Judging a speed run (pure): each figure against its hardware limit and the node's median.

- ``GpuSlow`` (FAIL): a GPU's figure below ``slow_fraction`` x the median of that figure over the
  node's measured GPUs (needs 2 or more), naming the GPU and what NVML says about why.
- ``GpuBelowLimit`` (WARN): a figure below ``warn_fraction`` of its hardware limit
  (:mod:`preflight.gpuspeed.limits`) on every GPU alike (a slow node, not a slow GPU).
- ``GpuStalled`` (FAIL): a worker missed a measurement deadline (the GPU did not finish work).
- ERROR: a worker died, raised or the run passed its deadline (could not decide).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from preflight.core.result import Status
from preflight.gpuspeed.limits import KINDS, UNITS, WORDS, Limit, limits_for
from preflight.gpuspeed.probe import SpeedRun
from preflight.probes.gpu import Gpu
from preflight.probes.pci import normalize_bus_id

DOC = "docs/gpu-speed.md"
REMEDY_SLOW = ("Drain the node and look at that GPU: nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,"
               "TEMPERATURE -i {index}; reset clocks and power limit with nvidia-smi -rac -i "
               "{index} and nvidia-smi -pl <default W> -i {index}; if it stays slow, run dcgmi "
               "diag -r 3 -i {index} and have the GPU replaced ({doc}).")
REMEDY_LIMIT = ("Compare with docs/benchmarks.md; check that no other process uses the GPUs "
                "(nvidia-smi), the PCIe slots train at full width (nvidia-smi -q -d PCIE) and "
                "clocks and power limits are at their defaults ({doc}).")


@dataclass(frozen=True)
class Figure:
    kind: str
    value: float
    limit: Limit | None
    median: float | None

    @property
    def fraction(self) -> float | None:
        return self.value / self.limit.value if self.limit and self.limit.value else None

    @property
    def ratio(self) -> float | None:
        return self.value / self.median if self.median else None

    def text(self) -> str:
        unit = UNITS[self.kind]
        lim = (f", {self.fraction:.2f} of {self.limit.value:,.0f} {unit} ({self.limit.source})"
               if self.limit and self.fraction is not None else ", no known limit")
        return f"{WORDS[self.kind]} {self.value:,.1f} {unit}{lim}"

    def to_json(self) -> dict[str, Any]:
        return {"value": round(self.value, 3), "unit": UNITS[self.kind],
                "limit": round(self.limit.value, 3) if self.limit else None,
                "limit_source": self.limit.source if self.limit else None,
                "limit_fraction": round(self.fraction, 4) if self.fraction is not None else None,
                "median": round(self.median, 3) if self.median is not None else None,
                "median_ratio": round(self.ratio, 4) if self.ratio is not None else None}


@dataclass(frozen=True)
class GpuVerdict:
    gpu: Gpu
    figures: tuple[Figure, ...]
    device: Mapping[str, Any]
    phase_s: Mapping[str, float]
    slow: tuple[Figure, ...] = ()
    below: tuple[Figure, ...] = ()

    def name(self) -> str:
        return f"GPU {self.gpu.index} ({self.gpu.pci_bus_id}, {self.gpu.uuid})"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.gpu.index, "pci_bus_id": self.gpu.pci_bus_id,
                "uuid": self.gpu.uuid, "name": self.gpu.name or self.device.get("name"),
                "figures": {f.kind: f.to_json() for f in self.figures},
                "slow": [f.kind for f in self.slow], "below_limit": [f.kind for f in self.below],
                "device": dict(self.device), "phase_s": dict(self.phase_s)}


@dataclass(frozen=True)
class SpeedVerdict:
    status: Status
    reason: str
    message: str
    remedy: str = ""
    gpus: tuple[GpuVerdict, ...] = ()
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.word, "reason": self.reason, "message": self.message,
                "gpus": [g.to_json() for g in self.gpus], "notes": list(self.notes),
                **self.extra}


def why(gpu: Gpu, kinds: Sequence[str]) -> str:
    """What NVML says that can make a GPU slow: clock-event reasons, clocks, power, PCIe, heat,
    other processes. Read right after the measurement."""
    parts = []
    clk = gpu.clocks
    if clk is not None:
        reasons = [r for r in clk.clock_reasons if r != "GpuIdle"]
        parts.append("clock event reasons " + (", ".join(reasons) if reasons else "none"))
        if clk.sm_clock_mhz is not None and clk.max_sm_clock_mhz:
            parts.append(f"SM clock {clk.sm_clock_mhz}/{clk.max_sm_clock_mhz} MHz")
        if clk.power_limit_w is not None:
            default = (f" (default {clk.default_power_limit_w:.0f} W)"
                       if clk.default_power_limit_w is not None
                       and abs(clk.default_power_limit_w - clk.power_limit_w) >= 1 else "")
            draw = f", drawing {clk.power_w:.0f} W" if clk.power_w is not None else ""
            parts.append(f"power limit {clk.power_limit_w:.0f} W{default}{draw}")
        if clk.temperature_c is not None:
            parts.append(f"{clk.temperature_c} C")
    if gpu.pcie is not None and ({"h2d", "d2h"} & set(kinds) or
                                 gpu.pcie.width < gpu.pcie.max_width):
        p = gpu.pcie
        parts.append(f"PCIe Gen{p.gen} x{p.width} (max Gen{p.max_gen} x{p.max_width})")
    if gpu.compute_pids:
        parts.append("other processes on it: pid " + ", ".join(map(str, gpu.compute_pids)))
    return "NVML: " + "; ".join(parts) if parts else "NVML gave no clocks or power figures"


REMEDY_ENGINE = ("Install the torch-free engine in the interpreter the workers run under "
                 "({python}): pip install 'cluster-preflight[gpuspeed]' (cuda-bindings, "
                 "cuda-pathfinder; cuBLAS from the CUDA install or the nvidia-cublas wheel), or "
                 "a CUDA build of torch; or name an interpreter that has one with --python "
                 "({doc}).")
REMEDY_KEEP = ("Run preflight bench --gpu --debug to keep the workers' output (the directory is "
               "printed); {doc} says what each phase does.")


def _failed(run: SpeedRun, extra: dict[str, Any]) -> SpeedVerdict:
    f = run.failure
    assert f is not None
    extra["failure"] = {"kind": f.kind, "message": f.message, "bus_ids": list(f.bus_ids)}
    python = run.environment.get("python") or "the workers' interpreter"
    if f.kind == "engine":
        return SpeedVerdict(Status.SKIP, "EngineMissing", f"no GPU speed test: {f.message}",
                            REMEDY_ENGINE.format(python=python, doc=DOC), extra=extra)
    if f.kind == "stalled":
        return SpeedVerdict(Status.FAIL, "GpuStalled", f.message,
                            "The GPU did not finish a copy or a multiply within its deadline: "
                            "look for Xid errors (dmesg | grep -i xid) and drain the node "
                            f"({DOC}).", extra=extra)
    if f.kind in ("timeout", "slow_start"):
        return SpeedVerdict(Status.ERROR, "WorkerStartSlow" if f.kind == "slow_start"
                            else "GpuSpeedTimeout", f.message,
                            "Raise gpu_speed_timeout_s (preflight bench --gpu --timeout S); a "
                            "slow start is often the filesystem the environment lives on (a cold "
                            "NFS cache).", extra=extra)
    reason = {"died": "WorkerDied", "spawn": "WorkerSpawnFailed"}.get(f.kind, "WorkerFailed")
    # A worker that died without a report: the last line of its output says what it saw.
    last = f.traceback.strip().splitlines()[-1][-300:] if f.traceback.strip() else ""
    tail = f" | last output: {last}" if last and f.kind == "died" else ""
    return SpeedVerdict(Status.ERROR, reason, f.message + tail, REMEDY_KEEP.format(doc=DOC),
                        extra=extra)


def judge(run: SpeedRun, gpus: Sequence[Gpu], *, slow_fraction: float, warn_fraction: float,
          after: Mapping[str, Gpu] | None = None, notes: Sequence[str] = ()) -> SpeedVerdict:
    """The verdict of ``run`` over ``gpus`` (NVML, before the run); ``after`` is NVML read again
    after the run (by bus id) for the reasons of a slow GPU."""
    extra: dict[str, Any] = {"elapsed_s": round(run.elapsed_s, 3), "slow_fraction": slow_fraction,
                             "warn_fraction": warn_fraction, "failure": None,
                             "teardown_s": round(run.teardown_s, 4)
                             if run.teardown_s is not None else None,
                             "environment": dict(run.environment),
                             "debug_log": run.debug_log}
    by_bus = {normalize_bus_id(g.pci_bus_id): g for g in gpus}
    measured = [(by_bus[normalize_bus_id(m.bus_id)], m) for m in run.measures
                if normalize_bus_id(m.bus_id) in by_bus]
    if run.failure is not None:
        return _failed(run, extra)
    if not measured:
        return SpeedVerdict(Status.ERROR, "NoMeasurement", "the workers reported no figures",
                            extra=extra)
    medians = {k: statistics.median(m.figures[k] for _, m in measured)
               for k in KINDS if all(k in m.figures for _, m in measured)}
    compare = len(measured) >= 2
    verdicts = []
    for gpu, m in measured:
        dev = m.device
        cap = dev.get("capability")
        clk = gpu.clocks
        # The cpu engine is a plumbing test: a GPU's limits say nothing about host memcpy.
        limits = {} if dev.get("engine") == "cpu" else limits_for(
            name=gpu.name or str(dev.get("name", "")),
            pcie_gen=gpu.pcie.max_gen if gpu.pcie else None,
            pcie_width=gpu.pcie.max_width if gpu.pcie else None,
            bus_width_bits=(clk.mem_bus_width_bits if clk and clk.mem_bus_width_bits
                            else dev.get("bus_width_bits")),
            max_mem_clock_mhz=clk.max_mem_clock_mhz if clk else None,
            sm_count=dev.get("sm_count"), max_sm_clock_mhz=clk.max_sm_clock_mhz if clk else None,
            capability=(int(cap[0]), int(cap[1])) if cap else None)
        figs = tuple(Figure(k, m.figures[k], limits.get(k), medians.get(k) if compare else None)
                     for k in KINDS if k in m.figures)
        slow = tuple(f for f in figs if f.ratio is not None and f.ratio < slow_fraction)
        below = tuple(f for f in figs if f.fraction is not None and f.fraction < warn_fraction)
        verdicts.append(GpuVerdict(gpu, figs, dev, m.phase_s, slow, below))
    all_notes = list(notes)
    if not compare:
        all_notes.append("1 GPU measured: no peer to compare with, judged against its limits only")
    summary = "; ".join(f"GPU {v.gpu.index}: " + ", ".join(
        f"{f.kind} {f.value:,.0f}" + (f" ({f.fraction:.2f})" if f.fraction is not None else "")
        for f in v.figures) for v in verdicts)
    tail = (f" [{'; '.join(all_notes)}]" if all_notes else "")
    slow_gpus = [v for v in verdicts if v.slow]
    if slow_gpus:
        later = after or {}
        lines = []
        for v in slow_gpus:
            nv = later.get(normalize_bus_id(v.gpu.pci_bus_id), v.gpu)
            what = "; ".join(f"{f.text()} = {f.ratio:.2f} x the node median {f.median:,.1f}"
                             for f in v.slow if f.ratio is not None and f.median is not None)
            lines.append(f"{v.name()} is slow: {what} (FAIL below {slow_fraction:g} x median); "
                         f"{why(nv, [f.kind for f in v.slow])}")
        first = slow_gpus[0].gpu.index
        return SpeedVerdict(Status.FAIL, "GpuSlow", " | ".join(lines) + tail,
                            REMEDY_SLOW.format(index=first, doc=DOC), tuple(verdicts),
                            tuple(all_notes), extra)
    low = [v for v in verdicts if v.below]
    if low:
        text = " | ".join(f"{v.name()}: " + "; ".join(f.text() for f in v.below)
                          + f" (WARN below {warn_fraction:g} of the limit)" for v in low)
        return SpeedVerdict(Status.WARN, "GpuBelowLimit", text + tail,
                            REMEDY_LIMIT.format(doc=DOC), tuple(verdicts), tuple(all_notes),
                            extra)
    return SpeedVerdict(Status.PASS, "GpuSpeedOk",
                        f"{len(verdicts)} GPU{'s' if len(verdicts) > 1 else ''} measured; "
                        f"{summary} (GB/s, TFLOP/s; fraction of the limit){tail}",
                        gpus=tuple(verdicts), notes=tuple(all_notes), extra=extra)
