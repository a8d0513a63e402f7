"""Network facts for the ``network`` and ``master_port`` checks: interfaces, RDMA ports, routes,
name resolution, port holders. Plain data out; every socket and lookup has a deadline.

Where the facts come from, and why:

* Interfaces, addresses, flags and MTU come from the LIVE kernel of this process's network
  namespace (netifaces = getifaddrs(), and the SIOCGIFFLAGS / SIOCGIFMTU ioctls), never from
  ``--root``: NCCL runs in the job's network namespace, which is this one (an init container shares
  the pod's), while ``/host/sys/class/net`` would show the host's namespace instead.
* RDMA ports come from ``<root>/sys/class/infiniband`` (``ctx.host_path``): device files are
  not per-namespace, and a container sees them only through the host mount.
* The route to MASTER_ADDR is the kernel's own answer: ``connect()`` on a UDP socket picks a
  route and a source address without sending a packet.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil

from preflight.jobenv.netvars import IbPort, IfAddr, parse_ib_state

T = TypeVar("T")

# <linux/sockios.h> and <net/if.h>
_SIOCGIFFLAGS = 0x8913
_SIOCGIFMTU = 0x8921
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_RUNNING = 0x40


@dataclass(frozen=True)
class NetIf:
    """One interface as the kernel reports it.

    Attributes:
        name: ``eth0``.
        up: IFF_UP (administratively up).
        running: IFF_RUNNING (up with carrier); NCCL ignores interfaces without it.
        loopback: IFF_LOOPBACK.
        mtu: bytes, None when the ioctl failed.
        addresses: (family, address, netmask) for IPv4/IPv6, in getifaddrs order.
        speed_mbps: ``/sys/class/net/<name>/speed`` (Mb/s); None when the kernel does not know
            (-1, EINVAL: no carrier, loopback) or the file is missing.
        physical: whether ``/sys/class/net/<name>/device`` exists (a NIC, not a veth, bridge or
            bond: a software interface reports a nominal speed); None when not read.
    """

    name: str
    up: bool
    running: bool
    loopback: bool
    mtu: int | None
    addresses: tuple[tuple[int, str, str | None], ...]
    speed_mbps: int | None = None
    physical: bool | None = None


@dataclass(frozen=True)
class NetSnapshot:
    """All interfaces, and the getifaddrs() address order NCCL walks.

    Attributes:
        interfaces: by interface index order.
        entries: IPv4 entries of every interface, then IPv6 entries (glibc asks the kernel for
            AF_INET addresses before AF_INET6), each with its interface's RUNNING flag.
        default_gateway_ifs: family -> interfaces that carry a default route.
    """

    interfaces: tuple[NetIf, ...]
    entries: tuple[IfAddr, ...]
    default_gateway_ifs: dict[int, tuple[str, ...]]

    def get(self, name: str) -> NetIf | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def owner(self, address: str) -> NetIf | None:
        """The interface that holds ``address`` (the source address a route picked)."""
        bare = address.split("%", 1)[0]
        for i in self.interfaces:
            if any(a.split("%", 1)[0] == bare for _, a, _ in i.addresses):
                return i
        return None


def _ioctl_int(sock: socket.socket, request: int, name: str, fmt: str) -> int | None:
    try:
        buf = fcntl.ioctl(sock.fileno(), request, struct.pack(f"16s{fmt}", name.encode()[:15], 0))
    except OSError:
        return None
    return int(struct.unpack(f"16s{fmt}", buf[:16 + struct.calcsize(fmt)])[1])


def probe_interfaces() -> NetSnapshot:
    """Read every interface of this network namespace (a few hundred microseconds)."""
    import netifaces  # here, not at the top: the data types and fixtures work without it

    names = list(netifaces.interfaces())
    interfaces: list[NetIf] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            flags = _ioctl_int(sock, _SIOCGIFFLAGS, name, "H") or 0
            mtu = _ioctl_int(sock, _SIOCGIFMTU, name, "i")
            addrs: list[tuple[int, str, str | None]] = []
            info = netifaces.ifaddresses(name)
            for family in (socket.AF_INET, socket.AF_INET6):
                for a in info.get(family, []):
                    if "addr" in a:
                        addrs.append((family, a["addr"].split("%", 1)[0], a.get("netmask")))
            sys_dir = Path("/sys/class/net") / name
            interfaces.append(NetIf(name, bool(flags & IFF_UP), bool(flags & IFF_RUNNING),
                                    bool(flags & IFF_LOOPBACK), mtu, tuple(addrs),
                                    parse_speed(_read(sys_dir / "speed")),
                                    (sys_dir / "device").exists()))
    gateways: dict[int, tuple[str, ...]] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        raw = netifaces.gateways()
        for family in (socket.AF_INET, socket.AF_INET6):
            routes: Any = raw.get(family, [])
            gateways[family] = tuple(str(g[1]) for g in routes if len(g) > 2 and g[2])
    return make_snapshot(interfaces, gateways)


def parse_speed(text: str) -> int | None:
    """``/sys/class/net/IF/speed`` text -> Mb/s; None for -1, empty (EINVAL) or junk."""
    raw = text.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        return None
    value = int(raw)
    return value if value > 0 else None


def make_snapshot(interfaces: Sequence[NetIf],
                  default_gateway_ifs: Mapping[int, tuple[str, ...]] | None = None) -> NetSnapshot:
    """A snapshot of ``interfaces`` with the address order NCCL walks (live or fixture)."""
    entries = tuple(
        IfAddr(i.name, fam, addr, i.running, mask)
        for family in (socket.AF_INET, socket.AF_INET6)
        for i in interfaces
        for fam, addr, mask in i.addresses if fam == family)
    return NetSnapshot(tuple(interfaces), entries, dict(default_gateway_ifs or {}))


@dataclass(frozen=True)
class IbSnapshot:
    """RDMA ports under ``<root>/sys/class/infiniband``.

    Attributes:
        path: the directory read.
        present: it exists (no RDMA driver loaded, or not mounted in a container, otherwise).
        ports: every port of every device, by device name then port.
    """

    path: str
    present: bool
    ports: tuple[IbPort, ...]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def probe_ib(path: Path) -> IbSnapshot:
    """Read device/port state from ``path`` (``ctx.host_path("/sys/class/infiniband")``)."""
    if not path.is_dir():
        return IbSnapshot(str(path), False, ())
    ports: list[IbPort] = []
    for dev in sorted(path.iterdir(), key=lambda p: p.name):
        port_dir = dev / "ports"
        if not port_dir.is_dir():
            continue
        for p in sorted(port_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
            if not p.name.isdigit():
                continue
            ports.append(IbPort(dev.name, int(p.name), parse_ib_state(_read(p / "state")),
                                _read(p / "link_layer"), _read(p / "rate")))
    return IbSnapshot(str(path), True, tuple(ports))


def with_deadline(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking call (getaddrinfo has no timeout of its own) on a daemon thread.

    Raises:
        TimeoutError: the call did not return within ``timeout_s``; the thread is abandoned (it
            holds no socket of ours and ends when the resolver gives up).
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, name=f"deadline-{what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"{what} did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def resolve(host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
    """getaddrinfo(host) as torch's TCPStore client calls it: (family, address) in its order.

    Raises:
        socket.gaierror: the name does not resolve.
        TimeoutError: the resolver did not answer in time.
    """
    def lookup() -> tuple[tuple[int, str], ...]:
        try:
            infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except UnicodeError as exc:  # the IDNA codec refuses the name before any lookup
            raise socket.gaierror(socket.EAI_NONAME, f"not a valid host name ({exc})") from None
        out: list[tuple[int, str]] = []
        for family, _, _, _, sockaddr in infos:
            item = (int(family), str(sockaddr[0]).split("%", 1)[0])
            if family in (socket.AF_INET, socket.AF_INET6) and item not in out:
                out.append(item)
        return tuple(out)

    return with_deadline(lookup, timeout_s, f"resolving {host}")


def route_source(family: int, address: str) -> str:
    """The source address the kernel picks to reach ``address`` (a UDP connect sends nothing).

    Raises:
        OSError: no route (ENETUNREACH / EHOSTUNREACH).
    """
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return str(sock.getsockname()[0]).split("%", 1)[0]


@dataclass(frozen=True)
class PortHolder:
    """A process with a socket on the port. pid/name/user are None when not visible to us."""

    pid: int | None
    name: str | None
    user: str | None
    status: str
    local: str


def port_holders(port: int) -> tuple[PortHolder, ...]:
    """Sockets bound to TCP ``port`` (listeners first) and their processes, via psutil."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return ()
    out: list[PortHolder] = []
    for c in conns:
        if not c.laddr or c.laddr.port != port:
            continue
        if c.status not in (psutil.CONN_LISTEN, psutil.CONN_NONE) and c.raddr:
            continue  # an outbound connection that happens to use the port number
        name = user = None
        if c.pid is not None:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(c.pid)
                name = proc.name()
                user = proc.username()
        out.append(PortHolder(c.pid, name, user, str(c.status), f"{c.laddr.ip}:{c.laddr.port}"))
    out.sort(key=lambda h: (h.status != psutil.CONN_LISTEN, h.pid or 0))
    unique: list[PortHolder] = []
    for h in out:
        if all(h.pid != u.pid or h.pid is None for u in unique):
            unique.append(h)
    return tuple(unique)


def ancestor_pids() -> frozenset[int]:
    """This process and its parents (a torchrun agent that already holds the port is ours)."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return frozenset(pids)


def try_listen(port: int) -> OSError | None:
    """Bind and listen on ``port`` on every address as torch's TCPStore server does, then close.

    TCPStore listens on the wildcard address (dual-stack ``::`` when IPv6 exists) with
    SO_REUSEADDR, so TIME_WAIT leftovers do not count but any listener does. The socket is closed
    before returning: a listener with no connections leaves nothing behind.

    Returns:
        None when the port is free, else the error (EADDRINUSE, EACCES...).
    """
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 in this namespace: fall back to IPv4
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno == errno.EADDRNOTAVAIL:
                continue  # IPv6 disabled on this node
            return exc
        finally:
            sock.close()
        return None
    return OSError(errno.EAFNOSUPPORT, "no IPv4 or IPv6 socket could be created")


def free_port_near(port: int, *, tries: int = 64) -> int | None:
    """A port after ``port`` that can be listened on now, outside the ephemeral range."""
    low, high = 32768, 60999
    with contextlib.suppress(OSError, ValueError):
        low, high = (int(x) for x in
                     Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidate = port
    for _ in range(tries):
        candidate += 1
        if candidate > 65535:
            candidate = 20000
        if low <= candidate <= high:
            candidate = high + 1 if high < 65535 else 20000
        if try_listen(candidate) is None:
            return candidate
    return None


def tcp_connect(family: int, address: str, port: int, *, timeout_s: float) -> str:
    """Try a TCP connect and close at once: ``"connected"``, ``"refused"``, ``"timeout"``, or
    the error text (``"No route to host"``)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((address, port))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return exc.strerror or str(exc)
        return "connected"


class NetProbe(Protocol):
    """Source of network facts for the checks (the live kernel, or a fixture in tests)."""

    def interfaces(self) -> NetSnapshot:
        """Every interface of this network namespace."""
        ...

    def ib(self, path: Path) -> IbSnapshot:
        """The RDMA ports under ``path`` (``<root>/sys/class/infiniband``)."""
        ...

    def resolve(self, host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
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

    def resolve(self, host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
        return resolve(host, timeout_s=timeout_s)

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

    def resolve(self, host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
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

