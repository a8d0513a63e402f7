"""The ``fabric`` verdicts on /sys/class/infiniband fixture trees under ``--root``."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from preflight.checks import fabric
from preflight.core.result import Status
from preflight.probes.ibparse import parse_numbered, parse_rate, roce_version
from tests.checks.sysfs_ib import ROCE_GIDS, ZERO_GID, add_port
from tests.conftest import MakeCtx
from tests.helpers import cli_json


def four_rails(root: Path, **changes: dict[str, object]) -> Path:
    """mlx5_0..3, one 400 Gb/s NDR port each; ``changes['mlx5_2']`` overrides that port."""
    for i in range(4):
        name = f"mlx5_{i}"
        add_port(root, name, **changes.get(name, {}))  # type: ignore[arg-type]
    return root


def test_no_rdma_is_a_skip(make_ctx: MakeCtx, tmp_path: Path) -> None:
    r = fabric.run(make_ctx(root=tmp_path))
    assert (r.status, r.reason) == (Status.SKIP, "NoRdmaPorts")
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)  # driver loaded, no HCA
    assert fabric.run(make_ctx(root=tmp_path)).status is Status.SKIP


def test_healthy_rails_pass(make_ctx: MakeCtx, tmp_path: Path) -> None:
    r = fabric.run(make_ctx(root=four_rails(tmp_path), fabric_counter_interval_s=0.1))
    assert (r.status, r.reason) == (Status.PASS, "FabricOk")
    assert "4 active port(s) of 4" in r.message and "400 Gb/s InfiniBand" in r.message


def test_half_rate_port_fails_against_the_best_port(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_2={"rate": "200 Gb/sec (2X NDR)"})
    r = fabric.run(make_ctx(root=root, fabric_counter_interval_s=0))
    assert (r.status, r.reason) == (Status.FAIL, "IbRateLow")
    assert "mlx5_2:1 (InfiniBand) trained at 200 Gb/s (200 Gb/sec (2X NDR)), expected 400 Gb/s" \
        in r.message
    assert "bad lane" in r.remedy


def test_configured_rate(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path)
    r = fabric.run(make_ctx(root=root, fabric_counter_interval_s=0,
                            fabric_expected_rate_gbps=800.0))
    assert r.reason == "IbRateLow" and r.message.count("expected 800 Gb/s") == 4


def test_one_port_down_warns_all_down_fails(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path / "one", mlx5_1={"state": "DOWN", "phys": "Polling"})
    r = fabric.run(make_ctx(root=root, fabric_counter_interval_s=0))
    assert (r.status, r.reason) == (Status.WARN, "IbPortDown")
    assert "mlx5_1:1 (DOWN, Polling)" in r.message
    down = {f"mlx5_{i}": {"state": "DOWN", "phys": "Polling"} for i in range(4)}
    r = fabric.run(make_ctx(root=four_rails(tmp_path / "all", **down),
                            fabric_counter_interval_s=0))
    assert (r.status, r.reason) == (Status.FAIL, "IbNoActivePort")


def test_disabled_port_is_only_listed(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_3={"state": "DOWN", "phys": "Disabled"})
    r = fabric.run(make_ctx(root=root, fabric_counter_interval_s=0))
    assert r.status is Status.PASS and "3 active port(s) of 4" in r.message


def test_no_subnet_manager_state_init(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_0={"state": "INIT"})
    r = fabric.run(make_ctx(root=root, env={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"},
                            fabric_counter_interval_s=0))
    assert (r.status, r.reason) == (Status.FAIL, "IbSelectedPortDown")
    assert "mlx5_0:1 (INIT, LinkUp)" in r.message and "sminfo" in r.remedy


def test_nccl_ib_hca_selecting_only_down_ports(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_3={"state": "DOWN", "phys": "Polling"})
    r = fabric.run(make_ctx(root=root, env={"NCCL_IB_HCA": "mlx5_3"},
                            fabric_counter_interval_s=0))
    assert r.status is Status.FAIL and r.reason in ("IbSelectedPortDown", "IbNoSelectedPort")
    assert "selects mlx5_3:1 (DOWN, Polling): not ACTIVE" in r.message
    assert "selects no ACTIVE port" in r.message


def test_unselected_down_port_is_not_a_failure(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_3={"state": "DOWN", "phys": "Polling"})
    r = fabric.run(make_ctx(root=root, env={"NCCL_IB_HCA": "^mlx5_3"},
                            fabric_counter_interval_s=0))
    assert r.status is Status.PASS
    assert "NCCL_IB_HCA='^mlx5_3' selects 3 active port(s)" in r.message


def test_counters_growing_between_two_reads(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_1={"counters": {"symbol_error": 7}})
    port1 = root / "sys/class/infiniband/mlx5_1/ports/1/counters"
    port2 = root / "sys/class/infiniband/mlx5_2/ports/1/counters"

    def errors_arrive() -> None:
        time.sleep(0.2)
        (port1 / "symbol_error").write_text("19\n")
        (port2 / "link_downed").write_text("1\n")

    t = threading.Thread(target=errors_arrive)
    t.start()
    r = fabric.run(make_ctx(root=root, fabric_counter_interval_s=1.0))
    t.join()
    assert (r.status, r.reason) == (Status.FAIL, "IbLinkFlapping")
    assert "mlx5_2:1: link_downed +1 within 1 s; expected 0" in r.message
    assert "mlx5_1:1: symbol_error +12 within 1 s; expected 0" in r.message
    # A counter that was already high but does not move is history, not a failure.
    r = fabric.run(make_ctx(root=four_rails(tmp_path / "old", mlx5_0={
        "counters": {"symbol_error": 50000, "link_downed": 3}}), fabric_counter_interval_s=0.1))
    assert r.status is Status.PASS


def test_roce_gid_index(make_ctx: MakeCtx, tmp_path: Path) -> None:
    roce = {"link_layer": "Ethernet", "rate": "400 Gb/sec (4X NDR)", "gids": ROCE_GIDS}
    root = four_rails(tmp_path, **{f"mlx5_{i}": roce for i in range(4)})
    ok = fabric.run(make_ctx(root=root, env={"NCCL_IB_GID_INDEX": "3",
                                             "NCCL_IB_ROCE_VERSION_NUM": "2"},
                             fabric_counter_interval_s=0))
    assert ok.status is Status.PASS and ok.details["roce"]["mlx5_0:1"]["type"] == "RoCE v2"
    v1 = fabric.run(make_ctx(root=root, env={"NCCL_IB_GID_INDEX": "2",
                                             "NCCL_IB_ROCE_VERSION_NUM": "2"},
                             fabric_counter_interval_s=0))
    assert v1.reason == "IbRoceVersionMismatch" and "is IB/RoCE v1" in v1.message
    empty = fabric.run(make_ctx(root=root, env={"NCCL_IB_GID_INDEX": "7"},
                                fabric_counter_interval_s=0))
    assert empty.reason == "IbGidMissing" and "no GID at index 7" in empty.message


def test_zero_gid_slot_is_missing(make_ctx: MakeCtx, tmp_path: Path) -> None:
    add_port(tmp_path, "mlx5_0", link_layer="Ethernet", gids={3: (ZERO_GID, "RoCE v2")})
    r = fabric.run(make_ctx(root=tmp_path, env={"NCCL_IB_GID_INDEX": "3"},
                            fabric_counter_interval_s=0))
    assert r.reason == "IbGidMissing"


def test_rate_per_link_layer(make_ctx: MakeCtx, tmp_path: Path) -> None:
    # A 400 Gb/s IB compute fabric next to a 100 Gb/s RoCE storage NIC: each judged by its kind.
    four_rails(tmp_path)
    add_port(tmp_path, "mlx5_4", link_layer="Ethernet", rate="100 Gb/sec (4X EDR)")
    r = fabric.run(make_ctx(root=tmp_path, fabric_counter_interval_s=0))
    assert r.status is Status.PASS


def test_cli_json_under_root(tmp_path: Path) -> None:
    root = four_rails(tmp_path, mlx5_2={"rate": "200 Gb/sec (4X HDR)"})
    rc, report = cli_json(["check", "--only", "fabric", "--root", str(root)],
                          env={"PREFLIGHT_FABRIC_COUNTER_INTERVAL_S": "0"})
    assert rc == 1
    (res,) = report["results"]
    assert res["reason"] == "IbRateLow"
    rates = {p["port"]: p["rate_gbps"] for p in res["details"]["ports"]}
    assert rates == {"mlx5_0:1": 400.0, "mlx5_1:1": 400.0, "mlx5_2:1": 200.0, "mlx5_3:1": 400.0}


def test_parsers_on_kernel_strings() -> None:
    assert parse_rate("2.5 Gb/sec (1X SDR)") == parse_rate("2.5 Gb/sec (1X SDR)\n")
    r = parse_rate("2.5 Gb/sec (1X SDR)")
    assert r is not None and (r.gbps, r.width, r.speed) == (2.5, 1, "SDR")
    r = parse_rate("10 Gb/sec (4X)")
    assert r is not None and (r.gbps, r.width, r.speed) == (10.0, 4, "")
    assert parse_rate("garbage") is None
    assert parse_numbered("5: LinkUp\n") == (5, "LinkUp")
    assert parse_numbered("ACTIVE") == (None, "ACTIVE")
    assert roce_version("RoCE v2") == 2 and roce_version("IB/RoCE v1") == 1
    assert roce_version("") is None


@given(whole=st.integers(0, 9_999_999), half=st.booleans(), width=st.sampled_from([1, 2, 4, 8, 12]),
       speed=st.sampled_from(["", " SDR", " DDR", " QDR", " FDR", " EDR", " HDR", " NDR", " XDR"]))
def test_rate_parser_reads_every_kernel_rate(whole: int, half: bool, width: int,
                                             speed: str) -> None:
    text = f"{whole}{'.5' if half else ''} Gb/sec ({width}X{speed})\n"
    r = parse_rate(text)
    assert r is not None
    assert (r.gbps, r.width, r.speed) == (whole + (0.5 if half else 0), width, speed.strip())


def test_nccl_ib_disable_skips_even_with_ports_down(make_ctx: MakeCtx, tmp_path: Path) -> None:
    down = {f"mlx5_{i}": {"state": "DOWN", "phys": "Polling"} for i in range(4)}
    r = fabric.run(make_ctx(root=four_rails(tmp_path, **down), env={"NCCL_IB_DISABLE": "1"}))
    assert (r.status, r.reason) == (Status.SKIP, "NcclIbDisabled")
    assert "mlx5_0:1 DOWN" in r.message
