"""Which interfaces NCCL's socket transport and bootstrap use, and gloo's list: predicted from the
getifaddrs() entries (:class:`preflight.probes.net.IfAddr`) and the variables.

NCCL src/misc/socket.cc ``findInterfaces`` / ``ncclFindInterfaces``: only IPv4/IPv6 addresses of
RUNNING interfaces count, IPv6 loopback is skipped, the order is getifaddrs()'s (IPv4 addresses of
every interface by index, then IPv6), an interface counts once, and at most 16 are used. A
``NCCL_SOCKET_IFNAME`` of length 1 is ignored and NCCL auto-selects: ``ib*``; else (NCCL_COMM_ID
set) the interface on that address's subnet; else anything but ``docker*``/``lo*``/``virbr*``;
else ``docker*``; else ``lo*``; else ``virbr*``. ``GLOO_SOCKET_IFNAME``: torch's gloo backend
reads a comma list of exact interface names.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from preflight.jobenv.netvars.iflist import MAX_IFS, parse_if_list
from preflight.probes.net.interfaces import IfAddr


@dataclass(frozen=True)
class Selection:
    """The interfaces NCCL's socket code will use, and why.

    Attributes:
        interfaces: (name, address) in NCCL's order, at most 16; the first is bootstrap's.
        mode: ``"user"`` (NCCL_SOCKET_IFNAME used) or ``"auto"``.
        rule: which rule chose them: the user's value, or the auto step (``ib``, ``subnet``,
            ``^docker,lo,virbr``, ``docker``, ``lo``, ``virbr``); empty when nothing matched.
        not_running: names that match the rule but are skipped because they are not RUNNING.
        ignored_value: a set value NCCL ignores (length 1), else None.
    """

    interfaces: tuple[tuple[str, str], ...]
    mode: str
    rule: str
    not_running: tuple[str, ...] = ()
    ignored_value: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.interfaces)

    @property
    def bootstrap(self) -> tuple[str, str] | None:
        """NCCL bootstrap's interface and address: the first match only."""
        return self.interfaces[0] if self.interfaces else None


#: NCCL's auto-selection steps after ``ib`` (and the NCCL_COMM_ID subnet step), in order.
AUTO_STEPS = ("^docker,lo,virbr", "docker", "lo", "virbr")


def _is_v6_loopback(entry: IfAddr) -> bool:
    if entry.family != socket.AF_INET6:
        return False
    try:
        return ipaddress.IPv6Address(entry.address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def find_interfaces(entries: Sequence[IfAddr], value: str, *, family: int | None = None,
                    max_ifs: int = MAX_IFS) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """NCCL's ``findInterfaces``: the interfaces a list selects, and the matching ones not running.

    Args:
        entries: getifaddrs() entries in the system's order (see ``IfAddr``).
        value: the list (``"eth"``, ``"^docker,lo"``, ``"=eth1"``).
        family: NCCL_SOCKET_FAMILY's family, None for both.
        max_ifs: 16 for the transport, 1 for bootstrap.
    """
    spec = parse_if_list(value)
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    not_running: list[str] = []
    for e in entries:
        if len(found) >= max_ifs:
            break
        if e.family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if family is not None and e.family != family:
            continue
        if _is_v6_loopback(e) or not spec.matches(e.name):
            continue
        if not e.running:
            if e.name not in not_running:
                not_running.append(e.name)
            continue
        if e.name not in seen:
            seen.add(e.name)
            found.append((e.name, e.address))
    return tuple(found), tuple(n for n in not_running if n not in seen)


def subnet_match(entries: Sequence[IfAddr], target: str) -> tuple[str, str] | None:
    """The first running interface whose subnet holds ``target`` (NCCL_COMM_ID's step), or None."""
    try:
        want = ipaddress.ip_address(target.split("%", 1)[0])
    except ValueError:
        return None
    for e in entries:
        if e.running and in_subnet(e.address, e.netmask, want):
            return e.name, e.address
    return None


def in_subnet(address: str, netmask: str | None,
              target: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True when ``target`` is on the network of ``address``/``netmask``."""
    if netmask is None:
        return False
    # netifaces writes IPv6 masks as "ffff:ffff::/64": the prefix length after the slash wins.
    prefix = netmask.rpartition("/")[2]
    try:
        iface = ipaddress.ip_interface(f"{address.split('%', 1)[0]}/{prefix}")
    except ValueError:
        return False
    return iface.version == target.version and target in iface.network


def socket_family(value: str | None) -> tuple[int | None, bool]:
    """NCCL_SOCKET_FAMILY -> (family or None, whether NCCL understood the value).

    Only ``AF_INET`` and ``AF_INET6`` count; NCCL silently ignores anything else.
    """
    if value is None or value == "":
        return None, True
    if value == "AF_INET":
        return socket.AF_INET, True
    if value == "AF_INET6":
        return socket.AF_INET6, True
    return None, False


def nccl_socket_selection(entries: Sequence[IfAddr], env_value: str | None, *,
                          family: int | None = None, comm_id_host: str | None = None,
                          max_ifs: int = MAX_IFS) -> Selection:
    """Predict NCCL's ``ncclFindInterfaces`` for ``NCCL_SOCKET_IFNAME=env_value``.

    Set (longer than one character): find-or-fail on the user's list. Otherwise auto-selection:
    ``ib``, then the NCCL_COMM_ID subnet, then ``^docker,lo,virbr``, ``docker``, ``lo``, ``virbr``.
    """
    if env_value is not None and len(env_value) > 1:
        found, down = find_interfaces(entries, env_value, family=family, max_ifs=max_ifs)
        return Selection(found, "user", env_value, down)
    ignored = env_value if env_value else None
    down_all: list[str] = []
    found, down = find_interfaces(entries, "ib", family=family, max_ifs=max_ifs)
    down_all.extend(down)
    if found:
        return Selection(found, "auto", "ib", tuple(down_all), ignored)
    if comm_id_host:
        hit = subnet_match(entries, comm_id_host)
        if hit:
            return Selection((hit,), "auto", "subnet", tuple(down_all), ignored)
    for step in AUTO_STEPS:
        found, down = find_interfaces(entries, step, family=family, max_ifs=max_ifs)
        down_all.extend(d for d in down if d not in down_all)
        if found:
            return Selection(found, "auto", step, tuple(down_all), ignored)
    return Selection((), "auto", "", tuple(down_all), ignored)


def parse_gloo_ifnames(value: str) -> tuple[str, ...]:
    """GLOO_SOCKET_IFNAME: a comma list of exact names (empty entries kept: gloo rejects them)."""
    return tuple(value.split(","))
