"""`preflight prolog` as slurmd runs it: a bad node is drained with the check's reason and exit 1;
warnings and undecided runs let the job go. scontrol is a recording stand-in (argv to a file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import topologies
from tests.helpers import run_cli, write_fixture


def _prolog(tmp_path: Path, snap: object, fake: Path, *args: str,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    fixture = write_fixture(tmp_path / "nvml.json", snap)  # type: ignore[arg-type]
    proc = run_cli(["prolog", "--scontrol", str(fake), "--skip", "network,master_port,versions",
                    *args], fixture=fixture, env={"SLURMD_NODENAME": "gpu017", **(env or {})})
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stderr


def test_bad_node_is_drained_with_the_reason(tmp_path: Path,
                                             scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    rc, err = _prolog(tmp_path, topologies.lost_gpu(3), fake)
    assert rc == 1
    assert calls.read_text().splitlines() == [
        "update", "nodename=gpu017", "state=drain", "reason=preflight: gpu_visible GpuLost", "---"]
    assert "FAIL gpu_visible GpuLost (scope node): GPU 3 does not answer" in err


@pytest.mark.parametrize(("env", "reason"), [
    ({"CUDA_VISIBLE_DEVICES": "0,1,0"}, "CvdDuplicate"),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "3"},
     "LocalRankOutOfRange"),
])
def test_a_jobs_own_mistake_never_drains(tmp_path: Path, scontrol: tuple[Path, Path],
                                         env: dict[str, str], reason: str) -> None:
    """A job fault (scope job) goes to stderr; the node stays in service (#11 point 3)."""
    fake, calls = scontrol
    rc, err = _prolog(tmp_path, topologies.healthy_8x_h100(), fake, env=env)
    assert (rc, calls.exists()) == (0, False)
    assert f"FAIL cuda_devices {reason} (scope job)" in err


def test_a_node_fault_beside_a_job_fault_drains_for_the_node_only(
        tmp_path: Path, scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    rc, _ = _prolog(tmp_path, topologies.lost_gpu(3), fake, env={"CUDA_VISIBLE_DEVICES": "0,0"})
    assert rc == 1
    assert "reason=preflight: gpu_visible GpuLost" in calls.read_text().splitlines()


def test_healthy_node_and_warnings_do_not_drain(tmp_path: Path,
                                                scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    rc, err = _prolog(tmp_path, topologies.healthy_8x_h100(), fake,
                      env={"NCCL_P2P_DISABLE": "1"})
    assert rc == 0
    assert not calls.exists()
    assert "WARN nccl_env P2pDisabled" in err


def test_a_drain_reason_names_node_faults_only() -> None:
    from preflight.commands.prolog import drain_reason
    from preflight.core.result import Report, Result, Scope, Status

    report = Report(results=(
        Result("cuda_devices", Status.FAIL, "CvdDuplicate", "x", scope=Scope.JOB),
        Result("shm", Status.FAIL, "ShmTooSmall", "y")))
    assert drain_reason(report) == "preflight: shm ShmTooSmall"
    assert report.status is Status.FAIL and report.node_status is Status.FAIL
    job_only = Report(results=report.results[:1])
    assert (job_only.status, job_only.node_status) == (Status.FAIL, Status.PASS)


def test_undecided_is_fail_open_unless_asked(tmp_path: Path, scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    env = {"PREFLIGHT_NVML_FIXTURE": str(broken), "SLURMD_NODENAME": "gpu017"}
    proc = run_cli(["prolog", "--scontrol", str(fake), "--skip", "network,master_port,versions"],
                   env=env)
    assert proc.returncode == 0 and not calls.exists()
    assert "ERROR gpu_visible CheckCrashed" in proc.stderr
    proc = run_cli(["prolog", "--scontrol", str(fake), "--fail-closed",
                    "--skip", "network,master_port,versions"], env=env)
    assert proc.returncode == 1
    assert "reason=preflight: gpu_visible CheckCrashed" in calls.read_text()


def test_config_error_does_not_drain_the_cluster(tmp_path: Path,
                                                 scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    cfg = tmp_path / "p.yaml"
    cfg.write_text("expect_gpu: 8\n")
    rc, err = _prolog(tmp_path, topologies.healthy_8x_h100(), fake, "--config", str(cfg))
    assert rc == 0 and not calls.exists()
    assert "configuration error" in err and "expect_gpu" in err


def test_scontrol_failure_still_exits_1(tmp_path: Path) -> None:
    missing = tmp_path / "no-scontrol"
    rc, err = _prolog(tmp_path, topologies.lost_gpu(0), missing)
    assert rc == 1
    assert "could not drain gpu017" in err


def test_long_reasons_are_cut() -> None:
    from preflight.commands.prolog import MAX_REASON_CHARS, drain_reason
    from preflight.core.result import Report, Result, Status

    report = Report(results=tuple(Result(f"check{i}", Status.FAIL, "SomethingQuiteLongAndBad",
                                         "x") for i in range(30)))
    text = drain_reason(report)
    assert len(text) == MAX_REASON_CHARS and text.endswith("...")
    assert text.startswith("preflight: check0 SomethingQuiteLongAndBad, check1 ")
