"""Xid and IB port metrics from real check results (fixture roots), as `check --prom-file` and
the daemon render them."""

from __future__ import annotations

import math
from pathlib import Path

from preflight.checks import fabric, xid
from preflight.core.result import Report
from preflight.outputs.prom import DaemonStats, MetricsSnapshot, render
from tests.checks.sysfs_ib import add_port
from tests.checks.test_xid import FELL_OFF_GPU3, MMU_GPU0, kmsg_root
from tests.conftest import MakeCtx
from tests.serve.conftest import samples


def scrape(report: Report, daemon: DaemonStats | None = None) -> dict[str, float]:
    return samples(render(MetricsSnapshot(report, (), daemon)).decode())


def test_xid_counter_per_gpu_and_code(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (10.0, FELL_OFF_GPU3), (20.0, MMU_GPU0), (30.0, MMU_GPU0))
    m = scrape(Report(results=(xid.run(make_ctx(root=root)),)))
    assert m['preflight_xid_errors_total{gpu="3",xid="79"}'] == 1
    assert m['preflight_xid_errors_total{gpu="0",xid="31"}'] == 2
    assert "preflight_xid_events_watching" not in m  # one-shot: no watcher


def test_daemon_counts_and_the_log_merge(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (10.0, FELL_OFF_GPU3), (20.0, MMU_GPU0), (30.0, MMU_GPU0))
    report = Report(results=(xid.run(make_ctx(root=root)),))
    watching = DaemonStats(xid_counts={("3", 79): 4, ("1", 48): 1}, xid_watching=True)
    m = scrape(report, watching)
    assert m['preflight_xid_errors_total{gpu="3",xid="79"}'] == 4  # events since the last run
    assert m['preflight_xid_errors_total{gpu="1",xid="48"}'] == 1
    assert m['preflight_xid_errors_total{gpu="0",xid="31"}'] == 2  # in the log, missed by NVML
    assert m["preflight_xid_events_watching"] == 1
    # A watcher without NVML only caught up once at start: the check's fresh log counts rule.
    stale = DaemonStats(xid_counts={("3", 79): 0}, xid_watching=False)
    m = scrape(report, stale)
    assert m['preflight_xid_errors_total{gpu="3",xid="79"}'] == 1
    assert m["preflight_xid_events_watching"] == 0


def test_ib_port_state_and_rates(make_ctx: MakeCtx, tmp_path: Path) -> None:
    add_port(tmp_path, "mlx5_0")
    add_port(tmp_path, "mlx5_1", rate="200 Gb/sec (4X HDR)")
    add_port(tmp_path, "mlx5_2", state="DOWN", phys="Polling")
    r = fabric.run(make_ctx(root=tmp_path, fabric_counter_interval_s=0))
    m = scrape(Report(results=(r,)))
    assert m['preflight_ib_port_active{device="mlx5_0",link_layer="InfiniBand",port="1"}'] == 1
    assert m['preflight_ib_port_active{device="mlx5_2",link_layer="InfiniBand",port="1"}'] == 0
    assert m['preflight_ib_port_rate_bytes_per_second{device="mlx5_1",port="1"}'] == 25e9
    assert m['preflight_ib_port_expected_rate_bytes_per_second{device="mlx5_1",port="1"}'] == 50e9
    assert m['preflight_ib_port_rate_bytes_per_second{device="mlx5_0",port="1"}'] == 50e9


def test_no_rdma_no_port_series(make_ctx: MakeCtx, tmp_path: Path) -> None:
    m = scrape(Report(results=(fabric.run(make_ctx(root=tmp_path)),)))
    assert not [k for k in m if k.startswith("preflight_ib_port")]
    assert not any(math.isnan(v) for k, v in m.items() if k.startswith("preflight_xid"))
