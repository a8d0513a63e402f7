"""Which ranks and steps the ladder plans from the node (fixture GPUs, the job's
CUDA_VISIBLE_DEVICES), what it says when it cannot run, the verdict's layer, evidence and scope
from given rank states, and an environment whose torch does not import (real workers, no torch:
fast)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from preflight.bench.options import DdpStep
from preflight.bench.records import Failure, WorkerState
from preflight.bench.worker import wire
from preflight.core.result import Scope, Status
from preflight.ddp import DdpUsageError, plan, run
from preflight.ddp.ladder import LadderPlan, judge_step, verdict
from preflight.ddp.verdict import StepResult, render_table
from tests import topologies
from tests.conftest import MakeCtx
from tests.venvs import MakeVenv


def test_a_gpu_node_runs_every_step_on_the_gpus_the_job_sees(make_ctx: MakeCtx) -> None:
    snap = topologies.healthy_8x_h100()
    p = plan(make_ctx(env={"CUDA_VISIBLE_DEVICES": "3,1"}, snapshot=snap))
    assert p.options is not None and p.options.nproc == 2
    assert [(s.name, s.backend, s.gpu) for s in p.options.steps] == [
        ("single", None, True), ("gloo", "gloo", True), ("nccl", "nccl", True)]
    assert p.expected == {0: snap.gpus[3].pci_bus_id, 1: snap.gpus[1].pci_bus_id}
    assert p.options.labels == (f"GPU 3, {snap.gpus[3].pci_bus_id}",
                                f"GPU 1, {snap.gpus[1].pci_bus_id}")
    assert p.skipped == {} and p.cvd == "3,1"
    env = p.options.env_for(1)
    assert (env["LOCAL_RANK"], env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
        "1", "1", "2", "2")
    assert env["CUDA_VISIBLE_DEVICES"] == "3,1" and "CUDA_DEVICE_ORDER" not in env
    assert env["NCCL_DEBUG"] == "WARN"
    with pytest.raises(DdpUsageError, match="only 2 GPU"):
        plan(make_ctx(env={"CUDA_VISIBLE_DEVICES": "3,1"}, snapshot=snap), nproc=3)


@pytest.mark.parametrize(("env", "why"), [
    ({"CUDA_VISIBLE_DEVICES": ""}, "no GPU visible (CUDA_VISIBLE_DEVICES '')"),
    ({}, "NVML is not available"),
])
def test_without_a_gpu_two_cpu_ranks_run_gloo(make_ctx: MakeCtx, env: dict[str, str],
                                             why: str) -> None:
    snap = topologies.healthy_8x_h100() if env else topologies.no_driver()
    p = plan(make_ctx(env=env, snapshot=snap))
    assert p.options is not None and p.options.nproc == 2
    assert [(s.name, s.gpu) for s in p.options.steps] == [("gloo", False)]
    assert set(p.skipped) == {"single", "nccl"} and why in p.skipped["single"]


def test_an_environment_without_torch_is_undecided(make_ctx: MakeCtx,
                                                  make_venv: MakeVenv) -> None:
    python = make_venv()
    ctx = make_ctx(snapshot=topologies.no_driver(), python=str(python))
    result = run(ctx, plan(ctx))
    assert (result.status, result.reason, result.layer) == (Status.ERROR, "TorchMissing", None)
    assert str(python) in result.message and all(s.status is Status.SKIP for s in result.steps)


def test_a_torch_that_does_not_import_is_the_environment(make_ctx: MakeCtx,
                                                        make_venv: MakeVenv) -> None:
    # Real workers under a venv whose torch raises at import: before any step ran.
    python = make_venv(torch=("2.9.0", None))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOO_", "NCCL_"))}
    ctx = make_ctx(env=env, snapshot=topologies.no_driver(), python=str(python))
    result = run(ctx, plan(ctx))
    assert (result.status, result.layer) == (Status.FAIL, "environment"), result.message
    assert "ImportError: the fingerprint must not import torch" in result.message
    assert "failed in import" in result.message
    assert result.leftovers["processes"] == []
    assert "verdict: FAIL DdpEnvironmentLayer, layer environment" in render_table(result)


def _states(step: str, *, warnings: tuple[str, ...] = ()) -> list[WorkerState]:
    return [WorkerState(rank=r, label=f"GPU {r}", reduces=True, step=step, phase="init",
                        pid=1000 + r, nccl_warnings=warnings) for r in range(2)]


def test_nccl_failing_after_gloo_names_nccl_with_its_warnings_and_checks(
        make_ctx: MakeCtx, tmp_path: Path) -> None:
    env = {"NCCL_SOCKET_IFNAME": "nosuch0", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    ctx = make_ctx(env=env)
    warn = ("Bootstrap : no socket interface found",)  # as kept from "... NCCL WARN <text>"
    failure = Failure("error", "rank 0 (GPU 0) failed in init_process_group (step nccl): "
                      "DistBackendError: NCCL error ...", (0,))
    stopped = StepResult("nccl", Status.FAIL, failure.message, ranks=2, backend="nccl",
                         failure_kind=failure.kind, failed_ranks=failure.ranks)
    result = verdict(ctx, stopped, _states(wire.DDP_NCCL, warnings=warn), {})
    assert (result.status, result.layer, result.reason) == (Status.FAIL, "nccl",
                                                            "DdpNcclLayer")
    assert result.evidence["nccl_warnings"] == ["Bootstrap : no socket interface found"]
    assert result.evidence["variables"] == env
    checks = {c["check"]: c for c in result.evidence["checks"]}
    assert set(checks) == {"network", "shm", "nccl_env"}
    assert checks["network"]["status"] == "fail" and "nosuch0" in checks["network"]["message"]
    assert checks["nccl_env"]["status"] == "warn"
    assert "NCCL WARN: Bootstrap : no socket interface found" in result.message
    assert result.scope is Scope.JOB  # the job's own NCCL_* settings bear on it


def test_scope_is_the_nodes_without_a_job_variable(make_ctx: MakeCtx) -> None:
    stopped = StepResult("single", Status.FAIL, "rank 1 (GPU 1) failed in set-up (step "
                         "single): CUDA error: uncorrectable ECC error encountered",
                         failure_kind="error", failed_ranks=(1,))
    result = verdict(make_ctx(env={}), stopped, _states(wire.DDP_SINGLE), {})
    assert (result.layer, result.scope) == ("environment", Scope.NODE)
    mapping = StepResult("single", Status.FAIL, "rank 1 failed: CUDA error: invalid device "
                         "ordinal", failure_kind="error", failed_ranks=(1,))
    result = verdict(make_ctx(env={"CUDA_VISIBLE_DEVICES": "0"}), mapping,
                     _states(wire.DDP_SINGLE), {})
    assert result.scope is Scope.JOB


def test_a_rank_frozen_while_starting_is_undecided(make_ctx: MakeCtx) -> None:
    states = _states(wire.START)
    step = DdpStep("gloo", "gloo", False)
    got = judge_step(step, states, Failure("stalled", "rank 0 stalled in import", (0,)),
                     LadderPlan(None), 3.0)
    assert got.status is Status.ERROR
