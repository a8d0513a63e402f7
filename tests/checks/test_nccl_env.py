from __future__ import annotations

from pathlib import Path

import pytest

from preflight.checks import nccl_env
from preflight.core.result import Scope, Status
from tests.conftest import MakeCtx


def test_clean_env_passes_and_lists_what_it_saw(make_ctx: MakeCtx) -> None:
    r = nccl_env.run(make_ctx(env={"NCCL_DEBUG": "INFO", "PATH": "/bin"}))
    assert r.status is Status.PASS
    assert "NCCL_DEBUG=INFO" in r.message and "PATH" not in r.message


@pytest.mark.parametrize(("env", "reason", "fix"), [
    ({"NCCL_P2P_DISABLE": "1"}, "P2pDisabled", "unset NCCL_P2P_DISABLE"),
    ({"NCCL_SHM_DISABLE": "1"}, "ShmDisabled", "unset NCCL_SHM_DISABLE"),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "AsyncErrorHandlingOff",
     "unset TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ({"NCCL_ALGO": "Tree"}, "TuningForced", "unset NCCL_ALGO"),
    ({"NCCL_PROTO": "Simple"}, "TuningForced", "unset NCCL_PROTO"),
    ({"NCCL_IB_HCA": "mlx5_0, mlx5_1"}, "WhitespaceInList", "export NCCL_IB_HCA=mlx5_0,mlx5_1"),
    ({"NCCL_TOPO_FILE": "/nonexistent/topo.xml"}, "TopoFileMissing", "unset NCCL_TOPO_FILE"),
])
def test_risky_settings_warn_with_a_fix(make_ctx: MakeCtx, env: dict[str, str], reason: str,
                                        fix: str) -> None:
    r = nccl_env.run(make_ctx(env=env))
    assert (r.status, r.reason, r.scope) == (Status.WARN, reason, Scope.JOB)
    assert fix in r.remedy


@pytest.mark.parametrize("env", [{"NCCL_SOCKET_FAMILY": "inet"},
                                 {"NCCL_SOCKET_IFNAME": "eth0, eth1"}])
def test_socket_settings_are_left_to_network(make_ctx: MakeCtx, env: dict[str, str]) -> None:
    """One fault, one owner: ``network`` reports NCCL_SOCKET_FAMILY and NCCL_SOCKET_IFNAME."""
    assert nccl_env.run(make_ctx(env=env)).reason == "NcclEnvOk"


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), ("0x1", True), (" 2", True),
                                           ("yes", False), ("true", False), ("1 ", False),
                                           ("", False)])
def test_ib_disable_is_read_as_nccl_reads_it(make_ctx: MakeCtx, tmp_path: Path, value: str,
                                            on: bool) -> None:
    """NCCL reads NCCL_IB_DISABLE with strtoll: "yes" is no number, so IB stays on."""
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    r = nccl_env.run(make_ctx(env={"NCCL_IB_DISABLE": value}, root=tmp_path))
    assert (r.reason == "IbDisabled") is on


def test_accepted_values_do_not_warn(make_ctx: MakeCtx, tmp_path: Path) -> None:
    topo = tmp_path / "topo.xml"
    topo.write_text("<system/>")
    env = {"NCCL_P2P_DISABLE": "0", "NCCL_SOCKET_FAMILY": "AF_INET6",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "NCCL_SOCKET_IFNAME": "=eth0,eth1",
           "NCCL_TOPO_FILE": str(topo)}
    assert nccl_env.run(make_ctx(env=env)).status is Status.PASS


def test_ib_disable_warns_only_where_infiniband_exists(make_ctx: MakeCtx, tmp_path: Path) -> None:
    env = {"NCCL_IB_DISABLE": "1"}
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    assert nccl_env.run(make_ctx(env=env, root=tmp_path)).status is Status.PASS
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir()
    r = nccl_env.run(make_ctx(env=env, root=tmp_path))
    assert (r.status, r.reason) == (Status.WARN, "IbDisabled")


def test_every_finding_is_reported(make_ctx: MakeCtx) -> None:
    r = nccl_env.run(make_ctx(env={"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}))
    assert r.details["reasons"] == ["P2pDisabled", "TuningForced"]
