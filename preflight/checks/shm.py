"""``shm``: /dev/shm exists, is writable, and is big enough for NCCL and DataLoader workers.

Why: NCCL's SHM transport, its proxy-ops pool and NVLS registration live in /dev/shm
(/dev/shm/nccl-XXXXXX); a Docker container's default of 64 MiB makes NCCL fail with "Error while
creating shared memory segment" from 4 GPUs on, or hang half-way through training (NCCL
troubleshooting guide, "Docker":
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html). DataLoader workers
pass tensors through it too ("Bus error").

Need: max(``shm_min_bytes`` (1 GiB), 9.2 MiB x ``shm_channels`` (16) x local peers) where local
peers = local GPUs - 1. Both the size and the free space must reach it.
"""

from __future__ import annotations

import contextlib
import os
import uuid

from preflight.checks.job_gpus import job_gpu_count
from preflight.core.context import Context
from preflight.core.result import Result, Status
from preflight.core.units import fmt_bytes

NAME = "shm"
#: Bytes of one NCCL SHM connection (NCCL's SHM transport allocates one per channel per peer).
SHM_BYTES_PER_CONNECTION = 9_637_888
DOCKER_DEFAULT_SHM_BYTES = 64 * 1024 * 1024

REMEDY = ("Give the container a bigger /dev/shm: docker run --shm-size=16g (or --ipc=host); "
          "Kubernetes: mount an emptyDir {medium: Memory, sizeLimit: 16Gi} at /dev/shm; "
          "last resort: export NCCL_SHM_DISABLE=1 (slower).")


def need_bytes(local_gpus: int, *, channels: int, floor_bytes: int) -> int:
    """Bytes of /dev/shm NCCL needs for ``local_gpus`` GPUs on this node."""
    peers = max(0, local_gpus - 1)
    return max(floor_bytes, SHM_BYTES_PER_CONNECTION * channels * peers)


def run(ctx: Context) -> Result:
    path = ctx.host_path("/dev/shm")
    if not path.is_dir():
        return Result(NAME, Status.FAIL, "ShmMissing", f"{path} does not exist or is not a "
                      "directory; NCCL aborts when stat(/dev/shm) fails", REMEDY)
    probe = path / f".preflight-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        return Result(NAME, Status.FAIL, "ShmNotWritable",
                      f"cannot create a file in {path}: {exc.strerror or exc}",
                      "Mount /dev/shm read-write (tmpfs, mode 1777) for the job's user. " + REMEDY,
                      details={"path": str(path), "errno": exc.errno})
    try:
        os.write(fd, b"\0" * 4096)
    except OSError as exc:
        return Result(NAME, Status.FAIL, "ShmFull",
                      f"cannot write 4 KiB to {path}: {exc.strerror or exc}", REMEDY,
                      details={"path": str(path), "errno": exc.errno})
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()
    st = os.statvfs(path)
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    gpus = job_gpu_count(ctx)
    need = need_bytes(gpus, channels=ctx.config.shm_channels, floor_bytes=ctx.config.shm_min_bytes)
    details = {"path": str(path), "size_bytes": size, "free_bytes": free, "need_bytes": need,
               "local_gpus": gpus}
    for_gpus = f"for {gpus} local GPU{'s' if gpus != 1 else ''}"
    if size < need:
        docker = " (the Docker default)" if size == DOCKER_DEFAULT_SHM_BYTES else ""
        return Result(NAME, Status.FAIL, "ShmTooSmall",
                      f"/dev/shm is {fmt_bytes(size)}{docker}; need >= {fmt_bytes(need)} "
                      f"{for_gpus}", REMEDY, details=details)
    if free < need:
        return Result(NAME, Status.FAIL, "ShmFull",
                      f"/dev/shm has {fmt_bytes(free)} free of {fmt_bytes(size)}; need >= "
                      f"{fmt_bytes(need)} free {for_gpus}",
                      f"Remove stale files from {path} (old nccl-* or torch_* segments of dead "
                      "jobs: ls -la /dev/shm), or " + REMEDY[0].lower() + REMEDY[1:],
                      details=details)
    return Result(NAME, Status.PASS, "ShmOk",
                  f"/dev/shm {fmt_bytes(size)}, {fmt_bytes(free)} free; need {fmt_bytes(need)} "
                  f"{for_gpus}", details=details)
