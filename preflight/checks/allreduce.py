"""``allreduce``: a timed all-reduce over the node's GPUs is fast enough, exact, and never hangs.

What: the same test as ``preflight bench`` (nccl-tests' method, its doc/PERFORMANCE.md) with NCCL
over every visible GPU, judged at the largest size against ``min_busbw_gbps`` or the built-in
table per GPU model and count (FAIL below 0.9 x expected); the link efficiency against NVML's
link figures.

Why: a node with an NVLink down, P2P disabled or a GPU that stops answering passes every static
check and then trains at a fraction of the speed or hangs in the first all-reduce
(docs/bandwidth.md). Only a collective shows it; a stalled rank is named.

When: on by default with at least 2 visible GPUs; SKIP without NVML, with fewer GPUs, or when a
compute process uses a GPU (never steal a running job's GPUs). ``--no-bandwidth`` skips it. It
runs after gpu_speed, never beside it; with both selected, each GPU's worker measures its GPU
and then joins the all-reduce (one process and one CUDA context per GPU).

Knobs: ``min_busbw_gbps`` (None = table), ``bench_max_bytes`` (1 GiB: the one size this check
runs), ``bench_engine`` (auto), ``bench_timeout_s`` (120 s, also this check's deadline, plus a
margin).
"""

from __future__ import annotations

from preflight.core.context import Context, activity
from preflight.core.result import Result

NAME = "allreduce"
#: The runner's deadline sits behind the test's own, so the test names the stalled rank itself.
DEADLINE_MARGIN_S = 15.0


def timeout_s(ctx: Context) -> float:
    """This check's deadline: the bandwidth test's own, plus time to kill and judge."""
    return ctx.config.bench_timeout_s + DEADLINE_MARGIN_S


def prepare(ctx: Context) -> None:
    """Say that the all-reduce will run, so that gpu_speed, before it, starts workers that run
    both (one process and one CUDA context per GPU)."""
    from preflight.bench import expect_check

    with activity("planning the all-reduce (NVML, the workers' interpreter)"):
        expect_check(ctx)


def run(ctx: Context) -> Result:
    from preflight.bench import run_check

    with activity("the all-reduce workers (preflight bench)"):
        result = run_check(ctx)
    # The whole run (rows, devices, NCCL summary) goes to Report.bandwidth (lifted by the runner).
    return Result(NAME, result.status, result.reason, result.message, result.remedy,
                  details={**result.details(), "bandwidth": result.to_json()})
