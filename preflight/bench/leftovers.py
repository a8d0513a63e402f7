"""NCCL's shared-memory files that the all-reduce workers may leave in /dev/shm, and their removal.

NCCL creates ``/dev/shm/nccl-XXXXXX`` files for its intra-node transports and unlinks each one once
every peer has attached it, or in ``ncclCommDestroy`` when a peer never did. The workers end by
exiting (a destroy costs 0.5 s: docs/benchmarks.md), and a worker that is killed (a stall, a
deadline) never destroys anything, so a file a peer never attached would stay in /dev/shm, which
is memory, for good. After every run the parent removes the ``nccl-*`` files that appeared
during it, belong to the user the workers ran as, and that no live process has open or mapped.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

SHM_DIR = "/dev/shm"
PREFIX = "nccl-"


def snapshot(directory: str = SHM_DIR) -> frozenset[str]:
    """The names of the NCCL files in ``directory`` now (empty when it cannot be read)."""
    try:
        return frozenset(n for n in os.listdir(directory) if n.startswith(PREFIX))
    except OSError:
        return frozenset()


def remove_orphans(before: Iterable[str], *, directory: str = SHM_DIR,
                   uid: int | None = None, proc: str = "/proc") -> tuple[str, ...]:
    """Remove the NCCL files that appeared in ``directory`` since ``before``, are regular files of
    ``uid`` (default: this process's effective uid) and that no process has open or mapped;
    return their paths. Never raises."""
    new = snapshot(directory) - frozenset(before)
    if not new:
        return ()
    owner = os.geteuid() if uid is None else uid
    busy = paths_in_use(directory, proc)
    removed = []
    for name in sorted(new):
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or path in busy:
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return tuple(removed)


def paths_in_use(directory: str, proc: str = "/proc") -> set[str]:
    """Paths under ``directory`` that a process we can inspect has open (fd) or mapped (maps)."""
    prefix = directory.rstrip("/") + "/"
    used: set[str] = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return used
    for pid in pids:
        base = os.path.join(proc, pid)
        try:
            with open(os.path.join(base, "maps"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        used.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            pass
        try:
            fds = os.listdir(os.path.join(base, "fd"))
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(base, "fd", fd))
            except OSError:
                continue
            if target.startswith(prefix):
                used.add(target)
    return used
