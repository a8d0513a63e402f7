"""Time to verdict and store traffic of `preflight cluster` vs the number of (simulated) nodes.

N agents on this machine, all on 127.0.0.1 (one process per "node", gloo on CPU, one rank per
node, 1 MiB all-reduce), started at once; the figures are node 0's: wall time from the first
start to the last exit, node 0's own verdict time, the store operations and bytes node 0 made,
and the world all-reduce's busbw. Usage:
    python benchmarks/cluster_scale.py [--nodes 8,16,32] [--no-bandwidth]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import describe, pythonpath  # benchmarks/machine.py (sys.path[0] is this folder)

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(n: int, extra: list[str]) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO), "PREFLIGHT_EXPECT_GPUS": "0"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "preflight", "cluster", "--nnodes", str(n),
                               "--node-rank", str(r), "--master-addr", "127.0.0.1",
                               "--master-port", str(port), "--timeout", "120", "--json",
                               "--size", "1M", *extra],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for r in range(n)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    wall = time.perf_counter() - t0
    v = json.loads(outs[0])
    codes = sorted({p.returncode for p in procs})
    ar = v.get("allreduce") or {}
    return {"n": n, "wall_s": wall, "verdict_s": v["elapsed_s"], "ops": v["store"]["ops"],
            "peer_ops": v["store"].get("other_nodes_ops", 0),
            "bytes": v["store"]["bytes"], "status": v["status"], "codes": codes,
            "busbw": ar.get("busbw_gbps")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", default="8,16,32")
    p.add_argument("--no-bandwidth", action="store_true")
    args = p.parse_args()
    extra = ["--no-bandwidth"] if args.no_bandwidth else []
    print(f"# {describe()}, load average {os.getloadavg()[0]:.1f} at start, "
          f"{time.strftime('%Y-%m-%d')}{' (no bandwidth)' if extra else ''}")
    print("| nodes | wall s (all exited) | node 0 verdict s | store ops (node 0) | "
          "store KiB (node 0) | store ops (other nodes) | world busbw GB/s | status | exit codes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.nodes.split(",")):
        r = one(n, extra)
        bw = "-" if r["busbw"] is None else r["busbw"]
        print(f"| {r['n']} | {r['wall_s']:.1f} | {r['verdict_s']:.1f} | {r['ops']} | "
              f"{r['bytes'] / 1024:.0f} | {r['peer_ops']} | {bw} | {r['status']} | "
              f"{r['codes']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
