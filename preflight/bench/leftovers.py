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

from preflight.probes.holders import FileId, Wanted, find_holders

SHM_DIR = "/dev/shm"
PREFIX = "nccl-"
#: Most seconds the look for processes holding the files may take (a node has a few thousand;
#: a scan usually takes well under one).
HOLDERS_DEADLINE_S = 5.0


def snapshot(directory: str = SHM_DIR) -> frozenset[str]:
    """The names of the NCCL files in ``directory`` now (empty when it cannot be read)."""
    try:
        return frozenset(n for n in os.listdir(directory) if n.startswith(PREFIX))
    except OSError:
        return frozenset()


def remove_orphans(before: Iterable[str], *, directory: str = SHM_DIR,
                   uid: int | None = None, proc: str = "/proc",
                   deadline_s: float = HOLDERS_DEADLINE_S) -> tuple[str, ...]:
    """Remove the NCCL files that appeared in ``directory`` since ``before``, are regular files of
    ``uid`` (default: this process's effective uid) and that no process has open or mapped;
    return their paths. Never raises.

    Holders are found by the files' device and inode (:func:`preflight.probes.holders.
    find_holders`), so a process in another mount namespace counts too. A process that cannot
    be inspected (another user's, without root) is not waited for: the files are this user's.
    When the processes could not all be looked at (``proc`` unreadable, ``deadline_s`` spent),
    nothing is removed.
    """
    new = snapshot(directory) - frozenset(before)
    if not new:
        return ()
    owner = os.geteuid() if uid is None else uid
    candidates: dict[str, FileId] = {}
    for name in sorted(new):
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == owner:
            candidates[path] = FileId.of(st)
    if not candidates:
        return ()
    scan = find_holders(proc, Wanted(files=frozenset(candidates.values())),
                        deadline_s=deadline_s)
    if not scan.complete:
        return ()
    held = scan.held()
    removed = []
    for path, file in candidates.items():
        if file in held or not _same_file(path, file):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return tuple(removed)


def _same_file(path: str, file: FileId) -> bool:
    """``path`` still names ``file`` (not a new file of the same name made since the scan)."""
    try:
        return FileId.of(os.lstat(path)) == file
    except OSError:
        return False
