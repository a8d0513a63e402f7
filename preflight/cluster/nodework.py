"""What one node runs for its agent, for real: its arrival facts, the node checks and its share
of each all-reduce (the bench workers). The agent gets it as its :class:`~agent.Runner`."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

from preflight.checks import CHECKS, GPU_LOAD_CHECKS, master_port
from preflight.cluster.agent import RunSettings
from preflight.cluster.facts import node_facts
from preflight.cluster.groups import run_share
from preflight.cluster.options import ClusterOptions
from preflight.cluster.store import GroupRelay, Rendezvous
from preflight.core.context import Context
from preflight.core.runner import run_checks, select


def master_is_loopback(ctx: Context, host: str) -> bool:
    """Whether the master resolves to a loopback address: every agent is on this one host (a
    test set-up), so the network check judges a single-node job, not a broken multi-node one."""
    try:
        return any(ipaddress.ip_address(a).is_loopback for _, a in ctx.resolve_host(host))
    except (OSError, TimeoutError, ValueError):
        return False


def checks_context(ctx: Context, opts: ClusterOptions) -> Context:
    """The node checks' context: the master the agents met at is the job's MASTER_ADDR, so the
    network check judges the route to it instead of warning that MASTER_ADDR is unset."""
    one_host = master_is_loopback(ctx, opts.master_addr)
    env = dict(ctx.env)
    if not one_host:
        env.setdefault("MASTER_ADDR", opts.master_addr)
        env.setdefault("MASTER_PORT", str(opts.master_port))
    config = ctx.config.replace(multi_node=opts.nnodes > 1 and not one_host)
    return dataclasses.replace(ctx, env=env, config=config)


def run_node_checks(ctx: Context) -> dict[str, Any]:
    """The checks of ``preflight check --no-bandwidth``, as JSON (results + fingerprint).

    Without ``master_port`` too: the rendezvous has just proven that MASTER_ADDR resolves and its
    port answers, and on node 0 that port is the cluster's own store (it would read as in use)."""
    skip = [*GPU_LOAD_CHECKS, master_port.NAME]
    report = run_checks(ctx, select(CHECKS, skip=skip), mode="cluster")
    data = report.to_json()
    fp = data.get("fingerprint") or {}
    return {"status": data["status"], "results": data["results"], "fingerprint": fp,
            "fingerprint_sha256": fp.get("sha256")}


class BenchRunner:
    """The agent's :class:`~preflight.cluster.agent.Runner` on a real node."""

    def __init__(self, ctx: Context, opts: ClusterOptions, settings: RunSettings,
                 store: Callable[[], Rendezvous], *, host: str) -> None:
        self.ctx, self.opts, self.settings = ctx, opts, settings
        self._store = store
        self.host = host
        self.iface: str | None = None

    def facts(self, nonce: str) -> dict[str, Any]:
        s = self.settings
        info = node_facts(self.ctx, self.opts, backend=s.backend, nproc=s.nproc,
                          engine=s.engine, bandwidth=s.bandwidth, python=s.python, nonce=nonce,
                          host=self.host)
        self.iface = info.get("interface")
        return info

    def checks(self) -> dict[str, Any]:
        return run_node_checks(checks_context(self.ctx, self.opts))

    def allreduce(self, *, key: str, tag: str, group: list[int], nproc: Callable[[int], int],
                  engine: str) -> dict[str, Any]:
        s, o = self.settings, self.opts
        store = self._store()
        return run_share(self.ctx, me=o.node_rank, group=group, nproc=nproc, backend=s.backend,
                         size_bytes=s.size_bytes, timeout_s=s.bench_timeout_s, python=s.python,
                         engine=engine, iface=self.iface, master=(o.master_addr, o.master_port),
                         prefix=f"{store.prefix}{key}", relay=GroupRelay(store, key),
                         # --min-busbw is the network's floor; inside one node the built-in
                         # table per GPU model and count judges.
                         min_busbw_gbps=None)

    def ddp(self, *, key: str, nodes: list[int], nproc: Callable[[int], int]) -> dict[str, Any]:
        from preflight.ddp.world import cluster_step

        o = self.opts
        return cluster_step(self.ctx, master_addr=o.master_addr, master_port=o.master_port,
                            node_rank=o.node_rank, nproc={r: nproc(r) for r in nodes},
                            nodes=nodes, prefix=f"{self._store().prefix}{key}",
                            backend=self.settings.backend, iface=self.iface)
