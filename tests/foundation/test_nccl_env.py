from __future__ import annotations

from pathlib import Path

import pytest

from preflight.checks import nccl_env
from preflight.model import Status
from tests.conftest import MakeCtx


def test_clean_env_passes_and_lists_what_it_saw(make_ctx: MakeCtx) -> None:
    r = nccl_env.run(make_ctx(env={"NCCL_DEBUG": "INFO", "PATH": "/bin"}))
    assert r.status is Status.PASS
    assert "NCCL_DEBUG=INFO" in r.message and "PATH" not in r.message


@pytest.mark.parametrize(("env", "reason", "fix"), [
    ({"NCCL_P2P_DISABLE": "1"}, "P2pDisabled", "unset NCCL_P2P_DISABLE"),
    ({"NCCL_SHM_DISABLE": "1"}, "ShmDisabled", "unset NCCL_SHM_DISABLE"),
    ({"NCCL_SOCKET_FAMILY": "inet"}, "SocketFamilyIgnored", "AF_INET"),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "AsyncErrorHandlingOff",
     "unset TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ({"NCCL_ALGO": "Tree"}, "TuningForced", "unset NCCL_ALGO"),
    ({"NCCL_PROTO": "Simple"}, "TuningForced", "unset NCCL_PROTO"),
    ({"NCCL_SOCKET_IFNAME": "eth0, eth1"}, "WhitespaceInList",
     "export NCCL_SOCKET_IFNAME=eth0,eth1"),
    ({"NCCL_TOPO_FILE": "/nonexistent/topo.xml"}, "TopoFileMissing", "unset NCCL_TOPO_FILE"),
])
def test_risky_settings_warn_with_a_fix(make_ctx: MakeCtx, env: dict[str, str], reason: str,
                                        fix: str) -> None:
    r = nccl_env.run(make_ctx(env=env))
    assert (r.status, r.reason) == (Status.WARN, reason)
    assert fix in r.remedy


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
