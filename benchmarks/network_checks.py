"""Time the ``network`` and ``master_port`` checks: what they add to ``preflight check``.

Each sample builds a fresh Context (nothing cached: interfaces read, names resolved, the port bound
and released) and runs both checks through the runner, as ``preflight check`` does. Prints a table
of median / p95 / max in milliseconds per scenario, and the one-off import cost of the modules.

    python benchmarks/network_checks.py [--samples 50]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import describe  # benchmarks/machine.py (sys.path[0] is this folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from preflight.checks import master_port, network
from preflight.checks.base import Check
from preflight.core.config import Config
from preflight.core.runner import run_checks
from preflight.probes.node import make_context

CHECKS = (Check(network.NAME, network.run, ""), Check(master_port.NAME, master_port.run, ""))


def local_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def scenarios() -> dict[str, dict[str, str]]:
    me = local_address()
    return {
        "single node, nothing set": {},
        "multi-node worker (route lookup)": {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                                             "RANK": "8", "MASTER_ADDR": "192.0.2.1",
                                             "MASTER_PORT": "29500"},
        "multi-node rank 0 (route + bind)": {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                                             "RANK": "0", "MASTER_ADDR": me,
                                             "MASTER_PORT": "29511"},
        "MASTER_ADDR=localhost (resolve; FAIL)": {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                                           "RANK": "0", "MASTER_ADDR": "localhost",
                                           "MASTER_PORT": "29512"},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=50)
    args = ap.parse_args()
    print(f"# {describe()}, {args.samples} samples per row")
    print(f"{'scenario':<36} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}  verdicts")
    for name, env in scenarios().items():
        times = []
        verdicts = ""
        for _ in range(args.samples):
            ctx = make_context(Config(), env=env)
            t0 = time.perf_counter()
            report = run_checks(ctx, CHECKS)
            times.append((time.perf_counter() - t0) * 1e3)
            verdicts = " ".join(f"{r.check}={r.status.word}" for r in report.results)
        times.sort()
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        print(f"{name:<36} {statistics.median(times):>10.2f} {p95:>8.2f} {times[-1]:>8.2f}  "
              f"{verdicts}")
    # The probe module pulls in netifaces and psutil; the check modules themselves are small.
    code = ("import time; t=time.perf_counter(); import preflight.probes.net; "
            "print((time.perf_counter()-t)*1e3)")
    runs = sorted(float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, timeout=60, check=True,
                                       cwd=Path(__file__).resolve().parents[1]).stdout)
                  for _ in range(5))
    print(f"{'import (cold process, once per run)':<36} {statistics.median(runs):>10.2f} "
          f"{runs[-1]:>8.2f} {runs[-1]:>8.2f}  preflight.probes.net: netifaces, psutil")


if __name__ == "__main__":
    main()
