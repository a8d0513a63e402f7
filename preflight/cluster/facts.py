"""What a node tells the others when it arrives: who it is, the facts parity compares, and the
link its NCCL will use across nodes (the expectation the all-reduce is judged against).

The link, as NCCL would pick it (NCCL docs, Environment Variables; the ``network`` and ``fabric``
checks parse the same variables the same way):

* RDMA: the ACTIVE ports ``NCCL_IB_HCA`` selects (every ACTIVE port when unset) under
  ``<root>/sys/class/infiniband``, unless ``NCCL_IB_DISABLE=1``; their rates summed (NCCL
  spreads its channels over every selected port).
* Sockets otherwise (and always for gloo): the interfaces ``NCCL_SOCKET_IFNAME`` selects (NCCL's
  auto-selection when unset; ``GLOO_SOCKET_IFNAME``, else the route to the master, for gloo),
  ``/sys/class/net/IF/speed``; with several interfaces the slowest one times their count (NCCL
  splits the data equally, so the slowest socket sets the pace: nccl-tests#83).

-1 or a missing speed is unknown. A software interface (veth, bridge: no ``device`` link in
sysfs) reports a nominal speed and is marked ``virtual``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from preflight.bench import interpreter_facts, visible_gpus
from preflight.bench.worker import engines
from preflight.cluster import wire
from preflight.cluster.options import ClusterOptions
from preflight.core.context import Context
from preflight.jobenv.netvars import (
    nccl_flag,
    nccl_socket_selection,
    parse_gloo_ifnames,
    select_ib,
    socket_family,
)
from preflight.probes.ib import IbPort, IbSnapshot
from preflight.probes.ibparse import parse_rate

if TYPE_CHECKING:  # the snapshot comes through the Context's network probe
    from preflight.probes.net import NetSnapshot



def has_nccl4py(ctx: Context, python: str) -> bool | None:
    """Whether the workers' interpreter can import nccl4py (the GPU workers' own engine choice,
    :mod:`preflight.bench.worker.engines`); None when it could not be asked within 10 s."""
    found = interpreter_facts(ctx, python)
    return None if found is None else engines.has(found, "nccl4py")


def choose_engine(requested: str, backend: str, nccl4py: Mapping[int, bool | None]) -> str:
    """One engine for every node of the run, decided by node 0 from what each node can import.

    The nccl4py engine (no torch in the workers: ~0.6 s of imports against ~4 s) when asked for,
    or with ``auto`` when every node's workers can import it; else torch. gloo is torch's.
    """
    if backend == "gloo" or requested == "torch":
        return "torch"
    if requested == "nccl4py":
        return "nccl4py"
    return "nccl4py" if nccl4py and all(v is True for v in nccl4py.values()) else "torch"


def socket_link(snap: NetSnapshot, names: tuple[str, ...], how: str) -> wire.Link:
    """The link of the socket interfaces ``names``: the slowest one's speed x their count."""
    ifs = [snap.get(n) for n in dict.fromkeys(names)]
    known = [i for i in ifs if i is not None]
    if not names:
        return wire.Link("socket", None, f"{how}: no interface selected, so no link speed")
    if len(known) < len(ifs) or any(i.speed_mbps is None for i in known):
        unknown = [n for n, i in zip(names, ifs, strict=True) if i is None or i.speed_mbps is None]
        return wire.Link("socket", None, f"{how}: speed of {', '.join(unknown)} unknown "
                         "(/sys/class/net/IF/speed)")
    slowest = min(i.speed_mbps or 0 for i in known)
    gbps = slowest * len(known) / 1000
    parts = ", ".join(f"{i.name} {i.speed_mbps} Mb/s" for i in known)
    return wire.Link("socket", gbps, f"{how}: {parts} (/sys/class/net/IF/speed)",
                     virtual=any(i.physical is False for i in known))


def rdma_link(ports: tuple[IbPort, ...], hca: str | None) -> wire.Link | None:
    """The summed rate of the ACTIVE RDMA ports NCCL_IB_HCA selects; None: no such port."""
    active = select_ib(ports, hca).active
    if not active:
        return None
    rates = [(p, parse_rate(p.rate)) for p in active]
    if any(r is None for _, r in rates):
        odd = ", ".join(f"{p.label} {p.rate!r}" for p, r in rates if r is None)
        return wire.Link("rdma", None, f"rate of {odd} not understood")
    total = sum(r.gbps for _, r in rates if r is not None)
    parts = ", ".join(f"{p.label} {r.gbps:g} Gb/s" for p, r in rates if r is not None)
    return wire.Link("rdma", total, f"RDMA {parts}" + (f" (NCCL_IB_HCA={hca})" if hca else ""))


def link_of(snap: NetSnapshot, ib: IbSnapshot, env: Mapping[str, str], *, backend: str,
            route_iface: str | None) -> wire.Link:
    """The link this node's collectives use across nodes (see the module docstring). Pure."""
    if backend == "gloo":
        raw = env.get("GLOO_SOCKET_IFNAME")
        names = parse_gloo_ifnames(raw) if raw else ((route_iface,) if route_iface else ())
        how = f"gloo over GLOO_SOCKET_IFNAME={raw}" if raw else "gloo over the route's interface"
        return socket_link(snap, tuple(n for n in names if n), how)
    if ib.present and not nccl_flag(env.get("NCCL_IB_DISABLE")) \
            and env.get("NCCL_NET", "").lower() != "socket":
        link = rdma_link(ib.ports, env.get("NCCL_IB_HCA") or None)
        if link is not None:
            return link
    family, _ = socket_family(env.get("NCCL_SOCKET_FAMILY"))
    sel = nccl_socket_selection(snap.entries, env.get("NCCL_SOCKET_IFNAME"), family=family)
    how = ("NCCL sockets over NCCL_SOCKET_IFNAME=" + str(env.get("NCCL_SOCKET_IFNAME"))
           if sel.mode == "user" else "NCCL sockets, auto-selected")
    return socket_link(snap, sel.names, how)


def node_facts(ctx: Context, opts: ClusterOptions, *, backend: str, nproc: int, engine: str,
               bandwidth: bool, python: str, nonce: str, host: str) -> dict[str, Any]:
    """This node's arrival (checked on node 0 by :func:`wire.arrival`)."""
    addr: str | None = None
    try:
        family, target = ctx.resolve_host(opts.master_addr)[0]
        addr = ctx.route_source(family, target)
    except (OSError, TimeoutError, IndexError):
        pass
    snap = ctx.interfaces()
    iface = snap.owner(addr) if addr else None
    gpu_snap = ctx.gpus()
    gpus, count, _ = visible_gpus(ctx)
    nccl4py = (has_nccl4py(ctx, python) if backend == "nccl" and engine == "auto" and bandwidth
               else None)
    link = link_of(snap, ctx.ib(), ctx.env, backend=backend,
                   route_iface=iface.name if iface else None)
    return {"node_rank": opts.node_rank, "nonce": nonce, "host": host[:wire.MAX_NAME],
            "addr": addr, "pid": os.getpid(), "nnodes": opts.nnodes,
            "timeout_s": opts.timeout_s, "nproc": nproc, "backend": backend,
            "nccl4py": nccl4py, "interface": iface.name if iface else None,
            "link": link.to_json(),
            "facts": {"gpu_count": count if gpu_snap.available else None,
                      "gpu_model": ", ".join(sorted({g.name for g in gpus if g.name})) or None,
                      "mtu": iface.mtu if iface else None,
                      "env": {k: v for k, v in sorted(ctx.env.items())
                              if k.startswith(("NCCL_", "GLOO_"))}}}
