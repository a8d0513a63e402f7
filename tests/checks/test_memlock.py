"""``memlock`` with real limits: the CLI runs in a child whose RLIMIT_MEMLOCK is set with
setrlimit (as ``ulimit -l`` or ``docker --ulimit`` would), on a made-up RDMA tree under --root."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.checks.memlock import judge
from preflight.core.result import Scope, Status
from preflight.probes.limits import MemlockLimit
from tests.helpers import REPO


def rdma_root(tmp_path: Path, *, ports: int = 1) -> Path:
    for p in range(1, ports + 1):
        port = tmp_path / "sys/class/infiniband/mlx5_0/ports" / str(p)
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    return tmp_path


def run_memlock(root: Path, limit: int, env: dict[str, str] | None = None) -> dict[str, object]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "preflight", "check", "--only", "memlock", "--json",
         "--root", str(root)],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), **(env or {})},
        preexec_fn=lower,
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)["results"][0]
    return result


def test_a_small_limit_on_an_rdma_node_warns_with_the_figure(tmp_path: Path) -> None:
    r = run_memlock(rdma_root(tmp_path), 64 * 1024)
    assert (r["status"], r["reason"], r["scope"]) == ("warn", "MemlockLimited", "node")
    assert "is 64 KiB (hard 64 KiB), expected unlimited" in str(r["message"])
    assert "--ulimit memlock=-1" in str(r["remedy"])
    assert r["details"] == {"soft_bytes": 65536, "hard_bytes": 65536, "rdma_ports": 1,
                            "reasons": ["MemlockLimited"]}


def test_without_rdma_or_with_ib_disabled_it_skips(tmp_path: Path) -> None:
    assert run_memlock(tmp_path, 64 * 1024)["reason"] == "NoRdma"
    r = run_memlock(rdma_root(tmp_path), 64 * 1024, env={"NCCL_IB_DISABLE": "1"})
    assert (r["status"], r["reason"]) == ("skip", "NoRdma")


def _can_unlimit() -> bool:
    """Raising RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE, which a container may lack even as root."""
    code = ("import resource; "
            "resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY,) * 2)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30,
                          check=False).returncode == 0


@pytest.mark.skipif(not _can_unlimit(), reason="cannot raise RLIMIT_MEMLOCK here "
                    "(no CAP_SYS_RESOURCE)")
def test_unlimited_passes(tmp_path: Path) -> None:
    r = run_memlock(rdma_root(tmp_path, ports=2), resource.RLIM_INFINITY)
    assert (r["status"], r["reason"]) == ("pass", "MemlockUnlimited")


def test_judge_is_pure() -> None:
    assert judge(MemlockLimit(None, None)) == []
    [finding] = judge(MemlockLimit(8 << 20, None))
    assert (finding.status, finding.scope) == (Status.WARN, Scope.NODE)
    assert "8 MiB (hard unlimited)" in finding.message
