"""May the bandwidth test run now? One answer for the ``allreduce`` check, ``preflight serve``'s
periodic test and ``preflight bench`` (pure over a GPU snapshot; imports neither NVML nor torch)."""

from __future__ import annotations

from dataclasses import dataclass

from preflight.probes.gpu import GpuSnapshot

_EXCLUSIVE = ("EXCLUSIVE_PROCESS", "EXCLUSIVE_THREAD")


@dataclass(frozen=True)
class Blocker:
    """Why the test must not run now: a reason token and a sentence."""

    reason: str
    why: str


def blocker(snapshot: GpuSnapshot, *, periodic: bool = False) -> Blocker | None:
    """Why the all-reduce must not run on these GPUs now, or None when it may.

    Never on GPUs that compute processes use (a running job's GPUs are not ours to take), nor
    without NVML (GPU use unknown), nor on a GPU in compute mode PROHIBITED (no CUDA context).
    ``periodic`` (the daemon's test between jobs): also not on a GPU in an exclusive compute mode,
    since a job starting during the test could not get its GPU ("all CUDA-capable devices are busy
    or unavailable").
    """
    if not snapshot.available:
        return Blocker("NvmlUnavailable", f"NVML is not available "
                       f"({snapshot.error or 'no driver'}), so GPU use is unknown")
    prohibited = [str(g.index) for g in snapshot.gpus if g.compute_mode == "PROHIBITED"]
    if prohibited:
        return Blocker("ComputeProhibited", f"GPU {', '.join(prohibited)} in compute mode "
                       "PROHIBITED (gpu_visible says so)")
    busy = [f"GPU {g.index} (pid {', '.join(map(str, g.compute_pids))})" for g in snapshot.gpus
            if g.compute_pids]
    if busy:
        return Blocker("GpusBusy", "compute processes use the GPUs: " + "; ".join(busy))
    exclusive = [str(g.index) for g in snapshot.gpus if g.compute_mode in _EXCLUSIVE]
    if periodic and exclusive:
        return Blocker("GpusExclusive", f"GPU {', '.join(exclusive)} in an exclusive compute mode: "
                       "a job starting during the test could not get its GPU (run `preflight "
                       "bench` between jobs instead)")
    return None
