"""Every check on one fixture node, end to end, against golden files (as node_exporter's
end-to-end test runs its collectors over a fixture /proc and /sys).

The node: ``tests/e2e/root/`` (RDMA ports under sys/class/infiniband, a kernel log at dev/kmsg,
proc/uptime, a site check and a training venv's interpreter) mounted as ``--root``, the replayed
NVML snapshot of a one-H200 VM, a recorded gpu_speed run, the environment of rank 0 of a 2-node
torchrun job, and private namespaces (tests/e2e/inside.py): a 2 GiB tmpfs at dev/shm, a veth pair
for the network, a 64 KiB locked-memory limit. The real CLI writes the JSON report and the
metrics; both are compared with tests/e2e/golden/ after the run-dependent values (times, host,
the tree's own path) are replaced. Refresh with ``pytest --update-golden`` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import preflight
from preflight.checks import CHECKS
from tests.helpers import REPO

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs root, unshare and ip (private mount and network namespaces)")

#: Rank 0 of torchrun --nnodes=2 --nproc-per-node=1, NCCL pinned to eth0 and mlx5_0.
JOB = {
    "TORCHELASTIC_RUN_ID": "e2e", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "0",
    "ROLE_WORLD_SIZE": "2", "MASTER_ADDR": "10.10.0.2", "MASTER_PORT": "29500",
    "CUDA_VISIBLE_DEVICES": "0", "NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_HCA": "=mlx5_0",
    "NCCL_ALGO": "Ring",
}


def _run_node(tmp_path: Path) -> tuple[int, dict[str, Any], str, Path]:
    root = tmp_path / "root"
    shutil.copytree(HERE / "root", root, symlinks=True)
    (root / "dev" / "shm").mkdir()
    config = tmp_path / "preflight.yaml"
    config.write_text(json.dumps({
        "fabric_counter_interval_s": 0,
        "site_checks": [{"name": "lustre", "path": f"{root}/opt/site/lustre-mounted",
                         "args": [f"{root}/lustre"], "timeout_s": 5, "reason": "LustreMissing",
                         "summary": "the parallel file system is mounted"}]}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "LANG": "C.UTF-8", "HOME": str(tmp_path),
           "PREFLIGHT_NVML_FIXTURE": str(REPO / "tests" / "fixtures" / "nvml_h200_vm.json"),
           "PREFLIGHT_GPU_SPEED_FIXTURE": str(HERE / "gpu-speed-run.json"), **JOB}
    metrics = tmp_path / "metrics.prom"
    argv = ["unshare", "--mount", "--net", "--propagation", "private", "--",
            sys.executable, str(HERE / "inside.py"), str(root), "--",
            sys.executable, "-m", "preflight", "check", "--json", "--root", str(root),
            "--config", str(config), "--python", f"{root}/opt/venv/bin/python",
            "--prom-file", str(metrics)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                          check=False, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), metrics.read_text(), root


def _report(data: dict[str, Any], root: Path) -> dict[str, Any]:
    text = json.dumps(data).replace(str(root), "ROOT")
    data = json.loads(text)
    data.update(host="HOST", timestamp_s=0, version="VERSION")
    for r in data["results"]:
        r["duration_s"] = 0
    meta = data["fingerprint"]["meta"]
    meta.update(host="HOST", created_s=0, preflight_version="VERSION")
    return data


def _metrics(text: str, root: Path) -> str:
    text = text.replace(str(root), "ROOT")
    text = text.replace(f'version="{preflight.__version__}"', 'version="VERSION"')
    # run-dependent values: durations and the run's own timestamps
    return re.sub(r"^(preflight_(check_duration_seconds|last_run_timestamp_seconds)\S*) \S+$",
                  r"\1 0", text, flags=re.MULTILINE)


def _compare(path: Path, got: str, update: bool) -> None:
    if update:
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
    assert got == path.read_text(), f"run pytest --update-golden and review {path.name}'s diff"


def test_every_check_on_the_fixture_node(tmp_path: Path, update_golden: bool) -> None:
    rc, data, metrics, root = _run_node(tmp_path)
    report = _report(data, root)
    checks = [r["check"] for r in report["results"]]
    assert checks == [*(c.name for c in CHECKS), "lustre"]  # every check, the site one last
    _compare(GOLDEN / "node.json", json.dumps(report, indent=2, sort_keys=True) + "\n",
             update_golden)
    _compare(GOLDEN / "node.prom", _metrics(metrics, root), update_golden)
    assert rc == int(report["status"] == "fail")  # a WARN node exits 0
