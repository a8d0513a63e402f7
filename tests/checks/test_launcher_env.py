"""launcher_env: torchrun / env:// / Slurm variables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.checks import launcher_env
from preflight.core.result import Result, Scope, Status
from preflight.jobenv import launcher
from tests.conftest import MakeCtx

TORCHRUN_2x4 = {  # rank 6 of torchrun --nnodes=2 --nproc-per-node=4, on the second node
    "TORCHELASTIC_RUN_ID": "job-1", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0", "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "6",
    "ROLE_WORLD_SIZE": "8", "MASTER_ADDR": "node1", "MASTER_PORT": "29500",
}
SRUN_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
             "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
             "SLURM_NTASKS_PER_NODE": "2"}


def check(make_ctx: MakeCtx, env: dict[str, str]) -> Result:
    return launcher_env.run(make_ctx(env=env))


def test_outside_a_job_skips(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0"})
    assert (r.status, r.reason) == (Status.SKIP, "NoLauncher")
    assert r.message == "no launcher variables: not inside torchrun or a Slurm job"


def test_complete_torchrun_passes(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, TORCHRUN_2x4)
    assert (r.status, r.reason) == (Status.PASS, "LauncherOk")
    assert r.message.startswith("torchrun: RANK=6, WORLD_SIZE=8, LOCAL_RANK=2")


def test_missing_rank_quotes_the_article(make_ctx: MakeCtx) -> None:
    env = {k: v for k, v in TORCHRUN_2x4.items() if k != "RANK"}
    r = check(make_ctx, env)
    assert (r.status, r.reason) == (Status.FAIL, "LauncherVarMissing")
    assert "Invalid environment variable: RANK" in r.message
    assert "torchrun" in r.remedy and "rank= and world_size=" in r.remedy


def test_local_rank_alone_is_an_incomplete_env_launch(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"})
    assert (r.status, r.reason) == (Status.FAIL, "LauncherVarMissing")
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are unset" in r.message


def test_empty_rank_counts_as_unset(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {**TORCHRUN_2x4, "RANK": ""})
    assert r.reason == "LauncherVarMissing" and "RANK is unset or empty" in r.message


@pytest.mark.parametrize(("change", "reason", "text"), [
    ({"RANK": "8"}, "LauncherVarOutOfRange", "RANK=8 violates 0 <= RANK < WORLD_SIZE=8"),
    ({"RANK": "-1"}, "LauncherVarOutOfRange", "RANK=-1 violates"),
    ({"LOCAL_RANK": "4"}, "LauncherVarOutOfRange", "LOCAL_RANK=4 violates 0 <= LOCAL_RANK < "
                                                   "LOCAL_WORLD_SIZE=4"),
    ({"GROUP_RANK": "2"}, "LauncherVarOutOfRange", "GROUP_RANK=2 violates"),
    ({"WORLD_SIZE": "0"}, "LauncherVarOutOfRange", "WORLD_SIZE=0 violates WORLD_SIZE >= 1"),
    ({"RANK": "six"}, "LauncherVarNotInteger", "RANK='six' is not an integer"),
    ({"LOCAL_WORLD_SIZE": "16", "LOCAL_RANK": "2", "GROUP_WORLD_SIZE": "1"},
     "LauncherVarOutOfRange", "LOCAL_WORLD_SIZE=16 is larger than WORLD_SIZE=8"),
])
def test_bad_torchrun_values_fail(make_ctx: MakeCtx, change: dict[str, str], reason: str,
                                  text: str) -> None:
    r = check(make_ctx, {**TORCHRUN_2x4, **change})
    assert (r.status, r.reason, r.scope) == (Status.FAIL, reason, Scope.JOB)
    assert text in r.message


@pytest.mark.parametrize("port", ["70000", "0", "29500x"])
def test_master_port_range_is_left_to_master_port(make_ctx: MakeCtx, port: str) -> None:
    """One fault, one owner: master_port reports a bad MASTER_PORT, not this check."""
    r = check(make_ctx, {**TORCHRUN_2x4, "MASTER_PORT": port})
    assert (r.status, r.reason) == (Status.PASS, "LauncherOk")


def test_world_size_not_nodes_times_local_warns(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {**TORCHRUN_2x4, "WORLD_SIZE": "6", "ROLE_WORLD_SIZE": "6", "RANK": "5",
                         "ROLE_RANK": "5"})
    assert (r.status, r.reason) == (Status.WARN, "WorldSizeMismatch")
    assert "GROUP_WORLD_SIZE=2 x LOCAL_WORLD_SIZE=4 = 8" in r.message


def test_world_size_not_a_multiple_warns_without_group_size(make_ctx: MakeCtx) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "0",
           "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    r = check(make_ctx, env)
    assert (r.status, r.reason) == (Status.WARN, "WorldSizeMismatch")


def test_rank_inconsistent_with_group_rank_warns(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {**TORCHRUN_2x4, "RANK": "2"})
    assert (r.status, r.reason) == (Status.WARN, "RankInconsistent")
    assert "GROUP_RANK=1 x LOCAL_WORLD_SIZE=4 + LOCAL_RANK=2 = 6" in r.message


def test_slurm_step_passes_and_checks_ranges(make_ctx: MakeCtx) -> None:
    assert check(make_ctx, SRUN_STEP).status is Status.PASS
    r = check(make_ctx, {**SRUN_STEP, "SLURM_PROCID": "4"})
    assert (r.status, r.reason) == (Status.FAIL, "LauncherVarOutOfRange")
    assert "SLURM_PROCID=4 violates 0 <= SLURM_PROCID < SLURM_NTASKS=4" in r.message


def test_slurm_step_missing_procid(make_ctx: MakeCtx) -> None:
    env = {k: v for k, v in SRUN_STEP.items() if k != "SLURM_PROCID"}
    r = check(make_ctx, env)
    assert (r.status, r.reason) == (Status.FAIL, "LauncherVarMissing")


def test_slurm_prolog_skips(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {"SLURM_JOB_ID": "4242", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
                         "CUDA_VISIBLE_DEVICES": "1"})
    assert (r.status, r.reason) == (Status.SKIP, "SlurmProlog")


def test_srun_torchrun_combination(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, {**SRUN_STEP, "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
                         "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1", **TORCHRUN_2x4})
    assert r.status is Status.PASS
    assert r.message.startswith("torchrun + slurm:")


# -- property tests: no input gives a traceback ---------------------------------------------

VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID",
        "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_LOCALID", "SLURM_SCRIPT_CONTEXT", "SLURM_NNODES")
values = st.one_of(st.text(max_size=12), st.integers(-5, 70000).map(str),
                   st.sampled_from(["", " 1", "1_0", "٣", "+2", "0x10", "1e3"]))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(VARS), values, max_size=len(VARS)))
def test_any_environment_gives_a_verdict(env: dict[str, str]) -> None:
    for issue in launcher_env.findings(env, launcher.parse(env)):
        assert issue.message and issue.reason and issue.scope is Scope.JOB


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(VARS), values, max_size=len(VARS)))
def test_check_never_raises(env: dict[str, str]) -> None:
    from preflight.core.config import Config
    from preflight.core.context import Context

    r = launcher_env.run(Context(config=Config(), env=env))
    assert r.status in (Status.PASS, Status.SKIP, Status.WARN, Status.FAIL)
    assert r.message
