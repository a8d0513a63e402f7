"""Device-only: where `ctx.gpus()` (the NVML snapshot every check shares, and the all-reduce's
gate waits for) spends its time, and the 2-rank wrong-sum case through the real parent."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

from preflight.core.config import load
from preflight.probes.node import make_context

if sys.argv[1:] == ["nvml"]:
    ctx = make_context(load(path=None, env=os.environ, overrides={}))
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    snap = ctx.gpus()
    prof.disable()
    print(f"snapshot {time.perf_counter() - t0:.3f} s, {len(snap.gpus)} GPUs")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(18)
    print(out.getvalue()[-4000:])
else:
    from preflight.bench import plan, run_bench

    # The test-only variable goes to the workers only: the CLI's configuration rejects it.
    ctx = make_context(load(path=None, env=os.environ, overrides={}))
    p = plan(ctx, backend="nccl", min_bytes=1 << 30, max_bytes=1 << 30)
    assert p.options is not None
    import dataclasses

    env = {**os.environ, "PREFLIGHT_BENCH_TEST_CORRUPT_RANK": "1"}
    p = dataclasses.replace(p, options=dataclasses.replace(p.options, env=env))
    res = run_bench(ctx, p)
    print(res.status.word, res.reason, res.message[:400])
