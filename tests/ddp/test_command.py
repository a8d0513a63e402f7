"""``check --ddp`` and ``prolog --ddp`` run the ladder as the check ``ddp``: a broken gloo (an
interface that does not exist) is the communication layer, named with its variable, within a
bounded time; being the job's own setting, it never drains the node."""

from __future__ import annotations

import time
from pathlib import Path

from tests.helpers import cli_json, run_cli


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


def test_prolog_ddp_does_not_drain_for_the_jobs_own_setting(scontrol: tuple[Path, Path]
                                                            ) -> None:
    fake, calls = scontrol
    proc = run_cli(["prolog", "--ddp", "--skip", "gpu_visible,xid,versions", "--scontrol",
                    str(fake)], timeout=150,
                   # The ladder needs more than a prolog's default 8 s budget: raised with it.
                   env={"GLOO_SOCKET_IFNAME": "nosuch0", "PREFLIGHT_PROLOG_BUDGET_S": "140"})
    assert proc.returncode == 0, proc.stderr
    assert not calls.exists()  # no drain
    assert "FAIL ddp DdpCommunicationLayer (scope job)" in proc.stderr
    assert "GLOO_SOCKET_IFNAME=nosuch0" in proc.stderr


def test_only_ddp_without_the_flag_says_what_is_known() -> None:
    proc = run_cli(["check", "--only", "ddp"], timeout=30)
    assert proc.returncode == 2 and "unknown check(s): ddp" in proc.stderr
