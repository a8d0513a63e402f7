"""Real network namespaces for the network tests: ``ip netns`` + veth pairs.

Each topology is a namespace holding the interfaces under test; the peer end of every veth lives
in a second namespace, so links are RUNNING (carrier) and routes to the peers' addresses are real.
The check runs inside the namespace as a subprocess: ``ip netns exec NS python -m preflight check``.
Namespaces are deleted in teardown even when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2 (CI runs as root)")


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, timeout=10, capture_output=True)


@dataclass
class Topology:
    """A namespace under test (``ns``) and the namespace holding the veth peers (``peer``)."""

    ns: str
    peer: str
    created: list[str] = field(default_factory=list)

    def link(self, name: str, addrs: Sequence[str] = (), peer_addrs: Sequence[str] = (), *,
             up: bool = True, carrier: bool = True) -> None:
        """A veth ``name`` in ns (peer ``p<name>`` in the peer ns) with addresses (CIDR)."""
        pname = f"p{name}"[:15]
        ip("-n", self.ns, "link", "add", name, "type", "veth", "peer", "name", pname,
           "netns", self.peer)
        for a in addrs:
            ip("-n", self.ns, "addr", "add", a, "dev", name, *(["nodad"] if ":" in a else []))
        for a in peer_addrs:
            ip("-n", self.peer, "addr", "add", a, "dev", pname, *(["nodad"] if ":" in a else []))
        if carrier:
            ip("-n", self.peer, "link", "set", pname, "up")
        if up:
            ip("-n", self.ns, "link", "set", name, "up")
        if up and carrier:
            self.wait_running(name)

    def wait_running(self, name: str, timeout_s: float = 5.0) -> None:
        """Wait until the kernel reports the link up with carrier (IFF_RUNNING), as NCCL needs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(["ip", "-n", self.ns, "-o", "link", "show", "dev", name],
                                 capture_output=True, text=True, timeout=10, check=True).stdout
            if "state UP" in out:
                return
            time.sleep(0.02)
        raise AssertionError(f"{name} in {self.ns} did not become RUNNING in {timeout_s} s")

    def route(self, *argv: str) -> None:
        ip("-n", self.ns, "route", *argv)

    def check(self, env: Mapping[str, str] | None = None, *args: str,
              only: str = "network,master_port") -> tuple[int, dict[str, Any]]:
        """Run ``preflight check --json`` inside the namespace; (exit code, {check: result})."""
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root",
                    "PYTHONPATH": str(REPO), **(env or {})}
        proc = subprocess.run(
            ["ip", "netns", "exec", self.ns, sys.executable, "-m", "preflight", "check",
             "--only", only, "--json", *args],
            env=full_env, cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        report = json.loads(proc.stdout)
        return proc.returncode, {r["check"]: r for r in report["results"]}


@pytest.fixture
def netns() -> Iterator[Any]:
    """Factory: ``netns()`` -> a fresh Topology with lo up; all are deleted at teardown."""
    made: list[str] = []
    counter = iter(range(1000))

    def make() -> Topology:
        n = next(counter)
        topo = Topology(f"pft{os.getpid()}-{n}", f"pfp{os.getpid()}-{n}")
        for name in (topo.ns, topo.peer):
            ip("netns", "add", name)
            made.append(name)
        ip("-n", topo.ns, "link", "set", "lo", "up")
        ip("-n", topo.peer, "link", "set", "lo", "up")
        return topo

    try:
        yield make
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], timeout=10, capture_output=True,
                           check=False)
