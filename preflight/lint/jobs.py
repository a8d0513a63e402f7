"""``preflight lint --jobs N``: the files that must be parsed, spread over worker processes.

The main process walks the tree, reads each file and keeps the ones some rule can match (most
files of a repository are not parsed at all). Those go, with their bytes, in chunks of a few
files to a pool of ``N`` processes; the results come back in the order the files were walked,
whatever the order the workers finish in. A handful of files is linted in the main process:
starting workers would cost more than it saves.

Nothing is left behind: a worker ignores Ctrl-C (the main process handles it and stops the
pool), dies with the main process (Linux ``PR_SET_PDEATHSIG``), and the pool is registered with
:mod:`preflight.core.aborting` so SIGTERM stops it too. A worker that dies (the OOM killer) costs
the files it held, which are reported as not linted; the rest are linted in the main process.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import math
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from preflight.core import aborting

#: Fewer files to parse than this are linted in the main process.
POOL_MIN_FILES = 32
#: A chunk holds at most this many files, or this many bytes, whichever comes first.
CHUNK_FILES = 16
CHUNK_BYTES = 512 * 1024
#: Chunks in flight per worker (bounds the bytes held in memory).
IN_FLIGHT_PER_JOB = 4

Item = tuple[str, bytes]
R = TypeVar("R")


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota
    (``cpu.max`` of a container limited to 2 CPUs on a 64-core host)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as stream:
            quota, period = stream.read(64).split()[:2]
        if quota != "max" and int(period) > 0:
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def _worker_init(parent: int | None) -> None:
    """In each worker: Ctrl-C ignored, killed when its parent dies. ``parent``: the process
    that forked it, or None when a fork server did (its parent is then that server, which ends
    when the main process does)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(3)  # the parent died before the death signal was asked for


def _context() -> multiprocessing.context.BaseContext:
    """fork where it is safe (one thread: nothing to copy half-way), else forkserver/spawn."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class Dispatcher(Generic[R]):
    """Runs ``work(chunk)`` for chunks of items, in this process or in a pool of ``jobs``
    processes, and hands each item's result to ``done(index, result)``; ``lost(index, reason)``
    for an item whose worker died. ``work`` must be a module-level function (it is pickled)."""

    def __init__(self, jobs: int, work: Callable[[list[Item]], list[R]],
                 done: Callable[[int, R], None], lost: Callable[[int, str], None]) -> None:
        self.jobs = jobs
        self.work = work
        self.done = done
        self.lost = lost
        self._waiting: list[tuple[int, Item]] = []  # before the pool starts
        self._chunk: list[tuple[int, Item]] = []
        self._chunk_bytes = 0
        self._pool: cf.ProcessPoolExecutor | None = None
        self._broken = False
        self._flight: deque[tuple[cf.Future[list[R]], list[int]]] = deque()
        self._undo_key: int | None = None

    def add(self, index: int, item: Item) -> None:
        if self.jobs <= 1 or self._broken:
            self._run_here([(index, item)])
            return
        if self._pool is None:
            self._waiting.append((index, item))
            if len(self._waiting) >= POOL_MIN_FILES:
                self._start()
            return
        self._chunk.append((index, item))
        self._chunk_bytes += len(item[1])
        if len(self._chunk) >= CHUNK_FILES or self._chunk_bytes >= CHUNK_BYTES:
            self._submit()

    def finish(self) -> None:
        """Lint what is left and wait for every chunk."""
        try:
            if self._pool is None:
                self._run_here(self._waiting)
                self._waiting = []
                return
            self._submit()
            while self._flight:
                self._collect()
        finally:
            self.close()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self._undo_key is not None:
            aborting.unregister(self._undo_key)
            self._undo_key = None

    # -- inside ---------------------------------------------------------------------------
    def _run_here(self, items: Iterable[tuple[int, Item]]) -> None:
        for index, item in items:
            self.done(index, self.work([item])[0])

    def _start(self) -> None:
        try:
            self._undo_key = aborting.register(self._kill)
            context = _context()
            forked = context.get_start_method() == "fork"
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=context, initializer=_worker_init,
                initargs=(os.getpid() if forked else None,))
        except (OSError, aborting.Aborted):  # no processes to be had: lint here
            self._broken = True
            self.close()
            self._run_here(self._waiting)
            self._waiting = []
            return
        waiting, self._waiting = self._waiting, []
        for index, item in waiting:
            self.add(index, item)

    def _kill(self) -> None:
        pool = self._pool
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(OSError, ValueError):
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self) -> None:
        if not self._chunk:
            return
        chunk, self._chunk, self._chunk_bytes = self._chunk, [], 0
        if self._pool is None or self._broken:
            self._run_here(chunk)
            return
        while len(self._flight) >= self.jobs * IN_FLIGHT_PER_JOB:
            self._collect()
        if self._broken:
            self._run_here(chunk)
            return
        try:
            future = self._pool.submit(self.work, [item for _i, item in chunk])
        except (cf.process.BrokenProcessPool, RuntimeError):
            self._broken = True
            self._run_here(chunk)
            return
        self._flight.append((future, [i for i, _item in chunk]))

    def _collect(self) -> None:
        future, indexes = self._flight.popleft()
        try:
            results = future.result()
        except (cf.process.BrokenProcessPool, cf.CancelledError):
            self._broken = True
            for index in indexes:
                self.lost(index, "not linted: the worker process linting it ended "
                                 "unexpectedly (out of memory?)")
            return
        for index, result in zip(indexes, results, strict=True):
            self.done(index, result)


__all__ = ["CHUNK_BYTES", "CHUNK_FILES", "POOL_MIN_FILES", "Dispatcher", "usable_cpus"]
