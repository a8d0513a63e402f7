"""Network facts for the ``network`` and ``master_port`` checks: interfaces, RDMA ports, routes,
name resolution, port holders. Plain data out; every socket and lookup has a deadline.

Where the facts come from, and why:

* Interfaces, addresses, flags and MTU come from the LIVE kernel of this process's network
  namespace (netifaces = getifaddrs(), and the SIOCGIFFLAGS / SIOCGIFMTU ioctls), never from
  ``--root``: NCCL runs in the job's network namespace, which is this one (an init container shares
  the pod's), while ``/host/sys/class/net`` would show the host's namespace instead
  (:mod:`.interfaces`).
* RDMA ports come from ``<root>/sys/class/infiniband`` (``ctx.host_path``): device files are
  not per-namespace, and a container sees them only through the host mount
  (:mod:`preflight.probes.ib`).
* The route to MASTER_ADDR is the kernel's own answer: ``connect()`` on a UDP socket picks a
  route and a source address without sending a packet (:mod:`.names`).
* Who holds a port, and whether it can be listened on as torch's TCPStore would (:mod:`.ports`).

The checks get interfaces, RDMA ports, lookups and routes through a :class:`NetProbe` on the
Context (:mod:`.probe`): the live kernel, or a fixture in tests.
"""

from __future__ import annotations

from preflight.probes.ib import IbPort, IbSnapshot, probe_ib
from preflight.probes.net.interfaces import (
    IFF_LOOPBACK,
    IFF_RUNNING,
    IFF_UP,
    IfAddr,
    NetIf,
    NetSnapshot,
    make_snapshot,
    parse_speed,
    probe_interfaces,
)
from preflight.probes.net.names import resolve_host, route_source, with_deadline
from preflight.probes.net.ports import (
    PortHolder,
    ancestor_pids,
    free_port_near,
    port_holders,
    tcp_connect,
    try_listen,
)
from preflight.probes.net.probe import FixtureNetProbe, LiveNetProbe, NetProbe

__all__ = ["IFF_LOOPBACK", "IFF_RUNNING", "IFF_UP", "FixtureNetProbe", "IbPort", "IbSnapshot",
           "IfAddr", "LiveNetProbe", "NetIf", "NetProbe", "NetSnapshot", "PortHolder",
           "ancestor_pids", "free_port_near", "make_snapshot", "parse_speed", "port_holders",
           "probe_ib", "probe_interfaces", "resolve_host", "route_source", "tcp_connect",
           "try_listen", "with_deadline"]
