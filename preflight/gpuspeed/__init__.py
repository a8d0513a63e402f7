"""Per-GPU speed in seconds: device copy, pinned host<->device copies, dense matrix multiply.

The ``gpu_speed`` check and ``preflight bench --gpu``: :func:`run_speed` picks the GPUs CUDA
exposes (the all-reduce's :func:`preflight.bench.visible_gpus`), asks a
:class:`~preflight.gpuspeed.probe.SpeedProbe` for figures (the GPU workers of
:mod:`preflight.bench.parent`, whose speed step is :mod:`preflight.bench.worker.speed`; or a
fixture), reads NVML again when a GPU is slow (why), and judges with
:mod:`preflight.gpuspeed.verdict`. docs/gpu-speed.md explains the method and limits.
"""

from __future__ import annotations

import dataclasses
import sys

from preflight.core.context import Context
from preflight.core.result import Status
from preflight.gpuspeed.limits import KINDS, UNITS
from preflight.gpuspeed.probe import (
    FIXTURE_ENV,
    FixtureSpeedProbe,
    SpeedProbe,
    Target,
    WorkerSpeedProbe,
)
from preflight.gpuspeed.verdict import SpeedVerdict, judge
from preflight.probes.pci import normalize_bus_id


def speed_probe(ctx: Context, *, debug: bool = False) -> SpeedProbe:
    """The fixture when ``PREFLIGHT_GPU_SPEED_FIXTURE`` names a file, else the real workers (this
    run's, which go on into the all-reduce when the ``allreduce`` check follows)."""
    from preflight.bench.session import gpu_tests

    fixture = ctx.env.get(FIXTURE_ENV)
    if fixture:
        return FixtureSpeedProbe(fixture)
    cfg = ctx.config
    return WorkerSpeedProbe(python=cfg.python, engine=cfg.gpu_speed_engine,
                            timeout_s=cfg.gpu_speed_timeout_s, env=ctx.env, debug=debug,
                            run=gpu_tests(ctx))


def prestart(ctx: Context) -> None:
    """Start the speed workers now, while NVML is read (their interpreter and the driver's own
    initialisation, no GPU context: :mod:`preflight.bench.prestart`): gpu_speed's ``prepare``,
    and ``preflight bench --gpu``."""
    from preflight.bench.session import gpu_tests

    if ctx.config.gpu_prestart and not ctx.env.get(FIXTURE_ENV):
        gpu_tests(ctx).prestart(ctx.host_path("/proc/driver/nvidia/gpus"),
                                python=ctx.config.python or sys.executable, env=ctx.env)


def run_speed(ctx: Context, *, include_busy: bool, probe: SpeedProbe | None = None,
              visible_only: bool = True, debug: bool = False) -> SpeedVerdict:
    """Measure every GPU CUDA exposes (all NVML GPUs with ``visible_only=False``) and judge."""
    from preflight.bench.session import gpu_tests

    if probe is None:
        prestart(ctx)
    try:
        verdict = _run_speed(ctx, include_busy=include_busy, probe=probe,
                             visible_only=visible_only, debug=debug)
    finally:
        gpu_tests(ctx).release()  # what was started for a test that did not run
    return verdict


def _run_speed(ctx: Context, *, include_busy: bool, probe: SpeedProbe | None,
               visible_only: bool, debug: bool) -> SpeedVerdict:
    from preflight.bench import visible_gpus
    from preflight.bench.gate import blocker

    snap = ctx.gpus()
    gpus = tuple(visible_gpus(ctx)[0] if visible_only and snap.available else snap.gpus)
    notes: list[str] = []
    # The same rule as the all-reduce: never on a running job's GPUs, nor without NVML.
    stop = blocker(dataclasses.replace(snap, gpus=gpus))
    if stop is not None:
        if not (include_busy and stop.reason == "GpusBusy"):
            return SpeedVerdict(Status.SKIP, stop.reason, f"no GPU speed test: {stop.why}",
                                "Run it when the GPUs are idle (preflight bench --gpu measures "
                                "them anyway), or pass --no-bandwidth."
                                if stop.reason == "GpusBusy" else "")
        notes.append(f"GPUs in use, their figures compete with other work: {stop.why}")
    gpus = tuple(g for g in gpus if g.error is None)
    if not gpus:
        return SpeedVerdict(Status.SKIP, "NoGpu", "no GPU speed test: no usable GPU is visible "
                            "(gpu_visible and cuda_devices say why)")
    targets = tuple(Target(g.pci_bus_id, i, f"GPU {g.index}, {g.pci_bus_id}")
                    for i, g in enumerate(gpus))
    the_probe = probe or speed_probe(ctx, debug=debug)
    run = the_probe.measure(targets)
    cfg = ctx.config
    first = judge(run, gpus, slow_fraction=cfg.gpu_speed_slow_fraction,
                  warn_fraction=cfg.gpu_speed_warn_fraction, notes=notes)
    if first.status is not Status.FAIL or first.reason != "GpuSlow" or ctx.gpu_probe is None:
        return first
    # NVML again, now: clocks, power and event reasons right after the load, not before it.
    later = ctx.gpu_probe.snapshot()
    after = {normalize_bus_id(g.pci_bus_id): g for g in later.gpus}
    return judge(run, gpus, slow_fraction=cfg.gpu_speed_slow_fraction,
                 warn_fraction=cfg.gpu_speed_warn_fraction, after=after, notes=notes)


def render_table(verdict: SpeedVerdict) -> str:
    """nvidia-smi-like table: one row per GPU, each figure with its fraction of the limit."""
    head = f"{'GPU':<4} {'PCI BUS ID':<13} " + " ".join(
        f"{k + ' ' + UNITS[k]:>22}" for k in KINDS) + "  PHASES s (start/setup/measure)"
    lines = [head]
    for v in verdict.gpus:
        cells = []
        for kind in KINDS:
            f = next((x for x in v.figures if x.kind == kind), None)
            if f is None:
                cells.append(f"{'-':>22}")
                continue
            frac = f"{f.fraction:.2f}" if f.fraction is not None else "-"
            mark = "*" if f in v.slow else "!" if f in v.below else " "
            cells.append(f"{f'{f.value:,.1f} ({frac}){mark}':>22}")
        ph = v.phase_s
        start = sum(ph.get(k, 0.0) for k in ("interpreter", "imports", "waiting", "cuda_context"))
        measure = sum(ph.get(k, 0.0) for k in KINDS)
        lines.append(f"{v.gpu.index:<4} {v.gpu.pci_bus_id:<13} " + " ".join(cells) +
                     f"  {start:.2f}/{ph.get('setup', 0.0):.2f}/{measure:.2f}")
    lines.append("# (fraction of the hardware limit); * below the node median's "
                 "slow fraction, ! below the limit's warn fraction")
    lines.append(f"# {verdict.status.name} {verdict.reason}: {verdict.message}")
    if verdict.remedy and verdict.status >= Status.WARN:
        lines.append(f"# fix: {verdict.remedy}")
    env = verdict.extra.get("environment")
    if isinstance(env, dict) and env:
        from preflight.bench.verdict import environment_text

        lines.append(f"# environment: {environment_text(env)}")
    return "\n".join(lines)


__all__ = ["SpeedVerdict", "prestart", "render_table", "run_speed", "speed_probe"]
