"""The DDP ladder on this node: which ranks and steps, the run, the verdict.

:func:`plan` decides from the Context: one rank per GPU the job's ``CUDA_VISIBLE_DEVICES``
leaves visible (``--nproc`` fewer), the steps ``single`` (each rank alone on its GPU), ``gloo``
and ``nccl``; without a GPU (no NVML, none visible) 2 CPU ranks run the gloo step and the GPU
steps SKIP. :func:`run` starts one worker per local rank through
:class:`preflight.bench.parent.WorkerRun` (the GPU workers' process life, wire, deadlines and
stall diagnosis) under the training environment's interpreter (``--python``); the workers run
the steps one after the other, each on the parent's go, in one process and one CUDA context per
rank (torch's import is paid once). Each step is judged (:mod:`preflight.ddp.proofs`) before the
next one starts; the first that fails ends the run and names the layer
(:mod:`preflight.ddp.verdict`), with the node checks that bear on it as evidence.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from preflight.bench.gate import blocker
from preflight.bench.options import DdpOptions, DdpStep, RunOptions
from preflight.bench.procs import proc_state
from preflight.bench.records import Failure, WorkerState
from preflight.bench.worker import engines, wire
from preflight.core.context import Context, activity
from preflight.core.result import Scope, Status
from preflight.ddp import proofs
from preflight.ddp.verdict import (
    LAYER_CHECKS,
    LAYER_VARIABLES,
    LAYERS,
    NONE_MESSAGE,
    REMEDIES,
    STEP_NUMBERS,
    LadderResult,
    StepResult,
    evidence_text,
)
from preflight.jobenv import cuda_visible

#: CPU ranks of the gloo step on a node without a GPU (two: the smallest world that
#: communicates).
CPU_RANKS = 2
#: Most local ranks (more than any node's GPUs; a bound on what a typo can start).
MAX_NPROC = 64
#: Failures that say the step itself broke (FAIL); the others leave it undecided (ERROR).
FAILED_KINDS = ("stalled", "hung", "died", "error")


class DdpUsageError(ValueError):
    """The request cannot be run as given (exit code 2)."""


@dataclass(frozen=True)
class LadderPlan:
    """What :func:`run` runs: the workers' options, the steps that SKIP and why, the GPU each
    local rank must land on (PCI bus id, from NVML and the job's CUDA_VISIBLE_DEVICES), or why
    nothing can run (``undecided``: reason, message, remedy)."""

    options: DdpOptions | None
    order: tuple[str, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)
    expected: Mapping[int, str] | None = None
    expected_note: str = ""
    cvd: str | None = None
    notes: tuple[str, ...] = ()
    undecided: tuple[str, str, str] | None = None


def _expected(ctx: Context) -> tuple[list[str], str, str | None, str]:
    """(per cuda index the GPU's label, its bus id ...); why there is no GPU ("" when there is
    one), CUDA_VISIBLE_DEVICES, a note on the mapping."""
    snap = ctx.gpus()
    cvd = ctx.env.get("CUDA_VISIBLE_DEVICES")
    if not snap.available:
        return [], f"NVML is not available ({snap.error or 'no driver'})", cvd, ""
    res = cuda_visible.resolve_devices(cuda_visible.parse(cvd), snap,
                                       device_order=ctx.env.get("CUDA_DEVICE_ORDER"))
    if res.duplicate is not None or not res.devices:
        shown = "unset" if cvd is None else repr(cvd)
        return [], f"no GPU visible (CUDA_VISIBLE_DEVICES {shown})", cvd, ""
    note = ("CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs differ in model: the expected "
            "mapping is PCI order, a guess" if res.order_ambiguous else "")
    return [d.gpu.pci_bus_id for d in res.devices], "", cvd, note


def plan(ctx: Context, *, nproc: int | None = None, timeout_s: float | None = None,
         debug: bool = False, python: str | None = None) -> LadderPlan:
    """The ladder for this node (see the module docstring); DdpUsageError on impossible
    requests."""
    if nproc is not None and not 1 <= nproc <= MAX_NPROC:
        raise DdpUsageError(f"--nproc {nproc}: expected 1..{MAX_NPROC} (one rank per GPU)")
    timeout = float(timeout_s if timeout_s is not None else ctx.config.ddp_timeout_s)
    python = python or ctx.config.python or sys.executable
    buses, no_gpu, cvd, note = _expected(ctx)
    notes: list[str] = []
    skipped: dict[str, str] = {}
    if buses:
        if nproc is not None and nproc > len(buses):
            raise DdpUsageError(f"--nproc {nproc} but only {len(buses)} GPU(s) are visible")
        count = nproc or len(buses)
        steps: tuple[DdpStep, ...] = (DdpStep(wire.DDP_SINGLE, None, True),
                                      DdpStep(wire.DDP_GLOO, "gloo", True),
                                      DdpStep(wire.DDP_NCCL, "nccl", True))
        snap = ctx.gpus()
        labels = tuple(next((f"GPU {g.index}, {g.pci_bus_id}" for g in snap.gpus
                             if g.pci_bus_id == bus), f"cuda:{i}")
                       for i, bus in enumerate(buses[:count]))
        stop = blocker(snap)
        if stop is not None and stop.reason == "GpusBusy":
            notes.append(f"the GPUs are in use; the run competes with that work: {stop.why}")
    else:
        count = nproc or CPU_RANKS
        steps = (DdpStep(wire.DDP_GLOO, "gloo", False),)
        labels = ("CPU",) * count
        why = f"needs a GPU: {no_gpu}"
        skipped = {wire.DDP_SINGLE: why, wire.DDP_NCCL: why}
    order = (wire.DDP_SINGLE, wire.DDP_GLOO, wire.DDP_NCCL)
    found = _facts(ctx, python)
    if found is not None and not engines.has(found, "torch"):
        return LadderPlan(None, order, skipped, cvd=cvd, undecided=(
            "TorchMissing", f"the DDP ladder runs the training environment's torch, and {python} "
            "cannot import torch",
            "Point --python (config key python) at the training environment's interpreter, or "
            "install torch there."))
    opts = DdpOptions(steps=steps, nproc=count, timeout_s=timeout, labels=labels, env=ctx.env,
                      python=python, debug=debug)
    expected = {i: bus for i, bus in enumerate(buses[:count])} if buses else None
    return LadderPlan(opts, order, skipped, expected, note, cvd, tuple(notes))


def _facts(ctx: Context, python: str) -> dict[str, Any] | None:
    from preflight.bench import interpreter_facts

    with activity(f"asking {python} what it can import"):
        return interpreter_facts(ctx, python)


# ------------------------------------------------------------------------------------- the run
def run(ctx: Context, p: LadderPlan, *,
        on_progress: Callable[[str], None] | None = None) -> LadderResult:
    """Run the plan to its end or its first failing step; never raises for a worker's failure
    and leaves nothing behind (the result's ``leftovers`` says what it checked)."""
    started = time.monotonic()
    if p.undecided is not None or p.options is None:
        reason, message, remedy = p.undecided or ("DdpUndecided", "nothing to run", "")
        steps = tuple(StepResult(name, Status.SKIP, "not run: " + message) for name in p.order)
        return LadderResult(Status.ERROR, None, reason, message, remedy, steps,
                            scope=Scope.UNDECIDED, notes=p.notes)
    from preflight.bench.parent import WorkerRun

    opts = p.options
    with activity("the DDP ladder's workers (preflight ddp)"):
        wr = WorkerRun(RunOptions(ddp=opts), on_progress=on_progress)
        done: dict[str, StepResult] = {}
        try:
            for step in opts.steps:
                t0 = time.monotonic()
                failure = wr.ddp_step(step.name)
                result = judge_step(step, wr.workers, failure, p, time.monotonic() - t0)
                done[step.name] = result
                if result.status is not Status.PASS:
                    break
        finally:
            wr.finish()
    results: list[StepResult] = []
    stopped_at = next((r for r in done.values() if r.status is not Status.PASS), None)
    for name in p.order:
        if name in done:
            results.append(done[name])
        elif name in p.skipped:
            results.append(StepResult(name, Status.SKIP, p.skipped[name]))
        else:
            results.append(StepResult(name, Status.SKIP, f"not run: step {stopped_at.name} "
                                      "did not pass" if stopped_at else "not run"))
    workers = wr.workers
    left = leftovers(ctx, workers, wr.store_port, wr.shm_removed,
                     gpu=any(s.gpu for s in opts.steps))
    base = dict(steps=tuple(results), start_s=start_times(workers),
                elapsed_s=time.monotonic() - started, leftovers=left,
                environment={"python": opts.python, **next((st.loaded for st in workers
                                                             if st.loaded), {})},
                ranks=tuple({"rank": st.rank, "label": st.label, "pid": st.pid,
                             "device": st.device.get("bus_id")} for st in workers),
                notes=p.notes + _hook_notes(workers),
                debug_log=wr.log_dir if opts.debug else None)
    return verdict(ctx, stopped_at, workers, base)


def run_ladder(ctx: Context, *, nproc: int | None = None, timeout_s: float | None = None,
               debug: bool = False,
               on_progress: Callable[[str], None] | None = None) -> LadderResult:
    """:func:`plan`, then :func:`run`."""
    return run(ctx, plan(ctx, nproc=nproc, timeout_s=timeout_s, debug=debug),
               on_progress=on_progress)


# ----------------------------------------------------------------------------------- judging
def _slowest(workers: Sequence[WorkerState], step: str) -> tuple[float | None, dict[str, float]]:
    per = [st.ddp_times.get(step) for st in workers]
    if not per or any(t is None for t in per):
        return None, {}
    times = [t for t in per if t is not None]
    phases: dict[str, float] = {}
    for t in times:
        for k, v in t.items():
            phases[k] = max(phases.get(k, 0.0), v)
    return max(sum(t.values()) for t in times), phases


def judge_step(step: DdpStep, workers: Sequence[WorkerState], failure: Failure | None,
               p: LadderPlan, wall_s: float) -> StepResult:
    """One step from its ranks' reports (``failure``: the run broke in it)."""
    seconds, phases = _slowest(workers, step.name)

    def result(status: Status, message: str, **more: Any) -> StepResult:
        return StepResult(step.name, status, message, ranks=len(workers), backend=step.backend,
                          phase_s=phases, **more)

    if failure is not None:
        status = Status.FAIL if failure.kind in FAILED_KINDS else Status.ERROR
        starting = [st for st in workers if st.rank in failure.ranks and st.step == wire.START]
        if failure.kind == "stalled" and starting and len(starting) == len(failure.ranks):
            # Frozen while its interpreter starts (before anything of the ladder ran): nothing
            # says whose fault that is.
            status = Status.ERROR
        if seconds is None:
            # The parent's clock from the step's go; the first step's go waits for start-up.
            first = p.options is not None and p.options.steps[0] is step
            started = max((sum(st.start_times.values()) for st in workers), default=0.0)
            seconds = max(0.0, wall_s - started) if first else wall_s
        return result(status, failure.message, seconds=seconds, failure_kind=failure.kind,
                      failed_ranks=failure.ranks)
    try:
        facts = [proofs.parse_facts(st.ddp[step.name]) for st in workers]
    except (KeyError, ValueError) as exc:
        return result(Status.ERROR, f"a rank's report of the step is missing or malformed: "
                      f"{exc}", seconds=seconds)
    found = proofs.judge(facts, expected=p.expected if step.gpu else None, cvd=p.cvd,
                         expected_note=p.expected_note)
    false = [pr for pr in found if pr.ok is False]
    if false:
        return result(Status.FAIL, "; ".join(f"{pr.title}: no: {pr.message}" for pr in false),
                      seconds=seconds, proofs=found)
    held = sum(1 for pr in found if pr.ok)
    return result(Status.PASS, f"{held} of {len(found)} proofs hold, the others do not apply "
                  "here" if held < len(found) else f"all {held} proofs hold", seconds=seconds,
                  proofs=found)


def _layer_of(stopped: StepResult, workers: Sequence[WorkerState]) -> str:
    """The failing step's layer; a worker that broke before any step (the interpreter, torch's
    import, the CUDA context) is the environment's whatever step was first."""
    if stopped.failure_kind and any(st.step == wire.START for st in workers
                                    if st.rank in stopped.failed_ranks):
        return "environment"
    return LAYERS.get(stopped.name, "environment")


def _variables(env: Mapping[str, str], layer: str) -> dict[str, str]:
    names = LAYER_VARIABLES.get(layer, ())
    return {k: v for k, v in sorted(env.items())
            if any(k == n or (n.endswith("_") and k.startswith(n)) for n in names)}


def _evidence_checks(ctx: Context, layer: str) -> list[dict[str, Any]]:
    from preflight.checks import CHECKS
    from preflight.core.runner import run_checks, select

    names = [n for n in LAYER_CHECKS.get(layer, ()) if n in {c.name for c in CHECKS}]
    if not names:
        return []
    report = run_checks(ctx, select(CHECKS, only=names), mode="ddp")
    return [{k: v for k, v in r.to_json().items() if k != "details"} for r in report.results]


def _scope(layer: str, stopped: StepResult, variables: Mapping[str, str]) -> Scope:
    """Whose fault: the job's when a variable of its own bears on the layer (or, for the
    environment, the device mapping is what failed), else the node's."""
    if layer == "environment":
        mapping = any(pr.name == "device" and pr.ok is False for pr in stopped.proofs) or \
            "invalid device ordinal" in stopped.message
        return Scope.JOB if mapping else Scope.NODE
    if layer == "communication":
        return Scope.JOB if "GLOO_SOCKET_IFNAME" in variables else Scope.NODE
    return Scope.JOB if variables else Scope.NODE


def verdict(ctx: Context, stopped: StepResult | None, workers: Sequence[WorkerState],
            base: dict[str, Any]) -> LadderResult:
    """The ladder's verdict from the first step that did not pass (None: every step did)."""
    if stopped is None:
        return LadderResult(Status.PASS, "none", "DdpOk", NONE_MESSAGE, **base)
    number = STEP_NUMBERS.get(stopped.name, "?")
    head = f"step {number} ({stopped.name}: {stopped.title})"
    if stopped.status is Status.ERROR:
        return LadderResult(Status.ERROR, None, "DdpUndecided",
                            f"{head} could not decide: {stopped.message}",
                            "Raise ddp_timeout_s (preflight ddp --timeout S) when the workers "
                            "start slowly (torch's import from a cold filesystem); preflight ddp "
                            "--debug keeps each rank's log.", scope=Scope.UNDECIDED, **base)
    layer = _layer_of(stopped, workers)
    variables = _variables(ctx.env, layer)
    warnings = list(dict.fromkeys(w for st in workers for w in st.nccl_warnings))
    with activity(f"the node checks that bear on the {layer} layer"):
        checks = _evidence_checks(ctx, layer)
    evidence = {"checks": checks, "variables": variables, "nccl_warnings": warnings[:20]}
    seen = evidence_text(checks, variables, warnings if layer in ("nccl", "network") else [])
    message = f"{head} failed: {stopped.message}" + (f". Evidence: {seen}" if seen else "")
    reason = f"Ddp{layer.capitalize()}Layer"
    # The failing checks' own fixes are the most specific; the layer's follows.
    fixes = [str(c["remedy"]) for c in checks if c.get("status") in ("warn", "fail")
             and c.get("remedy")]
    if stopped.failure_kind == "stalled":
        pids = {st.rank: st.pid for st in workers}
        who = ", ".join(f"rank {r} (pid {pids.get(r)})" for r in stopped.failed_ranks)
        fixes.insert(0, f"{who} stopped while the others waited for it: where a rank of the job "
                        "stops the same way, py-spy dump --pid PID shows where; a process in "
                        "state D waits on the kernel (dmesg)")
    remedy = "; ".join(dict.fromkeys([*fixes, REMEDIES[layer]]))
    return LadderResult(Status.FAIL, layer, reason, message, remedy, evidence=evidence,
                        scope=_scope(layer, stopped, variables), **base)


# ------------------------------------------------------------------------------------ figures
def start_times(workers: Sequence[WorkerState]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("interpreter", "imports", "cuda_context"):
        values = [st.start_times[key] for st in workers if key in st.start_times]
        if values:
            out[key] = max(values)
    return out


def _hook_notes(workers: Sequence[WorkerState]) -> tuple[str, ...]:
    hooks = sorted({str(h) for st in workers for f in st.ddp.values()
                    for h in (f.get("test_hooks") or []) if isinstance(f, dict)})
    return (f"test-only faults injected ({wire.DDP_TEST_ENV}): {', '.join(hooks)}",) \
        if hooks else ()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As any server would rebind it: TIME_WAIT of closed connections does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def leftovers(ctx: Context, workers: Sequence[WorkerState], port: int | None,
              shm_removed: Sequence[str], *, gpu: bool) -> dict[str, Any]:
    """What of the run is still there, looked at after it: worker processes, the store's port on
    127.0.0.1, GPU processes of the workers (a fresh NVML read), NCCL's /dev/shm files removed."""
    pids = [st.pid for st in workers if st.pid]
    out: dict[str, Any] = {"workers": len(pids),
                           "processes": [pid for pid in pids if proc_state(pid) is not None],
                           "port": port, "port_free": None, "shm_removed": list(shm_removed)}
    if port is not None:
        with contextlib.suppress(OSError):
            out["port_free"] = _port_free(port)
    if gpu and ctx.gpu_probe is not None:
        with contextlib.suppress(Exception):  # NVML trouble must not turn a verdict into a crash
            snap = ctx.gpu_probe.snapshot()
            if snap.available:
                out["gpu_processes"] = sorted(pid for g in snap.gpus for pid in g.compute_pids
                                              if pid in pids)
    return out
