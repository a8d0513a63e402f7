"""The timed all-reduce test (``preflight bench`` and the ``allreduce`` check).

:func:`run_bench` plans a run from the context (backend, ranks, sizes, which GPU each rank uses),
runs it through :mod:`preflight.bench.parent` (which never imports torch) and judges it with
:mod:`preflight.bench.verdict`. The method and the reference figures are in
:mod:`preflight.bench.method`; docs/bandwidth.md explains both.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from preflight.bench import method
from preflight.bench.gate import blocker
from preflight.bench.parent import BenchOptions, run_workers
from preflight.bench.verdict import BenchResult, judge
from preflight.core.context import Context
from preflight.core.result import Status
from preflight.core.units import fmt_bytes
from preflight.jobenv import cuda_visible
from preflight.probes.gpu import Gpu
from preflight.probes.pci import normalize_bus_id

#: Worker engines (docs/bandwidth.md): "auto" takes nccl4py (no torch: about 1.3 s to an
#: initialised communicator on 2x H200, against 4.3-4.5 s with torch) when the workers'
#: interpreter can import it, else torch.
ENGINES = ("auto", "torch", "nccl4py")
#: gloo on CPU is a correctness and plumbing test; its default sweep stays small.
GLOO_DEFAULT_MAX_BYTES = 64 << 20
ITERS = {"nccl": 20, "gloo": 10}
WARMUP = {"nccl": 5, "gloo": 2}


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
    in the device order the workers get (CUDA_DEVICE_ORDER, else PCI_BUS_ID: parent._worker_env), so
    rank r is named by the GPU it really uses; an invalid value leaves what CUDA would keep.
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


def plan(ctx: Context, *, backend: str | None = None, nproc: int | None = None,
         min_bytes: int | None = None, max_bytes: int | None = None,
         timeout_s: float | None = None, debug: bool = False, engine: str = "auto",
         largest_only: bool = False) -> Plan:
    """Decide backend, ranks, sizes and device names; BenchUsageError on impossible requests.

    ``largest_only``: sweep only the largest size (the ``allreduce`` check: the largest size
    decides the verdict, the full sweep is ``preflight bench``'s).
    """
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
    if chosen == "nccl":
        count = nproc if nproc is not None else visible
        if visible and count > visible:
            raise BenchUsageError(f"--nproc {count} but only {visible} GPU(s) are visible")
    else:
        count = nproc if nproc is not None else 2
    if count < 2:
        raise BenchUsageError(f"--nproc must be >= 2 (all-reduce over one rank moves nothing), "
                              f"got {count}")
    lo = min_bytes if min_bytes is not None else cfg.bench_min_bytes
    hi = max_bytes if max_bytes is not None else cfg.bench_max_bytes
    used: tuple[Gpu, ...] = ()
    if chosen == "gloo" and engine == "nccl4py":
        raise BenchUsageError("--engine nccl4py runs NCCL on GPUs; gloo needs --engine torch")
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
    if python == sys.executable and not _engine_available(chosen, engine):
        need = ("torch" if chosen == "gloo" or engine == "torch" else
                "nccl4py (nccl.bindings, cuda.bindings)" if engine == "nccl4py" else
                "torch or nccl4py (nccl.bindings, cuda.bindings)")
        return Plan(None, used, (), _skip(chosen, "TorchMissing",
                    f"the all-reduce test needs {need}, which {python} cannot import",
                    "Run it in the training environment: --python /path/to/venv/bin/python "
                    "(config key python), or install nccl4py next to preflight "
                    "(pip install 'cluster-preflight[nccl4py]')."))
    opts = BenchOptions(backend=chosen, nproc=count, sizes=sizes, python=python,
                        timeout_s=timeout_s if timeout_s is not None else cfg.bench_timeout_s,
                        iters=ITERS[chosen], warmup=WARMUP[chosen], debug=debug, labels=labels,
                        env=ctx.env, engine="torch" if chosen == "gloo" else engine,
                        libnccl=libnccl)
    return Plan(opts, used, tuple(notes))


def _interpreter(ctx: Context, backend: str, engine: str) -> tuple[str, str | None, str, str]:
    """(the workers' interpreter, the libnccl they must load or None, the engine, a note).

    With ``--python`` (config ``python``) the test must exercise the training environment's NCCL.
    When that environment cannot run the nccl4py engine itself but this one can, the workers run
    here and load the environment's own ``libnccl.so.2`` (its fingerprint's ``nccl_source``): the
    same NCCL, without torch's 3-4 s start. ``--engine torch`` keeps the environment's own torch.
    """
    cfg = ctx.config
    if not cfg.python or cfg.python == sys.executable or backend != "nccl" or engine == "torch":
        return cfg.python or sys.executable, None, engine, ""
    from preflight.checks.versions import fingerprint_of

    try:
        meta = fingerprint_of(ctx).get("meta") or {}
    except Exception:  # the versions check reports a broken interpreter; the run names it too
        return cfg.python, None, engine, ""
    source = meta.get("nccl_source")
    if meta.get("nccl4py") or not isinstance(source, str) or not _engine_available("nccl",
                                                                                   "nccl4py"):
        return cfg.python, None, engine, ""
    # A file of that environment, or the soname its loader found (LD_LIBRARY_PATH, the system);
    # "<wheel> wheel metadata" means nothing could be loaded there.
    loadable = (os.path.isfile(source) if os.path.isabs(source)
                else source.startswith("libnccl") and "/" not in source)
    if not loadable:
        return cfg.python, None, engine, ""
    return sys.executable, source, "nccl4py", (
        f"nccl4py from preflight's environment runs the training environment's NCCL "
        f"({source}); {cfg.python} has no nccl4py (--engine torch runs its torch instead)")


def _engine_available(backend: str, engine: str) -> bool:
    """Whether this interpreter can run the engine (another interpreter is left to the worker)."""
    def has(*mods: str) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in mods)
    if backend == "gloo" or engine == "torch":
        return has("torch")
    if engine == "nccl4py":
        return has("nccl", "cuda")
    return has("torch") or has("nccl", "cuda")


def run_bench(ctx: Context, p: Plan, *, min_busbw_gbps: float | None = None,
              floor_source: str = "--min-busbw",
              on_progress: Callable[[str], None] | None = None,
              on_done: Callable[[], None] | None = None) -> BenchResult:
    """Run a plan and judge it; the GPUs are named by what each worker reports (PCI bus id).
    ``on_done``: called once every rank has reported done (before their exits)."""
    if p.skip is not None or p.options is None:
        assert p.skip is not None
        return p.skip
    record = run_workers(p.options, on_progress=on_progress, on_done=on_done)
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


__all__ = ["BenchResult", "BenchUsageError", "Plan", "plan", "run_bench"]
