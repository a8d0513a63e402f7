"""Facts about processes from ``/proc`` (under ``--root``): who a GPU's compute process is, and
whether a user still runs anything on the node. Reads are bounded; a process that exits while
being read simply reads as gone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Bytes of a process's environment read for its SLURM_JOB_ID (it is set early, by slurmstepd).
_ENVIRON_BYTES = 256 << 10


@dataclass(frozen=True)
class ProcInfo:
    """One process. ``alive`` False: no such pid (it exited, or lives in another pid namespace).
    ``slurm_job_id``: the job it belongs to by its environment, None when it has none."""

    pid: int
    alive: bool
    uid: int | None = None
    comm: str = ""
    slurm_job_id: str | None = None

    def describe(self) -> str:
        if not self.alive:
            return f"pid {self.pid} (no longer in /proc)"
        job = f", job {self.slurm_job_id}" if self.slurm_job_id else ""
        return f"pid {self.pid} ({self.comm or '?'}, uid {self.uid}{job})"


def proc_info(pid: int, proc: Path = Path("/proc")) -> ProcInfo:
    base = proc / str(pid)
    try:
        uid = os.stat(base).st_uid
    except OSError:
        return ProcInfo(pid, alive=False)
    try:
        comm = (base / "comm").read_text(errors="replace").strip()[:64]
    except OSError:
        comm = ""
    return ProcInfo(pid, alive=True, uid=uid, comm=comm, slurm_job_id=_job_id(base))


def _job_id(base: Path) -> str | None:
    try:
        with open(base / "environ", "rb") as f:
            data = f.read(_ENVIRON_BYTES)
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            value = item[len(b"SLURM_JOB_ID="):].decode("ascii", "replace")
            return value if value.isdigit() and len(value) <= 20 else None
    return None


def processes_of(uid: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids owned by ``uid`` (this process left out)."""
    me = os.getpid()
    out: list[int] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(proc / name).st_uid == uid:
                out.append(int(name))
        except OSError:
            continue
    return sorted(out)


__all__ = ["ProcInfo", "proc_info", "processes_of"]
