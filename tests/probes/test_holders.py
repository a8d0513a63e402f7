"""Who holds a file: the pure parsers on literal /proc texts, then real processes holding real
files open, mapped, or deleted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from preflight.probes.holders import (
    FileId,
    Wanted,
    command_text,
    find_holders,
    job_of_cgroup,
    job_of_cgroups,
    parse_cgroup,
    parse_maps,
    parse_passwd,
    parse_stat,
    session_members,
)

HOLD_FILE = Path(__file__).with_name("hold_file.py")
Start = Callable[..., "subprocess.Popen[bytes]"]
POD = "0f9d3c2e-1b2a-4c3d-9e8f-0123456789ab"
CID = "0123456789abcdef" * 4


def test_maps_lines_name_device_inode_and_deletion() -> None:
    text = (b"55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0          [heap]\n"
            b"7f1c2a000000-7f1c2a400000 rw-s 00000000 00:1a 12345      /dev/shm/nccl-Ab1 "
            b"(deleted)\n"
            b"7f1c2b000000-7f1c2b001000 r--p 00002000 fd:01 998        /usr/lib/a b.so\n"
            b"garbage line\n")
    assert parse_maps(text) == [
        (FileId(os.makedev(0, 0x1a), 12345), "/dev/shm/nccl-Ab1", True),
        (FileId(os.makedev(0xfd, 1), 998), "/usr/lib/a b.so", False),
    ]


def test_stat_fields_after_a_command_name_with_parentheses() -> None:
    assert parse_stat(b"4242 (py (x) y) S 1 4240 4239 0 -1 4194560") == (1, 4240, 4239)
    assert parse_stat(b"4242 (py") is None
    assert parse_stat(b"") is None


def test_cgroup_paths_v2_first_and_hybrid_hosts() -> None:
    assert parse_cgroup(b"0::/system.slice/slurmstepd.scope/job_4242/step_0\n") == [
        "/system.slice/slurmstepd.scope/job_4242/step_0"]
    hybrid = b"9:name=systemd:/\n4:memory:/slurm/uid_1000/job_77/step_batch\n0::/\n"
    assert parse_cgroup(hybrid) == ["/slurm/uid_1000/job_77/step_batch"]
    assert job_of_cgroups(parse_cgroup(hybrid)) == ("/slurm/uid_1000/job_77/step_batch",
                                                    "Slurm job 77")
    assert job_of_cgroups([]) == ("", None)


@pytest.mark.parametrize(("path", "job"), [
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "Slurm job 4242"),
    ("/slurm/uid_1000/job_77/step_batch", "Slurm job 77"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}"
     f".slice/cri-containerd-{CID}.scope", f"Kubernetes pod {POD}"),
    (f"/kubepods/besteffort/pod{POD}/{CID}", f"Kubernetes pod {POD}"),
    (f"/system.slice/docker-{CID}.scope", "container 0123456789ab"),
    (f"/docker/{CID}", "container 0123456789ab"),
    ("/user.slice/user-1000.slice/session-3.scope", "login session 3 of uid 1000"),
    ("/system.slice/sshd.service", "systemd unit sshd.service"),
    ("/", None),
    ("/job_x/nothing", None),
])
def test_job_of_cgroup(path: str, job: str | None) -> None:
    assert job_of_cgroup(path) == job


def test_passwd_and_command_lines() -> None:
    assert parse_passwd(b"root:x:0:0::/root:/bin/sh\nbad\nalice:x:1000:1000::/h:/bin/sh\n"
                        b"alias:x:1000:1000::/h:/bin/sh\n") == {0: "root", 1000: "alice"}
    assert command_text(b"python\0-c\0\x1b[2Jprint()\0") == "python -c \\e[2Jprint()"
    assert command_text(b"", b"kworker/0:1\n") == "[kworker/0:1]"
    assert len(command_text(b"x" * 10000)) == 160


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Start]:
    """Start a process that holds ``path`` as asked (``open``, ``mmap``, ``deleted``)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(path: Path, how: str, size: int = 1 << 20) -> subprocess.Popen[bytes]:
        ready = tmp_path / f"ready-{len(procs)}"
        proc = subprocess.Popen([sys.executable, str(HOLD_FILE), str(path), how, str(size),
                                 str(ready)])
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "holder did not start"
            time.sleep(0.02)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("how", ["open", "mmap"])
def test_a_real_process_holding_a_file_is_found(tmp_path: Path, holder: Start,
                                                how: str) -> None:
    path = tmp_path / "seg"
    proc = holder(path, how)
    scan = find_holders("/proc", Wanted(files=frozenset({FileId.of(os.stat(path))})),
                        skip_pids=(os.getpid(),))
    assert [h.pid for h in scan.holders] == [proc.pid]
    found = scan.holders[0]
    assert found.uid == os.getuid() and "hold_file.py" in found.command
    assert [h.path for h in found.files] == [str(path)]
    assert (found.files[0].bytes is None) == (how == "mmap")  # a mapping has no size of its own
    assert scan.complete and scan.processes > 1


def test_a_deleted_file_is_found_through_its_filesystem(tmp_path: Path,
                                                       holder: Start) -> None:
    path = tmp_path / "seg"
    proc = holder(path, "deleted", size=3 << 20)
    scan = find_holders("/proc", Wanted(devices=frozenset({os.stat(tmp_path).st_dev})),
                        skip_pids=(os.getpid(),))
    mine = [h for h in scan.holders if h.pid == proc.pid]
    assert len(mine) == 1
    held = [f for f in mine[0].files if f.path == str(path)]
    assert held and held[0].deleted and held[0].bytes is not None and held[0].bytes >= 3 << 20


def test_nobody_holds_a_closed_file(tmp_path: Path) -> None:
    path = tmp_path / "left"
    path.write_bytes(b"x" * 4096)
    scan = find_holders("/proc", Wanted(files=frozenset({FileId.of(os.stat(path))})))
    assert scan.holders == () and scan.complete


def test_a_missing_proc_says_so(tmp_path: Path) -> None:
    scan = find_holders(tmp_path / "proc", Wanted())
    assert not scan.complete and scan.error and "cannot list" in scan.error


def test_session_members_include_a_process_that_changed_its_group() -> None:
    code = ("import os, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import os,time; os.setpgid(0, 0); "
            "time.sleep(60)'])\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while grandchild not in session_members("/proc", proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.pid in session_members("/proc", proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        with_members = session_members("/proc", proc.pid)
        for pid in with_members:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
