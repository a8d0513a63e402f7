"""``memlock``: on a node with RDMA ports, the locked-memory limit lets NCCL register its buffers.

What: when ``<root>/sys/class/infiniband`` lists at least one port and NCCL_IB_DISABLE is not on,
the soft RLIMIT_MEMLOCK (``ulimit -l``) of this process, which the job inherits from the same
place, must be unlimited.

Why: NCCL's InfiniBand / RoCE transport pins its buffers with ``ibv_reg_mr``; under a small
locked-memory limit (64 KiB or 8 MiB are common defaults, and Docker's own) that call fails and the
job dies at its first inter-node collective with "NCCL WARN Call to ibv_reg_mr failed" or "Failed
to register memory", or NCCL falls back to slow TCP sockets. NCCL's troubleshooting guide asks for
an unlimited limit (NCCL docs, "Troubleshooting", InfiniBand: "ulimit -l unlimited"); Docker needs
``--ulimit memlock=-1``, Slurm ``PropagateResourceLimits`` or a raised limit on slurmd.

Verdicts: PASS (unlimited), WARN ``MemlockLimited`` (the figure and the remedy; scope node: the
limit comes from the node's or the container runtime's configuration), SKIP ``NoRdma`` (no RDMA
port, or NCCL_IB_DISABLE on: NCCL registers no memory then). Knobs: none.
"""

from __future__ import annotations

from preflight.core.context import Context
from preflight.core.result import Finding, Result, Status, fold
from preflight.core.units import fmt_bytes
from preflight.jobenv.netvars import nccl_flag
from preflight.probes.limits import MemlockLimit, read_memlock

NAME = "memlock"

REMEDY = ("Raise the locked-memory limit for jobs to unlimited: `* - memlock unlimited` in "
          "/etc/security/limits.conf (and LimitMEMLOCK=infinity for slurmd); Docker: "
          "--ulimit memlock=-1; check with `ulimit -l` in the job's shell.")


def judge(limit: MemlockLimit) -> list[Finding]:
    """The finding for a limit on a node that uses RDMA (pure)."""
    if limit.soft_bytes is None:
        return []
    hard = "unlimited" if limit.hard_bytes is None else fmt_bytes(limit.hard_bytes)
    return [Finding(Status.WARN, "MemlockLimited",
                    f"locked-memory limit (ulimit -l) is {fmt_bytes(limit.soft_bytes)} (hard "
                    f"{hard}), expected unlimited on a node with RDMA ports: NCCL's ibv_reg_mr "
                    "can fail ('Call to ibv_reg_mr failed') at the first inter-node collective",
                    REMEDY)]


def run(ctx: Context) -> Result:
    ib = ctx.ib()
    if not ib.ports:
        return Result(NAME, Status.SKIP, "NoRdma",
                      f"no RDMA port in {ib.path}: NCCL registers no memory with the NIC")
    if nccl_flag(ctx.env.get("NCCL_IB_DISABLE")):
        return Result(NAME, Status.SKIP, "NoRdma",
                      "NCCL_IB_DISABLE is on: NCCL uses no RDMA, so registers no memory")
    limit = ctx.cached("limits.memlock", read_memlock)
    details = {"soft_bytes": limit.soft_bytes, "hard_bytes": limit.hard_bytes,
               "rdma_ports": len(ib.ports)}
    return fold(NAME, judge(limit), ok_reason="MemlockUnlimited",
                summary=f"locked-memory limit unlimited ({len(ib.ports)} RDMA port(s))",
                details=details)
