"""The all-reduce step (stdlib at import time): nccl4py on the worker's CUDA context, or torch.

Method (docs/bandwidth.md): per size, untimed warm-up all-reduces (communicator creation and the
first collective are init, never timed), a barrier, then back-to-back timed all-reduces between
CUDA events recorded on the stream, as nccl-tests does (gloo: the host clock); time per op =
elapsed / iterations. Then the exact check: a fresh integer-valued float32 pattern, one
all-reduce, every element compared with the expected sum.

Rendezvous: rank 0 publishes what the others need (the torch engine: its TCPStore's port on
127.0.0.1, port 0 so the OS picks it; nccl4py: the NCCL unique id) and the parent writes it to
the other ranks' stdin. Across nodes (``preflight cluster``: ``store`` in the plan) the torch
ranks are clients of the cluster's store; the nccl4py unique id still comes through the parent.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from . import wire

#: Length of the repeating data pattern; values stay small integers so float32 sums are exact.
PATTERN_LEN = 4096
#: ncclDataType_t / ncclRedOp_t values of nccl.h (a stable ABI): ncclFloat32, ncclSum.
NCCL_FLOAT32, NCCL_SUM = 7, 0
#: Sockets a TCPStore serves on (closed with the process).
_KEEP_OPEN: list[Any] = []


def pattern(i: int) -> int:
    return ((i % PATTERN_LEN) * 7919) % 1021


def _corrupt_me(rank: int) -> bool:
    value = os.environ.get(wire.CORRUPT_ENV)
    return value is not None and value.strip() == str(rank)


class Step:
    """What both engines share: the plan's fields, the progress pipe and the phase clock."""

    def __init__(self, plan: dict[str, Any], progress: wire.Progress, control: wire.Control,
                 clock: wire.Clock, *, enter: Callable[[str, int | None], None]) -> None:
        self.plan, self.progress, self.control, self.clock = plan, progress, control, clock
        self.enter = enter
        self.rank, self.world = int(plan["rank"]), int(plan["world_size"])
        self.sizes = [int(s) for s in plan["sizes"]]
        self.warmup, self.iters = int(plan["warmup"]), int(plan["iters"])
        self.timeout_s = float(plan["timeout_s"])
        self.corrupt = _corrupt_me(self.rank)

    def phase(self, phase: str, size: int | None = None) -> None:
        self.enter(phase, size)


# ---------------------------------------------------------------------------------------- torch
def _loopback_store(tcp_store: Any, world_size: int, timeout: Any) -> Any:
    """Rank 0's TCPStore listening on 127.0.0.1 only: a store torch opens itself listens on every
    interface, so the socket is bound here (port 0: the OS picks one) and handed over."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(max(16, world_size))
        port = sock.getsockname()[1]
        try:
            store = tcp_store("127.0.0.1", port, world_size, True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=sock.fileno())
            _KEEP_OPEN.append(sock)  # the store serves on this fd: it must outlive the call
            return store
        except TypeError:  # a torch without master_listen_fd: its own socket, on every interface
            sock.close()
            return tcp_store("127.0.0.1", 0, world_size, True, timeout=timeout,
                             wait_for_workers=False)
    except BaseException:
        sock.close()
        raise


def open_store(dist: Any, plan: dict[str, Any], *, rank: int, world: int, timeout_s: float,
               progress: wire.Progress, control: wire.Control) -> Any:
    """The rendezvous store of torch.distributed: across nodes a client of the cluster's store
    (``store`` "HOST:PORT" in the plan, keys under ``store_prefix``); on one node rank 0's
    store on 127.0.0.1, its port published to the others through the parent."""
    tcp_store: Any = dist.TCPStore
    timeout = datetime.timedelta(seconds=timeout_s)
    store_at = plan.get("store")
    if store_at:
        host, _, port_text = str(store_at).rpartition(":")
        return dist.PrefixStore(str(plan.get("store_prefix", "")),
                                tcp_store(host, int(port_text), None, False, timeout=timeout))
    if rank == 0:
        store = _loopback_store(tcp_store, world, timeout)
        progress.send(wire.PUBLISH, port=int(store.port))
        return store
    port = int(control.get(wire.PORT, timeout_s))
    return tcp_store("127.0.0.1", port, world, False, timeout=timeout)


def run_torch(s: Step, torch: Any, device: Any) -> None:
    """In phase ``init`` already (the caller entered it)."""
    import torch.distributed as dist

    nccl = None
    if device.type == "cuda":
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            nccl = None
    s.progress.send(wire.ENGINE, step=wire.ALLREDUCE, engine="torch", nccl=nccl)
    timeout = datetime.timedelta(seconds=s.timeout_s)
    store = open_store(dist, s.plan, rank=s.rank, world=s.world, timeout_s=s.timeout_s,
                       progress=s.progress, control=s.control)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device  # eager communicator creation (torch >= 2.3): init, untimed
    dist.init_process_group(s.plan["backend"], store=store, rank=s.rank, world_size=s.world,
                            timeout=timeout, **kwargs)
    try:
        s.clock.lap("nccl_init")
        buf = torch.empty(max(s.sizes) // 4, dtype=torch.float32, device=device)
        s.clock.lap("allocation")
        _barrier(torch, dist, device)
        s.clock.lap("nccl_init")
        for i, size in enumerate(s.sizes):
            _one_size(s, torch, dist, buf[: size // 4], size=size, device=device, first=i == 0)
    finally:
        dist.destroy_process_group()


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(torch: Any, dist: Any, device: Any) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    _sync(torch, device)


def _base(torch: Any, device: Any) -> Any:
    return ((torch.arange(PATTERN_LEN, dtype=torch.int32, device=device) * 7919) % 1021).to(
        torch.float32)


def _fill(torch: Any, out: Any, offset: float) -> None:
    """The pattern plus ``offset`` into ``out``, block by block (no second full buffer)."""
    base = _base(torch, out.device) + offset
    n = out.numel()
    full = n // PATTERN_LEN
    if full:
        out[: full * PATTERN_LEN].view(full, PATTERN_LEN).copy_(base.expand(full, PATTERN_LEN))
    tail = n - full * PATTERN_LEN
    if tail:
        out[full * PATTERN_LEN:].copy_(base[:tail])


def _one_size(s: Step, torch: Any, dist: Any, buf: Any, *, size: int, device: Any,
              first: bool) -> None:
    n = s.world
    s.phase("warmup", size)
    _fill(torch, buf, float(s.rank + 1))
    first_s = None
    for i in range(s.warmup):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        if i == 0 and first:
            _sync(torch, device)
            first_s = time.perf_counter() - t0
    _barrier(torch, dist, device)
    s.clock.lap("warmup")
    s.phase("measure", size)
    if device.type == "cuda":
        # CUDA events around the timed calls, as nccl-tests times (a CUDA graph of the calls was
        # tried on 2x H200 and was slower from 4 MiB: docs/benchmarks.md).
        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)
        start_ev.record()
        for _ in range(s.iters):
            dist.all_reduce(buf)
        end_ev.record()
        end_ev.synchronize()
        elapsed, timer = start_ev.elapsed_time(end_ev) / 1e3, "cuda-events"
    else:
        start = time.perf_counter()
        for _ in range(s.iters):
            dist.all_reduce(buf)
        elapsed, timer = time.perf_counter() - start, "host"
    s.progress.send(wire.MEASURED, size=size, time_s=elapsed / s.iters, iters=s.iters,
                    first_allreduce_s=first_s, timer=timer)
    s.phase("verify", size)
    _fill(torch, buf, float(s.rank + 1))
    dist.all_reduce(buf)
    if s.corrupt:
        buf[buf.numel() // 2] += 1
    # Expected: the sum over ranks of pattern + (r + 1) = n * pattern + n(n+1)/2.
    rows_len = (buf.numel() // PATTERN_LEN) * PATTERN_LEN
    want = _base(torch, device) * n + n * (n + 1) / 2
    mismatch = torch.empty(buf.numel(), dtype=torch.bool, device=device)
    if rows_len:
        rows = rows_len // PATTERN_LEN
        torch.ne(buf[:rows_len].view(rows, PATTERN_LEN), want.expand(rows, PATTERN_LEN),
                 out=mismatch[:rows_len].view(rows, PATTERN_LEN))
    if rows_len < buf.numel():
        torch.ne(buf[rows_len:], want[: buf.numel() - rows_len], out=mismatch[rows_len:])
    bad = int(mismatch.sum().item())
    fields: dict[str, Any] = {"size": size, "ok": bad == 0, "mismatches": bad,
                              "elements": buf.numel()}
    if bad:
        first_bad = int(mismatch.to(torch.uint8).argmax().item())
        fields.update(first_index=first_bad, got=float(buf[first_bad].item()),
                      want=float(want[first_bad % PATTERN_LEN].item()))
    s.progress.send(wire.VERIFIED, **fields)
    del mismatch
    s.clock.lap("sweep")


# -------------------------------------------------------------------------------------- nccl4py
def import_nccl(libnccl: str | None) -> Any:
    """``nccl.bindings.nccl`` (nccl4py's C API layer; ``nccl.core`` costs 0.25 s more), after
    loading ``libnccl`` (the training environment's) globally: cuda-pathfinder then takes the
    library already loaded."""
    import ctypes
    from importlib import import_module

    if libnccl:
        try:
            ctypes.CDLL(libnccl, mode=os.RTLD_GLOBAL)
        except OSError as exc:
            raise RuntimeError(f"cannot load the training environment's NCCL {libnccl}: "
                               f"{exc}") from None
    return import_module("nccl.bindings.nccl")


def run_nccl4py(s: Step, gpu: Any, nccl: Any) -> None:
    """On the worker's :class:`~.cudadrv.Gpu`: the communicator is created in a thread while the
    buffer is allocated and filled (on the GPU, by ``pf_fill``); the exact check runs on the GPU
    too (``pf_check``: no host copy of the buffer). Nothing is destroyed: the process exits
    right after (``ncclCommDestroy`` alone costs 0.5 s, docs/benchmarks.md)."""
    import ctypes

    from .cudadrv import Background

    libnccl = s.plan.get("libnccl")
    lib_path = nccl.get_library_path()
    if libnccl and os.path.isabs(libnccl) and lib_path and \
            os.path.realpath(lib_path) != os.path.realpath(libnccl):
        raise RuntimeError(f"nccl4py loaded {lib_path}, not the training environment's "
                           f"{libnccl}")
    s.progress.send(wire.ENGINE, step=wire.ALLREDUCE, engine="nccl4py",
                    nccl_code=int(nccl.get_version()))

    def init_comm() -> Any:
        gpu.make_current()
        if s.rank == 0:
            uid = bytes(nccl.get_unique_id())
            s.progress.send(wire.PUBLISH, uid=uid.hex())
        else:
            uid = bytes.fromhex(s.control.get(wire.UID, s.timeout_s))
        # As nccl4py's Communicator.init: one unique id (a writable buffer), no config.
        return nccl.comm_init_rank_scalable(s.world, s.rank, 1, bytearray(uid), 0)

    comm_job = Background(init_comm, "nccl-init")
    largest = max(s.sizes)
    ptr = int(nccl.mem_alloc(largest)) if s.plan.get("alloc") == "nccl" else gpu.alloc(largest)
    out = gpu.alloc(16)  # [mismatch count, lowest mismatching index] of the last check
    kernels = gpu.kernels()

    def fill(size: int) -> None:
        n = size // 4
        kernels.launch("pf_fill", n, ctypes.c_uint64(ptr), ctypes.c_uint64(n),
                       ctypes.c_float(s.rank + 1))
        gpu.sync()

    fill(s.sizes[0])
    s.clock.times["allocation"] = time.perf_counter() - s.clock.mark
    comm = comm_job.join()
    s.clock.lap("nccl_init")
    s.clock.times["nccl_init"] = max(comm_job.seconds, s.clock.times["nccl_init"]
                                     - s.clock.times["allocation"])

    def allreduce(count: int) -> None:
        # The raw binding: a few microseconds of host time per call, so even 1 MiB is GPU-bound.
        nccl.all_reduce(ptr, ptr, count, NCCL_FLOAT32, NCCL_SUM, comm, gpu.s_handle)

    def barrier() -> None:
        allreduce(1)
        gpu.sync()

    def check(size: int) -> dict[str, Any]:
        n = size // 4
        if s.corrupt:  # the test-only corruption: the middle element, plus 1
            at = ptr + 4 * (n // 2)
            gpu.write(at, ctypes.c_float(gpu.read(at, ctypes.c_float) + 1))
        add = s.world * (s.world + 1) / 2
        gpu.drv.call("cuMemsetD32Async", out, 0, 2, gpu.s_handle)
        gpu.drv.call("cuMemsetD32Async", out + 8, 0xFFFFFFFF, 2, gpu.s_handle)
        kernels.launch("pf_check", n, ctypes.c_uint64(ptr), ctypes.c_uint64(n),
                       ctypes.c_float(s.world), ctypes.c_float(add), ctypes.c_uint64(out))
        bad, first_bad = gpu.read(out, ctypes.c_uint64), gpu.read(out + 8, ctypes.c_uint64)
        fields: dict[str, Any] = {"size": size, "ok": bad == 0, "mismatches": int(bad),
                                  "elements": n}
        if bad:
            fields.update(first_index=int(first_bad),
                          got=float(gpu.read(ptr + 4 * first_bad, ctypes.c_float)),
                          want=float(pattern(first_bad) * s.world + add))
        return fields

    # The first collective sets up NCCL's connections lazily and waits for a rank still
    # initialising: both belong to init, not to the first measured size.
    barrier()
    s.clock.lap("nccl_init")
    start, end = gpu.event(), gpu.event()
    for i, size in enumerate(s.sizes):
        count = size // 4
        s.phase("warmup", size)
        if i:
            fill(size)
        first_s = None
        for w in range(s.warmup):
            t0 = time.perf_counter()
            allreduce(count)
            if w == 0 and i == 0:
                gpu.sync()
                first_s = time.perf_counter() - t0
        barrier()
        s.clock.lap("warmup")
        s.phase("measure", size)
        gpu.record(start)
        for _ in range(s.iters):
            allreduce(count)
        gpu.record(end)
        elapsed = gpu.elapsed_s(start, end)
        s.progress.send(wire.MEASURED, size=size, time_s=elapsed / s.iters, iters=s.iters,
                        first_allreduce_s=first_s, timer="cuda-events")
        s.phase("verify", size)
        fill(size)
        allreduce(count)
        s.progress.send(wire.VERIFIED, **check(size))
        s.clock.lap("sweep")
    barrier()  # every rank is past its last all-reduce before any of them exits
