"""The NCCL worker path on a one-GPU machine: one rank, the real sweep, timing and sum check.

`preflight bench` refuses one rank (nothing moves over the wire; busbw is 0 by definition), so this
calls the same orchestrator directly. What it proves on a single GPU: eager NCCL init on the device,
the CUDA timing loop, the exact sum check, and a clean exit (no process, no GPU memory left).
"""

from __future__ import annotations

import os

from preflight.bench import method
from preflight.bench.parent import BenchOptions, run_workers
from preflight.bench.verdict import rows_of

opts = BenchOptions(backend="nccl", nproc=1, sizes=tuple(method.sweep(1 << 20, 1 << 30)),
                    timeout_s=120, iters=20, warmup=5, labels=("GPU 0",), env=dict(os.environ))
record = run_workers(opts)
print(f"failure: {record.failure}")
print(f"rank 0 pid {record.ranks[0].pid} pci {record.ranks[0].pci_bus_id} "
      f"phase {record.ranks[0].phase} error {record.ranks[0].error}")
print(f"{'size_B':>12} {'time_us':>10} {'algbw_GBps':>11} {'correct':>8}")
for row in rows_of(record):
    print(f"{row.size_bytes:>12} {row.time_s * 1e6:>10.1f} {row.algbw_gbps:>11.2f} "
          f"{row.correct!s:>8}")
print(f"elapsed {record.elapsed_s:.2f} s")
