"""One rank of the all-reduce test: the only module of the bench that imports torch or NCCL.

Started by :mod:`preflight.bench.parent` as ``python .../bench/worker.py --rank R ...``, one
process per GPU (NCCL) or per ``--nproc`` (gloo on CPU). It reports every phase it enters and
leaves as JSON lines on the file descriptor ``--progress-fd`` (stdout and stderr are left to
NCCL_DEBUG and tracebacks), plus a heartbeat every ``HEARTBEAT_S`` from a thread, so the parent
can tell a rank that is frozen (no heartbeat: SIGSTOP, a stuck driver call holding the GIL) from a
rank that is alive but waiting in a collective for a peer.

Two engines (``--engine``, docs/bandwidth.md):

* ``nccl4py``: no torch. NVIDIA's ``nccl4py`` (its C API binding ``nccl.bindings.nccl``) and
  ``cuda-bindings`` (the driver API); ``cuda-pathfinder`` loads the ``libnccl.so.2`` of the
  interpreter's environment (the training venv with ``--python``), or the one ``--libnccl``
  names. The buffer is filled and checked on the GPU by two small PTX kernels. Rendezvous: rank
  0 makes the NCCL unique id and reports it, the parent writes it to the other ranks' stdin. No
  TCP store.
* ``torch``: ``torch.distributed`` (NCCL, or gloo on CPU). Rendezvous: rank 0 hosts a TCPStore on
  127.0.0.1 with port 0, so the OS picks a free port; the parent relays it like the unique id.

``auto`` takes nccl4py when the interpreter can import it, else torch; gloo is always torch.

Across nodes (``preflight cluster``, ``--store HOST:PORT``): ``--rank`` / ``--world-size`` are
global and ``--local-rank`` picks the GPU. The torch engine's ranks are clients of the cluster's
store under ``--store-prefix``; the nccl4py engine (only when asked for by name: ``auto`` with
``--store`` stays torch) reads the unique id from stdin as on one node, the parents carrying it
between nodes through the cluster's store.

Method (docs/bandwidth.md): per size, ``warmup`` untimed all-reduces (communicator creation is in
init, never timed), a barrier, then ``iters`` back-to-back all-reduces timed by CUDA events
recorded on the stream before and after them (as nccl-tests does: the GPU's time, not the host's
enqueue loop; gloo: the host clock); time per op = elapsed / iters. Then the exact check: a fresh
integer-valued float32 pattern, one all-reduce, compared element by element with the expected sum.
The worker reports how long each phase took (imports, CUDA context, NCCL init, allocation,
warm-up, sweep) and how long the first all-reduce of the first size took.

``PREFLIGHT_BENCH_TEST_CORRUPT_RANK`` (test-only, documented in docs/bandwidth.md): the named rank
adds 1 to one element of its result before the check, so the tests can prove a wrong sum is caught.
It needs the exact variable name; nothing sets it but the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

HEARTBEAT_S = 0.5
#: Length of the repeating data pattern; values stay small integers so float32 sums are exact.
PATTERN_LEN = 4096
CORRUPT_ENV = "PREFLIGHT_BENCH_TEST_CORRUPT_RANK"
_PR_SET_PDEATHSIG = 1
#: Sockets whose file descriptors a TCPStore serves on (closed with the process).
_KEEP_OPEN: list[Any] = []


class Progress:
    """JSON lines to the parent on one pipe; one lock so the heartbeat never splits a line."""

    def __init__(self, fd: int, rank: int) -> None:
        self._file = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()
        self.rank = rank

    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "rank": self.rank, "t": time.time(), **fields})
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (BrokenPipeError, ValueError):
                # The parent is gone: nobody is left to report to, and nothing may keep running.
                os._exit(3)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker when the parent dies (Linux PR_SET_PDEATHSIG), even while stopped;
    then check the parent did not die before the call."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(3)


def _heartbeat(progress: Progress, parent_pid: int) -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        if os.getppid() != parent_pid:
            # Orphaned (the parent was killed): a validator must not leave processes behind.
            os._exit(3)
        progress.send("hb")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="preflight.bench.worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    p.add_argument("--engine", choices=("auto", "torch", "nccl4py"), default="auto")
    p.add_argument("--alloc", choices=("device", "nccl"), default="device",
                   help="nccl4py: cuMemAlloc, or ncclMemAlloc")
    p.add_argument("--libnccl", default=None, metavar="PATH",
                   help="nccl4py: load this libnccl.so.2 (the training environment's) first")
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--progress-fd", type=int, required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="deadline of the store and of each collective inside torch")
    # Multi-node (preflight cluster): --rank/--world-size are global, the device is --local-rank,
    # and every rank is a client of the cluster agent's store (no port through stdin).
    p.add_argument("--local-rank", type=int, default=None, help="device index (default --rank)")
    p.add_argument("--store", metavar="HOST:PORT", default=None,
                   help="join this TCPStore as a client instead of rank 0 hosting one")
    p.add_argument("--store-prefix", default="", help="key prefix inside --store")
    return p.parse_args(argv)


def _read_rendezvous(key: str, timeout_s: float) -> Any:
    """What rank 0 published (store port, NCCL unique id), written by the parent to our stdin."""
    import select

    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no rendezvous {key} from the parent within {timeout_s:g} s")
    line = sys.stdin.readline()
    if not line:
        raise EOFError("the parent closed the control pipe before the rendezvous")
    return json.loads(line)[key]


def _pick_engine(args: argparse.Namespace) -> str:
    if args.backend == "gloo" or args.engine == "torch":
        return "torch"
    if args.engine == "nccl4py":
        # Across nodes only when the cluster agent chose it for every node of the group (its
        # parents relay the unique id through the cluster's store).
        return "nccl4py"
    if args.store:
        # auto across nodes: the engine must be the same on every node, which one node's
        # interpreter cannot tell; torch.distributed meets in the cluster's TCPStore.
        return "torch"
    import importlib.util

    found = all(importlib.util.find_spec(m) is not None for m in ("nccl", "cuda"))
    return "nccl4py" if found else "torch"


def main(argv: list[str] | None = None) -> int:
    t_main = time.time()
    args = _parse(sys.argv[1:] if argv is None else argv)
    parent = args.parent_pid or os.getppid()
    _die_with_parent(parent)
    progress = Progress(args.progress_fd, args.rank)
    progress.send("started", t_main=t_main)
    threading.Thread(target=_heartbeat, args=(progress, parent), daemon=True,
                     name="heartbeat").start()
    corrupt = os.environ.get(CORRUPT_ENV)
    corrupt_me = corrupt is not None and corrupt.strip() == str(args.rank)
    sizes = [int(s) for s in args.sizes.split(",")]
    phase = "spawn"
    engine = "torch"
    code = 0
    try:
        engine = _pick_engine(args)
        runner = _run_nccl4py if engine == "nccl4py" else _run_torch
        runner(args, progress, sizes, corrupt_me)
    except Exception as exc:
        progress.send("error", phase=phase, error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-4000:])
        code = 1
    if engine == "nccl4py":
        if code == 0:
            # A peer may still be finishing the last barrier with data of ours: exit only once
            # the parent has seen every rank done (it closes our stdin then).
            await_release(sys.stdin, args.timeout_s)
        # Everything is reported: the process exit releases the CUDA context, the buffers and
        # NCCL's threads and sockets at once, and the parent waits for it before it reports.
        # ncclCommDestroy first would add 0.5 s (NCCL's proxy service thread sees the stop only
        # at its 500 ms poll timeout; docs/benchmarks.md); the interpreter's finalisation is
        # skipped for the same reason.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def await_release(stream: Any, timeout_s: float) -> None:
    """Block until ``stream`` (the parent's control pipe) has a line or reaches end of file, at
    most ``timeout_s``: the parent closes it once every local rank reported done."""
    import select

    try:
        ready, _, _ = select.select([stream], [], [], timeout_s)
        if ready:
            stream.readline()
    except (OSError, ValueError):
        pass


class Clock:
    """Phase durations of one rank, in seconds, sent with ``done``."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self._mark
        self._mark = now


# ---------------------------------------------------------------------------------------- torch
def _run_torch(args: argparse.Namespace, progress: Progress, sizes: list[int],
               corrupt_me: bool) -> None:
    clock = Clock()
    import torch
    import torch.distributed as dist

    clock.lap("imports")
    tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]
    device = _device(torch, args)
    clock.lap("cuda_context")
    progress.send("spawned", pid=os.getpid(), device=str(device), engine="torch",
                  pci_bus_id=_bus_id(torch, device), torch=torch.__version__,
                  nccl=_torch_nccl_version(torch, device))
    progress.send("phase", phase="init")
    timeout = datetime.timedelta(seconds=args.timeout_s)
    if args.store:
        host, _, port_text = args.store.rpartition(":")
        store = dist.PrefixStore(args.store_prefix,  # type: ignore[attr-defined]
                                 tcp_store(host, int(port_text), None, False, timeout=timeout))
    elif args.rank == 0:
        store = _loopback_store(tcp_store, args.world_size, timeout)
        progress.send("store", port=int(store.port))
    else:
        port = int(_read_rendezvous("port", args.timeout_s))
        store = tcp_store("127.0.0.1", port, args.world_size, False, timeout=timeout)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        # Eager communicator creation (torch >= 2.3), so it is part of init, never timed.
        kwargs["device_id"] = device
    dist.init_process_group(args.backend, store=store, rank=args.rank,
                            world_size=args.world_size, timeout=timeout, **kwargs)
    try:
        clock.lap("nccl_init")
        buf = torch.empty(max(sizes) // 4, dtype=torch.float32, device=device)
        clock.lap("allocation")
        _barrier(torch, dist, device)
        clock.lap("nccl_init")
        progress.send("phase", phase="init", done=True)
        for i, size in enumerate(sizes):
            _one_size(torch, dist, progress, buf[: size // 4], size=size, args=args,
                      device=device, corrupt_me=corrupt_me, clock=clock, first=i == 0)
        progress.send("done", phase_times=clock.times)
    finally:
        dist.destroy_process_group()


def _loopback_store(tcp_store: Any, world_size: int, timeout: Any) -> Any:
    """Rank 0's TCPStore listening on 127.0.0.1 only: torch binds a store it opens itself to every
    interface, so the socket is bound here (port 0: the OS picks a free one) and handed over."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As torch's own store socket: the port is free again as soon as the run ends.
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


def _torch_nccl_version(torch: Any, device: Any) -> str | None:
    if device.type != "cuda":
        return None
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return None


def _device(torch: Any, args: argparse.Namespace) -> Any:
    if args.backend != "nccl":
        return torch.device("cpu")
    index = args.rank if args.local_rank is None else args.local_rank
    count = torch.cuda.device_count()
    if index >= count:
        raise RuntimeError(f"rank {args.rank} needs cuda:{index} but CUDA sees {count} GPU(s)")
    torch.cuda.set_device(index)
    torch.cuda.init()
    return torch.device("cuda", index)


def _bus_id(torch: Any, device: Any) -> str | None:
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    try:
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:  # older torch without the PCI fields
        return None


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
    """``(i * 7919) % 1021`` for i < PATTERN_LEN as float32: small integers, so the sums of a few
    hundred ranks stay exact (< 2**24) and a misplaced block changes values."""
    return ((torch.arange(PATTERN_LEN, dtype=torch.int32, device=device) * 7919) % 1021).to(
        torch.float32)


def _fill(torch: Any, out: Any, offset: float) -> None:
    """Write the pattern plus ``offset`` into ``out`` block by block (no second full buffer)."""
    base = _base(torch, out.device) + offset
    n = out.numel()
    full = n // PATTERN_LEN
    if full:
        out[: full * PATTERN_LEN].view(full, PATTERN_LEN).copy_(base.expand(full, PATTERN_LEN))
    tail = n - full * PATTERN_LEN
    if tail:
        out[full * PATTERN_LEN:].copy_(base[:tail])


def _one_size(torch: Any, dist: Any, progress: Progress, buf: Any, *, size: int,
              args: argparse.Namespace, device: Any, corrupt_me: bool, clock: Clock,
              first: bool) -> None:
    n = args.world_size
    progress.send("phase", phase="warmup", size=size)
    _fill(torch, buf, float(args.rank + 1))
    first_s = None
    for i in range(args.warmup):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        if i == 0 and first:
            _sync(torch, device)
            first_s = time.perf_counter() - t0
    _barrier(torch, dist, device)
    clock.lap("warmup")

    progress.send("phase", phase="measure", size=size)
    timer = "host"
    if device.type == "cuda":
        # CUDA events on the stream around the timed calls, as nccl-tests times. (A CUDA graph
        # of the calls was tried on 2x H200 and was slower from 4 MiB: docs/benchmarks.md.)
        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)
        start_ev.record()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        end_ev.record()
        end_ev.synchronize()
        elapsed = start_ev.elapsed_time(end_ev) / 1e3
        timer = "cuda-events"
    else:
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        elapsed = time.perf_counter() - start
    progress.send("measured", size=size, time_s=elapsed / args.iters, iters=args.iters,
                  first_allreduce_s=first_s, timer=timer)

    progress.send("phase", phase="verify", size=size)
    _fill(torch, buf, float(args.rank + 1))
    dist.all_reduce(buf)
    if corrupt_me:
        buf[buf.numel() // 2] += 1
    # Expected: the sum over ranks of pattern + (r + 1) = n * pattern + n(n+1)/2.
    view_len = (buf.numel() // PATTERN_LEN) * PATTERN_LEN
    want = _base(torch, device) * n + n * (n + 1) / 2
    mismatch = torch.empty(buf.numel(), dtype=torch.bool, device=device)
    if view_len:
        rows = view_len // PATTERN_LEN
        torch.ne(buf[:view_len].view(rows, PATTERN_LEN), want.expand(rows, PATTERN_LEN),
                 out=mismatch[:view_len].view(rows, PATTERN_LEN))
    if view_len < buf.numel():
        torch.ne(buf[view_len:], want[: buf.numel() - view_len], out=mismatch[view_len:])
    bad = int(mismatch.sum().item())
    fields: dict[str, Any] = {"size": size, "ok": bad == 0, "mismatches": bad,
                              "elements": buf.numel()}
    if bad:
        first_bad = int(mismatch.to(torch.uint8).argmax().item())
        fields.update(first_index=first_bad, got=float(buf[first_bad].item()),
                      want=float(want[first_bad % PATTERN_LEN].item()))
    progress.send("verified", **fields)
    del mismatch
    clock.lap("sweep")


# -------------------------------------------------------------------------------------- nccl4py
def _cu_check(result: Any) -> Any:
    """cuda.bindings returns (CUresult, *values): raise on an error, return the values."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err!r}")
    return rest[0] if len(rest) == 1 else rest


class _Background:
    """A call run in a thread (the nccl4py bindings release the GIL), its error re-raised here."""

    def __init__(self, fn: Any, name: str) -> None:
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

    def join(self) -> Any:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result


#: ncclDataType_t / ncclRedOp_t values of nccl.h (a stable ABI): ncclFloat32, ncclSum.
NCCL_FLOAT32 = 7
NCCL_SUM = 0


def _preload(library: str) -> None:
    """Load ``library`` globally before nccl4py asks cuda-pathfinder for libnccl: pathfinder takes
    a libnccl.so.2 that is already loaded, so nccl4py runs the training environment's NCCL."""
    try:
        ctypes.CDLL(library, mode=os.RTLD_GLOBAL)
    except OSError as exc:
        raise RuntimeError(f"cannot load the training environment's NCCL {library}: {exc}") \
            from None


def _early_context(index: int) -> None:
    """cuInit and device ``index``'s primary context through libcuda directly (ctypes: no import
    to wait for); cuda.bindings then finds both ready. Errors are left to those later calls."""
    with contextlib.suppress(OSError, AttributeError):
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0:
            return
        dev = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return
        ctx = ctypes.c_void_p()
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)


class _Gpu:
    """This rank's GPU through the CUDA driver API (``cuda.bindings.driver``): its primary context,
    one non-blocking stream and timing events."""

    def __init__(self, cu: Any, index: int, rank: int) -> None:
        self.cu = cu
        _cu_check(cu.cuInit(0))
        count = _cu_check(cu.cuDeviceGetCount())
        if index >= count:
            raise RuntimeError(f"rank {rank} needs cuda:{index} but CUDA sees {count} GPU(s)")
        self.device = _cu_check(cu.cuDeviceGet(index))
        self.context = _cu_check(cu.cuDevicePrimaryCtxRetain(self.device))
        self.make_current()
        raw = _cu_check(cu.cuDeviceGetPCIBusId(32, self.device))
        self.pci_bus_id = (raw if isinstance(raw, str) else bytes(raw).decode()).split("\0")[0]
        self.stream = _cu_check(cu.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING
        self.s_handle = int(self.stream)

    def make_current(self) -> None:
        """The context is per thread: every thread that calls CUDA or NCCL sets it first."""
        _cu_check(self.cu.cuCtxSetCurrent(self.context))

    def sync(self) -> None:
        _cu_check(self.cu.cuStreamSynchronize(self.stream))

    def event(self) -> Any:
        return _cu_check(self.cu.cuEventCreate(0))  # CU_EVENT_DEFAULT: timing enabled

    def record(self, event: Any) -> None:
        _cu_check(self.cu.cuEventRecord(event, self.stream))

    def elapsed_s(self, start: Any, end: Any) -> float:
        _cu_check(self.cu.cuEventSynchronize(end))
        fn = getattr(self.cu, "cuEventElapsedTime", None) or self.cu.cuEventElapsedTime_v2
        return float(_cu_check(fn(start, end))) / 1e3


def _run_nccl4py(args: argparse.Namespace, progress: Progress, sizes: list[int],
                 corrupt_me: bool) -> None:
    """The torch-free engine, on the low-level layers only: ``cuda.bindings.driver`` and
    ``nccl.bindings.nccl`` (nccl4py's own binding of the C API). Their friendlier layers
    (``cuda.core``, ``nccl.core``) cost another 0.25 s of imports (docs/benchmarks.md). Overlaps
    what does not depend on each other: the CUDA context is created in a thread while the binding
    imports, the buffer is allocated and filled while the communicator initialises."""
    if args.backend != "nccl":
        raise RuntimeError("the nccl4py engine runs NCCL only (gloo needs --engine torch)")
    clock = Clock()
    # Imported by name: optional packages of the workers' interpreter, without type stubs.
    from importlib import import_module

    # The device is the local rank (across nodes --rank is global); on one node they are equal.
    index = args.rank if args.local_rank is None else args.local_rank
    # The driver's own initialisation (0.4-0.6 s with two GPUs on the host) is the longest part
    # of the start: begin it now, through libcuda itself, before any package imports.
    early = _Background(lambda: _early_context(index), "cuda-init")
    cu = import_module("cuda.bindings.driver")

    def make_gpu() -> _Gpu:
        early.join()  # its failures are reported by _Gpu's own calls, with their CUDA error
        return _Gpu(cu, index, args.rank)

    gpu_job = _Background(make_gpu, "cuda-context")
    if args.libnccl:
        _preload(args.libnccl)
    nccl = import_module("nccl.bindings.nccl")
    clock.lap("imports")
    gpu: _Gpu = gpu_job.join()
    gpu.make_current()
    clock.lap("cuda_context")
    lib_path = nccl.get_library_path()
    if args.libnccl and os.path.isabs(args.libnccl) and lib_path and \
            os.path.realpath(lib_path) != os.path.realpath(args.libnccl):
        raise RuntimeError(f"nccl4py loaded {lib_path}, not the training environment's "
                           f"{args.libnccl}")
    progress.send("spawned", pid=os.getpid(), device=f"cuda:{index}", engine="nccl4py",
                  # ncclGetVersion's integer: the parent writes it as text (pyenv's reader).
                  pci_bus_id=gpu.pci_bus_id, nccl_code=int(nccl.get_version()),
                  libnccl=str(lib_path) if lib_path else None)
    progress.send("phase", phase="init")

    def init_comm() -> Any:
        gpu.make_current()
        if args.rank == 0:
            uid = bytes(nccl.get_unique_id())
            progress.send("uid", uid=uid.hex())
        else:
            uid = bytes.fromhex(_read_rendezvous("uid", args.timeout_s))
        # As nccl4py's Communicator.init: one unique id (a writable buffer), no config.
        return nccl.comm_init_rank_scalable(args.world_size, args.rank, 1, bytearray(uid), 0)

    comm_job = _Background(init_comm, "nccl-init")
    # Nothing here is freed or destroyed: the process exits right after (main()).
    bufs = _Nccl4pyBuffers(args, gpu=gpu, nccl=nccl, largest=max(sizes))
    bufs.fill(sizes[0])
    clock.times["allocation"] = time.perf_counter() - clock._mark
    comm = comm_job.join()
    clock.lap("nccl_init")
    clock.times["nccl_init"] = max(comm_job.seconds, clock.times["nccl_init"]
                                   - clock.times["allocation"])
    _nccl4py_sweep(args, progress, sizes, corrupt_me, clock=clock, bufs=bufs, gpu=gpu,
                   comm=comm, nccl=nccl)


#: What both PTX kernels below share: %rd3 = this thread's first index, %rd5 = the grid's
#: stride, %p1 = nothing to do (index >= n in %rd2) ...
_PTX_INDEX = """\
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd3, %r1, %r2;
    cvt.u64.u32 %rd4, %r3;
    add.u64 %rd3, %rd3, %rd4;
    mul.wide.u32 %rd5, %r4, %r2;
    setp.ge.u64 %p1, %rd3, %rd2;
"""
#: ... and %f2 = pattern(%rd3) as float32.
_PTX_PATTERN = """\
    cvt.u32.u64 %r5, %rd3;
    and.b32 %r5, %r5, 4095;
    mul.lo.u32 %r5, %r5, 7919;
    rem.u32 %r5, %r5, 1021;
    cvt.rn.f32.u32 %f2, %r5;
"""
#: The nccl4py engine's fill and check, as PTX the driver compiles for the GPU it runs on (no
#: compiler, no torch): ``pf_fill`` writes ``pattern(i) + offset``, ``pf_check`` counts the
#: elements that differ from ``pattern(i) * mul + add`` and keeps the lowest such index, where
#: ``pattern(i) = ((i % 4096) * 7919) % 1021`` (the torch engine's ``_base``). Grid-stride loops
#: over 64-bit indices; round-to-nearest float arithmetic on small integers, so exact.
_PTX = """\
.version 7.0
.target sm_70
.address_size 64

.visible .entry pf_fill(.param .u64 p_buf, .param .u64 p_n, .param .f32 p_off)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [p_buf];
    ld.param.u64 %rd2, [p_n];
    ld.param.f32 %f1, [p_off];
    cvta.to.global.u64 %rd1, %rd1;
@INDEX@
    @%p1 bra FILL_DONE;
FILL_LOOP:
@PATTERN@
    add.rn.f32 %f2, %f2, %f1;
    shl.b64 %rd6, %rd3, 2;
    add.u64 %rd7, %rd1, %rd6;
    st.global.f32 [%rd7], %f2;
    add.u64 %rd3, %rd3, %rd5;
    setp.lt.u64 %p1, %rd3, %rd2;
    @%p1 bra FILL_LOOP;
FILL_DONE:
    ret;
}

.visible .entry pf_check(.param .u64 p_buf, .param .u64 p_n, .param .f32 p_mul,
                         .param .f32 p_add, .param .u64 p_out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<12>;
    .reg .f32 %f<6>;
    ld.param.u64 %rd1, [p_buf];
    ld.param.u64 %rd2, [p_n];
    ld.param.f32 %f1, [p_mul];
    ld.param.f32 %f3, [p_add];
    ld.param.u64 %rd8, [p_out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd8, %rd8;
    add.u64 %rd9, %rd8, 8;
@INDEX@
    @%p1 bra CHECK_DONE;
CHECK_LOOP:
@PATTERN@
    mul.rn.f32 %f2, %f2, %f1;
    add.rn.f32 %f2, %f2, %f3;
    shl.b64 %rd6, %rd3, 2;
    add.u64 %rd7, %rd1, %rd6;
    ld.global.f32 %f4, [%rd7];
    setp.neu.f32 %p2, %f4, %f2;
    @!%p2 bra CHECK_NEXT;
    atom.global.add.u64 %rd10, [%rd8], 1;
    atom.global.min.u64 %rd11, [%rd9], %rd3;
CHECK_NEXT:
    add.u64 %rd3, %rd3, %rd5;
    setp.lt.u64 %p1, %rd3, %rd2;
    @%p1 bra CHECK_LOOP;
CHECK_DONE:
    ret;
}
""".replace("@INDEX@\n", _PTX_INDEX).replace("@PATTERN@\n", _PTX_PATTERN)
#: Threads per block and the most blocks of the fill / check launches (grid-stride beyond that).
_BLOCK = 256
_MAX_BLOCKS = 4096


def _pattern(i: int) -> int:
    return ((i % PATTERN_LEN) * 7919) % 1021


class _Nccl4pyBuffers:
    """The device buffer of the largest size, filled and checked on the GPU by two small kernels
    (:data:`_PTX`): no host copy of the buffer, no pinned staging, a few ms for 1 GiB."""

    def __init__(self, args: argparse.Namespace, *, gpu: _Gpu, nccl: Any, largest: int) -> None:
        cu = self.cu = gpu.cu
        self.gpu = gpu
        self.s_handle = gpu.s_handle
        self.rank, self.world = args.rank, args.world_size
        image = ctypes.create_string_buffer(_PTX.encode())
        # The driver compiles the PTX for this GPU (a few ms; cached by the driver's JIT cache).
        self.module = _cu_check(cu.cuModuleLoadData(ctypes.addressof(image)))
        self.fill_fn = _cu_check(cu.cuModuleGetFunction(self.module, b"pf_fill"))
        self.check_fn = _cu_check(cu.cuModuleGetFunction(self.module, b"pf_check"))
        # A plain allocation (cuMemAlloc), or NCCL's own (ncclMemAlloc) with --alloc nccl.
        self.ptr = int(nccl.mem_alloc(largest) if args.alloc == "nccl"
                       else _cu_check(cu.cuMemAlloc(largest)))
        # [mismatch count, lowest mismatching index] of the last check, on the device.
        self.out = int(_cu_check(cu.cuMemAlloc(16)))

    def _launch(self, fn: Any, n: int, *params: Any) -> None:
        blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))
        argv = (ctypes.c_void_p * len(params))(*[ctypes.addressof(p) for p in params])
        _cu_check(self.cu.cuLaunchKernel(fn, blocks, 1, 1, _BLOCK, 1, 1, 0, self.s_handle,
                                         ctypes.addressof(argv), 0))

    def fill(self, size: int) -> None:
        n = size // 4
        self._launch(self.fill_fn, n, ctypes.c_uint64(self.ptr), ctypes.c_uint64(n),
                     ctypes.c_float(self.rank + 1))
        self.gpu.sync()

    def _read(self, address: int, ctype: Any) -> Any:
        value = ctype()
        _cu_check(self.cu.cuMemcpyDtoHAsync(ctypes.addressof(value), address,
                                            ctypes.sizeof(value), self.s_handle))
        self.gpu.sync()
        return value.value

    def _add_one(self, index: int) -> None:
        """The test-only corruption: element ``index`` of the result, plus 1."""
        value = ctypes.c_float(self._read(self.ptr + 4 * index, ctypes.c_float) + 1)
        _cu_check(self.cu.cuMemcpyHtoDAsync(self.ptr + 4 * index, ctypes.addressof(value), 4,
                                            self.s_handle))
        self.gpu.sync()

    def check(self, size: int, corrupt_me: bool) -> dict[str, Any]:
        """Compare every element of the result with the exact sum, on the GPU."""
        n = size // 4
        if corrupt_me:
            self._add_one(n // 2)
        world = self.world
        add = world * (world + 1) / 2
        _cu_check(self.cu.cuMemsetD32Async(self.out, 0, 2, self.s_handle))
        _cu_check(self.cu.cuMemsetD32Async(self.out + 8, 0xFFFFFFFF, 2, self.s_handle))
        self._launch(self.check_fn, n, ctypes.c_uint64(self.ptr), ctypes.c_uint64(n),
                     ctypes.c_float(world), ctypes.c_float(add), ctypes.c_uint64(self.out))
        result = (ctypes.c_uint64 * 2)()
        _cu_check(self.cu.cuMemcpyDtoHAsync(ctypes.addressof(result), self.out, 16,
                                            self.s_handle))
        self.gpu.sync()
        bad, first_bad = int(result[0]), int(result[1])
        fields: dict[str, Any] = {"size": size, "ok": bad == 0, "mismatches": bad,
                                  "elements": n}
        if bad:
            fields.update(first_index=first_bad,
                          got=float(self._read(self.ptr + 4 * first_bad, ctypes.c_float)),
                          want=float(_pattern(first_bad) * world + add))
        return fields


def _nccl4py_sweep(args: argparse.Namespace, progress: Progress, sizes: list[int],
                   corrupt_me: bool, *, clock: Clock, bufs: _Nccl4pyBuffers, gpu: _Gpu,
                   comm: Any, nccl: Any) -> None:
    ptr, s_handle = bufs.ptr, gpu.s_handle
    start, end = gpu.event(), gpu.event()

    def allreduce(count: int) -> None:
        # The raw binding: a few microseconds of host time per call, so even 1 MiB is GPU-bound.
        nccl.all_reduce(ptr, ptr, count, NCCL_FLOAT32, NCCL_SUM, comm, s_handle)

    def barrier() -> None:
        allreduce(1)
        gpu.sync()

    # The first collective: connections are set up lazily (NCCL_RUNTIME_CONNECT), and the other
    # rank may still be initialising; both belong to init, not to the first measured size.
    barrier()
    clock.lap("nccl_init")
    progress.send("phase", phase="init", done=True)
    for i, size in enumerate(sizes):
        count = size // 4
        progress.send("phase", phase="warmup", size=size)
        if i:
            bufs.fill(size)
        first_s = None
        for w in range(args.warmup):
            t0 = time.perf_counter()
            allreduce(count)
            if w == 0 and i == 0:
                gpu.sync()
                first_s = time.perf_counter() - t0
        barrier()
        clock.lap("warmup")
        progress.send("phase", phase="measure", size=size)
        gpu.record(start)
        for _ in range(args.iters):
            allreduce(count)
        gpu.record(end)
        elapsed = gpu.elapsed_s(start, end)
        progress.send("measured", size=size, time_s=elapsed / args.iters, iters=args.iters,
                      first_allreduce_s=first_s, timer="cuda-events")
        progress.send("phase", phase="verify", size=size)
        bufs.fill(size)
        allreduce(count)
        progress.send("verified", **bufs.check(size, corrupt_me))
        clock.lap("sweep")
    # Every rank is past its last all-reduce before any of them exits.
    barrier()
    progress.send("done", phase_times=clock.times)


if __name__ == "__main__":
    sys.exit(main())
