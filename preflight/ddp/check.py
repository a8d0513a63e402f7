"""``ddp``: the DDP ladder as a check, for ``preflight check --ddp`` and ``preflight prolog --ddp``.

What: the same run as ``preflight ddp`` (docs/ddp.md): the field guide's minimal DDP training,
one variable at a time (each rank alone on its GPU, gloo, NCCL), each step proving what it
claims; FAIL names the layer of the first step that failed (environment, communication, nccl)
with its evidence. Not in the default list: torch's import alone takes seconds, and the run
loads the GPUs (a few MB each).

Scope: a failure that a variable of the job's own bears on (GLOO_SOCKET_IFNAME for gloo, an
NCCL_* setting for NCCL, the device mapping for a single GPU) is the job's and never drains a
node; the others are the node's; undecided (the workers did not start in time) is an ERROR.

When: SKIP while a compute process uses the GPUs (never steal a running job's GPUs) or a GPU is
in compute mode PROHIBITED. It runs after the GPU tests, never beside them.

Knobs: ``ddp_timeout_s`` (60 s, each step), ``python`` (the training environment).
"""

from __future__ import annotations

from preflight.bench.gate import blocker
from preflight.bench.options import DDP_START_S
from preflight.checks import GPU_SERIAL
from preflight.core.check import Check
from preflight.core.context import Context, activity
from preflight.core.result import Result, Status

NAME = "ddp"
#: The runner's deadline sits behind the ladder's own, so the ladder names the stalled rank.
DEADLINE_MARGIN_S = 15.0
#: The most steps one node runs (single, gloo, nccl).
STEPS = 3


def timeout_s(ctx: Context) -> float:
    """This check's deadline: the workers' start-up and every step's own, plus time to judge."""
    return DDP_START_S + STEPS * ctx.config.ddp_timeout_s + DEADLINE_MARGIN_S


def run(ctx: Context) -> Result:
    from preflight.ddp.ladder import run_ladder

    snap = ctx.gpus()
    stop = blocker(snap) if snap.available else None
    if stop is not None and stop.reason in ("GpusBusy", "ComputeProhibited"):
        return Result(NAME, Status.SKIP, stop.reason, f"no DDP run: {stop.why}",
                      "Run preflight ddp when the GPUs are idle." if stop.reason == "GpusBusy"
                      else "")
    with activity("the DDP ladder (preflight ddp)"):
        return run_ladder(ctx).to_result(NAME)


CHECK = Check(NAME, run, "the field guide's minimal DDP run, one variable at a time (--ddp)",
              timeout_s=timeout_s, timeout_key="ddp_timeout_s", serial=GPU_SERIAL)
