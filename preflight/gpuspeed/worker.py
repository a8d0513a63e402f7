"""One GPU's speed test: device copy, pinned host<->device copies, a dense matrix multiply.

Started by :mod:`preflight.gpuspeed.parent` as ``python .../gpuspeed/worker.py --pci-bus-id ...``,
one process per GPU, all at once. It needs only the standard library plus one engine:

- ``cuda`` (default when it imports): NVIDIA's ``cuda-bindings`` (driver API: primary context,
  ``cuMemAlloc``, ``cuMemAllocHost`` pinned memory, async copies on a stream, CUDA events) and
  cuBLAS (``cublasGemmEx``) through ctypes on the library ``cuda-pathfinder`` finds (class
  :class:`Cublas`). No torch: importing it alone takes
  2.6-3.1 s on an H200 node, more than the whole check may take.
- ``torch``: the same measurements through torch (``pin_memory``, ``torch.cuda.Event``,
  ``torch.matmul``); the fallback where the cuda engine does not import.
- ``cpu``: plain host memory copies and a small pure-Python multiply; a plumbing test of the
  worker and its parent on machines without a GPU (the figures mean nothing for a GPU).

After ``init`` the worker reports ``ready`` and waits for a ``go`` line on stdin (the parent gives
it when no other GPU test runs). Progress goes to the parent as JSON lines on ``--progress-fd``
(``spawned``, ``phase``, ``measured``, ``done``, ``error``), with a heartbeat every
``HEARTBEAT_S`` from a thread, as the all-reduce workers do (:mod:`preflight.bench.worker`).

Method, each timed with events on the GPU's own stream after untimed warm-up:
``h2d`` / ``d2h``: ``COPY_BYTES`` between pinned host memory and the device; ``d2d``: a device copy
of ``D2D_BYTES`` (far beyond any L2 cache), counted as read + write (2 x bytes / time);
``gemm``: C = A x B, n = ``GEMM_N``, bf16 inputs and output, fp32 accumulate (fp16 where the
GPU has no bf16, compute capability < 8.0); 2 n^3 FLOP per multiply. The input data is a
pseudo-random bf16 pattern in [-1, 1] (zeros would draw less power and read faster).

``PREFLIGHT_GPUSPEED_TEST_STALL`` (test-only, docs/gpu-speed.md): ``BUS:PHASE`` makes the worker of
that bus id stop itself (SIGSTOP) on entering PHASE, so the tests prove a frozen worker is named.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

HEARTBEAT_S = 0.5
COPY_BYTES = 256 << 20
D2D_BYTES = 512 << 20
GEMM_N = 8192
ITERS = {"h2d": 5, "d2h": 5, "d2d": 10, "gemm": 10}
WARMUP = {"h2d": 1, "d2h": 1, "d2d": 2, "gemm": 3}
STALL_ENV = "PREFLIGHT_GPUSPEED_TEST_STALL"
#: cudaDataType (library_types.h) and cuBLAS enums (cublas_api.h), as plain ints.
CUDA_R_16F, CUDA_R_16BF = 2, 14
CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 0, 68, -1


class Progress:
    """JSON lines to the parent on one pipe; one lock so the heartbeat never splits a line."""

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "t": time.time(), **fields})
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (BrokenPipeError, ValueError):
                os._exit(3)  # the parent is gone: nothing may keep running


def _killed_with(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG = 1): a stopped
    worker, or one stuck inside the driver, never gets to the heartbeat's orphan test. A parent
    that died before the request is caught by comparing the parent pid afterwards."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(3)


def _heartbeat(progress: Progress, parent_pid: int) -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        if os.getppid() != parent_pid:
            os._exit(3)  # orphaned: a validator leaves no process behind
        progress.send("hb")


def bf16_pattern(count: int, seed: int = 16) -> bytes:
    """``count`` pseudo-random bf16 values in [-1, 1] (sign, exponent 118..126, 7-bit mantissa)."""
    rng = random.Random(seed)
    values = array.array("H", (rng.getrandbits(1) << 15 | rng.randint(118, 126) << 7
                               | rng.getrandbits(7) for _ in range(count)))
    return values.tobytes()


class Engine:
    """What every engine provides; ``timed(kind, iters)`` returns seconds for ``iters`` ops."""

    name = "none"
    device: dict[str, Any]
    dtype = "bf16"

    def setup(self) -> None:
        raise NotImplementedError

    def timed(self, kind: str, iters: int) -> float:
        raise NotImplementedError

    def close(self) -> None:
        """Free device and pinned memory (process exit would too; freeing first is tidier)."""


class Cublas:
    """The four cuBLAS calls the gemm needs (cublas_api.h, a stable C ABI), through ctypes on the
    libcublas that ``cuda-pathfinder`` finds: the CUDA install or the nvidia-cublas wheel.
    nvmath-python's binding did the same but took 0.8-1.6 s to import on an H200 node (its package
    imports every library it wraps), more than this whole test (docs/benchmarks.md)."""

    def __init__(self) -> None:
        from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib

        try:
            loaded = load_nvidia_dynamic_lib("cublas")
            lib = ctypes.CDLL(loaded.abs_path)
        except (DynamicLibNotFoundError, OSError) as exc:
            # As a missing package: engine auto falls back to torch.
            raise ImportError(f"cuBLAS could not be loaded: {exc}") from exc
        vp, i = ctypes.c_void_p, ctypes.c_int
        self._create = lib.cublasCreate_v2
        self._create.argtypes = [ctypes.POINTER(vp)]
        self._set_stream = lib.cublasSetStream_v2
        self._set_stream.argtypes = [vp, vp]
        self._destroy = lib.cublasDestroy_v2
        self._destroy.argtypes = [vp]
        self._gemm = lib.cublasGemmEx
        self._gemm.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        for fn in (self._create, self._set_stream, self._destroy, self._gemm):
            fn.restype = i

    @staticmethod
    def _ok(name: str, status: int) -> None:
        if status != 0:  # CUBLAS_STATUS_SUCCESS
            raise RuntimeError(f"cuBLAS {name} failed with status {status}")

    def create(self, stream: int) -> int:
        handle = ctypes.c_void_p()
        self._ok("cublasCreate", self._create(ctypes.byref(handle)))
        self._ok("cublasSetStream", self._set_stream(handle, stream))
        return int(handle.value or 0)

    def gemm_ex(self, handle: int, n: int, *, a: int, b: int, c: int, dtype: int, alpha: Any,
                beta: Any) -> None:
        """C = alpha A B + beta C, n x n, no transposes, fp32 accumulate, default algorithm."""
        self._ok("cublasGemmEx", self._gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n,
                                            ctypes.byref(alpha), a, dtype, n, b, dtype, n,
                                            ctypes.byref(beta), c, dtype, n, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT))

    def destroy(self, handle: int) -> None:
        self._destroy(handle)


class CudaEngine(Engine):
    """cuda-bindings (driver API) + cuBLAS through ctypes; no torch. The CUDA context is created
    in a thread while cuBLAS loads."""

    name = "cuda"

    def __init__(self, bus_id: str) -> None:
        # Imports here, so a missing one falls back to torch under engine auto.
        from cuda.bindings import driver

        self.cu = driver
        self.bus_id = bus_id
        self.ptrs: list[Any] = []
        self.host: int | None = None
        self.blas: int | None = None
        self._ctx_error: BaseException | None = None
        self._ctx_thread = threading.Thread(target=self._make_context, name="cuda-context",
                                            daemon=True)
        self._ctx_thread.start()
        self.cublas = Cublas()

    def _make_context(self) -> None:
        cu, ck = self.cu, self._ck
        try:
            ck(cu.cuInit(0))
            self.dev = ck(cu.cuDeviceGetByPCIBusId(self.bus_id.encode()))
            self.ctx = ck(cu.cuDevicePrimaryCtxRetain(self.dev))
        except BaseException as exc:  # re-raised by setup() in the main thread
            self._ctx_error = exc

    def _ck(self, res: Any) -> Any:
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            _, text = self.cu.cuGetErrorString(err)
            raise RuntimeError(f"CUDA: {err!r}: {text.decode() if text else ''}")
        if isinstance(res, tuple):
            return res[1] if len(res) == 2 else res[1:]
        return None

    def setup(self) -> None:
        cu, ck = self.cu, self._ck
        self._ctx_thread.join()
        if self._ctx_error is not None:
            raise self._ctx_error
        ck(cu.cuCtxSetCurrent(self.ctx))
        attr = cu.CUdevice_attribute

        def get(name: str) -> int:
            return int(ck(cu.cuDeviceGetAttribute(getattr(attr, name), self.dev)))

        cc = (get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
              get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
        name = ck(cu.cuDeviceGetName(256, self.dev))
        self.device = {"name": name.split(b"\0")[0].decode(), "capability": list(cc),
                       "sm_count": get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
                       "bus_width_bits": get("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH")}
        self.dtype = "bf16" if cc >= (8, 0) else "fp16"
        self.stream = ck(cu.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING
        self.src = self._alloc(D2D_BYTES)
        self.dst = self._alloc(D2D_BYTES)
        self.host = int(ck(cu.cuMemAllocHost(COPY_BYTES)))
        pattern = bf16_pattern(1 << 15)
        ctypes.memmove(self.host, pattern, len(pattern))
        filled = len(pattern)
        while filled < COPY_BYTES:  # double the pattern in place: a few memmoves, not a loop
            step = min(filled, COPY_BYTES - filled)
            ctypes.memmove(self.host + filled, self.host, step)
            filled += step
        # A and B are the first two n x n blocks of what h2d uploads; C lands in dst.
        ck(cu.cuMemcpyHtoDAsync(self.src, self.host, COPY_BYTES, self.stream))
        ck(cu.cuMemcpyHtoDAsync(int(self.src) + COPY_BYTES, self.host, COPY_BYTES, self.stream))
        ck(cu.cuStreamSynchronize(self.stream))
        self.ev0 = ck(cu.cuEventCreate(0))
        self.ev1 = ck(cu.cuEventCreate(0))
        self.blas = self.cublas.create(int(self.stream))
        self.alpha = ctypes.c_float(1.0)
        self.beta = ctypes.c_float(0.0)

    def _alloc(self, nbytes: int) -> Any:
        ptr = self._ck(self.cu.cuMemAlloc(nbytes))
        self.ptrs.append(ptr)
        return ptr

    def _op(self, kind: str) -> None:
        cu, ck, s = self.cu, self._ck, self.stream
        if kind == "h2d":
            ck(cu.cuMemcpyHtoDAsync(self.dst, self.host, COPY_BYTES, s))
        elif kind == "d2h":
            ck(cu.cuMemcpyDtoHAsync(self.host, self.dst, COPY_BYTES, s))
        elif kind == "d2d":
            ck(cu.cuMemcpyDtoDAsync(self.dst, self.src, D2D_BYTES, s))
        else:
            n = GEMM_N
            a = int(self.src)
            b = a + n * n * 2
            t = CUDA_R_16BF if self.dtype == "bf16" else CUDA_R_16F
            assert self.blas is not None
            self.cublas.gemm_ex(self.blas, n, a=a, b=b, c=int(self.dst), dtype=t,
                                alpha=self.alpha, beta=self.beta)

    def timed(self, kind: str, iters: int) -> float:
        cu, ck = self.cu, self._ck
        for _ in range(WARMUP[kind]):
            self._op(kind)
        ck(cu.cuEventRecord(self.ev0, self.stream))
        for _ in range(iters):
            self._op(kind)
        ck(cu.cuEventRecord(self.ev1, self.stream))
        ck(cu.cuEventSynchronize(self.ev1))
        return float(ck(cu.cuEventElapsedTime(self.ev0, self.ev1))) / 1000

    def close(self) -> None:
        cu = self.cu
        if self.blas is not None:
            self.cublas.destroy(self.blas)
        for ptr in self.ptrs:
            cu.cuMemFree(ptr)
        if self.host is not None:
            cu.cuMemFreeHost(self.host)
        cu.cuDevicePrimaryCtxRelease(self.dev)


class TorchEngine(Engine):
    """The same measurements through torch (the fallback engine)."""

    name = "torch"

    def __init__(self, bus_id: str, index: int) -> None:
        import torch

        self.torch = torch
        self.bus_id = bus_id
        self.index = index

    def setup(self) -> None:
        torch = self.torch
        dev = torch.device("cuda", self.index)
        torch.cuda.set_device(dev)
        props = torch.cuda.get_device_properties(dev)
        seen = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        if seen != self.bus_id:
            raise RuntimeError(f"cuda:{self.index} is {seen}, not {self.bus_id}: set "
                               "CUDA_DEVICE_ORDER=PCI_BUS_ID")
        cc = (props.major, props.minor)
        self.device = {"name": props.name, "capability": list(cc),
                       "sm_count": props.multi_processor_count, "bus_width_bits": None}
        self.dtype = "bf16" if cc >= (8, 0) else "fp16"
        dt = torch.bfloat16 if self.dtype == "bf16" else torch.float16
        self.src = torch.empty(D2D_BYTES, dtype=torch.uint8, device=dev)
        self.dst = torch.empty_like(self.src)
        self.host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
        self.hdst = self.dst[:COPY_BYTES]
        n = GEMM_N
        self.a = torch.empty(n, n, dtype=dt, device=dev).uniform_(-1, 1)
        self.b = torch.empty(n, n, dtype=dt, device=dev).uniform_(-1, 1)
        self.c = torch.empty(n, n, dtype=dt, device=dev)
        self.stream = torch.cuda.Stream(dev)
        self.ev0 = torch.cuda.Event(enable_timing=True)
        self.ev1 = torch.cuda.Event(enable_timing=True)

    def _op(self, kind: str) -> None:
        if kind == "h2d":
            self.hdst.copy_(self.host, non_blocking=True)
        elif kind == "d2h":
            self.host.copy_(self.hdst, non_blocking=True)
        elif kind == "d2d":
            self.dst.copy_(self.src)
        else:
            self.torch.matmul(self.a, self.b, out=self.c)

    def timed(self, kind: str, iters: int) -> float:
        with self.torch.cuda.stream(self.stream):
            for _ in range(WARMUP[kind]):
                self._op(kind)
            self.ev0.record()
            for _ in range(iters):
                self._op(kind)
            self.ev1.record()
        self.ev1.synchronize()
        return float(self.ev0.elapsed_time(self.ev1)) / 1000


class CpuEngine(Engine):
    """Host memory copies and a tiny pure-Python multiply: tests the plumbing without a GPU."""

    name = "cpu"
    nbytes = 16 << 20
    n = 24

    def setup(self) -> None:
        self.device = {"name": "CPU", "capability": None, "sm_count": None,
                       "bus_width_bits": None}
        self.dtype = "fp64"
        self.src = bytearray(os.urandom(1 << 16)) * (self.nbytes >> 16)
        self.dst = bytearray(self.nbytes)
        rng = random.Random(16)
        self.a = [[rng.uniform(-1, 1) for _ in range(self.n)] for _ in range(self.n)]

    def timed(self, kind: str, iters: int) -> float:
        start = time.perf_counter()
        for _ in range(iters):
            if kind == "gemm":
                a, n = self.a, self.n
                [[sum(a[i][k] * a[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
            else:
                self.dst[:] = self.src
        return time.perf_counter() - start


def figure(kind: str, seconds: float, iters: int, engine: Engine) -> float:
    """GB/s (1e9 B/s) for copies (d2d counts read + write), TFLOP/s for gemm."""
    if isinstance(engine, CpuEngine):
        per = 2 * engine.n ** 3 if kind == "gemm" else engine.nbytes * (2 if kind == "d2d" else 1)
    else:
        per = (2 * GEMM_N ** 3 if kind == "gemm" else
               2 * D2D_BYTES if kind == "d2d" else COPY_BYTES)
    scale = 1e12 if kind == "gemm" else 1e9
    return per * iters / seconds / scale


def make_engine(name: str, bus_id: str, index: int) -> Engine:
    if name == "cpu":
        return CpuEngine()
    if name == "torch":
        return TorchEngine(bus_id, index)
    try:
        return CudaEngine(bus_id)
    except ImportError:
        if name == "cuda":
            raise
        return TorchEngine(bus_id, index)


def _maybe_stall(bus_id: str, phase: str) -> None:
    want = os.environ.get(STALL_ENV, "")
    if want and want == f"{bus_id}:{phase}":
        os.kill(os.getpid(), signal.SIGSTOP)


def run(args: argparse.Namespace, progress: Progress) -> None:
    phase_s: dict[str, float] = {}

    def phase(name: str, body: Callable[[], None]) -> None:
        progress.send("phase", phase=name)
        _maybe_stall(args.pci_bus_id, name)
        start = time.monotonic()
        body()
        phase_s[name] = round(time.monotonic() - start, 4)

    holder: dict[str, Engine] = {}

    def load() -> None:
        holder["e"] = make_engine(args.engine, args.pci_bus_id, args.cuda_index)

    phase("import", load)
    engine = holder["e"]
    try:
        phase("init", engine.setup)
        progress.send("device", engine=engine.name, dtype=engine.dtype, **engine.device)
        # Ready: wait for the parent's go, given when no other GPU test (the all-reduce) runs, so
        # interpreter start, import and CUDA init overlap with it and only the measurement waits.
        progress.send("phase", phase="ready")
        if not sys.stdin.readline().startswith("go"):
            raise RuntimeError("the parent closed the pipe before the go")
        for kind in args.kinds.split(","):
            def measure(kind: str = kind) -> None:
                iters = ITERS[kind]
                seconds = engine.timed(kind, iters)
                progress.send("measured", kind=kind, value=figure(kind, seconds, iters, engine),
                              time_s=seconds, iters=iters)
            phase(kind, measure)
    finally:
        phase("close", engine.close)
    progress.send("done", phase_s=phase_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="preflight.gpuspeed.worker")
    p.add_argument("--pci-bus-id", required=True)
    p.add_argument("--cuda-index", type=int, required=True)
    p.add_argument("--engine", choices=("auto", "cuda", "torch", "cpu"), default="auto")
    p.add_argument("--kinds", default="h2d,d2h,d2d,gemm")
    p.add_argument("--progress-fd", type=int, required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    args = p.parse_args(argv)
    parent = args.parent_pid or os.getppid()
    _killed_with(parent)
    progress = Progress(args.progress_fd)
    progress.send("spawned", pid=os.getpid(), pci_bus_id=args.pci_bus_id)
    threading.Thread(target=_heartbeat, args=(progress, parent), daemon=True).start()
    code = 0
    try:
        run(args, progress)
    except BaseException as exc:  # every failure, KeyboardInterrupt too, goes to the parent
        progress.send("error", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-2000:])
        code = 1
    # Reported: exit without the interpreter's finalisation (the parent waits for this exit).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
