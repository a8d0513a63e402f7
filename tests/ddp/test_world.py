"""Step 4 across nodes (``preflight cluster --ddp``): node 0's verdict from the nodes' answers
(pure), and two agents on 127.0.0.1 training one DDP model over gloo, one rank each (real:
the cluster's store, its numbered steps, the workers as global ranks of one world)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import Any

from preflight.ddp.world import judge_world
from tests.cluster.conftest import REPO, clean_env
from tests.ddp.test_proofs import _facts


def _answer(*ranks: dict[str, Any], status: str = "pass", **more: Any) -> dict[str, Any]:
    return {"status": status, "ranks": list(ranks), "device": {"status": "n/a"},
            "nccl_warnings": [], "message": "", "failure": None, **more}


def test_every_rank_of_every_node_is_judged_as_one_training() -> None:
    got = judge_world({0: _answer(_facts(0)), 1: _answer(_facts(1))}, nodes=[0, 1])
    assert (got["status"], got["layer"]) == ("pass", "none"), got
    proofs = {p["name"]: p["status"] for p in got["proofs"]}
    assert proofs["parameters_equal"] == proofs["shards"] == proofs["broadcast"] == "pass"
    # node 1's rank diverged: the parameters differ across nodes.
    got = judge_world({0: _answer(_facts(0)), 1: _answer(_facts(1, digest_final="other"))},
                      nodes=[0, 1])
    assert (got["status"], got["layer"]) == ("fail", "network")
    assert "rank 1 differ from rank 0's" in got["message"]
    assert all(not isinstance(v, dict) for p in got["proofs"] for v in p["figures"].values())


def test_the_node_that_failed_first_is_named_before_those_that_waited() -> None:
    stalled = _answer(status="fail", message="rank 2 (node 1 CPU) stalled in forward",
                      failure={"kind": "stalled", "ranks": [2]})
    hung = _answer(status="fail", message="all 2 ranks are alive but ... hangs",
                   failure={"kind": "hung", "ranks": [0, 1]})
    got = judge_world({0: hung, 1: stalled}, nodes=[0, 1, 2])
    assert got["status"] == "fail" and got["layer"] == "network"
    assert got["message"].startswith("node 1: rank 2 (node 1 CPU) stalled")
    assert got["message"].endswith("node(s) 2 did not answer")


def test_two_agents_train_one_model_over_gloo() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--backend", "gloo", "--no-bandwidth", "--ddp", "--json", "--timeout", "60"]
    procs = [subprocess.Popen([sys.executable, "-m", "preflight", "cluster", "--node-rank",
                               str(r), *args], env=clean_env({"GLOO_SOCKET_IFNAME": "lo"}),
                              cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r in (0, 1)]
    outs = [p.communicate(timeout=200) for p in procs]
    assert all("Traceback" not in err for _, err in outs), outs
    lead = json.loads(outs[0][0])
    ddp = lead["ddp"]
    assert ddp is not None and ddp["status"] == "pass", ddp
    assert ddp["ranks"] == 2 and ddp["layer"] == "none"
    proofs = {p["name"]: p["status"] for p in ddp["proofs"]}
    assert proofs == {"device": "n/a", "broadcast": "pass", "parameters_equal": "pass",
                      "loss_down": "pass", "shards": "pass", "order_changed": "pass",
                      "parameters_used": "pass"}
    assert json.loads(outs[1][0])["ddp"]["status"] == "pass"  # every node prints one verdict
    assert not any(f["reason"] == "DdpWorldFailed" for f in lead["findings"])
