"""RDMA ports (InfiniBand and RoCE) from ``<root>/sys/class/infiniband``, as plain data.

Reads the files the kernel documents (Documentation/ABI/stable/sysfs-class-infiniband): per port
``state``, ``phys_state``, ``rate``, ``link_layer``, ``counters/*`` and, for the GID index NCCL is
told to use, ``gids/<i>`` and ``gid_attrs/types/<i>``. sysfs files answer from the driver without
blocking on the fabric; the check still runs this under its deadline.
Parsing: :mod:`preflight.probes.ibparse`.

Two views of the same ports: :class:`IbPort` (state, link layer, rate: what NCCL_IB_HCA selects
among, served by the network probe to ``network``, ``nccl_env`` and ``memlock``) and
:class:`PortInfo` (that plus physical state, error counters and the GID: the ``fabric`` check).
Device files are not per network namespace, so both read ``<root>/sys/class/infiniband``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from preflight.core.boundedio import read_small_text
from preflight.probes.ibparse import ERROR_COUNTERS, parse_counter, parse_ib_state, parse_numbered

#: Most ports read (a node has a handful; a bound keeps a strange tree from costing seconds).
MAX_PORTS = 256


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


@dataclass(frozen=True)
class PortInfo:
    """One port as sysfs shows it (texts as read, stripped; empty when a file is missing).

    Attributes:
        device: ``mlx5_0``.
        port: the port number.
        state: ``ACTIVE``, ``DOWN``, ``INIT``...
        phys_state: ``LinkUp``, ``Polling``, ``Disabled``...
        rate: the rate text (``400 Gb/sec (4X NDR)``).
        link_layer: ``InfiniBand`` or ``Ethernet``.
        counters: error counters that could be read, by name.
        gid: ``gids/<i>`` for the asked GID index; None when not asked or missing.
        gid_type: ``gid_attrs/types/<i>`` (``RoCE v2``); None when not asked or unreadable.
    """

    device: str
    port: int
    state: str
    phys_state: str
    rate: str
    link_layer: str
    counters: Mapping[str, int] = field(default_factory=dict)
    gid: str | None = None
    gid_type: str | None = None

    @property
    def label(self) -> str:
        return f"{self.device}:{self.port}"


def _read(path: Path) -> str | None:
    """A sysfs attribute's text; None when missing, unreadable, or not a small regular file (a
    FIFO or a huge file in a --root tree is refused unread)."""
    try:
        return read_small_text(path)
    except OSError:
        return None


def read_counters(port_dir: Path) -> dict[str, int]:
    """The error counters of one port directory that exist and read as numbers."""
    found: dict[str, int] = {}
    for name in ERROR_COUNTERS:
        text = _read(port_dir / "counters" / name)
        value = parse_counter(text) if text is not None else None
        if value is not None:
            found[name] = value
    return found


def port_dirs(path: Path) -> list[tuple[str, int, Path]]:
    """(device, port, directory) of every port under ``path``, sorted; [] when absent."""
    out: list[tuple[str, int, Path]] = []
    try:
        devices = sorted(path.iterdir(), key=lambda p: p.name)
    except OSError:
        return out
    for dev in devices:
        try:
            ports = sorted((p for p in (dev / "ports").iterdir() if p.name.isdigit()),
                           key=lambda p: int(p.name))
        except OSError:
            continue
        out += [(dev.name, int(p.name), p) for p in ports]
        if len(out) >= MAX_PORTS:
            return out[:MAX_PORTS]
    return out


def probe_ib(path: Path) -> IbSnapshot:
    """State, link layer and rate of every port under ``path``
    (``ctx.host_path("/sys/class/infiniband")``)."""
    if not path.is_dir():
        return IbSnapshot(str(path), False, ())
    return IbSnapshot(str(path), True, tuple(
        IbPort(device, num, parse_ib_state(_read(d / "state") or ""), _read(d / "link_layer") or "",
               _read(d / "rate") or "")
        for device, num, d in port_dirs(path)))


def read_ports(path: Path, *, gid_index: int | None = None) -> tuple[PortInfo, ...]:
    """Every port under ``path`` (``ctx.host_path("/sys/class/infiniband")``)."""
    ports = []
    for device, num, d in port_dirs(path):
        state = parse_numbered(_read(d / "state") or "")[1].upper()
        phys = parse_numbered(_read(d / "phys_state") or "")[1]
        gid = gid_type = None
        if gid_index is not None:
            gid = _read(d / "gids" / str(gid_index))
            gid_type = _read(d / "gid_attrs" / "types" / str(gid_index))
        ports.append(PortInfo(device, num, state, phys, _read(d / "rate") or "",
                              _read(d / "link_layer") or "", read_counters(d), gid, gid_type))
    return tuple(ports)


def reread_counters(path: Path, ports: Sequence[PortInfo]) -> dict[str, dict[str, int]]:
    """The error counters of ``ports`` again, by port label (the second of the two reads)."""
    return {p.label: read_counters(path / p.device / "ports" / str(p.port)) for p in ports}


__all__ = ["IbPort", "IbSnapshot", "PortInfo", "port_dirs", "probe_ib", "read_counters",
           "read_ports", "reread_counters"]
