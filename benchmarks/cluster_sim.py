"""The real rendezvous and localisation of `preflight cluster` at 64, 256 and 1,024 nodes.

Node 0's real Agent hosts a real TCPStore on 127.0.0.1 in this process; every other node is a
real Agent with its own store client on a thread of one of ``--procs`` processes (a lightweight
client: no workers, one torch import per process). The node checks answer at once and every
all-reduce reports a synthetic figure (tests/cluster/sim.py): healthy nodes at 10 GB/s with
+-3 % noise, the d bad nodes each slow (0.5-0.85x, uniform) or, one in three, failing; d = 1,
5, 1 % and 10 % of N. Reported: the rounds after the world all-reduce, node 0's time to its
verdict (the protocol's own cost: a real run adds the rounds' all-reduces), node 0's store
requests and bytes, those of all agents together (the server's load), and how many bad nodes
were named and healthy ones wrongly. ``--pure`` runs the localisation alone (no store) on many
random fabrics per N, one bad node each, and counts the bad nodes missed per band of slowness
and the healthy ones named. Usage:
    python benchmarks/cluster_sim.py [--nodes 64,256,1024] [--seeds 1] [--procs 8]
    python benchmarks/cluster_sim.py --pure [--nodes 3,4,5,8,16,64] [--seeds 300]
Where the DNS server drops queries, run it in a network namespace of its own (torch's store
looks up every connecting client's name on its one thread):
    unshare -n sh -c 'ip link set lo up; python benchmarks/cluster_sim.py'
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

from machine import describe  # benchmarks/machine.py (sys.path[0] is this folder)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from preflight.cluster.localise import Localiser, Outcome  # noqa: E402
from tests.cluster.sim import Fabric  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _followers(*, ranks: list[int], n: int, port: int, fabric: Fabric, timeout_s: float,
               ready: Any, go: Any, results: Any) -> None:
    """One process of followers: connect, say ready, run them on threads when told, report."""
    import threading

    from preflight.cluster.agent import Agent
    from tests.cluster.sim import SETTINGS, SyntheticRunner, open_rank, options

    stores = {r: open_rank(r, n, port, timeout_s) for r in ranks}
    ready.put(len(ranks))
    go.wait()
    out: dict[int, Any] = {}

    def follow(rank: int) -> None:
        try:
            v = Agent(options(rank, n, port, timeout_s), SETTINGS, stores[rank],
                      SyntheticRunner(rank, fabric, nnodes=n, timeout_s=timeout_s),
                      host=f"node{rank}").run()
            out[rank] = (v["slow_nodes"], v["failed_nodes"], None)
        except BaseException as exc:  # reported to the parent
            out[rank] = (None, None, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=follow, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 6)
    results.put({r: (*out.get(r, (None, None, "no verdict")), stores[r].traffic.ops,
                     stores[r].traffic.bytes) for r in ranks})


def run_split(n: int, fabric: Fabric, *, port: int, timeout_s: float, procs: int
              ) -> tuple[dict[str, Any], dict[int, Any], Any]:
    """Node 0 here, the followers in ``procs`` processes (one GIL for 1,023 agents' threads
    would starve node 0: the rendezvous is timed, not Python's thread switching)."""
    import multiprocessing as mp

    from preflight.cluster.agent import Agent
    from tests.cluster.sim import SETTINGS, SyntheticRunner, open_rank, options

    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    server = open_rank(0, n, port, timeout_s)
    ranks = list(range(1, n))
    parts = [ranks[i::procs] for i in range(procs)]
    children = [ctx.Process(target=_followers, daemon=True, kwargs={
        "ranks": part, "n": n, "port": port, "fabric": fabric, "timeout_s": timeout_s,
        "ready": ready, "go": go, "results": results}) for part in parts]
    for c in children:
        c.start()
    for _ in children:
        ready.get(timeout=900)
    go.set()
    v = Agent(options(0, n, port, timeout_s), SETTINGS, server,
              SyntheticRunner(0, fabric, nnodes=n, timeout_s=timeout_s), host="node0").run()
    got: dict[int, Any] = {}
    for _ in children:
        got.update(results.get(timeout=timeout_s * 8))
    for c in children:
        c.join(30)
    return v, got, server


def one(n: int, d: int, seed: int, procs: int) -> dict[str, object]:
    rng = random.Random(seed * 7919 + n * 31 + d)
    bad = rng.sample(range(1, n), d)  # node 0 hosts the store; it is healthy here
    fabric = Fabric(seed=seed)
    for b in bad:
        if rng.random() < 1 / 3:
            fabric.failing.add(b)
        else:
            fabric.speed[b] = rng.uniform(0.5, 0.85)
    v, got, server = run_split(n, fabric, port=free_port(), timeout_s=120.0, procs=procs)
    errors = {r: g[2] for r, g in got.items() if g[2]}
    if errors:
        first = next(iter(errors.items()))
        raise SystemExit(f"n={n} d={d}: {len(errors)} agent(s) failed, first: {first}")
    named = set(v["slow_nodes"]) | set(v["failed_nodes"])
    rounds = [r["round"] for r in v["localisation"]["rounds"]]
    everyone = server.traffic.ops + sum(g[3] for g in got.values())
    total_bytes = server.traffic.bytes + sum(g[4] for g in got.values())
    return {"n": n, "d": d, "rounds": len(rounds), "verdict_s": v["elapsed_s"],
            "ops0": v["store"]["ops"], "bytes0": v["store"]["bytes"], "ops_all": everyone,
            "bytes_all": total_bytes, "found": len(named & set(bad)),
            "wrong": len(named - set(bad)), "same": all(
                g[0] == v["slow_nodes"] and g[1] == v["failed_nodes"] for g in got.values())}


def pure(n: int, seed: int, slow: tuple[float, float]) -> tuple[int, int]:
    """One bad node (a third of the time failing) on a +-3 % fabric: (missed, healthy named)."""
    rng = random.Random(seed)
    bad = rng.randrange(n)
    failing = rng.random() < 1 / 3
    speed = rng.uniform(*slow)
    loc = Localiser(list(range(n)))
    groups, tag = loc.first_groups(), "pairs"
    while groups:
        out = {}
        for g in groups:
            fig = None if failing and bad in g else 10 * (speed if bad in g else 1.0) * (
                1 + rng.uniform(-0.03, 0.03))
            out[g] = Outcome(fig, why="failed" if fig is None else "")
        loc.observe(tag, out)
        groups, tag = loc.next_groups(), "confirm"
    c = loc.judge()
    named = set(c.slow) | set(c.failed)
    return int(bad not in named), len(named - {bad})


def main_pure(nodes: list[int], seeds: int) -> int:
    print(f"# localisation alone, {seeds} random fabrics per cell, one bad node each "
          "(a third failing), +-3 % noise")
    print("| nodes | bad node at 0.3-0.75x: missed | at 0.75-0.8x | at 0.8-0.85x | "
          "healthy named |")
    print("|---|---|---|---|---|")
    for n in nodes:
        cells, wrong = [], 0
        for band in ((0.3, 0.75), (0.75, 0.8), (0.8, 0.85)):
            missed = 0
            for seed in range(seeds):
                m, w = pure(n, seed * 3 + int(band[0] * 100), band)
                missed += m
                wrong += w
            cells.append(f"{missed}/{seeds}")
        print(f"| {n} | {' | '.join(cells)} | {wrong} |", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--pure", action="store_true")
    p.add_argument("--procs", type=int, default=8,
                   help="processes the other nodes' agents are spread over")
    args = p.parse_args()
    if args.pure:
        return main_pure([int(x) for x in (args.nodes or "3,4,5,8,16,64,256,1024").split(",")],
                         args.seeds or 300)
    args.nodes = args.nodes or "64,256,1024"
    args.seeds = args.seeds or 1
    print(f"# {describe()}, load average {os.getloadavg()[0]:.1f} at start, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| nodes | bad (d) | rounds after world | node 0 verdict s | node 0 requests | "
          "node 0 KiB | all agents' requests | all agents' KiB | bad named | healthy named | "
          "same verdict on every node |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.nodes.split(",")):
        for d in sorted({1, 5, max(1, n // 100), n // 10}):
            for seed in range(args.seeds):
                r = one(n, d, seed, args.procs)
                print(f"| {r['n']} | {r['d']} | {r['rounds']} | {r['verdict_s']:.1f} | "
                      f"{r['ops0']} | {int(r['bytes0']) / 1024:.0f} | {r['ops_all']} | "
                      f"{int(r['bytes_all']) / 1024:.0f} | {r['found']}/{r['d']} | {r['wrong']} | "
                      f"{'yes' if r['same'] else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
