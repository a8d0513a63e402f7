"""Agents in one process: a real TCPStore on 127.0.0.1, the real Agent (rendezvous, steps,
localisation, verdict), and a :class:`SyntheticRunner` that answers the node checks and each
all-reduce with made-up figures instead of starting workers. Shared by the protocol tests and the
scale benchmark (benchmarks/cluster_sim.py)."""

from __future__ import annotations

import os
import random
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The 1 s wait slices time out by design; c10d would log a warning for each one.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

from preflight.cluster.agent import Agent, RunSettings
from preflight.cluster.options import ClusterOptions
from preflight.cluster.store import Rendezvous, connect

SETTINGS = RunSettings(backend="gloo", nproc=1, size_bytes=1 << 20, min_busbw_gbps=None,
                       bandwidth=True, bench_timeout_s=10.0, python="python3", engine="torch")


@dataclass
class Fabric:
    """Every node's speed factor (1.0 healthy), the failing nodes, and the noise of a figure."""

    base_gbps: float = 10.0
    speed: dict[int, float] = field(default_factory=dict)
    failing: set[int] = field(default_factory=set)
    noise: float = 0.03
    seed: int = 0

    def figure(self, key: str, group: Sequence[int]) -> float | None:
        """The same figure for every member of a group (as a real all-reduce gives)."""
        if any(n in self.failing for n in group):
            return None
        rng = random.Random(zlib.crc32(f"{self.seed}/{key}".encode()))
        slowest = min(self.speed.get(n, 1.0) for n in group)
        return self.base_gbps * slowest * (1 + rng.uniform(-self.noise, self.noise))


class SyntheticRunner:
    """A node that answers at once: checks pass, an all-reduce reports the fabric's figure."""

    def __init__(self, rank: int, fabric: Fabric, *, nnodes: int, timeout_s: float,
                 nproc: int = 1,
                 facts: Callable[[str], dict[str, Any]] | None = None,
                 checks: Callable[[], dict[str, Any]] | None = None,
                 ddp: Callable[[list[int]], dict[str, Any]] | None = None) -> None:
        self.rank, self.fabric, self.nproc = rank, fabric, nproc
        self.nnodes, self.timeout_s = nnodes, timeout_s
        self._facts, self._checks, self._ddp = facts, checks, ddp

    def facts(self, nonce: str) -> dict[str, Any]:
        if self._facts is not None:
            return self._facts(nonce)
        return arrival(self.rank, nonce, nnodes=self.nnodes, timeout_s=self.timeout_s,
                       nproc=self.nproc)

    def checks(self) -> dict[str, Any]:
        if self._checks is not None:
            return self._checks()
        return {"status": "pass", "results": [], "fingerprint": {"torch": "2.13.0"},
                "fingerprint_sha256": "ab" * 32}

    def allreduce(self, *, key: str, tag: str, group: list[int], nproc: Callable[[int], int],
                  engine: str) -> dict[str, Any]:
        fig = self.fabric.figure(key, group)
        if fig is None:
            return {"status": "error", "reason": "WorkerFailed", "busbw_gbps": None,
                    "message": f"rank 0 (node {self.rank} CPU 0) failed in init: boom",
                    "failure_kind": "error" if self.rank in self.fabric.failing else "hung",
                    "nccl_warnings": ["Duplicate GPU detected"] if self.rank in
                    self.fabric.failing else [], "world_size": len(group)}
        return {"status": "pass", "reason": "AllreduceOk", "busbw_gbps": round(fig, 5),
                "message": "ok", "failure_kind": None, "nccl_warnings": [],
                "world_size": len(group)}


    def ddp(self, *, key: str, nodes: list[int], nproc: Callable[[int], int]) -> dict[str, Any]:
        if self._ddp is not None:
            return self._ddp(nodes)
        return {"status": "error", "reason": "DdpUndecided", "message": "not simulated",
                "ranks": [], "failure": None, "device": None, "nccl_warnings": [],
                "seconds": None}


def arrival(rank: int, nonce: str, *, nnodes: int = 0, timeout_s: float = 0.0, nproc: int = 1,
            host: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"node_rank": rank, "nonce": nonce, "host": host or f"node{rank}",
                           "addr": f"10.0.{rank // 250}.{rank % 250 + 1}", "pid": 1000 + rank,
                           "nnodes": nnodes, "timeout_s": timeout_s, "nproc": nproc,
                           "backend": "gloo", "nccl4py": None, "interface": "eth0",
                           "link": {"transport": "socket", "gbps": 100.0,
                                    "basis": "eth0 100000 Mb/s", "virtual": False},
                           "facts": {"gpu_count": None, "gpu_model": None, "mtu": 1500,
                                     "env": {}}}
    out.update(extra)
    return out


def options(rank: int, n: int, port: int, timeout_s: float) -> ClusterOptions:
    return ClusterOptions(nnodes=n, node_rank=rank, master_addr="127.0.0.1", master_port=port,
                          timeout_s=timeout_s)


def open_rank(rank: int, n: int, port: int, timeout_s: float) -> Rendezvous:
    opts = options(rank, n, port, timeout_s)
    import time

    raw = connect(opts, hosting=rank == 0, until=time.monotonic() + timeout_s)
    return Rendezvous.wrap(raw, hosting=rank == 0, master=f"127.0.0.1:{port}",
                           op_timeout_s=timeout_s)


@dataclass
class Outcome:
    verdicts: dict[int, dict[str, Any]]
    errors: dict[int, BaseException]
    stores: dict[int, Rendezvous]


def run_cluster(n: int, fabric: Fabric, *, port: int, timeout_s: float = 20.0,
                settings: RunSettings = SETTINGS, ranks: Sequence[int] | None = None,
                runners: Mapping[int, Any] | None = None,
                before_followers: Callable[[Rendezvous], None] | None = None) -> Outcome:
    """Node 0 in this thread, the followers in threads, all through one real TCPStore.

    Every client connects first, one after the other: in one process TCPStore's constructor
    holds the GIL, so clients connecting from many threads at once queue behind each other
    (real agents are processes of their own); what is measured is the protocol from there."""
    # The server first: the followers' clients connect to it.
    stores = {0: open_rank(0, n, port, timeout_s)}
    followers = [r for r in (ranks if ranks is not None else range(n)) if r != 0]
    for r in followers:
        stores[r] = open_rank(r, n, port, timeout_s)
    verdicts: dict[int, dict[str, Any]] = {}
    errors: dict[int, BaseException] = {}

    def agent(rank: int) -> Agent:
        runner = (runners or {}).get(rank) or SyntheticRunner(rank, fabric, nnodes=n,
                                                              timeout_s=timeout_s)
        return Agent(options(rank, n, port, timeout_s), settings, stores[rank], runner,
                     host=f"node{rank}")

    def follow(rank: int) -> None:
        try:
            verdicts[rank] = agent(rank).run()
        except BaseException as exc:  # reported to the test
            errors[rank] = exc

    if before_followers is not None:
        before_followers(stores[0])
    threads = [threading.Thread(target=follow, args=(r,), daemon=True) for r in followers]
    for t in threads:
        t.start()
    try:
        verdicts[0] = agent(0).run()
    except BaseException as exc:
        errors[0] = exc
    for t in threads:
        t.join(timeout_s * 4)
    return Outcome(verdicts, errors, stores)
