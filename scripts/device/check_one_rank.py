"""Device-only (issue 14, one GPU): `preflight check --json` exactly as the CLI runs it, except
that the allreduce check's plan allows ONE rank (the lent machine has one GPU; plan() refuses
fewer than two). Time it from the shell: it is the whole check with a 1-rank all-reduce, an
estimate of the 2-GPU time to verdict minus the second rank's share of NCCL's init and sweep.
The verdict itself is meaningless (one rank moves nothing: busbw 0)."""

from __future__ import annotations

import sys

from preflight import bench
from preflight.bench.parent import BenchOptions
from preflight.cli import main


def _plan_one(ctx, **kw):  # type: ignore[no-untyped-def]
    gpus, _, _ = bench.visible_gpus(ctx)
    cfg = ctx.config
    opts = BenchOptions(backend="nccl", nproc=1, sizes=(cfg.bench_max_bytes,),
                        python=sys.executable, timeout_s=cfg.bench_timeout_s, iters=20, warmup=5,
                        labels=(f"GPU 0, {gpus[0].pci_bus_id}",), env=ctx.env, engine="auto")
    return bench.Plan(opts, gpus[:1], ())


bench.plan = _plan_one
sys.exit(main(sys.argv[1:]))
