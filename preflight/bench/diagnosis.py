"""Why a run of the GPU workers did not complete, and who is to blame (pure functions).

The parent's loop fills each :class:`~preflight.bench.records.WorkerState` (its phase, last
heartbeat, exit status, the kernel's state letter) and asks, in this order:

- :func:`broken`: a worker died or raised: the first cause is named (killed workers before those
  that only saw a peer go).
- :func:`frozen`: a worker frozen, named without waiting for a deadline: one the kernel shows as
  stopped (state T or t: SIGSTOP, a debugger) for :data:`STOPPED_CONFIRM_S`; or, while measuring
  (where the heartbeat thread is never held off by a long import or driver call), one silent for
  :data:`FROZEN_SILENT_S` while another still beats. A slow but live worker keeps beating and is
  left to its deadline.
- :func:`late`: a phase past its deadline, or a step past its total. The workers behind the
  others are named; in the all-reduce and the DDP ladder's steps with a process group, when
  every rank is in the same phase, those without a heartbeat (frozen) are named, else the
  collective itself hangs. Still starting (the
  interpreter, the imports) is its own kind: nothing ran on the GPUs, so it is no hang.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence

from preflight.bench.options import Limits
from preflight.bench.records import Failure, WorkerState
from preflight.bench.worker import wire

#: A worker whose last heartbeat is older than this is frozen (it beats every 0.5 s).
HEARTBEAT_SILENT_S = 2.0
#: How long a worker must stay in the kernel's stopped state before it is named as frozen.
STOPPED_CONFIRM_S = 2.0
#: While measuring, a worker silent this long while another beats is frozen (no deadline waited).
FROZEN_SILENT_S = 3.0
#: While importing, a worker heard from and then silent this long is frozen; shorter silences
#: are an import holding the GIL (loading libtorch from a slow disk takes seconds in one call).
START_SILENT_S = 10.0
#: Phases in which the heartbeat thread always gets the GIL (no import, no long driver call).
MEASURING = ("warmup", "measure", "verify", *wire.SPEED_KINDS)


def who(st: WorkerState) -> str:
    """"rank 1 (GPU 1, 0000:00:07.0)" in the all-reduce, "the worker for GPU 1, ..." else."""
    if st.reduces and (st.step in wire.COLLECTIVE_STEPS or not st.measures):
        return f"rank {st.rank} ({st.label})"
    return f"the worker for {st.label}"


def names(workers: Sequence[WorkerState]) -> str:
    return ", ".join(who(st) for st in workers)


def others(workers: Sequence[WorkerState], skip: Sequence[WorkerState]) -> str:
    """"; rank 0 reached verify of 4 GiB" for the workers not in ``skip``."""
    by_where: dict[str, list[WorkerState]] = {}
    for st in workers:
        if st not in skip:
            by_where.setdefault(st.where(), []).append(st)
    parts = []
    for where, group in by_where.items():
        if all(who(st).startswith("rank") for st in group):
            ranks = ", ".join(str(st.rank) for st in group)
            parts.append(f"rank{'s' if len(group) > 1 else ''} {ranks} reached {where}")
        else:
            parts.append(f"{', '.join(st.label for st in group)} reached {where}")
    return "".join(f"; {p}" for p in parts)


def exit_text(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def failing(workers: Sequence[WorkerState]) -> bool:
    """Some worker reported an error or exited other than cleanly."""
    return any(st.error or st.exit_code not in (None, 0) for st in workers)


def broken(workers: Sequence[WorkerState]) -> Failure:
    """The first cause among workers that died or raised (see the module docstring)."""
    killed = [st for st in workers if (st.exit_code or 0) < 0]
    if killed:
        first = killed[0]
        rest = [st for st in workers if st.error and st not in killed]
        seen = f"; then {names(rest)} failed: {rest[0].error}" if rest else ""
        return Failure("died", f"{names(killed)} {exit_text(first.exit_code)} in "
                       f"{first.where()}{seen}", tuple(st.rank for st in killed))
    errs = [st for st in workers if st.error]
    if errs:
        first = errs[0]
        return Failure("error", f"{names(errs)} failed in {first.where()}: {first.error}",
                       tuple(st.rank for st in errs))
    dead = [st for st in workers if st.exit_code not in (None, 0)] or list(workers[:1])
    first = dead[0]
    return Failure("died", f"{names(dead)} {exit_text(first.exit_code)} in {first.where()} "
                   "without a report", tuple(st.rank for st in dead))


def frozen(workers: Sequence[WorkerState], now: float) -> Failure | None:
    """A frozen worker, named without waiting for a deadline (see the module docstring)."""
    stopped = []
    for st in workers:
        if st.exit_code is None and st.kernel_state in ("T", "t"):
            st.stopped_since = st.stopped_since or now
            if now - st.stopped_since >= STOPPED_CONFIRM_S:
                stopped.append(st)
        else:
            st.stopped_since = None
    if stopped:
        st0 = stopped[0]
        return Failure("stalled", f"{names(stopped)} stopped in {st0.where()} (process state T:"
                       f" stopped by a signal or a debugger; no heartbeat for "
                       f"{now - st0.last_beat:.0f} s){others(workers, stopped)}",
                       tuple(st.rank for st in stopped))
    measuring = [st for st in workers if st.phase in MEASURING]
    if len(measuring) < 2:
        return None
    silent = [st for st in measuring if now - st.last_beat > FROZEN_SILENT_S]
    beating = [st for st in workers if now - st.last_beat <= HEARTBEAT_SILENT_S]
    if silent and beating:
        st0 = silent[0]
        return Failure("stalled", f"{names(silent)} stopped in {st0.where()} (no heartbeat for "
                       f"{now - st0.last_beat:.0f} s: the process is frozen)"
                       f"{others(workers, silent)}", tuple(st.rank for st in silent))
    return None


def _beat(st: WorkerState, now: float) -> str:
    return (f" (no heartbeat for {now - st.last_beat:.0f} s: the process is frozen)"
            if now - st.last_beat > HEARTBEAT_SILENT_S else "")


def late(workers: Sequence[WorkerState], limits: Limits, now: float,
         started: Mapping[str, float]) -> Failure | None:
    """A Failure when a worker is in one phase past its deadline, or a step past its total
    (``started``: when each step began, the speed step at the run's start)."""
    active = [st for st in workers if not st.done]
    overdue = [st for st in active
               if (d := limits.for_phase(st.step, st.phase)) is not None and now - st.entered > d]
    total = _over_total(active, limits, now, started)
    if not active or (not overdue and total is None):
        return None
    lowest = min(st.order for st in active)
    behind = [st for st in active if st.order == lowest]
    st0 = behind[0]
    if not overdue:
        assert total is not None
        return Failure("timeout", f"{total}; {names(behind)} in {st0.where()} (still "
                       f"progressing){others(workers, behind)}", tuple(st.rank for st in behind))
    deadline = limits.for_phase(st0.step, st0.phase) or 0.0
    silent = [st for st in behind if now - st.last_beat > HEARTBEAT_SILENT_S]
    if st0.step == wire.START and st0.phase in ("spawn", "imports") and not any(
            st.heard and now - st.last_beat > START_SILENT_S for st in behind):
        # Still starting: the interpreter has not reported yet or is importing its packages.
        # Nothing ran on the GPUs, so this is no hang and no reason to look for Xid errors.
        quiet = [st for st in behind if not st.heard]
        what = ("the interpreter has not started the worker yet" if len(quiet) == len(behind)
                else "still importing torch / nccl4py / cuda-bindings")
        return Failure("slow_start", f"{names(behind)} still starting after "
                       f"{now - st0.entered:.0f} s ({what}; start-up deadline {deadline:g} s)"
                       f"{others(workers, behind)}", tuple(st.rank for st in behind))
    if st0.step not in wire.COLLECTIVE_STEPS:
        # The speed step, the CUDA context, the DDP ladder's single step: each worker on its
        # own, no peer to wait for.
        mine = [st for st in overdue if st.step not in wire.COLLECTIVE_STEPS] or behind
        st1 = mine[0]
        beat = _beat(st1, now) or (" (heartbeats still arrive: the GPU or driver does not "
                                   "finish the work)")
        return Failure("stalled", f"{names(mine)} stalled in {st1.where()} after "
                       f"{now - st1.entered:.1f} s (deadline {deadline:g} s){beat}"
                       f"{others(workers, mine)}", tuple(st.rank for st in mine))
    if len(behind) < len(workers):
        return Failure("stalled", f"{names(behind)} stalled in {st0.where()} after "
                       f"{now - st0.entered:.0f} s{_beat(st0, now)}{others(workers, behind)}",
                       tuple(st.rank for st in behind))
    waited = max(now - st.entered for st in behind)
    if silent:
        # Before its first collective the others wait at the rendezvous, after it inside it.
        at = "at the rendezvous" if st0.phase == "init" else "in the collective"
        whom = "the others" if len(silent) < len(workers) else "the run"
        return Failure("stalled", f"{names(silent)} stopped in {st0.where()} (no heartbeat for "
                       f"{now - max(st.last_beat for st in silent):.0f} s: the process is "
                       f"frozen); {whom} waited {waited:.0f} s {at}",
                       tuple(st.rank for st in silent))
    what = "the all-reduce" if st0.step == wire.ALLREDUCE else "the DDP step"
    return Failure("hung", f"all {len(workers)} ranks are alive but {what} in "
                   f"{st0.where()} did not complete within {waited:.0f} s: the collective "
                   "itself hangs", tuple(st.rank for st in behind))


def _over_total(active: Sequence[WorkerState], limits: Limits, now: float,
                started: Mapping[str, float]) -> str | None:
    """Which step passed its total deadline, in words; None when none did."""
    speed_at, ar_at = started.get(wire.SPEED), started.get(wire.ALLREDUCE)
    if (limits.speed_total_s is not None and speed_at is not None
            and any(st.step != wire.ALLREDUCE for st in active if st.measures)
            and now - speed_at > limits.speed_total_s):
        return (f"the GPU speed test did not finish within {limits.speed_total_s:g} s "
                "(gpu_speed_timeout_s)")
    if (limits.allreduce_total_s is not None and ar_at is not None
            and now - ar_at > limits.allreduce_total_s):
        return (f"the all-reduce did not finish within {limits.allreduce_total_s:g} s "
                "(bench_timeout_s)")
    if limits.ddp_total_s is not None:
        for step in {st.step for st in active if st.step in wire.DDP_STEPS}:
            at = started.get(step)
            if at is not None and now - at > limits.ddp_total_s:
                return (f"the DDP step {step} did not finish within {limits.ddp_total_s:g} s "
                        "(preflight ddp --timeout)")
    return None
