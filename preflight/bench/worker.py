"""One rank of the all-reduce test: the only module of the bench that imports torch or NCCL.

Started by :mod:`preflight.bench.parent` as ``python .../bench/worker.py --rank R ...``, one
process per GPU (NCCL) or per ``--nproc`` (gloo on CPU). It reports every phase it enters and
leaves as JSON lines on the file descriptor ``--progress-fd`` (stdout and stderr are left to
NCCL_DEBUG and tracebacks), plus a heartbeat every ``HEARTBEAT_S`` from a thread, so the parent
can tell a rank that is frozen (no heartbeat: SIGSTOP, a stuck driver call holding the GIL) from a
rank that is alive but waiting in a collective for a peer.

Two engines (``--engine``, docs/bandwidth.md):

* ``nccl4py``: no torch. NVIDIA's ``nccl4py`` (``nccl.core``) over ``cuda.core`` /
  ``cuda-bindings``; ``cuda-pathfinder`` loads the ``libnccl.so.2`` of the interpreter's
  environment (the training venv with ``--python``). Rendezvous: rank 0 makes the NCCL unique id
  and reports it, the parent writes it to the other ranks' stdin. No TCP store.
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
#: Host staging chunk of the nccl4py engine's fill and check (pinned, reused for every size).
STAGE_BYTES = 64 << 20
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
                   help="nccl4py: cuda.core's device allocator, or ncclMemAlloc")
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
    try:
        engine = _pick_engine(args)
        runner = _run_nccl4py if engine == "nccl4py" else _run_torch
        runner(args, progress, sizes, corrupt_me)
    except Exception as exc:
        progress.send("error", phase=phase, error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-4000:])
        return 1
    if engine == "nccl4py":
        # Everything is reported, the communicator destroyed and the memory freed: skip the
        # interpreter's finalisation (the parent waits for this exit; the driver releases the
        # context either way).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


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


def _nccl_text(nccl: Any) -> tuple[str, str | None]:
    """("2.28.9", "/path/libnccl.so.2") of the libnccl that nccl4py loaded."""
    info = nccl.get_version()
    lib = getattr(info, "libnccl", None)
    version = getattr(lib, "version", None)
    path = getattr(lib, "path", None)
    return (str(version) if version is not None else str(info)), (str(path) if path else None)


def _run_nccl4py(args: argparse.Namespace, progress: Progress, sizes: list[int],
                 corrupt_me: bool) -> None:
    """The torch-free engine. Overlaps what does not depend on each other: the CUDA context is
    created in a thread while the Python packages import, the buffers are allocated and filled
    while the communicator initialises (docs/benchmarks.md has the phase times)."""
    if args.backend != "nccl":
        raise RuntimeError("the nccl4py engine runs NCCL only (gloo needs --engine torch)")
    clock = Clock()
    # Imported by name: optional packages of the workers' interpreter, without type stubs.
    from importlib import import_module

    cu = import_module("cuda.bindings.driver")
    # The device is the local rank (across nodes --rank is global); on one node they are equal.
    index = args.rank if args.local_rank is None else args.local_rank

    def make_context() -> Any:
        _cu_check(cu.cuInit(0))
        count = _cu_check(cu.cuDeviceGetCount())
        if index >= count:
            raise RuntimeError(f"rank {args.rank} needs cuda:{index} but CUDA sees {count} "
                               "GPU(s)")
        dev = _cu_check(cu.cuDeviceGet(index))
        return _cu_check(cu.cuDevicePrimaryCtxRetain(dev))

    ctx_job = _Background(make_context, "cuda-context")
    np = import_module("numpy")
    cuda_core = import_module("cuda.core")
    nccl = import_module("nccl.core")
    nccl_raw = import_module("nccl.bindings.nccl")
    clock.lap("imports")
    ctx_job.join()
    dev = cuda_core.Device(index)
    dev.set_current()
    stream = dev.create_stream()
    clock.lap("cuda_context")
    version, lib = _nccl_text(nccl)
    progress.send("spawned", pid=os.getpid(), device=f"cuda:{index}", engine="nccl4py",
                  pci_bus_id=str(dev.pci_bus_id), nccl=version, libnccl=lib)
    progress.send("phase", phase="init")

    def init_comm() -> Any:
        dev.set_current()  # this thread's current context
        if args.rank == 0:
            uid = nccl.get_unique_id()
            progress.send("uid", uid=bytes(uid).hex())
        else:
            uid = nccl.UniqueId.from_bytes(bytes.fromhex(_read_rendezvous("uid",
                                                                          args.timeout_s)))
        return nccl.Communicator.init(args.world_size, args.rank, uid)

    comm_job = _Background(init_comm, "nccl-init")
    bufs = _Nccl4pyBuffers(args, np=np, cu=cu, dev=dev, stream=stream, nccl=nccl,
                           largest=max(sizes))
    try:
        bufs.fill(sizes[0])
        clock.times["allocation"] = time.perf_counter() - clock._mark
        comm = comm_job.join()
        clock.lap("nccl_init")
        clock.times["nccl_init"] = max(comm_job.seconds, clock.times["nccl_init"]
                                       - clock.times["allocation"])
        try:
            _nccl4py_sweep(args, progress, sizes, corrupt_me, clock=clock, np=np, bufs=bufs,
                           stream=stream, comm=comm, nccl=nccl, nccl_raw=nccl_raw,
                           event_options=cuda_core.EventOptions(timing_enabled=True))
        finally:
            # In line: destroying it in a thread while the last check ran made the teardown
            # 0.35 s -> 0.8 s on 2x H200 (docs/benchmarks.md).
            comm.destroy()
    finally:
        bufs.close()


class _Nccl4pyBuffers:
    """The device buffer of the largest size and a pinned host staging buffer (fill, check)."""

    def __init__(self, args: argparse.Namespace, *, np: Any, cu: Any, dev: Any, stream: Any,
                 nccl: Any, largest: int) -> None:
        self.np, self.cu, self.stream = np, cu, stream
        self.rank, self.world = args.rank, args.world_size
        self.buf = (nccl.mem_alloc(largest, dev) if args.alloc == "nccl"
                    else dev.allocate(largest, stream=stream))
        self.ptr = int(self.buf.handle)
        self.stage_bytes = min(STAGE_BYTES, _round_up(largest, PATTERN_LEN * 4))
        # Two pinned staging buffers: one is compared while the next chunk copies into the other.
        self.hosts = [_cu_check(cu.cuMemAllocHost(self.stage_bytes)) for _ in range(2)]
        self.host = self.hosts[0]
        self.hviews = [np.ctypeslib.as_array((ctypes.c_float * (self.stage_bytes // 4))
                                             .from_address(int(h))) for h in self.hosts]
        self.hview = self.hviews[0]
        self.pool: Any = None
        base = ((np.arange(PATTERN_LEN, dtype=np.int64) * 7919) % 1021).astype(np.float32)
        self.tile = np.resize(base, self.stage_bytes // 4)
        n = self.world
        self.want = self.tile * n + n * (n + 1) / 2

    def fill(self, size: int) -> None:
        self.hview[:] = self.tile + float(self.rank + 1)
        for off in range(0, size, self.stage_bytes):
            _cu_check(self.cu.cuMemcpyHtoDAsync(self.ptr + off, int(self.host),
                                                min(self.stage_bytes, size - off),
                                                self.stream.handle))
        self.stream.sync()

    def _equal(self, view: Any, k: int) -> bool:
        """``view[:k] == want[:k]`` everywhere, compared in slices on a thread pool (numpy
        releases the GIL in the comparison, so 1 GiB takes tens of ms, not 0.3 s)."""
        np = self.np
        if k < (1 << 20):
            return bool(np.array_equal(view[:k], self.want[:k]))
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                           thread_name_prefix="check")
        step = _round_up(-(-k // 8), PATTERN_LEN)
        parts = [(a, min(k, a + step)) for a in range(0, k, step)]
        return all(self.pool.map(
            lambda ab: bool(np.array_equal(view[ab[0]:ab[1]], self.want[ab[0]:ab[1]])), parts))

    def check(self, size: int, corrupt_me: bool) -> dict[str, Any]:
        """Copy the result back chunk by chunk and compare every element with the exact sum."""
        np = self.np
        bad, first_bad, got = 0, None, None
        offsets = list(range(0, size, self.stage_bytes))

        def copy(i: int) -> None:
            off = offsets[i]
            _cu_check(self.cu.cuMemcpyDtoHAsync(int(self.hosts[i % 2]), self.ptr + off,
                                                min(self.stage_bytes, size - off),
                                                self.stream.handle))

        copy(0)
        for i, off in enumerate(offsets):
            self.stream.sync()
            if i + 1 < len(offsets):
                copy(i + 1)
            view = self.hviews[i % 2]
            chunk = min(self.stage_bytes, size - off)
            k = chunk // 4
            if corrupt_me and off <= size // 2 < off + chunk:
                view[(size // 2 - off) // 4] += 1
            if self._equal(view, k):
                continue
            ne = view[:k] != self.want[:k]
            nbad = int(np.count_nonzero(ne))
            if first_bad is None:
                j = int(np.argmax(ne))
                first_bad, got = off // 4 + j, float(view[j])
            bad += nbad
        fields: dict[str, Any] = {"size": size, "ok": bad == 0, "mismatches": bad,
                                  "elements": size // 4}
        if first_bad is not None:
            fields.update(first_index=first_bad, got=got,
                          want=float(self.want[first_bad % PATTERN_LEN]))
        return fields

    def close(self) -> None:
        self.stream.sync()
        if self.pool is not None:
            self.pool.shutdown()
        for host in self.hosts:
            _cu_check(self.cu.cuMemFreeHost(host))
        self.buf.close()


def _nccl4py_sweep(args: argparse.Namespace, progress: Progress, sizes: list[int],
                   corrupt_me: bool, *, clock: Clock, np: Any, bufs: _Nccl4pyBuffers,
                   stream: Any, comm: Any, nccl: Any, nccl_raw: Any, event_options: Any) -> None:
    ptr = bufs.ptr
    s_handle = int(stream.handle)
    raw_comm = getattr(comm, "_comm", None)
    if raw_comm is None:
        raw_comm = comm.ptr
    f32, op_sum = int(nccl.FLOAT32), int(nccl.SUM)

    def allreduce(count: int) -> None:
        # The raw binding: a few microseconds of host time per call, so even 1 MiB is GPU-bound.
        nccl_raw.all_reduce(ptr, ptr, count, f32, op_sum, raw_comm, s_handle)

    def barrier() -> None:
        allreduce(1)
        stream.sync()

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
                stream.sync()
                first_s = time.perf_counter() - t0
        barrier()
        clock.lap("warmup")
        progress.send("phase", phase="measure", size=size)
        start = stream.record(options=event_options)
        for _ in range(args.iters):
            allreduce(count)
        end = stream.record(options=event_options)
        end.sync()
        elapsed = (end - start) / 1e3
        progress.send("measured", size=size, time_s=elapsed / args.iters, iters=args.iters,
                      first_allreduce_s=first_s, timer="cuda-events")
        progress.send("phase", phase="verify", size=size)
        bufs.fill(size)
        allreduce(count)
        progress.send("verified", **bufs.check(size, corrupt_me))
        clock.lap("sweep")
    progress.send("done", phase_times=clock.times)


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


if __name__ == "__main__":
    sys.exit(main())
