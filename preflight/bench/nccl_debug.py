"""A summary of what NCCL chose, from its ``NCCL_DEBUG=INFO`` output (``preflight bench --debug``).

When the all-reduce is slow or fails, the first questions are: which NCCL, which transport between
the GPUs (P2P over NVLink, SHM, NET), which network and interface
(NCCL_SOCKET_IFNAME: docs/network.md), how many channels, and which NCCL_* variables the
environment set. Pure: :func:`summarize` takes the text and never raises.

Lines it reads (NCCL 2.1x-2.2x)::

    NCCL version 2.21.5+cuda12.4
    host:1234:1299 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
    host:1234:1299 [0] NCCL INFO Using network Socket
    host:1234:1299 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
    host:1234:1299 [0] NCCL INFO Channel 03/24 :    0   1
    host:1234:1299 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, ...
    host:1234:1299 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
    host:1234:1299 [0] NCCL WARN ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_VERSION = re.compile(r"NCCL version (\S+)")
_NET = re.compile(r"Using network (\S+)")
_IFACE = re.compile(r"NET/(Socket|IB)\s*:\s*Using (.+)$")
_BOOTSTRAP = re.compile(r"Bootstrap\s*:\s*Using (\S+)")
_VIA = re.compile(r"Channel (\d+)/\d+ : \d+\[[0-9a-fx]+\] -> \d+\[[0-9a-fx]+\] (?:\[\w+\] )?via "
                  r"(\S+)")
_RING = re.compile(r"Channel (\d+)/(\d+) :\s+\d+(?:\s+\d+)+\s*$")
_COLL = re.compile(r"(\d+) coll channels, .*?(\d+) nvls channels")
_ENV = re.compile(r"(NCCL_\w+) set by environment to (.*)$")
_WARN = re.compile(r"NCCL WARN (.*)$")
_IFACE_ITEM = re.compile(r"\[\d+\]([^\s:<\[]+)")


@dataclass
class NcclSummary:
    """What NCCL reported choosing; empty fields mean the log did not say."""

    version: str | None = None
    network: str | None = None
    bootstrap: str | None = None
    interfaces: list[str] = field(default_factory=list)
    transports: list[str] = field(default_factory=list)
    channels: int | None = None
    nvls_channels: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.version or self.network or self.transports or self.channels
                    or self.env or self.warnings)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "network": self.network, "bootstrap": self.bootstrap,
                "interfaces": self.interfaces, "transports": self.transports,
                "channels": self.channels, "nvls_channels": self.nvls_channels,
                "env": self.env, "warnings": self.warnings}

    def text(self) -> str:
        """One line for a person: "NCCL 2.21.5, transport P2P/CUMEM/read, 24 channels, ..."."""
        if self.empty:
            return "NCCL printed nothing at NCCL_DEBUG=INFO (did the NCCL path run?)"
        parts = [f"NCCL {self.version or '(version not printed)'}"]
        if self.transports:
            parts.append("transport " + ", ".join(self.transports))
        if self.channels is not None:
            parts.append(f"{self.channels} channels")
        if self.nvls_channels:
            parts.append(f"{self.nvls_channels} NVLS channels")
        if self.network:
            iface = f" via {', '.join(self.interfaces)}" if self.interfaces else ""
            parts.append(f"network {self.network}{iface}")
        if self.bootstrap:
            parts.append(f"bootstrap on {self.bootstrap}")
        if self.env:
            parts.append("set: " + " ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        if self.warnings:
            parts.append(f"{len(self.warnings)} warning(s), first: {self.warnings[0]}")
        return "; ".join(parts)


def _add(items: list[str], value: str) -> None:
    if value not in items:
        items.append(value)


def summarize(text: str) -> NcclSummary:
    """Read NCCL's INFO/WARN lines out of ``text`` (any mix of ranks and other output)."""
    s = NcclSummary()
    seen_channels: set[int] = set()
    for raw in text.splitlines():
        line = raw.rstrip()
        if "NCCL" not in line:
            continue
        if s.version is None and (m := _VERSION.search(line)):
            s.version = m.group(1)
        if m := _WARN.search(line):
            if len(s.warnings) < 10:
                _add(s.warnings, m.group(1).strip())
            continue
        if "NCCL INFO" not in line:
            continue
        if m := _NET.search(line):
            s.network = m.group(1)
        elif m := _IFACE.search(line):
            for item in _IFACE_ITEM.findall(m.group(2)):
                _add(s.interfaces, item)
        elif m := _BOOTSTRAP.search(line):
            s.bootstrap = m.group(1)
        elif m := _VIA.search(line):
            _add(s.transports, m.group(2))
            seen_channels.add(int(m.group(1)))
        elif m := _RING.search(line):
            seen_channels.add(int(m.group(1)))
        elif m := _COLL.search(line):
            s.channels = int(m.group(1))
            s.nvls_channels = int(m.group(2))
        elif m := _ENV.search(line):
            s.env[m.group(1)] = m.group(2).strip()
    if s.channels is None and seen_channels:
        s.channels = max(seen_channels) + 1
    return s
