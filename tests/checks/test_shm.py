"""/dev/shm against real filesystems: the machine's own and small tmpfs mounts in a private mount
namespace (``unshare -m``, needs root), seen through ``--root``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.checks import shm
from preflight.core.result import Status
from tests.conftest import MakeCtx
from tests.helpers import REPO

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare for a private tmpfs mount")


def test_need_grows_with_local_peers() -> None:
    assert shm.need_bytes(1, channels=16, floor_bytes=1 << 30) == 1 << 30
    assert shm.need_bytes(8, channels=16, floor_bytes=1 << 30) == 9_637_888 * 16 * 7
    assert shm.need_bytes(8, channels=32, floor_bytes=0) == 9_637_888 * 32 * 7


def test_machine_dev_shm_is_judged_and_left_clean(make_ctx: MakeCtx) -> None:
    before = set(os.listdir("/dev/shm"))
    r = shm.run(make_ctx(shm_min_bytes=0))
    assert r.status is Status.PASS
    assert r.details["size_bytes"] > 0
    assert set(os.listdir("/dev/shm")) == before  # the probe file is gone


def test_missing_dev_shm(make_ctx: MakeCtx, tmp_path: Path) -> None:
    r = shm.run(make_ctx(root=tmp_path))
    assert (r.status, r.reason) == (Status.FAIL, "ShmMissing")


def _in_private_tmpfs(tmp_path: Path, mount_opts: str, *args: str,
                      fill_bytes: int = 0) -> subprocess.CompletedProcess[str]:
    """Mount a tmpfs at <tmp>/dev/shm in a new mount namespace and run preflight there."""
    shm_dir = tmp_path / "dev" / "shm"
    shm_dir.mkdir(parents=True)
    fill = f"head -c {fill_bytes} /dev/zero > {shm_dir}/ballast && " if fill_bytes else ""
    remount = f"mount -o remount,ro {shm_dir} && " if "ro" in mount_opts.split(",") else ""
    opts = ",".join(o for o in mount_opts.split(",") if o != "ro")
    script = (f"mount -t tmpfs -o {opts} tmpfs {shm_dir} && {fill}{remount}"
              f'exec "$0" -m preflight check --only shm --json --root {tmp_path} "$@"')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           sys.executable, *args], capture_output=True, text=True, timeout=60,
                          env=env, check=False)


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    import json

    data = json.loads(proc.stdout)
    result: dict[str, object] = data["results"][0]
    return result


@needs_root
@pytest.mark.parametrize(("mount", "gpus", "fill_bytes", "reason", "words"), [
    ("size=64m", "4", 0, "ShmTooSmall", "64 MiB (the Docker default)"),
    ("size=1100m", "2", 600 << 20, "ShmFull", "free of 1.1 GiB"),
    ("size=2g,ro", "1", 0, "ShmNotWritable", "Read-only file system"),
])
def test_a_bad_tmpfs_fails_naming_what_is_wrong(tmp_path: Path, mount: str, gpus: str,
                                                fill_bytes: int, reason: str, words: str) -> None:
    proc = _in_private_tmpfs(tmp_path, mount, "--expect-gpus", gpus, fill_bytes=fill_bytes)
    assert proc.returncode == 1, proc.stderr
    r = _result(proc)
    assert (r["reason"], r["scope"]) == (reason, "node")
    assert words in str(r["message"])
    assert "--shm-size" in str(r["remedy"]) or reason == "ShmNotWritable"
    if reason == "ShmTooSmall":
        assert "medium: Memory" in str(r["remedy"])


@needs_root
def test_big_enough_tmpfs_passes(tmp_path: Path) -> None:
    proc = _in_private_tmpfs(tmp_path, "size=1100m", "--expect-gpus", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _result(proc)["status"] == "pass"
