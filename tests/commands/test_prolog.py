"""`preflight prolog` as slurmd runs it, the real CLI against a stand-in cluster (tests/slurmfakes):
a bad node is drained with the check's reason and exit 1; warnings, a job's own mistakes and
undecided runs let the job go; --report-only drains nothing; the fleet guard holds a drain back;
--resume resumes only what preflight drained, after resume_after passing runs; the run ends
within its budget whatever hangs. tests/slurm does the same against a real slurmctld."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.helpers import REPO, run_cli, write_fixture
from tests.slurmfakes import FakeSlurm, fake_slurm
from tests.slurmfakes import persistence_daemon as fake_persistence_daemon

NODE = "gpu017"
SKIP = "network,master_port,versions"


@pytest.fixture
def cluster(tmp_path: Path) -> FakeSlurm:
    """Ten idle nodes, this one among them."""
    return fake_slurm(tmp_path / "slurm", {f"gpu{i:03d}": ("IDLE", "") for i in range(10, 20)})


def _prolog(tmp_path: Path, slurm: FakeSlurm, snap: GpuSnapshot | None, *args: str,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    fixture = write_fixture(tmp_path / "nvml.json", snap) if snap is not None else None
    # A roomy budget: these tests are about the verdicts, on a machine that may be loaded (the
    # budget's own tests below set theirs).
    proc = run_cli(["prolog", *slurm.args(), "--skip", SKIP, *args], fixture=fixture,
                   env={"SLURMD_NODENAME": NODE, "PREFLIGHT_STATE_DIR": str(tmp_path / "state"),
                        "PREFLIGHT_PROLOG_BUDGET_S": "30", **(env or {})})
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stderr


def test_bad_node_is_drained_with_the_reason(tmp_path: Path, cluster: FakeSlurm) -> None:
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(3))
    assert rc == 1
    assert cluster.updates() == [["update", f"nodename={NODE}", "state=drain",
                                  "reason=preflight: gpu_visible GpuLost"]]
    assert "FAIL gpu_visible GpuLost (scope node): GPU 3 does not answer" in err
    assert cluster.node(NODE) == {"state": "IDLE+DRAIN",
                                  "reason": "preflight: gpu_visible GpuLost"}


@pytest.mark.parametrize(("env", "reason"), [
    ({"CUDA_VISIBLE_DEVICES": "0,1,0"}, "CvdDuplicate"),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "3"},
     "LocalRankOutOfRange"),
])
def test_a_jobs_own_mistake_never_drains(tmp_path: Path, cluster: FakeSlurm,
                                         env: dict[str, str], reason: str) -> None:
    """A job fault (scope job) goes to stderr; the node stays in service."""
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), env=env)
    assert (rc, cluster.updates()) == (0, [])
    assert f"FAIL cuda_devices {reason} (scope job)" in err


def test_a_node_fault_beside_a_job_fault_drains_for_the_node_only(
        tmp_path: Path, cluster: FakeSlurm) -> None:
    rc, _ = _prolog(tmp_path, cluster, topologies.lost_gpu(3),
                    env={"CUDA_VISIBLE_DEVICES": "0,0"})
    assert rc == 1
    assert cluster.node(NODE)["reason"] == "preflight: gpu_visible GpuLost"


def test_healthy_node_and_warnings_do_not_drain(tmp_path: Path, cluster: FakeSlurm) -> None:
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(),
                      env={"NCCL_P2P_DISABLE": "1"})
    assert rc == 0
    assert cluster.calls() == []  # no drain, so not even the fleet count
    assert "WARN nccl_env P2pDisabled" in err


def test_a_drain_reason_names_node_faults_only() -> None:
    from preflight.commands.slurmhook import drain_reason
    from preflight.core.result import Report, Result, Scope, Status

    report = Report(results=(
        Result("cuda_devices", Status.FAIL, "CvdDuplicate", "x", scope=Scope.JOB),
        Result("shm", Status.FAIL, "ShmTooSmall", "y")))
    assert drain_reason(report) == "preflight: shm ShmTooSmall"
    assert report.status is Status.FAIL and report.node_status is Status.FAIL
    job_only = Report(results=report.results[:1])
    assert (job_only.status, job_only.node_status) == (Status.FAIL, Status.PASS)


def test_undecided_is_fail_open_unless_asked(tmp_path: Path, cluster: FakeSlurm) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    env = {"PREFLIGHT_NVML_FIXTURE": str(broken)}
    rc, err = _prolog(tmp_path, cluster, None, env=env)
    assert rc == 0 and cluster.updates() == []
    assert "ERROR gpu_visible CheckCrashed" in err
    rc, _ = _prolog(tmp_path, cluster, None, "--fail-closed", env=env)
    assert rc == 1
    assert cluster.node(NODE)["reason"].startswith("preflight: gpu_visible CheckCrashed")


def test_config_error_does_not_drain_the_cluster(tmp_path: Path, cluster: FakeSlurm) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text("expect_gpu: 8\n")
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--config", str(cfg))
    assert rc == 0 and cluster.calls() == []
    assert "configuration error" in err and "expect_gpu" in err


def test_scontrol_failure_still_exits_1(tmp_path: Path, cluster: FakeSlurm) -> None:
    missing = tmp_path / "no-scontrol"
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(0), "--scontrol", str(missing))
    assert rc == 1  # Slurm drains on the exit code itself ("Prolog error")
    assert "could not drain gpu017" in err


def test_long_reasons_are_cut() -> None:
    from preflight.commands.slurmhook import drain_reason
    from preflight.core.result import Report, Result, Status
    from preflight.core.slurm import MAX_REASON_CHARS

    report = Report(results=tuple(Result(f"check{i}", Status.FAIL, "SomethingQuiteLongAndBad",
                                         "x") for i in range(30)))
    text = drain_reason(report)
    assert len(text) == MAX_REASON_CHARS and text.endswith("...")
    assert text.startswith("preflight: check0 SomethingQuiteLongAndBad, check1 ")


# -- report-only -----------------------------------------------------------------------------

def test_report_only_reports_everything_and_drains_nothing(tmp_path: Path,
                                                          cluster: FakeSlurm) -> None:
    prom = tmp_path / "prolog.prom"
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--report-only",
                      "--prom-file", str(prom))
    assert rc == 0
    assert cluster.updates() == []
    assert cluster.node(NODE)["state"] == "IDLE"
    assert "FAIL gpu_visible GpuLost (scope node)" in err
    assert ("report-only: would drain gpu017 with reason 'preflight: gpu_visible GpuLost'"
            in err)
    text = prom.read_text()
    assert 'preflight_slurm_would_drain{hook="prolog"} 1.0' in text
    assert 'preflight_slurm_drained{hook="prolog"} 0.0' in text
    assert 'preflight_check_status{check="gpu_visible",status="fail"} 1.0' in text
    assert 'preflight_slurm_report_only{hook="prolog"} 1.0' in text
    assert_promtool_ok(prom)


def assert_promtool_ok(path: Path) -> None:
    """``promtool check metrics`` finds nothing wrong (when promtool is installed)."""
    if shutil.which("promtool") is None:
        return
    with path.open("rb") as f:
        proc = subprocess.run(["promtool", "check", "metrics"], stdin=f, capture_output=True,
                              text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_usage_error_with_report_only_still_lets_the_job_run(tmp_path: Path,
                                                                cluster: FakeSlurm) -> None:
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--report-only",
                      "--fail-closed", "--expect-gpus", "eight")
    assert rc == 0 and "letting the job run" in err


# -- fleet guard ----------------------------------------------------------------------------

def test_the_fleet_guard_holds_back_a_drain(tmp_path: Path, cluster: FakeSlurm) -> None:
    cluster.set_node("gpu010", "IDLE+DRAIN", "preflight: gpu_visible GpuLost")
    cluster.set_node("gpu011", "IDLE+DRAIN", "preflight: xid XidNodeFault")
    prom = tmp_path / "p.prom"
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--prom-file", str(prom),
                      env={"PREFLIGHT_MAX_DRAIN_FRACTION": "0.15"})
    assert rc == 0, err
    assert cluster.updates() == []
    assert [c[0] for c in cluster.calls()] == ["--noheader"]  # one sinfo call, nothing else
    assert ("FLEET GUARD: NOT draining gpu017 (preflight: gpu_visible GpuLost): 2 of 10 nodes "
            "(20.0%) are already drained by preflight, more than max_drain_fraction 0.15") in err
    text = prom.read_text()
    assert 'preflight_slurm_drain_held_back{hook="prolog"} 1.0' in text
    assert 'preflight_slurm_fleet_nodes{hook="prolog"} 10.0' in text
    assert 'preflight_slurm_fleet_drained_by_preflight_nodes{hook="prolog"} 2.0' in text


def test_the_fleet_guard_counts_only_preflights_drains(tmp_path: Path,
                                                       cluster: FakeSlurm) -> None:
    for i in range(10, 16):
        cluster.set_node(f"gpu{i:03d}", "IDLE+DRAIN", "maintenance: new PSU")
    cluster.set_node("gpu016", "IDLE+DRAIN", "preflight: shm ShmTooSmall")
    rc, _ = _prolog(tmp_path, cluster, topologies.lost_gpu(3))
    assert rc == 1
    assert cluster.node(NODE)["reason"] == "preflight: gpu_visible GpuLost"


def test_a_fleet_that_cannot_be_counted_holds_the_drain_back(tmp_path: Path,
                                                             cluster: FakeSlurm) -> None:
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--sinfo", "/nonexistent/sinfo")
    assert rc == 0 and cluster.updates() == []
    assert "could not count the nodes already drained (cannot run /nonexistent/sinfo" in err
    assert "max_drain_fraction: 1.0 to turn the guard off" in err
    rc, _ = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--sinfo", "/nonexistent/sinfo",
                    env={"PREFLIGHT_MAX_DRAIN_FRACTION": "1"})
    assert rc == 1 and len(cluster.updates()) == 1


# -- resume ---------------------------------------------------------------------------------

def test_resume_after_two_passes_of_a_node_preflight_drained(tmp_path: Path,
                                                            cluster: FakeSlurm) -> None:
    rc, _ = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--resume")
    assert rc == 1 and cluster.node(NODE)["state"] == "IDLE+DRAIN"
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume")
    assert rc == 0 and cluster.node(NODE)["state"] == "IDLE+DRAIN", err  # 1 of 2
    prom = tmp_path / "p.prom"
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume",
                      "--prom-file", str(prom))
    assert rc == 0
    assert cluster.node(NODE) == {"state": "IDLE", "reason": ""}
    assert cluster.updates()[-1] == ["update", f"nodename={NODE}", "state=resume"]
    assert ("resumed gpu017: it was drained by preflight ('preflight: gpu_visible GpuLost') "
            "and has passed 2 runs in a row (resume_after 2)") in err
    assert 'preflight_slurm_resumed{hook="prolog"} 1.0' in prom.read_text()


def test_a_failing_run_restarts_the_count(tmp_path: Path, cluster: FakeSlurm) -> None:
    cluster.set_node(NODE, "IDLE+DRAIN", "preflight: gpu_visible GpuLost")
    for snap in (topologies.healthy_8x_h100(), topologies.lost_gpu(1),
                 topologies.healthy_8x_h100()):
        _prolog(tmp_path, cluster, snap, "--resume")
        assert cluster.node(NODE)["state"] == "IDLE+DRAIN"
    _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume")
    assert cluster.node(NODE)["state"] == "IDLE"


def test_a_node_drained_by_someone_else_is_never_resumed(tmp_path: Path,
                                                         cluster: FakeSlurm) -> None:
    cluster.set_node(NODE, "IDLE+DRAIN", "maintenance: reseat GPU 3")
    for _ in range(2):
        rc, _ = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume")
        assert rc == 0
    assert cluster.node(NODE) == {"state": "IDLE+DRAIN", "reason": "maintenance: reseat GPU 3"}
    assert cluster.updates() == []


def test_no_resume_when_the_run_did_not_test_what_drained_the_node(
        tmp_path: Path, cluster: FakeSlurm) -> None:
    cluster.set_node(NODE, "IDLE+DRAIN", "preflight: gpu_visible GpuLost")
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume",
                      "--expect-gpus", "0", env={"PREFLIGHT_RESUME_AFTER": "1"})
    assert rc == 0 and cluster.node(NODE)["state"] == "IDLE+DRAIN"
    assert "this run did not test gpu_visible, which drained it" in err


def test_report_only_never_resumes(tmp_path: Path, cluster: FakeSlurm) -> None:
    cluster.set_node(NODE, "IDLE+DRAIN", "preflight: gpu_visible GpuLost")
    _, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume",
                     "--report-only", env={"PREFLIGHT_RESUME_AFTER": "1"})
    assert cluster.node(NODE)["state"] == "IDLE+DRAIN"
    assert "report-only: would resume gpu017" in err


def test_resume_needs_a_usable_state_dir(tmp_path: Path, cluster: FakeSlurm) -> None:
    cluster.set_node(NODE, "IDLE+DRAIN", "preflight: gpu_visible GpuLost")
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    rc, err = _prolog(tmp_path, cluster, topologies.healthy_8x_h100(), "--resume",
                      env={"PREFLIGHT_STATE_DIR": str(unsafe), "PREFLIGHT_RESUME_AFTER": "1"})
    assert rc == 0
    assert cluster.node(NODE)["state"] == "IDLE+DRAIN"
    assert "cannot keep the count of passing runs, so no resume" in err
    assert "writable by group or others" in err


def test_a_plain_prolog_writes_no_state(tmp_path: Path, cluster: FakeSlurm) -> None:
    _prolog(tmp_path, cluster, topologies.lost_gpu(3))
    assert not (tmp_path / "state").exists()


# -- the budget -----------------------------------------------------------------------------

@pytest.fixture
def persistence_daemon(tmp_path: Path) -> Iterator[int]:
    with fake_persistence_daemon(tmp_path) as pid:
        yield pid


def _fifo(tmp_path: Path) -> Path:
    """An NVML snapshot nobody writes: reading it blocks like a hung nvmlInit."""
    fifo = tmp_path / "hung-nvml.json"
    os.mkfifo(fifo)
    return fifo


def test_a_hung_driver_drains_within_the_budget(tmp_path: Path, cluster: FakeSlurm,
                                                persistence_daemon: int) -> None:
    env = {"PREFLIGHT_NVML_FIXTURE": str(_fifo(tmp_path)), "PREFLIGHT_CHECK_TIMEOUT_S": "3",
           "PREFLIGHT_GPU_PROBE_TIMEOUT_S": "1.5", "PREFLIGHT_PROLOG_BUDGET_S": "8"}
    started = time.monotonic()
    rc, err = _prolog(tmp_path, cluster, None, env=env)
    took = time.monotonic() - started
    assert rc == 1, err
    assert cluster.node(NODE)["reason"] == "preflight: gpu_visible NvmlNotAnswering"
    assert "FAIL gpu_visible NvmlNotAnswering (scope node): NVML did not answer within 1.5 s " \
           f"although the driver is initialised (nvidia-persistenced (pid {persistence_daemon}) " \
           "runs)" in err
    assert took < 8 + 3  # the budget, plus a process's start and end on a loaded machine


def test_a_slow_first_initialisation_is_undecided_not_a_drain(tmp_path: Path,
                                                              cluster: FakeSlurm) -> None:
    env = {"PREFLIGHT_NVML_FIXTURE": str(_fifo(tmp_path)), "PREFLIGHT_CHECK_TIMEOUT_S": "2.5",
           "PREFLIGHT_GPU_PROBE_TIMEOUT_S": "1", "PREFLIGHT_PROLOG_BUDGET_S": "8"}
    started = time.monotonic()
    rc, err = _prolog(tmp_path, cluster, None, env=env)
    assert rc == 0 and cluster.calls() == []
    assert "ERROR gpu_visible ProbeTimeout" in err and "may be slow rather than hung" in err
    assert time.monotonic() - started < 8 + 3


def test_the_watchdog_ends_a_run_that_hangs_where_no_deadline_reaches(
        tmp_path: Path, cluster: FakeSlurm) -> None:
    """The config read from a pipe that never ends (allowed for the daemon's child; bounded at
    5 s) outlasts a 3 s budget: the watchdog ends the process and lets the job run."""
    fixture = write_fixture(tmp_path / "nvml.json", topologies.lost_gpu(3))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PREFLIGHT"))}
    env.update(PYTHONPATH=str(REPO), PREFLIGHT_NVML_FIXTURE=str(fixture),
               PREFLIGHT_PROLOG_BUDGET_S="3", SLURMD_NODENAME=NODE)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "prolog", *cluster.args(),
                             "--config", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        proc.wait(timeout=30)  # stdin stays open: the config never ends
    finally:
        proc.kill()
    assert proc.stderr is not None and proc.stdin is not None
    err = proc.stderr.read()
    proc.stdin.close()
    proc.stderr.close()
    assert time.monotonic() - started < 3 + 3
    assert proc.returncode == 0 and cluster.calls() == []
    assert ("the run reached its 3 s budget (prolog_budget_s) while loading the configuration; "
            "letting the job run") in err


def test_prolog_help_has_no_raw_markup() -> None:
    proc = run_cli(["prolog", "--help"])
    assert proc.returncode == 0
    assert "``" not in proc.stdout and ":mod:" not in proc.stdout and ":func:" not in proc.stdout
    for words in ("--report-only", "--resume", "--prom-file", "prolog_budget_s",
                  "max_drain_fraction", "docs/slurm.md"):
        assert words in proc.stdout


def test_a_prom_file_that_cannot_be_written_changes_no_verdict(tmp_path: Path,
                                                               cluster: FakeSlurm) -> None:
    rc, err = _prolog(tmp_path, cluster, topologies.lost_gpu(3), "--prom-file",
                      str(tmp_path / "no-such-dir" / "p.prom"))
    assert rc == 1 and cluster.node(NODE)["state"] == "IDLE+DRAIN"
    assert "cannot write the metrics to --prom-file" in err
