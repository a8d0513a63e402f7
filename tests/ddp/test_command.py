"""``check --ddp`` and ``prolog --ddp`` run the ladder as the check ``ddp``: a broken gloo (an
interface that does not exist) is the communication layer, named with its variable, within a
bounded time, and the job's own setting (scope job: never a drain); a training environment
whose torch does not import is the environment layer, the node's, and the prolog drains."""

from __future__ import annotations

import time
from pathlib import Path

from tests import topologies
from tests.helpers import cli_json, run_cli, write_fixture
from tests.slurmfakes import fake_slurm
from tests.venvs import MakeVenv


def test_check_ddp_names_gloo_socket_ifname_as_the_communication_layer() -> None:
    t0 = time.monotonic()
    code, data = cli_json(["check", "--ddp", "--only", "ddp"],
                          env={"GLOO_SOCKET_IFNAME": "nosuch0"}, timeout=150)
    took = time.monotonic() - t0
    assert code == 1
    (ddp,) = data["results"]
    assert (ddp["check"], ddp["status"], ddp["reason"]) == ("ddp", "fail",
                                                             "DdpCommunicationLayer")
    assert ddp["scope"] == "job"  # the job's own GLOO_SOCKET_IFNAME
    assert "GLOO_SOCKET_IFNAME=nosuch0" in ddp["message"]
    assert ddp["remedy"].startswith("export GLOO_SOCKET_IFNAME=")  # the network check's fix
    run = ddp["details"]["ddp"]
    assert run["layer"] == "communication"
    gloo = next(s for s in run["steps"] if s["name"] == "gloo")
    assert gloo["status"] == "fail" and "init_process_group" in gloo["message"]
    assert run["evidence"]["variables"] == {"GLOO_SOCKET_IFNAME": "nosuch0"}
    network = next(c for c in run["evidence"]["checks"] if c["check"] == "network")
    assert network["status"] == "fail" and "nosuch0" in network["message"]
    assert run["leftovers"]["processes"] == []
    # gloo fails at once: the time is the workers' start-up (torch's import), not a deadline.
    assert took < 100


def test_prolog_ddp_drains_a_node_whose_training_environment_cannot_import_torch(
        tmp_path: Path, make_venv: MakeVenv) -> None:
    # Real workers (8: one per GPU of the fixture node) under a venv whose torch raises at
    # import: the environment layer, the node's fault, drained with the check as the reason.
    python = make_venv(torch=("2.9.0", None))
    slurm = fake_slurm(tmp_path / "slurm", {f"gpu{i:03d}": ("IDLE", "") for i in range(10, 20)})
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    proc = run_cli(["prolog", *slurm.args(), "--ddp", "--python", str(python), "--skip",
                    "network,master_port,versions"], fixture=fixture, timeout=120,
                   env={"SLURMD_NODENAME": "gpu017", "PREFLIGHT_PROLOG_BUDGET_S": "60",
                        "PREFLIGHT_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 1, proc.stderr
    assert "FAIL ddp DdpEnvironmentLayer (scope node)" in proc.stderr
    assert "ImportError" in proc.stderr
    assert slurm.updates() == [["update", "nodename=gpu017", "state=drain",
                                "reason=preflight: ddp DdpEnvironmentLayer"]]


def test_only_ddp_without_the_flag_says_what_is_known() -> None:
    proc = run_cli(["check", "--only", "ddp"], timeout=30)
    assert proc.returncode == 2 and "unknown check(s): ddp" in proc.stderr
