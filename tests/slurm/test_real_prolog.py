"""``preflight prolog`` as the Prolog of a real one-node Slurm 22.05 (see conftest.py).

What an operator checks after deploying it: a healthy node runs jobs as before; a node with a
lost GPU runs no job, is drained with our reason in ``sinfo -R`` (not Slurm's generic "Prolog
error"), the check's message is in the slurmd log, and the job waits, requeued and held; once the
node is fixed and resumed, the released job runs. Each test leaves the node IDLE with a healthy
GPU fixture, so the tests do not depend on one another.
"""

from __future__ import annotations

from pathlib import Path

from tests import topologies
from tests.helpers import write_fixture
from tests.slurm.conftest import SlurmCluster

#: Our reason as `scontrol update ... reason=` set it; scontrol shows it with "[user@time]" after.
REASON = "preflight: gpu_visible GpuLost"
#: Job states after which nothing more happens to a job without an operator.
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY")


def _submit_marker_job(slurm: SlurmCluster, name: str) -> tuple[str, Path]:
    """A batch job whose only effect is a file: it exists if and only if the job ran."""
    marker = slurm.root / f"ran-{name}"
    return slurm.sbatch(f"--job-name={name}", "--wrap", f"touch {marker}"), marker


def _settled(job: dict[str, str]) -> bool:
    """Finished, or held (a held job waits for an operator: waiting longer shows nothing)."""
    return job.get("JobState") in FINAL or "held" in job.get("Reason", "")


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
        sinfo = slurm.run("sinfo", "--list-reasons", "--noheader", "--format=%E|%T|%N")
        assert sinfo.splitlines() == [f"{REASON}|drained|{slurm.node}"], sinfo
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
