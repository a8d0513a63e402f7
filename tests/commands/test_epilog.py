"""`preflight epilog` on the real CLI: a real process left on the job's GPU (its pid in the NVML
fixture's compute-process list, as NVML would list it) and GPU memory not released drain the
node; another job's process does not; the job user's unheld /dev/shm files are removed, held
ones and other users' kept (a real tmpfs: /dev/shm itself, as root)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.commands.test_prolog import assert_promtool_ok
from tests.helpers import run_cli, write_fixture
from tests.slurmfakes import FakeSlurm, fake_slurm

NODE = "gpu017"
JOB = "4242"


def _unused_uid() -> int:
    """A uid that owns no file in /dev/shm and runs no process: the job's user for the /dev/shm
    tests. Derived from this run's pid, so two test runs that share /dev/shm (two checkouts
    tested at once on one machine) do not count each other's files as the job's."""
    def owner(path: str) -> int | None:
        try:
            return os.lstat(path).st_uid
        except OSError:  # gone since it was listed
            return None

    def used(uid: int) -> bool:
        try:
            paths = [f"/proc/{n}" for n in os.listdir("/proc") if n.isdigit()]
            paths += [e.path for e in os.scandir("/dev/shm")]
        except OSError:
            paths = []
        return any(owner(p) == uid for p in paths)

    uid = 50000 + os.getpid() % 10000
    while used(uid):
        uid = 50000 + (uid - 50000 + 7919) % 10000
    return uid


#: The job's user for the /dev/shm tests (see :func:`_unused_uid`).
JOB_UID = _unused_uid()


@pytest.fixture
def cluster(tmp_path: Path) -> FakeSlurm:
    return fake_slurm(tmp_path / "slurm", {f"gpu{i:03d}": ("IDLE", "") for i in range(10, 20)})


@pytest.fixture
def job_process() -> Iterator[int]:
    """A real process of job 4242 that outlived its job (SLURM_JOB_ID in its environment)."""
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, "SLURM_JOB_ID": JOB})
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _with(snap: GpuSnapshot, index: int, **changes: object) -> GpuSnapshot:
    gpus = list(snap.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(snap, gpus=tuple(gpus))


def _epilog(tmp_path: Path, slurm: FakeSlurm, snap: GpuSnapshot, *args: str,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    fixture = write_fixture(tmp_path / "nvml.json", snap)
    proc = run_cli(["epilog", *slurm.args(), *args], fixture=fixture,
                   env={"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": JOB, "SLURM_JOB_GPUS": "0,1",
                        "PREFLIGHT_STATE_DIR": str(tmp_path / "state"),
                        "PREFLIGHT_PROLOG_BUDGET_S": "30", **(env or {})})
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stderr


def test_a_clean_job_leaves_the_node_in_service(tmp_path: Path, cluster: FakeSlurm) -> None:
    rc, err = _epilog(tmp_path, cluster, topologies.healthy_8x_h100())
    assert (rc, cluster.calls()) == (0, [])
    assert err == ""


def test_a_process_left_on_the_jobs_gpu_and_memory_not_released_drain(
        tmp_path: Path, cluster: FakeSlurm, job_process: int) -> None:
    snap = _with(topologies.healthy_8x_h100(), 0, compute_pids=(job_process,))
    snap = _with(snap, 1, memory_used_bytes=6 << 30)
    prom = tmp_path / "epilog.prom"
    rc, err = _epilog(tmp_path, cluster, snap, "--prom-file", str(prom))
    assert rc == 1, err
    assert cluster.node(NODE)["reason"] == \
        "preflight: gpu_processes GpuProcessLeft, gpu_memory GpuMemoryNotReleased"
    assert (f"FAIL gpu_processes GpuProcessLeft (scope node): 1 compute process(es) still on "
            f"the job's GPUs after the job ended: GPU 0: pid {job_process} (sleep, uid "
            f"{os.getuid()}, job {JOB})") in err
    assert "GPU 1: 6144 MiB in use with no compute process" in err
    text = prom.read_text()
    assert 'preflight_slurm_drained{hook="epilog"} 1.0' in text
    assert 'preflight_slurm_gpu_leftover_processes{hook="epilog"} 1.0' in text
    # The epilog's file carries only its own series: it can sit beside the prolog's.
    assert "preflight_node_healthy" not in text and "preflight_check_status" not in text
    assert_promtool_ok(prom)


def test_another_jobs_process_is_not_this_jobs_leftover(tmp_path: Path,
                                                        cluster: FakeSlurm) -> None:
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, "SLURM_JOB_ID": "777"})
    try:
        snap = _with(topologies.healthy_8x_h100(), 0, compute_pids=(other.pid,))
        snap = _with(snap, 5, compute_pids=(other.pid,))  # not one of the job's GPUs
        rc, _ = _epilog(tmp_path, cluster, snap)
    finally:
        other.kill()
        other.wait()
    assert (rc, cluster.updates()) == (0, [])


def test_report_only_drains_nothing(tmp_path: Path, cluster: FakeSlurm, job_process: int) -> None:
    snap = _with(topologies.healthy_8x_h100(), 1, compute_pids=(job_process,))
    rc, err = _epilog(tmp_path, cluster, snap, "--report-only")
    assert (rc, cluster.updates()) == (0, [])
    assert "report-only: would drain gpu017 with reason 'preflight: gpu_processes " \
           "GpuProcessLeft'" in err


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not Path("/dev/shm").is_dir(),
                                reason="files of another uid in the real /dev/shm need root")


@pytest.fixture
def shm_files() -> Iterator[list[Path]]:
    """Four files in the real /dev/shm (a tmpfs): three of the job's user, one of root."""
    tag = f"preflight-epilog-test-{os.getpid()}"
    files = [Path(f"/dev/shm/{tag}-{n}") for n in ("nccl-a", "torch-b", "held-c", "root-d")]
    for f in files:
        f.write_bytes(b"\0" * 4096)
    for f in files[:3]:
        os.chown(f, JOB_UID, JOB_UID)
    try:
        yield files
    finally:
        for f in files:
            f.unlink(missing_ok=True)


def _holder(path: Path) -> subprocess.Popen[str]:
    """A real process that keeps ``path`` open (and says when it does)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys, time; f = open(sys.argv[1], 'rb'); print('open', "
                             "flush=True); time.sleep(300)", str(path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    return proc


@needs_root
def test_the_job_users_unheld_shm_files_are_removed_and_listed(
        tmp_path: Path, cluster: FakeSlurm, shm_files: list[Path]) -> None:
    holder = _holder(shm_files[2])
    try:
        prom = tmp_path / "e.prom"
        rc, err = _epilog(tmp_path, cluster, topologies.healthy_8x_h100(), "--report-only",
                          env={"SLURM_JOB_UID": str(JOB_UID)})
        assert rc == 0 and all(f.exists() for f in shm_files)
        assert f"report-only: would remove 2 file(s) of uid {JOB_UID}" in err
        rc, err = _epilog(tmp_path, cluster, topologies.healthy_8x_h100(),
                          "--prom-file", str(prom), env={"SLURM_JOB_UID": str(JOB_UID)})
    finally:
        holder.kill()
        holder.wait()
    assert rc == 0, err
    assert [f.exists() for f in shm_files] == [False, False, True, True]
    assert (f"removed 2 file(s) of uid {JOB_UID} that no process held from /dev/shm: "
            f"{shm_files[0].name}, {shm_files[1].name}; kept 1 that a process holds") in err
    assert 'preflight_slurm_shm_files_removed{hook="epilog"} 2.0' in prom.read_text()


@needs_root
def test_a_file_held_under_another_name_is_kept(tmp_path: Path, cluster: FakeSlurm,
                                                 shm_files: list[Path]) -> None:
    """A holder is known by the file's device and inode, not its path: a process that opened
    the file through a hard link in a subdirectory still holds it."""
    alias_dir = shm_files[0].with_name(shm_files[0].name + "-dir")
    alias_dir.mkdir()
    alias = alias_dir / "alias"
    os.link(shm_files[0], alias)
    holder = _holder(alias)
    try:
        rc, err = _epilog(tmp_path, cluster, topologies.healthy_8x_h100(),
                          env={"SLURM_JOB_UID": str(JOB_UID)})
    finally:
        holder.kill()
        holder.wait()
        alias.unlink()
        alias_dir.rmdir()
    assert rc == 0, err
    assert [f.exists() for f in shm_files] == [True, False, False, True]
    assert "removed 2 file(s)" in err and "kept 1 that a process holds" in err


@needs_root
def test_nothing_is_removed_while_the_user_still_runs_a_process(
        tmp_path: Path, cluster: FakeSlurm, shm_files: list[Path]) -> None:
    def become_job_user() -> None:
        os.setgid(JOB_UID)
        os.setuid(JOB_UID)

    still = subprocess.Popen(["sleep", "300"], preexec_fn=become_job_user)  # noqa: PLW1509
    try:
        time.sleep(0.1)
        rc, _ = _epilog(tmp_path, cluster, topologies.healthy_8x_h100(),
                          env={"SLURM_JOB_UID": str(JOB_UID)})
    finally:
        still.kill()
        still.wait()
    assert rc == 0 and all(f.exists() for f in shm_files)
    assert cluster.updates() == []


def test_epilog_help_teaches() -> None:
    proc = run_cli(["epilog", "--help"])
    assert proc.returncode == 0 and "``" not in proc.stdout
    for words in ("/dev/shm", "--bandwidth", "--report-only", "GpuProcessLeft",
                  "SLURM_JOB_UID"):
        assert words in proc.stdout


def test_bandwidth_runs_the_gpu_tests_on_the_idle_gpus(tmp_path: Path,
                                                       cluster: FakeSlurm) -> None:
    """--bandwidth: gpu_speed's workers (the cpu plumbing engine here) run after the job; their
    verdict joins the epilog's."""
    prom = tmp_path / "e.prom"
    rc, err = _epilog(tmp_path, cluster, topologies.single_h200_vm(), "--bandwidth",
                      "--prom-file", str(prom),
                      env={"PREFLIGHT_GPU_SPEED_ENGINE": "cpu", "PREFLIGHT_PROLOG_BUDGET_S": "30",
                           "SLURM_JOB_GPUS": "0"})
    assert (rc, cluster.calls()) == (0, []), err
    text = prom.read_text()
    assert 'check="gpu_speed",hook="epilog",reason="GpuSpeedOk"' in text
    assert 'check="allreduce",hook="epilog",reason="NotEnoughGpus"' in text
