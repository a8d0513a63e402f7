"""The timed all-reduce test (``preflight bench`` and the ``allreduce`` check), and the GPU
workers both GPU tests share.

:func:`plan` plans a run from the context (backend, ranks, sizes, which GPU each rank uses, the
workers' interpreter and engine), :func:`run_bench` runs it through
:mod:`preflight.bench.parent` (which never imports torch) and judges it with
:mod:`preflight.bench.verdict`; :func:`run_check` is the ``allreduce`` check's run, which shares
its workers with the ``gpu_speed`` check's (:mod:`preflight.bench.session`). The method and the
reference figures are in :mod:`preflight.bench.method`; docs/bandwidth.md explains both.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from preflight.bench import method
from preflight.bench.gate import blocker
from preflight.bench.options import BenchOptions
from preflight.bench.records import RunRecord
from preflight.bench.verdict import BenchResult, judge
from preflight.bench.worker import engines, wire
from preflight.core.context import Context
from preflight.core.result import Status
from preflight.core.units import fmt_bytes
from preflight.jobenv import cuda_visible
from preflight.probes.gpu import Gpu
from preflight.probes.pci import normalize_bus_id

ENGINES = engines.ALLREDUCE_ENGINES
#: gloo on CPU is a correctness and plumbing test; its default sweep stays small.
GLOO_DEFAULT_MAX_BYTES = 64 << 20


class BenchUsageError(ValueError):
    """The request cannot be run as given (exit code 2)."""


@dataclass(frozen=True)
class Plan:
    """A run that can start (``options``), or the SKIP that replaces it (``skip``)."""

    options: BenchOptions | None
    gpus: tuple[Gpu, ...]
    notes: tuple[str, ...]
    skip: BenchResult | None = None


def visible_gpus(ctx: Context) -> tuple[tuple[Gpu, ...], int, str | None]:
    """(the GPUs the workers will see, in cuda:N order; how many; why none when NVML is
    unavailable).

    CUDA_VISIBLE_DEVICES is read by the same parser as the cuda_devices check (jobenv/cuda_visible),
    in the device order the workers get (CUDA_DEVICE_ORDER, else PCI_BUS_ID: procs.worker_env),
    so rank r is named by the GPU it really uses; an invalid value leaves what CUDA would keep.
    """
    snap = ctx.gpus()
    if not snap.available:
        return (), 0, snap.error or "NVML is not available"
    res = cuda_visible.resolve_devices(
        cuda_visible.parse(ctx.env.get("CUDA_VISIBLE_DEVICES")), snap,
        device_order=ctx.env.get("CUDA_DEVICE_ORDER", cuda_visible.ORDER_PCI))
    gpus = () if res.duplicate else tuple(d.gpu for d in res.devices)
    return gpus, len(gpus), None


def _skip(backend: str, reason: str, message: str, remedy: str = "") -> BenchResult:
    return BenchResult(backend=backend, world_size=0, devices=(), rows=(), status=Status.SKIP,
                       reason=reason, message=message, remedy=remedy)


def interpreter_facts(ctx: Context, python: str) -> dict[str, Any] | None:
    """What ``python`` can import for the engines, asked once per run (a process start of that
    interpreter; this one answers in-process)."""
    from preflight.bench.procs import interpreter_facts as ask

    return ctx.cached(f"bench.facts:{python}", lambda: ask(python, env=ctx.env))


def plan(ctx: Context, *, backend: str | None = None, nproc: int | None = None,
         min_bytes: int | None = None, max_bytes: int | None = None,
         timeout_s: float | None = None, debug: bool = False, engine: str = "auto",
         largest_only: bool = False) -> Plan:
    """Decide backend, ranks, sizes, device names and interpreter; BenchUsageError on impossible
    requests. ``largest_only``: the largest size alone (the ``allreduce`` check: the largest size
    decides the verdict; the full sweep is ``preflight bench``'s)."""
    if engine not in ENGINES:
        raise BenchUsageError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    cfg = ctx.config
    gpus, visible, nvml_error = visible_gpus(ctx)
    # On a GPU node the test is NCCL's even when CUDA_VISIBLE_DEVICES hides the GPUs: a gloo run
    # on the CPU would measure the wrong thing and pass; gloo is the default only without NVML.
    chosen = backend or ("gloo" if nvml_error else "nccl")
    notes: list[str] = []
    if chosen == "nccl" and nproc is None and visible < 2:
        why = f"NVML: {nvml_error}" if nvml_error else f"{visible} visible"
        return Plan(None, gpus, (), _skip("nccl", "NotEnoughGpus",
                    f"the all-reduce test needs at least 2 GPUs; {why}"))
    count = (nproc if nproc is not None else visible) if chosen == "nccl" else (nproc or 2)
    if chosen == "nccl" and visible and count > visible:
        raise BenchUsageError(f"--nproc {count} but only {visible} GPU(s) are visible")
    if count < 2:
        raise BenchUsageError(f"--nproc must be >= 2 (all-reduce over one rank moves nothing), "
                              f"got {count}")
    if chosen == "gloo" and engine == "nccl4py":
        raise BenchUsageError("--engine nccl4py runs NCCL on GPUs; gloo needs --engine torch")
    lo = min_bytes if min_bytes is not None else cfg.bench_min_bytes
    hi = max_bytes if max_bytes is not None else cfg.bench_max_bytes
    used: tuple[Gpu, ...] = ()
    if chosen == "gloo" and max_bytes is None and hi > GLOO_DEFAULT_MAX_BYTES:
        hi = GLOO_DEFAULT_MAX_BYTES
        notes.append(f"gloo on CPU: sweep capped at {fmt_bytes(hi)} (pass --max-bytes for more)")
    if chosen == "nccl":
        used = gpus[:count]
        cap = method.memory_cap_bytes(used)
        if cap is not None and hi > cap:
            notes.append(f"largest size lowered from {fmt_bytes(hi)} to {fmt_bytes(cap)}: GPU "
                         f"memory allows 1/{method.MEMORY_SHARE} of the smallest GPU's memory")
            hi = cap
        # A person asked for this run: it goes ahead, and says what the figures compete with.
        stop = blocker(dataclasses.replace(ctx.gpus(), gpus=used))
        if stop is not None and stop.reason == "GpusBusy":
            notes.append(f"the figures compete with other work: {stop.why}")
    if largest_only:
        lo = max(lo, hi)
    try:
        sizes = tuple(method.sweep(lo, hi))
    except ValueError as exc:
        raise BenchUsageError(str(exc)) from None
    labels = tuple("CPU" if chosen == "gloo" else
                   f"GPU {used[r].index}, {used[r].pci_bus_id}" if r < len(used) else f"cuda:{r}"
                   for r in range(count))
    python, libnccl, engine, why = _interpreter(ctx, chosen, engine)
    if why:
        notes.append(why)
    here = interpreter_facts(ctx, sys.executable) or {}
    if python == sys.executable and not engines.choose("allreduce", engine, here, backend=chosen):
        return Plan(None, used, (), _skip(chosen, "TorchMissing",
                    f"the all-reduce test needs {engines.need('allreduce', engine, backend=chosen)}"
                    f", which {python} cannot import",
                    "Run it in the training environment: --python /path/to/venv/bin/python "
                    "(config key python), or install nccl4py next to preflight "
                    "(pip install 'cluster-preflight[nccl4py]')."))
    warmup, iters = wire.ITERATIONS[chosen]
    opts = BenchOptions(backend=chosen, nproc=count, sizes=sizes, python=python,
                        timeout_s=timeout_s if timeout_s is not None else cfg.bench_timeout_s,
                        iters=iters, warmup=warmup, debug=debug, labels=labels, env=ctx.env,
                        engine="torch" if chosen == "gloo" else engine, libnccl=libnccl)
    return Plan(opts, used, tuple(notes))


def _interpreter(ctx: Context, backend: str, engine: str) -> tuple[str, str | None, str, str]:
    """(the workers' interpreter, the libnccl they must load or None, the engine, a note).

    With ``--python`` (config ``python``) the test must exercise the training environment's
    NCCL. When that environment has torch but not the nccl4py engine, and this one has it, the
    workers run here and load the environment's own ``libnccl.so.2`` (the one its torch loads)
    first: the same NCCL, without torch's 3-4 s start. ``--engine torch`` keeps the
    environment's own torch.
    """
    cfg = ctx.config
    if not cfg.python or cfg.python == sys.executable or backend != "nccl" or engine == "torch":
        return cfg.python or sys.executable, None, engine, ""
    theirs = interpreter_facts(ctx, cfg.python)
    if theirs is None or engines.has(theirs, "nccl4py") or not engines.has(theirs, "torch"):
        # Its own nccl4py; no torch, so no NCCL of a job of its own (its workers say what it
        # lacks); or it could not be asked (its workers say what is wrong with it).
        return cfg.python, None, engine, ""
    source = theirs.get("libnccl")
    here = interpreter_facts(ctx, sys.executable) or {}
    if not isinstance(source, str) or not engines.has(here, "nccl4py"):
        return cfg.python, None, engine, ""
    return sys.executable, source, "nccl4py", (
        f"nccl4py from preflight's environment runs the training environment's NCCL "
        f"({source}); {cfg.python} has no nccl4py (--engine torch runs its torch instead)")


def check_plan(ctx: Context) -> Plan:
    """The ``allreduce`` check's run (NCCL, the largest size, ``bench_engine``), once per run of
    the checks; a SKIP when a job uses the GPUs (never steal a running job's GPUs)."""
    def make() -> Plan:
        stop = blocker(ctx.gpus())
        if stop is not None:
            return Plan(None, (), (), _skip(
                "nccl", stop.reason, f"no all-reduce test: {stop.why}",
                "Run it when the GPUs are idle, or pass --no-bandwidth."
                if stop.reason == "GpusBusy" else ""))
        return plan(ctx, backend="nccl", engine=ctx.config.bench_engine, largest_only=True)

    return ctx.cached("bench.check-plan", make)


def expect_check(ctx: Context) -> None:
    """The ``allreduce`` check will run in this run of the checks: a speed test before it may
    start its workers to do both (:mod:`preflight.bench.session`)."""
    from preflight.bench.session import gpu_tests

    p = check_plan(ctx)
    if p.options is not None:
        gpu_tests(ctx).expect_allreduce(p.options)


def run_check(ctx: Context) -> BenchResult:
    """The ``allreduce`` check's test, judged against ``min_busbw_gbps`` or the table."""
    from preflight.bench.session import gpu_tests

    return run_bench(ctx, check_plan(ctx), min_busbw_gbps=ctx.config.min_busbw_gbps,
                     floor_source="min_busbw_gbps / --min-busbw",
                     runner=lambda opts: gpu_tests(ctx).allreduce(opts))


def run_bench(ctx: Context, p: Plan, *, min_busbw_gbps: float | None = None,
              floor_source: str = "--min-busbw",
              on_progress: Callable[[str], None] | None = None,
              runner: Callable[[BenchOptions], RunRecord] | None = None) -> BenchResult:
    """Run a plan and judge it; the GPUs are named by what each worker reports (PCI bus id)."""
    if p.skip is not None or p.options is None:
        assert p.skip is not None
        return p.skip
    if runner is None:
        from preflight.bench.parent import run_workers

        record = run_workers(p.options, on_progress=on_progress)
    else:
        record = runner(p.options)
    gpus = p.gpus
    if p.options.backend == "nccl":
        by_bus = {normalize_bus_id(g.pci_bus_id): g for g in ctx.gpus().gpus if g.pci_bus_id}
        found = []
        for st in record.ranks:
            g = by_bus.get(normalize_bus_id(st.pci_bus_id)) if st.pci_bus_id else None
            if g is not None:
                st.label = f"GPU {g.index}, {g.pci_bus_id}"
                found.append(g)
        if len(found) == len(record.ranks):
            gpus = tuple(found)
    return judge(record, gpus=gpus, min_busbw_gbps=min_busbw_gbps, floor_source=floor_source,
                 notes=p.notes)


__all__ = ["BenchResult", "BenchUsageError", "Plan", "check_plan", "expect_check", "plan",
           "run_bench", "run_check", "visible_gpus"]
