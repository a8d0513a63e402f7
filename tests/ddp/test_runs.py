"""The DDP ladder for real on the CPU: 2 gloo ranks under this venv's torch, as a user runs it,
and with faults injected through the worker's test-only hook (docs/ddp.md). What a person
checks afterwards: every claim proven, each shown false by its fault, the rank named, nothing
left (no process, no port)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import pytest

from preflight.bench.worker.wire import DDP_TEST_ENV
from preflight.core.result import Status
from preflight.ddp import LadderResult, plan, run
from tests import topologies
from tests.conftest import MakeCtx
from tests.helpers import cli_json, pid_alive

_JOB = ("NCCL_", "TORCH_", "SLURM_", "PREFLIGHT_", "CUDA_", "GLOO_")


def _env(**extra: str) -> dict[str, str]:
    """This machine's environment without job variables (as tests.helpers.run_cli does)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_JOB)
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")}
    return {**env, **extra}


def _run(make_ctx: MakeCtx, *, timeout_s: float | None = None, **env: str) -> LadderResult:
    ctx = make_ctx(env=_env(**env), snapshot=topologies.no_driver())
    return run(ctx, plan(ctx, timeout_s=timeout_s))


def _proofs(step: Mapping[str, object]) -> dict[str, object]:
    return {p["name"]: p["status"] for p in step["proofs"]}  # type: ignore[attr-defined]


def _assert_nothing_left(pids: list[int], port: int | None) -> None:
    assert pids and not [p for p in pids if pid_alive(p)]
    assert port is not None
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # free: the store died with rank 0


def test_a_healthy_run_proves_every_claim_and_leaves_nothing() -> None:
    code, data = cli_json(["ddp"], timeout=150)
    assert code == 0, data
    assert (data["status"], data["layer"]) == ("pass", "none")
    assert "look at the model and data" in data["message"]
    steps = {s["name"]: s for s in data["steps"]}
    # A CPU-only machine: the GPU steps SKIP, gloo runs.
    assert steps["single"]["status"] == "skip" and "needs a GPU" in steps["single"]["message"]
    assert steps["nccl"]["status"] == "skip"
    gloo = steps["gloo"]
    assert gloo["status"] == "pass" and gloo["ranks"] == 2 and gloo["seconds"] > 0
    assert _proofs(gloo) == {"device": "n/a", "broadcast": "pass", "parameters_equal": "pass",
                             "loss_down": "pass", "shards": "pass", "order_changed": "pass",
                             "parameters_used": "pass"}
    order = next(p for p in gloo["proofs"] if p["name"] == "order_changed")
    assert "without set_epoch it would not have" in order["message"]
    assert order["figures"]["repeats_without_set_epoch"] is True
    left = data["leftovers"]
    assert left["processes"] == [] and left["port_free"] is True and left["workers"] == 2
    _assert_nothing_left([r["pid"] for r in data["ranks"]], left["port"])
    assert data["environment"]["torch"]["version"]
    assert set(data["start_s"]) >= {"interpreter", "imports"}


def test_faults_make_their_claims_false(make_ctx: MakeCtx) -> None:
    # One run, two independent faults: no rank calls set_epoch (the order of every epoch is the
    # same), rank 1 never calls optimizer.step() (its parameters stay where the broadcast put
    # them). Each fault falsifies its own claims; the others still hold.
    result = _run(make_ctx, **{DDP_TEST_ENV: "no_set_epoch,skip_step=1"})
    assert result.status is Status.FAIL and result.layer == "communication"
    gloo = next(s for s in result.steps if s.name == "gloo")
    got = {p.name: p for p in gloo.proofs}
    assert got["order_changed"].ok is False
    assert "set_epoch was not called" in got["order_changed"].message
    assert got["parameters_equal"].ok is False
    assert "rank 1 differ from rank 0's" in got["parameters_equal"].message
    assert got["loss_down"].ok is False and "rank 1:" in got["loss_down"].message
    assert "rank 0:" not in got["loss_down"].message
    assert got["broadcast"].ok and got["shards"].ok and got["parameters_used"].ok
    assert any("test-only faults injected" in n for n in result.notes)
    assert not [p for p in (r["pid"] for r in result.ranks) if pid_alive(int(str(p)))]


def test_a_rank_that_hangs_is_named_by_the_deadline(make_ctx: MakeCtx) -> None:
    t0 = time.monotonic()
    result = _run(make_ctx, timeout_s=10, **{DDP_TEST_ENV: "hang=1@gloo"})
    took = time.monotonic() - t0
    gloo = next(s for s in result.steps if s.name == "gloo")
    assert gloo.status is Status.FAIL and gloo.failure_kind == "stalled"
    assert gloo.failed_ranks == (1,)
    assert "rank 1 (CPU) stalled in forward of iteration 2 (step gloo)" in gloo.message
    assert "rank 0 reached backward of iteration 2 (step gloo)" in gloo.message
    # The phase deadline is 2.5 s (10 / 4): named long before gloo's own timeout (40 s).
    assert took < 60
    assert result.leftovers["processes"] == [] and result.leftovers["port_free"] is True
    pids = [int(str(r["pid"])) for r in result.ranks]
    _assert_nothing_left(pids, result.leftovers["port"])


@pytest.mark.parametrize("command", [["ddp", "--nproc", "0"], ["ddp", "--timeout", "inf"]])
def test_bad_options_exit_2_without_a_run(command: list[str]) -> None:
    from tests.helpers import run_cli

    proc = run_cli(command, timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
