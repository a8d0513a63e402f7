"""The interfaces of this network namespace, and the getifaddrs() order NCCL walks them in.

Read from the live kernel (netifaces = getifaddrs(), SIOCGIFFLAGS / SIOCGIFMTU), never from
``--root``: NCCL runs in this process's network namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# <linux/sockios.h> and <net/if.h>
_SIOCGIFFLAGS = 0x8913
_SIOCGIFMTU = 0x8921
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_RUNNING = 0x40


@dataclass(frozen=True)
class IfAddr:
    """One getifaddrs() entry NCCL looks at: an interface name, an address, and its flags.

    Attributes:
        name: interface name (``eth0``).
        family: ``socket.AF_INET`` or ``socket.AF_INET6``.
        address: the address without a ``%scope`` suffix.
        running: IFF_RUNNING (up and carrier): NCCL skips interfaces without it.
        netmask: the netmask or prefix as text, None when unknown.
    """

    name: str
    family: int
    address: str
    running: bool = True
    netmask: str | None = None


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


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[:64]
    except OSError:
        return ""


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
