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


def _in_private_tmpfs(tmp_path: Path, mount_opts: str, *args: str, fill_bytes: int = 0,
                      setup: str = "", cleanup: str = "",
                      env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Mount a tmpfs at <tmp>/dev/shm in a new mount namespace and run preflight there, with the
    machine's /proc under the root (as a container mounts the host's). ``setup`` runs after the
    mount (``$SHM`` is the tmpfs), ``cleanup`` after preflight."""
    shm_dir = tmp_path / "dev" / "shm"
    shm_dir.mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "etc").mkdir()
    shutil.copyfile("/etc/passwd", tmp_path / "etc" / "passwd")  # user names, as on the host
    fill = f"head -c {fill_bytes} /dev/zero > {shm_dir}/ballast && " if fill_bytes else ""
    remount = f"mount -o remount,ro {shm_dir} && " if "ro" in mount_opts.split(",") else ""
    opts = ",".join(o for o in mount_opts.split(",") if o != "ro")
    script = (f"mount -t tmpfs -o {opts} tmpfs {shm_dir} && "
              f"mount --bind /proc {tmp_path}/proc && {fill}{setup}{remount}"
              f'"$0" -m preflight check --only shm --json --root {tmp_path} "$@"; rc=$?; '
              f"{cleanup}exit $rc")
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "SHM": str(shm_dir), **(env or {})}
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           sys.executable, *args], capture_output=True, text=True, timeout=60,
                          env=full_env, check=False)


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    import json

    data = json.loads(proc.stdout)
    result: dict[str, object] = data["results"][0]
    return result


@needs_root
@pytest.mark.parametrize(("mount", "gpus", "fill_bytes", "reason", "words"), [
    ("size=64m", "4", 0, "ShmTooSmall", "64 MiB (the Docker default)"),
    ("size=1100m", "2", 600 << 20, "ShmFull",
     "1 file that no running process holds takes 600 MiB: ballast (600 MiB)"),
    ("size=2g,ro", "1", 0, "ShmNotWritable", "Read-only file system"),
])
def test_a_bad_tmpfs_fails_naming_what_is_wrong(tmp_path: Path, mount: str, gpus: str,
                                                fill_bytes: int, reason: str, words: str) -> None:
    proc = _in_private_tmpfs(tmp_path, mount, "--expect-gpus", gpus, fill_bytes=fill_bytes)
    assert proc.returncode == 1, proc.stderr
    r = _result(proc)
    assert (r["reason"], r["scope"]) == (reason, "node")
    assert words in str(r["message"])
    assert "--shm-size" in str(r["remedy"]) or reason != "ShmTooSmall"
    if reason == "ShmTooSmall":
        assert "medium: Memory" in str(r["remedy"])


@needs_root
def test_big_enough_tmpfs_passes(tmp_path: Path) -> None:
    proc = _in_private_tmpfs(tmp_path, "size=1100m", "--expect-gpus", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _result(proc)["status"] == "pass"


HOLD_FILE = REPO / "tests" / "probes" / "hold_file.py"


def _holder(how: str, name: str, size: int, *, cgroup: Path | None = None) -> tuple[str, str]:
    """Shell that starts hold_file.py on $SHM/name (optionally moved into ``cgroup``), waits
    until it holds the file, and the shell that ends it."""
    ready = f"$SHM/../ready-{name}"
    start = (f"{sys.executable} {HOLD_FILE} $SHM/{name} {how} {size} {ready} & HOLDER=$!; "
             f"i=0; while [ ! -e {ready} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
             "echo $HOLDER > $SHM/../holder.pid; ")
    if cgroup is not None:
        start += f"mkdir -p {cgroup} && echo $HOLDER > {cgroup}/cgroup.procs && "
    stop = "kill -9 $HOLDER; wait $HOLDER 2>/dev/null; "
    if cgroup is not None:
        stop += f"rmdir {cgroup} {cgroup.parent}; "
    return start, stop


def _job_cgroup(name: str) -> Path | None:
    """A writable cgroup directory path .../preflight-test-PID/job_777 (v2, else v1 pids)."""
    for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"),
                 Path("/sys/fs/cgroup/pids")):
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            return base / f"preflight-test-{os.getpid()}-{name}" / "job_777"
    return None


#: A 48 MiB tmpfs that must have 40 MiB free: small, so a loaded CI machine fills it in no time.
SMALL = {"PREFLIGHT_SHM_MIN_BYTES": str(40 << 20)}


@needs_root
@pytest.mark.parametrize("how", ["open", "mmap", "deleted"])
def test_space_a_live_process_holds_warns_naming_it_and_never_fails(tmp_path: Path,
                                                                     how: str) -> None:
    """A running job's DataLoader (deleted files held open), NCCL segments (mapped) or plain
    open files fill /dev/shm: not the node's fault, so no FAIL (a prolog would drain)."""
    cgroup = _job_cgroup(how)
    start, stop = _holder(how, "torch_4242_x", 20 << 20, cgroup=cgroup)
    proc = _in_private_tmpfs(tmp_path, "size=48m", "--expect-gpus", "1", setup=start,
                             cleanup=stop, env=SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = _result(proc)
    assert (r["status"], r["reason"], r["scope"]) == ("warn", "ShmBusy", "job"), r["message"]
    pid = (tmp_path / "dev" / "holder.pid").read_text().strip()
    message = str(r["message"])
    assert f"pid {pid} (" in message and "hold_file.py" in message
    assert "of root (uid 0)" in message and ": 20 MiB" in message
    if cgroup is not None:
        assert "Slurm job 777" in message
    assert "Not the node's fault" in str(r["remedy"])


@needs_root
def test_leftovers_fail_listing_them_while_a_live_holder_is_named_too(tmp_path: Path) -> None:
    start, stop = _holder("open", "torch_live", 4 << 20)
    setup = (f"{start}head -c {20 << 20} /dev/zero > $SHM/nccl-dead01 && "
             "mkdir $SHM/sub && head -c 1048576 /dev/zero > $SHM/sub/left && ")
    proc = _in_private_tmpfs(tmp_path, "size=48m", "--expect-gpus", "1", setup=setup,
                             cleanup=stop, env=SMALL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    r = _result(proc)
    assert (r["reason"], r["scope"]) == ("ShmFull", "node")
    assert "2 files that no running process holds take 21 MiB: nccl-dead01 (20 MiB), " \
           "sub/left (1 MiB); running processes hold 4 MiB more" in str(r["message"])
    assert f"rm -f {tmp_path}/dev/shm/nccl-dead01 {tmp_path}/dev/shm/sub/left" \
        in str(r["remedy"])


@needs_root
def test_a_completely_full_shm_is_judged_by_evidence_too(tmp_path: Path) -> None:
    """Not even the 4 KiB probe fits (every page held by a live process): still a WARN."""
    start, stop = _holder("deleted", "torch_all", 48 << 20)
    proc = _in_private_tmpfs(tmp_path, "size=48m", "--expect-gpus", "1", setup=start,
                             cleanup=stop, env=SMALL)
    r = _result(proc)
    assert (r["reason"], r["scope"]) == ("ShmBusy", "job"), r["message"]
    assert "has 0 B free of 48 MiB" in str(r["message"])
