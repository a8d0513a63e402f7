"""Pure parsers for the network variables, written to agree with NCCL and torch, byte for byte.

Nothing here touches the system: each function takes strings (and plain data gathered by
``preflight/probes/net.py``) and returns plain data, so every rule is tested on literal strings.

Sources (NCCL docs, "Environment Variables"; NCCL src/misc/utils.cc ``parseStringList`` /
``matchIfList``, src/misc/socket.cc ``findInterfaces`` / ``ncclFindInterfaces``):

* ``NCCL_SOCKET_IFNAME``: a leading ``^`` makes an exclude list, then a leading ``=`` makes the
  tokens exact names; tokens are split on ``,`` with NO whitespace trimming (``"eth0, eth1"`` holds
  the prefix ``" eth1"``, which never matches); without ``=`` a token is a prefix (``eth`` matches
  ``eth10``); ``:N`` after a token is a port (used by ``NCCL_IB_HCA``); at most 16 tokens are read.
  A value of length 1 is ignored and NCCL auto-selects. Only IPv4/IPv6 addresses of RUNNING
  interfaces count, IPv6 loopback is skipped, the order is getifaddrs()'s (IPv4 addresses of every
  interface by index, then IPv6), an interface counts once, and at most 16 are used.
* Unset: ``ib*``; else (NCCL_COMM_ID set) the interface on that address's subnet; else anything but
  ``docker*``/``lo*``/``virbr*``; else ``docker*``; else ``lo*``; else ``virbr*``.
* ``NCCL_IB_HCA``: the same syntax, tokens ``device[:port]``; only ACTIVE ports count.
* ``GLOO_SOCKET_IFNAME``: torch's gloo backend reads a comma list of exact interface names.
* ``MASTER_ADDR`` / ``MASTER_PORT``: torch's env:// rendezvous passes MASTER_ADDR to getaddrinfo
  unchanged and reads MASTER_PORT with Python's ``int()``; a usable port is 1..65535.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: NCCL's MAX_IFS: tokens read from a list, and interfaces used by the socket transport.
MAX_IFS = 16
#: torchrun's default --master-port (torch.distributed docs).
DEFAULT_MASTER_PORT = 29500


class ParseError(ValueError):
    """A variable's value cannot be used; the message names the variable and what was expected."""


# ---------------------------------------------------------------------------------------------
# NCCL interface / HCA lists


@dataclass(frozen=True)
class IfToken:
    """One list entry: a name (prefix unless the list is exact) and a port (-1: any)."""

    name: str
    port: int = -1


@dataclass(frozen=True)
class IfList:
    """A parsed NCCL list (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``).

    Attributes:
        tokens: the entries, in the order written, at most 16.
        exclude: the list started with ``^``: match everything the tokens do not.
        exact: ``=`` followed (after any ``^``): tokens are whole names, not prefixes.
        dropped: tokens past the 16th, which NCCL never reads.
    """

    tokens: tuple[IfToken, ...]
    exclude: bool = False
    exact: bool = False
    dropped: int = 0

    def matches(self, name: str, port: int = -1) -> bool:
        """True when NCCL would select ``name`` (and ``port``) with this list.

        NCCL's ``matchIfList(...) ^ searchNot``: an empty token list matches everything, so an
        exclude list of nothing excludes everything.
        """
        return _match_any(name, port, self) != self.exclude

    @property
    def whitespace_tokens(self) -> tuple[str, ...]:
        """Tokens with spaces or tabs in them: NCCL keeps them, so they almost never match."""
        return tuple(t.name for t in self.tokens if t.name != t.name.strip()
                     or any(c.isspace() for c in t.name))


def _atoi(text: str) -> int:
    """C ``atoi``: optional blanks and sign, then digits; 0 when there are none."""
    i = 0
    while i < len(text) and text[i] in " \t\n\v\f\r":
        i += 1
    sign = 1
    if i < len(text) and text[i] in "+-":
        sign = -1 if text[i] == "-" else 1
        i += 1
    j = i
    while j < len(text) and text[j] in "0123456789":
        j += 1
    return sign * int(text[i:j]) if j > i else 0


def parse_if_list(value: str) -> IfList:
    """Parse an NCCL interface or HCA list exactly as NCCL does (see the module docstring).

    ``parse_if_list("^=docker0,lo")`` -> exclude, exact, tokens docker0 and lo. Empty tokens
    (``"eth0,,eth1"``) and tokens that are only a port (``":1"``) are skipped, as in NCCL.
    """
    exclude = value.startswith("^")
    if exclude:
        value = value[1:]
    exact = value.startswith("=")
    if exact:
        value = value[1:]
    tokens: list[IfToken] = []
    dropped = 0
    for raw in value.split(","):
        name, colon, rest = raw.partition(":")
        if not name:
            continue
        if len(tokens) >= MAX_IFS:
            dropped += 1
            continue
        tokens.append(IfToken(name, _atoi(rest) if colon else -1))
    return IfList(tuple(tokens), exclude=exclude, exact=exact, dropped=dropped)


def _match_any(name: str, port: int, spec: IfList) -> bool:
    if not spec.tokens:
        return True
    for tok in spec.tokens:
        hit = name == tok.name if spec.exact else name.startswith(tok.name)
        if hit and (tok.port == -1 or port in (-1, tok.port)):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# NCCL socket interface selection


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


# ---------------------------------------------------------------------------------------------
# NCCL_IB_HCA


@dataclass(frozen=True)
class IbPort:
    """One RDMA port from /sys/class/infiniband/<device>/ports/<port>/.

    Attributes:
        device: ``mlx5_0``.
        port: port number (1-based).
        state: the state word (``ACTIVE``, ``DOWN``, ``INIT``...).
        link_layer: ``InfiniBand`` or ``Ethernet`` (RoCE); empty when unknown.
        rate: the rate text (``400 Gb/sec (4X NDR)``); empty when unknown.
    """

    device: str
    port: int
    state: str
    link_layer: str = ""
    rate: str = ""

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def label(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class IbSelection:
    """What NCCL_IB_HCA selects among the ports.

    Attributes:
        active: ACTIVE ports NCCL will use.
        inactive: ports the list matches that are not ACTIVE (NCCL skips them).
        ambiguous: (token, other devices) for a prefix token that is a device's full name and
            also matches other devices (``mlx5_1`` also takes ``mlx5_10``).
        unmatched: tokens that match no device at all.
    """

    active: tuple[IbPort, ...]
    inactive: tuple[IbPort, ...] = ()
    ambiguous: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unmatched: tuple[str, ...] = ()


def parse_ib_state(text: str) -> str:
    """``"4: ACTIVE\\n"`` -> ``"ACTIVE"`` (sysfs port state); unknown text -> stripped text."""
    _, _, word = text.strip().partition(":")
    return (word or text).strip().upper()


def select_ib(ports: Iterable[IbPort], value: str | None) -> IbSelection:
    """Which ports NCCL's IB transport takes for ``NCCL_IB_HCA=value`` (unset: every port)."""
    ports = tuple(ports)
    spec = parse_if_list(value or "")
    chosen = [p for p in ports if spec.matches(p.device, p.port)]
    devices = sorted({p.device for p in ports})
    ambiguous: list[tuple[str, tuple[str, ...]]] = []
    unmatched: list[str] = []
    for tok in spec.tokens:
        hits = [d for d in devices if (d == tok.name if spec.exact else d.startswith(tok.name))]
        if not hits:
            unmatched.append(tok.name)
        elif not spec.exact and tok.name in hits and len(hits) > 1:
            ambiguous.append((tok.name, tuple(d for d in hits if d != tok.name)))
    return IbSelection(tuple(p for p in chosen if p.active),
                       tuple(p for p in chosen if not p.active), tuple(ambiguous),
                       tuple(unmatched))


# ---------------------------------------------------------------------------------------------
# MASTER_ADDR / MASTER_PORT / NCCL_COMM_ID


@dataclass(frozen=True)
class MasterAddr:
    """A usable MASTER_ADDR.

    Attributes:
        host: the text handed to getaddrinfo.
        kind: ``ipv4``, ``ipv6`` or ``hostname``.
    """

    host: str
    kind: str
    notes: tuple[str, ...] = field(default=())


def parse_master_addr(value: str | None) -> MasterAddr:
    """Validate MASTER_ADDR as torch will use it (getaddrinfo on the raw text).

    Raises:
        ParseError: empty, blanks inside, brackets around an IPv6 address, a URL or a port, an
            empty or over-long label (``a..b``).
    """
    if value is None or value == "":
        raise ParseError("MASTER_ADDR is empty; expected rank 0's hostname or IP address")
    if value != value.strip() or any(c.isspace() for c in value):
        raise ParseError(f"MASTER_ADDR={value!r} contains blanks; torch passes it to getaddrinfo "
                         "as is, so it will not resolve")
    if "\x00" in value or not value.isprintable():
        raise ParseError(f"MASTER_ADDR={value!r} contains control characters")
    if "://" in value or "/" in value:
        raise ParseError(f"MASTER_ADDR={value!r} is not a host: expected a bare hostname or IP "
                         "(no scheme, no path)")
    if value.startswith("[") and value.endswith("]"):
        raise ParseError(f"MASTER_ADDR={value!r} has brackets; torch passes it to getaddrinfo as "
                         f"is: write the bare IPv6 address {value[1:-1]}")
    try:
        ip = ipaddress.ip_address(value.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return MasterAddr(value, f"ipv{ip.version}")
    if value.count(":") == 1 and value.rpartition(":")[2].isdigit():
        raise ParseError(f"MASTER_ADDR={value!r} includes a port; put the port in MASTER_PORT "
                         f"(MASTER_ADDR={value.rpartition(':')[0]} "
                         f"MASTER_PORT={value.rpartition(':')[2]})")
    if ":" in value:
        raise ParseError(f"MASTER_ADDR={value!r} is neither an IP address nor a hostname")
    if len(value) > 253 or any(not (c.isalnum() or c in "-._") for c in value):
        raise ParseError(f"MASTER_ADDR={value!r} is not a valid hostname (letters, digits, '-', "
                         "'.', at most 253 characters)")
    labels = (value[:-1] if value.endswith(".") else value).split(".")
    bad = next((label for label in labels if not 1 <= len(label) <= 63), None)
    if bad is not None:
        what = "an empty label (two dots in a row, or a leading dot)" if not bad else \
            f"a label of {len(bad)} characters (at most 63)"
        raise ParseError(f"MASTER_ADDR={value!r} is not a valid hostname: it has {what}, so "
                         "getaddrinfo cannot look it up (RFC 1123)")
    try:
        value.encode("idna")  # what Python's getaddrinfo does first with a non-ASCII name
    except UnicodeError as exc:
        raise ParseError(f"MASTER_ADDR={value!r} is not a valid hostname: {exc}") from None
    return MasterAddr(value, "hostname")


def parse_master_port(value: str | None) -> int:
    """MASTER_PORT as torch reads it (``int()``), which must lie in 1..65535.

    Unset means torchrun's default, 29500.

    Raises:
        ParseError: not an integer, or out of range.
    """
    if value is None:
        return DEFAULT_MASTER_PORT
    try:
        port = int(value)
    except ValueError:
        raise ParseError(f"MASTER_PORT={value!r} is not a number; expected an integer "
                         "1..65535") from None
    if not 1 <= port <= 65535:
        raise ParseError(f"MASTER_PORT={value!r} is out of range; expected 1..65535")
    return port


def parse_comm_id(value: str) -> tuple[str, int]:
    """NCCL_COMM_ID ``host:port`` / ``[v6]:port`` -> (host, port).

    Raises:
        ParseError: no port, or a port that is not 1..65535.
    """
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ParseError(f"NCCL_COMM_ID={value!r}: expected [ipv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise ParseError(f"NCCL_COMM_ID={value!r}: expected host:port")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ParseError(f"NCCL_COMM_ID={value!r}: port must be 1..65535")
    return host, int(port_text)


def is_multi_node(*, world_size: int | None,
                  local_world_size: int | None, slurm_nodes: int | None,
                  forced: bool) -> tuple[bool, str]:
    """Whether the job spans nodes, and why: ``--multi-node``, WORLD_SIZE > LOCAL_WORLD_SIZE, or
    Slurm's SLURM_JOB_NUM_NODES > 1."""
    if forced:
        return True, "--multi-node"
    if world_size is not None and local_world_size is not None and world_size > local_world_size:
        return True, f"WORLD_SIZE={world_size} > LOCAL_WORLD_SIZE={local_world_size}"
    if slurm_nodes is not None and slurm_nodes > 1:
        return True, f"SLURM_JOB_NUM_NODES={slurm_nodes}"
    if world_size is not None and local_world_size is not None:
        return False, f"WORLD_SIZE={world_size} <= LOCAL_WORLD_SIZE={local_world_size}"
    return False, "WORLD_SIZE/LOCAL_WORLD_SIZE unset, no --multi-node"


_NCCL_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def nccl_int(value: str | None) -> int | None:
    """An integer NCCL parameter as NCCL reads it (``strtoll(value, &end, 0)`` with the whole value
    consumed: decimal, 0x hex, 0 octal, leading blanks); None when unset or invalid, and then NCCL
    keeps its default."""
    m = _NCCL_INT.fullmatch(value) if value is not None else None
    if m is None:
        return None
    sign, body = (-1 if m.group(1) == "-" else 1), m.group(2)
    if body[:2] in ("0x", "0X"):
        return sign * int(body[2:], 16)
    return sign * int(body, 8 if body.startswith("0") else 10)


def nccl_flag(value: str | None, *, default: bool = False) -> bool:
    """An on/off NCCL parameter (NCCL_IB_DISABLE, NCCL_P2P_DISABLE, ...): on when it reads as a
    non-zero integer; ``default`` when unset or not an integer ("yes" and "true" are not: NCCL
    ignores them and keeps its default)."""
    number = nccl_int(value)
    return default if number is None else number != 0
