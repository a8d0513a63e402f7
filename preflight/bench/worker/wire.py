"""The wire between the GPU worker and its parent, for both sides (stdlib only, Python >= 3.8).

Worker -> parent: one JSON object per line on the file descriptor ``--progress-fd``
(``{"ev": EVENT, "t": wall clock, ...fields}``): :class:`Progress` writes them, a heartbeat
thread adds ``hb`` every :data:`HEARTBEAT_S` so the parent tells a frozen worker (no heartbeat:
SIGSTOP, a driver call holding the GIL) from one waiting for a peer. stdout and stderr are left
to NCCL_DEBUG and tracebacks (a log file per worker).

Parent -> worker: JSON lines on the worker's stdin (:data:`PLAN`, :data:`GO`, :data:`PORT`,
:data:`UID`), read with :class:`Control`; end of file releases the worker (every rank is done,
it may exit).

A worker never outlives its parent: PR_SET_PDEATHSIG (even while stopped) and the heartbeat
thread's orphan test (:func:`die_with_parent`, :func:`start_heartbeat`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

# ----------------------------------------------------------------------------- events (ev)
#: The interpreter runs the worker: ``t_main`` (wall clock at main()), ``pid``, ``python``.
STARTED = "started"
#: The heartbeat.
BEAT = "hb"
#: A step or phase entered: ``step``, ``phase``, ``size`` (all-reduce phases of one size).
PHASE = "phase"
#: The GPU the worker opened: ``bus_id``, ``name``, ``capability``, ``sm_count``,
#: ``bus_width_bits``.
DEVICE = "device"
#: A step's engine as chosen and loaded: ``step``, ``engine`` (and NCCL's ``nccl_code``).
ENGINE = "engine"
#: This interpreter cannot run a step: ``step``, ``need`` (what the step needs, in words),
#: ``why`` (what stopped each engine that imported but cannot run here), ``python``.
MISSING = "missing"
#: A figure: speed ``kind``/``value``/``time_s``/``iters``; all-reduce ``size``/``time_s``/
#: ``iters``/``first_allreduce_s``/``timer``.
MEASURED = "measured"
#: The exact check of one all-reduce size: ``size``, ``ok``, ``mismatches``, ``elements``, ...
VERIFIED = "verified"
#: Rank 0's rendezvous for the other ranks: ``port`` (torch's store) or ``uid`` (NCCL's id).
PUBLISH = "publish"
#: A step finished (``start``: the start-up): ``step``, ``times`` (seconds per phase).
STEP_DONE = "step_done"
#: What the worker loaded, from where: ``python``, ``torch``, ``nccl4py``, ``cuda_bindings``,
#: ``libnccl``, ``libcublas`` (each ``{"version", "path"}`` or None). Sent before ``done``.
LOADED = "loaded"
#: Every step finished.
DONE = "done"
#: The worker failed: ``step``, ``phase``, ``error`` (a sentence), ``traceback``.
ERROR = "error"
#: What one step of the DDP ladder showed on this rank (:mod:`.ddp`): ``step``, ``rank``,
#: ``local_rank``, ``world_size``, ``backend``, ``device``, the parameters' digests, the loss
#: before and after, the sample indices of each epoch, the gradients seen.
DDP_FACTS = "ddp_facts"

# ------------------------------------------------------------------ control (parent -> worker)
GO = "go"
PORT = "port"
UID = "uid"
#: A worker started before its plan was known gets it (or null: not needed, exit).
PLAN = "plan"


def go_key(step: str) -> str:
    """The control key that starts one DDP step (``go_gloo``); end of file instead: stop."""
    return f"go_{step}"


# ------------------------------------------------------------------------------- steps, phases
START, SPEED, ALLREDUCE = "start", "speed", "allreduce"
STEPS = (START, SPEED, ALLREDUCE)
#: ``spawn`` until the worker's first line (the interpreter starting), then its engines'
#: imports and the CUDA context (the driver's own initialisation).
START_PHASES = ("spawn", "imports", "context")
#: ``setup`` (memory, cuBLAS), ``ready`` (waiting for the parent's go: every GPU measures at
#: the same moment), then one phase per kind.
SPEED_KINDS = ("h2d", "d2h", "d2d", "gemm")
SPEED_PHASES = ("setup", "ready", *SPEED_KINDS)
#: ``init`` (rendezvous, communicator, buffer), then per size warm-up, measure, verify.
ALLREDUCE_PHASES = ("init", "warmup", "measure", "verify")
DONE_PHASE = "done"
#: The DDP ladder's steps (``preflight ddp``): each local rank alone on its GPU with no process
#: group, every local rank with gloo, then with NCCL; ``world``: every rank of every node
#: (``preflight cluster --ddp``).
DDP_SINGLE, DDP_GLOO, DDP_NCCL, DDP_WORLD = "single", "gloo", "nccl", "world"
DDP_STEPS = (DDP_SINGLE, DDP_GLOO, DDP_NCCL, DDP_WORLD)
#: ``ready`` (waiting for the parent's go), ``setup`` (data, model on its device), ``init`` (the
#: process group), ``wrap`` (DDP(...): its broadcast of the parameters), per iteration
#: ``forward``, ``backward`` (the gradient all-reduce), ``optimizer`` (``size``: the
#: iteration), ``check`` (the loss over the whole data set, the digests), ``teardown``
#: (barrier, destroy).
DDP_ITERATION_PHASES = ("forward", "backward", "optimizer")
DDP_PHASES = ("ready", "setup", "init", "wrap", *DDP_ITERATION_PHASES, "check", "teardown")
#: Steps whose ranks wait for each other (a stall there is diagnosed across ranks).
COLLECTIVE_STEPS = (ALLREDUCE, DDP_GLOO, DDP_NCCL, DDP_WORLD)

#: The one table of iterations: (untimed warm-ups, timed iterations) per speed kind and per
#: all-reduce backend. gloo on the CPU is a plumbing and correctness test: few iterations.
ITERATIONS = {"h2d": (1, 10), "d2h": (1, 10), "d2d": (2, 10), "gemm": (3, 10),
              "nccl": (5, 20), "gloo": (1, 3)}

#: Test-only (docs/gpu-speed.md): ``BUS:PHASE`` stops the worker of that bus id (SIGSTOP)
#: when it enters PHASE, so the tests prove a frozen worker is named.
STALL_ENV = "PREFLIGHT_GPUSPEED_TEST_STALL"
#: Test-only (docs/bandwidth.md): this all-reduce rank adds 1 to one element before the check.
CORRUPT_ENV = "PREFLIGHT_BENCH_TEST_CORRUPT_RANK"
#: Test-only (docs/ddp.md): comma-separated faults the DDP worker injects into itself:
#: ``no_set_epoch`` (every rank), ``skip_step=R`` (rank R never calls optimizer.step()),
#: ``hang=R@STEP`` (rank R sleeps before its third forward of that step).
DDP_TEST_ENV = "PREFLIGHT_DDP_TEST"

HEARTBEAT_S = 0.5
_PR_SET_PDEATHSIG = 1


def encode(event: str, **fields: Any) -> bytes:
    """One message line."""
    return (json.dumps({"ev": event, "t": time.time(), **fields}) + "\n").encode()


def decode(line: bytes) -> dict[str, Any] | None:
    """A message line as a dict; None for anything else (a partial write, noise)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("ev"), str) else None


def control_line(**fields: Any) -> bytes:
    """A parent -> worker line."""
    return (json.dumps(fields) + "\n").encode()


class Progress:
    """The worker's side of the progress pipe; one lock so the heartbeat never splits a line."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        data = encode(event, **fields)
        with self._lock:
            try:
                while data:
                    data = data[os.write(self._fd, data):]
            except OSError:
                # The parent is gone: nobody is left to report to, and nothing may keep running.
                os._exit(3)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent dies (Linux PR_SET_PDEATHSIG), even while stopped;
    then make sure the parent did not die before the request."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(3)


def start_heartbeat(progress: Progress, parent_pid: int) -> None:
    def beat() -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            if os.getppid() != parent_pid:
                os._exit(3)  # orphaned: a validator leaves no process behind
            progress.send(BEAT)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


class Control:
    """The worker's side of its stdin: JSON lines from the parent, read without buffering behind
    ``select`` (a buffered reader would hide a second line that arrived with the first)."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._buffer = b""
        self._seen: dict[str, Any] = {}
        self.closed = False

    def _read(self, timeout_s: float) -> bool:
        """Read what arrives within ``timeout_s``; False when nothing did."""
        if self.closed:
            return False
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        chunk = os.read(self._fd, 65536)
        if not chunk:
            self.closed = True
            return True
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                self._seen.update(msg)
        return True

    def get(self, key: str, timeout_s: float) -> Any:
        """The value the parent sent for ``key``; TimeoutError / EOFError when none comes."""
        deadline = time.monotonic() + timeout_s
        while key not in self._seen:
            if self.closed:
                raise EOFError(f"the parent closed the control pipe before sending {key}")
            if not self._read(deadline - time.monotonic()) and time.monotonic() >= deadline:
                raise TimeoutError(f"no {key} from the parent within {timeout_s:g} s")
        return self._seen[key]

    def wait_release(self, timeout_s: float) -> None:
        """Until the parent closes the pipe (every rank done), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self.closed and time.monotonic() < deadline:
                self._read(deadline - time.monotonic())
        except (OSError, ValueError):
            pass


class Clock:
    """Seconds per phase, as the worker reports them (``times`` of ``step_done`` / ``done``)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self.mark
        self.mark = now
