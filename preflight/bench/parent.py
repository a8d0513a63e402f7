"""The orchestrator of the all-reduce test: starts the workers, watches them, kills them on a
deadline. It never imports torch (only :mod:`preflight.bench.worker` does).

Why a separate parent: a collective that hangs cannot be interrupted from inside the process that
waits in it (tell "slow" from "dead", find the first rank that stopped: docs/bandwidth.md). The
parent owns every deadline, and reports which rank did not reach which phase.

Processes: one worker per rank, ``PYTHON .../bench/worker.py`` (argv list; PYTHON is config
``python`` or this interpreter), each the
leader of a new session (``start_new_session``, safe from threads and on Python 3.10), so the
parent can kill each worker's whole process group; stdout and stderr go to one log file per rank
(NCCL_DEBUG writes there), progress comes as JSON lines on a dedicated pipe.

Rendezvous: rank 0 publishes what the others need (the torch engine: the port of its TCPStore on
127.0.0.1, port 0 so the OS picks a free one; the nccl4py engine: the NCCL unique id) and the
parent writes it to the other ranks' stdin.
With ``BenchOptions.world`` (``preflight cluster``) this node's workers are a slice of a
larger world. The torch engine's ranks join the cluster's store themselves. The nccl4py engine's
unique id crosses nodes through ``WorldSpec.relay`` (the cluster agent's store client, behind the
:class:`StoreRelay` protocol, so this module still never imports torch): the parent of the
group's first node (``rank_offset`` 0, whose local rank 0 is global rank 0) publishes the id its
rank 0 reports, the other nodes' parents fetch it with the init deadline and write it to every
local worker's stdin, as the local relay does.

Deadlines within ``timeout_s``: spawn (start + import torch) and init (store + process group +
communicator) may each take half of it, at most 60 s; each warm-up, measure and verify step of one
size at most a quarter, between 2 and 30 s; the whole run ``timeout_s``. A step past its deadline is
a stall: the ranks behind the others are named; when all ranks are in the same step, those without
a heartbeat (frozen) are named, else the collective itself is reported as hung.

A frozen rank is named without waiting for a deadline (issue 14: within 5 s of the stop, in any
phase): a worker the kernel shows as stopped (``/proc/PID/stat`` state T or t: SIGSTOP, a
debugger) for ``STOPPED_CONFIRM_S``; or, once the workers are past init (where the heartbeat thread
is never held off by a long import or driver call), one silent for ``FROZEN_SILENT_S`` while
another rank still beats. A slow but live rank keeps beating and is left to its deadline.

Nothing is left behind: each worker dies with the parent (PR_SET_PDEATHSIG, set by the worker) and
on SIGTERM / SIGINT the parent kills the workers and removes its ``preflight-bench-*`` directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from preflight.bench import leftovers
from preflight.core import aborting
from preflight.core.units import fmt_bytes
from preflight.probes.pyenv import nccl_version_text

PHASES = ("spawn", "init", "warmup", "measure", "verify", "done")
PHASE_WORDS = {"spawn": "spawn", "init": "init", "warmup": "warm-up", "measure": "measure",
               "verify": "verify", "done": "done"}
#: A rank whose last heartbeat is older than this is frozen (the worker beats every 0.5 s).
HEARTBEAT_SILENT_S = 2.0
#: How long a worker must stay in the kernel's stopped state before it is named as frozen.
STOPPED_CONFIRM_S = 2.0
#: Past init, a rank silent this long while another rank beats is frozen (no deadline waited).
FROZEN_SILENT_S = 3.0
#: Phase durations a worker reports, in the order they happen (``bench --json`` phase_times_s).
PHASE_TIMES = ("interpreter", "imports", "cuda_context", "nccl_init", "allocation", "warmup",
               "sweep", "teardown")
#: After the first sign of failure, how long to keep reading so the first cause is the one named.
GRACE_S = 0.5
_DONE_STEP = 1 << 30


#: The worker program (stdlib + torch only).
WORKER_SCRIPT = Path(__file__).with_name("worker.py")


@dataclass(frozen=True)
class Deadlines:
    """Per-phase deadlines, seconds, derived from the run's ``timeout_s``."""

    total_s: float
    spawn_s: float
    init_s: float
    step_s: float

    @classmethod
    def from_timeout(cls, timeout_s: float) -> Deadlines:
        return cls(total_s=timeout_s, spawn_s=min(60.0, timeout_s / 2),
                   init_s=min(60.0, timeout_s / 2),
                   step_s=min(30.0, max(2.0, timeout_s / 4)))

    def for_phase(self, phase: str) -> float:
        return {"spawn": self.spawn_s, "init": self.init_s}.get(phase, self.step_s)


#: The store key (under the group's prefix) of the NCCL unique id of the nccl4py engine.
UID_KEY = "nccl-uid"
#: How long one fetch of the unique id waits server-side before the parent checks for a stop.
FETCH_SLICE_S = 1.0


class StoreRelay(Protocol):
    """Publish / fetch with a deadline through the cluster's store (``preflight cluster`` passes
    its own client, scoped to the group's key prefix; nothing here imports torch)."""

    #: Where a value is published, for messages ("the store at HOST:PORT, key K").
    where: str

    def set(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key``; raises when the store does not answer."""

    def get(self, key: str, timeout_s: float) -> str | None:
        """The value of ``key`` once set, None when it is not set within ``timeout_s``; raises
        when the store does not answer."""


@dataclass(frozen=True)
class WorldSpec:
    """Multi-node only (``preflight cluster``): this node's workers are ranks ``rank_offset`` ..
    ``rank_offset + nproc - 1`` of a world of ``world_size`` ranks over several nodes, and every
    rank joins the store the cluster agent already reaches (``store_host:store_port``, keys under
    ``store_prefix``) instead of a store of rank 0 on 127.0.0.1."""

    store_host: str
    store_port: int
    store_prefix: str
    rank_offset: int
    world_size: int
    #: The nccl4py engine's unique id across nodes (see the module docstring); None: torch only.
    relay: StoreRelay | None = field(default=None, compare=False)


@dataclass(frozen=True)
class BenchOptions:
    """What to run. ``labels`` names each rank's device in messages ("GPU 1, 0000:00:07.0")."""

    backend: str
    nproc: int
    sizes: tuple[int, ...]
    timeout_s: float
    iters: int = 20
    warmup: int = 5
    debug: bool = False
    labels: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    python: str = sys.executable
    #: "auto" (nccl4py when the interpreter has it, else torch), "torch" or "nccl4py".
    engine: str = "auto"
    #: nccl4py's buffer: "device" (cuMemAlloc) or "nccl" (ncclMemAlloc).
    alloc: str = "device"
    #: nccl4py: load this libnccl (the training environment's, bench._interpreter) instead of
    #: the one cuda-pathfinder finds for the workers' interpreter
    libnccl: str | None = None
    world: WorldSpec | None = None

    @property
    def world_size(self) -> int:
        """Ranks of the whole collective: ``nproc`` on one node, more with ``world``."""
        return self.world.world_size if self.world else self.nproc


@dataclass
class RankState:
    """What the parent knows about one rank, from its progress pipe and its exit status."""

    rank: int
    label: str
    proc: subprocess.Popen[bytes] | None = None
    phase: str = "spawn"
    size: int | None = None
    step: int = 0
    entered: float = 0.0
    last_beat: float = 0.0
    pid: int | None = None
    pci_bus_id: str | None = None
    error: str | None = None
    traceback: str = ""
    times: dict[int, float] = field(default_factory=dict)
    verified: dict[int, dict[str, Any]] = field(default_factory=dict)
    buffer: bytes = b""
    #: wall clock (time.time) when the parent started this worker
    spawned_wall: float = 0.0
    phase_times: dict[str, float] = field(default_factory=dict)
    engine: str | None = None
    nccl_version: str | None = None
    libnccl: str | None = None
    first_allreduce_s: float | None = None
    stopped_since: float | None = None
    #: the worker has sent at least one line (its interpreter is running)
    heard: bool = False

    def where(self) -> str:
        word = PHASE_WORDS[self.phase]
        return f"{word} of {fmt_bytes(self.size)}" if self.size is not None else word


@dataclass(frozen=True)
class Failure:
    """Why the run did not complete. ``kind``: stalled, hung, died, error, timeout, spawn."""

    kind: str
    message: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RunRecord:
    """Everything the workers reported; judged by :mod:`preflight.bench.verdict`."""

    options: BenchOptions
    ranks: tuple[RankState, ...]
    failure: Failure | None
    store_port: int | None
    log_dir: str | None
    elapsed_s: float
    #: seconds from the last rank's "done" to every worker's exit (communicator and CUDA
    #: context torn down)
    teardown_s: float | None = None
    #: NCCL files the workers left in /dev/shm, removed by the parent (bench/leftovers.py)
    shm_removed: tuple[str, ...] = ()


def _step(phase: str, size: int | None, sizes: Sequence[int]) -> int:
    if phase == "done":
        return _DONE_STEP
    if phase in ("spawn", "init"):
        return PHASES.index(phase)
    index = sizes.index(size) if size in sizes else 0
    return 2 + 3 * index + ("warmup", "measure", "verify").index(phase)


def _worker_env(opts: BenchOptions) -> dict[str, str]:
    env = dict(os.environ if opts.env is None else opts.env)
    # With CUDA_VISIBLE_DEVICES unset, cuda:r is then NVML index r (docs/checks.md, cuda_devices).
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if opts.backend == "gloo" and opts.world is None:
        # A local test: keep gloo on loopback even where the hostname resolves elsewhere.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if opts.debug:
        env["NCCL_DEBUG"] = "INFO"
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET,GRAPH")
    env["PYTHONUNBUFFERED"] = "1"
    # The package must import in the workers even when run from a source tree.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run_workers(opts: BenchOptions, *,
                on_progress: Callable[[str], None] | None = None,
                on_done: Callable[[], None] | None = None) -> RunRecord:
    """Start ``opts.nproc`` workers, follow them to the end or to a deadline, kill what is left.

    Never raises for a worker's failure: the record's ``failure`` says what went wrong. Always
    leaves no worker process running (each worker's process group is killed and reaped).
    """
    started = time.monotonic()
    deadlines = Deadlines.from_timeout(opts.timeout_s)
    log_dir = tempfile.mkdtemp(prefix="preflight-bench-")
    with _terminate_as_exit():
        return _run(opts, started, deadlines, log_dir, on_progress=on_progress, on_done=on_done)


@contextlib.contextmanager
def _terminate_as_exit() -> Any:
    """SIGTERM raises SystemExit in the main thread while workers run, so the ``finally`` clauses
    kill them and remove the log directory (SIGINT already raises KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(opts: BenchOptions, started: float, deadlines: Deadlines, log_dir: str, *,
         on_progress: Callable[[str], None] | None,
         on_done: Callable[[], None] | None = None) -> RunRecord:
    keep = opts.debug
    labels = opts.labels or tuple("CPU" if opts.backend == "gloo" else f"cuda:{r}"
                                  for r in range(opts.nproc))
    ranks = tuple(RankState(rank=r, label=labels[r], entered=started, last_beat=started)
                  for r in range(opts.nproc))
    env = _worker_env(opts)
    sel = selectors.DefaultSelector()
    store_port: int | None = None
    failure: Failure | None = None
    logs: list[Any] = []
    completed = False
    all_done: float | None = None
    w = opts.world
    fetch: _UidFetch | None = None
    shm_before = leftovers.snapshot() if opts.backend == "nccl" else None
    shm_removed: tuple[str, ...] = ()
    # Until the workers are reaped: a signal that ends preflight while this runs in a check's
    # daemon thread (whose finally never runs then) kills them and removes their files.
    undo = aborting.register(lambda: abandon(ranks, log_dir, shm_before))
    try:
        if w is not None and opts.engine == "nccl4py" and w.relay is None:
            failure = Failure("spawn", "the nccl4py engine across nodes needs the cluster store "
                              "to carry its unique id (WorldSpec.relay); run --engine torch",
                              tuple(st.rank for st in ranks))
        for st in ranks:
            failure = failure or _spawn(st, opts, env=env, log_dir=log_dir, sel=sel, logs=logs)
            if failure:
                break
        if (failure is None and w is not None and w.relay is not None and w.rank_offset > 0
                and opts.engine == "nccl4py"):
            # Global rank 0 is on another node: its unique id comes through the store.
            fetch = _UidFetch(w.relay, deadlines.spawn_s + deadlines.init_s)
        failing_since: float | None = None
        while failure is None:
            now = time.monotonic()
            for st, chunk in read_ready(sel, 0.1):
                relay = _consume(st, chunk, opts.sizes, now, on_progress)
                if relay is not None:
                    if "port" in relay:
                        store_port = int(relay["port"])
                    _relay(ranks, relay)
                    if "uid" in relay and w is not None and w.relay is not None:
                        failure = failure or _publish_uid(w.relay, str(relay["uid"]), ranks)
            if failure is not None:
                break
            if fetch is not None and fetch.value is not None and not fetch.relayed:
                # Every local rank waits for it here: none of them is global rank 0.
                _relay(ranks, {"uid": fetch.value}, first=0)
                fetch.relayed = True
            now = time.monotonic()
            if all_done is None and all(st.phase == "done" for st in ranks):
                all_done = now
                # Every rank is past its last collective: the nccl4py workers may exit now, and
                # the GPUs are free for the next test while they do.
                _release(ranks)
                if on_done is not None:
                    on_done()
            if all_done is not None:
                # Everything is reported: wait on the exits themselves, waking the moment the
                # last one is reaped (a pipe reaches end of file while its process still closes
                # its GPU files; polling the pipes would add up to their 0.1 s timeout). Exits
                # that take longer than a step's deadline fall through to the run's own.
                await_exits(ranks, max(0.0, all_done + deadlines.step_s - now))
            if all(st.phase == "done" and st.proc and st.proc.poll() == 0 for st in ranks):
                break
            broken = any(st.error or (st.proc and st.proc.poll() not in (None, 0))
                         for st in ranks)
            if broken:
                # Let the first cause's own report arrive before naming it.
                failing_since = failing_since or now
                if now - failing_since >= GRACE_S:
                    failure = _broken(ranks)
                continue
            failure = (_uid_missing(fetch, ranks, deadlines, now) or _frozen(ranks, now)
                       or _stalled(ranks, deadlines, now, started))
        completed = True
    finally:
        if fetch is not None:
            fetch.stop()
        close_run(ranks, sel, logs)
        if shm_before is not None:
            # Every worker is reaped: what NCCL left in /dev/shm has no owner any more.
            shm_removed = leftovers.remove_orphans(shm_before)
        if not completed and not keep:
            # Interrupted (SIGINT, SIGTERM): no report follows, so nothing of the run may stay.
            shutil.rmtree(log_dir, ignore_errors=True)
        aborting.unregister(undo)
    _collect_tracebacks(ranks, log_dir)
    if not keep:
        shutil.rmtree(log_dir, ignore_errors=True)
    ended = time.monotonic()
    return RunRecord(options=opts, ranks=ranks, failure=failure, store_port=store_port,
                     log_dir=log_dir if keep else None, elapsed_s=ended - started,
                     teardown_s=ended - all_done if all_done is not None and not failure
                     else None, shm_removed=shm_removed)


def _spawn(st: RankState, opts: BenchOptions, *, env: dict[str, str], log_dir: str,
           sel: selectors.BaseSelector, logs: list[Any]) -> Failure | None:
    read_fd, write_fd = os.pipe()
    # Run as a script, not `-m preflight.bench.worker`: the worker needs only the standard library
    # and torch, so it also runs under the training environment's interpreter (config `python`),
    # which need not have preflight's own dependencies.
    w = opts.world
    argv = [opts.python, str(WORKER_SCRIPT), "--rank", str(st.rank + (w.rank_offset if w else 0)),
            "--world-size", str(opts.world_size), "--backend", opts.backend,
            "--sizes", ",".join(str(s) for s in opts.sizes), "--iters", str(opts.iters),
            "--warmup", str(opts.warmup), "--progress-fd", str(write_fd),
            "--engine", opts.engine, "--alloc", opts.alloc, "--parent-pid", str(os.getpid()),
            # torch's own deadline is a backstop behind the parent's, so the parent names the rank.
            "--timeout-s", f"{opts.timeout_s + 30:g}"]
    if opts.libnccl:
        argv += ["--libnccl", opts.libnccl]
    if w is not None:
        argv += ["--local-rank", str(st.rank), "--store", f"{w.store_host}:{w.store_port}",
                 "--store-prefix", w.store_prefix]
    st.spawned_wall = time.time()
    exc = launch(st, argv, pipe=(read_fd, write_fd), env=env, log_dir=log_dir, sel=sel,
                 logs=logs)
    if exc is not None:
        return Failure("spawn", f"cannot start rank {st.rank} ({' '.join(argv[:3])}): {exc}",
                       (st.rank,))
    return None


def launch(st: RankState, argv: Sequence[str], *, pipe: tuple[int, int], env: Mapping[str, str],
           log_dir: str, sel: selectors.BaseSelector, logs: list[Any]) -> OSError | None:
    """Start one worker in its own session with ``pipe``'s write end as its progress fd and its
    output in ``log_dir/rank<N>.log``; register the read end in ``sel`` with ``st`` as data.
    Shared by the all-reduce and the gpu_speed workers; the OSError when it cannot start."""
    read_fd, write_fd = pipe
    if aborting.aborted():  # the run's undo has run already: it would miss this worker
        os.close(read_fd)
        os.close(write_fd)
        return aborting.Aborted("preflight is being stopped by a signal")
    log = open(Path(log_dir) / f"rank{st.rank}.log", "wb")  # noqa: SIM115 - closed by the caller
    logs.append(log)
    try:
        st.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log,
                                   stderr=subprocess.STDOUT, env=env, pass_fds=(write_fd,),
                                   start_new_session=True, close_fds=True)
    except OSError as exc:
        os.close(read_fd)
        return exc
    finally:
        os.close(write_fd)
    st.pid = st.proc.pid
    os.set_blocking(read_fd, False)
    sel.register(read_fd, selectors.EVENT_READ, st)
    return None


def read_ready(sel: selectors.BaseSelector, timeout: float) -> list[tuple[Any, bytes]]:
    """(registered data, bytes) for each progress pipe with output within ``timeout``; a pipe at
    end of file is unregistered and closed."""
    got = []
    for key, _ in sel.select(timeout=timeout):
        try:
            chunk = os.read(key.fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(key.fd)
            os.close(key.fd)
            continue
        got.append((key.data, chunk))
    return got


def close_run(ranks: Sequence[RankState], sel: selectors.BaseSelector,
              logs: Sequence[Any]) -> None:
    """Kill and reap every worker, close the progress pipes, the selector and the log files."""
    _kill_all(ranks)
    for key in list(sel.get_map().values()):
        with contextlib.suppress(OSError):
            os.close(key.fd)
    sel.close()
    for f in logs:
        f.close()


def messages(st: RankState, chunk: bytes, now: float) -> Iterator[dict[str, Any]]:
    """The complete JSON-object lines of ``st``'s progress pipe, ``chunk`` being what just
    arrived (a partial last line waits in ``st.buffer``); each one counts as a beat. Shared by
    the all-reduce and the gpu_speed parents."""
    st.buffer += chunk
    *lines, st.buffer = st.buffer.split(b"\n")
    for raw in lines:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if isinstance(msg, dict):
            st.last_beat, st.heard = now, True
            yield msg


def _consume(st: RankState, chunk: bytes, sizes: Sequence[int], now: float,
             on_progress: Callable[[str], None] | None) -> dict[str, Any] | None:
    """Apply the JSON lines in ``chunk`` to ``st``; return what rank 0 published for the others
    (``{"port": N}`` or ``{"uid": HEX}``), if it did."""
    relay: dict[str, Any] | None = None
    for msg in messages(st, chunk, now):
        ev = msg.get("ev")
        if ev == "started":
            t_main = msg.get("t_main")
            if isinstance(t_main, (int, float)) and st.spawned_wall:
                st.phase_times["interpreter"] = max(0.0, float(t_main) - st.spawned_wall)
        elif ev == "spawned":
            st.pid = int(msg.get("pid") or st.pid or 0)
            st.pci_bus_id = msg.get("pci_bus_id")
            st.engine = str(msg["engine"]) if msg.get("engine") else None
            code = msg.get("nccl_code")
            st.nccl_version = (nccl_version_text(code) if isinstance(code, int) else
                               str(msg["nccl"]) if msg.get("nccl") else None)
            st.libnccl = str(msg["libnccl"]) if msg.get("libnccl") else None
        elif ev == "phase":
            phase = str(msg.get("phase"))
            if phase == "init" and msg.get("done"):
                continue
            if phase in PHASES:
                st.phase, st.size = phase, msg.get("size")
                st.step, st.entered = _step(phase, st.size, sizes), now
                if on_progress and st.rank == 0:
                    on_progress(st.where())
        elif ev == "store":
            relay = {"port": int(msg["port"])}
        elif ev == "uid":
            relay = {"uid": str(msg["uid"])}
        elif ev == "measured":
            st.times[int(msg["size"])] = float(msg["time_s"])
            first = msg.get("first_allreduce_s")
            if isinstance(first, (int, float)):
                st.first_allreduce_s = float(first)
        elif ev == "verified":
            st.verified[int(msg["size"])] = msg
        elif ev == "done":
            st.phase, st.size, st.step, st.entered = "done", None, _DONE_STEP, now
            times = msg.get("phase_times")
            if isinstance(times, dict):
                st.phase_times.update({str(k): float(v) for k, v in times.items()
                                       if k in PHASE_TIMES and isinstance(v, (int, float))})
        elif ev == "error":
            st.error = str(msg.get("error"))
            st.traceback = str(msg.get("traceback", ""))
    return relay


def _relay(ranks: Sequence[RankState], payload: Mapping[str, Any], first: int = 1) -> None:
    """Write what rank 0 published to the stdin of ``ranks[first:]``."""
    line = (json.dumps(dict(payload)) + "\n").encode()
    for st in ranks[first:]:
        if st.proc and st.proc.stdin:
            with contextlib.suppress(OSError):
                st.proc.stdin.write(line)
                st.proc.stdin.flush()


class _UidFetch:
    """A thread that waits for the group's NCCL unique id in the cluster's store (every node but
    the group's first), in slices of ``FETCH_SLICE_S`` so :meth:`stop` ends it promptly."""

    def __init__(self, relay: StoreRelay, timeout_s: float) -> None:
        self.relay, self.timeout_s = relay, timeout_s
        self.started = time.monotonic()
        self.value: str | None = None
        self.error: str | None = None
        self.timed_out = False
        self.relayed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._body, name="uid-fetch", daemon=True)
        self._thread.start()

    def _body(self) -> None:
        deadline = self.started + self.timeout_s
        try:
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    self.timed_out = True
                    return
                got = self.relay.get(UID_KEY, min(FETCH_SLICE_S, left))
                if got is not None:
                    self.value = got
                    return
        except Exception as exc:  # the store's own errors: reported as the rendezvous failing
            self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=FETCH_SLICE_S + 5)


def _publish_uid(relay: StoreRelay, uid: str, ranks: Sequence[RankState]) -> Failure | None:
    """The group's first node: put rank 0's unique id into the store for the other nodes."""
    try:
        relay.set(UID_KEY, uid)
    except Exception as exc:  # the store's own errors
        return Failure("error", f"could not publish rank 0's NCCL unique id to {relay.where}: "
                       f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                       (ranks[0].rank,))
    return None


def _uid_missing(fetch: _UidFetch | None, ranks: Sequence[RankState], deadlines: Deadlines,
                 now: float) -> Failure | None:
    """The unique id did not come through the store: a rendezvous timeout naming global rank 0
    (on another node) as what did not answer; this node's ranks are not blamed ("hung")."""
    if fetch is None or fetch.value is not None:
        return None
    if fetch.error is not None:
        return Failure("hung", f"{_names(ranks)} could not get the NCCL unique id from "
                       f"{fetch.relay.where}: {fetch.error}", tuple(st.rank for st in ranks))
    late = any(st.phase == "init" and now - st.entered > deadlines.init_s for st in ranks)
    if not (fetch.timed_out or late):
        return None
    return Failure("hung", f"no NCCL unique id from global rank 0 (on the group's first node) in "
                   f"{fetch.relay.where} within {now - fetch.started:.0f} s: that node's rank 0 "
                   f"did not reach init (look at that node's output); {_names(ranks)} waited at "
                   f"the rendezvous", tuple(st.rank for st in ranks))


def _names(ranks: Sequence[RankState]) -> str:
    return ", ".join(f"rank {st.rank} ({st.label})" for st in ranks)


def _others(ranks: Sequence[RankState], skip: Sequence[RankState]) -> str:
    rest = [st for st in ranks if st not in skip]
    if not rest:
        return ""
    by_where: dict[str, list[int]] = {}
    for st in rest:
        by_where.setdefault(st.where(), []).append(st.rank)
    return "; " + "; ".join(
        f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} reached {w}"
        for w, rs in by_where.items())


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, t, Z, ...), None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat_state(raw)


def stat_state(raw: bytes) -> str | None:
    """The state letter of a ``/proc/PID/stat`` line, None when the line is not one.

    "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
    """
    end = raw.rfind(b")")
    if end < 0:
        return None
    tail = raw[end + 1:].split()
    state = tail[0].decode(errors="replace") if tail else ""
    return state if len(state) == 1 and state.isalpha() else None


def _frozen(ranks: Sequence[RankState], now: float,
            state_of: Callable[[int], str | None] = proc_state) -> Failure | None:
    """A frozen rank, named without waiting for a phase deadline (see the module docstring)."""
    stopped = []
    for st in ranks:
        alive = st.proc is not None and st.proc.poll() is None
        state = state_of(st.proc.pid) if alive and st.proc is not None else None
        if state in ("T", "t"):
            st.stopped_since = st.stopped_since or now
            if now - st.stopped_since >= STOPPED_CONFIRM_S:
                stopped.append(st)
        else:
            st.stopped_since = None
    if stopped:
        st0 = stopped[0]
        return Failure("stalled", f"{_names(stopped)} stopped in {st0.where()} (process state T:"
                       f" stopped by a signal or a debugger; no heartbeat for "
                       f"{now - st0.last_beat:.0f} s){_others(ranks, stopped)}",
                       tuple(st.rank for st in stopped))
    past_init = [st for st in ranks if st.phase in ("warmup", "measure", "verify")]
    if len(past_init) < 2:
        return None
    silent = [st for st in past_init if now - st.last_beat > FROZEN_SILENT_S]
    beating = [st for st in ranks if now - st.last_beat <= HEARTBEAT_SILENT_S]
    if silent and beating:
        st0 = silent[0]
        return Failure("stalled", f"{_names(silent)} stopped in {st0.where()} (no heartbeat for "
                       f"{now - st0.last_beat:.0f} s: the process is frozen)"
                       f"{_others(ranks, silent)}", tuple(st.rank for st in silent))
    return None


def _stalled(ranks: Sequence[RankState], deadlines: Deadlines, now: float,
             started: float) -> Failure | None:
    """A Failure when some rank has been in one phase past its deadline, or the run past its."""
    late = [st for st in ranks if st.step != _DONE_STEP
            and now - st.entered > deadlines.for_phase(st.phase)]
    over = now - started > deadlines.total_s
    if not late and not over:
        return None
    active = [st for st in ranks if st.step != _DONE_STEP] or list(ranks)
    lowest = min(st.step for st in active)
    behind = [st for st in active if st.step == lowest]
    silent = [st for st in behind if now - st.last_beat > HEARTBEAT_SILENT_S]
    if not late:
        return Failure("timeout", f"the run did not finish within --timeout {deadlines.total_s:g}"
                       f" s; {_names(behind)} in {behind[0].where()} (still progressing)"
                       f"{_others(ranks, behind)}", tuple(st.rank for st in behind))
    if behind[0].phase == "spawn" and (not silent or not any(st.heard for st in behind)):
        # Still starting: the interpreter has not reported yet or is importing its packages.
        # Nothing ran on the GPUs, so this is no hang and no reason to look for Xid errors.
        st0 = behind[0]
        quiet = [st for st in behind if not st.heard]
        what = ("the interpreter has not started the worker yet" if len(quiet) == len(behind)
                else "still importing torch / nccl4py")
        return Failure("slow_start", f"{_names(behind)} still starting after "
                       f"{now - st0.entered:.0f} s ({what}; spawn deadline "
                       f"{deadlines.spawn_s:g} s){_others(ranks, behind)}",
                       tuple(st.rank for st in behind))
    if len(behind) < len(ranks):
        st0 = behind[0]
        beat = (f" (no heartbeat for {now - st0.last_beat:.0f} s: the process is frozen)"
                if st0 in silent else "")
        return Failure("stalled", f"{_names(behind)} stalled in {st0.where()} after "
                       f"{now - st0.entered:.0f} s{beat}{_others(ranks, behind)}",
                       tuple(st.rank for st in behind))
    where = behind[0].where()
    waited = max(now - st.entered for st in behind)
    if silent:
        # Before init the others wait at the rendezvous, after it inside the collective.
        at = "at the rendezvous" if behind[0].phase in ("spawn", "init") else "in the collective"
        who = "the others" if len(silent) < len(ranks) else "the run"
        return Failure("stalled", f"{_names(silent)} stopped in {where} (no heartbeat for "
                       f"{now - max(st.last_beat for st in silent):.0f} s: the process is frozen)"
                       f"; {who} waited {waited:.0f} s {at}", tuple(st.rank for st in silent))
    return Failure("hung", f"all {len(ranks)} ranks are alive but the all-reduce in {where} did "
                   f"not complete within {waited:.0f} s: the collective itself hangs",
                   tuple(st.rank for st in behind))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _broken(ranks: Sequence[RankState]) -> Failure:
    """A worker died or raised: name the first cause (killed ranks before those that saw it)."""
    killed = [st for st in ranks if st.proc and (st.proc.poll() or 0) < 0]
    if killed:
        first = killed[0]
        rest = [st for st in ranks if st.error and st not in killed]
        seen = (f"; then {_names(rest)} failed: {rest[0].error}" if rest else "")
        how = _exit_text(first.proc.poll() if first.proc else None)
        return Failure("died", f"{_names(killed)} {how} in {first.where()}{seen}",
                       tuple(st.rank for st in killed))
    errs = [st for st in ranks if st.error]
    if errs:
        first = errs[0]
        return Failure("error", f"{_names(errs)} failed in {first.where()}: {first.error}",
                       tuple(st.rank for st in errs))
    dead = [st for st in ranks if st.proc and st.proc.poll() not in (None, 0)]
    first = dead[0]
    how = _exit_text(first.proc.poll() if first.proc else None)
    return Failure("died", f"{_names(dead)} {how} in {first.where()} without a report",
                   tuple(st.rank for st in dead))


def _release(ranks: Sequence[RankState]) -> None:
    """Close the workers' control pipes: end of file tells a waiting worker it may exit."""
    for st in ranks:
        if st.proc is not None and st.proc.stdin is not None:
            with contextlib.suppress(OSError):
                st.proc.stdin.close()


def await_exits(ranks: Sequence[RankState], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for the workers to exit, waking the moment each does (a
    pidfd where Linux has them; Popen.wait polls in steps of up to 50 ms)."""
    end = time.monotonic() + timeout_s
    for st in ranks:
        if st.proc is None or st.proc.returncode is not None:
            continue
        left = end - time.monotonic()
        if left <= 0:
            return
        try:
            fd = os.pidfd_open(st.proc.pid)
        except (AttributeError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                st.proc.wait(timeout=left)
            continue
        try:
            select.select([fd], [], [], left)
        finally:
            os.close(fd)
        st.proc.poll()


def abandon(ranks: Sequence[RankState], log_dir: str,
            shm_before: frozenset[str] | None = None) -> None:
    """Undo a run cut short by a signal (core/aborting.py): kill the workers, remove the log
    directory and, given the snapshot from before the run, what NCCL left in /dev/shm. Shared
    with the gpu_speed parent."""
    _kill_all(ranks)
    shutil.rmtree(log_dir, ignore_errors=True)
    if shm_before is not None:
        leftovers.remove_orphans(shm_before)


def _kill_all(ranks: Sequence[RankState]) -> None:
    """SIGKILL every worker's process group and reap it: nothing of the run may outlive it."""
    for st in ranks:
        if st.proc is None:
            continue
        if st.proc.stdin:
            with contextlib.suppress(OSError):
                st.proc.stdin.close()
        if st.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(st.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # Children of a worker that already exited (its group lives on without the leader).
            os.killpg(st.proc.pid, signal.SIGKILL)
    for st in ranks:
        if st.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                st.proc.wait(timeout=10)


def _collect_tracebacks(ranks: Sequence[RankState], log_dir: str) -> None:
    """Keep the tail of each failed rank's log, for the message (the directory may be removed)."""
    for st in ranks:
        if st.error and not st.traceback:
            path = Path(log_dir) / f"rank{st.rank}.log"
            with contextlib.suppress(OSError):
                st.traceback = path.read_text(errors="replace")[-2000:]
