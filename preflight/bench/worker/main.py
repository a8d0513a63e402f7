"""The worker's plan: start-up, then its steps in order, in one process and one CUDA context.

``start.py --plan JSON --progress-fd N --parent-pid P``; the plan (written by
:mod:`preflight.bench.options`): ``{"label", "device": CUDA index or None (the CPU), "bus_id",
"speed": {"engine", "kinds", "timeout_s"} or None, "allreduce": {"rank", "world_size",
"backend", "engine", "sizes", "warmup", "iters", "alloc", "libnccl", "store", "store_prefix",
"timeout_s"} or None}``, or ``{"label", "ddp": {...}}``: the DDP ladder instead (:mod:`.ddp`).

Start-up overlaps what does not depend on each other: the driver's own initialisation (through
libcuda, before any import), the imports of the engines, cuBLAS's loading and nccl4py's import
(threads, joined before anything is measured, so that nothing competes with a measurement). A
step whose engine this interpreter lacks is reported (``missing``: what is lacking, in words) and
left out; the others still run. Everything is reported before the exit, which releases the
context, its memory and NCCL's threads at once (the parent waits for it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import time
import traceback
from importlib import import_module
from typing import Any

from . import engines, wire
from .cudadrv import Background, CudaError, Driver, Gpu, early_init

#: Extra seconds the worker's own waits (the go, the release) allow beyond the parent's
#: deadlines, which always decide first.
BACKSTOP_S = 30.0


def _torch_device(torch: Any, index: int, bus_id: str | None) -> Any:
    """The torch device of this worker's GPU; :class:`engines.Unavailable` on a CPU-only torch."""
    if not torch.cuda.is_available():
        build = ("a CPU-only build" if getattr(torch.version, "cuda", None) is None else
                 f"built for CUDA {torch.version.cuda}, but it finds no GPU")
        raise engines.Unavailable(f"torch {torch.__version__} cannot use the GPU ({build})")
    if bus_id:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            seen = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            if seen.lower() == bus_id.lower()[-len(seen):]:
                index = i
                break
    torch.cuda.set_device(index)
    torch.cuda.init()
    return torch.device("cuda", index)


def _libraries() -> dict[str, str]:
    """The shared libraries of interest this process has mapped (the real files loaded)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                for key, stem in (("libnccl", "/libnccl.so"), ("libcublas", "/libcublas.so")):
                    if stem in path and key not in found:
                        found[key] = path
    except OSError:
        pass
    return found


def loaded() -> dict[str, Any]:
    """What this worker imported and loaded, from where (the ``loaded`` event)."""
    out: dict[str, Any] = {"python": sys.executable, "python_version": platform.python_version()}
    for key, name, dist in (("torch", "torch", "torch"), ("nccl4py", "nccl", "nccl4py"),
                            ("cuda_bindings", "cuda.bindings", "cuda-bindings")):
        module = sys.modules.get(name)
        if module is None:
            out[key] = None
            continue
        where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])),
                                                           None)
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                from importlib.metadata import version as dist_version

                version = dist_version(dist)
            except Exception:  # no metadata: the path still says which one
                version = None
        out[key] = {"version": str(version) if version else None, "path": where}
    libs = _libraries()
    out["libnccl"] = {"path": libs["libnccl"]} if "libnccl" in libs else None
    out["libcublas"] = {"path": libs["libcublas"]} if "libcublas" in libs else None
    return out


class Worker:
    """One run of the plan; :meth:`run` raises what it cannot report as a step's own failure."""

    def __init__(self, plan: dict[str, Any], progress: wire.Progress,
                 control: wire.Control) -> None:
        self.plan, self.progress, self.control = plan, progress, control
        self.device: int | None = plan.get("device")
        self.bus_id: str | None = plan.get("bus_id")
        self.clock = wire.Clock()
        self.step, self.phase = wire.START, "imports"
        self.drv: Driver | None = None
        self.gpu: Gpu | None = None
        self.torch: Any = None
        self.torch_device: Any = None
        self.capability: list[int] = [0, 0]
        self.device_sent = False
        self.cublas_job: Background | None = None
        self.nccl_job: Background | None = None
        #: exit only once the parent released the worker (a peer may still read our data),
        #: at most this many seconds; None: exit at once
        self.release_s: float | None = None

    def enter(self, step: str, phase: str, size: int | None = None) -> None:
        self.step, self.phase = step, phase
        self.progress.send(wire.PHASE, step=step, phase=phase, size=size)
        stall = os.environ.get(wire.STALL_ENV, "")
        if stall and self.bus_id and stall == f"{self.bus_id}:{phase}":
            os.kill(os.getpid(), signal.SIGSTOP)

    def missing(self, step: str, need: str, why: list[str] | None = None) -> None:
        self.progress.send(wire.MISSING, step=step, need=need, why="; ".join(why or []),
                           python=sys.executable)

    # ------------------------------------------------------------------------------ start-up
    def pending(self) -> bool:
        """A worker started before its plan was known (``{"pending": S}``): the interpreter, the
        driver's own initialisation (cuInit: no context, no GPU memory) and cuda-bindings' import
        happen while the parent reads NVML; then the plan comes on stdin (``plan``), or null
        (not needed: exit). False when released."""
        self.enter(wire.START, "imports")
        self.pre_init = Background(lambda: early_init(None, None, context=False), "cuda-init")
        with contextlib.suppress(ImportError):
            self.drv = Driver(import_module("cuda.bindings.driver"))
        self.clock.lap("imports")
        plan = self.control.get(wire.PLAN, float(self.plan["pending"]))
        self.clock.lap("waiting")
        if not isinstance(plan, dict):
            return False
        self.plan = plan
        self.device, self.bus_id = plan.get("device"), plan.get("bus_id")
        return True

    def run(self) -> None:
        if self.plan.get("pending") and not self.pending():
            self.progress.send(wire.DONE)
            return
        if self.plan.get("ddp"):
            self.ddp_run(self.plan["ddp"])
            return
        speed, ar = self.plan.get("speed"), self.plan.get("allreduce")
        found = engines.facts(libnccl=False)
        self.speed_try = engines.choose("speed", speed["engine"], found) if speed else ()
        self.ar_try = (engines.choose("allreduce", ar["engine"], found, backend=ar["backend"])
                       if ar else ())
        if speed and not self.speed_try:
            self.missing(wire.SPEED, engines.need("speed", speed["engine"]))
            speed = None
        if ar and not self.ar_try:
            self.missing(wire.ALLREDUCE, engines.need("allreduce", ar["engine"],
                                                      backend=ar["backend"]))
            ar = None
        first = {self.speed_try[0] if speed else None, self.ar_try[0] if ar else None}
        on_gpu = self.device is not None and bool(first - {None, "cpu"})
        self.enter(wire.START, "imports")
        early = (Background(lambda: early_init(self.device, self.bus_id), "cuda-init")
                 if on_gpu else None)
        if on_gpu and first & {"cuda", "nccl4py"} and self.drv is None:
            with contextlib.suppress(ImportError):  # else its engines are unavailable here
                self.drv = Driver(import_module("cuda.bindings.driver"))
        if not on_gpu:
            self.drv = None
        if "cuda" in first and speed and self.drv is not None:
            from .speed import Cublas

            self.cublas_job = Background(Cublas, "cublas-load")
        if "nccl4py" in first and ar and self.drv is not None:
            from .allreduce import import_nccl

            libnccl = ar.get("libnccl")
            self.nccl_job = Background(lambda: import_nccl(libnccl), "nccl-import")
        if "torch" in first and (not speed or self.speed_try[0] == "torch"):
            # (Only the all-reduce's: imported after the speed step, whose time it is not.)
            self.torch = import_module("torch")
        self.clock.lap("imports")
        self.enter(wire.START, "context")
        if early is not None:
            early.join()
        self._open_device(on_gpu)
        self.clock.lap("cuda_context")
        self.progress.send(wire.STEP_DONE, step=wire.START, times=self.clock.times)
        if speed:
            self.speed_step(speed)
        if ar:
            self.allreduce_step(ar)
        self.progress.send(wire.LOADED, **loaded())
        self.progress.send(wire.DONE)

    def _open_device(self, on_gpu: bool) -> None:
        if not on_gpu:
            return
        assert self.device is not None
        if self.drv is not None:
            self.gpu = Gpu(self.drv, index=self.device, bus_id=self.bus_id)
            self._device_facts(self.gpu.facts())
        elif self.torch is not None:
            with contextlib.suppress(engines.Unavailable):  # each step that needs it says so
                self._torch_on_gpu()

    def _device_facts(self, facts: dict[str, Any]) -> None:
        if not self.device_sent:
            self.device_sent = True
            self.capability = list(facts["capability"])
            self.progress.send(wire.DEVICE, **facts)

    def _torch_on_gpu(self) -> tuple[Any, Any]:
        if self.torch is None:
            self.torch = import_module("torch")
        if self.torch_device is None:
            self.torch_device = _torch_device(self.torch, int(self.device or 0), self.bus_id)
            p = self.torch.cuda.get_device_properties(self.torch_device)
            self._device_facts({"bus_id": f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:"
                                          f"{p.pci_device_id:02x}.0",
                                "name": p.name, "capability": [p.major, p.minor],
                                "sm_count": p.multi_processor_count, "bus_width_bits": None})
        return self.torch, self.torch_device

    # ------------------------------------------------------------------------------- the DDP
    def ddp_run(self, plan: dict[str, Any]) -> None:
        """The DDP ladder (:mod:`.ddp`): torch's import and the CUDA context of
        ``cuda:LOCAL_RANK`` at start-up, then the steps on the parent's go. A CUDA error at
        start-up is the first step's to report (its layer: CUDA, the driver, the torch build)."""
        from . import ddp

        self.enter(wire.START, "imports")
        gpu = any(step.get("gpu") for step in plan["steps"])
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
        early = Background(lambda: early_init(local, None), "cuda-init") if gpu else None
        self.torch = ddp.imports()
        self.clock.lap("imports")
        self.enter(wire.START, "context")
        cuda_error: BaseException | None = None
        if early is not None:
            early.join()
            self.device = local
            try:
                self._torch_on_gpu()
            except Exception as exc:  # the single step raises it, in the layer it belongs to
                cuda_error = exc
        self.clock.lap("cuda_context")
        self.progress.send(wire.STEP_DONE, step=wire.START, times=self.clock.times)
        ladder = ddp.Ladder(self, plan)
        ladder.run(cuda_error)
        if ladder.wait_release:
            self.release_s = float(plan["timeout_s"]) + BACKSTOP_S
        self.progress.send(wire.LOADED, **loaded())
        self.progress.send(wire.DONE)

    # --------------------------------------------------------------------------------- speed
    def _speed_engine(self, name: str) -> Any:
        from . import speed

        if name == "cpu":
            return speed.CpuSpeed()
        if self.device is None:
            raise engines.Unavailable("no GPU in this worker's plan")
        if name == "cuda":
            if self.gpu is None or self.cublas_job is None:
                raise engines.Unavailable("cuda.bindings did not import")
            return speed.CudaSpeed(self.gpu, self.cublas_job.join(), self.capability)
        torch, device = self._torch_on_gpu()
        return speed.TorchSpeed(torch, device.index, self.capability)

    def speed_step(self, plan: dict[str, Any]) -> None:
        from .speed import measure

        self.enter(wire.SPEED, "setup")
        t0 = time.perf_counter()
        engine, why = None, []
        for name in self.speed_try:
            try:
                engine = self._speed_engine(name)
                break
            except ImportError as exc:  # Unavailable too: the next engine, the reason kept
                why.append(str(exc))
        if engine is None:
            self.missing(wire.SPEED, engines.need("speed", plan["engine"]), why)
            return
        self.progress.send(wire.ENGINE, step=wire.SPEED, engine=engine.name, dtype=engine.dtype)
        engine.setup()
        if self.nccl_job is not None:
            # The next step's import finishes now: nothing may compete with a measurement.
            self.nccl_job.wait()
        times = {"setup": time.perf_counter() - t0}
        self.enter(wire.SPEED, "ready")
        self.control.get(wire.GO, float(plan["timeout_s"]) + BACKSTOP_S)
        times.update(measure(engine, list(plan["kinds"]),
                             enter=lambda kind: self.enter(wire.SPEED, kind),
                             send=lambda **f: self.progress.send(wire.MEASURED, **f)))
        t1 = time.perf_counter()
        engine.close()
        times["close"] = time.perf_counter() - t1
        self.progress.send(wire.STEP_DONE, step=wire.SPEED, times=times)

    # ----------------------------------------------------------------------------- all-reduce
    def allreduce_step(self, plan: dict[str, Any]) -> None:
        from . import allreduce

        # Init first: what follows (torch's import, the rendezvous) is no measurement, and a
        # heartbeat held off by an import must not read as a frozen worker.
        self.enter(wire.ALLREDUCE, "init")
        step = allreduce.Step(plan, self.progress, self.control, wire.Clock(),
                              enter=lambda phase, size: self.enter(wire.ALLREDUCE, phase, size))
        why = []
        for name in self.ar_try:
            try:
                if name == "nccl4py":
                    if self.gpu is None or self.nccl_job is None:
                        raise engines.Unavailable("cuda.bindings did not import")
                    nccl = self.nccl_job.join()
                    self.release_s = float(plan["timeout_s"]) + BACKSTOP_S
                    allreduce.run_nccl4py(step, self.gpu, nccl)
                else:
                    if plan["backend"] == "gloo":
                        torch = self.torch or import_module("torch")
                        self.torch, device = torch, torch.device("cpu")
                    else:
                        torch, device = self._torch_on_gpu()
                    allreduce.run_torch(step, torch, device)
                break
            except ImportError as exc:  # before anything ran: the next engine
                why.append(str(exc))
        else:
            self.missing(wire.ALLREDUCE, engines.need("allreduce", plan["engine"],
                                                      backend=plan["backend"]), why)
            return
        self.progress.send(wire.STEP_DONE, step=wire.ALLREDUCE, times=step.clock.times)


def error_text(exc: BaseException) -> str:
    """A failure as one sentence: CUDA's and the engines' own errors as they word them, anything
    else with its type (the traceback is in the worker's log and the ``error`` event)."""
    if isinstance(exc, (CudaError, engines.Unavailable, TimeoutError, EOFError)):
        return str(exc)
    text = " ".join(str(exc).split())[:500]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    t_main = time.time()
    p = argparse.ArgumentParser(prog="preflight GPU worker")
    p.add_argument("--plan", required=True, help="the plan, JSON (preflight.bench.options)")
    p.add_argument("--progress-fd", type=int, required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    parent = args.parent_pid or os.getppid()
    wire.die_with_parent(parent)
    progress = wire.Progress(args.progress_fd)
    progress.send(wire.STARTED, t_main=t_main, pid=os.getpid(), python=sys.executable)
    wire.start_heartbeat(progress, parent)
    control = wire.Control(0)
    worker = Worker(json.loads(args.plan), progress, control)
    code = 0
    try:
        worker.run()
    except BaseException as exc:  # every failure, KeyboardInterrupt too, goes to the parent
        progress.send(wire.ERROR, step=worker.step, phase=worker.phase, error=error_text(exc),
                      traceback=traceback.format_exc()[-4000:])
        code = 1
    if worker.release_s is not None and code == 0:
        # A peer may still be finishing the last barrier with data of ours: exit only once the
        # parent has seen every rank done (it closes our stdin then).
        control.wait_release(worker.release_s)
    # Reported: the exit releases the CUDA context, the memory and NCCL's threads at once; the
    # interpreter's finalisation is skipped (it adds time and runs nothing of ours).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
