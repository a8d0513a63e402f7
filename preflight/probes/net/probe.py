"""The network probe the Context serves the checks from: the live kernel, or a fixture."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from preflight.probes.ib import IbSnapshot, probe_ib
from preflight.probes.net.interfaces import NetSnapshot, probe_interfaces
from preflight.probes.net.names import resolve_host, route_source


class NetProbe(Protocol):
    """Source of network facts for the checks (the live kernel, or a fixture in tests)."""

    def interfaces(self) -> NetSnapshot:
        """Every interface of this network namespace."""
        ...

    def ib(self, path: Path) -> IbSnapshot:
        """The RDMA ports under ``path`` (``<root>/sys/class/infiniband``)."""
        ...

    def resolve_host(self, host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
        """(family, address) of ``host``; raises socket.gaierror / TimeoutError."""
        ...

    def route_source(self, family: int, address: str) -> str:
        """The source address the kernel picks to reach ``address``; raises OSError."""
        ...


class LiveNetProbe:
    """The kernel of this process's network namespace (:func:`probe_interfaces`, ...)."""

    def interfaces(self) -> NetSnapshot:
        return probe_interfaces()

    def ib(self, path: Path) -> IbSnapshot:
        return probe_ib(path)

    def resolve_host(self, host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
        return resolve_host(host, timeout_s=timeout_s)

    def route_source(self, family: int, address: str) -> str:
        return route_source(family, address)


@dataclass(frozen=True)
class FixtureNetProbe:
    """Made-up network facts, so ``network`` is tested without root or namespaces.

    Attributes:
        snapshot: the interfaces.
        ib_ports: the RDMA snapshot (default: none present).
        hosts: name -> addresses; a name not listed does not resolve.
        routes: destination address -> source address; a destination not listed has no route.
    """

    snapshot: NetSnapshot
    ib_ports: IbSnapshot | None = None
    hosts: Mapping[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    routes: Mapping[str, str] = field(default_factory=dict)

    def interfaces(self) -> NetSnapshot:
        return self.snapshot

    def ib(self, path: Path) -> IbSnapshot:
        return self.ib_ports or IbSnapshot(str(path), False, ())

    def resolve_host(self, host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
        if host in self.hosts:
            return tuple(self.hosts[host])
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return ((socket.AF_INET6 if ":" in host else socket.AF_INET, host),)

    def route_source(self, family: int, address: str) -> str:
        if address in self.routes:
            return self.routes[address]
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

