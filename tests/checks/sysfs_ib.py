"""Fixture trees of /sys/class/infiniband in the kernel's layout and file formats
(Documentation/ABI/stable/sysfs-class-infiniband; drivers/infiniband/core/sysfs.c prints
``state`` as "%d: %s", ``phys_state`` as "%u: %s", ``rate`` as "%d%s Gb/sec (%dX%s)")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
PHYS = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
        "LinkErrorRecovery": 6}
COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
            "port_rcv_remote_physical_errors", "port_xmit_discards", "port_xmit_data",
            "port_rcv_data", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
            "VL15_dropped")


def add_port(root: Path, device: str, port: int = 1, *, state: str = "ACTIVE",
             phys: str = "LinkUp", rate: str = "400 Gb/sec (4X NDR)",
             link_layer: str = "InfiniBand", counters: Mapping[str, int] | None = None,
             gids: Mapping[int, tuple[str, str]] | None = None) -> Path:
    """One port of ``device`` under ``<root>/sys/class/infiniband``; returns its directory.

    As in sysfs, ``class/infiniband/<device>`` is a symlink into the PCI device's directory
    (``../../devices/pci0000:00/0000:00:01.0/0000:0c:00.0/infiniband/mlx5_0``)."""
    link = root / "sys" / "class" / "infiniband" / device
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        pci = f"0000:{0x0c + len(list(link.parent.iterdir())):02x}:00.0"
        real = root / "sys/devices/pci0000:00/0000:00:01.0" / pci / "infiniband" / device
        (real / "ports").mkdir(parents=True)
        link.symlink_to(Path("..", "..", real.relative_to(root / "sys")))
    dev = link
    (dev / "ports").mkdir(parents=True, exist_ok=True)
    (dev / "node_type").write_text("1: CA\n")
    (dev / "fw_ver").write_text("28.39.1002\n")
    p = dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True)
    (p / "state").write_text(f"{STATES[state]}: {state}\n")
    (p / "phys_state").write_text(f"{PHYS[phys]}: {phys}\n")
    (p / "rate").write_text(rate + "\n")
    (p / "link_layer").write_text(link_layer + "\n")
    (p / "lid").write_text("0x0\n" if link_layer == "Ethernet" else "0x1a\n")
    (p / "cap_mask").write_text("0x00010000\n")
    values = dict.fromkeys(COUNTERS, 0) | dict(counters or {})
    for name, value in values.items():
        (p / "counters" / name).write_text(f"{value}\n")
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (p / sub).mkdir(parents=True)
    for index, (gid, kind) in (gids or {}).items():
        (p / "gids" / str(index)).write_text(gid + "\n")
        (p / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
    return p


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
ROCE_GIDS = {0: ("fe80:0000:0000:0000:0e42:a1ff:fe2c:5e8a", "IB/RoCE v1"),
             1: ("fe80:0000:0000:0000:0e42:a1ff:fe2c:5e8a", "RoCE v2"),
             2: ("0000:0000:0000:0000:0000:ffff:0a00:0a07", "IB/RoCE v1"),
             3: ("0000:0000:0000:0000:0000:ffff:0a00:0a07", "RoCE v2")}
