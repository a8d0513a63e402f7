"""``preflight epilog``: after a job, clean what it may leave and drain for what would poison the
next job (Slurm ``Epilog=``, run as root on every node of the job when it ends).

- ``/dev/shm``: the job user's regular files that no process has open or mapped are removed and
  listed (NCCL's ``nccl-*``, torch's and multiprocessing's segments of killed ranks: memory that
  is gone until reboot otherwise). Nothing is removed while that user still runs a process on
  the node (another job of theirs may own the files), nor for root or without ``SLURM_JOB_UID``.
- GPUs: a compute process still on the job's GPUs (``SLURM_JOB_GPUS``, else any GPU with a
  process of this job) once a short grace for its exit has passed, or GPU memory in use on a
  GPU without a compute process (above ``epilog_idle_memory_max_bytes``), drains the node
  (scope node): the next job on those GPUs would run out of memory or fail to get its GPU.
- ``--bandwidth``: the tests that load the GPUs (all-reduce, gpu_speed) run on the now idle
  node when nothing is left on them.

Drains go through the same fleet guard, ``--report-only``, budget and ``--prom-file`` as the
prolog (:mod:`preflight.commands.slurmhook`).
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from preflight.cli import Formatter, add_config_options
from preflight.commands.hookopts import add_hook_options
from preflight.core.textsafe import escape

# What the epilog runs is imported when it runs: building the parser (every command's, and
# --help) loads none of it.
if TYPE_CHECKING:
    from preflight.commands.slurmhook import HookRun, Leftovers
    from preflight.core.context import Context
    from preflight.core.result import Result
    from preflight.probes.gpu import GpuSnapshot

#: How long the epilog waits for a job's processes to exit and release GPU memory (a killed
#: rank's CUDA context can take a few seconds to tear down), at most.
RELEASE_GRACE_S = 3.0
_POLL_S = 0.25
#: Files named in a message (the rest are counted).
MAX_LISTED = 10

DESCRIPTION = """\
Run after a job (Slurm Epilog=, as root on each of the job's nodes):

  /dev/shm   the job user's files that no process holds are removed and listed
  GPUs       a compute process still on the job's GPUs, or GPU memory not released, drains
             the node (gpu_processes GpuProcessLeft, gpu_memory GpuMemoryNotReleased)
  --bandwidth  the all-reduce and gpu_speed run on the now idle GPUs

Drains go through the fleet guard and honour --report-only, like the prolog; the run ends
within prolog_budget_s. Reads SLURM_JOB_ID, SLURM_JOB_UID and SLURM_JOB_GPUS as slurmd sets
them. Details: docs/slurm.md."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "epilog", formatter_class=Formatter,
        help="after a job: remove its unheld /dev/shm files, drain for processes or GPU memory "
             "it left",
        description=DESCRIPTION, epilog="exit codes: 0 clean (or --report-only, undecided, a "
        "drain held back by the fleet guard), 1 this node is drained")
    p.add_argument("--bandwidth", action="store_true",
                   help="also run the all-reduce and gpu_speed on the idle GPUs (seconds; raise "
                        "prolog_budget_s and PrologEpilogTimeout with it)")
    add_hook_options(p)
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from preflight.commands.slurmhook import HookRun

    return HookRun("epilog", args).execute(_judge)


def _judge(hook: HookRun) -> int:
    from preflight.bench.gate import blocker
    from preflight.checks import CHECKS, GPU_LOAD_CHECKS
    from preflight.core.config import ConfigError
    from preflight.core.result import Report, Result, Status
    from preflight.core.runner import SelectionError, run_checks, select

    try:
        ctx = hook.context({})
        extra = select(CHECKS, only=GPU_LOAD_CHECKS) if hook.args.bandwidth else ()
    except (ConfigError, SelectionError) as exc:
        return hook.config_error(exc)
    env = hook.env
    job_id = env.get("SLURM_JOB_ID") or None
    hook.phase = "waiting for the job's GPU processes and memory to go"
    left, snap_error = _wait_released(ctx, hook, job_id=job_id)
    results = [_processes_result(left, snap_error), _memory_result(left, ctx, snap_error)]
    hook.phase = "cleaning /dev/shm"
    shm = clean_shm(ctx.host_path("/dev/shm"), _uid(env.get("SLURM_JOB_UID")),
                    proc=ctx.host_path("/proc"), stop_at=hook.budget.end - 1.0,
                    dry_run=bool(hook.args.report_only))
    results.append(shm.result())
    if shm.removed or shm.held or shm.errors:
        hook.say(shm.result().message)
    hook.outcome.counts["shm_files_removed"] = float(len(shm.removed))
    hook.outcome.counts["gpu_leftover_processes"] = float(len(left.processes))
    if extra and not left and snap_error is None:
        stop = blocker(_fresh_snapshot(ctx))
        if stop is None:
            hook.phase = "running the GPU tests (--bandwidth)"
            results.extend(run_checks(ctx, extra, mode="epilog").results)
        else:
            results.append(Result("allreduce", Status.SKIP, stop.reason,
                                  f"GPU tests not run after the job: {stop.why}"))
    report = Report(results=tuple(results), mode="epilog")
    # A clean epilog says nothing about the node's health: it never counts as a passing run.
    return hook.act(report, ctx, count_pass=False)


def _fresh_snapshot(ctx: Context) -> GpuSnapshot:
    """A new GPU snapshot, not the run's cached one: the epilog watches memory being released.
    The Context's probe is the node's, within its deadlines."""
    from preflight.probes.gpu import GpuSnapshot

    if ctx.gpu_probe is None:
        return GpuSnapshot(available=False, error="no GPU probe")
    return ctx.gpu_probe.snapshot()


def _uid(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and len(text) <= 10 else None


def _wait_released(ctx: Context, hook: HookRun, *,
                   job_id: str | None) -> tuple[Leftovers, str | None]:
    """Leftovers once they are gone or the grace has passed (within the budget); the second
    item is why NVML could not tell (then there are no leftovers to report)."""
    from preflight.commands.slurmhook import Leftovers, gpu_leftovers, job_gpus

    gpus = job_gpus(hook.env)
    proc = ctx.host_path("/proc")
    limit = ctx.config.epilog_idle_memory_max_bytes
    until = min(time.monotonic() + RELEASE_GRACE_S, hook.budget.end - 2.0)
    while True:
        snap = _fresh_snapshot(ctx)
        if not snap.available:
            return Leftovers(), snap.error or "NVML not available"
        left = gpu_leftovers(snap, gpus=gpus, job_id=job_id, memory_max_bytes=limit, proc=proc)
        if not left or time.monotonic() + _POLL_S > until:
            return left, None
        time.sleep(_POLL_S)


def _processes_result(left: Leftovers, error: str | None) -> Result:
    from preflight.commands.slurmhook import Leftovers, describe_leftovers
    from preflight.core.result import Result, Status

    if error is not None:
        return Result("gpu_processes", Status.SKIP, "NvmlUnavailable",
                      f"cannot see the GPUs' processes: {error}")
    others = "; ".join(f"GPU {i}: {p.describe()}" for i, p in left.others[:MAX_LISTED])
    note = f" Processes of other jobs (not this job's, left alone): {others}." if others else ""
    if left.processes:
        return Result(
            "gpu_processes", Status.FAIL, "GpuProcessLeft",
            f"{len(left.processes)} compute process(es) still on the job's GPUs after the job "
            f"ended: {describe_leftovers(Leftovers(processes=left.processes))}; the next job "
            f"on these GPUs would not get their memory.{note}",
            "Kill them (kill -9 PID; a process in state D needs the GPU reset or a reboot), "
            "check `nvidia-smi` shows none, then resume the node.",
            details={"pids": [p.pid for _, p in left.processes]})
    return Result("gpu_processes", Status.PASS, "NoGpuProcessLeft",
                  f"no compute process of the job left on its GPUs.{note}".replace("..", "."))


def _memory_result(left: Leftovers, ctx: Context, error: str | None) -> Result:
    from preflight.commands.slurmhook import Leftovers, describe_leftovers
    from preflight.core.result import Result, Status

    if error is not None:
        return Result("gpu_memory", Status.SKIP, "NvmlUnavailable",
                      f"cannot see the GPUs' memory: {error}")
    limit = ctx.config.epilog_idle_memory_max_bytes
    if left.memory:
        return Result(
            "gpu_memory", Status.FAIL, "GpuMemoryNotReleased",
            f"{describe_leftovers(Leftovers(memory=left.memory))} (more than "
            f"epilog_idle_memory_max_bytes {limit / (1 << 20):.0f} MiB) after the job: the "
            "memory of a process that is gone was not released.",
            "Reset the GPU when idle (nvidia-smi -r -i <gpu>) or reboot, then resume the node.",
            details={"gpus": [i for i, _ in left.memory]})
    return Result("gpu_memory", Status.PASS, "GpuMemoryReleased",
                  "the job's GPUs hold no memory without a process")


@dataclass
class ShmCleanup:
    """What the /dev/shm clean-up did."""

    path: str
    uid: int | None
    removed: list[str] = field(default_factory=list)
    held: int = 0
    skipped: str = ""
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def result(self) -> Result:
        from preflight.core.result import Result, Status

        details = {"path": self.path, "removed": self.removed[:100], "held": self.held}
        if self.skipped:
            return Result("shm_files", Status.SKIP, "ShmNotCleaned", self.skipped,
                          details=details)
        if self.removed:
            shown = ", ".join(escape(n, 80) for n in self.removed[:MAX_LISTED])
            more = f" and {len(self.removed) - MAX_LISTED} more" if \
                len(self.removed) > MAX_LISTED else ""
            verb = "report-only: would remove" if self.dry_run else "removed"
            message = (f"{verb} {len(self.removed)} file(s) of uid {self.uid} that no process "
                       f"held from {self.path}: {shown}{more}")
        else:
            message = f"no unheld file of uid {self.uid} in {self.path}"
        if self.held:
            message += f"; kept {self.held} that a process holds"
        if self.errors:
            message += f"; could not remove {len(self.errors)}: {escape(self.errors[0], 200)}"
        return Result("shm_files", Status.PASS, "ShmCleaned", message, details=details)


def clean_shm(shm: Path, uid: int | None, *, proc: Path, stop_at: float,
              dry_run: bool = False) -> ShmCleanup:
    """Remove the regular files of ``uid`` directly in ``shm`` that no process holds.

    Holders are found in ``proc`` by the files' device and inode (open descriptors and mappings,
    :func:`preflight.probes.holders.find_holders`; the same in any mount namespace, so a
    ``--root`` view of the host's ``/dev/shm`` needs no translation). Nothing is removed for
    root, for an unknown uid, while the user still has a process on the node, or when some
    process could not be inspected or the scan did not end by ``stop_at`` (monotonic), which
    also ends the clean-up. ``dry_run``: list what would go, remove nothing
    (``--report-only``)."""
    from preflight.probes.holders import FileId, Wanted, find_holders
    from preflight.probes.procs import processes_of

    out = ShmCleanup(str(shm), uid, dry_run=dry_run)
    if uid is None:
        out.skipped = "no SLURM_JOB_UID: the job's user is unknown, nothing removed"
        return out
    if uid == 0:
        out.skipped = "the job ran as root: root's files in /dev/shm are left alone"
        return out
    still = processes_of(uid, proc)
    if still:
        out.skipped = (f"uid {uid} still runs {len(still)} process(es) on this node (another job "
                       f"of theirs, or this job's leftovers: pid {', '.join(map(str, still[:5]))})"
                       ": nothing removed")
        return out
    try:
        entries = sorted(os.scandir(shm), key=lambda e: e.name)
    except OSError as exc:
        out.skipped = f"cannot list {shm}: {exc.strerror or exc}"
        return out
    candidates: list[tuple[os.DirEntry[str], FileId]] = []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
            candidates.append((entry, FileId.of(st)))
    if not candidates:
        return out
    scan = find_holders(proc, Wanted(files=frozenset(f for _, f in candidates)),
                        deadline_s=max(0.0, stop_at - time.monotonic()))
    if not scan.seen_all:
        if scan.error:
            why = scan.error
        elif scan.unreadable:
            why = f"{scan.unreadable} of {scan.processes} processes could not be inspected"
        else:
            why = "the time budget ran out before every process was looked at"
        out.skipped = (f"cannot tell which of uid {uid}'s {len(candidates)} file(s) a process "
                       f"holds ({why}): nothing removed")
        return out
    held = scan.held()
    for entry, file in candidates:
        if time.monotonic() > stop_at:
            out.errors.append("stopped: the time budget is spent")
            break
        if file in held:
            out.held += 1
            continue
        try:
            if FileId.of(os.lstat(entry.path)) != file:
                continue  # a new file of that name since the scan: not what was looked at
            if not dry_run:
                os.unlink(entry.path)
        except OSError as exc:
            out.errors.append(f"{entry.name}: {exc.strerror or exc}")
            continue
        out.removed.append(entry.name)
    return out
