"""Resource limits of this process (``getrlimit``), as plain data.

The job inherits them from the same place preflight does (the Slurm step, the container runtime,
``/etc/security/limits.conf``), so a Slurm prolog, an init container or ``preflight check`` in the
job's shell reads what the job will get. ``preflight serve`` runs under systemd, whose limits
(``LimitMEMLOCK=``) are its own: there the figure describes the daemon, not the jobs.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class MemlockLimit:
    """RLIMIT_MEMLOCK: bytes a process may lock in RAM (``ulimit -l``, in bytes here).

    Attributes:
        soft_bytes: the limit in force; None = unlimited.
        hard_bytes: the ceiling the process may raise it to; None = unlimited.
    """

    soft_bytes: int | None
    hard_bytes: int | None


def read_memlock() -> MemlockLimit:
    """This process's RLIMIT_MEMLOCK (a system call; cannot hang)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def bytes_or_none(value: int) -> int | None:
        return None if value == resource.RLIM_INFINITY else int(value)

    return MemlockLimit(bytes_or_none(soft), bytes_or_none(hard))
