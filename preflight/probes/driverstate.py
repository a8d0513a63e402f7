"""Is the NVIDIA driver already initialised on this node? Evidence from /proc, without NVML.

Asked only when an NVML call has not answered in time (:class:`~preflight.probes.gpu.
DeadlineGpuProbe`): with the GPUs initialised, a silent NVML is a hung driver; without, it may be a
slow first initialisation. The GPUs stay initialised while any process holds a ``/dev/nvidiaN``
open (NVIDIA, "Driver Persistence": the driver deinitialises a GPU when its last client closes
it), which is what ``nvidia-persistenced``, DCGM's ``nv-hostengine`` and any running CUDA job do.
A legacy persistence mode (``nvidia-smi -pm 1`` without the daemon) leaves no such trace: it reads
as "no evidence", the cautious side (undecided, not drained).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

#: Daemons whose only job is to keep the GPUs initialised (or that hold them for monitoring).
KEEPERS = ("nvidia-persistenced", "nv-hostengine")
#: The kernel keeps 15 characters of a command name (TASK_COMM_LEN 16): "nvidia-persiste".
_COMMS = {name[:15]: name for name in KEEPERS}
_GPU_DEVICE = re.compile(r"^/dev/nvidia\d+$")
#: Upper bound of the /proc scan, seconds (a node with thousands of processes and descriptors).
SCAN_DEADLINE_S = 0.5


def warm_evidence(proc: Path = Path("/proc"), *,
                  deadline_s: float = SCAN_DEADLINE_S) -> str | None:
    """A sentence naming a process that keeps the GPUs initialised, or None (none found in
    ``deadline_s``; this process itself does not count)."""
    stop = time.monotonic() + deadline_s
    me = str(os.getpid())
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and p != me]
    except OSError:
        return None
    holder: str | None = None
    for pid in pids:
        if time.monotonic() > stop:
            break
        base = proc / pid
        try:
            comm = (base / "comm").read_text(errors="replace").strip()[:32]
        except OSError:
            continue
        if comm in _COMMS:
            return f"{_COMMS[comm]} (pid {pid}) runs"
        if holder is None:
            holder = _holds_gpu(base, pid, comm)
    return holder


def _holds_gpu(base: Path, pid: str, comm: str) -> str | None:
    try:
        fds = os.listdir(base / "fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(base / "fd" / fd)
        except OSError:
            continue
        if _GPU_DEVICE.match(target):
            return f"pid {pid} ({comm}) holds {target} open"
    return None


__all__ = ["KEEPERS", "warm_evidence"]
