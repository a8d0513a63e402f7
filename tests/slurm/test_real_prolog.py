"""The preflight hooks in a real one-node Slurm 22.05 (see conftest.py): Prolog, Epilog and
HealthCheckProgram as a site installs them.

What an operator checks after deploying it: a healthy node runs jobs as before; a node with a
lost GPU runs no job, is drained with our reason in ``sinfo -R`` (not Slurm's generic "Prolog
error"), the check's message is in the slurmd log, and the job waits, requeued and held; once the
node is fixed and resumed, the released job runs. And the rollout: ``--report-only`` lets the job
run on the same node; the health check resumes what preflight drained once it passes, never a
node drained for maintenance; the epilog drains after a job that leaves a process on its GPU; a
driver that does not answer drains within the budget; the fleet guard holds a drain back. Each
test leaves the node IDLE with a healthy GPU fixture, so the tests do not depend on one another.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import topologies
from tests.helpers import REPO, write_fixture
from tests.slurm.conftest import GHOST, HOOKS, SlurmCluster
from tests.slurmfakes import persistence_daemon as fake_persistence_daemon

#: Our reason as `scontrol update ... reason=` set it; scontrol shows it with "[user@time]" after.
REASON = "preflight: gpu_visible GpuLost"
#: Job states after which nothing more happens to a job without an operator.
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY")


def _submit_marker_job(slurm: SlurmCluster, name: str) -> tuple[str, Path]:
    """A batch job whose only effect is a file: it exists if and only if the job ran."""
    marker = slurm.root / f"ran-{name}"
    return slurm.sbatch(f"--job-name={name}", "--wrap", f"touch {marker}"), marker


def _settled(job: dict[str, str]) -> bool:
    """Finished, or requeued and held (a held job waits for an operator: waiting longer shows
    nothing); a requeued job is COMPLETING while the epilog runs, then PENDING."""
    return job.get("JobState") in FINAL or (job.get("JobState") == "PENDING"
                                            and "held" in job.get("Reason", ""))


def test_healthy_node_runs_the_job(slurm: SlurmCluster) -> None:
    slurm.wait_idle()
    write_fixture(slurm.nvml_fixture, topologies.single_h200_vm())
    job, marker = _submit_marker_job(slurm, "healthy")

    info = slurm.wait_for(f"job {job} to finish", lambda: slurm.show_job(job), _settled)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), \
        f"{info}\n{slurm.logs()}"
    assert marker.exists(), "the job did not run its command"
    assert slurm.prolog_runs()[job][0] == 0, slurm.logs()
    assert slurm.node_state() == "IDLE"
    assert "prolog failed" not in (slurm.root / "slurmd.log").read_text()


def test_lost_gpu_drains_the_node_and_holds_the_job(slurm: SlurmCluster) -> None:
    slurm.wait_idle()
    write_fixture(slurm.nvml_fixture, topologies.lost_gpu(0))
    job, marker = _submit_marker_job(slurm, "lostgpu")
    try:
        # Observed on 22.05.8: the job is allocated (RUNNING, node MIXED) while the prolog runs;
        # the prolog drains the node (DRAINING) and exits 1; slurmctld requeues the job, and a
        # job whose prolog failed is requeued *held*: PENDING, Reason=launch_failed_requeued_held,
        # Priority=0 (the hold), Restarts=1. With no job left, the node is IDLE+DRAIN (drained).
        info = slurm.wait_for(f"job {job} requeued and held", lambda: slurm.show_job(job),
                              _settled)
        assert (info["JobState"], info["Reason"]) == ("PENDING", "launch_failed_requeued_held"), \
            f"{info}\n{slurm.logs()}"
        assert (info["Restarts"], info["Priority"]) == ("1", "0"), info
        assert not marker.exists(), "the job ran on a node whose GPU is lost"
        assert slurm.prolog_runs()[job][0] == 1, slurm.logs()

        node = slurm.show_node()
        assert node["State"] == "IDLE+DRAIN", f"{node}\n{slurm.logs()}"
        # Our reason, not Slurm's generic "Prolog error": slurmctld keeps a reason already set.
        assert node["Reason"].startswith(f"{REASON} [root@"), node["Reason"]
        assert slurm.reasons() == [f"{REASON}|drained"]
        # The check's message and remedy reach the slurmd log (a prolog's stderr on failure).
        assert ("prolog failed: rc:1 output:preflight prolog: FAIL gpu_visible GpuLost "
                "(scope node): GPU 0 does not answer") in (slurm.root / "slurmd.log").read_text(), \
            slurm.logs()

        # The operator's way back: fix the node, resume it, release the job; now it runs.
        write_fixture(slurm.nvml_fixture, topologies.single_h200_vm())
        slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")
        slurm.run("scontrol", "release", job)
        # A requeued job is not eligible until about 2 minutes after the requeue (EligibleTime
        # in `scontrol show job`, observed: 121 s); the operator who fixed the node starts it now.
        slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")
        info = slurm.wait_for(f"released job {job} to finish", lambda: slurm.show_job(job),
                              _settled)
        assert info["JobState"] == "COMPLETED", f"{info}\n{slurm.logs()}"
        assert marker.exists()
        assert slurm.prolog_runs()[job][0] == 0
    finally:
        # Leave the node usable for the next test whatever happened above.
        write_fixture(slurm.nvml_fixture, topologies.single_h200_vm())
        slurm.run("scancel", job, check=False)
        if "DRAIN" in slurm.node_state():
            slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")
    slurm.wait_idle()


@pytest.fixture
def clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The node IDLE, healthy, the hooks with their default options, health checks off: before
    and after the test, whatever it did."""

    def reset() -> None:
        slurm.health_checks(False)
        for hook in HOOKS:
            slurm.set_hook_args(hook)
        slurm.set_hooks_env()
        if slurm.nvml_fixture.exists() and not slurm.nvml_fixture.is_file():
            slurm.nvml_fixture.unlink()  # the hung-driver FIFO
        write_fixture(slurm.nvml_fixture, topologies.single_h200_vm())
        slurm.run("scancel", "--partition=debug", check=False)
        if "DRAIN" in slurm.node_state():
            slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")
        slurm.wait_idle()

    reset()
    yield slurm
    reset()


def test_report_only_on_a_lost_gpu_lets_the_job_run(clean: SlurmCluster) -> None:
    slurm = clean
    slurm.set_hook_args("prolog", "--report-only")
    write_fixture(slurm.nvml_fixture, topologies.lost_gpu(0))
    job, marker = _submit_marker_job(slurm, "reportonly")
    info = slurm.wait_for(f"job {job} to finish", lambda: slurm.show_job(job), _settled)
    assert info["JobState"] == "COMPLETED", f"{info}\n{slurm.logs()}"
    assert marker.exists(), "report-only kept the job from running"
    assert slurm.prolog_runs()[job][0] == 0
    assert slurm.node_state() == "IDLE" and slurm.reasons() == []
    err = slurm.hook_stderr("prolog")
    assert "FAIL gpu_visible GpuLost (scope node)" in err
    assert f"report-only: would drain {slurm.node} with reason '{REASON}'" in err
    prom = (slurm.root / "prolog.prom").read_text()
    assert 'preflight_slurm_would_drain{hook="prolog"} 1.0' in prom
    assert 'preflight_check_status{check="gpu_visible",status="fail"} 1.0' in prom


def test_a_drained_node_is_resumed_by_the_health_check_once_it_passes(
        clean: SlurmCluster) -> None:
    slurm = clean
    write_fixture(slurm.nvml_fixture, topologies.lost_gpu(0))
    job, _ = _submit_marker_job(slurm, "drainresume")
    slurm.wait_for(f"job {job} requeued and held", lambda: slurm.show_job(job), _settled)
    assert slurm.reasons() == [f"{REASON}|drained"], slurm.logs()

    write_fixture(slurm.nvml_fixture, topologies.single_h200_vm())  # the node is fixed
    before = len(slurm.hook_runs("healthcheck"))
    slurm.health_checks(True)  # slurmd runs `preflight prolog --resume` every 2 s
    slurm.wait_idle()
    runs = slurm.hook_runs("healthcheck")[before:]
    assert len(runs) >= 2 and all(rc == 0 for _, rc, _ in runs), runs
    assert slurm.reasons() == []  # `sinfo -R` no longer lists the node
    err = slurm.hook_stderr("healthcheck")
    assert (f"resumed {slurm.node}: it was drained by preflight ('{REASON}') and has passed 2 "
            "runs in a row (resume_after 2)") in err


def test_a_node_drained_for_maintenance_is_never_resumed(clean: SlurmCluster) -> None:
    slurm = clean
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=drain",
              "reason=maintenance: swap PSU")
    before = len(slurm.hook_runs("healthcheck"))
    slurm.health_checks(True)
    slurm.wait_for("3 passing health checks", lambda: slurm.hook_runs("healthcheck")[before:],
                   lambda runs: len(runs) >= 3)
    runs = slurm.hook_runs("healthcheck")[before:]
    assert all(rc == 0 for _, rc, _ in runs), runs
    node = slurm.show_node()
    assert node["State"] == "IDLE+DRAIN" and node["Reason"].startswith("maintenance: swap PSU")
    assert slurm.reasons() == ["maintenance: swap PSU|drained"]


def test_the_epilog_drains_after_a_job_that_leaves_a_process_on_its_gpu(
        clean: SlurmCluster) -> None:
    """The job starts a process that escapes it (setsid; proctrack/linuxproc loses it), and -
    as NVML would - the GPU lists that process: the epilog finds it, still alive after the job,
    and drains the node with our reason."""
    slurm = clean
    pidfile = slurm.root / "leftover.pid"
    script = slurm.root / "leave-a-process.sh"
    writer = (f"import dataclasses, sys; sys.path.insert(0, {str(REPO)!r}); "
              "from tests import topologies; from tests.helpers import write_fixture; "
              "from pathlib import Path; s = topologies.single_h200_vm(); "
              f"pid = int(Path({str(pidfile)!r}).read_text()); "
              "g = dataclasses.replace(s.gpus[0], compute_pids=(pid,)); "
              f"write_fixture(Path({str(slurm.nvml_fixture)!r}), "
              "dataclasses.replace(s, gpus=(g,)))")
    script.write_text("#!/bin/sh\n"
                      f"(setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > {pidfile})\n"
                      f"{shlex.quote(sys.executable)} -c {shlex.quote(writer)}\n")
    script.chmod(0o755)
    job = slurm.sbatch("--job-name=leftover", str(script))
    try:
        slurm.wait_for(f"job {job} to finish", lambda: slurm.show_job(job), _settled)
        pid = int(pidfile.read_text())
        assert Path(f"/proc/{pid}").exists(), "the process did not outlive its job"
        node = slurm.wait_for("the epilog's drain", slurm.show_node,
                              lambda n: "DRAIN" in n.get("State", ""))
        assert node["Reason"].startswith("preflight: gpu_processes GpuProcessLeft [root@"), \
            f"{node}\n{slurm.logs()}"
        err = slurm.hook_stderr("epilog")
        assert f"GPU 0: pid {pid} (sleep, uid 0, job {job})" in err
        assert slurm.prolog_runs("epilog")[job][0] == 1
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.fixture
def persistence_daemon(slurm: SlurmCluster) -> Iterator[int]:
    with fake_persistence_daemon(slurm.root) as pid:
        yield pid


def test_a_hung_driver_drains_within_the_budget(clean: SlurmCluster,
                                                persistence_daemon: int) -> None:
    slurm = clean
    slurm.nvml_fixture.unlink()
    os.mkfifo(slurm.nvml_fixture)  # an NVML snapshot nobody writes: a hung nvmlInit
    job, marker = _submit_marker_job(slurm, "hungnvml")
    info = slurm.wait_for(f"job {job} requeued and held", lambda: slurm.show_job(job), _settled)
    assert info["JobState"] == "PENDING" and not marker.exists(), info
    node = slurm.show_node()
    assert node["Reason"].startswith("preflight: gpu_visible NvmlNotAnswering [root@"), node
    rc, took = slurm.prolog_runs()[job]
    assert rc == 1 and took < 8.0, (rc, took)  # prolog_budget_s, under MessageTimeout (10 s)
    assert "NVML did not answer within" in slurm.hook_stderr("prolog")


def test_the_fleet_guard_holds_back_a_drain(clean: SlurmCluster) -> None:
    slurm = clean
    slurm.run("scontrol", "update", f"nodename={GHOST}", "state=drain",
              "reason=preflight: xid XidNodeFault")
    try:
        slurm.set_hooks_env(PREFLIGHT_MAX_DRAIN_FRACTION="0.3")
        write_fixture(slurm.nvml_fixture, topologies.lost_gpu(0))
        job, marker = _submit_marker_job(slurm, "fleetguard")
        info = slurm.wait_for(f"job {job} to finish", lambda: slurm.show_job(job), _settled)
        assert info["JobState"] == "COMPLETED" and marker.exists(), f"{info}\n{slurm.logs()}"
        assert slurm.prolog_runs()[job][0] == 0
        assert slurm.node_state() == "IDLE" and slurm.reasons() == []
        assert (f"FLEET GUARD: NOT draining {slurm.node} ({REASON}): 1 of 2 nodes (50.0%) are "
                "already drained by preflight, more than max_drain_fraction 0.3") \
            in slurm.hook_stderr("prolog")
        prom = (slurm.root / "prolog.prom").read_text()
        assert 'preflight_slurm_drain_held_back{hook="prolog"} 1.0' in prom
        assert 'preflight_slurm_fleet_drained_by_preflight_nodes{hook="prolog"} 1.0' in prom
    finally:
        slurm.run("scontrol", "update", f"nodename={GHOST}", "state=drain",
                  "reason=no slurmd on this test node")
