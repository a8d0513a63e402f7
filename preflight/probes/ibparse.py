"""The text of ``/sys/class/infiniband/<dev>/ports/<n>/*`` files (pure).

Formats, from the kernel (Documentation/ABI/stable/sysfs-class-infiniband and
drivers/infiniband/core/sysfs.c):

* ``state``: ``"4: ACTIVE"`` (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).
* ``phys_state``: ``"5: LinkUp"`` (1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining,
  5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test).
* ``rate``: ``"%d%s Gb/sec (%dX%s)"``, e.g. ``"400 Gb/sec (4X NDR)"``, ``"2.5 Gb/sec (1X SDR)"``,
  ``"10 Gb/sec (4X)"`` (the speed name can be missing).
* ``link_layer``: ``InfiniBand`` or ``Ethernet`` (RoCE).
* ``counters/<name>``: a decimal number.
* ``gids/<i>``: ``"fe80:0000:0000:0000:0202:c9ff:fe03:1234"`` (all zero = empty slot);
  ``gid_attrs/types/<i>``: ``"IB/RoCE v1"`` or ``"RoCE v2"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RATE = re.compile(r"^\s*(\d{1,7}(?:\.\d{1,3})?) Gb/sec \((\d{1,3})X ?([A-Za-z0-9]*)\)\s*$")
#: Counters whose growth means bit errors or a flapping link (sysfs-class-infiniband, counters).
ERROR_COUNTERS = (
    "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "port_rcv_constraint_errors",
    "port_xmit_constraint_errors", "VL15_dropped",
)
#: Of those, the ones that mean the link itself went down or retrained.
LINK_COUNTERS = ("link_downed", "link_error_recovery")


@dataclass(frozen=True)
class Rate:
    """A port's trained rate: ``gbps`` (Gb/s = 1e9 bit/s), lanes, speed name (``NDR``)."""

    gbps: float
    width: int
    speed: str

    @property
    def bytes_per_second(self) -> float:
        return self.gbps * 1e9 / 8


def parse_rate(text: str) -> Rate | None:
    """``"400 Gb/sec (4X NDR)"`` -> Rate(400.0, 4, "NDR"); None for anything else."""
    m = _RATE.match(text)
    if m is None:
        return None
    return Rate(float(m.group(1)), int(m.group(2)), m.group(3))


def parse_numbered(text: str) -> tuple[int | None, str]:
    """``"5: LinkUp"`` -> (5, "LinkUp"); text without a number -> (None, the text)."""
    num, sep, word = text.strip().partition(":")
    if sep and num.strip().isdigit():
        return int(num), word.strip()
    return None, text.strip()


def parse_ib_state(text: str) -> str:
    """``"4: ACTIVE\\n"`` -> ``"ACTIVE"`` (a port's ``state``); unknown text -> stripped text."""
    _, _, word = text.strip().partition(":")
    return (word or text).strip().upper()


def parse_counter(text: str) -> int | None:
    """A counter file's value; None when it is not a number (some drivers print N/A)."""
    value = text.strip()
    return int(value) if value.isdigit() else None


def gid_is_empty(gid: str) -> bool:
    """An unused GID table slot reads as all zeroes."""
    digits = gid.replace(":", "").strip()
    return not digits or set(digits) == {"0"}


def roce_version(gid_type: str) -> int | None:
    """``"RoCE v2"`` -> 2, ``"IB/RoCE v1"`` -> 1, else None."""
    m = re.search(r"v(\d)\s*$", gid_type.strip())
    return int(m.group(1)) if m else None


__all__ = ["ERROR_COUNTERS", "LINK_COUNTERS", "Rate", "gid_is_empty", "parse_counter",
           "parse_ib_state", "parse_numbered", "parse_rate", "roce_version"]
