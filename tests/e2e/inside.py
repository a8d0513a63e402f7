"""Run a command as on the fixture node: in private mount and network namespaces (``unshare -mn``,
root), with ROOT/dev/shm a 2 GiB tmpfs, lo and a veth pair eth0 (10.10.0.2/24) <-> eth1 up, and
RLIMIT_MEMLOCK at 64 KiB, so every fact the checks read is the fixture's, not this machine's.

Usage: unshare --mount --net --propagation private -- python inside.py ROOT -- COMMAND...
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, timeout=30, capture_output=True)


def main(root: str, command: list[str]) -> None:
    run("mount", "-t", "tmpfs", "-o", "size=2g,mode=1777", "tmpfs", f"{root}/dev/shm")
    run("ip", "link", "set", "lo", "up")
    run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
    run("ip", "addr", "add", "10.10.0.2/24", "dev", "eth0")
    run("ip", "addr", "add", "10.10.0.3/24", "dev", "eth1")
    run("ip", "link", "set", "eth1", "up")
    run("ip", "link", "set", "eth0", "up")
    give_up = time.monotonic() + 20
    while b"LOWER_UP" not in subprocess.run(["ip", "-o", "link", "show", "eth0"], check=True,
                                            capture_output=True, timeout=10).stdout:
        if time.monotonic() > give_up:
            raise SystemExit("eth0 has no carrier after 20 s")
        time.sleep(0.05)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
    os.execvp(command[0], command)


if __name__ == "__main__":
    sep = sys.argv.index("--")
    main(sys.argv[1], sys.argv[sep + 1:])
