"""The speed step: device copy, pinned host<->device copies, a dense matrix multiply (stdlib at
import time; each engine imports its own packages).

Method, each timed with events on the worker's own stream after untimed warm-ups (the table of
iterations: :data:`.wire.ITERATIONS`): ``h2d`` / ``d2h``: :data:`COPY_BYTES` between pinned host
memory and the device; ``d2d``: a device copy of :data:`D2D_BYTES` (far beyond any L2 cache),
counted as read + write (2 x bytes / time); ``gemm``: C = A x B, n = :data:`GEMM_N`, bf16 inputs
and output, fp32 accumulate (fp16 below compute capability 8.0), 2 n^3 FLOP per multiply, on a
pseudo-random bf16 pattern in [-1, 1] (zeros would draw less power and run faster).

Engines (:mod:`.engines` chooses): :class:`CudaSpeed` (cuda-bindings' driver API and cuBLAS
through ctypes: no torch), :class:`TorchSpeed`, :class:`CpuSpeed` (host memory and a tiny
pure-Python multiply: a plumbing test without a GPU, its figures mean nothing for a GPU).
"""

from __future__ import annotations

import ctypes
import os
import random
import time
from typing import Any

from .engines import Unavailable
from .wire import ITERATIONS

COPY_BYTES = 64 << 20
D2D_BYTES = 512 << 20
GEMM_N = 8192
#: cudaDataType (library_types.h) and cuBLAS enums (cublas_api.h), as plain ints.
CUDA_R_16F, CUDA_R_16BF = 2, 14
CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 0, 68, -1


class Cublas:
    """The four cuBLAS calls the multiply needs (cublas_api.h, a stable C ABI), through ctypes on
    the libcublas that ``cuda-pathfinder`` finds (the CUDA install or the nvidia-cublas wheel).
    Loading it takes a while: :class:`~.cudadrv.Background` does it while the context is made."""

    def __init__(self) -> None:
        from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib

        try:
            loaded = load_nvidia_dynamic_lib("cublas")
            lib = ctypes.CDLL(loaded.abs_path)
        except (DynamicLibNotFoundError, OSError) as exc:
            raise Unavailable(f"cuBLAS could not be loaded ({exc})") from exc
        self.path = loaded.abs_path
        vp, i = ctypes.c_void_p, ctypes.c_int
        self._create = lib.cublasCreate_v2
        self._create.argtypes = [ctypes.POINTER(vp)]
        self._set_stream = lib.cublasSetStream_v2
        self._set_stream.argtypes = [vp, vp]
        self._gemm = lib.cublasGemmEx
        self._gemm.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        for fn in (self._create, self._set_stream, self._gemm):
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


class CudaSpeed:
    """cuda-bindings' driver API on the worker's :class:`~.cudadrv.Gpu` and cuBLAS; no torch.
    Nothing is freed at the end: the buffers go with the step (:meth:`close`)."""

    name = "cuda"

    def __init__(self, gpu: Any, cublas: Cublas, capability: list[int]) -> None:
        self.gpu, self.cublas = gpu, cublas
        self.dtype = "bf16" if tuple(capability) >= (8, 0) else "fp16"

    def setup(self) -> None:
        gpu, call = self.gpu, self.gpu.drv.call
        self.src = gpu.alloc(D2D_BYTES)
        self.dst = gpu.alloc(D2D_BYTES)
        # Pinned and left as the kernel hands it out: a copy's speed does not depend on the data.
        self.host = int(call("cuMemAllocHost", COPY_BYTES))
        # A and B are the first two n x n blocks of src (fp16 has the same size); C lands in dst.
        gpu.kernels().bf16(self.src, D2D_BYTES // 2)
        self.ev0, self.ev1 = gpu.event(), gpu.event()
        self.blas = self.cublas.create(gpu.s_handle)
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        gpu.sync()

    def _op(self, kind: str) -> None:
        call, s = self.gpu.drv.call, self.gpu.stream
        if kind == "h2d":
            call("cuMemcpyHtoDAsync", self.dst, self.host, COPY_BYTES, s)
        elif kind == "d2h":
            call("cuMemcpyDtoHAsync", self.host, self.dst, COPY_BYTES, s)
        elif kind == "d2d":
            call("cuMemcpyDtoDAsync", self.dst, self.src, D2D_BYTES, s)
        else:
            n = GEMM_N
            t = CUDA_R_16BF if self.dtype == "bf16" else CUDA_R_16F
            self.cublas.gemm_ex(self.blas, n, a=self.src, b=self.src + n * n * 2, c=self.dst,
                                dtype=t, alpha=self.alpha, beta=self.beta)

    def timed(self, kind: str, warmup: int, iters: int) -> float:
        for _ in range(warmup):
            self._op(kind)
        self.gpu.record(self.ev0)
        for _ in range(iters):
            self._op(kind)
        self.gpu.record(self.ev1)
        return float(self.gpu.elapsed_s(self.ev0, self.ev1))

    def close(self) -> None:
        """Give the memory back before the next step (the all-reduce's buffer)."""
        call = self.gpu.drv.call
        self.gpu.sync()
        for ptr in (self.src, self.dst):
            self.gpu.free(ptr)
        call("cuMemFreeHost", self.host)


class TorchSpeed:
    """The same measurements through torch (``pin_memory``, ``torch.cuda.Event``,
    ``torch.matmul``)."""

    name = "torch"

    def __init__(self, torch: Any, index: int, capability: list[int]) -> None:
        self.torch, self.index = torch, index
        self.dtype = "bf16" if tuple(capability) >= (8, 0) else "fp16"

    def setup(self) -> None:
        torch = self.torch
        dev = torch.device("cuda", self.index)
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
        torch.cuda.synchronize(dev)

    def _op(self, kind: str) -> None:
        if kind == "h2d":
            self.hdst.copy_(self.host, non_blocking=True)
        elif kind == "d2h":
            self.host.copy_(self.hdst, non_blocking=True)
        elif kind == "d2d":
            self.dst.copy_(self.src)
        else:
            self.torch.matmul(self.a, self.b, out=self.c)

    def timed(self, kind: str, warmup: int, iters: int) -> float:
        with self.torch.cuda.stream(self.stream):
            for _ in range(warmup):
                self._op(kind)
            self.ev0.record()
            for _ in range(iters):
                self._op(kind)
            self.ev1.record()
        self.ev1.synchronize()
        return float(self.ev0.elapsed_time(self.ev1)) / 1000

    def close(self) -> None:
        self.torch.cuda.synchronize(self.index)
        del self.src, self.dst, self.host, self.hdst, self.a, self.b, self.c
        self.torch.cuda.empty_cache()


class CpuSpeed:
    """Host memory copies and a tiny pure-Python multiply: tests the plumbing without a GPU."""

    name = "cpu"
    dtype = "fp64"
    nbytes = 16 << 20
    n = 24

    def setup(self) -> None:
        self.src = bytearray(os.urandom(1 << 16)) * (self.nbytes >> 16)
        self.dst = bytearray(self.nbytes)
        rng = random.Random(16)
        self.a = [[rng.uniform(-1, 1) for _ in range(self.n)] for _ in range(self.n)]

    def timed(self, kind: str, warmup: int, iters: int) -> float:
        start = time.perf_counter()
        for _ in range(iters):
            if kind == "gemm":
                a, n = self.a, self.n
                [[sum(a[i][k] * a[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
            else:
                self.dst[:] = self.src
        return time.perf_counter() - start

    def close(self) -> None:
        del self.src, self.dst


CPU_DEVICE = {"name": "CPU", "capability": None, "sm_count": None, "bus_width_bits": None}


def figure(kind: str, seconds: float, iters: int, engine: Any) -> float:
    """GB/s (1e9 B/s) for copies (d2d counts read + write), TFLOP/s for gemm."""
    if isinstance(engine, CpuSpeed):
        per = 2 * engine.n ** 3 if kind == "gemm" else engine.nbytes * (2 if kind == "d2d" else 1)
    else:
        per = (2 * GEMM_N ** 3 if kind == "gemm" else
               2 * D2D_BYTES if kind == "d2d" else COPY_BYTES)
    scale = 1e12 if kind == "gemm" else 1e9
    return per * iters / seconds / scale


def measure(engine: Any, kinds: list[str], enter: Any, send: Any) -> dict[str, float]:
    """Each kind in turn (``enter(kind)`` first): ``send`` gets the figure; returns the seconds
    each phase took."""
    times = {}
    for kind in kinds:
        enter(kind)
        t0 = time.perf_counter()
        warmup, iters = ITERATIONS[kind]
        seconds = engine.timed(kind, warmup, iters)
        send(kind=kind, value=figure(kind, seconds, iters, engine), time_s=seconds, iters=iters)
        times[kind] = time.perf_counter() - t0
    return times
