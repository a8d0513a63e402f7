"""Where the job meets: ``MASTER_ADDR`` / ``MASTER_PORT`` as torch's env:// rendezvous reads them,
``NCCL_COMM_ID``, and whether the job spans nodes.

torch passes MASTER_ADDR to getaddrinfo unchanged and reads MASTER_PORT with Python's ``int()``; a
usable port is 1..65535.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

#: torchrun's default --master-port (torch.distributed docs).
DEFAULT_MASTER_PORT = 29500


class ParseError(ValueError):
    """A variable's value cannot be used; the message names the variable and what was expected."""


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
