"""One GPU through the CUDA driver API (``cuda.bindings.driver``), shared by the speed and the
all-reduce steps of a worker: one primary context, one stream, timing events, and the small PTX
kernels of ``kernels.ptx`` (fill and exact check of the all-reduce buffer, the bf16 matrices of
the multiply) that the driver compiles for the GPU it runs on. Plus :class:`Background`, a call
run in a thread so that the slow parts of the start (the driver's own initialisation, imports,
libraries) overlap.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable
from typing import Any

#: Threads per block and the most blocks of a kernel launch (grid-stride loops beyond that).
BLOCK = 256
MAX_BLOCKS = 4096
KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.ptx")


class CudaError(RuntimeError):
    """A driver call failed: the call, CUDA's error name and its description."""


class Background:
    """``fn()`` in a thread (the bindings release the GIL); :meth:`join` returns its result or
    re-raises its exception in the caller's thread."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0

        def body() -> None:
            t0 = time.perf_counter()
            try:
                self.result = fn()
            except BaseException as exc:  # re-raised by join() in the caller's thread
                self.error = exc
            self.seconds = time.perf_counter() - t0

        self._thread = threading.Thread(target=body, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the call returned (its outcome is left to :meth:`join`)."""
        self._thread.join()

    def join(self) -> Any:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def early_init(index: int | None, bus_id: str | None, *, context: bool = True) -> None:
    """cuInit and the device's primary context through libcuda itself (ctypes: no import to wait
    for), so that the driver's initialisation (0.1-0.6 s) overlaps the imports; cuda.bindings and
    torch then find both ready. ``context=False``: cuInit alone, which creates no context and
    takes no GPU memory (a worker started before the parent knows the GPUs are idle). Errors are
    left to the later calls, which name them."""
    with contextlib.suppress(OSError, AttributeError):
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0 or not context:
            return
        dev = ctypes.c_int()
        found = (cuda.cuDeviceGetByPCIBusId(ctypes.byref(dev), bus_id.encode()) if bus_id
                 else cuda.cuDeviceGet(ctypes.byref(dev), int(index or 0)))
        if found != 0:
            return
        ctx = ctypes.c_void_p()
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)


class Driver:
    """``cuda.bindings.driver`` with its (CUresult, *values) returns checked: ``call(name, ...)``
    returns the values or raises :class:`CudaError` naming the call and CUDA's error."""

    def __init__(self, module: Any) -> None:
        self.cu = module

    def call(self, name: str, *args: Any) -> Any:
        result = getattr(self.cu, name)(*args)
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise CudaError(f"CUDA {name} failed: {self.error_text(err)}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def error_text(self, err: Any) -> str:
        try:
            _, name = self.cu.cuGetErrorName(err)
            _, text = self.cu.cuGetErrorString(err)
            return f"{name.decode()} ({text.decode()})"
        except Exception:  # an unknown code: the number says enough
            return f"error {int(err)}"


class Gpu:
    """The worker's GPU: its primary context (current on every thread that calls CUDA or NCCL:
    :meth:`make_current`), one non-blocking stream, timing events, the facts CUDA reports."""

    def __init__(self, drv: Driver, *, index: int | None, bus_id: str | None) -> None:
        self.drv = drv
        drv.call("cuInit", 0)
        if bus_id:
            self.device = drv.call("cuDeviceGetByPCIBusId", bus_id.encode())
        else:
            count = drv.call("cuDeviceGetCount")
            if int(index or 0) >= count:
                raise CudaError(f"needs cuda:{index} but CUDA sees {count} GPU(s)")
            self.device = drv.call("cuDeviceGet", int(index or 0))
        self.context = drv.call("cuDevicePrimaryCtxRetain", self.device)
        self.make_current()
        raw = drv.call("cuDeviceGetPCIBusId", 32, self.device)
        self.bus_id = (raw if isinstance(raw, str) else bytes(raw).decode()).split("\0")[0]
        self.stream = drv.call("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING
        self.s_handle = int(self.stream)
        self._kernels: Kernels | None = None

    def facts(self) -> dict[str, Any]:
        attr = self.drv.cu.CUdevice_attribute

        def get(name: str) -> int:
            return int(self.drv.call("cuDeviceGetAttribute", getattr(attr, name), self.device))

        cc = [get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
              get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")]
        name = self.drv.call("cuDeviceGetName", 256, self.device)
        return {"bus_id": self.bus_id, "name": bytes(name).split(b"\0")[0].decode(),
                "capability": cc, "sm_count": get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
                "bus_width_bits": get("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH")}

    def make_current(self) -> None:
        self.drv.call("cuCtxSetCurrent", self.context)

    def sync(self) -> None:
        self.drv.call("cuStreamSynchronize", self.stream)

    def alloc(self, nbytes: int) -> int:
        return int(self.drv.call("cuMemAlloc", nbytes))

    def free(self, ptr: int) -> None:
        self.drv.call("cuMemFree", ptr)

    def event(self) -> Any:
        return self.drv.call("cuEventCreate", 0)  # CU_EVENT_DEFAULT: timing enabled

    def record(self, event: Any) -> None:
        self.drv.call("cuEventRecord", event, self.stream)

    def elapsed_s(self, start: Any, end: Any) -> float:
        self.drv.call("cuEventSynchronize", end)
        name = ("cuEventElapsedTime" if hasattr(self.drv.cu, "cuEventElapsedTime")
                else "cuEventElapsedTime_v2")
        return float(self.drv.call(name, start, end)) / 1e3

    def read(self, address: int, ctype: Any) -> Any:
        value = ctype()
        self.drv.call("cuMemcpyDtoHAsync", ctypes.addressof(value), address,
                      ctypes.sizeof(value), self.s_handle)
        self.sync()
        return value.value

    def write(self, address: int, value: Any) -> None:
        self.drv.call("cuMemcpyHtoDAsync", address, ctypes.addressof(value),
                      ctypes.sizeof(value), self.s_handle)
        self.sync()

    def kernels(self) -> Kernels:
        if self._kernels is None:
            self._kernels = Kernels(self)
        return self._kernels


class Kernels:
    """The PTX of ``kernels.ptx``, compiled by the driver for this GPU (a few ms; the driver's
    JIT cache keeps it): ``pf_fill`` / ``pf_check`` (the all-reduce pattern and its exact check)
    and ``pf_bf16`` (pseudo-random bf16 values in [-1, 1] for the matrix multiply)."""

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        with open(KERNELS, "rb") as f:
            image = ctypes.create_string_buffer(f.read())
        self.module = gpu.drv.call("cuModuleLoadData", ctypes.addressof(image))
        self.fn = {name: gpu.drv.call("cuModuleGetFunction", self.module, name.encode())
                   for name in ("pf_fill", "pf_check", "pf_bf16")}

    def launch(self, name: str, n: int, *params: Any) -> None:
        """``name`` over ``n`` elements (grid-stride), ``params`` as ctypes values."""
        blocks = max(1, min(MAX_BLOCKS, -(-n // BLOCK)))
        argv = (ctypes.c_void_p * len(params))(*[ctypes.addressof(p) for p in params])
        self.gpu.drv.call("cuLaunchKernel", self.fn[name], blocks, 1, 1, BLOCK, 1, 1, 0,
                          self.gpu.s_handle, ctypes.addressof(argv), 0)

    def bf16(self, ptr: int, count: int, seed: int = 16) -> None:
        self.launch("pf_bf16", count, ctypes.c_uint64(ptr), ctypes.c_uint64(count),
                    ctypes.c_uint32(seed))
