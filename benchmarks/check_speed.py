"""Wall time of `preflight check --no-bandwidth` as a prolog runs it: a fresh process each time.

Prints a table (median, min, max of N runs) for the real node (NVML or none) and, when given,
a fixture node (PREFLIGHT_NVML_FIXTURE). Usage:
    python benchmarks/check_speed.py [--runs 7] [--fixture nvml.json] [-- extra check args]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import describe, pythonpath  # benchmarks/machine.py (sys.path[0] is this folder)

REPO = Path(__file__).resolve().parent.parent


def time_runs(args: list[str], env: dict[str, str], runs: int) -> tuple[list[float], int]:
    times = []
    rc = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "preflight", "check", "--no-bandwidth",
                               "--json", *args], env=env, capture_output=True, check=False,
                              timeout=120)
        times.append(time.perf_counter() - t0)
        rc = proc.returncode
    return times, rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--fixture", help="NVML fixture JSON for a second row")
    p.add_argument("extra", nargs="*", help="extra arguments to preflight check")
    a = p.parse_args()
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO)}
    env.pop("PREFLIGHT_NVML_FIXTURE", None)
    rows = [("this node", env)]
    if a.fixture:
        rows.append((f"fixture {Path(a.fixture).name}", {**env, "PREFLIGHT_NVML_FIXTURE":
                                                          a.fixture}))
    print(f"# preflight check --no-bandwidth wall time, {a.runs} runs each")
    print(f"# {describe()}")
    print(f"{'node':<28} {'median_s':>9} {'min_s':>7} {'max_s':>7} {'exit':>5}")
    for name, e in rows:
        times, rc = time_runs(a.extra, e, a.runs)
        print(f"{name:<28} {statistics.median(times):>9.3f} {min(times):>7.3f} "
              f"{max(times):>7.3f} {rc:>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
