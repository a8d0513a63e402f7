"""Files under ``--root`` that are not what they should be: a FIFO where a sysfs attribute or
``/proc/uptime`` belongs, a FIFO at ``/dev/kmsg``, a 3 GB sparse file as an attribute. Each is
refused unread (bounded memory, no blocking), and the checks say what they could not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from preflight.core.boundedio import BoundedReadError, read_small, read_small_text
from preflight.probes.nvml import scan_pci_gpus
from tests.helpers import PEAK_RSS_LAUNCHER, REPO

#: The CLI's resident memory must stay far below the 3 GB file (it measured ~30 MB).
MAX_RSS_BYTES = 400 << 20


def hostile_root(root: Path) -> Path:
    """A --root tree whose files are traps (FIFOs, a 3 GB sparse file)."""
    port = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    os.mkfifo(port / "state")  # nobody writes it: a plain read blocks for ever
    with (port / "rate").open("wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GB to read_text, nothing on disk
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (root / "proc").mkdir()
    os.mkfifo(root / "proc" / "uptime")
    (root / "dev" / "shm").mkdir(parents=True)
    os.mkfifo(root / "dev" / "kmsg")
    return root


def _run_measured(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str],
                                                           int]:
    """Run the CLI; return its result and its peak resident memory in bytes."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")},
           "PYTHONPATH": str(REPO)}
    rss_file = tmp_path / "peak-rss"
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS_LAUNCHER, str(rss_file), sys.executable,
                           "-m", "preflight", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    return proc, int(rss_file.read_text())


def test_a_hostile_sysfs_tree_is_refused_unread(tmp_path: Path) -> None:
    root = hostile_root(tmp_path / "root")
    proc, rss = _run_measured(["check", "--json", "--no-bandwidth", "--expect-gpus", "0",
                               "--only", "fabric,xid,memlock,nccl_env", "--root", str(root)],
                              tmp_path)
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    by = {r["check"]: r for r in report["results"]}
    assert rss < MAX_RSS_BYTES, rss
    assert "is a FIFO" in by["xid"]["message"]
    # The port's state (a FIFO) and rate (3 GB) are unreadable: the port is not ACTIVE.
    port = by["fabric"]["details"]["ports"][0]
    assert port["state"] != "ACTIVE" and port["rate_gbps"] is None


def test_read_small_refuses_fifos_devices_and_big_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BoundedReadError, match="is a FIFO"):
        read_small(fifo)
    with pytest.raises(BoundedReadError, match="is a device"):
        read_small("/dev/zero")
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(3 << 30)
    with pytest.raises(BoundedReadError, match="more than the 65536 bytes"):
        read_small(big)
    assert read_small(big, max_bytes=10, cut=True) == b"\0" * 10
    (tmp_path / "attr").write_bytes(b" 400 Gb/sec (4X NDR)\n\xff")
    assert read_small_text(tmp_path / "attr") == "400 Gb/sec (4X NDR)\n\ufffd"


def test_a_proc_file_that_grows_past_the_limit_is_refused(tmp_path: Path) -> None:
    """procfs reports st_size 0: the limit holds on what is read, not on what stat says."""
    data = read_small("/proc/self/status")
    assert b"Pid:" in data
    with pytest.raises(BoundedReadError, match="more than the 16 bytes"):
        read_small("/proc/self/status", max_bytes=16)


def _pci_device(devices: Path, bus_id: str, vendor: str = "0x10de\n",
                klass: str = "0x030200\n") -> Path:
    dev = devices / bus_id
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor)
    (dev / "class").write_text(klass)
    return dev


def test_the_pci_scan_skips_trap_attributes_unread(tmp_path: Path) -> None:
    """``scan_pci_gpus`` under a --root whose PCI attributes are a FIFO nobody writes and a
    256 MiB sparse file: both devices are skipped at once, memory stays small, the real GPUs
    are still found."""
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    _pci_device(devices, "0000:18:00.0")
    _pci_device(devices, "0000:2a:00.0", klass="0x030000\n")  # a VGA controller counts too
    _pci_device(devices, "0000:00:1f.0", vendor="0x8086\n", klass="0x060100\n")
    fifo = _pci_device(devices, "0000:3b:00.0")
    (fifo / "vendor").unlink()
    os.mkfifo(fifo / "vendor")
    big = _pci_device(devices, "0000:4c:00.0")
    with (big / "class").open("wb") as f:
        f.truncate(256 << 20)
    found: list[tuple[str, ...]] = []
    tracemalloc.start()
    try:
        worker = threading.Thread(target=lambda: found.append(scan_pci_gpus(tmp_path / "sys")),
                                  daemon=True)
        worker.start()
        worker.join(30)  # a blocking open of the FIFO would never return
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not worker.is_alive(), "scan_pci_gpus blocked on the FIFO"
    assert found == [("0000:18:00.0", "0000:2a:00.0")]
    assert peak < 4 << 20, peak  # the 256 MiB file was not read
