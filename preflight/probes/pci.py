"""PCI bus id helpers (pure)."""

from __future__ import annotations

import re

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(bus_id: str) -> str:
    """Canonical ``dddd:bb:dd.f`` lower-case form of a PCI bus id.

    NVML prints an 8-digit domain (``00000000:07:00.0``), CUDA and sysfs a 4-digit one
    (``0000:07:00.0``); comparing them needs one form. Unparseable input is returned lower-cased.
    """
    text = bus_id.strip()
    m = _BUS_ID.match(text)
    if not m:
        return text.lower()
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"
