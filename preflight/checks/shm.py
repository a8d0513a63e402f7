"""``shm``: /dev/shm exists, is writable, and is big enough for NCCL and DataLoader workers.

Why: NCCL's SHM transport, its proxy-ops pool and NVLS registration live in /dev/shm
(/dev/shm/nccl-XXXXXX); a Docker container's default of 64 MiB makes NCCL fail with "Error while
creating shared memory segment" from 4 GPUs on, or hang half-way through training (NCCL
troubleshooting guide, "Docker":
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html). DataLoader workers
pass tensors through it too ("Bus error").

Need: max(``shm_min_bytes`` (1 GiB), 9.2 MiB x ``shm_channels`` (16) x local peers) where local
peers = local GPUs - 1. Both the size and the free space must reach it.

Whose fault a lack of free space is, is decided by evidence (``preflight.probes.holders``): space
that live processes hold (open or mapped, deleted files included) belongs to running jobs, which
free it when they end: a WARN ``ShmBusy`` naming the holders and their jobs, never a drain (on a
shared node one DataLoader would drain it). Files no process holds are leftovers of dead jobs that
poison every next one: a FAIL ``ShmFull`` listing them, when removing them would free enough. When
neither explains the shortfall (processes that could not be inspected: not root), WARN
``ShmFullUnattributed``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.checks.job_gpus import job_gpu_count
from preflight.core.context import Context
from preflight.core.result import Result, Scope, Status
from preflight.core.textsafe import escape
from preflight.core.units import fmt_bytes
from preflight.probes.holders import FileId, Held, Holder, HolderScan, Wanted, find_holders

NAME = "shm"
#: Bytes of one NCCL SHM connection (NCCL's SHM transport allocates one per channel per peer).
SHM_BYTES_PER_CONNECTION = 9_637_888
DOCKER_DEFAULT_SHM_BYTES = 64 * 1024 * 1024
#: Most entries of /dev/shm looked at (files and directories) when judging a lack of space.
MAX_LISTED = 20000
#: Leftovers and holders named in a message (the details list more).
SHOWN = 5

REMEDY = ("Give the container a bigger /dev/shm: docker run --shm-size=16g (or --ipc=host); "
          "Kubernetes: mount an emptyDir {medium: Memory, sizeLimit: 16Gi} at /dev/shm; "
          "last resort: export NCCL_SHM_DISABLE=1 (slower).")


def need_bytes(local_gpus: int, *, channels: int, floor_bytes: int) -> int:
    """Bytes of /dev/shm NCCL needs for ``local_gpus`` GPUs on this node."""
    peers = max(0, local_gpus - 1)
    return max(floor_bytes, SHM_BYTES_PER_CONNECTION * channels * peers)


@dataclass(frozen=True)
class Listed:
    """A regular file in /dev/shm: its path relative to it, the space it takes, its owner."""

    path: str
    bytes: int
    uid: int


def list_files(path: Path, *, skip: str = "", limit: int = MAX_LISTED
               ) -> tuple[dict[FileId, Listed], bool]:
    """The regular files under ``path`` (not following links, not leaving its filesystem) and
    whether the listing is complete (``limit`` entries at most)."""
    files: dict[FileId, Listed] = {}
    seen = 0
    todo = [(path, "")]
    top_dev = os.lstat(path).st_dev
    while todo:
        directory, prefix = todo.pop()
        try:
            with os.scandir(directory) as entries:
                items = list(entries)
        except OSError:
            continue
        for entry in items:
            seen += 1
            if seen > limit:
                return files, False
            if not prefix and entry.name == skip:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            rel = prefix + entry.name
            if stat.S_ISDIR(st.st_mode) and st.st_dev == top_dev:
                todo.append((Path(entry.path), rel + "/"))
            elif stat.S_ISREG(st.st_mode):
                files[FileId.of(st)] = Listed(rel, st.st_blocks * 512, st.st_uid)
    return files, True


def _held_bytes(held: Held, listed: dict[FileId, Listed]) -> int:
    """The space one held file takes: what the holder's mapping says, else its listed size."""
    if held.bytes is not None:
        return held.bytes
    item = listed.get(held.file)
    return item.bytes if item is not None else 0


def _holder_bytes(holder: Holder, listed: dict[FileId, Listed]) -> int:
    return sum(_held_bytes(h, listed) for h in holder.files)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _list(items: list[str], more: int, noun: str) -> str:
    text = ", ".join(items)
    return text + (f" and {more} more {noun}" if more > 0 else "")


def _pressure(ctx: Context, path: Path, *, size: int, free: int, need: int, for_gpus: str,
              details: dict[str, Any], probe: str) -> Result:
    """Not enough free space: whose it is, from who holds what (``probe``: our own file)."""
    listed, listing_complete = list_files(path, skip=probe)
    scan: HolderScan = find_holders(ctx.host_path("/proc"),
                                    Wanted(devices=frozenset({os.stat(path).st_dev})),
                                    deadline_s=ctx.config.check_timeout_s / 2,
                                    skip_pids=(os.getpid(),))
    held = scan.held()
    held_bytes = sum(_held_bytes(h, listed) for h in held.values())
    leftovers = sorted((item for f, item in listed.items() if f not in held),
                       key=lambda item: (-item.bytes, item.path))
    leftover_bytes = sum(item.bytes for item in leftovers)
    holders = sorted(scan.holders, key=lambda h: (-_holder_bytes(h, listed), h.pid))
    short = need - free
    details.update({
        "held_bytes": held_bytes, "leftover_bytes": leftover_bytes,
        "leftovers": [{"path": escape(i.path, 300), "bytes": i.bytes, "uid": i.uid}
                      for i in leftovers[:20]],
        "holders": [{"pid": h.pid, "uid": h.uid, "user": h.user, "job": h.job,
                     "cgroup": h.cgroup, "command": h.command,
                     "bytes": _holder_bytes(h, listed)} for h in holders[:20]],
        "processes_seen": scan.processes, "processes_unreadable": scan.unreadable,
        "listing_complete": listing_complete})
    state = f"/dev/shm has {fmt_bytes(free)} free of {fmt_bytes(size)}; need >= " \
            f"{fmt_bytes(need)} free {for_gpus}"
    left_text = _list([f"{escape(i.path, 80)} ({fmt_bytes(i.bytes)})"
                       for i in leftovers[:SHOWN]], len(leftovers) - SHOWN, "files")
    held_text = _list([f"{h.describe()}: {fmt_bytes(_holder_bytes(h, listed))}"
                       for h in holders[:SHOWN]], len(holders) - SHOWN, "processes")
    if leftovers and leftover_bytes >= short and scan.seen_all:
        also = f"; running processes hold {fmt_bytes(held_bytes)} more" if held_bytes else ""
        shown = " ".join(shlex.quote(str(path / i.path)) for i in leftovers[:SHOWN])
        return Result(NAME, Status.FAIL, "ShmFull",
                      f"{state}: {_count(len(leftovers), 'file')} that no running process "
                      f"holds take{'s' if len(leftovers) == 1 else ''} "
                      f"{fmt_bytes(leftover_bytes)}: {left_text}"
                      f"{also}",
                      f"Remove what dead jobs left (no process has them open or mapped): rm -f "
                      f"{escape(shown, 600)}{' ...' if len(leftovers) > SHOWN else ''}; have the "
                      "epilog clean /dev/shm (or give each job its own: Slurm "
                      "job_container/tmpfs).", details=details)
    if held_bytes and scan.holders:
        rest = (f"; files no process holds take {fmt_bytes(leftover_bytes)}: {left_text}"
                if leftovers else "")
        return Result(NAME, Status.WARN, "ShmBusy",
                      f"{state}: running processes hold {fmt_bytes(held_bytes)} of it, freed "
                      f"when they end: {held_text}{rest}",
                      "Not the node's fault: the next job here gets what these processes leave. "
                      "Run it elsewhere or after them; give each job its own /dev/shm (Slurm "
                      "job_container/tmpfs, a pod's emptyDir {medium: Memory}).",
                      details=details, scope=Scope.JOB)
    unseen = (scan.error if scan.error else
              f"{scan.unreadable} of {scan.processes} processes could not be inspected"
              if scan.unreadable else "the process scan did not finish in time"
              if not scan.complete else "no visible process holds the space")
    candidates = f"; files no inspected process holds: {left_text}" if leftovers else ""
    return Result(NAME, Status.WARN, "ShmFullUnattributed",
                  f"{state}, and whose the space is cannot be told: {unseen}{candidates}",
                  "Run the check as root to see every process (ls -la /dev/shm; fuser -v "
                  "/dev/shm/*), then remove what no process holds.", details=details,
                  scope=Scope.UNDECIDED)


def run(ctx: Context) -> Result:
    path = ctx.host_path("/dev/shm")
    if not path.is_dir():
        return Result(NAME, Status.FAIL, "ShmMissing", f"{path} does not exist or is not a "
                      "directory; NCCL aborts when stat(/dev/shm) fails", REMEDY)
    probe = path / f".preflight-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return Result(NAME, Status.FAIL, "ShmNotWritable",
                          f"cannot create a file in {path}: {exc.strerror or exc}",
                          "Mount /dev/shm read-write (tmpfs, mode 1777) for the job's user. "
                          + REMEDY, details={"path": str(path), "errno": exc.errno})
        fd = -1
    full = fd < 0
    try:
        if fd >= 0:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return Result(NAME, Status.FAIL, "ShmNotWritable",
                          f"cannot write 4 KiB to {path}: {exc.strerror or exc}", REMEDY,
                          details={"path": str(path), "errno": exc.errno})
        full = True
    finally:
        if fd >= 0:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                probe.unlink()
    st = os.statvfs(path)
    size = st.f_blocks * st.f_frsize
    free = 0 if full else st.f_bavail * st.f_frsize
    gpus = job_gpu_count(ctx)
    need = need_bytes(gpus, channels=ctx.config.shm_channels, floor_bytes=ctx.config.shm_min_bytes)
    details: dict[str, Any] = {"path": str(path), "size_bytes": size, "free_bytes": free,
                               "need_bytes": need, "local_gpus": gpus}
    for_gpus = f"for {gpus} local GPU{'s' if gpus != 1 else ''}"
    if size < need:
        docker = " (the Docker default)" if size == DOCKER_DEFAULT_SHM_BYTES else ""
        return Result(NAME, Status.FAIL, "ShmTooSmall",
                      f"/dev/shm is {fmt_bytes(size)}{docker}; need >= {fmt_bytes(need)} "
                      f"{for_gpus}", REMEDY, details=details)
    if free < need:
        return _pressure(ctx, path, size=size, free=free, need=need, for_gpus=for_gpus,
                         details=details, probe=probe.name)
    return Result(NAME, Status.PASS, "ShmOk",
                  f"/dev/shm {fmt_bytes(size)}, {fmt_bytes(free)} free; need {fmt_bytes(need)} "
                  f"{for_gpus}", details=details)
