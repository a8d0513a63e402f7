"""One rank of the all-reduce test: the only module of the bench that imports torch.

Started by :mod:`preflight.bench.parent` as ``python .../bench/worker.py --rank R ...``, one
process per GPU (NCCL) or per ``--nproc`` (gloo on CPU). It reports every phase it enters and
leaves as JSON lines on the file descriptor ``--progress-fd`` (stdout and stderr are left to
NCCL_DEBUG and tracebacks), plus a heartbeat every ``HEARTBEAT_S`` from a thread, so the parent
can tell a rank that is frozen (no heartbeat: SIGSTOP, a stuck driver call holding the GIL) from a
rank that is alive but waiting in a collective for a peer.

Rendezvous: rank 0 hosts a TCPStore on 127.0.0.1 with port 0, so the OS picks a free port (no
race with other jobs); it reports the port and the parent writes it to the other ranks' stdin.
Across nodes (``preflight cluster``, ``--store HOST:PORT``): every rank is a client of the
cluster's store under ``--store-prefix``, ``--rank`` / ``--world-size`` are global and
``--local-rank`` picks the GPU.

Method (nccl.md section 1): per size, ``warmup`` untimed all-reduces (communicator creation is in
init, never timed), a barrier, then a host clock around ``iters`` back-to-back all-reduces and one
device sync; time per op = elapsed / iters. Then the exact check: a fresh integer-valued float32
pattern, one all-reduce, compared element by element with the expected sum.

``PREFLIGHT_BENCH_TEST_CORRUPT_RANK`` (test-only, documented in docs/bandwidth.md): the named rank
adds 1 to one element of its result before the check, so the tests can prove a wrong sum is caught.
It needs the exact variable name; nothing sets it but the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

HEARTBEAT_S = 0.5
#: Length of the repeating data pattern; values stay small integers so float32 sums are exact.
PATTERN_LEN = 4096
CORRUPT_ENV = "PREFLIGHT_BENCH_TEST_CORRUPT_RANK"


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
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--progress-fd", type=int, required=True)
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="deadline of the store and of each collective inside torch")
    # Multi-node (preflight cluster): --rank/--world-size are global, the device is --local-rank,
    # and every rank is a client of the cluster agent's store (no port through stdin).
    p.add_argument("--local-rank", type=int, default=None, help="device index (default --rank)")
    p.add_argument("--store", metavar="HOST:PORT", default=None,
                   help="join this TCPStore as a client instead of rank 0 hosting one")
    p.add_argument("--store-prefix", default="", help="key prefix inside --store")
    return p.parse_args(argv)


def _read_port(timeout_s: float) -> int:
    """The store port, written by the parent to our stdin once rank 0 has it."""
    import select

    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no rendezvous port from the parent within {timeout_s:g} s")
    line = sys.stdin.readline()
    if not line:
        raise EOFError("the parent closed the control pipe before sending the port")
    return int(json.loads(line)["port"])


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    progress = Progress(args.progress_fd, args.rank)
    threading.Thread(target=_heartbeat, args=(progress, os.getppid()), daemon=True,
                     name="heartbeat").start()
    phase = "spawn"
    try:
        import torch
        import torch.distributed as dist

        tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]

        device = _device(torch, args)
        progress.send("spawned", pid=os.getpid(), device=str(device),
                      pci_bus_id=_bus_id(torch, device), torch=torch.__version__)
        phase = "init"
        progress.send("phase", phase="init")
        timeout = datetime.timedelta(seconds=args.timeout_s)
        if args.store:
            host, _, port_text = args.store.rpartition(":")
            store = dist.PrefixStore(args.store_prefix,  # type: ignore[attr-defined]
                                     tcp_store(host, int(port_text), None, False, timeout=timeout))
        elif args.rank == 0:
            store = tcp_store("127.0.0.1", 0, args.world_size, True, timeout=timeout,
                              wait_for_workers=False)
            progress.send("store", port=int(store.port))
        else:
            port = _read_port(args.timeout_s)
            store = tcp_store("127.0.0.1", port, args.world_size, False, timeout=timeout)
        kwargs: dict[str, Any] = {}
        if device.type == "cuda":
            # Eager communicator creation (torch >= 2.3), so it is part of init, never timed.
            kwargs["device_id"] = device
        dist.init_process_group(args.backend, store=store, rank=args.rank,
                                world_size=args.world_size, timeout=timeout, **kwargs)
        try:
            sizes = [int(s) for s in args.sizes.split(",")]
            buf = torch.empty(max(sizes) // 4, dtype=torch.float32, device=device)
            _barrier(torch, dist, device)
            progress.send("phase", phase="init", done=True)
            corrupt = os.environ.get(CORRUPT_ENV)
            corrupt_me = corrupt is not None and corrupt.strip() == str(args.rank)
            for size in sizes:
                _one_size(torch, dist, progress, buf[: size // 4], size=size, args=args,
                          device=device, corrupt_me=corrupt_me)
            progress.send("done")
        finally:
            dist.destroy_process_group()
    except Exception as exc:
        progress.send("error", phase=phase, error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-4000:])
        return 1
    return 0


def _device(torch: Any, args: argparse.Namespace) -> Any:
    if args.backend != "nccl":
        return torch.device("cpu")
    index = args.rank if args.local_rank is None else args.local_rank
    count = torch.cuda.device_count()
    if index >= count:
        raise RuntimeError(f"rank {args.rank} needs cuda:{index} but CUDA sees {count} GPU(s)")
    torch.cuda.set_device(index)
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
              args: argparse.Namespace, device: Any, corrupt_me: bool) -> None:
    n = args.world_size
    progress.send("phase", phase="warmup", size=size)
    _fill(torch, buf, float(args.rank + 1))
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    _barrier(torch, dist, device)

    progress.send("phase", phase="measure", size=size)
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(buf)
    _sync(torch, device)
    elapsed = time.perf_counter() - start
    progress.send("measured", size=size, time_s=elapsed / args.iters, iters=args.iters)

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
        first = int(mismatch.to(torch.uint8).argmax().item())
        fields.update(first_index=first, got=float(buf[first].item()),
                      want=float(want[first % PATTERN_LEN].item()))
    progress.send("verified", **fields)
    del mismatch


if __name__ == "__main__":
    sys.exit(main())
