"""Files under ``--root`` that are not what they should be: a FIFO where a sysfs attribute or
``/proc/uptime`` belongs, a FIFO at ``/dev/kmsg``, a 3 GB sparse file as an attribute. Each is
refused unread (bounded memory, no blocking), and the checks say what they could not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preflight.core.boundedio import BoundedReadError, read_small, read_small_text
from tests.helpers import REPO

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
    """Run the CLI; return its result and its peak resident memory in bytes (wait4's rusage)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")},
           "PYTHONPATH": str(REPO)}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as o, err.open("wb") as e:
        pid = subprocess.Popen([sys.executable, "-m", "preflight", *args], env=env,
                               stdout=o, stderr=e).pid
    deadline = time.monotonic() + 60
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            raise AssertionError("preflight check did not finish within 60 s")
        time.sleep(0.05)
    return (subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(status), out.read_text(),
                                        err.read_text()), usage.ru_maxrss * 1024)


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
