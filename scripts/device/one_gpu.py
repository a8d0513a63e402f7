"""Device-only (one GPU): the all-reduce paths with ONE rank, which ``plan()`` refuses (one rank
moves nothing: busbw 0, the verdict is meaningless), everything else as the CLI does it.

    python3 scripts/device/one_gpu.py check [check args]   # `preflight check`: gpu_speed, then a
                                                           # 1-rank all-reduce in the same worker
    python3 scripts/device/one_gpu.py bench [bench args]   # `preflight bench` with one rank
    python3 scripts/device/one_gpu.py stall PHASE [ENGINE] # SIGSTOP the rank when it reports
                                                           # PHASE; seconds from stop to verdict
    python3 scripts/device/one_gpu.py corrupt [ENGINE]     # the test-only wrong sum on rank 0

The plan keeps the real interpreter decision (``--python``: the training environment's own
engine, or preflight's nccl4py driving its libnccl.so.2, with the note).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from preflight import bench
from preflight.bench import method
from preflight.bench.options import BenchOptions
from preflight.bench.worker import wire
from preflight.cli import main


def _plan_one(ctx: Any, *, backend: str | None = None, nproc: int | None = None,
              min_bytes: int | None = None, max_bytes: int | None = None,
              timeout_s: float | None = None, debug: bool = False, engine: str = "auto",
              largest_only: bool = False) -> bench.Plan:
    gpus, _, _ = bench.visible_gpus(ctx)
    cfg = ctx.config
    hi = max_bytes or cfg.bench_max_bytes
    lo = hi if largest_only else (min_bytes or cfg.bench_min_bytes)
    python, libnccl, engine, note = bench._interpreter(ctx, "nccl", engine)
    warmup, iters = wire.ITERATIONS["nccl"]
    opts = BenchOptions(backend="nccl", nproc=1, sizes=tuple(method.sweep(lo, hi)),
                        python=python, libnccl=libnccl, timeout_s=timeout_s or cfg.bench_timeout_s,
                        iters=iters, warmup=warmup, debug=debug, engine=engine, env=ctx.env,
                        labels=(f"GPU {gpus[0].index}, {gpus[0].pci_bus_id}",))
    return bench.Plan(opts, gpus[:1], (note,) if note else ())


def _context() -> Any:
    from preflight.core.config import Config
    from preflight.core.context import make_context

    # Defaults: the test-only variable below is no configuration key (the CLI refuses it).
    return make_context(Config())


def corrupt(engine: str) -> dict[str, Any]:
    """1 MiB..64 MiB with PREFLIGHT_BENCH_TEST_CORRUPT_RANK=0: the wrong element is named."""
    from preflight.bench.parent import run_workers
    from preflight.bench.verdict import judge

    os.environ[wire.CORRUPT_ENV] = "0"
    ctx = _context()
    p = _plan_one(ctx, min_bytes=1 << 20, max_bytes=64 << 20, engine=engine)
    assert p.options is not None
    result = judge(run_workers(p.options), gpus=p.gpus)
    return {"engine": result.engine, "status": result.status.word, "reason": result.reason,
            "message": result.message, "rows": [r.to_json() for r in result.rows]}


def stall(phase: str, engine: str) -> dict[str, Any]:
    """A 1-4 GiB sweep; the rank is stopped (SIGSTOP) when it reports ``phase``."""
    from preflight.bench.parent import run_workers
    from preflight.bench.verdict import judge

    ctx = _context()
    p = _plan_one(ctx, min_bytes=1 << 30, max_bytes=4 << 30, timeout_s=120, engine=engine)
    assert p.options is not None
    hit: dict[str, float] = {}
    victim: dict[str, int] = {}

    def progress(where: str) -> None:
        if where.startswith(phase) and "at" not in hit:
            from tests.bench.workers import rank

            proc = rank(None, 0)
            if proc is not None:
                os.kill(proc.pid, signal.SIGSTOP)
                hit["at"], victim["pid"] = time.monotonic(), proc.pid

    records: list[Any] = []
    t = threading.Thread(target=lambda: records.append(run_workers(p.options,
                                                                   on_progress=progress)))
    t.start()
    t.join(180)
    result = judge(records[0], gpus=p.gpus)
    return {"phase": phase, "engine": engine, "status": result.status.word,
            "reason": result.reason, "message": result.message,
            "seconds_stop_to_verdict": round(time.monotonic() - hit["at"], 3) if hit else None,
            "victim_alive": os.path.exists(f"/proc/{victim.get('pid', 0)}/stat")}


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())  # tests.bench.workers, for finding the rank's process
    bench.plan = _plan_one  # type: ignore[assignment]
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "stall":
        print(json.dumps(stall(rest[0], rest[1] if len(rest) > 1 else "auto")))
        sys.exit(0)
    if mode == "corrupt":
        print(json.dumps(corrupt(rest[0] if rest else "auto")))
        sys.exit(0)
    sys.exit(main([mode, *rest]))
